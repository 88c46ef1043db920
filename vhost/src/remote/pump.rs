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
    pub fn write_all(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.conn.writer().write_all(data)?;
        while self.conn.wants_write() {
            self.conn.write_tls(&mut self.tcp)?;
        }
        Ok(())
    }

    /// Reads exactly `buf.len()` bytes of plaintext, blocking. What follows them stays
    /// in rustls for the pump.
    pub fn read_exact(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        let mut got = 0;
        while got < buf.len() {
            match self.conn.reader().read(&mut buf[got..]) {
                Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if self.conn.read_tls(&mut self.tcp)? == 0 {
                        return Err(ErrorKind::UnexpectedEof.into());
                    }
                    let state = self.conn.process_new_packets();
                    while self.conn.wants_write() {
                        self.conn.write_tls(&mut self.tcp)?;
                    }
                    state.map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e))?;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
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

/// Where the bytes from the peer stand in its stream of frames.
#[derive(Debug, Default)]
struct FrameCursor {
    header: [u8; HEADER_LEN],
    have: usize,
    body_left: u64,
}

impl FrameCursor {
    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.body_left > 0 {
                let n = (self.body_left.min(bytes.len() as u64)) as usize;
                self.body_left -= n as u64;
                bytes = &bytes[n..];
                continue;
            }
            let n = (HEADER_LEN - self.have).min(bytes.len());
            self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have == HEADER_LEN {
                self.have = 0;
                self.body_left = match hira_protocol::FrameHeader::decode(&self.header) {
                    Ok(h) => u64::from(h.len),
                    // Not a frame: the stream is never at a boundary again.
                    Err(_) => u64::MAX,
                };
            }
        }
    }

    fn at_frame(&self) -> bool {
        self.have == 0 && self.body_left == 0
    }
}

fn would_block(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted)
}

/// Pumps until either side ends.
pub fn pump(local: &UnixStream, link: &mut TlsLink) -> End {
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
    let mut cursor = FrameCursor::default();
    let mut local_eof = false;
    let mut peer_eof = false;
    // Plaintext the exchange before the pump left in rustls is taken first.
    let mut take_plain = true;
    let failed = |cursor: &FrameCursor, e: std::io::Error| End::Peer {
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
                    Ok(n) => {
                        cursor.feed(&buf[..n]);
                        to_local.extend_from_slice(&buf[..n]);
                    }
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
    use hira_protocol::{FrameHeader, FrameKind};

    #[test]
    fn the_cursor_knows_frame_boundaries_across_pieces() {
        let mut c = FrameCursor::default();
        assert!(c.at_frame());
        let h = FrameHeader::new(FrameKind::Reply, 1, 0, 7, 10).encode();
        c.feed(&h[..5]);
        assert!(!c.at_frame());
        c.feed(&h[5..]);
        assert!(!c.at_frame(), "a body is due");
        c.feed(&[0; 9]);
        assert!(!c.at_frame());
        c.feed(&[0; 1]);
        assert!(c.at_frame());
        let mut two = h.to_vec();
        two.extend_from_slice(&[0; 10]);
        two.extend_from_slice(&h);
        c.feed(&two);
        assert!(!c.at_frame());
        c.feed(&[0; 10]);
        assert!(c.at_frame());
        c.feed(&[0xff; HEADER_LEN]);
        c.feed(&[0; 4096]);
        assert!(
            !c.at_frame(),
            "after bytes that are no frame, never at a boundary"
        );
    }
}
