//! Hira's control protocol: what `hira-vhost`'s control socket (`--control-socket
//! PATH`) is asked and what it answers, typed once for the daemon, `hira-ctl` and
//! anyone else who drives the daemon.
//!
//! The wire format (docs/control.md has it in full): one JSON object per line each
//! way on a Unix stream socket. A request names its command in `"cmd"`
//! ([`Request`]); every answer is either the command's object or `{"error": TEXT}`
//! ([`Client::ask`] turns the latter into [`ControlError::Refused`]). Two commands
//! carry more than lines: `checkpoint` answers with a frame that holds the snapshot's
//! file descriptor, and `restore` takes the snapshot's bytes after the daemon's
//! `{"send":"bytes"}`, so that it can arrive over a forwarded socket.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hira_protocol::handshake::Token;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};

pub mod session_file;
pub mod settings;

/// Longest request line the daemon reads, and longest answer line a client reads
/// byte by byte (the answers that precede or follow a snapshot).
pub const MAX_LINE: usize = 4096;
/// Longest answer a client reads to [`Client::ask`]: a `status` holds every live
/// session and the last 256 that ended, far more than a request line.
pub const MAX_ANSWER: usize = 64 << 20;

/// A request, one JSON object on a line, its command in `"cmd"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// The daemon's state: [`Status`].
    Status,
    /// Answers ([`Waited`]) once no session is live, or when `timeout_ms` (10 s by
    /// default) passes.
    WaitIdle {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
    },
    /// Answers ([`Waited`]) once exactly `count` sessions are live, and with
    /// `started` (the default) their API servers have started.
    WaitLive {
        count: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        started: Option<bool>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
    },
    /// Changes a VM's settings live: [`SetAnswer`].
    Set(SetVm),
    /// Moves a live session to a new API server ([`MovedAnswer`]), on the host's
    /// device of index `device`; with `to` (another daemon's control socket on this
    /// host, or a GPU host of the daemon's configuration for a session placed here
    /// from another host) suspends it here and parks it there ([`SuspendedAnswer`]).
    Migrate {
        session: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        device: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        to: Option<String>,
    },
    /// Suspends a session into a snapshot the client stores (see [`Client::checkpoint`]).
    Checkpoint { session: u64 },
    /// A suspended session's snapshot, `bytes` long, follows once the daemon answers
    /// `{"send":"bytes"}`; it waits for its guest ([`ParkedAnswer`]).
    Restore {
        vm: String,
        token: TokenHex,
        bytes: u64,
        #[serde(default)]
        slot: Option<VmSlot>,
    },
    /// Starts serving a VM: `spec` has the keys `--vm` takes, `name=` first
    /// ([`VmAddedAnswer`]). Kept across restarts where the daemon has a state
    /// directory.
    VmAdd { spec: String },
    /// Stops serving a VM added at run time: its sessions end, its sockets and window
    /// go ([`VmRemovedAnswer`]); within `timeout_ms` (10 s by default).
    VmRemove {
        vm: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
    },
    /// The VMs the daemon serves ([`VmList`]).
    VmList,
    /// Drains this GPU host ([`DrainAnswer`]): it takes no new remote sessions, and
    /// each live session placed here from another host moves to GPU host `to` (by
    /// default, the configured GPU host that can take the most).
    Drain {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        to: Option<String>,
    },
}

/// What `drain` did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DrainAnswer {
    /// Sessions moved, each with the GPU host it went to.
    pub moved: Vec<(u64, String)>,
    /// Sessions that could not move, and why (they go on here).
    pub failed: Vec<(u64, String)>,
    /// Sessions of this host's own VMs, which stay.
    pub stayed: usize,
}

impl Request {
    /// The command's name on the wire.
    pub fn name(&self) -> &'static str {
        match self {
            Request::Status => "status",
            Request::WaitIdle { .. } => "wait_idle",
            Request::WaitLive { .. } => "wait_live",
            Request::Set(_) => "set",
            Request::Migrate { .. } => "migrate",
            Request::Checkpoint { .. } => "checkpoint",
            Request::Restore { .. } => "restore",
            Request::VmAdd { .. } => "vm_add",
            Request::VmRemove { .. } => "vm_remove",
            Request::VmList => "vm_list",
            Request::Drain { .. } => "drain",
        }
    }
}

