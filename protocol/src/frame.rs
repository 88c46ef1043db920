//! Frame header and framing limits.
//!
//! Every message on every Hira connection is one frame: a 24-byte little-endian header,
//! then `span_count` data-window spans of 16 bytes each, then the payload. `len` counts
//! everything after the header.

use thiserror::Error;

/// Size of the fixed frame header in bytes.
pub const HEADER_LEN: usize = 24;
/// Largest number of bytes after the header of one frame (spans and payload).
pub const MAX_FRAME_BODY: usize = 256 * 1024 * 1024 + 64 * 1024;
/// Largest number of data-window spans one frame may name.
pub const MAX_SPANS: usize = 16;
/// Size of one encoded span.
pub const SPAN_LEN: usize = 16;
/// Flag: the sender expects no reply (asynchronously forwarded call).
pub const FLAG_NO_REPLY: u8 = 1;
const KNOWN_FLAGS: u8 = FLAG_NO_REPLY;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// Guest to host: opens a session. Payload: [`crate::handshake::Hello`].
    Hello = 1,
    /// Host to guest: session accepted. Payload: [`crate::handshake::Welcome`].
    Welcome = 2,
    /// An API call. `opcode` names the function, `call_id` pairs it with its reply.
    Request = 3,
    /// The result of a call with the same `channel` and `call_id`.
    Reply = 4,
    /// Host to guest, unsolicited: a callback to deliver to the guest application.
    Notify = 5,
    /// The call (or the session, when `call_id` is 0) failed at the protocol level.
    Error = 6,
}

impl TryFrom<u8> for FrameKind {
    type Error = FrameError;

    fn try_from(v: u8) -> Result<Self, FrameError> {
        Ok(match v {
            1 => FrameKind::Hello,
            2 => FrameKind::Welcome,
            3 => FrameKind::Request,
            4 => FrameKind::Reply,
            5 => FrameKind::Notify,
            6 => FrameKind::Error,
            other => return Err(FrameError::UnknownKind(other)),
        })
    }
}

/// Errors found while decoding a frame header or its spans.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame kind {0} is not defined")]
    UnknownKind(u8),
    #[error("frame flags {0:#x} contain undefined bits")]
    UnknownFlags(u8),
    #[error("reserved header field is {0:#x}, must be zero")]
    Reserved(u16),
    #[error("frame body of {0} bytes exceeds the limit of {MAX_FRAME_BODY}")]
    TooLong(u32),
    #[error("frame names {0} data-window spans, the limit is {MAX_SPANS}")]
    TooManySpans(u16),
    #[error("frame body of {len} bytes cannot hold {spans} spans")]
    SpansDoNotFit { len: u32, spans: u16 },
    #[error("span {index} ({offset:#x}+{len:#x}) lies outside the {window:#x}-byte data window")]
    SpanOutsideWindow {
        index: usize,
        offset: u64,
        len: u64,
        window: u64,
    },
}

/// The fixed part of every frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// Bytes after the header: spans then payload.
    pub len: u32,
    pub kind: FrameKind,
    pub flags: u8,
    /// API function (for `Request`/`Reply`) or notification type (for `Notify`).
    pub opcode: u16,
    /// The guest thread's call channel; replies come back on the same channel.
    pub channel: u32,
    /// Number of data-window spans that follow the header.
    pub span_count: u16,
    /// Pairs a reply with its request within a channel. 0 for session-level frames.
    pub call_id: u64,
}

impl FrameHeader {
    /// A header for `len` bytes of payload with no spans and no flags.
    pub fn new(kind: FrameKind, opcode: u16, channel: u32, call_id: u64, len: usize) -> Self {
        debug_assert!(
            len <= MAX_FRAME_BODY,
            "frame payloads are capped before framing"
        );
        FrameHeader {
            len: len as u32,
            kind,
            flags: 0,
            opcode,
            channel,
            span_count: 0,
            call_id,
        }
    }

    /// Decodes and checks a header. The body length, span count and flags are checked
    /// against the protocol limits; nothing is trusted beyond them.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Self, FrameError> {
        let len = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let kind = FrameKind::try_from(b[4])?;
        let flags = b[5];
        let opcode = u16::from_le_bytes([b[6], b[7]]);
        let channel = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        let span_count = u16::from_le_bytes([b[12], b[13]]);
        let reserved = u16::from_le_bytes([b[14], b[15]]);
        let call_id = u64::from_le_bytes(b[16..24].try_into().expect("slice of 8 bytes"));
        if flags & !KNOWN_FLAGS != 0 {
            return Err(FrameError::UnknownFlags(flags));
        }
        if reserved != 0 {
            return Err(FrameError::Reserved(reserved));
        }
        if len as usize > MAX_FRAME_BODY {
            return Err(FrameError::TooLong(len));
        }
        if span_count as usize > MAX_SPANS {
            return Err(FrameError::TooManySpans(span_count));
        }
        if (span_count as usize) * SPAN_LEN > len as usize {
            return Err(FrameError::SpansDoNotFit {
                len,
                spans: span_count,
            });
        }
        Ok(FrameHeader {
            len,
            kind,
            flags,
            opcode,
            channel,
            span_count,
            call_id,
        })
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&self.len.to_le_bytes());
        b[4] = self.kind as u8;
        b[5] = self.flags;
        b[6..8].copy_from_slice(&self.opcode.to_le_bytes());
        b[8..12].copy_from_slice(&self.channel.to_le_bytes());
        b[12..14].copy_from_slice(&self.span_count.to_le_bytes());
        b[16..24].copy_from_slice(&self.call_id.to_le_bytes());
        b
    }

    /// Bytes of payload after the spans.
    pub fn payload_len(&self) -> usize {
        self.len as usize - self.span_count as usize * SPAN_LEN
    }

    pub fn no_reply(&self) -> bool {
        self.flags & FLAG_NO_REPLY != 0
    }
}

