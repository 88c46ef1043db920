//! The daemon's lifecycle: the live sessions, the record of ended ones, and an
//! orderly stop.
//!
//! Every session registers its guest connection here. On SIGTERM or SIGINT the daemon
//! stops accepting, shuts every guest connection down (each session then ends its API
//! server and reaps it as on any disconnect) and waits, bounded, for the sessions to
//! finish. The control socket reads the same records.

use std::collections::{HashMap, VecDeque};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Ended sessions kept for status queries.
const ENDED_KEPT: usize = 256;

pub use hira_control::{EndedSession, LiveSession};

#[derive(Debug, Default)]
struct State {
    live: HashMap<u64, (UnixStream, LiveSession)>,
    ended: VecDeque<EndedSession>,
    /// Sessions that can migrate, by id.
    doors: HashMap<u64, Arc<crate::migrate::Door>>,
    /// Suspended sessions waiting for their guests, by token, with when they came.
    parked: HashMap<hira_protocol::handshake::Token, (crate::migrate::Parked, Instant)>,
    /// Live sessions whose guest connection a device reset cut, waiting for the guest
    /// to connect again: their VM and where its new connection goes (with how many
    /// bytes of the relayed stream its guest says it took in).
    detached:
        HashMap<hira_protocol::handshake::Token, (String, std::sync::mpsc::Sender<Reattached>)>,
}

/// A guest's new connection to its live session, and the bytes of the relayed
/// stream it took in before the cut (see `hira_protocol::resend`).
pub type Reattached = (UnixStream, u64);

/// Live sessions, ended sessions and the stop flag.
#[derive(Debug, Default)]
pub struct Lifecycle {
    stopping: AtomicBool,
    state: Mutex<State>,
    changed: Condvar,
    /// API servers that died of a signal the daemon did not send.
    pub api_server_crashes: AtomicU64,
    /// Sessions moved to a new API server, suspended (to leave this daemon) and
    /// resumed here.
    pub migrations: AtomicU64,
    pub suspensions: AtomicU64,
    pub resumptions: AtomicU64,
    /// Connections from other hosts refused.
    pub remote_refused: AtomicU64,
    /// This (GPU) host is being drained: it takes no new remote sessions.
    pub draining: AtomicBool,
    /// Placed sessions a GPU host handed to another, by token: where their guests'
    /// resumptions go, and since when.
    moves: Mutex<HashMap<hira_protocol::handshake::Token, (String, Instant)>>,
    /// Guests that connected again to their live session after a device reset.
    pub reconnections: AtomicU64,
}

/// A registered session; it leaves the registry when dropped.
#[derive(Debug)]
pub struct Registration {
    life: Arc<Lifecycle>,
    id: u64,
    ended: Option<EndedSession>,
    /// Released before the session leaves the registry, so that whoever waits for it
    /// to end finds what it held (a listener's connection slot) free already.
    held: Option<Box<dyn std::fmt::Debug + Send>>,
}

impl Registration {
    /// Records what the session's guest and API server are.
    pub fn describe(&self, api: &'static str, process: &str, guest_pid: u32, api_server_pid: u32) {
        if let Some((_, s)) = self.life.lock().live.get_mut(&self.id) {
            s.api = api.to_string();
            s.process = process.to_string();
            s.guest_pid = guest_pid;
            s.api_server_pid = Some(api_server_pid);
        }
        self.life.changed.notify_all();
    }

    /// Records that the session runs on GPU host `gpu_host`, with no API server here.
    pub fn placed(&self, gpu_host: &str) {
        if let Some((_, s)) = self.life.lock().live.get_mut(&self.id) {
            s.api_server_pid = None;
            s.gpu_host = Some(gpu_host.to_string());
        }
        self.life.changed.notify_all();
    }

    /// Lets the control socket ask this session to migrate, through `door`.
    pub fn accept_migrations(&self, door: Arc<crate::migrate::Door>) {
        self.life.lock().doors.insert(self.id, door);
    }

