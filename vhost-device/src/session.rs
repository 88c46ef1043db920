//! One guest application's session.
//!
//! The session thread takes the guest's `Hello`, admits it, starts the API server and
//! answers with the `Welcome`. A session on shared-memory rings then carries no
//! commands here: a host-local one only watches for its guest to leave and for
//! migration requests, a VM's relays doorbells. A session without rings has each
//! frame checked (kind, opcode, data-window spans, `NO_REPLY`) and written to the API
//! server's socket; a relay thread carries replies and notifications back. Whichever
//! side goes away, the other is shut down, the API server is reaped, and the guest sees
//! an error frame rather than a hang. `Mover` moves a live session to a new API server
//! or suspends it (see `migrate`).

use std::io::{BufReader, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

use hira_protocol::api::Description;
use hira_protocol::frame::{self, HEADER_LEN, SPAN_LEN};
use hira_protocol::handshake::{
    DOORBELL, ErrorPayload, Hello, TEARDOWN_REPORT, TeardownPayload, Welcome, error_code, migrate,
};
use hira_protocol::replay::{self, Replayed};
use hira_protocol::{FrameHeader, FrameKind, ring, unix};
use log::{debug, info, warn};

use crate::config::Config;
use crate::lifecycle::{EndedSession, Lifecycle, Registration};
use crate::migrate::{MigrateError, Placement};
use crate::router::VmQueue;
use crate::spawn;

/// Chunk size for relaying frame bodies.
const RELAY_CHUNK: usize = 256 * 1024;

/// A relayed VM session reads each frame of its guest whole before forwarding it (up
/// to this size), so that a cut connection leaves no part of one with the API server.
const WHOLE_FRAME: usize = 16 << 20;

/// The guest's end as the daemon writes it: a relayed VM session keeps what it sends
/// until the guest acknowledges it (`hira_protocol::replay`).
type GuestOut = Replayed<UnixStream>;

/// What a session's guest sent, for the log line that closes the session.
#[derive(Debug, Default, Clone, Copy)]
pub struct SessionStats {
    /// Commands forwarded to the API server.
    pub commands: u64,
    /// Bytes of those commands after their headers.
    pub bytes: u64,
    /// Frames refused by the router.
    pub rejected: u64,
    /// The last command forwarded, for the record of a session whose API server died.
    pub last_call: Option<&'static str>,
}

/// Why a session ended.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("handshake failed: {0}")]
    Handshake(String),
    #[error("no hello within {0:?}; connection closed")]
    HandshakeTimeout(std::time::Duration),
    #[error("refused: {0}")]
    Refused(String),
    #[error("cannot start the API server")]
    Spawn(#[source] std::io::Error),
    #[error("socket error")]
    Io(#[from] std::io::Error),
}

/// Sends an `Error` frame.
fn send_error(w: &Mutex<GuestOut>, h: Option<&FrameHeader>, code: u32, message: &str) {
    let frame = error_frame(h, code, message);
    let _ = w
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .write_all(&frame);
}

/// An `Error` frame answering `h` (or the session, without one).
pub(crate) fn error_frame(h: Option<&FrameHeader>, code: u32, message: &str) -> Vec<u8> {
    let payload = ErrorPayload {
        code,
        message: message.to_string(),
    }
    .encode();
    let header = FrameHeader::new(
        FrameKind::Error,
        h.map_or(0, |h| h.opcode),
        h.map_or(0, |h| h.channel),
        h.map_or(0, |h| h.call_id),
        payload.len(),
    );
    let mut frame = header.encode().to_vec();
    frame.extend_from_slice(&payload);
    frame
}

/// Size of the window memfd, which must match what the guest announced.
fn window_size(fd: &OwnedFd) -> Option<u64> {
    // SAFETY: a zeroed stat struct is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open; `st` is valid for writes.
    (unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } == 0).then_some(st.st_size as u64)
}

/// Whether a guest's window memfd can no longer shrink (so no mapping of it faults).
fn sealed_against_shrinking(fd: &OwnedFd) -> bool {
    // SAFETY: F_GET_SEALS only reads the descriptor's seals.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    seals >= 0 && seals & libc::F_SEAL_SHRINK != 0
}

/// Runs a session to its end. Never panics on guest input; logs why it ended.
#[allow(clippy::too_many_arguments)]
pub fn run(
    guest: UnixStream,
    slot: crate::listener::ConnectionSlot,
    id: u64,
    vm: &str,
    config: &Config,
    queue: &Arc<VmQueue>,
    life: &Arc<Lifecycle>,
) {
    // The session is registered (visible as live) once it holds every descriptor its
    // handshake needs.
    let registered = guest
        .try_clone()
        .map_err(|_| "the host is out of resources; try again")
        .and_then(|w| Ok((w, life.register(id, vm, &guest)?)));
    let (guest_w, mut registration) = match registered {
        Ok(r) => r,
        Err(why) => {
            crate::listener::refuse(&guest, error_code::SERVER_GONE, why);
            return;
        }
    };
    registration.hold(Box::new(slot));
    let guest_w = Arc::new(Mutex::new(Replayed::plain(guest_w)));
    if let Err(e) = serve(
        guest,
        guest_w,
        id,
        vm,
        config,
        queue,
        life,
        &mut registration,
    ) {
        warn!("VM {vm:?} session {id}: {e}");
    }
}

#[allow(clippy::too_many_arguments)]
fn serve(
    mut guest: UnixStream,
    guest_w: Arc<Mutex<GuestOut>>,
    id: u64,
    vm: &str,
    config: &Config,
    queue: &Arc<VmQueue>,
    life: &Lifecycle,
    registration: &mut Registration,
) -> Result<(), SessionError> {
    // A guest that connects and says nothing, or sends part of a hello, is cut off.
    let deadline = config.limits.handshake_timeout;
    guest.set_read_timeout(Some(deadline))?;
    let (header, payload, fds) = match unix::recv_frame_with_fds(&mut guest) {
        Ok(x) => x,
        Err(unix::UnixFrameError::Closed) => {
            debug!("VM {vm:?} session {id}: closed before its hello");
            return Ok(());
        }
        Err(unix::UnixFrameError::Io(e))
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            send_error(&guest_w, None, error_code::HANDSHAKE, "no hello in time");
            return Err(SessionError::HandshakeTimeout(deadline));
        }
        Err(e) => {
            send_error(&guest_w, None, error_code::HANDSHAKE, &e.to_string());
            return Err(SessionError::Handshake(e.to_string()));
        }
    };
    if header.kind != FrameKind::Hello {
        let m = format!("first frame must be Hello, got {:?}", header.kind);
        send_error(&guest_w, None, error_code::HANDSHAKE, &m);
        return Err(SessionError::Handshake(m));
    }
    let mut hello = match Hello::decode(&payload) {
        Ok(h) => h,
        Err(e) => {
            send_error(&guest_w, None, error_code::HANDSHAKE, &e.to_string());
            return Err(SessionError::Handshake(e.to_string()));
        }
    };
    let Some(api) = hira_apis::describe(hello.api) else {
        let m = format!("{} is not an API this daemon knows", hello.api);
        send_error(&guest_w, None, error_code::HANDSHAKE, &m);
        return Err(SessionError::Handshake(m));
    };
    let mut fds = fds.into_iter();
    let fd = fds.next();
    // A VM guest whose connection a device reset cut comes back to its live session
    // (on rings in its window slot, or relayed with the stream kept on both ends).
    if let Some(token) = hello.resume
        && fd.is_none()
        && (hello.vm_window && hello.rings || hello.replay)
    {
        guest.set_read_timeout(None)?;
        match life.reattach(&token, vm, guest, hello.taken) {
            Ok(()) => {
                info!("VM {vm:?}: a guest reconnected to its live session");
                return Ok(());
            }
            Err(g) => guest = g,
        }
    }
    // A guest resuming a suspended session brings back its ring region and eventfds.
    let guest_rings: Vec<OwnedFd> = fds.collect();
    let mut parked = match hello.resume.take() {
        Some(token) => match resumable(life, &token, vm, &hello, &guest_rings) {
            Ok(p) => Some(p),
            Err(e) => {
                let m = e.to_string();
                send_error(&guest_w, None, error_code::HANDSHAKE, &m);
                return Err(SessionError::Refused(m));
            }
        },
        None if !guest_rings.is_empty() => {
            let m = "a new session passes at most its window";
            send_error(&guest_w, None, error_code::HANDSHAKE, m);
            return Err(SessionError::Handshake(m.into()));
        }
        None => None,
    };
    // Rings: host-local, for a guest that can pass descriptors (it sent its window);
    // in a VM, at the end of the session's window slot (below).
    let local_rings = hello.rings && fd.is_some();
    hello.ring_offset = 0;
    // A guest that passed a memfd gets it checked: exactly the announced size, within
    // the configured limit. A guest of a VM with a shared window (ivshmem) may lease a
    // slot of it instead. Otherwise the session runs without a window.
    let mut lease = None;
    hello.window_offset = 0;
    let window: Option<OwnedFd> = match fd {
        Some(fd) => {
            let ok = hello.window_len > 0
                && hello.window_len <= config.max_window
                && window_size(&fd) == Some(hello.window_len)
                && sealed_against_shrinking(&fd);
            if !ok {
                warn!(
                    "VM {vm:?} session {id}: data window refused (announced {} bytes)",
                    hello.window_len
                );
            }
            ok.then_some(fd)
        }
        None if hello.vm_window && parked.is_some() => {
            // A VM session resuming: in its slot, where its rings are.
            let reserved = parked.as_mut().and_then(crate::migrate::Parked::take_slot);
            let slot = reserved.and_then(|(s, _)| {
                let w = queue.window.get()?;
                Some((s, w.lease_reserved(s.offset, s.len)?, w.open().ok()?))
            });
            match slot {
                Some((s, l, fd)) => {
                    hello.window_len = s.window_len;
                    hello.window_offset = s.offset;
                    hello.ring_offset = s.ring_offset;
                    lease = Some(l);
                    Some(fd)
                }
                None => {
                    let m = "the suspended session's window slot is not kept here";
                    send_error(&guest_w, None, error_code::HANDSHAKE, m);
                    return Err(SessionError::Refused(m.into()));
                }
            }
        }
        None if hello.vm_window => {
            let slot = queue
                .window
                .get()
                .and_then(|w| w.lease().zip(w.open().ok()));
            match slot {
                Some((l, fd)) => {
                    hello.window_len = l.len;
                    hello.window_offset = l.offset;
                    // The slot's last bytes hold the rings, if it has room for them
                    // beside a window of at least a mebibyte.
                    let rings_len = ring::region_len(ring::DEFAULT_CAPACITY) as u64;
                    if hello.rings && l.len >= rings_len + (1 << 20) {
                        hello.window_len = l.len - rings_len;
                        hello.ring_offset = l.offset + hello.window_len;
                    }
                    lease = Some(l);
                    Some(fd)
                }
                None => None,
            }
        }
        None => None,
    };
    hello.vm_window = false;
    if window.is_none() {
        hello.window_len = 0;
    }
    let vm_rings = hello.ring_offset > 0;
    hello.rings = local_rings || vm_rings;
    let asks_replay = std::mem::take(&mut hello.replay);
    guest.set_read_timeout(None)?;
    let max = queue
        .max_sessions()
        .unwrap_or(config.limits.max_sessions_per_vm);
    let Some(_slot) = queue.open_session(max) else {
        let m = format!("VM {vm:?} has its maximum of {max} sessions");
        send_error(&guest_w, None, error_code::POLICY, &m);
        return Err(SessionError::Refused(m));
    };
    let vm_page = queue.page().map_err(SessionError::Spawn)?;
    let cgroup = queue.cgroup.get().map(crate::cgroup::VmCgroup::procs_fd);
    let kills_before = queue.host_memory().2;
    let token = parked
        .as_ref()
        .map_or_else(crate::migrate::new_token, |p| p.token);
    let (child, mut server, usage) =
        spawn::api_server(config, id, &vm_page.fd, cgroup).map_err(SessionError::Spawn)?;
    let child_pid = child.id();
    let mut child = Some(child);
    let mut usage = Arc::new(usage);
    let mut tracked = queue.track(id, usage.clone());
    // What API servers the session left by migrating counted.
    let mut carried = hira_protocol::usage::Usage::default();
    registration.describe(api.name, &hello.process_name, hello.pid, child_pid);
    // Requests to migrate wait from now on: the session takes them once its data
    // plane is up, or answers why it cannot.
    let door = crate::migrate::Door::new().map_err(SessionError::Spawn)?;
    registration.accept_migrations(door.clone());
    info!(
        "VM {vm:?} session {id}: {} (guest pid {}) -> API server pid {}{}",
        hello.process_name,
        hello.pid,
        child_pid,
        if parked.is_some() { ", resuming" } else { "" }
    );
    let mut stats = SessionStats::default();
    type Relay = std::thread::JoinHandle<Option<TeardownPayload>>;
    let mut on_rings = false;
    let result = (|| -> Result<(Result<(), SessionError>, Relay), SessionError> {
        let hello_bytes = hello.encode();
        let h = FrameHeader {
            len: hello_bytes.len() as u32,
            ..header
        };
        if let Some(p) = &parked {
            // The API server restores the session before it answers.
            let mut fds = vec![&p.snapshot];
            fds.extend(guest_rings.iter());
            let ah = FrameHeader::new(FrameKind::Notify, migrate::ADOPT, 0, 0, 0);
            unix::send_frame_with_fds(&mut server, &ah, &[], &fds)?;
        }
        unix::send_frame_with_fd(&mut server, &h, &hello_bytes, window.as_ref())?;
        // A host-local session on rings can migrate: the next API server gets the
        // same window, hello and data plane.
        let keep_window = window.as_ref().map(OwnedFd::try_clone).transpose()?;
        drop(window);
        let (rh, rp, ring_fds) = unix::recv_frame_with_fds(&mut server)
            .map_err(|e| SessionError::Handshake(e.to_string()))?;
        if rh.kind != FrameKind::Welcome {
            let m = ErrorPayload::decode(&rp)
                .map(|e| e.message)
                .unwrap_or_default();
            send_error(&guest_w, None, error_code::HANDSHAKE, &m);
            if let Some(p) = parked.take() {
                // The guest may try again; the snapshot stays parked.
                life.park(p);
            }
            return Err(SessionError::Handshake(format!("API server refused: {m}")));
        }
        let server_welcome =
            Welcome::decode(&rp).map_err(|e| SessionError::Handshake(e.to_string()))?;
        // The data plane: the API server's ring region and eventfds go to the guest
        // as they came; from then on the daemon carries no frame of this session.
        let rings = server_welcome.ring_capacity > 0;
        on_rings = rings;
        let fds_expected = if rings && local_rings && parked.is_none() {
            1 + ring::EVENTFDS
        } else {
            0
        };
        if ring_fds.len() != fds_expected || (rings && !hello.rings) {
            let m = "the API server's data plane is inconsistent";
            send_error(&guest_w, None, error_code::HANDSHAKE, m);
            return Err(SessionError::Handshake(m.into()));
        }
        // A relayed guest that keeps its stream gets it kept here too.
        let replay = asks_replay && !rings;
        let mut welcome = Welcome {
            version: hira_protocol::handshake::VERSION,
            session: id,
            vm_name: vm.to_string(),
            window_len: server_welcome.window_len,
            window_offset: if server_welcome.window_len > 0 {
                hello.window_offset
            } else {
                0
            },
            ring_capacity: server_welcome.ring_capacity,
            ring_offset: if rings && vm_rings {
                hello.ring_offset
            } else {
                0
            },
            token,
            replay,
            taken: 0,
        };
        let welcome_bytes = welcome.encode();
        let wh = FrameHeader::new(FrameKind::Welcome, 0, 0, 0, welcome_bytes.len());
        {
            let mut g = guest_w.lock().unwrap_or_else(|e| e.into_inner());
            let fds: Vec<&OwnedFd> = ring_fds.iter().collect();
            unix::send_frame_with_fds(g.get_mut(), &wh, &welcome_bytes, &fds)?;
            if replay {
                g.enable(replay::DAEMON_KEEPS);
            }
        }
        let guest_acked = guest_w.lock().unwrap_or_else(|e| e.into_inner()).acked();
        registration.serving();
        if parked.is_some() {
            life.resumptions
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let server_r = server.try_clone()?;
        let relay_guest = guest_w.clone();
        let link = Arc::new(RelayLink::default());
        let relay_link = link.clone();
        let relay = std::thread::Builder::new()
            .name(format!("relay-{id}"))
            .spawn(move || relay_to_guest(server_r, &relay_guest, &relay_link))?;
        let res = {
            let slot = lease
                .as_ref()
                .filter(|_| server_welcome.window_len > 0)
                .map(|l| crate::migrate::VmSlot {
                    offset: l.offset,
                    len: l.len,
                    window_len: hello.window_len,
                    ring_offset: hello.ring_offset,
                });
            let mut m = Mover {
                config,
                id,
                vm,
                token,
                slot,
                guest_w: &guest_w,
                queue,
                vm_page: &vm_page.fd,
                cgroup,
                hello: (h, hello_bytes),
                window: keep_window,
                rings: if parked.is_some() {
                    guest_rings
                } else {
                    ring_fds
                },
                link,
                relayed: !rings,
                replay,
                taken: 0,
                ack_sent: 0,
                guest_acked,
                draining: None,
                child: &mut child,
                server: &mut server,
                usage: &mut usage,
                tracked: &mut tracked,
                carried: &mut carried,
                registration,
            };
            if local_rings && rings {
                serve_on_rings(&mut guest, &door, &mut m)
            } else {
                // Relayed: every frame, or on a VM's rings the doorbells only.
                let mut guest_r = BufReader::with_capacity(RELAY_CHUNK, guest.try_clone()?);
                loop {
                    let resets = queue.resets();
                    let r = relay_to_server(
                        &mut guest_r,
                        &door,
                        &mut m,
                        server_welcome.window_len,
                        rings,
                        api,
                        &mut stats,
                    );
                    // On rings in the VM's window the session lives on in shared
                    // memory when a device reset cuts its connection (not when the
                    // guest closes it), and so does a relayed one whose stream both
                    // ends keep: it waits for the guest to connect again.
                    let cut = (vm_rings || replay)
                        && r.is_ok()
                        && m.child.is_some()
                        && queue.resets() != resets;
                    if !cut {
                        break r;
                    }
                    info!(
                        "VM {vm:?} session {id}: connection cut by a device reset; waiting {RESET_GRACE:?} for its guest"
                    );
                    let Some((back, taken)) = life.await_reattach(token, vm, RESET_GRACE) else {
                        info!("VM {vm:?} session {id}: its guest did not come back");
                        break r;
                    };
                    {
                        let mut g = guest_w.lock().unwrap_or_else(|e| e.into_inner());
                        *g.get_mut() = back.try_clone()?;
                        if let Err(e) = g.check(taken).map_err(|e| e.to_string()) {
                            let f = error_frame(None, error_code::HANDSHAKE, &e);
                            let _ = g.get_mut().write_all(&f);
                            info!("VM {vm:?} session {id}: its guest cannot go on: {e}");
                            break r;
                        }
                        // A relayed guest learns what to send again; this end sends
                        // again what the guest did not take.
                        welcome.taken = m.taken;
                        let w = welcome.encode();
                        let wh = FrameHeader::new(FrameKind::Welcome, 0, 0, 0, w.len());
                        unix::send_frame_with_fds(g.get_mut(), &wh, &w, &[])?;
                        if replay {
                            let _ = g.resume(taken);
                            info!(
                                "VM {vm:?} session {id}: relayed stream goes on: {} bytes sent again to the guest, which sends again what followed byte {}",
                                g.sent() - taken,
                                m.taken
                            );
                        }
                    }
                    m.link
                        .reattached
                        .store(true, std::sync::atomic::Ordering::Release);
                    life.reconnections
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    guest_r = BufReader::with_capacity(RELAY_CHUNK, back);
                    info!("VM {vm:?} session {id}: its guest reconnected");
                }
            }
        };
        // The guest side ended: the API server sees its socket close, releases
        // what the guest held and reports it. It is reaped (killed after the grace
        // period if it is stuck, say in an endless kernel) before the relay is
        // joined, since the relay ends only when the API server's end closes.
        let _ = server.shutdown(std::net::Shutdown::Write);
        let _ = guest.shutdown(std::net::Shutdown::Both);
        Ok((res, relay))
    })();
    door.close(crate::migrate::Closed::Ended(id));
    let child_id = child.as_ref().map_or(0, std::process::Child::id);
    let (mut how, crashed) = match child.take() {
        Some(c) => spawn::reap(c, config.limits.teardown_grace),
        None => (
            "suspended: the session moved off this daemon".to_string(),
            false,
        ),
    };
    if crashed && queue.host_memory().2 > kills_before {
        how += " (killed by the kernel: the VM reached its host-memory cap)";
    }
    // What the API server counted: every frame it received, however it came.
    let counted = usage.read();
    queue.session_ended(&counted);
    drop(tracked);
    stats.commands = counted.commands + carried.commands;
    stats.bytes = counted.bytes + carried.bytes;
    stats.rejected += counted.rejected + carried.rejected;
    stats.last_call = counted.last_opcode.and_then(|o| api.op(o)).map(|o| o.name);
    if crashed {
        life.api_server_crashes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        warn!(
            "VM {vm:?} session {id}: API server {child_id} {how} after {} (last call forwarded)",
            stats.last_call.unwrap_or("no call")
        );
    }
    let (result, report) = match result {
        Ok((res, relay)) => (res, relay.join().ok().flatten()),
        Err(e) => (Err(e), None),
    };
    drop(lease);
    info!(
        "VM {vm:?} session {id}: ended after {} commands ({} bytes, {} rejected), API server {} reaped ({how}){}",
        stats.commands,
        stats.bytes,
        stats.rejected,
        child_id,
        report.map_or(String::new(), |r| format!(
            ", released {} objects ({} failed)",
            r.released, r.failed
        ))
    );
    registration.ended(EndedSession {
        api: api.name.to_string(),
        process: hello.process_name.clone(),
        api_server_pid: Some(child_id),
        api_server_end: how,
        released: report.map(|r| r.released),
        release_failures: report.map(|r| r.failed),
        commands: stats.commands,
        bytes: stats.bytes,
        rejected: stats.rejected,
        last_call: stats.last_call.map(str::to_string),
        data_plane: if on_rings { "rings" } else { "relayed" }.to_string(),
        ..EndedSession::default()
    });
    result
}

/// Where the relay thread passes a migration's answer (its opcode and payload).
type AnswerTo = std::sync::mpsc::Sender<(u16, Vec<u8>)>;

/// What the relay thread and a migration share: where the migration's answers go,
/// and the API server to go on with once the old one has closed.
#[derive(Debug, Default)]
struct RelayLink {
    answers: Mutex<Option<AnswerTo>>,
    /// Where a relayed session's snapshot pieces go.
    snapshot: Mutex<Option<std::fs::File>>,
    next: Mutex<Option<UnixStream>>,
    /// The session was suspended: its API server's end is no news to the guest.
    quiet: std::sync::atomic::AtomicBool,
    /// A new guest connection replaced one that a device reset cut.
    reattached: std::sync::atomic::AtomicBool,
}

/// Copies replies and notifications to the guest until the API server closes; then
/// tells the guest its session is over. Returns the API server's teardown report,
/// which is for the daemon and never reaches the guest. Once the guest is gone, the
/// API server's frames are read and dropped, so that the report still arrives. A
/// migration's answers go to the migration; when a migrated session's old API server
/// closes, the relay goes on with the new one.
fn relay_to_guest(
    server: UnixStream,
    guest: &Mutex<GuestOut>,
    link: &RelayLink,
) -> Option<TeardownPayload> {
    let mut server = BufReader::with_capacity(RELAY_CHUNK, server);
    let mut buf = vec![0u8; RELAY_CHUNK];
    let mut report = None;
    let mut guest_gone = false;
    loop {
        let mut hb = [0u8; HEADER_LEN];
        if server.read_exact(&mut hb).is_err() {
            let next = link.next.lock().unwrap_or_else(|e| e.into_inner()).take();
            match next {
                Some(s) => {
                    server = BufReader::with_capacity(RELAY_CHUNK, s);
                    continue;
                }
                None => break,
            }
        }
        let Ok(h) = FrameHeader::decode(&hb) else {
            warn!("API server sent a malformed frame; ending the session");
            break;
        };
        if h.kind == FrameKind::Notify && h.opcode == TEARDOWN_REPORT {
            let mut p = vec![0u8; h.len as usize];
            if server.read_exact(&mut p).is_err() {
                break;
            }
            report = TeardownPayload::decode(&p).ok();
            continue;
        }
        if h.kind == FrameKind::Notify && h.opcode == migrate::DATA {
            if h.len as usize > migrate::DATA_PIECE {
                warn!("API server sent an oversized snapshot piece; ending the session");
                break;
            }
            let mut p = vec![0u8; h.len as usize];
            if server.read_exact(&mut p).is_err() {
                break;
            }
            if let Some(f) = &mut *link.snapshot.lock().unwrap_or_else(|e| e.into_inner()) {
                let _ = f.write_all(&p);
            }
            continue;
        }
        if h.kind == FrameKind::Notify && matches!(h.opcode, migrate::CAPTURED | migrate::FAILED) {
            // The snapshot is whole (or will not come): the memfd stays the migration's.
            link.snapshot
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            let mut p = vec![0u8; (h.len as usize).min(64 * 1024)];
            if h.len as usize > p.len() || server.read_exact(&mut p).is_err() {
                break;
            }
            if let Some(tx) = &*link.answers.lock().unwrap_or_else(|e| e.into_inner()) {
                let _ = tx.send((h.opcode, p));
            }
            continue;
        }
        if guest_gone
            && link
                .reattached
                .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            guest_gone = false;
        }
        if guest_gone {
            if skip(&mut server, h.len as usize, &mut buf).is_err() {
                break;
            }
            continue;
        }
        if forward(
            &mut server,
            &mut *guest_lock(guest),
            &hb,
            &[],
            h.len as usize,
            &mut buf,
        )
        .is_err()
        {
            guest_gone = true;
        }
    }
    if !guest_gone && !link.quiet.load(std::sync::atomic::Ordering::Acquire) {
        send_error(
            guest,
            None,
            error_code::SERVER_GONE,
            "the API server has exited",
        );
    }
    let _ = guest_lock(guest)
        .get_ref()
        .shutdown(std::net::Shutdown::Both);
    report
}

