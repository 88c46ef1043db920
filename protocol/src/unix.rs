//! Frames with an attached file descriptor over Unix sockets.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use sendfd::{RecvWithFd, SendWithFd};

use crate::frame::{FrameHeader, HEADER_LEN};

/// Largest frame these helpers exchange (handshakes only).
const MAX_SMALL_FRAME: usize = 4096;

/// Errors exchanging a frame with a descriptor.
#[derive(Debug, thiserror::Error)]
pub enum UnixFrameError {
    #[error("socket error")]
    Io(#[from] std::io::Error),
    #[error("connection closed before a whole frame arrived")]
    Closed,
    #[error("bad frame header")]
    Header(#[from] crate::FrameError),
    #[error("frame of {0} bytes is too long for a handshake")]
    TooLong(usize),
}

/// Most descriptors one frame carries (a ring region and its eventfds).
pub const MAX_FDS: usize = 8;

/// Receives one small frame and any descriptor sent with it (only the first counts;
/// extra ones are closed).
pub fn recv_frame_with_fd(
    s: &mut UnixStream,
) -> Result<(FrameHeader, Vec<u8>, Option<OwnedFd>), UnixFrameError> {
    let (header, payload, mut fds) = recv_frame_with_fds(s)?;
    let fd = if fds.is_empty() {
        None
    } else {
        Some(fds.swap_remove(0))
    };
    Ok((header, payload, fd))
}

/// Receives one small frame and the descriptors sent with it, in order. It reads no
/// byte past the frame, so frames sent back to back each arrive whole.
pub fn recv_frame_with_fds(
    s: &mut UnixStream,
) -> Result<(FrameHeader, Vec<u8>, Vec<OwnedFd>), UnixFrameError> {
    let mut buf = vec![0u8; MAX_SMALL_FRAME];
    // The header alone first: descriptors come with a frame's first byte.
    let mut fds = [-1i32; MAX_FDS];
    let (n, nfds) = s.recv_with_fd(&mut buf[..HEADER_LEN], &mut fds)?;
    let owned: Vec<OwnedFd> = fds[..nfds]
        .iter()
        .map(|&fd| {
            // SAFETY: the kernel just installed these descriptors for this process.
            unsafe { OwnedFd::from_raw_fd(fd) }
        })
        .collect();
    if n == 0 {
        return Err(UnixFrameError::Closed);
    }
    let mut have = n;
    if have < HEADER_LEN {
        s.read_exact(&mut buf[have..HEADER_LEN])
            .map_err(cut_short)?;
        have = HEADER_LEN;
    }
    let hb: [u8; HEADER_LEN] = buf[..HEADER_LEN].try_into().expect("header-sized slice");
    let header = FrameHeader::decode(&hb)?;
    let total = HEADER_LEN + header.len as usize;
    if total > MAX_SMALL_FRAME {
        return Err(UnixFrameError::TooLong(total));
    }
    if have < total {
        s.read_exact(&mut buf[have..total]).map_err(cut_short)?;
    }
    buf.truncate(total);
    let payload = buf.split_off(HEADER_LEN);
    Ok((header, payload, owned))
}

/// A frame that stopped arriving: closed, or (with a read timeout set) too slow.
fn cut_short(e: std::io::Error) -> UnixFrameError {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => UnixFrameError::Io(e),
        _ => UnixFrameError::Closed,
    }
}

/// Sends one frame, with `fd` attached if given.
pub fn send_frame_with_fd(
    s: &mut UnixStream,
    header: &FrameHeader,
    payload: &[u8],
    fd: Option<&OwnedFd>,
) -> std::io::Result<()> {
    let fds: Vec<&OwnedFd> = fd.into_iter().collect();
    send_frame_with_fds(s, header, payload, &fds)
}

/// Sends one frame with `fds` attached (at most [`MAX_FDS`]).
pub fn send_frame_with_fds(
    s: &mut UnixStream,
    header: &FrameHeader,
    payload: &[u8],
    fds: &[&OwnedFd],
) -> std::io::Result<()> {
    let mut bytes = header.encode().to_vec();
    bytes.extend_from_slice(payload);
    let fds: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let sent = s.send_with_fd(&bytes, &fds)?;
    if sent < bytes.len() {
        s.write_all(&bytes[sent..])?;
    }
    Ok(())
}

/// Whether a small frame written to socket `fd` now leaves at once: the socket is
/// writable. An acknowledgement (see `resend`) is sent only then, so that the end
/// that reads never waits for its peer to read.
pub fn writable_now(fd: std::os::fd::RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: polls one descriptor the caller holds, without waiting.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n == 1 && p.revents & libc::POLLOUT != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::FrameKind;

    #[test]
    fn frames_sent_back_to_back_arrive_whole_with_their_descriptors() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let fd = crate::shm::memfd(c"t", 4096, crate::shm::FIXED).unwrap();
        let h1 = FrameHeader::new(FrameKind::Notify, 1, 0, 0, 3);
        let h2 = FrameHeader::new(FrameKind::Hello, 0, 0, 0, 5);
        send_frame_with_fds(&mut a, &h1, b"abc", &[&fd]).unwrap();
        send_frame_with_fds(&mut a, &h2, b"hello", &[]).unwrap();
        a.write_all(&FrameHeader::new(FrameKind::Notify, 2, 0, 0, 0).encode())
            .unwrap();
        let (r1, p1, f1) = recv_frame_with_fds(&mut b).unwrap();
        assert_eq!((r1.opcode, p1.as_slice(), f1.len()), (1, &b"abc"[..], 1));
        let (r2, p2, f2) = recv_frame_with_fds(&mut b).unwrap();
        assert_eq!(
            (r2.kind, p2.as_slice(), f2.len()),
            (FrameKind::Hello, &b"hello"[..], 0)
        );
        let (r3, p3, _) = recv_frame_with_fds(&mut b).unwrap();
        assert_eq!((r3.opcode, p3.len()), (2, 0));
    }
}
