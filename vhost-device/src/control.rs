//! The control socket: operators and tests ask the daemon what it is doing.
//!
//! One JSON request per line, one JSON answer per line:
//!
//! - `{"cmd":"status"}`: the live sessions (VM, process, guest pid, API-server pid),
//!   the most recently ended ones (how the API server ended, what it released), the
//!   per-VM counters, the count of API servers that crashed, and how each layer of
//!   the API servers' sandbox went on this machine.
//! - `{"cmd":"wait_idle","timeout_ms":N}`: answers once no session is live (or the
//!   timeout passes) with `{"reached":true|false}` and the status, so a caller waits
//!   for an event rather than polling. `{"cmd":"wait_live","count":N,...}` waits for
//!   exactly N live sessions whose API servers have started (`"started":false`: in
//!   their handshake or later).
//!
//! - `{"cmd":"set","vm":NAME,"mem_quota":BYTES|null,"share":N,"max_sessions":N,
//!   "host_mem":BYTES|null}`: sets a VM's device-memory quota (null: none), share of
//!   device time, cap on sessions and cap on its API servers' host memory (with
//!   `--cgroup`) live; answers with the VM's new state. The VM must be one the daemon
//!   serves.
//!
//! - `{"cmd":"migrate","session":ID,"timeout_ms":N,"device":K}`: moves a live session
//!   to a new API server (see `migrate`), on the host's device of index K if given and answers with what it did (`{"moved":{...}}`: the
//!   old and new API-server pids, the snapshot's size, the pause), or with why the
//!   session stays where it was (`{"error":...}`).
//!
//!   With `"to":PATH` (another daemon's control socket on this host) the session is
//!   suspended here and resumed there: its guest reconnects to that daemon.
//! - `{"cmd":"checkpoint","session":ID}`: suspends a session into a snapshot that the
//!   client stores. The answer is a frame (the protocol's header, a JSON payload)
//!   with the snapshot's memfd attached; the client answers `{"stored":true}` (or
//!   false, and the session goes on here), and the daemon's last line says what
//!   happened. The guest then waits to reconnect.
//! - `{"cmd":"restore","vm":NAME,"token":HEX,"bytes":N,"slot":...}`: the daemon
//!   answers `{"send":"bytes"}`, the client sends the snapshot's N bytes on the same
//!   connection (so that it may be a socket forwarded from another host, `ssh -L`),
//!   and the session waits here for its guest, which resumes it on reconnecting
//!   (`{"parked":{"endpoint":...}}`).
//!
//! The socket gets the same owner and mode as the guest sockets.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use log::{debug, info, warn};
use serde::Serialize;
use serde_json::{Value, json};

use crate::lifecycle::{EndedSession, Lifecycle, LiveSession};
use crate::router::{Router, VmQueue};

/// Longest request line accepted.
const MAX_REQUEST: usize = 4096;
/// Longest `wait_idle` timeout.
const MAX_WAIT: Duration = Duration::from_secs(600);

/// One VM's counters.
#[derive(Debug, Serialize)]
pub struct VmStatus {
    pub name: String,
    pub sessions: usize,
    pub commands: u64,
    pub bytes: u64,
    /// Device memory the VM's sessions hold now, in bytes.
    pub mem_used: u64,
    /// The VM's device-memory quota in bytes (null: none).
    pub mem_quota: Option<u64>,
    /// The VM's share of device time.
    pub share: u32,
    /// Device time its sessions' commands used, in ns (ended and live sessions).
    pub device_ns: u64,
    /// Its measured commands in flight now, and of those held back by the scheduler.
    pub in_flight: u64,
    pub held: u64,
    /// Time its commands spent held by the scheduler (queue delay), in ns.
    pub held_ns: u64,
    /// The scheduler's last decision: run, hold or delay.
    pub decision: &'static str,
    /// The host library's output (a kernel's `printf`) sent to the VM's guests, and
    /// dropped over their sessions' bound, in bytes (ended and live sessions).
    pub output_bytes: u64,
    pub output_dropped: u64,
    /// The VM's own cap on sessions (null: the daemon-wide one).
    pub max_sessions: Option<usize>,
    /// Host memory its API servers use together, their cap, and how many the kernel
    /// killed for it (null without `--cgroup`; the cap null when there is none).
    pub host_mem_used: Option<u64>,
    pub host_mem: Option<u64>,
    pub host_mem_kills: Option<u64>,
}

