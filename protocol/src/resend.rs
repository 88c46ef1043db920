//! Relayed streams that outlive their connection being cut.
//!
//! A VM session whose frames the daemon relays over vsock (no shared window) loses
//! whatever was in flight when the VM's vsock device is reset: bytes in the guest's
//! socket buffers, bytes the daemon wrote that the guest never read. Both ends
//! therefore keep what they sent until the peer acknowledges it ([`Resending`]), and
//! count the bytes of the whole frames they took in. On reconnecting, each tells the
//! other its count (the guest in its `Hello`, the daemon in its `Welcome`) and each
//! sends again what the other has not taken: every frame arrives exactly once, and
//! none twice, since counts are at frame boundaries.
//!
//! Acknowledgements are [`ACK`] notifications carrying the count, sent every
//! [`ACK_EVERY`] bytes taken in; they travel in the stream like any frame (counted,
//! kept), and an old one sent again is harmless. What an end keeps is bounded
//! ([`GUEST_KEEPS`], [`DAEMON_KEEPS`]); a cut that finds the bytes the peer needs
//! already dropped ends the session as before.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::frame::{FrameHeader, FrameKind, HEADER_LEN};

/// Opcode of the `Notify` frame that acknowledges a relayed stream: its payload is
/// the number of bytes of whole frames the sender has taken in since the `Welcome`.
pub const ACK: u16 = 0xFFFA;

/// An end acknowledges each time it has taken in this many bytes more.
pub const ACK_EVERY: u64 = 512 * 1024;

/// Most bytes a guest keeps for sending again (its own process's memory).
pub const GUEST_KEEPS: usize = 64 << 20;

/// Most bytes the daemon keeps per session for sending again.
pub const DAEMON_KEEPS: usize = 16 << 20;

/// An [`ACK`] frame acknowledging `taken` bytes.
pub fn ack_frame(taken: u64) -> [u8; HEADER_LEN + 8] {
    let h = FrameHeader::new(FrameKind::Notify, ACK, 0, 0, 8);
    let mut f = [0u8; HEADER_LEN + 8];
    f[..HEADER_LEN].copy_from_slice(&h.encode());
    f[HEADER_LEN..].copy_from_slice(&taken.to_le_bytes());
    f
}

/// Whether `h` heads an [`ACK`] frame.
pub fn is_ack(h: &FrameHeader) -> bool {
    h.kind == FrameKind::Notify && h.opcode == ACK && h.len == 8
}

/// The count an [`ACK`] frame's payload carries.
pub fn ack_count(payload: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(payload.try_into().ok()?))
}

/// Why a stream cannot go on from where the peer says it is.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ResumeError {
    #[error("the peer took {taken} bytes, but only {sent} were sent")]
    Ahead { taken: u64, sent: u64 },
    #[error("the bytes after {taken} are no longer kept (kept from {kept_from})")]
    Dropped { taken: u64, kept_from: u64 },
}

/// A writer that keeps what it wrote until the peer acknowledges it.
///
/// Until [`Resending::enable`] it only passes writes on. Once enabled, a write never
/// fails: when the connection does, the bytes are kept and the writer is broken
/// (writes only keep) until [`Resending::resume`] on a new connection.
#[derive(Debug)]
pub struct Resending<W> {
    inner: W,
    /// Most bytes kept; 0 while not enabled.
    cap: usize,
    kept: VecDeque<u8>,
    /// Stream offset of the first byte kept.
    base: u64,
    /// What the peer acknowledged (set by whoever reads its frames).
    acked: Arc<AtomicU64>,
    broken: bool,
    /// Gathers a frame's parts into one write.
    scratch: Vec<u8>,
}

impl<W: Write> Resending<W> {
    /// A writer that only passes writes on to `inner`.
    pub fn plain(inner: W) -> Self {
        Resending {
            inner,
            cap: 0,
            kept: VecDeque::new(),
            base: 0,
            acked: Arc::new(AtomicU64::new(0)),
            broken: false,
            scratch: Vec::new(),
        }
    }

    /// From now on, keeps up to `cap` bytes written (counting from zero); 0 only
    /// passes writes on again.
    pub fn enable(&mut self, cap: usize) {
        self.cap = cap;
        self.reset();
    }

    /// Counts from zero again, keeping nothing (a new stream on a new connection).
    pub fn reset(&mut self) {
        self.kept.clear();
        self.base = 0;
        self.acked.store(0, Ordering::Release);
        self.broken = false;
    }

    pub fn is_enabled(&self) -> bool {
        self.cap > 0
    }

    /// Whether the connection failed and writes are only kept.
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Where the peer's acknowledgements go.
    pub fn acked(&self) -> Arc<AtomicU64> {
        self.acked.clone()
    }

    /// Bytes written since enabled.
    pub fn sent(&self) -> u64 {
        self.base + self.kept.len() as u64
    }

    pub fn get_ref(&self) -> &W {
        &self.inner
    }