fn guest_lock(g: &Mutex<GuestOut>) -> std::sync::MutexGuard<'_, GuestOut> {
    g.lock().unwrap_or_else(|e| e.into_inner())
}

/// Forwards a frame whose header (and spans) were read already and whose remaining
/// `n` body bytes are still in `from`. A frame that fits the buffer leaves in a single
/// write, so the receiver wakes once for it.
fn forward(
    from: &mut impl Read,
    to: &mut impl Write,
    head: &[u8],
    spans: &[u8],
    n: usize,
    buf: &mut [u8],
) -> std::io::Result<()> {
    if n <= buf.len() {
        from.read_exact(&mut buf[..n])?;
        return frame::write_parts(to, &[head, spans, &buf[..n]]);
    }
    frame::write_parts(to, &[head, spans])?;
    copy_exact(from, to, n, buf)
}

/// Copies exactly `n` bytes.
fn copy_exact(
    from: &mut impl Read,
    to: &mut impl Write,
    mut n: usize,
    buf: &mut [u8],
) -> std::io::Result<()> {
    while n > 0 {
        let chunk = n.min(buf.len());
        from.read_exact(&mut buf[..chunk])?;
        to.write_all(&buf[..chunk])?;
        n -= chunk;
    }
    Ok(())
}

/// Discards exactly `n` bytes.
fn skip(from: &mut impl Read, mut n: usize, buf: &mut [u8]) -> std::io::Result<()> {
    while n > 0 {
        let chunk = n.min(buf.len());
        from.read_exact(&mut buf[..chunk])?;
        n -= chunk;
    }
    Ok(())
}