    /// Records that the session moved to API server `pid`.
    pub fn moved(&self, pid: u32) {
        self.life.migrations.fetch_add(1, Ordering::Relaxed);
        if let Some((_, s)) = self.life.lock().live.get_mut(&self.id) {
            s.api_server_pid = Some(pid);
            s.migrations += 1;
        }
        self.life.changed.notify_all();
    }

    /// Records that the session left this daemon (suspended): it has no API server.
    pub fn suspended(&self) {
        self.life.suspensions.fetch_add(1, Ordering::Relaxed);
        if let Some((_, s)) = self.life.lock().live.get_mut(&self.id) {
            s.api_server_pid = None;
            s.serving = false;
        }
        self.life.changed.notify_all();
    }

    /// Records that the session's handshake is done and its calls are served.
    pub fn serving(&self) {
        if let Some((_, s)) = self.life.lock().live.get_mut(&self.id) {
            s.serving = true;
        }
        self.life.changed.notify_all();
    }

    /// Keeps `guard` (a connection slot) until the session ends.
    pub fn hold(&mut self, guard: Box<dyn std::fmt::Debug + Send>) {
        self.held = Some(guard);
    }

    /// Records how the session ended; kept when the registration drops.
    pub fn ended(&mut self, e: EndedSession) {
        self.ended = Some(e);
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        drop(self.held.take());
        let mut s = self.life.lock();
        s.doors.remove(&self.id);
        let live = s.live.remove(&self.id);
        let mut e = self.ended.take().unwrap_or_default();
        if let Some((_, l)) = live {
            e.id = l.id;
            e.vm = l.vm;
            if e.process.is_empty() {
                e.process = l.process;
            }
            e.api_server_pid = e.api_server_pid.or(l.api_server_pid);
        }
        if s.ended.len() == ENDED_KEPT {
            s.ended.pop_front();
        }
        s.ended.push_back(e);
        let idle = s.live.is_empty();
        drop(s);
        self.life.changed.notify_all();
        if idle {
            // The last session's buffers go back to the system, so an idle daemon's
            // memory is what it needs idle.
            #[cfg(target_env = "gnu")]
            // SAFETY: malloc_trim only releases free heap memory.
            unsafe {
                libc::malloc_trim(0);
            }
        }
    }
}

/// How long a placed session's move is remembered for its guest's resumption (its
/// guest gives up sooner: `HIRA_RESUME_SECS`, 60 s by default).
const MOVE_KEPT: Duration = Duration::from_secs(600);

impl Lifecycle {
    /// Remembers that the placed session of `token` now lives on GPU host `gpu`.
    pub fn remember_move(&self, token: hira_protocol::handshake::Token, gpu: &str) {
        let mut m = self.moves.lock().unwrap_or_else(|e| e.into_inner());
        m.retain(|_, (_, at)| at.elapsed() < MOVE_KEPT);
        m.insert(token, (gpu.to_string(), Instant::now()));
    }

    /// Where the placed session of `token` moved, taken once.
    pub fn moved_to(&self, token: &hira_protocol::handshake::Token) -> Option<String> {
        self.moves
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(token)
            .map(|(g, _)| g)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the daemon is stopping.
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Registers session `id` of VM `vm` with (a clone of) its guest connection;
    /// refused when the daemon is stopping or out of descriptors.
    pub fn register(
        self: &Arc<Self>,
        id: u64,
        vm: &str,
        guest: &UnixStream,
    ) -> Result<Registration, &'static str> {
        let clone = guest
            .try_clone()
            .map_err(|_| "the host is out of resources; try again")?;
        let mut s = self.lock();
        if self.stopping() {
            return Err("the daemon is stopping");
        }
        let live = LiveSession {
            id,
            vm: vm.to_string(),
            ..LiveSession::default()
        };
        s.live.insert(id, (clone, live));
        drop(s);
        self.changed.notify_all();
        Ok(Registration {
            life: self.clone(),
            id,
            ended: None,
            held: None,
        })
    }