/// `set`: the settings given change; absent ones stay. A size of `null` removes the
/// limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetVm {
    pub vm: String,
    /// Device-memory quota in bytes.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub mem_quota: Option<Option<u64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sessions: Option<usize>,
    /// Cap on the VM's API servers' host memory together (the daemon needs
    /// `--cgroup`).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub host_mem: Option<Option<u64>>,
}

/// A field that is present, `null` included (`Some(None)`); absent fields stay `None`
/// through `#[serde(default)]`.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// Why a `set` asks for something no VM may have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetError {
    #[error("set needs a setting (known: mem_quota, share, max_sessions, host_mem)")]
    Nothing,
    #[error("{0} must be a positive number of bytes or null")]
    ZeroBytes(&'static str),
    #[error("share must be a number from 1 to 1000")]
    Share,
    #[error("max_sessions must be a number from 1 to 4096")]
    MaxSessions,
}

impl SetVm {
    /// Checks every setting before anything changes.
    pub fn check(&self) -> Result<(), SetError> {
        if self.mem_quota.is_none()
            && self.share.is_none()
            && self.max_sessions.is_none()
            && self.host_mem.is_none()
        {
            return Err(SetError::Nothing);
        }
        if self.mem_quota == Some(Some(0)) {
            return Err(SetError::ZeroBytes("mem_quota"));
        }
        if self.host_mem == Some(Some(0)) {
            return Err(SetError::ZeroBytes("host_mem"));
        }
        if self.share.is_some_and(|s| !settings::SHARES.contains(&s)) {
            return Err(SetError::Share);
        }
        if self
            .max_sessions
            .is_some_and(|n| !settings::MAX_SESSIONS.contains(&n))
        {
            return Err(SetError::MaxSessions);
        }
        Ok(())
    }
}

/// A session's resume token, as 32 hex digits on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenHex(pub Token);

impl std::fmt::Display for TokenHex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl std::str::FromStr for TokenHex {
    type Err = &'static str;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        const BAD: &str = "a token is 32 hex digits";
        if s.len() != 32 || !s.is_ascii() {
            return Err(BAD);
        }
        let mut t = [0u8; 16];
        for (i, b) in t.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| BAD)?;
        }
        Ok(TokenHex(t))
    }
}

impl Serialize for TokenHex {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TokenHex {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Where a VM session's data window and rings lie in the VM's shared window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmSlot {
    /// The slot's offset and length in the window (as leased).
    pub offset: u64,
    pub len: u64,
    /// The session's data window within it, and its rings.
    pub window_len: u64,
    pub ring_offset: u64,
}

/// A live session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LiveSession {
    pub id: u64,
    pub vm: String,
    /// The API the session speaks, by its description's name (`OpenCL`, `CUDA`).
    pub api: String,
    pub process: String,
    pub guest_pid: u32,
    pub api_server_pid: Option<u32>,
    /// Times the session moved to a new API server.
    pub migrations: u32,
    /// Whether its handshake is done (its API server answered and the guest was
    /// welcomed): from then on its calls are served.
    pub serving: bool,
    /// The GPU host the session runs on, when not this host (its API server is
    /// that host's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_host: Option<String>,
}

/// A session that ended.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EndedSession {
    pub id: u64,
    pub vm: String,
    pub api: String,
    pub process: String,
    pub api_server_pid: Option<u32>,
    /// How the API server ended ("exit status 0", "died of signal 11", ...).
    pub api_server_end: String,
    /// Objects the API server released on the guest's behalf, from its report (none
    /// if it died before reporting).
    pub released: Option<u64>,
    pub release_failures: Option<u64>,
    pub commands: u64,
    pub bytes: u64,
    pub rejected: u64,
    /// The last call forwarded to the API server.
    pub last_call: Option<String>,
    /// How the session's frames travelled: "rings" (shared memory, straight to the
    /// API server) or "relayed" (through the daemon).
    pub data_plane: String,
}

/// One VM's counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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
    pub decision: String,
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
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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

/// A suspended session waiting for its guest.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ParkedStatus {
    pub vm: String,
    pub snapshot_bytes: u64,
}