/// Checks a resuming guest's hello and descriptors (its ring region and eventfds,
/// which the API server will map and signal) and takes its parked session.
fn resumable(
    life: &Lifecycle,
    token: &hira_protocol::handshake::Token,
    vm: &str,
    hello: &Hello,
    rings: &[OwnedFd],
) -> Result<crate::migrate::Parked, ResumeRefused> {
    let none = || ResumeRefused::NoSession(vm.to_string());
    if hello.vm_window && hello.rings && rings.is_empty() {
        // A VM guest: its rings are in its slot of the VM's window.
        return life
            .unpark(token, vm)
            .filter(|p| p.slot.is_some())
            .ok_or_else(none);
    }
    if !hello.rings && rings.is_empty() {
        // A relayed session: its frames resume on the new connection (a VM's window
        // slot, if it had one, is checked when it is taken).
        return life.unpark(token, vm).ok_or_else(none);
    }
    if !hello.rings || rings.len() != 1 + ring::EVENTFDS {
        return Err(ResumeRefused::Descriptors);
    }
    let region_ok = window_size(&rings[0]) == Some(ring::region_len(ring::DEFAULT_CAPACITY) as u64)
        && sealed_against_shrinking(&rings[0]);
    if !region_ok {
        return Err(ResumeRefused::ForeignRegion);
    }
    for fd in &rings[1..] {
        if !crate::migrate::is_eventfd(fd) {
            return Err(ResumeRefused::NotEventfd);
        }
        // Signalling never blocks the API server, whatever the guest did to it.
        // SAFETY: sets a status flag on a descriptor this process holds.
        unsafe {
            let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
    }
    life.unpark(token, vm).ok_or_else(none)
}

/// Why a guest cannot resume a suspended session here.
#[derive(Debug, thiserror::Error)]
enum ResumeRefused {
    #[error("no suspended session with this token for VM {0:?} here (yet)")]
    NoSession(String),
    #[error("a resuming guest passes its window, ring region and eventfds")]
    Descriptors,
    #[error("the ring region passed is not one an API server made")]
    ForeignRegion,
    #[error("a descriptor passed as an eventfd is not one")]
    NotEventfd,
}

/// Longest a migration waits for the old API server's capture, and for the new one
/// to restore.
const CAPTURE_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);
const RESTORE_LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