    /// Where to ask live session `id` to migrate; `None` if it is not live or cannot
    /// migrate.
    pub fn door(&self, id: u64) -> Option<Arc<crate::migrate::Door>> {
        self.lock().doors.get(&id).cloned()
    }

    /// Keeps a suspended session for its guest to resume.
    pub fn park(&self, p: crate::migrate::Parked) {
        let mut s = self.lock();
        Self::expire(&mut s);
        s.parked.insert(p.token, (p, Instant::now()));
        drop(s);
        self.changed.notify_all();
    }

    /// Drops parked sessions whose guests did not come back in time.
    fn expire(s: &mut State) {
        s.parked.retain(|_, (p, since)| {
            let keep = since.elapsed() < crate::migrate::PARK_LIMIT;
            if !keep {
                log::warn!(
                    "a suspended session of VM {:?} was not resumed in {:?}; dropped",
                    p.vm,
                    crate::migrate::PARK_LIMIT
                );
            }
            keep
        });
    }

    /// Takes the suspended session `token` of VM `vm`, if it is parked here.
    pub fn unpark(
        &self,
        token: &hira_protocol::handshake::Token,
        vm: &str,
    ) -> Option<crate::migrate::Parked> {
        let mut s = self.lock();
        Self::expire(&mut s);
        if s.parked.get(token).is_some_and(|(p, _)| p.vm == vm) {
            s.parked.remove(token).map(|(p, _)| p)
        } else {
            None
        }
    }