/// What `status` answers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub sessions: Vec<SessionStatus>,
    pub ended: Vec<EndedSession>,
    pub vms: Vec<VmStatus>,
    pub api_server_crashes: u64,
    /// How each layer of the API servers' sandbox went on this machine, and what an
    /// API server sees from inside it (OpenCL platforms and devices, the CUDA driver
    /// and devices), as the latest probe found them (at start and at each `vm add`).
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
    /// Connections from other hosts refused (no valid certificate, an unknown name,
    /// not Hira's preamble).
    #[serde(default)]
    pub remote_refused: u64,
}

/// What `wait_idle` and `wait_live` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Waited {
    /// Whether the wait ended because the sessions reached the count (not the
    /// timeout).
    pub reached: bool,
    pub status: Status,
}

/// What `set` answers: the VM's new state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SetAnswer {
    pub vm: VmStatus,
}

/// A VM the daemon serves, as `vm_list` and `vm_add` show it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VmEntry {
    pub name: String,
    /// `vhost-user` (QEMU), `hybrid` (cloud-hypervisor, Firecracker) or `local` (a
    /// host-local listener).
    pub transport: String,
    /// The socket the VMM (or local guests) connect to.
    pub socket: String,
    pub cid: Option<u32>,
    /// The VM's shared data window file, if it has one.
    pub window: Option<String>,
    /// Added at run time (`vm_add`), not from the daemon's configuration.
    pub added: bool,
    /// Kept across restarts (added at run time with a state directory).
    pub persistent: bool,
    pub sessions: usize,
    /// The GPU host its sessions run on, when not this host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_host: Option<String>,
}

/// What `vm_list` answers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VmList {
    pub vms: Vec<VmEntry>,
}

/// What `vm_add` answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmAddedAnswer {
    pub added: VmEntry,
}

/// What `vm_remove` answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmRemovedAnswer {
    pub removed: String,
    /// Its sessions that were live and ended.
    pub sessions_ended: usize,
}

/// What one migration did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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

/// What `migrate` answers for a move between API servers of one daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MovedAnswer {
    pub moved: Moved,
}

/// A session suspended to leave this daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Suspended {
    pub vm: String,
    pub slot: Option<VmSlot>,
    pub token: TokenHex,
    pub snapshot_bytes: u64,
    pub from_pid: u32,
    pub capture_ms: f64,
}

/// What `migrate` with `to`, and `checkpoint`, answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuspendedAnswer {
    pub suspended: Suspended,
    /// The daemon it went to (`migrate` with `to`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
}

/// A suspended session now waiting at a daemon for its guest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Parked {
    pub vm: String,
    /// The guest socket where its guest reconnects (empty: the one it used).
    pub endpoint: String,
    pub snapshot_bytes: u64,
}

/// What `restore` answers once the snapshot arrived.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParkedAnswer {
    pub parked: Parked,
}

/// The daemon's go-ahead for a `restore`'s bytes: `{"send":"bytes"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SendBytes {
    pub send: String,
}

/// The client's word after a `checkpoint`'s snapshot: stored, or why not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stored {
    pub stored: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// An answer that refuses: `{"error": TEXT}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Refusal {
    pub error: String,
}

/// What went wrong talking to the control socket.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error(
        "cannot reach hira-vhost's control socket {path} (is the daemon running with --control-socket?)"
    )]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the control socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("the daemon closed the control socket")]
    Closed,
    #[error("the daemon's answer is longer than {0} bytes")]
    TooLong(usize),
    #[error("the daemon's answer does not read as one: {0}")]
    Malformed(#[from] serde_json::Error),
    #[error("the daemon's answer frame: {0}")]
    Frame(#[source] hira_protocol::unix::UnixFrameError),
    /// The daemon answered with an error.
    #[error("{0}")]
    Refused(String),
    #[error("the snapshot is shorter than it says")]
    ShortSnapshot,
    #[error("the snapshot was not stored: {0}")]
    NotStored(String),
}

/// The answer `line` carries: `T`, or the daemon's refusal.
pub fn parse_answer<T: DeserializeOwned>(line: &[u8]) -> Result<T, ControlError> {
    let v: serde_json::Value = serde_json::from_slice(line)?;
    if let Some(e) = v.get("error").and_then(serde_json::Value::as_str) {
        return Err(ControlError::Refused(e.to_string()));
    }
    Ok(serde_json::from_value(v)?)
}

/// One line, read a byte at a time so that nothing after it is taken from the socket.
pub fn read_line_unbuffered(s: &mut impl Read) -> Result<Vec<u8>, ControlError> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    loop {
        if s.read(&mut b)? == 0 {
            return Err(ControlError::Closed);
        }
        if b[0] == b'\n' {
            return Ok(line);
        }
        line.push(b[0]);
        if line.len() > MAX_LINE {
            return Err(ControlError::TooLong(MAX_LINE));
        }
    }
}

