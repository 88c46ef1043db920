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
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hira_protocol::handshake::Token;

pub(crate) mod mover;

pub use hira_control::{Moved, VmSlot};

type Reply = Sender<Result<Moved, MigrateError>>;

/// Why a session no longer takes migration requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Closed {
    #[error("session {0} has ended")]
    Ended(u64),
    #[error("session {0} was suspended")]
    Suspended(u64),
}

/// Why a session did not move or was not suspended; it goes on where it was.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error(transparent)]
    Closed(#[from] Closed),
    #[error("the session did not answer (it may have ended)")]
    NoAnswer,
    #[error("the session is being suspended already")]
    Suspending,
    #[error("the guest did not stop sending in time (a guest shim that predates protocol 4?)")]
    GuestKeptSending,
    #[error("cannot reach the guest: {0}")]
    Guest(#[source] std::io::Error),
    #[error("no room for the snapshot: {0}")]
    SnapshotFile(#[source] std::io::Error),
    #[error("cannot reach the API server: {0}")]
    ApiServer(#[source] std::io::Error),
    #[error("the API server did not capture the session in time")]
    CaptureTimeout,
    /// The API server's own words: why it could not capture, or (the new one) restore.
    #[error("{0}")]
    ApiServerRefused(String),
    #[error("cannot start an API server: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("the new API server: {0}")]
    Handover(#[source] std::io::Error),
    #[error("the new API server's answer: {0}")]
    Answer(#[source] hira_protocol::unix::UnixFrameError),
    #[error(transparent)]
    Place(#[from] PlaceError),
    #[error("this daemon serves no VM {0:?}")]
    NoVm(String),
    #[error("VM {vm:?} has no free window slot at {offset} of {len} bytes here")]
    NoSlot { vm: String, offset: u64, len: u64 },
    #[error("the snapshot could not be read: {0}")]
    ReadSnapshot(#[source] std::io::Error),
    #[error("the snapshot was cut short")]
    ShortSnapshot,
}

/// Why a suspended session's snapshot was not placed where a daemon resumes it.
#[derive(Debug, thiserror::Error)]
pub enum PlaceError {
    #[error("the client did not store the snapshot: {0}")]
    NotStored(String),
    #[error("the client went away: {0}")]
    ClientGone(String),
    #[error("cannot read the snapshot: {0}")]
    Snapshot(#[source] std::io::Error),
    #[error("the daemon at {path}: {source}")]
    Daemon {
        path: std::path::PathBuf,
        #[source]
        source: hira_control::ControlError,
    },
    #[error("GPU host {gpu:?}: {source}")]
    Remote {
        gpu: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Where a suspended session's snapshot went, as its thread hears it.
#[derive(Debug)]
pub(crate) enum Placement {
    /// Placed; the guest reconnects at this endpoint (empty: the one it used).
    At(String),
    /// Not placed, for this reason (the session goes on here).
    Failed(String),
}

/// A session captured for a suspension: the snapshot and what resumes it.
#[derive(Debug)]
pub struct Captured {
    pub snapshot: OwnedFd,
    pub bytes: u64,
    pub token: Token,
    pub vm: String,
    /// A VM session's slot of the VM's window, where its rings stay.
    pub slot: Option<VmSlot>,
    pub from_pid: u32,
    pub capture_ms: f64,
}

/// A suspension asked of a session's thread: it sends what it captured, and waits to
/// hear whether the snapshot was placed (and where the guest is to reconnect: empty
/// for the endpoint it used) before it lets the API server go.
#[derive(Debug)]
pub(crate) struct Suspension {
    pub captured: Sender<Result<Captured, MigrateError>>,
    pub placed: Receiver<Placement>,
    /// Told once the session has left this daemon (its API server gone, its guest
    /// told where to go).
    pub done: Sender<()>,
}

/// What a session's thread is asked to do.
#[derive(Debug)]
pub(crate) enum Ask {
    /// To a new API server; on the host's device of this index, if given.
    Migrate(Reply, Option<u32>),
    Suspend(Suspension),
}

impl Ask {
    pub(crate) fn refuse(self, why: Closed) {
        match self {
            Ask::Migrate(r, _) => {
                let _ = r.send(Err(why.into()));
            }
            Ask::Suspend(s) => {
                let _ = s.captured.send(Err(why.into()));
            }
        }
    }
}

/// Longest a suspension waits for its snapshot to be placed.
pub(crate) const PLACE_LIMIT: Duration = Duration::from_secs(300);

/// Where migration requests for one session wait for its thread.
#[derive(Debug)]
pub struct Door {
    /// The requests waiting, or, once the session cannot migrate, why.
    requests: Mutex<Result<VecDeque<Ask>, Closed>>,
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

    /// Asks for the session to move to a new API server (on the host's device of
    /// index `device`, if given) and waits for the outcome.
    pub fn ask(&self, timeout: Duration, device: Option<u32>) -> Result<Moved, MigrateError> {
        let (tx, rx): (Reply, Receiver<_>) = channel();
        self.push(Ask::Migrate(tx, device))?;
        rx.recv_timeout(timeout)
            .map_err(|_| MigrateError::NoAnswer)?
    }

    /// Suspends the session: captures it, lets `place` put the snapshot where a
    /// daemon will resume it (returning where the guest reconnects; empty: where it
    /// connected), then ends it here. If `place` fails, the session goes on here.
    pub fn suspend(
        &self,
        timeout: Duration,
        place: impl FnOnce(&Captured) -> Result<String, PlaceError>,
    ) -> Result<Captured, MigrateError> {
        let (ctx, crx) = channel();
        let (ptx, prx) = channel();
        let (dtx, drx) = channel();
        self.push(Ask::Suspend(Suspension {
            captured: ctx,
            placed: prx,
            done: dtx,
        }))?;
        let captured = crx
            .recv_timeout(timeout)
            .map_err(|_| MigrateError::NoAnswer)??;
        let placed = place(&captured);
        let _ = ptx.send(match &placed {
            Ok(endpoint) => Placement::At(endpoint.clone()),
            Err(e) => Placement::Failed(e.to_string()),
        });
        placed?;
        // The session's thread confirms it let go (or hung up, which is as good).
        let _ = drx.recv_timeout(timeout);
        Ok(captured)
    }

    fn push(&self, ask: Ask) -> Result<(), Closed> {
        match &mut *self.requests.lock().unwrap_or_else(|e| e.into_inner()) {
            Ok(q) => q.push_back(ask),
            Err(why) => return Err(*why),
        }
        let _ = std::io::Write::write(&mut &self.bell, &[1]);
        Ok(())
    }

    /// The requests waiting, emptying the bell.
    pub(crate) fn take(&self) -> Vec<Ask> {
        let mut b = [0u8; 64];
        while matches!(std::io::Read::read(&mut &self.rung, &mut b), Ok(n) if n > 0) {}
        match &mut *self.requests.lock().unwrap_or_else(|e| e.into_inner()) {
            Ok(q) => q.drain(..).collect(),
            Err(_) => Vec::new(),
        }
    }

    /// From now on the session cannot migrate, for `why`; requests waiting get it.
    pub fn close(&self, why: Closed) {
        let old = std::mem::replace(
            &mut *self.requests.lock().unwrap_or_else(|e| e.into_inner()),
            Err(why),
        );
        for ask in old.into_iter().flatten() {
            ask.refuse(why);
        }
    }
}

/// An empty memfd for a snapshot.
pub(crate) fn snapshot_file() -> std::io::Result<OwnedFd> {
    hira_protocol::shm::memfd(c"hira-snapshot", 0, 0)
}

/// Waits until `a` or `b` is readable (or hung up), for at most `limit` if given
/// (then neither); returns which are.
pub(crate) fn wait_either(
    a: &impl AsFd,
    b: &impl AsFd,
    limit: Option<Duration>,
) -> std::io::Result<(bool, bool)> {
    let timeout = limit.map_or(-1, |d| d.as_millis().min(i32::MAX as u128) as i32);
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
        // SAFETY: two valid pollfds.
        let n = unsafe { libc::poll(p.as_mut_ptr(), 2, timeout) };
        if n >= 0 {
            return Ok((p[0].revents != 0, p[1].revents != 0));
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// A fresh resume token.
pub fn new_token() -> Token {
    let mut t = [0u8; 16];
    let mut got = 0;
    while got < t.len() {
        // SAFETY: writes at most the remaining bytes of a local buffer.
        let n = unsafe { libc::getrandom(t[got..].as_mut_ptr().cast(), t.len() - got, 0) };
        if n > 0 {
            got += n as usize;
        } else if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            // No randomness at all: a token nobody can guess is impossible, and a
            // guessable one would let another guest take the session.
            panic!("getrandom failed: {}", std::io::Error::last_os_error());
        }
    }
    t
}

/// A suspended session waiting here for its guest.
#[derive(Debug)]
pub struct Parked {
    pub token: Token,
    pub vm: String,
    pub snapshot: OwnedFd,
    pub bytes: u64,
    /// A VM session's slot, reserved in `queue`'s window until it resumes.
    pub slot: Option<(VmSlot, std::sync::Arc<crate::vms::Vm>)>,
}

impl Drop for Parked {
    fn drop(&mut self) {
        // A session that never resumes gives its slot back; one that resumes has
        // taken it (see `take_slot`).
        if let Some((s, q)) = self.slot.take()
            && let Some(w) = q.window.get()
        {
            w.unreserve(s.offset, s.len);
        }
    }
}

/// A slot reserved for a session about to be parked: given back if it never is.
#[derive(Debug)]
pub struct SlotGuard(pub Option<(VmSlot, std::sync::Arc<crate::vms::Vm>)>);

impl SlotGuard {
    pub fn take(mut self) -> Option<(VmSlot, std::sync::Arc<crate::vms::Vm>)> {
        self.0.take()
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if let Some((s, q)) = self.0.take()
            && let Some(w) = q.window.get()
        {
            w.unreserve(s.offset, s.len);
        }
    }
}

/// Keeps slot `slot` of VM `vm`'s window for a session that will resume in it here;
/// the guard gives it back unless the session is parked with it.
pub fn reserve_slot(
    vms: &crate::vms::Vms,
    vm: &str,
    slot: Option<VmSlot>,
) -> Result<SlotGuard, MigrateError> {
    let Some(s) = slot else {
        return Ok(SlotGuard(None));
    };
    let Some(q) = vms.get(vm) else {
        return Err(MigrateError::NoVm(vm.to_string()));
    };
    if !q.window.get().is_some_and(|w| w.reserve(s.offset, s.len)) {
        return Err(MigrateError::NoSlot {
            vm: vm.to_string(),
            offset: s.offset,
            len: s.len,
        });
    }
    Ok(SlotGuard(Some((s, q))))
}

/// Parks a suspended session of VM `vm` here, to wait for its guest: its snapshot is
/// the next `bytes` of `from`.
pub fn park_from(
    life: &crate::lifecycle::Lifecycle,
    vm: &str,
    token: hira_protocol::handshake::Token,
    slot: SlotGuard,
    bytes: u64,
    from: &mut impl std::io::Read,
) -> Result<(), MigrateError> {
    let snapshot = snapshot_file().map_err(MigrateError::SnapshotFile)?;
    let mut file = std::fs::File::from(snapshot);
    let copied = std::io::copy(&mut std::io::Read::take(from, bytes), &mut file)
        .map_err(MigrateError::ReadSnapshot)?;
    if copied != bytes {
        return Err(MigrateError::ShortSnapshot);
    }
    life.park(Parked {
        token,
        vm: vm.to_string(),
        snapshot: OwnedFd::from(file),
        bytes,
        slot: slot.take(),
    });
    Ok(())
}

impl Parked {
    /// The slot, now that the session resumes in it.
    pub fn take_slot(&mut self) -> Option<(VmSlot, std::sync::Arc<crate::vms::Vm>)> {
        self.slot.take()
    }
}

/// How long a parked session waits for its guest before its snapshot is dropped
/// (guests give up after their `HIRA_RESUME_SECS`, 60 s by default).
pub const PARK_LIMIT: Duration = Duration::from_secs(600);

/// Whether `fd` is an eventfd.
pub(crate) fn is_eventfd(fd: &OwnedFd) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .is_ok_and(|p| p.as_os_str() == "anon_inode:[eventfd]")
}
