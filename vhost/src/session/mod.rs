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

use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

use hira_protocol::handshake::{ErrorPayload, TeardownPayload, error_code};
use hira_protocol::resend::Resending;
use hira_protocol::{FrameHeader, FrameKind};
use log::{info, warn};

use crate::config::Config;
use crate::lifecycle::{EndedSession, Lifecycle, Registration};
use crate::migrate::mover::Mover;
use crate::spawn;
use crate::vms::Vm;
use handshake::{
    DataPlane, Greeting, Introduced, admit, introduce, place_data_plane, receive_hello, take_parked,
};
use relay::{RelayLink, Relayed, relay_to_guest, relay_until_end, serve_on_rings};

pub(crate) mod handshake;
pub(crate) mod relay;

/// Chunk size for relaying frame bodies.
pub(crate) const RELAY_CHUNK: usize = 256 * 1024;

/// A relayed VM session reads each frame of its guest whole before forwarding it (up
/// to this size), so that a cut connection leaves no part of one with the API server.
pub(crate) const WHOLE_FRAME: usize = 16 << 20;

/// The guest's end as the daemon writes it: a relayed VM session keeps what it sends
/// until the guest acknowledges it (`hira_protocol::resend`).
pub(crate) type GuestOut = Resending<UnixStream>;

/// What a session's guest sent, for the log line that closes the session.
#[derive(Debug, Default, Clone, Copy)]
pub struct SessionStats {
    /// Commands forwarded to the API server.
    pub commands: u64,
    /// Bytes of those commands after their headers.
    pub bytes: u64,
    /// Frames the API server refused.
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
pub(crate) fn send_error(w: &Mutex<GuestOut>, h: Option<&FrameHeader>, code: u32, message: &str) {
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

/// What a session needs of the daemon: who it is, its VM's state, the daemon's
/// settings and the registry of sessions.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    pub id: u64,
    pub vm: &'a str,
    pub config: &'a Config,
    pub queue: &'a Arc<Vm>,
    pub life: &'a Arc<Lifecycle>,
}

/// Runs a session to its end. Never panics on guest input; logs why it ended.
pub fn run(guest: UnixStream, slot: crate::listener::ConnectionSlot, ctx: Context<'_>) {
    let Context { id, vm, life, .. } = ctx;
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
    let guest_w = Arc::new(Mutex::new(Resending::plain(guest_w)));
    if let Err(e) = serve(guest, guest_w, ctx, &mut registration) {
        warn!("VM {vm:?} session {id}: {e}");
    }
}

/// The session's stages in order: the guest's hello, a resumed session's checks,
/// the data plane's placement, admission under the VM's cap, the API server's start
/// and handshake, the relay until either side ends, and the record of how it ended.
pub(crate) fn serve(
    mut guest: UnixStream,
    guest_w: Arc<Mutex<GuestOut>>,
    ctx: Context<'_>,
    registration: &mut Registration,
) -> Result<(), SessionError> {
    let Context {
        id,
        vm,
        config,
        queue,
        life,
    } = ctx;
    let Some(Greeting {
        header,
        hello,
        api,
        fds,
    }) = receive_hello(&mut guest, &guest_w, &ctx)?
    else {
        return Ok(());
    };
    let Greeting {
        header,
        mut hello,
        api,
        fds,
    } = match queue.gpu_host() {
        Some(placement) => {
            let greeting = Greeting {
                header,
                hello,
                api,
                fds,
            };
            match crate::remote::forward::run(
                &guest,
                &guest_w,
                greeting,
                placement,
                &ctx,
                registration,
            )? {
                Some(g) => g,
                None => return Ok(()),
            }
        }
        None => Greeting {
            header,
            hello,
            api,
            fds,
        },
    };
    let mut fds = fds.into_iter();
    let fd = fds.next();
    // A VM guest whose connection a device reset cut comes back to its live session
    // (on rings in its window slot, or relayed with the stream kept on both ends).
    if let Some(token) = hello.resume
        && fd.is_none()
        && (hello.vm_window && hello.rings || hello.resend)
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
    let mut parked = take_parked(&mut hello, &guest_rings, &guest_w, &ctx)?;
    let DataPlane {
        window,
        lease,
        local_rings,
        vm_rings,
        asks_resend,
    } = place_data_plane(&mut hello, fd, &mut parked, &guest_w, &ctx)?;
    guest.set_read_timeout(None)?;
    let _slot = admit(&guest_w, &ctx)?;
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
        let Introduced {
            hello: (h, hello_bytes),
            keep_window,
            server_welcome,
            ring_fds,
            mut welcome,
            resend,
        } = introduce(
            &mut server,
            &guest_w,
            (header, &hello),
            window,
            (&mut parked, &guest_rings),
            (local_rings, vm_rings, asks_resend),
            token,
            &ctx,
        )?;
        let rings = server_welcome.ring_capacity > 0;
        on_rings = rings;
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
                resend,
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
                relay_until_end(
                    &guest,
                    &door,
                    &mut m,
                    &mut welcome,
                    Relayed {
                        window_len: server_welcome.window_len,
                        rings,
                        vm_rings,
                        api,
                    },
                    &mut stats,
                    &ctx,
                )
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
    if let Some(l) = &lease {
        l.ending();
    }
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

/// How long a VM session on rings whose connection a device reset cut waits for its
/// guest to connect again.
pub(crate) const RESET_GRACE: std::time::Duration = std::time::Duration::from_secs(30);
