//! Migration of a live session to a new API server.
//!
//! The daemon moves the session without knowing its API: it asks the API server to
//! capture the session into a memfd (an opaque snapshot), starts a new API server
//! that adopts the snapshot and the guest's data plane (its ring region and
//! eventfds, its data window), and lets the old one go only once the new one has
//! restored everything. Until then the old one keeps the session: a capture or
//! restore that fails leaves the guest where it was. The guest sees a pause; its
//! object handles, rings and window stay as they are, and no call is lost or run
//! twice: the old server executes exactly what it read before the capture, and the
//! input it read and had not executed travels in the snapshot.
//!
//! Requests come from the control socket ([`Door::ask`]) and are carried out on the
//! session's own thread, which owns its API server.

use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

/// What one migration did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Moved {
    pub session: u64,
    pub from_pid: u32,
    pub to_pid: u32,
    /// Bytes of the snapshot.
    pub snapshot_bytes: u64,
    /// How long the guest's calls were held: from the capture request until the new
    /// API server serves, in milliseconds.
    pub pause_ms: f64,
    /// Of which: capturing (draining the device, reading contents) and restoring
    /// (starting the new server, replaying, writing contents).
    pub capture_ms: f64,
    pub restore_ms: f64,
}

type Reply = Sender<Result<Moved, String>>;

/// Where migration requests for one session wait for its thread.
#[derive(Debug)]
pub struct Door {
    /// The requests waiting, or, once the session cannot migrate, why.
    requests: Mutex<Result<VecDeque<Reply>, String>>,
    bell: UnixStream,
    /// Readable while requests wait; the session thread polls it.
    pub(crate) rung: UnixStream,
}

impl Door {
    pub fn new() -> std::io::Result<Arc<Self>> {
        let (bell, rung) = UnixStream::pair()?;
        bell.set_nonblocking(true)?;
        rung.set_nonblocking(true)?;
        Ok(Arc::new(Door {
            requests: Mutex::new(Ok(VecDeque::new())),
            bell,
            rung,
        }))
    }

    /// Asks for the session to move and waits for the outcome.
    pub fn ask(&self, timeout: Duration) -> Result<Moved, String> {
        let (tx, rx): (Reply, Receiver<_>) = channel();
        match &mut *self.requests.lock().unwrap_or_else(|e| e.into_inner()) {
            Ok(q) => q.push_back(tx),
            Err(why) => return Err(why.clone()),
        }
        let _ = (&self.bell).write_one();
        rx.recv_timeout(timeout)
            .map_err(|_| "the session did not answer (it may have ended)".to_string())?
    }

    /// The requests waiting, emptying the bell.
    pub(crate) fn take(&self) -> Vec<Reply> {
        let mut b = [0u8; 64];
        while matches!((&self.rung).read_some(&mut b), Ok(n) if n > 0) {}
        match &mut *self.requests.lock().unwrap_or_else(|e| e.into_inner()) {
            Ok(q) => q.drain(..).collect(),
            Err(_) => Vec::new(),
        }
    }

    /// From now on the session cannot migrate, for `why`; requests waiting get it.
    pub fn close(&self, why: &str) {
        let old = std::mem::replace(
            &mut *self.requests.lock().unwrap_or_else(|e| e.into_inner()),
            Err(why.to_string()),
        );
        for reply in old.into_iter().flatten() {
            let _ = reply.send(Err(why.to_string()));
        }
    }
}

trait Bell {
    fn write_one(self) -> std::io::Result<usize>;
    fn read_some(self, b: &mut [u8]) -> std::io::Result<usize>;
}

impl Bell for &UnixStream {
    fn write_one(mut self) -> std::io::Result<usize> {
        std::io::Write::write(&mut self, &[1])
    }
    fn read_some(mut self, b: &mut [u8]) -> std::io::Result<usize> {
        std::io::Read::read(&mut self, b)
    }
}

/// An empty memfd for a snapshot.
pub(crate) fn snapshot_file() -> std::io::Result<OwnedFd> {
    // SAFETY: the name is a NUL-terminated literal; the flags are valid.
    let fd = unsafe { libc::memfd_create(c"hira-snapshot".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: memfd_create just returned this descriptor, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether `fd` is readable now (or hung up).
pub(crate) fn readable(fd: &impl AsFd) -> bool {
    let mut p = [libc::pollfd {
        fd: fd.as_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    // SAFETY: one valid pollfd; a zero timeout never blocks.
    unsafe { libc::poll(p.as_mut_ptr(), 1, 0) > 0 }
}

/// Waits until `a` or `b` is readable (or hung up); returns which are.
pub(crate) fn wait_either(a: &impl AsFd, b: &impl AsFd) -> std::io::Result<(bool, bool)> {
    let mut p = [
        libc::pollfd {
            fd: a.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: b.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: two valid pollfds; no timeout.
        let n = unsafe { libc::poll(p.as_mut_ptr(), 2, -1) };
        if n >= 0 {
            return Ok((p[0].revents != 0, p[1].revents != 0));
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
