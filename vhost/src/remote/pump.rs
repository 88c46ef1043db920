//! Moves one session's bytes between a local stream (the guest's connection on a VM
//! host; the session's socket pair on a GPU host) and its TLS connection, both ways,
//! on one thread.
//!
//! rustls keeps one state machine per connection, so the two directions share it
//! under `poll(2)` rather than running as two blocking threads. Each direction
//! holds at most one read's worth of bytes: the local side is read only once the TLS
//! records before are written to the socket, and the TLS side only once the local
//! stream took the plaintext before. A slow reader on either end therefore holds up
//! its own session's sender and nothing else.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;

use hira_protocol::frame::HEADER_LEN;
use hira_protocol::{FrameHeader, FrameKind};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

/// Bytes read from either side at once.
const CHUNK: usize = 256 * 1024;

/// A session's TLS connection and its socket.
#[derive(Debug)]
pub struct TlsLink {
    pub conn: rustls::Connection,
    pub tcp: TcpStream,
}

impl TlsLink {
    /// Writes `data` and the records it makes, blocking (the exchange before the
    /// pump).
    pub fn write_all(&mut self, mut data: &[u8]) -> std::io::Result<()> {
        while !data.is_empty() {
            // rustls takes what its buffer holds; the records go before the rest.
            let n = self.conn.writer().write(data)?;
            data = &data[n..];
            while self.conn.wants_write() {
                self.conn.write_tls(&mut self.tcp)?;
            }
        }
        Ok(())
    }
}

impl Read for TlsLink {
    /// Blocks until some plaintext is there; 0 at the peer's end.
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            match self.conn.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if self.conn.read_tls(&mut self.tcp)? == 0 {
                        return Ok(0);
                    }
                    let state = self.conn.process_new_packets();
                    while self.conn.wants_write() {
                        self.conn.write_tls(&mut self.tcp)?;
                    }
                    state.map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e))?;
                }
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
            }
        }
    }
}

/// How the pump ended.
#[derive(Debug)]
pub enum End {
    /// The local side closed (or failed); the peer was told with `close_notify`.
    Local,
    /// The peer closed, or the TLS connection failed (`error`: a bad record, a
    /// reset). `at_frame` says whether the local side got whole frames only, so that
    /// one more frame can follow.
    Peer {
        at_frame: bool,
        error: Option<std::io::Error>,
    },
}

/// What a pump does with a session-level `Error` frame from the peer (call id 0,
/// its payload at most [`HELD_MAX`] bytes): takes it whole and gives the frame the
/// local side gets instead.
pub type OnSessionError<'a> = &'a mut dyn FnMut(FrameHeader, Vec<u8>) -> Vec<u8>;

/// The largest session-level error frame held whole.
const HELD_MAX: u32 = 64 * 1024;

/// The peer's stream of frames: where it stands, and a session-level error frame
/// being held whole.
#[derive(Debug, Default)]
struct PeerFrames {
    header: [u8; HEADER_LEN],
    have: usize,
    body_left: u64,
    held: Option<(FrameHeader, Vec<u8>)>,
}

impl PeerFrames {
    /// Passes `bytes` from the peer on to `out`, session-level errors through
    /// `on_error`.
    fn take(&mut self, mut bytes: &[u8], out: &mut Vec<u8>, on_error: OnSessionError<'_>) {
        while !bytes.is_empty() {
            if self.body_left > 0 {
                let n = (self.body_left.min(bytes.len() as u64)) as usize;
                match &mut self.held {
                    Some((_, p)) => p.extend_from_slice(&bytes[..n]),
                    None => out.extend_from_slice(&bytes[..n]),
                }
                self.body_left -= n as u64;
                bytes = &bytes[n..];
                self.release(out, on_error);
                continue;
            }
            let n = (HEADER_LEN - self.have).min(bytes.len());
            self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have < HEADER_LEN {
                continue;
            }
            self.have = 0;
            match FrameHeader::decode(&self.header) {
                Ok(h) if h.kind == FrameKind::Error && h.call_id == 0 && h.len <= HELD_MAX => {
                    self.body_left = u64::from(h.len);
                    self.held = Some((h, Vec::with_capacity(h.len as usize)));
                    self.release(out, on_error);
                }
                Ok(h) => {
                    out.extend_from_slice(&self.header);
                    self.body_left = u64::from(h.len);
                }
                // Not a frame: passed on, and never at a boundary again.
                Err(_) => {
                    out.extend_from_slice(&self.header);
                    self.body_left = u64::MAX;
                }
            }
        }
    }

