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

use hira_protocol::handshake::Token;
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
    pub captured: Sender<Result<Captured, String>>,
    pub placed: Receiver<Result<String, String>>,
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
    pub(crate) fn refuse(self, why: &str) {
        match self {
            Ask::Migrate(r, _) => {
                let _ = r.send(Err(why.to_string()));
            }
            Ask::Suspend(s) => {
                let _ = s.captured.send(Err(why.to_string()));
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
    requests: Mutex<Result<VecDeque<Ask>, String>>,
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
    pub fn ask(&self, timeout: Duration, device: Option<u32>) -> Result<Moved, String> {
        let (tx, rx): (Reply, Receiver<_>) = channel();
        self.push(Ask::Migrate(tx, device))?;
        rx.recv_timeout(timeout)
            .map_err(|_| "the session did not answer (it may have ended)".to_string())?
    }

    /// Suspends the session: captures it, lets `place` put the snapshot where a
    /// daemon will resume it (returning where the guest reconnects; empty: where it
    /// connected), then ends it here. If `place` fails, the session goes on here.
    pub fn suspend(
        &self,
        timeout: Duration,
        place: impl FnOnce(&Captured) -> Result<String, String>,
    ) -> Result<Captured, String> {
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
            .map_err(|_| "the session did not answer (it may have ended)".to_string())??;
        let placed = place(&captured);
        let _ = ptx.send(placed.clone());
        placed?;
        // The session's thread confirms it let go (or hung up, which is as good).
        let _ = drx.recv_timeout(timeout);
        Ok(captured)
    }

    fn push(&self, ask: Ask) -> Result<(), String> {
        match &mut *self.requests.lock().unwrap_or_else(|e| e.into_inner()) {
            Ok(q) => q.push_back(ask),
            Err(why) => return Err(why.clone()),
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
    pub fn close(&self, why: &str) {
        let old = std::mem::replace(
            &mut *self.requests.lock().unwrap_or_else(|e| e.into_inner()),
            Err(why.to_string()),
        );
        for ask in old.into_iter().flatten() {
            ask.refuse(why);
        }
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

/// A token as text, for the control socket.
pub fn token_hex(t: &Token) -> String {
    t.iter().map(|b| format!("{b:02x}")).collect()
}

/// A token from its text.
pub fn token_from_hex(s: &str) -> Option<Token> {
    if s.len() != 32 || !s.is_ascii() {
        return None;
    }
    let mut t = [0u8; 16];
    for (i, b) in t.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(t)
}

/// Where a VM session's data window and rings lie in the VM's shared window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct VmSlot {
    /// The slot's offset and length in the window (as leased).
    pub offset: u64,
    pub len: u64,
    /// The session's data window within it, and its rings.
    pub window_len: u64,
    pub ring_offset: u64,
}

/// A suspended session waiting here for its guest.
#[derive(Debug)]
pub struct Parked {
    pub token: Token,
    pub vm: String,
    pub snapshot: OwnedFd,
    pub bytes: u64,
    /// A VM session's slot, reserved in `queue`'s window until it resumes.
    pub slot: Option<(VmSlot, std::sync::Arc<crate::router::VmQueue>)>,
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
pub struct SlotGuard(pub Option<(VmSlot, std::sync::Arc<crate::router::VmQueue>)>);

impl SlotGuard {
    pub fn take(mut self) -> Option<(VmSlot, std::sync::Arc<crate::router::VmQueue>)> {
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
    router: &crate::router::Router,
    vm: &str,
    slot: Option<VmSlot>,
) -> Result<SlotGuard, String> {
    let Some(s) = slot else {
        return Ok(SlotGuard(None));
    };
    let Some(q) = router.get(vm) else {
        return Err(format!("this daemon serves no VM {vm:?}"));
    };
    if !q.window.get().is_some_and(|w| w.reserve(s.offset, s.len)) {
        return Err(format!(
            "VM {vm:?} has no free window slot at {} of {} bytes here",
            s.offset, s.len
        ));
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
) -> Result<(), String> {
    let snapshot = snapshot_file().map_err(|e| format!("no room for the snapshot: {e}"))?;
    let mut file = std::fs::File::from(snapshot);
    let copied = std::io::copy(&mut std::io::Read::take(from, bytes), &mut file)
        .map_err(|e| format!("the snapshot could not be read: {e}"))?;
    if copied != bytes {
        return Err("the snapshot was cut short".into());
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
    pub fn take_slot(&mut self) -> Option<(VmSlot, std::sync::Arc<crate::router::VmQueue>)> {
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

/// A file of a suspended session, as `hira-ctl checkpoint` writes it and `hira-ctl
/// restore` reads it:
///
/// ```text
/// magic "HIRASESS" (8), version u16 (1), token (16), VM name (u16 length, bytes),
/// VM slot (u8 0, or 1 and four u64: offset, length, window length, ring offset),
/// then the snapshot (the API server's format; see the migration crate)
/// ```
pub mod file {
    use std::io::{Read, Write};

    use hira_protocol::handshake::Token;

    const MAGIC: &[u8; 8] = b"HIRASESS";
    const VERSION: u16 = 1;

    /// Writes the header; the snapshot follows.
    pub fn write_header(
        w: &mut impl Write,
        token: &Token,
        vm: &str,
        slot: Option<super::VmSlot>,
    ) -> std::io::Result<()> {
        w.write_all(MAGIC)?;
        w.write_all(&VERSION.to_le_bytes())?;
        w.write_all(token)?;
        let name = vm.as_bytes();
        let len =
            u16::try_from(name.len()).map_err(|_| std::io::Error::other("VM name too long"))?;
        w.write_all(&len.to_le_bytes())?;
        w.write_all(name)?;
        match slot {
            None => w.write_all(&[0]),
            Some(s) => {
                w.write_all(&[1])?;
                for v in [s.offset, s.len, s.window_len, s.ring_offset] {
                    w.write_all(&v.to_le_bytes())?;
                }
                Ok(())
            }
        }
    }

    /// Reads the header; the reader is left at the snapshot.
    pub fn read_header(
        r: &mut impl Read,
    ) -> std::io::Result<(Token, String, Option<super::VmSlot>)> {
        let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
        let mut magic = [0u8; 8];
        r.read_exact(&mut magic)?;
        if &magic != MAGIC {
            return Err(bad("not a Hira session file"));
        }
        let mut v = [0u8; 2];
        r.read_exact(&mut v)?;
        if u16::from_le_bytes(v) != VERSION {
            return Err(bad("a session file of another version"));
        }
        let mut token = [0u8; 16];
        r.read_exact(&mut token)?;
        let mut len = [0u8; 2];
        r.read_exact(&mut len)?;
        let mut name = vec![0u8; u16::from_le_bytes(len) as usize];
        r.read_exact(&mut name)?;
        let vm = String::from_utf8(name).map_err(|_| bad("the VM name is not UTF-8"))?;
        let mut flag = [0u8; 1];
        r.read_exact(&mut flag)?;
        let slot = match flag[0] {
            0 => None,
            1 => {
                let mut v = [0u64; 4];
                for x in &mut v {
                    let mut b = [0u8; 8];
                    r.read_exact(&mut b)?;
                    *x = u64::from_le_bytes(b);
                }
                Some(super::VmSlot {
                    offset: v[0],
                    len: v[1],
                    window_len: v[2],
                    ring_offset: v[3],
                })
            }
            _ => return Err(bad("a malformed VM slot")),
        };
        Ok((token, vm, slot))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_header_reads_back_and_others_are_refused() {
            let slot = super::super::VmSlot {
                offset: 4096,
                len: 8192,
                window_len: 4096,
                ring_offset: 8192,
            };
            for slot in [None, Some(slot)] {
                let mut b = Vec::new();
                write_header(&mut b, &[3; 16], "vm-a", slot).unwrap();
                b.extend_from_slice(b"snapshot");
                let mut r = &b[..];
                assert_eq!(
                    read_header(&mut r).unwrap(),
                    ([3; 16], "vm-a".to_string(), slot)
                );
                assert_eq!(r, b"snapshot");
            }
            assert!(read_header(&mut &b"HIRASNAP........"[..]).is_err());
        }
    }
}