    /// The connection itself (what is written through it is neither counted nor
    /// kept: the handshake).
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    /// Whether the stream can go on for a peer that took `taken` bytes.
    pub fn check(&self, taken: u64) -> Result<(), ResumeError> {
        let sent = self.sent();
        if taken > sent {
            return Err(ResumeError::Ahead { taken, sent });
        }
        if taken < self.base {
            return Err(ResumeError::Dropped {
                taken,
                kept_from: self.base,
            });
        }
        Ok(())
    }

    /// Goes on on the (new) connection for a peer that took `taken` bytes: sends
    /// again what it has not.
    pub fn resume(&mut self, taken: u64) -> Result<(), ResumeError> {
        self.check(taken)?;
        self.acked.fetch_max(taken, Ordering::AcqRel);
        self.trim();
        let (a, b) = self.kept.as_slices();
        self.broken = self
            .inner
            .write_all(a)
            .and_then(|()| self.inner.write_all(b))
            .is_err();
        Ok(())
    }

    /// Drops what the peer acknowledged.
    fn trim(&mut self) {
        let acked = self.acked.load(Ordering::Acquire);
        if acked > self.base {
            let n = ((acked - self.base) as usize).min(self.kept.len());
            self.kept.drain(..n);
            self.base += n as u64;
        }
    }

    fn keep(&mut self, buf: &[u8]) {
        self.trim();
        self.kept.extend(buf);
        if self.kept.len() > self.cap {
            let n = self.kept.len() - self.cap;
            self.kept.drain(..n);
            self.base += n as u64;
        }
    }
}

impl<W: Write> Write for Resending<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.cap == 0 {
            return self.inner.write(buf);
        }
        self.keep(buf);
        if !self.broken && self.inner.write_all(buf).is_err() {
            self.broken = true;
        }
        Ok(buf.len())
    }

    fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        if self.cap == 0 {
            return self.inner.write_vectored(bufs);
        }
        // Small frames leave in one write, so the peer wakes once for them.
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total <= 64 * 1024 {
            let mut s = std::mem::take(&mut self.scratch);
            s.clear();
            for b in bufs {
                s.extend_from_slice(b);
            }
            let r = self.write(&s);
            self.scratch = s;
            return r;
        }
        for b in bufs {
            self.write(b)?;
        }
        Ok(total)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection that takes `room` bytes and then fails.
    struct Cut {
        got: Vec<u8>,
        room: usize,
    }

    impl Write for Cut {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.got.len() + buf.len() > self.room {
                return Err(std::io::ErrorKind::ConnectionReset.into());
            }
            self.got.extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_cut_stream_goes_on_from_what_the_peer_took() {
        let mut w = Resending::plain(Cut {
            got: Vec::new(),
            room: 10,
        });
        w.enable(1024);
        w.write_all(b"0123456").unwrap();
        // The connection fails in the middle of this frame: the write still succeeds.
        w.write_all(b"789abc").unwrap();
        assert!(w.is_broken());
        w.write_all(b"def").unwrap();
        assert_eq!(w.sent(), 16);
        // The peer took the first frame only.
        w.get_mut().got.clear();
        w.get_mut().room = usize::MAX;
        w.resume(7).unwrap();
        assert!(!w.is_broken());
        assert_eq!(w.get_ref().got, b"789abcdef");
    }

    #[test]
    fn acknowledged_bytes_are_dropped_and_cannot_be_asked_for() {
        let mut w = Resending::plain(Vec::new());
        w.enable(1024);
        w.write_all(b"abcdef").unwrap();
        w.acked().store(4, Ordering::Release);
        w.write_all(b"gh").unwrap();
        assert_eq!(
            w.check(2),
            Err(ResumeError::Dropped {
                taken: 2,
                kept_from: 4
            })
        );
        assert_eq!(w.check(9), Err(ResumeError::Ahead { taken: 9, sent: 8 }));
        w.get_mut().clear();
        w.resume(5).unwrap();
        assert_eq!(w.get_ref(), b"fgh");
    }

    #[test]
    fn what_is_kept_is_bounded() {
        let mut w = Resending::plain(Vec::new());
        w.enable(8);
        w.write_all(&[1; 20]).unwrap();
        assert_eq!(w.sent(), 20);
        assert!(w.check(11).is_err());
        assert!(w.check(12).is_ok());
    }

    #[test]
    fn a_plain_writer_passes_failures_on() {
        let mut w = Resending::plain(Cut {
            got: Vec::new(),
            room: 2,
        });
        assert!(w.write_all(b"abc").is_err());
        assert!(!w.is_enabled());
    }

    #[test]
    fn ack_frames_round_trip() {
        let f = ack_frame(12345);
        let h = FrameHeader::decode(f[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert!(is_ack(&h));
        assert_eq!(ack_count(&f[HEADER_LEN..]), Some(12345));
    }
}