    /// Hands a held frame that is whole to `on_error`.
    fn release(&mut self, out: &mut Vec<u8>, on_error: OnSessionError<'_>) {
        if self.body_left == 0
            && let Some((h, p)) = self.held.take()
        {
            out.extend_from_slice(&on_error(h, p));
        }
    }

    fn at_frame(&self) -> bool {
        self.have == 0 && self.body_left == 0 && self.held.is_none()
    }
}

/// Passes a session-level error frame on as it came.
pub fn unchanged(h: FrameHeader, payload: Vec<u8>) -> Vec<u8> {
    let mut f = h.encode().to_vec();
    f.extend_from_slice(&payload);
    f
}

fn would_block(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted)
}

/// Pumps until either side ends; the peer's session-level error frames go through
/// `on_error` ([`unchanged`] passes them on).
pub fn pump(local: &UnixStream, link: &mut TlsLink, on_error: OnSessionError<'_>) -> End {
    let TlsLink { conn, tcp } = link;
    // What rustls holds is bounded here instead: the local side is read only once the
    // records before went out, so at most one read's worth waits.
    conn.set_buffer_limit(None);
    if let Err(e) = local
        .set_nonblocking(true)
        .and_then(|()| tcp.set_nonblocking(true))
    {
        return End::Peer {
            at_frame: true,
            error: Some(e),
        };
    }
    let mut local_r = local;
    let mut local_w = local;
    let mut buf = vec![0u8; CHUNK];
    let mut to_local: Vec<u8> = Vec::new();
    let mut sent = 0;
    let mut cursor = PeerFrames::default();
    let mut local_eof = false;
    let mut peer_eof = false;
    // Plaintext the exchange before the pump left in rustls is taken first.
    let mut take_plain = true;
    let failed = |cursor: &PeerFrames, e: std::io::Error| End::Peer {
        at_frame: cursor.at_frame(),
        error: Some(e),
    };
    loop {
        if take_plain {
            take_plain = false;
            loop {
                match conn.reader().read(&mut buf) {
                    Ok(0) => {
                        peer_eof = true;
                        break;
                    }
                    Ok(n) => cursor.take(&buf[..n], &mut to_local, on_error),
                    Err(e) if would_block(&e) => break,
                    // The peer's socket closed without close_notify.
                    Err(e) if e.kind() == ErrorKind::UnexpectedEof => {
                        peer_eof = true;
                        break;
                    }
                    Err(e) => return failed(&cursor, e),
                }
            }
        }
        while conn.wants_write() {
            match conn.write_tls(tcp) {
                Ok(_) => {}
                Err(e) if would_block(&e) => break,
                Err(e) => return failed(&cursor, e),
            }
        }
        while sent < to_local.len() {
            match local_w.write(&to_local[sent..]) {
                Ok(n) => sent += n,
                Err(e) if would_block(&e) => break,
                Err(_) => return End::Local,
            }
        }
        if sent == to_local.len() {
            to_local.clear();
            sent = 0;
            if peer_eof {
                return End::Peer {
                    at_frame: cursor.at_frame(),
                    error: None,
                };
            }
        }
        if local_eof && !conn.wants_write() {
            return End::Local;
        }
        let read_local = !local_eof && !conn.wants_write();
        let read_peer = !peer_eof && to_local.is_empty();
        let mut local_events = PollFlags::empty();
        if read_local {
            local_events |= PollFlags::POLLIN;
        }
        if !to_local.is_empty() {
            local_events |= PollFlags::POLLOUT;
        }
        let mut tcp_events = PollFlags::empty();
        if read_peer {
            tcp_events |= PollFlags::POLLIN;
        }
        if conn.wants_write() {
            tcp_events |= PollFlags::POLLOUT;
        }
        let mut fds = [
            PollFd::new(local.as_fd(), local_events),
            PollFd::new(tcp.as_fd(), tcp_events),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return failed(&cursor, e.into()),
        }
        let local_ready = fds[0].revents().unwrap_or(PollFlags::empty());
        let tcp_ready = fds[1].revents().unwrap_or(PollFlags::empty());
        let hangup = PollFlags::POLLHUP | PollFlags::POLLERR;
        if local_ready.intersects(hangup) && !local_ready.contains(PollFlags::POLLIN) {
            conn.send_close_notify();
            local_eof = true;
            continue;
        }
        if read_local && local_ready.contains(PollFlags::POLLIN) {
            match local_r.read(&mut buf) {
                Ok(0) => {
                    conn.send_close_notify();
                    local_eof = true;
                }
                Ok(n) => {
                    if let Err(e) = conn.writer().write_all(&buf[..n]) {
                        return failed(&cursor, e);
                    }
                }
                Err(e) if would_block(&e) => {}
                Err(_) => {
                    conn.send_close_notify();
                    local_eof = true;
                }
            }
        }
        if read_peer && (tcp_ready.contains(PollFlags::POLLIN) || tcp_ready.intersects(hangup)) {
            match conn.read_tls(tcp) {
                Ok(0) => peer_eof = true,
                Ok(_) => {
                    if let Err(e) = conn.process_new_packets() {
                        // rustls queued an alert for the peer; it goes if it can.
                        let _ = conn.write_tls(tcp);
                        return failed(&cursor, std::io::Error::new(ErrorKind::InvalidData, e));
                    }
                    take_plain = true;
                }
                Err(e) if would_block(&e) => {}
                Err(e) => return failed(&cursor, e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_pass_whole_and_session_errors_go_through_the_hook() {
        let mut c = PeerFrames::default();
        let mut out = Vec::new();
        let seen = std::cell::RefCell::new(Vec::new());
        let mut hook = |_: FrameHeader, p: Vec<u8>| {
            seen.borrow_mut().push(p);
            unchanged(
                FrameHeader::new(FrameKind::Error, 0, 0, 0, 7),
                b"swapped".to_vec(),
            )
        };
        assert!(c.at_frame());
        let reply = FrameHeader::new(FrameKind::Reply, 1, 0, 7, 10).encode();
        let mut stream = reply.to_vec();
        stream.extend_from_slice(&[1; 10]);
        let err = FrameHeader::new(FrameKind::Error, 0, 0, 0, 3).encode();
        stream.extend_from_slice(&err);
        stream.extend_from_slice(b"abc");
        // Byte by byte: boundaries are known across pieces.
        for (i, b) in stream.iter().enumerate() {
            c.take(std::slice::from_ref(b), &mut out, &mut hook);
            let whole = i + 1 == HEADER_LEN + 10 || i + 1 == stream.len();
            assert_eq!(c.at_frame(), whole, "after {} bytes", i + 1);
        }
        assert_eq!(*seen.borrow(), vec![b"abc".to_vec()]);
        assert_eq!(&out[..HEADER_LEN + 10], &stream[..HEADER_LEN + 10]);
        assert!(out.ends_with(b"swapped"));
        // An error answering a call is passed as it is.
        let mut out = Vec::new();
        let call_err = FrameHeader::new(FrameKind::Error, 4, 0, 9, 2).encode();
        let mut s2 = call_err.to_vec();
        s2.extend_from_slice(b"no");
        c.take(&s2, &mut out, &mut hook);
        assert_eq!(out, s2);
        c.take(&[0xff; HEADER_LEN], &mut out, &mut unchanged);
        c.take(&[0; 4096], &mut out, &mut unchanged);
        assert!(
            !c.at_frame(),
            "after bytes that are no frame, never at a boundary"
        );
    }
}