/// What moving a host-local session on rings to a new API server needs, and what it
/// changes.
struct Mover<'a> {
    config: &'a Config,
    id: u64,
    vm: &'a str,
    /// What resumes the session after a suspension.
    token: hira_protocol::handshake::Token,
    /// A VM session's slot of the VM's window.
    slot: Option<crate::migrate::VmSlot>,
    guest_w: &'a Mutex<GuestOut>,
    queue: &'a Arc<VmQueue>,
    vm_page: &'a OwnedFd,
    cgroup: Option<std::os::fd::RawFd>,
    /// The hello the API server got, as it got it.
    hello: (FrameHeader, Vec<u8>),
    window: Option<OwnedFd>,
    /// The guest's ring region and eventfds.
    rings: Vec<OwnedFd>,
    link: Arc<RelayLink>,
    /// The session's frames are relayed (no rings): the capture goes in-band and
    /// the snapshot comes back in pieces.
    relayed: bool,
    /// Both ends keep the relayed stream until acknowledged (a VM guest over vsock):
    /// the session outlives its connection being cut.
    replay: bool,
    /// Bytes of whole frames taken in from the guest since the `Welcome`.
    taken: u64,
    /// What this end last acknowledged to the guest.
    ack_sent: u64,
    /// What the guest acknowledged of this end's stream.
    guest_acked: Arc<std::sync::atomic::AtomicU64>,
    /// A suspension of a relayed session waiting for the guest's last frame
    /// (`DRAINED`), and until when.
    draining: Option<(crate::migrate::Suspension, std::time::Instant)>,
    /// The API server (none once the session was suspended).
    child: &'a mut Option<std::process::Child>,
    server: &'a mut UnixStream,
    usage: &'a mut Arc<hira_protocol::usage::UsagePage>,
    tracked: &'a mut crate::router::Tracked,
    carried: &'a mut hira_protocol::usage::Usage,
    registration: &'a Registration,
}