/// A region of the session's shared data window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Span {
    pub offset: u64,
    pub len: u64,
}

impl Span {
    pub fn encode(&self) -> [u8; SPAN_LEN] {
        let mut b = [0u8; SPAN_LEN];
        b[0..8].copy_from_slice(&self.offset.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Span {
        let mut o = [0u8; 8];
        let mut l = [0u8; 8];
        o.copy_from_slice(&b[0..8]);
        l.copy_from_slice(&b[8..16]);
        Span {
            offset: u64::from_le_bytes(o),
            len: u64::from_le_bytes(l),
        }
    }
}

/// Writes a frame made of `parts` (the encoded header first) with as few system calls
/// as the kernel allows: one `writev` for all parts, continued after partial writes.
/// A reader on the other end then wakes once per frame, not once per part.
pub fn write_parts(w: &mut impl std::io::Write, parts: &[&[u8]]) -> std::io::Result<()> {
    let mut parts: Vec<&[u8]> = parts.iter().copied().filter(|p| !p.is_empty()).collect();
    let mut first = 0;
    while first < parts.len() {
        let slices: Vec<std::io::IoSlice<'_>> = parts[first..]
            .iter()
            .map(|p| std::io::IoSlice::new(p))
            .collect();
        let mut n = match w.write_vectored(&slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        while first < parts.len() && n >= parts[first].len() {
            n -= parts[first].len();
            first += 1;
        }
        if n > 0 {
            parts[first] = &parts[first][n..];
        }
    }
    Ok(())
}

/// Decodes `count` spans from `bytes` and checks each lies inside a window of
/// `window_len` bytes (0 when the session has no window: then no span is valid).
pub fn decode_spans(bytes: &[u8], count: usize, window_len: u64) -> Result<Vec<Span>, FrameError> {
    let mut spans = Vec::with_capacity(count);
    for index in 0..count {
        let s = Span::decode(&bytes[index * SPAN_LEN..(index + 1) * SPAN_LEN]);
        let inside = s
            .offset
            .checked_add(s.len)
            .is_some_and(|end| end <= window_len);
        if !inside {
            return Err(FrameError::SpanOutsideWindow {
                index,
                offset: s.offset,
                len: s.len,
                window: window_len,
            });
        }
        spans.push(s);
    }
    Ok(spans)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> FrameHeader {
        FrameHeader {
            len: 40,
            kind: FrameKind::Request,
            flags: FLAG_NO_REPLY,
            opcode: 7,
            channel: 3,
            span_count: 1,
            call_id: 99,
        }
    }

    #[test]
    fn header_round_trips() {
        let h = header();
        assert_eq!(FrameHeader::decode(&h.encode()), Ok(h));
        assert_eq!(h.payload_len(), 24);
    }

    #[test]
    fn unknown_kind_is_rejected() {
        let mut b = header().encode();
        b[4] = 42;
        assert_eq!(FrameHeader::decode(&b), Err(FrameError::UnknownKind(42)));
    }

    #[test]
    fn nonzero_reserved_is_rejected() {
        let mut b = header().encode();
        b[15] = 1;
        assert_eq!(FrameHeader::decode(&b), Err(FrameError::Reserved(0x100)));
    }

    #[test]
    fn oversized_body_is_rejected() {
        let mut h = header();
        h.len = MAX_FRAME_BODY as u32 + 1;
        assert!(matches!(
            FrameHeader::decode(&h.encode()),
            Err(FrameError::TooLong(_))
        ));
    }

    #[test]
    fn spans_longer_than_body_are_rejected() {
        let mut h = header();
        h.len = 8;
        assert!(matches!(
            FrameHeader::decode(&h.encode()),
            Err(FrameError::SpansDoNotFit { .. })
        ));
    }

    #[test]
    fn undefined_flag_is_rejected() {
        let mut b = header().encode();
        b[5] = 0x80;
        assert_eq!(FrameHeader::decode(&b), Err(FrameError::UnknownFlags(0x80)));
    }

    #[test]
    fn span_past_window_end_is_rejected() {
        let s = Span {
            offset: 4096,
            len: 1,
        };
        let err = decode_spans(&s.encode(), 1, 4096).unwrap_err();
        assert!(matches!(
            err,
            FrameError::SpanOutsideWindow { index: 0, .. }
        ));
    }

    #[test]
    fn overflowing_span_is_rejected() {
        let s = Span {
            offset: u64::MAX,
            len: 2,
        };
        assert!(decode_spans(&s.encode(), 1, u64::MAX).is_err());
    }

    /// A writer that accepts at most 3 bytes per call, to exercise partial writes.
    struct Trickle(Vec<u8>);

    impl std::io::Write for Trickle {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            let n = b.len().min(3);
            self.0.extend_from_slice(&b[..n]);
            Ok(n)
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn partial_writes_still_send_every_part_in_order() {
        let mut t = Trickle(Vec::new());
        write_parts(&mut t, &[b"head", b"", b"er-and-", b"payload"]).unwrap();
        assert_eq!(t.0, b"header-and-payload");
    }

    #[test]
    fn span_inside_window_is_accepted() {
        let s = Span {
            offset: 100,
            len: 28,
        };
        assert_eq!(decode_spans(&s.encode(), 1, 128).unwrap(), vec![s]);
    }
}