/// A live session with what its API server has counted.
#[derive(Debug, Serialize)]
pub struct SessionStatus {
    #[serde(flatten)]
    pub session: LiveSession,
    pub commands: u64,
    pub bytes: u64,
    /// Device memory the session holds, in bytes.
    pub memory: u64,
    /// Device time its commands used, in ns.
    pub device_ns: u64,
    /// The host library's output sent to its guest, and dropped over its bound, in
    /// bytes.
    pub output_bytes: u64,
    pub output_dropped: u64,
}

/// What `status` answers.
#[derive(Debug, Serialize)]
pub struct Status {
    pub sessions: Vec<SessionStatus>,
    pub ended: Vec<EndedSession>,
    pub vms: Vec<VmStatus>,
    pub api_server_crashes: u64,
    /// How each layer of the API servers' sandbox went on this machine.
    pub sandbox: Vec<String>,
    /// Where the Prometheus endpoint listens, if it does.
    pub metrics_address: Option<String>,
    /// Suspended sessions restored here and waiting for their guests.
    pub parked: Vec<ParkedStatus>,
    /// Live sessions whose connection a device reset cut, waiting for their guests to
    /// connect again, and how many guests did so far.
    pub detached: usize,
    pub reconnections: u64,
    /// Sessions moved to a new API server, suspended to leave, and resumed here.
    pub migrations: u64,
    pub suspensions: u64,
    pub resumptions: u64,
}

/// A suspended session waiting for its guest.
#[derive(Debug, Serialize)]
pub struct ParkedStatus {
    pub vm: String,
    pub snapshot_bytes: u64,
}