fn notify(to: &mut UnixStream, opcode: u16, fds: &[&OwnedFd]) -> std::io::Result<()> {
    let h = FrameHeader::new(FrameKind::Notify, opcode, 0, 0, 0);
    unix::send_frame_with_fds(to, &h, &[], fds)
}

impl Mover<'_> {
    /// Has the API server capture the session into a fresh memfd; on success it
    /// waits for the verdict. Returns the memfd and the snapshot's length.
    fn capture(&mut self) -> Result<(OwnedFd, u64), MigrateError> {
        let snapshot = crate::migrate::snapshot_file().map_err(MigrateError::SnapshotFile)?;
        let (tx, rx) = std::sync::mpsc::channel();
        *self.link.answers.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        let sent = if self.relayed {
            // The pieces come back through the relay thread into the memfd.
            let f = snapshot.try_clone().map_err(MigrateError::SnapshotFile)?;
            *self.link.snapshot.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(std::fs::File::from(f));
            notify(self.server, migrate::CAPTURE, &[])
        } else {
            notify(self.server, migrate::CAPTURE, &[&snapshot])
        };
        sent.map_err(MigrateError::ApiServer)?;
        let (op, answer) = match rx.recv_timeout(CAPTURE_LIMIT) {
            Ok(a) => a,
            Err(_) => {
                let _ = notify(self.server, migrate::ABORT, &[]);
                return Err(MigrateError::CaptureTimeout);
            }
        };
        if op == migrate::FAILED {
            return Err(MigrateError::ApiServerRefused(
                String::from_utf8_lossy(&answer).into_owned(),
            ));
        }
        let len = answer
            .get(..8)
            .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or_default()));
        if self.relayed {
            // The relay wrote the pieces through a descriptor sharing this one's
            // offset: whoever reads the snapshot next reads it from its start.
            // SAFETY: repositions a descriptor this process owns.
            unsafe { libc::lseek(snapshot.as_raw_fd(), 0, libc::SEEK_SET) };
        }
        Ok((snapshot, len))
    }

    /// Suspends the session: captured, placed where a daemon will resume it (the
    /// caller's part), then its API server goes and the guest is told to reconnect.
    /// Returns whether the session left (else it goes on here).
    fn suspend(&mut self, s: crate::migrate::Suspension) -> bool {
        let start = std::time::Instant::now();
        let (snapshot, bytes) = match self.capture() {
            Ok(c) => c,
            Err(e) => {
                let _ = s.captured.send(Err(e));
                return false;
            }
        };
        let from_pid = self.child.as_ref().map_or(0, std::process::Child::id);
        let captured = snapshot
            .try_clone()
            .map(|snapshot| crate::migrate::Captured {
                snapshot,
                bytes,
                token: self.token,
                vm: self.vm.to_string(),
                slot: self.slot,
                from_pid,
                capture_ms: start.elapsed().as_secs_f64() * 1e3,
            });
        let sent = match captured {
            Ok(c) => s.captured.send(Ok(c)).is_ok(),
            Err(e) => {
                let _ = s.captured.send(Err(MigrateError::SnapshotFile(e)));
                false
            }
        };
        let placed = if sent {
            s.placed
                .recv_timeout(crate::migrate::PLACE_LIMIT)
                .unwrap_or_else(|_| Placement::Failed("the snapshot was not placed in time".into()))
        } else {
            Placement::Failed("nobody took the snapshot".into())
        };
        let endpoint = match placed {
            Placement::At(e) => e,
            Placement::Failed(e) => {
                warn!(
                    "session {}: suspension abandoned, the session stays: {e}",
                    self.id
                );
                let _ = notify(self.server, migrate::ABORT, &[]);
                return false;
            }
        };
        // The guest hears where to go before the old API server leaves (whose end
        // the relay then keeps to itself: the guest's socket closes after this word).
        self.link
            .quiet
            .store(true, std::sync::atomic::Ordering::Release);
        send_error(self.guest_w, None, error_code::MOVED, &endpoint);
        let _ = notify(self.server, migrate::COMMIT, &[]);
        if let Some(old) = self.child.take() {
            spawn::reap(old, self.config.limits.teardown_grace);
        }
        self.registration.suspended();
        let _ = s.done.send(());
        info!(
            "session {}: suspended ({bytes} bytes) after {:?}; its guest reconnects to {}",
            self.id,
            start.elapsed(),
            if endpoint.is_empty() {
                "its endpoint"
            } else {
                &endpoint
            }
        );
        true
    }

    /// Moves the session to a new API server (on the host's device of index
    /// `device`, if given), or leaves it where it is.
    fn migrate(&mut self, device: Option<u32>) -> Result<crate::migrate::Moved, MigrateError> {
        let start = std::time::Instant::now();
        let (snapshot, snapshot_bytes) = self.capture()?;
        let captured = start.elapsed();
        match self.start_next(&snapshot, device) {
            Ok((child, server, usage)) => {
                let to_pid = child.id();
                // The relay goes on with the new server once the old one closes.
                *self.link.next.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(server.try_clone().map_err(MigrateError::Handover)?);
                let pause = start.elapsed();
                let _ = notify(self.server, migrate::COMMIT, &[]);
                let old = self.child.replace(child);
                let from_pid = old.as_ref().map_or(0, std::process::Child::id);
                *self.server = server;
                let how = old.map_or_else(String::new, |o| {
                    spawn::reap(o, self.config.limits.teardown_grace).0
                });
                let old_usage = self.usage.read();
                self.queue.session_ended(&old_usage);
                self.carried.commands += old_usage.commands;
                self.carried.bytes += old_usage.bytes;
                self.carried.rejected += old_usage.rejected;
                *self.usage = Arc::new(usage);
                *self.tracked = self.queue.track(self.id, self.usage.clone());
                self.registration.moved(to_pid);
                info!(
                    "session {}: moved from API server {from_pid} ({how}) to {to_pid}; {snapshot_bytes} bytes, paused {pause:?}",
                    self.id
                );
                Ok(crate::migrate::Moved {
                    session: self.id,
                    from_pid,
                    to_pid,
                    snapshot_bytes,
                    pause_ms: pause.as_secs_f64() * 1e3,
                    capture_ms: captured.as_secs_f64() * 1e3,
                    restore_ms: (pause - captured).as_secs_f64() * 1e3,
                })
            }
            Err(e) => {
                let _ = notify(self.server, migrate::ABORT, &[]);
                Err(e)
            }
        }
    }

    /// Starts the API server that takes over, and waits until it has restored the
    /// snapshot.
    fn start_next(
        &mut self,
        snapshot: &OwnedFd,
        device: Option<u32>,
    ) -> Result<
        (
            std::process::Child,
            UnixStream,
            hira_protocol::usage::UsagePage,
        ),
        MigrateError,
    > {
        let (mut child, mut server, usage) =
            spawn::api_server(self.config, self.id, self.vm_page, self.cgroup)
                .map_err(MigrateError::Spawn)?;
        let handed = (|| -> Result<(), MigrateError> {
            let mut fds = vec![snapshot];
            fds.extend(self.rings.iter());
            let payload = device.map(u32::to_le_bytes);
            let payload: &[u8] = payload.as_ref().map_or(&[], |p| p);
            let h = FrameHeader::new(FrameKind::Notify, migrate::ADOPT, 0, 0, payload.len());
            unix::send_frame_with_fds(&mut server, &h, payload, &fds)
                .map_err(MigrateError::Handover)?;
            unix::send_frame_with_fd(
                &mut server,
                &self.hello.0,
                &self.hello.1,
                self.window.as_ref(),
            )
            .map_err(MigrateError::Handover)?;
            server
                .set_read_timeout(Some(RESTORE_LIMIT))
                .map_err(MigrateError::Handover)?;
            let (h, p, _) = unix::recv_frame_with_fds(&mut server).map_err(MigrateError::Answer)?;
            server
                .set_read_timeout(None)
                .map_err(MigrateError::Handover)?;
            if h.kind != FrameKind::Welcome {
                return Err(MigrateError::ApiServerRefused(
                    ErrorPayload::decode(&p)
                        .map(|e| e.message)
                        .unwrap_or_else(|_| "the new API server failed".into()),
                ));
            }
            Ok(())
        })();
        match handed {
            Ok(()) => Ok((child, server, usage)),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                // What it charged to the VM while restoring goes back.
                self.queue.session_ended(&usage.read());
                Err(e)
            }
        }
    }
}