    /// Waits up to `limit` for the guest of a live session of VM `vm` (resume token
    /// `token`) whose connection was cut to connect again; its new connection, or
    /// `None`.
    pub fn await_reattach(
        &self,
        token: hira_protocol::handshake::Token,
        vm: &str,
        limit: std::time::Duration,
    ) -> Option<Reattached> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.lock().detached.insert(token, (vm.to_string(), tx));
        let got = rx.recv_timeout(limit).ok();
        self.lock().detached.remove(&token);
        // A connection handed over as the wait ended is taken too.
        got.or_else(|| rx.try_recv().ok())
    }

    /// Hands `guest`, a new connection of VM `vm` resuming with `token` (having taken
    /// `taken` bytes of its relayed stream), to the live session waiting for it; gives
    /// it back if none is.
    pub fn reattach(
        &self,
        token: &hira_protocol::handshake::Token,
        vm: &str,
        guest: UnixStream,
        taken: u64,
    ) -> Result<(), UnixStream> {
        let s = self.lock();
        match s.detached.get(token) {
            Some((v, tx)) if v == vm => tx.send((guest, taken)).map_err(|e| e.0.0),
            _ => Err(guest),
        }
    }

    /// Live sessions waiting for their guest to connect again after a device reset.
    pub fn detached(&self) -> usize {
        self.lock().detached.len()
    }

    /// The live sessions that may be asked to migrate, by id.
    pub fn doors(&self) -> Vec<(u64, Arc<crate::migrate::Door>)> {
        let mut v: Vec<_> = self
            .lock()
            .doors
            .iter()
            .map(|(id, d)| (*id, d.clone()))
            .collect();
        v.sort_by_key(|(id, _)| *id);
        v
    }

    /// The suspended sessions parked here: VM and snapshot size.
    pub fn parked(&self) -> Vec<(String, u64)> {
        let mut s = self.lock();
        Self::expire(&mut s);
        let mut v: Vec<_> = s
            .parked
            .values()
            .map(|(p, _)| (p.vm.clone(), p.bytes))
            .collect();
        v.sort();
        v
    }

    /// Live sessions.
    pub fn sessions(&self) -> usize {
        self.lock().live.len()
    }

    /// The live sessions and the most recently ended ones.
    pub fn snapshot(&self) -> (Vec<LiveSession>, Vec<EndedSession>) {
        let s = self.lock();
        let mut live: Vec<LiveSession> = s.live.values().map(|(_, l)| l.clone()).collect();
        live.sort_by_key(|l| l.id);
        (live, s.ended.iter().cloned().collect())
    }

    /// Waits until no session is live; false on timeout.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        self.wait_live(0, timeout)
    }

    /// Waits until exactly `n` sessions are live, each with its API server started;
    /// false on timeout.
    pub fn wait_live(&self, n: usize, timeout: Duration) -> bool {
        self.wait_sessions(n, true, timeout)
    }

    /// Waits until exactly `n` sessions are live (with their API servers started if
    /// `started`; a session still in its handshake has none); false on timeout.
    pub fn wait_sessions(&self, n: usize, started: bool, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut s = self.lock();
        loop {
            let with_server = s
                .live
                .values()
                .filter(|(_, l)| l.api_server_pid.is_some())
                .count();
            if s.live.len() == n && (!started || with_server == n) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            s = self
                .changed
                .wait_timeout(s, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Ends every session of VM `vm` (removed at run time): cuts their guests'
    /// connections, so each ends its API server as on any disconnect, drops its
    /// suspended sessions and stops its sessions waiting for a guest to come back,
    /// and waits up to `timeout` for them to end. Returns how many were live and how
    /// many are still.
    pub fn end_vm(&self, vm: &str, timeout: Duration) -> (usize, usize) {
        let deadline = Instant::now() + timeout;
        let mut s = self.lock();
        s.parked.retain(|_, (p, _)| p.vm != vm);
        // A session waiting for its guest to reconnect stops waiting (its sender goes).
        s.detached.retain(|_, (v, _)| v != vm);
        let mut live = 0;
        for (guest, l) in s.live.values() {
            if l.vm == vm {
                let _ = guest.shutdown(std::net::Shutdown::Both);
                live += 1;
            }
        }
        loop {
            let left = s.live.values().filter(|(_, l)| l.vm == vm).count();
            let wait = deadline.saturating_duration_since(Instant::now());
            if left == 0 || wait.is_zero() {
                return (live, left);
            }
            s = self
                .changed
                .wait_timeout(s, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Stops accepting and ends every session; returns whether all ended within
    /// `timeout`.
    pub fn stop(&self, timeout: Duration) -> bool {
        {
            let s = self.lock();
            self.stopping.store(true, Ordering::Release);
            for (guest, _) in s.live.values() {
                let _ = guest.shutdown(std::net::Shutdown::Both);
            }
        }
        self.wait_idle(timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_shuts_sessions_down_and_waits_for_them() {
        let life = Arc::new(Lifecycle::default());
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let reg = life.register(1, "vm", &ours).unwrap();
        let session = std::thread::spawn(move || {
            // The session sees its guest connection end, then finishes.
            let mut b = [0u8; 1];
            let _ = std::io::Read::read(&mut theirs, &mut b);
            drop(reg);
        });
        assert!(life.stop(Duration::from_secs(30)));
        session.join().unwrap();
        assert_eq!(life.sessions(), 0);
        assert!(
            life.register(2, "vm", &ours).is_err(),
            "no new sessions once stopping"
        );
    }

    #[test]
    fn ended_sessions_are_recorded_with_their_report() {
        let life = Arc::new(Lifecycle::default());
        let (ours, _theirs) = UnixStream::pair().unwrap();
        let mut reg = life.register(7, "vm1", &ours).unwrap();
        reg.describe("OpenCL", "app", 42, 4242);
        assert_eq!(life.snapshot().0[0].api_server_pid, Some(4242));
        reg.ended(EndedSession {
            released: Some(6),
            ..EndedSession::default()
        });
        drop(reg);
        let (live, ended) = life.snapshot();
        assert!(live.is_empty());
        assert_eq!(ended[0].id, 7);
        assert_eq!(ended[0].vm, "vm1");
        assert_eq!(ended[0].api_server_pid, Some(4242));
        assert_eq!(ended[0].released, Some(6));
    }
}