/// The daemon's state as the control socket reports it.
pub fn status(life: &Lifecycle, router: &Router) -> Status {
    let (sessions, ended) = life.snapshot();
    let sessions = sessions
        .into_iter()
        .map(|session| {
            let usage = router
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
    let vms = router
        .snapshot()
        .into_iter()
        .map(|(name, q)| vm_status(name, &q))
        .collect();
    Status {
        sessions,
        ended,
        vms,
        api_server_crashes: life.api_server_crashes.load(Ordering::Relaxed),
        sandbox: crate::spawn::SANDBOX_REPORT
            .get()
            .cloned()
            .unwrap_or_default(),
        metrics_address: crate::metrics::ADDRESS.get().map(ToString::to_string),
        migrations: life.migrations.load(Ordering::Relaxed),
        suspensions: life.suspensions.load(Ordering::Relaxed),
        resumptions: life.resumptions.load(Ordering::Relaxed),
        detached: life.detached(),
        reconnections: life.reconnections.load(Ordering::Relaxed),
        parked: life
            .parked()
            .into_iter()
            .map(|(vm, snapshot_bytes)| ParkedStatus { vm, snapshot_bytes })
            .collect(),
    }
}

fn vm_status(name: String, q: &VmQueue) -> VmStatus {
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
        decision: q.decision(),
        output_bytes: u.output_bytes,
        output_dropped: u.output_dropped,
        max_sessions: q.max_sessions(),
        host_mem_used,
        host_mem,
        host_mem_kills,
    }
}

/// A size setting of `set`: absent (`None`), `null` (`Some(None)`: no limit) or a
/// positive number of bytes; anything else is the error answer.
fn bytes_or_null(req: &Value, key: &str) -> Result<Option<Option<u64>>, Value> {
    match req.get(key) {
        None => Ok(None),
        Some(Value::Null) => Ok(Some(None)),
        Some(v) => v
            .as_u64()
            .filter(|&n| n > 0)
            .map(|n| Some(Some(n)))
            .ok_or_else(
                || json!({ "error": format!("{key} must be a positive number of bytes or null") }),
            ),
    }
}

/// `set`: changes a VM's settings live.
fn set(req: &Value, router: &Router) -> Value {
    let Some(vm) = req.get("vm").and_then(Value::as_str) else {
        return json!({ "error": "set needs \"vm\"" });
    };
    let Some(q) = router.get(vm) else {
        let known: Vec<String> = router.snapshot().into_iter().map(|(n, _)| n).collect();
        return json!({ "error": format!("no VM {vm:?} (known: {})", known.join(", ")) });
    };
    // Everything is checked before anything changes.
    let quota = match bytes_or_null(req, "mem_quota") {
        Ok(q) => q,
        Err(e) => return e,
    };
    let share = match req.get("share") {
        None => None,
        Some(v) => match v.as_u64().filter(|n| (1..=1000).contains(n)) {
            Some(n) => Some(n as u32),
            None => return json!({ "error": "share must be a number from 1 to 1000" }),
        },
    };
    let max_sessions = match req.get("max_sessions") {
        None => None,
        Some(v) => match v.as_u64().filter(|n| (1..=4096).contains(n)) {
            Some(n) => Some(n as usize),
            None => return json!({ "error": "max_sessions must be a number from 1 to 4096" }),
        },
    };
    let host_mem = match bytes_or_null(req, "host_mem") {
        Ok(h) => h,
        Err(e) => return e,
    };
    if quota.is_none() && share.is_none() && max_sessions.is_none() && host_mem.is_none() {
        return json!({ "error": "set needs a setting (known: mem_quota, share, max_sessions, host_mem)" });
    }
    if host_mem.is_some() && q.cgroup.get().is_none() {
        return json!({ "error": "host_mem needs the daemon to run with --cgroup DIR" });
    }
    if let Some(cap) = host_mem {
        // The kernel may refuse a cap below what the VM uses now (cgroup v1).
        if let Err(e) = q.set_host_mem(cap) {
            return json!({ "error": format!("cannot set the host-memory cap: {e}") });
        }
        info!("VM {vm:?}: host-memory cap set to {cap:?} bytes");
    }
    if let Some(n) = max_sessions {
        q.set_max_sessions(n);
        info!("VM {vm:?}: at most {n} sessions");
    }
    if let Some(quota) = quota {
        if let Err(e) = q.set_mem_quota(quota) {
            return json!({ "error": format!("cannot set the quota: {e}") });
        }
        info!("VM {vm:?}: device-memory quota set to {quota:?} bytes");
    }
    if let Some(share) = share {
        q.set_share(share);
        info!("VM {vm:?}: share set to {share}");
    }
    json!({ "vm": vm_status(vm.to_string(), &q) })
}

/// Answers one request line.
pub fn answer(line: &str, life: &Lifecycle, router: &Router) -> Value {
    let req: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => return json!({ "error": format!("not JSON: {e}") }),
    };
    match req.get("cmd").and_then(Value::as_str) {
        Some("status") => json!(status(life, router)),
        Some("set") => set(&req, router),
        Some(cmd @ ("wait_idle" | "wait_live")) => {
            let ms = req
                .get("timeout_ms")
                .and_then(Value::as_u64)
                .unwrap_or(10_000);
            let count = match cmd {
                "wait_idle" => 0,
                _ => match req.get("count").and_then(Value::as_u64) {
                    Some(n) => n as usize,
                    None => return json!({ "error": "wait_live needs \"count\"" }),
                },
            };
            let started = req.get("started").and_then(Value::as_bool).unwrap_or(true);
            let reached =
                life.wait_sessions(count, started, Duration::from_millis(ms).min(MAX_WAIT));
            json!({ "reached": reached, "status": status(life, router) })
        }
        Some("migrate") if req.get("to").is_some() => json!({
            "error": "migrating to another daemon needs a connection that can carry descriptors"
        }),
        Some("migrate") => migrate(&req, life),
        Some(other) => json!({
            "error": format!("unknown command {other:?} (known: status, set, wait_idle, wait_live, migrate)")
        }),
        None => json!({ "error": "a request is {\"cmd\": ...}" }),
    }
}