/// How long a VM session on rings whose connection a device reset cut waits for its
/// guest to connect again.
const RESET_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

/// Longest a relayed session's guest may take to send its last frame before a
/// suspension; the suspension is abandoned after.
const DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Tells a relayed session's guest that it may send again here.
fn resumed_here(m: &Mover<'_>) {
    let h = FrameHeader::new(FrameKind::Notify, migrate::RESUMED, 0, 0, 0);
    let mut g = m.guest_w.lock().unwrap_or_else(|e| e.into_inner());
    let _ = g.write_all(&h.encode());
}

/// A relayed session's guest sent its last frame: the suspension goes on. Returns
/// whether the session was suspended (and so is over here).
fn drained(door: &crate::migrate::Door, m: &mut Mover<'_>) -> bool {
    let Some((s, _)) = m.draining.take() else {
        return false;
    };
    if m.suspend(s) {
        door.close(crate::migrate::Closed::Suspended(m.id));
        return true;
    }
    resumed_here(m);
    false
}

/// Carries out the migrations asked for. Returns whether the session was suspended
/// (and so is over here).
fn answer_door(door: &crate::migrate::Door, m: &mut Mover<'_>) -> bool {
    if m.draining
        .as_ref()
        .is_some_and(|(_, until)| std::time::Instant::now() >= *until)
        && let Some((s, _)) = m.draining.take()
    {
        let _ = s.captured.send(Err(MigrateError::GuestKeptSending));
        resumed_here(m);
    }
    let mut asks = door.take().into_iter();
    while let Some(ask) = asks.next() {
        match ask {
            crate::migrate::Ask::Migrate(reply, device) => {
                let res = m.migrate(device);
                if let Err(e) = &res {
                    warn!("session {}: migration failed, the session stays: {e}", m.id);
                }
                let _ = reply.send(res);
            }
            crate::migrate::Ask::Suspend(s) if m.relayed => {
                if m.draining.is_some() {
                    let _ = s.captured.send(Err(MigrateError::Suspending));
                    continue;
                }
                // The guest stops sending first (its last frame says so), so that
                // every frame it sent reaches the API server that is captured.
                let h = FrameHeader::new(FrameKind::Notify, migrate::SUSPENDING, 0, 0, 0);
                let told = {
                    let mut g = m.guest_w.lock().unwrap_or_else(|e| e.into_inner());
                    g.write_all(&h.encode())
                };
                match told {
                    Ok(()) => m.draining = Some((s, std::time::Instant::now() + DRAIN_LIMIT)),
                    Err(e) => {
                        let _ = s.captured.send(Err(MigrateError::Guest(e)));
                    }
                }
            }
            crate::migrate::Ask::Suspend(s) => {
                if m.suspend(s) {
                    door.close(crate::migrate::Closed::Suspended(m.id));
                    for rest in asks {
                        rest.refuse(crate::migrate::Closed::Suspended(m.id));
                    }
                    return true;
                }
            }
        }
    }
    false
}

