//! The control socket: operators and tests ask the daemon what it is doing, change
//! VMs' settings live, and move sessions.
//!
//! The requests and answers are the typed ones of `hira-control` (their wire format:
//! docs/control.md). Each client is served on its own thread; a request that does not
//! parse gets `{"error": ...}` and the connection goes on. `checkpoint` and `restore`
//! carry a snapshot besides their lines (a descriptor; bytes), and so are served
//! here rather than by [`answer`].
//!
//! The socket gets the same owner and mode as the guest sockets.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hira_control::{
    DrainAnswer, MovedAnswer, Parked, ParkedAnswer, Request, SendBytes, SetAnswer, SetError, SetVm,
    Stored, Suspended, SuspendedAnswer, TokenHex, VmAddedAnswer, VmList, VmRemovedAnswer, VmSlot,
    Waited,
};
use log::{debug, info, warn};
use serde::Serialize;
use serde_json::{Value, json};

use crate::lifecycle::Lifecycle;
use crate::migrate::{MigrateError, PlaceError};
use crate::served::Served;
use crate::vms::{Vm, Vms};
/// Longest `wait_idle` timeout.
const MAX_WAIT: Duration = Duration::from_secs(600);

pub use hira_control::{ParkedStatus, SessionStatus, Status, VmStatus};

/// The daemon's state as the control socket reports it.
pub fn status(life: &Lifecycle, vms: &Vms) -> Status {
    let (sessions, ended) = life.snapshot();
    let sessions = sessions
        .into_iter()
        .map(|session| {
            let usage = vms
                .get(&session.vm)
                .and_then(|q| q.usage_of(session.id))
                .unwrap_or_default();
            SessionStatus {
                session,
                commands: usage.commands,
                bytes: usage.bytes,
                memory: usage.memory,
                device_ns: usage.device_ns,
                output_bytes: usage.output_bytes,
                output_dropped: usage.output_dropped,
            }
        })
        .collect();
    let vms = vms
        .snapshot()
        .into_iter()
        .map(|(name, q)| vm_status(name, &q))
        .collect();
    Status {
        sessions,
        ended,
        vms,
        api_server_crashes: life.api_server_crashes.load(Ordering::Relaxed),
        sandbox: crate::spawn::sandbox_report(),
        metrics_address: crate::metrics::ADDRESS.get().map(ToString::to_string),
        migrations: life.migrations.load(Ordering::Relaxed),
        suspensions: life.suspensions.load(Ordering::Relaxed),
        resumptions: life.resumptions.load(Ordering::Relaxed),
        remote_refused: life.remote_refused.load(Ordering::Relaxed),
        detached: life.detached(),
        reconnections: life.reconnections.load(Ordering::Relaxed),
        parked: life
            .parked()
            .into_iter()
            .map(|(vm, snapshot_bytes)| ParkedStatus { vm, snapshot_bytes })
            .collect(),
    }
}

fn vm_status(name: String, q: &Vm) -> VmStatus {
    let u = q.usage();
    let (mem_quota, mem_used) = q.memory();
    let (host_mem_used, host_mem, host_mem_kills) = q.host_memory();
    VmStatus {
        name,
        sessions: q.sessions(),
        commands: u.commands,
        bytes: u.bytes,
        mem_used,
        mem_quota,
        share: q.share(),
        device_ns: u.device_ns,
        in_flight: u.in_flight,
        held: u.held,
        held_ns: u.held_ns,
        decision: q.decision().to_string(),
        output_bytes: u.output_bytes,
        output_dropped: u.output_dropped,
        max_sessions: q.max_sessions(),
        host_mem_used,
        host_mem,
        host_mem_kills,
    }
}