/// A connection to a daemon's control socket.
#[derive(Debug)]
pub struct Client {
    path: PathBuf,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Client {
    /// Connects to the control socket at `path`.
    pub fn connect(path: &Path) -> Result<Client, ControlError> {
        let s = UnixStream::connect(path).map_err(|source| ControlError::Connect {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Client {
            path: path.to_path_buf(),
            reader: BufReader::new(s.try_clone()?),
            writer: s,
        })
    }

    /// Sends `req` and reads its answer as `T`.
    pub fn ask<T: DeserializeOwned>(&mut self, req: &Request) -> Result<T, ControlError> {
        let line = serde_json::to_string(req)?;
        writeln!(self.writer, "{line}")?;
        let mut answer = Vec::new();
        let n = (&mut self.reader)
            .take(MAX_ANSWER as u64 + 1)
            .read_until(b'\n', &mut answer)?;
        if n == 0 {
            return Err(ControlError::Closed);
        }
        if answer.last() != Some(&b'\n') {
            return Err(ControlError::TooLong(MAX_ANSWER));
        }
        parse_answer(&answer)
    }

    /// The daemon's state.
    pub fn status(&mut self) -> Result<Status, ControlError> {
        self.ask(&Request::Status)
    }

    /// Suspends `session` into a snapshot that `store` keeps (given the suspension and
    /// the snapshot's memfd). If `store` fails, the daemon is told and the session goes
    /// on there. On a connection of its own: the first answer is a frame.
    pub fn checkpoint<E: std::fmt::Display>(
        &self,
        session: u64,
        store: impl FnOnce(&Suspended, OwnedFd) -> Result<(), E>,
    ) -> Result<Suspended, ControlError> {
        let mut s = UnixStream::connect(&self.path).map_err(|source| ControlError::Connect {
            path: self.path.clone(),
            source,
        })?;
        let req = serde_json::to_string(&Request::Checkpoint { session })?;
        writeln!(s, "{req}")?;
        let (_, payload, fds) =
            hira_protocol::unix::recv_frame_with_fds(&mut s).map_err(ControlError::Frame)?;
        let answer: SuspendedAnswer = parse_answer(&payload)?;
        let stored = match fds.into_iter().next() {
            Some(fd) => store(&answer.suspended, fd).map_err(|e| format!("{e:#}")),
            None => Err("no snapshot came".to_string()),
        };
        let ack = Stored {
            stored: stored.is_ok(),
            error: stored.as_ref().err().cloned(),
        };
        writeln!(s, "{}", serde_json::to_string(&ack)?)?;
        let end: Result<SuspendedAnswer, _> = parse_answer(&read_line_unbuffered(&mut s)?);
        // What the client failed at says more than the daemon's echo of it.
        stored.map_err(ControlError::NotStored)?;
        Ok(end?.suspended)
    }
}

/// Hands a suspended session of VM `vm` (its snapshot: the next `bytes` of `from`) to
/// the daemon whose control socket is `path`, as bytes on the connection (which may be
/// forwarded from another host); where it waits for its guest.
pub fn park_at(
    path: &Path,
    vm: &str,
    token: &Token,
    slot: Option<VmSlot>,
    bytes: u64,
    from: &mut impl Read,
) -> Result<Parked, ControlError> {
    let mut s = UnixStream::connect(path).map_err(|source| ControlError::Connect {
        path: path.to_path_buf(),
        source,
    })?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let req = Request::Restore {
        vm: vm.to_string(),
        token: TokenHex(*token),
        slot,
        bytes,
    };
    writeln!(s, "{}", serde_json::to_string(&req)?)?;
    let _: SendBytes = parse_answer(&read_line_unbuffered(&mut s)?)?;
    let sent = std::io::copy(&mut from.take(bytes), &mut s)?;
    if sent != bytes {
        return Err(ControlError::ShortSnapshot);
    }
    let answer: ParkedAnswer = parse_answer(&read_line_unbuffered(&mut s)?)?;
    Ok(answer.parked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(line: &str) -> Result<Request, serde_json::Error> {
        serde_json::from_str(line)
    }

    #[test]
    fn requests_read_as_the_wire_writes_them() {
        assert_eq!(request(r#"{"cmd":"status"}"#).unwrap(), Request::Status);
        assert_eq!(
            request(r#"{"cmd":"wait_live","count":2,"timeout_ms":60000}"#).unwrap(),
            Request::WaitLive {
                count: 2,
                started: None,
                timeout_ms: Some(60_000)
            }
        );
        let Request::Set(s) =
            request(r#"{"cmd":"set","vm":"a","mem_quota":null,"share":3}"#).unwrap()
        else {
            panic!("not a set");
        };
        assert_eq!(
            (s.mem_quota, s.share, s.host_mem),
            (Some(None), Some(3), None)
        );
        assert_eq!(s.check(), Ok(()));
        // What the daemon writes back, it reads back.
        let r = Request::Restore {
            vm: "vm1".into(),
            token: TokenHex([0xab; 16]),
            bytes: 10,
            slot: None,
        };
        let line = serde_json::to_string(&r).unwrap();
        assert!(line.contains(&"ab".repeat(16)), "{line}");
        assert_eq!(request(&line).unwrap(), r);
    }

    #[test]
    fn malformed_requests_say_what_is_wrong() {
        let e = request(r#"{"cmd":"reboot"}"#).unwrap_err().to_string();
        assert!(e.contains("reboot"), "{e}");
        let e = request(r#"{"cmd":"migrate"}"#).unwrap_err().to_string();
        assert!(e.contains("session"), "{e}");
        let e = request(r#"{"cmd":"set","vm":"a","quota":1}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("quota"), "{e}");
        assert!(request(r#"{"cmd":"restore","vm":"a","token":"xyz","bytes":1}"#).is_err());
        assert!(request("[]").is_err());
        let set = |j: &str| match request(j).unwrap() {
            Request::Set(s) => s.check(),
            _ => unreachable!(),
        };
        assert_eq!(set(r#"{"cmd":"set","vm":"a"}"#), Err(SetError::Nothing));
        assert_eq!(
            set(r#"{"cmd":"set","vm":"a","share":0}"#),
            Err(SetError::Share)
        );
        assert_eq!(
            set(r#"{"cmd":"set","vm":"a","host_mem":0}"#),
            Err(SetError::ZeroBytes("host_mem"))
        );
    }

    #[test]
    fn refusals_become_errors_and_answers_their_types() {
        let e = parse_answer::<Status>(br#"{"error":"no VM \"x\""}"#).unwrap_err();
        assert!(matches!(e, ControlError::Refused(m) if m == "no VM \"x\""));
        let s = Status {
            vms: vec![VmStatus {
                name: "vm1".into(),
                share: 3,
                ..Default::default()
            }],
            ..Default::default()
        };
        let back: Status = parse_answer(serde_json::to_string(&s).unwrap().as_bytes()).unwrap();
        assert_eq!(back, s);
        assert!(parse_answer::<Status>(b"{}").is_err());
    }

    #[test]
    fn a_status_longer_than_a_request_line_is_read_whole() {
        let path = std::env::temp_dir().join(format!("hira-control-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let status = Status {
            ended: vec![
                EndedSession {
                    process: "x".repeat(100),
                    ..Default::default()
                };
                256
            ],
            ..Default::default()
        };
        let line = serde_json::to_string(&status).unwrap();
        assert!(line.len() > 8 * MAX_LINE);
        let t = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut req = String::new();
            r.read_line(&mut req).unwrap();
            writeln!(&s, "{line}").unwrap();
        });
        let mut c = Client::connect(&path).unwrap();
        assert_eq!(c.status().unwrap(), status);
        t.join().unwrap();
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn tokens_are_32_hex_digits() {
        let t: TokenHex = "000102030405060708090a0b0c0d0e0f".parse().unwrap();
        assert_eq!(t.0[15], 15);
        assert_eq!(t.to_string(), "000102030405060708090a0b0c0d0e0f");
        assert!("0001".parse::<TokenHex>().is_err());
        assert!(
            "zz0102030405060708090a0b0c0d0e0f"
                .parse::<TokenHex>()
                .is_err()
        );
    }
}