/// Waits until the guest has something to read (or hung up), carrying out the
/// migrations asked for meanwhile. False once the session was suspended (it is over
/// here).
fn guest_or_door(
    guest: &UnixStream,
    door: &crate::migrate::Door,
    m: &mut Mover<'_>,
) -> Result<bool, SessionError> {
    loop {
        let limit = m
            .draining
            .as_ref()
            .map(|(_, until)| until.saturating_duration_since(std::time::Instant::now()));
        let (ready, rung) = crate::migrate::wait_either(guest, &door.rung, limit)?;
        let asked = rung || (!ready && limit.is_some());
        if asked && answer_door(door, m) {
            return Ok(false);
        }
        if ready {
            return Ok(true);
        }
    }
}

/// Waits until a guest whose frames travel on rings closes its socket (it has
/// nothing to send there: anything it does send ends the session), carrying out the
/// migrations asked for meanwhile.
fn serve_on_rings(
    guest: &mut UnixStream,
    door: &crate::migrate::Door,
    m: &mut Mover<'_>,
) -> Result<(), SessionError> {
    if !guest_or_door(guest, door, m)? {
        return Ok(());
    }
    let mut b = [0u8; 1];
    match guest.read(&mut b) {
        Ok(0) => Ok(()),
        Ok(_) => Err(SessionError::Handshake(
            "the guest sent on its socket while on rings".into(),
        )),
        Err(e) => Err(e.into()),
    }
}