/// Why the daemon refuses a request; sent as `{"error": TEXT}`.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("not a request: {0}")]
    Malformed(#[from] serde_json::Error),
    #[error("request longer than {} bytes", hira_control::MAX_LINE)]
    TooLong,
    #[error("no VM {vm:?} (known: {known})")]
    NoVm { vm: String, known: String },
    #[error(transparent)]
    Set(#[from] SetError),
    #[error("host_mem needs the daemon to run with --cgroup DIR")]
    NoCgroup,
    #[error("cannot set the host-memory cap: {0}")]
    HostMem(#[source] std::io::Error),
    #[error("cannot set the quota: {0}")]
    Quota(#[source] std::io::Error),
    #[error("session {0} is not live here (not served yet, ended, or unknown)")]
    NotMovable(u64),
    #[error("migrating to another daemon needs a connection that can carry descriptors")]
    NeedsDescriptors,
    #[error("{0}")]
    Migration(#[from] MigrateError),
    #[error(transparent)]
    Vm(#[from] crate::served::VmError),
    #[error("VMs are added and removed on the daemon's control socket")]
    NoServed,
    #[error("session {0} is not live or was not placed here from another host")]
    NotPlacedHere(u64),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("no configured GPU host can take sessions now")]
    NoGpuHost,
}

/// An answer on the wire: the command's object, or `{"error": ...}`.
fn reply<T: Serialize>(answer: Result<T, Refused>) -> Value {
    match answer.map(serde_json::to_value) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => json!({ "error": format!("cannot write the answer: {e}") }),
        Err(e) => json!({ "error": e.to_string() }),
    }
}

/// `set`: changes a VM's settings live, once every one of them is checked.
fn set(req: &SetVm, vms: &Vms) -> Result<SetAnswer, Refused> {
    let vm = &req.vm;
    let Some(q) = vms.get(vm) else {
        let known: Vec<String> = vms.snapshot().into_iter().map(|(n, _)| n).collect();
        return Err(Refused::NoVm {
            vm: vm.clone(),
            known: known.join(", "),
        });
    };
    req.check()?;
    if req.host_mem.is_some() && q.cgroup.get().is_none() {
        return Err(Refused::NoCgroup);
    }
    if let Some(cap) = req.host_mem {
        // The kernel may refuse a cap below what the VM uses now (cgroup v1).
        q.set_host_mem(cap).map_err(Refused::HostMem)?;
        info!("VM {vm:?}: host-memory cap set to {cap:?} bytes");
    }
    if let Some(n) = req.max_sessions {
        q.set_max_sessions(n);
        info!("VM {vm:?}: at most {n} sessions");
    }
    if let Some(quota) = req.mem_quota {
        q.set_mem_quota(quota).map_err(Refused::Quota)?;
        info!("VM {vm:?}: device-memory quota set to {quota:?} bytes");
    }
    if let Some(share) = req.share {
        q.set_share(share);
        info!("VM {vm:?}: share set to {share}");
    }
    Ok(SetAnswer {
        vm: vm_status(vm.clone(), &q),
    })
}

/// Answers one request line that needs nothing but the line (not `checkpoint`,
/// `restore`, or `migrate` to another daemon).
pub fn answer(line: &str, life: &Lifecycle, vms: &Vms) -> Value {
    match serde_json::from_str(line) {
        Ok(req) => answer_request(&req, life, vms),
        Err(e) => reply::<()>(Err(e.into())),
    }
}

fn answer_request(req: &Request, life: &Lifecycle, vms: &Vms) -> Value {
    match req {
        Request::Status => json!(status(life, vms)),
        Request::Set(s) => reply(set(s, vms)),
        Request::WaitIdle { timeout_ms } => wait(life, vms, 0, true, *timeout_ms),
        Request::WaitLive {
            count,
            started,
            timeout_ms,
        } => wait(
            life,
            vms,
            *count as usize,
            started.unwrap_or(true),
            *timeout_ms,
        ),
        Request::Migrate { to: Some(_), .. }
        | Request::Checkpoint { .. }
        | Request::Restore { .. } => reply::<()>(Err(Refused::NeedsDescriptors)),
        Request::VmAdd { .. }
        | Request::VmRemove { .. }
        | Request::VmList
        | Request::Drain { .. } => reply::<()>(Err(Refused::NoServed)),
        Request::Migrate {
            session,
            timeout_ms,
            device,
            to: None,
        } => reply(migrate(life, *session, *timeout_ms, *device)),
    }
}

/// `wait_idle`, `wait_live`: answers once `count` sessions are live (and `started`:
/// their API servers started), or the timeout passed.
fn wait(
    life: &Lifecycle,
    vms: &Vms,
    count: usize,
    started: bool,
    timeout_ms: Option<u64>,
) -> Value {
    let timeout = Duration::from_millis(timeout_ms.unwrap_or(10_000)).min(MAX_WAIT);
    let reached = life.wait_sessions(count, started, timeout);
    json!(Waited {
        reached,
        status: status(life, vms),
    })
}

/// Longest a migration may take by default.
const MIGRATE_WAIT: Duration = Duration::from_secs(300);

fn migrate(
    life: &Lifecycle,
    id: u64,
    timeout_ms: Option<u64>,
    device: Option<u32>,
) -> Result<MovedAnswer, Refused> {
    let timeout = timeout_ms
        .map_or(MIGRATE_WAIT, Duration::from_millis)
        .min(MAX_WAIT);
    let door = life.door(id).ok_or(Refused::NotMovable(id))?;
    let moved = door.ask(timeout, device)?;
    info!(
        "session {id} migrated to API server {} ({} bytes, paused {:.1} ms)",
        moved.to_pid, moved.snapshot_bytes, moved.pause_ms
    );
    Ok(MovedAnswer { moved })
}

fn serve_client(
    stream: UnixStream,
    life: &Lifecycle,
    vms: &Vms,
    served: &Served,
) -> std::io::Result<()> {
    let mut w = stream.try_clone()?;
    let mut r = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        let n = (&mut r)
            .take(hira_control::MAX_LINE as u64)
            .read_line(&mut line)?;
        if n == 0 {
            return Ok(());
        }
        let req = if line.ends_with('\n') {
            serde_json::from_str::<Request>(line.trim()).map_err(Refused::from)
        } else {
            Err(Refused::TooLong)
        };
        let answer = match req {
            Err(e) => reply::<()>(Err(e)),
            Ok(Request::Checkpoint { session }) => {
                // Answered in frames (one carries the snapshot), then one line.
                match checkpoint(session, life, &mut r, &mut w)? {
                    Some(v) => v,
                    None => continue,
                }
            }
            Ok(Request::Restore {
                vm,
                token,
                bytes,
                slot,
            }) => {
                let parked = restore(
                    life,
                    vms,
                    served,
                    (&vm, token.0, bytes, slot),
                    &mut r,
                    &mut w,
                )?;
                reply(parked)
            }
            Ok(Request::Migrate {
                session,
                to: Some(to),
                ..
            }) => reply(match served.config().remote.known(&to) {
                Ok(gpu) if !to.contains('/') => {
                    migrate_to_gpu_host(life, session, served.config(), gpu)
                }
                _ => migrate_to(life, session, PathBuf::from(to)),
            }),
            Ok(Request::Drain { to }) => reply(drain(life, served.config(), to.as_deref())),
            Ok(Request::VmAdd { spec }) => reply(
                served
                    .add(&spec)
                    .map(|added| VmAddedAnswer { added })
                    .map_err(Refused::from),
            ),
            Ok(Request::VmRemove { vm, timeout_ms }) => {
                let timeout = Duration::from_millis(timeout_ms.unwrap_or(10_000)).min(MAX_WAIT);
                reply(
                    served
                        .remove(&vm, timeout)
                        .map(|sessions_ended| VmRemovedAnswer {
                            removed: vm,
                            sessions_ended,
                        })
                        .map_err(Refused::from),
                )
            }
            Ok(Request::VmList) => json!(VmList { vms: served.list() }),
            Ok(req) => answer_request(&req, life, vms),
        };
        writeln!(w, "{answer}")?;
    }
}

fn suspended(c: &crate::migrate::Captured) -> Suspended {
    Suspended {
        vm: c.vm.clone(),
        slot: c.slot,
        token: TokenHex(c.token),
        snapshot_bytes: c.bytes,
        from_pid: c.from_pid,
        capture_ms: c.capture_ms,
    }
}

/// A frame with a JSON payload and descriptors, as `checkpoint` answers.
fn json_frame(w: &mut UnixStream, v: &Value, fds: &[&std::os::fd::OwnedFd]) -> std::io::Result<()> {
    let payload = v.to_string();
    let h =
        hira_protocol::FrameHeader::new(hira_protocol::FrameKind::Notify, 0, 0, 0, payload.len());
    hira_protocol::unix::send_frame_with_fds(w, &h, payload.as_bytes(), fds)
}

/// `checkpoint`: the snapshot goes to the client, which stores it. The first answer
/// is a frame: the snapshot (with `"suspended"`) or why not (`"error"`, and nothing
/// follows); after the client's word, a line says how it ended (returned; `None` when
/// the frame was the whole answer).
fn checkpoint(
    id: u64,
    life: &Lifecycle,
    r: &mut BufReader<UnixStream>,
    w: &mut UnixStream,
) -> std::io::Result<Option<Value>> {
    let Some(door) = life.door(id) else {
        json_frame(w, &reply::<()>(Err(Refused::NotMovable(id))), &[])?;
        return Ok(None);
    };
    let mut io_error = None;
    let mut placed = false;
    let res = door.suspend(MIGRATE_WAIT, |c| {
        placed = true;
        let answer = reply::<SuspendedAnswer>(Ok(SuspendedAnswer {
            suspended: suspended(c),
            to: None,
        }));
        let stored = json_frame(w, &answer, &[&c.snapshot]).and_then(|()| {
            let mut ack = String::new();
            r.read_line(&mut ack)?;
            Ok(ack)
        });
        match stored {
            Ok(ack) => match serde_json::from_str::<Stored>(ack.trim()) {
                Ok(Stored { stored: true, .. }) => Ok(String::new()),
                Ok(Stored { error, .. }) => Err(PlaceError::NotStored(
                    error.unwrap_or_else(|| "no reason given".into()),
                )),
                Err(e) => Err(PlaceError::NotStored(format!("a malformed answer: {e}"))),
            },
            Err(e) => {
                let m = PlaceError::ClientGone(e.to_string());
                io_error = Some(e);
                Err(m)
            }
        }
    });
    if let Some(e) = io_error {
        return Err(e);
    }
    match res {
        Ok(c) => {
            info!(
                "session {id} checkpointed ({} bytes) and suspended",
                c.bytes
            );
            Ok(Some(reply(Ok(SuspendedAnswer {
                suspended: suspended(&c),
                to: None,
            }))))
        }
        Err(e) if placed => Ok(Some(reply::<()>(Err(e.into())))),
        Err(e) => {
            json_frame(w, &reply::<()>(Err(e.into())), &[])?;
            Ok(None)
        }
    }
}

/// `restore`: a snapshot from the client waits here for its guest.
fn restore(
    life: &Lifecycle,
    vms: &Vms,
    served: &Served,
    (vm, token, bytes, slot): (&str, hira_protocol::handshake::Token, u64, Option<VmSlot>),
    r: &mut BufReader<UnixStream>,
    w: &mut UnixStream,
) -> std::io::Result<Result<ParkedAnswer, Refused>> {
    // A VM session resumes in its slot of the VM's window, kept for it until then
    // (given back if anything below fails).
    let parked_slot = match crate::migrate::reserve_slot(vms, vm, slot) {
        Ok(s) => s,
        Err(e) => return Ok(Err(e.into())),
    };
    // The snapshot comes as bytes on this connection, so that it can come from
    // another host through a forwarded socket (`ssh -L`), which carries no
    // descriptor.
    writeln!(
        w,
        "{}",
        json!(SendBytes {
            send: "bytes".into()
        })
    )?;
    if let Err(e) = crate::migrate::park_from(life, vm, token, parked_slot, bytes, r) {
        return Ok(Err(e.into()));
    }
    let endpoint = served
        .endpoint(vm)
        .map_or_else(String::new, |p| p.display().to_string());
    info!("a suspended session of VM {vm:?} waits for its guest");
    Ok(Ok(ParkedAnswer {
        parked: Parked {
            vm: vm.to_string(),
            endpoint,
            snapshot_bytes: bytes,
        },
    }))
}

/// Parks `c` at the daemon whose control socket is `path`; returns where the guest
/// reconnects.
pub fn restore_at(
    path: &std::path::Path,
    c: &crate::migrate::Captured,
) -> Result<String, PlaceError> {
    use std::io::{Seek, SeekFrom};
    let mut f = c
        .snapshot
        .try_clone()
        .map(std::fs::File::from)
        .and_then(|mut f| f.seek(SeekFrom::Start(0)).map(|_| f))
        .map_err(PlaceError::Snapshot)?;
    let parked = hira_control::park_at(path, &c.vm, &c.token, c.slot, c.bytes, &mut f).map_err(
        |source| PlaceError::Daemon {
            path: path.to_path_buf(),
            source,
        },
    )?;
    Ok(parked.endpoint)
}

/// `migrate` with `to`: suspended here, resumed at the other daemon.
fn migrate_to(life: &Lifecycle, id: u64, to: PathBuf) -> Result<SuspendedAnswer, Refused> {
    let door = life.door(id).ok_or(Refused::NotMovable(id))?;
    let c = door.suspend(MIGRATE_WAIT, |c| restore_at(&to, c))?;
    info!("session {id} moved to the daemon at {}", to.display());
    Ok(SuspendedAnswer {
        suspended: suspended(&c),
        to: Some(to.display().to_string()),
    })
}

/// `migrate` with `to` naming a GPU host: a session placed here from another host is
/// suspended and handed to that GPU host, where its guest's VM host resumes it.
fn migrate_to_gpu_host(
    life: &Lifecycle,
    id: u64,
    config: &crate::config::Config,
    gpu: &crate::config::GpuHost,
) -> Result<SuspendedAnswer, Refused> {
    let (live, _) = life.snapshot();
    if !live
        .iter()
        .any(|s| s.id == id && s.vm.contains(':') && s.api_server_pid.is_some())
    {
        return Err(Refused::NotPlacedHere(id));
    }
    let door = life.door(id).ok_or(Refused::NotMovable(id))?;
    let c = door.suspend(MIGRATE_WAIT, |c| {
        crate::remote::client::park_at(config, gpu, c)
    })?;
    info!("session {id} moved to GPU host {:?}", gpu.name);
    Ok(SuspendedAnswer {
        suspended: suspended(&c),
        to: Some(gpu.name.clone()),
    })
}

/// `drain`: no new remote sessions here, and every session placed here from another
/// host moves to `to` (or to the configured GPU host that can take the most).
fn drain(
    life: &Lifecycle,
    config: &crate::config::Config,
    to: Option<&str>,
) -> Result<DrainAnswer, Refused> {
    let target = to.map(|t| config.remote.known(t)).transpose()?;
    life.draining.store(true, Ordering::Release);
    info!("draining: no new remote sessions");
    let mut answer = DrainAnswer::default();
    let (live, _) = life.snapshot();
    for s in live {
        if !s.vm.contains(':') {
            answer.stayed += 1;
            continue;
        }
        let gpu = match target {
            Some(g) => Ok(g),
            None => crate::remote::client::ranked(config)
                .first()
                .copied()
                .ok_or(Refused::NoGpuHost),
        };
        match gpu.and_then(|g| migrate_to_gpu_host(life, s.id, config, g).map(|_| g)) {
            Ok(g) => answer.moved.push((s.id, g.name.clone())),
            Err(e) => answer.failed.push((s.id, e.to_string())),
        }
    }
    Ok(answer)
}

/// Serves the control socket until the daemon exits; each client on its own thread.
/// `served`: the VMs served (each one's guest socket, where a restored session's
/// guest reconnects), which VMs are added to and removed from.
pub fn serve(listener: UnixListener, life: Arc<Lifecycle>, vms: Arc<Vms>, served: Arc<Served>) {
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                warn!("control socket accept failed: {e}");
                continue;
            }
        };
        let (life, vms, served) = (life.clone(), vms.clone(), served.clone());
        let spawned = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || {
                if let Err(e) = serve_client(stream, &life, &vms, &served) {
                    debug!("control client: {e}");
                }
            });
        if let Err(e) = spawned {
            warn!("cannot serve a control client: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_commands_and_bad_json_get_errors() {
        let (life, vms) = (Lifecycle::default(), Vms::default());
        assert!(answer("nonsense", &life, &vms)["error"].is_string());
        assert!(
            answer("{\"cmd\":\"reboot\"}", &life, &vms)["error"]
                .as_str()
                .unwrap()
                .contains("reboot")
        );
    }

    #[test]
    fn status_lists_vms_and_wait_idle_returns_at_once_when_idle() {
        let (life, vms) = (Lifecycle::default(), Vms::default());
        let (page, _fd) = hira_protocol::usage::UsagePage::create().unwrap();
        page.command(3, 100);
        let _tracked = vms.vm("vm1").track(1, std::sync::Arc::new(page));
        let s = answer("{\"cmd\":\"status\"}", &life, &vms);
        assert_eq!(s["vms"][0]["name"], "vm1");
        assert_eq!(s["vms"][0]["bytes"], 100);
        let w = answer("{\"cmd\":\"wait_idle\",\"timeout_ms\":1}", &life, &vms);
        assert_eq!(w["reached"], true);
    }
}