/// Longest a migration may take by default.
const MIGRATE_WAIT: Duration = Duration::from_secs(300);

fn migrate(req: &Value, life: &Lifecycle) -> Value {
    let Some(id) = req.get("session").and_then(Value::as_u64) else {
        return json!({ "error": "migrate needs \"session\": a live session's id" });
    };
    let timeout = req
        .get("timeout_ms")
        .and_then(Value::as_u64)
        .map_or(MIGRATE_WAIT, Duration::from_millis)
        .min(MAX_WAIT);
    let Some(door) = life.door(id) else {
        return json!({
            "error": format!("session {id} is not live or cannot migrate (host-local sessions on shared-memory rings can)")
        });
    };
    let device = match req.get("device") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64().and_then(|d| u32::try_from(d).ok()) {
            Some(d) => Some(d),
            None => return json!({ "error": "\"device\" is a device's index on the host" }),
        },
    };
    match door.ask(timeout, device) {
        Ok(moved) => {
            info!(
                "session {id} migrated to API server {} ({} bytes, paused {:.1} ms)",
                moved.to_pid, moved.snapshot_bytes, moved.pause_ms
            );
            json!({ "moved": moved })
        }
        Err(e) => json!({ "error": e }),
    }
}

fn serve_client(
    stream: UnixStream,
    life: &Lifecycle,
    router: &Router,
    endpoints: &HashMap<String, PathBuf>,
) -> std::io::Result<()> {
    let mut w = stream.try_clone()?;
    let mut r = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        let n = (&mut r).take(MAX_REQUEST as u64).read_line(&mut line)?;
        if n == 0 {
            return Ok(());
        }
        let req: Option<Value> = serde_json::from_str(line.trim()).ok();
        let cmd = req.as_ref().and_then(|v| v.get("cmd")?.as_str());
        let answer = match (cmd, &req) {
            _ if !line.ends_with('\n') => {
                json!({ "error": format!("request longer than {MAX_REQUEST} bytes") })
            }
            (Some("checkpoint"), Some(req)) => {
                // Answered in frames (one carries the snapshot), then one line.
                match checkpoint(req, life, &mut r, &mut w)? {
                    Some(v) => v,
                    None => continue,
                }
            }
            (Some("restore"), Some(req)) => restore(req, life, router, endpoints, &mut r, &mut w)?,
            (Some("migrate"), Some(req)) if req.get("to").is_some() => migrate_to(req, life),
            _ => answer(line.trim(), life, router),
        };
        writeln!(w, "{answer}")?;
    }
}

/// The session `req` names and the door to it.
fn door_of(req: &Value, life: &Lifecycle) -> Result<(u64, Arc<crate::migrate::Door>), Value> {
    let id = req
        .get("session")
        .and_then(Value::as_u64)
        .ok_or_else(|| json!({ "error": "a live session's id is needed as \"session\"" }))?;
    let door = life.door(id).ok_or_else(|| {
        json!({
            "error": format!("session {id} is not live or cannot migrate (host-local sessions on shared-memory rings can)")
        })
    })?;
    Ok((id, door))
}