/// Acknowledges the guest's stream every `replay::ACK_EVERY` bytes taken in, unless
/// the relay to the guest holds its end or it has no room now (the relay may wait
/// for the guest to read, which may wait for this side to read): the next frame
/// tries again.
fn acknowledge(m: &mut Mover<'_>) {
    if m.taken - m.ack_sent < replay::ACK_EVERY {
        return;
    }
    let mut g = match m.guest_w.try_lock() {
        Ok(g) => g,
        Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => return,
    };
    // Only if it leaves at once: this side must not wait for the guest to read.
    if g.is_broken() || unix::writable_now(g.get_ref().as_raw_fd()) {
        let _ = g.write_all(&replay::ack_frame(m.taken));
        m.ack_sent = m.taken;
    }
}

/// Checks and forwards the guest's commands (on a VM's rings: its doorbells) until
/// it disconnects or breaks framing; between two of them, carries out the
/// migrations asked for (a relayed session's API server gets the capture in its
/// stream, after every frame forwarded before).
///
/// A session whose stream both ends keep (`Mover::replay`) reads each frame whole
/// before forwarding it and counts it taken; its connection failing between two
/// frames, or within one not forwarded yet, ends this as the guest closing would (the
/// caller tells a cut from that).
fn relay_to_server(
    guest: &mut BufReader<UnixStream>,
    door: &crate::migrate::Door,
    m: &mut Mover<'_>,
    window_len: u64,
    doorbells_only: bool,
    api: &'static Description,
    stats: &mut SessionStats,
) -> Result<(), SessionError> {
    let guest_w = m.guest_w;
    let keeps = m.replay;
    let mut buf = vec![0u8; RELAY_CHUNK];
    let mut whole: Vec<u8> = Vec::new();
    // A read from the guest that fails: the end of its connection, or an error.
    let ended = |e: std::io::Error| -> Result<(), SessionError> {
        if keeps || e.kind() == std::io::ErrorKind::UnexpectedEof {
            Ok(())
        } else {
            Err(e.into())
        }
    };
    loop {
        if guest.buffer().is_empty() && !guest_or_door(guest.get_ref(), door, m)? {
            return Ok(());
        }
        let mut hb = [0u8; HEADER_LEN];
        if let Err(e) = guest.read_exact(&mut hb) {
            return ended(e);
        }
        let h = match FrameHeader::decode(&hb) {
            Ok(h) => h,
            Err(e) => {
                // Framing is lost; nothing after this can be trusted.
                send_error(guest_w, None, error_code::MALFORMED, &e.to_string());
                return Err(SessionError::Handshake(format!(
                    "malformed frame header: {e}"
                )));
            }
        };
        let frame_len = (HEADER_LEN + h.len as usize) as u64;
        if doorbells_only {
            // A VM session on rings: its frames travel in shared memory; the socket
            // carries only doorbells, which have no body to copy.
            if h.kind == FrameKind::Notify && h.opcode == DOORBELL && h.len == 0 {
                forward(guest, &mut &*m.server, &hb, &[], 0, &mut buf)?;
                continue;
            }
            let m = "a guest on rings may only ring the doorbell on its socket";
            send_error(guest_w, None, error_code::MALFORMED, m);
            return Err(SessionError::Handshake(m.into()));
        }
        if keeps && replay::is_ack(&h) {
            let mut p = [0u8; 8];
            if let Err(e) = guest.read_exact(&mut p) {
                return ended(e);
            }
            if let Some(n) = replay::ack_count(&p) {
                m.guest_acked
                    .fetch_max(n, std::sync::atomic::Ordering::AcqRel);
            }
            m.taken += frame_len;
            acknowledge(m);
            continue;
        }
        if h.kind == FrameKind::Notify && h.opcode == migrate::DRAINED && h.len == 0 {
            m.taken += frame_len;
            // The guest's last frame before a suspension (ignored otherwise).
            if drained(door, m) {
                return Ok(());
            }
            continue;
        }
        let span_bytes = h.span_count as usize * SPAN_LEN;
        let mut spans = vec![0u8; span_bytes];
        if let Err(e) = guest.read_exact(&mut spans) {
            return ended(e);
        }
        let rest = h.len as usize - span_bytes;
        let verdict = if h.kind != FrameKind::Request {
            Err((
                error_code::MALFORMED,
                format!("guests may only send requests, not {:?}", h.kind),
            ))
        } else {
            match api.op(h.opcode) {
                None => Err((
                    error_code::UNKNOWN_OPCODE,
                    format!("opcode {} names no function", h.opcode),
                )),
                Some(op) if h.no_reply() && !op.may_async => Err((
                    error_code::MALFORMED,
                    format!("{} may not be forwarded asynchronously", op.name),
                )),
                Some(op) => frame::decode_spans(&spans, h.span_count as usize, window_len)
                    .map(|_| op.name)
                    .map_err(|e| (error_code::BAD_SPAN, e.to_string())),
            }
        };
        if let Err((code, message)) = verdict {
            debug!("rejected frame: {message}");
            stats.rejected += 1;
            if let Err(e) = skip(guest, rest, &mut buf) {
                return ended(e);
            }
            if !h.no_reply() {
                send_error(guest_w, Some(&h), code, &message);
            }
            m.taken += frame_len;
            continue;
        }
        if !keeps {
            forward(guest, &mut &*m.server, &hb, &spans, rest, &mut buf)?;
            continue;
        }
        if rest <= WHOLE_FRAME {
            let body: &mut [u8] = if rest <= buf.len() {
                &mut buf[..rest]
            } else {
                whole.resize(rest, 0);
                &mut whole[..]
            };
            if let Err(e) = guest.read_exact(body) {
                return ended(e);
            }
            frame::write_parts(&mut &*m.server, &[&hb, &spans, body])?;
            if whole.len() > RELAY_CHUNK {
                whole = Vec::new();
            }
        } else {
            // Too large to hold: forwarded as it comes. A cut in its middle leaves
            // part of it with the API server, so then the session cannot go on.
            forward(guest, &mut &*m.server, &hb, &spans, rest, &mut buf)?;
        }
        m.taken += frame_len;
        acknowledge(m);
    }
}