fn suspended(c: &crate::migrate::Captured) -> Value {
    json!({
        "vm": c.vm,
        "slot": c.slot,
        "token": crate::migrate::token_hex(&c.token),
        "snapshot_bytes": c.bytes,
        "from_pid": c.from_pid,
        "capture_ms": c.capture_ms,
    })
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
    req: &Value,
    life: &Lifecycle,
    r: &mut BufReader<UnixStream>,
    w: &mut UnixStream,
) -> std::io::Result<Option<Value>> {
    let (id, door) = match door_of(req, life) {
        Ok(d) => d,
        Err(e) => {
            json_frame(w, &e, &[])?;
            return Ok(None);
        }
    };
    let mut io_error = None;
    let mut placed = false;
    let res = door.suspend(MIGRATE_WAIT, |c| {
        placed = true;
        let stored =
            json_frame(w, &json!({ "suspended": suspended(c) }), &[&c.snapshot]).and_then(|()| {
                let mut ack = String::new();
                r.read_line(&mut ack)?;
                Ok(ack)
            });
        match stored {
            Ok(ack) => {
                let v: Value = serde_json::from_str(ack.trim()).unwrap_or(Value::Null);
                if v["stored"] == true {
                    Ok(String::new())
                } else {
                    Err(format!(
                        "the client did not store the snapshot: {}",
                        v["error"].as_str().unwrap_or("no reason given")
                    ))
                }
            }
            Err(e) => {
                let m = format!("the client went away: {e}");
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
            Ok(Some(json!({ "suspended": suspended(&c) })))
        }
        Err(e) if placed => Ok(Some(json!({ "error": e }))),
        Err(e) => {
            json_frame(w, &json!({ "error": e }), &[])?;
            Ok(None)
        }
    }
}

/// `restore`: a snapshot from the client waits here for its guest.
fn restore(
    req: &Value,
    life: &Lifecycle,
    router: &Router,
    endpoints: &HashMap<String, PathBuf>,
    r: &mut BufReader<UnixStream>,
    w: &mut UnixStream,
) -> std::io::Result<Value> {
    let Some(vm) = req.get("vm").and_then(Value::as_str) else {
        return Ok(json!({ "error": "restore needs \"vm\"" }));
    };
    let Some(token) = req
        .get("token")
        .and_then(Value::as_str)
        .and_then(crate::migrate::token_from_hex)
    else {
        return Ok(json!({ "error": "restore needs \"token\": 32 hex digits" }));
    };
    let slot: Option<crate::migrate::VmSlot> = match req.get("slot") {
        None | Some(Value::Null) => None,
        Some(v) => match serde_json::from_value(v.clone()) {
            Ok(s) => Some(s),
            Err(e) => return Ok(json!({ "error": format!("a malformed \"slot\": {e}") })),
        },
    };
    // A VM session resumes in its slot of the VM's window, kept for it until then
    // (given back if anything below fails).
    let parked_slot = match crate::migrate::reserve_slot(router, vm, slot) {
        Ok(s) => s,
        Err(e) => return Ok(json!({ "error": e })),
    };
    let Some(bytes) = req.get("bytes").and_then(Value::as_u64) else {
        return Ok(json!({ "error": "restore needs \"bytes\": the snapshot's length" }));
    };
    // The snapshot comes as bytes on this connection, so that it can come from
    // another host through a forwarded socket (`ssh -L`), which carries no
    // descriptor.
    writeln!(w, "{}", json!({ "send": "bytes" }))?;
    if let Err(e) = crate::migrate::park_from(life, vm, token, parked_slot, bytes, r) {
        return Ok(json!({ "error": e }));
    }
    let st_size = bytes;
    let endpoint = endpoints
        .get(vm)
        .map_or_else(String::new, |p| p.display().to_string());
    info!("a suspended session of VM {vm:?} waits for its guest");
    Ok(json!({ "parked": { "vm": vm, "endpoint": endpoint, "snapshot_bytes": st_size } }))
}

/// Parks `c` at the daemon whose control socket is `path`; returns where the guest
/// reconnects.
pub fn restore_at(path: &std::path::Path, c: &crate::migrate::Captured) -> Result<String, String> {
    use std::io::{Seek, SeekFrom};
    let mut f = c
        .snapshot
        .try_clone()
        .map(std::fs::File::from)
        .and_then(|mut f| f.seek(SeekFrom::Start(0)).map(|_| f))
        .map_err(|e| e.to_string())?;
    let parked = park_at(path, &c.vm, &c.token, c.slot, c.bytes, &mut f)?;
    Ok(parked["endpoint"].as_str().unwrap_or_default().to_string())
}

/// Hands a suspended session of VM `vm` (its snapshot: the next `bytes` of `from`)
/// to the daemon whose control socket is `path`, as bytes on the connection (which
/// may be forwarded from another host); the daemon's `parked` answer.
pub fn park_at(
    path: &std::path::Path,
    vm: &str,
    token: &hira_protocol::handshake::Token,
    slot: Option<crate::migrate::VmSlot>,
    bytes: u64,
    from: &mut impl Read,
) -> Result<Value, String> {
    let fail = |e: std::io::Error| format!("cannot reach {}: {e}", path.display());
    let mut s = UnixStream::connect(path).map_err(fail)?;
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(fail)?;
    let req = json!({
        "cmd": "restore",
        "vm": vm,
        "token": crate::migrate::token_hex(token),
        "slot": slot,
        "bytes": bytes,
    });
    writeln!(s, "{req}").map_err(fail)?;
    let answer = |s: &mut UnixStream| -> Result<Value, String> {
        let line = read_line_unbuffered(s).map_err(fail)?;
        serde_json::from_str(&line).map_err(|e| e.to_string())
    };
    let v = answer(&mut s)?;
    if v.get("send").is_none() {
        return Err(format!("{} refused: {}", path.display(), v["error"]));
    }
    let sent = std::io::copy(&mut from.take(bytes), &mut s).map_err(fail)?;
    if sent != bytes {
        return Err("the snapshot is shorter than it says".into());
    }
    let v = answer(&mut s)?;
    match v.get("parked") {
        Some(p) => Ok(p.clone()),
        None => Err(format!("{} refused: {}", path.display(), v["error"])),
    }
}

/// One line, read a byte at a time so that nothing after it is taken from the socket.
pub fn read_line_unbuffered(s: &mut UnixStream) -> std::io::Result<String> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    loop {
        if s.read(&mut b)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if b[0] == b'\n' {
            return String::from_utf8(line).map_err(std::io::Error::other);
        }
        line.push(b[0]);
        if line.len() > MAX_REQUEST {
            return Err(std::io::Error::other("answer too long"));
        }
    }
}

/// `migrate` with `to`: suspended here, resumed at the other daemon.
fn migrate_to(req: &Value, life: &Lifecycle) -> Value {
    let (id, door) = match door_of(req, life) {
        Ok(d) => d,
        Err(e) => return e,
    };
    let Some(to) = req.get("to").and_then(Value::as_str) else {
        return json!({ "error": "\"to\" is another daemon's control socket" });
    };
    let to = PathBuf::from(to);
    match door.suspend(MIGRATE_WAIT, |c| restore_at(&to, c)) {
        Ok(c) => {
            info!("session {id} moved to the daemon at {}", to.display());
            json!({ "suspended": suspended(&c), "to": to.display().to_string() })
        }
        Err(e) => json!({ "error": e }),
    }
}

/// Serves the control socket until the daemon exits; each client on its own thread.
/// `endpoints`: each VM's local guest socket, where a restored session's guest
/// reconnects.
pub fn serve(
    listener: UnixListener,
    life: Arc<Lifecycle>,
    router: Arc<Router>,
    endpoints: Arc<HashMap<String, PathBuf>>,
) {
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                warn!("control socket accept failed: {e}");
                continue;
            }
        };
        let (life, router, endpoints) = (life.clone(), router.clone(), endpoints.clone());
        let spawned = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || {
                if let Err(e) = serve_client(stream, &life, &router, &endpoints) {
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
        let (life, router) = (Lifecycle::default(), Router::default());
        assert!(answer("nonsense", &life, &router)["error"].is_string());
        assert!(
            answer("{\"cmd\":\"reboot\"}", &life, &router)["error"]
                .as_str()
                .unwrap()
                .contains("reboot")
        );
    }

    #[test]
    fn status_lists_vms_and_wait_idle_returns_at_once_when_idle() {
        let (life, router) = (Lifecycle::default(), Router::default());
        let (page, _fd) = hira_protocol::usage::UsagePage::create().unwrap();
        page.command(3, 100);
        let _tracked = router.vm("vm1").track(1, std::sync::Arc::new(page));
        let s = answer("{\"cmd\":\"status\"}", &life, &router);
        assert_eq!(s["vms"][0]["name"], "vm1");
        assert_eq!(s["vms"][0]["bytes"], 100);
        let w = answer("{\"cmd\":\"wait_idle\",\"timeout_ms\":1}", &life, &router);
        assert_eq!(w["reached"], true);
    }
}
