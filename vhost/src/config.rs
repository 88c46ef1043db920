//! Daemon configuration.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// Default host-local listener (matches the guest driver's default `HIRA_SOCKET`).
pub const DEFAULT_LOCAL_SOCKET: &str = "/run/hira/local.sock";

/// Errors in a listener or VM spec.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("empty listener path")]
    EmptyPath,
    #[error("VM name {0:?} must be 1-64 characters of letters, digits, '-', '_' or '.'")]
    BadVmName(String),
    #[error("`{0}` is not KEY=VALUE")]
    NotKeyValue(String),
    #[error(
        "unknown VM setting `{0}` (known: name, socket, hybrid, cid, window, window-mb, window-slots, mem-quota, share, max-sessions, host-mem, gpu-host)"
    )]
    UnknownKey(String),
    #[error("VM setting `{0}` given twice")]
    DuplicateKey(String),
    #[error("VM spec lacks `{0}`")]
    Missing(&'static str),
    #[error("CID {0:?} must be a number from 3 to 4294967294 (0-2 are reserved)")]
    BadCid(String),
    #[error("config file: {0}")]
    File(String),
    #[error("line {line}, key `{key}`: {source}")]
    At {
        line: usize,
        key: &'static str,
        #[source]
        source: Box<ConfigError>,
    },
    #[error("window-mb {0:?} must be a number of MiB from 4 to 65536")]
    BadWindowSize(String),
    #[error(
        "window-slots {0:?} must be a number from 1 to 64 that leaves each slot at least 4 MiB of the window"
    )]
    BadWindowSlots(String),
    #[error("a data window (`window=`) needs the vhost-user transport (`socket=`)")]
    WindowNeedsVhostUser,
    #[error(transparent)]
    Setting(#[from] SettingError),
    #[error(
        "unknown listener setting `{0}` (known: mem-quota, share, max-sessions, host-mem, gpu-host)"
    )]
    UnknownListenerKey(String),
    #[error("socket mode {0:?} must be octal permission bits such as 0660")]
    BadMode(String),
    #[error("no user named {0:?}")]
    UnknownUser(String),
    #[error("no group named {0:?}")]
    UnknownGroup(String),
    #[error(
        "give exactly one of `socket=` (QEMU vhost-user) and `hybrid=` (cloud-hypervisor, Firecracker)"
    )]
    Transport,
    #[error("VM {vm:?} is given two {what} ({first} and {second})")]
    Conflict {
        vm: String,
        what: &'static str,
        first: String,
        second: String,
    },
    #[error("HIRA_SERVER_NT_KB: expected a size in KiB (0: glibc's own), got {0:?}")]
    NtKb(String),
    #[error("HIRA_SERVER_NT_KB: {0} KiB is outside 64 KiB to 1 TiB (0: glibc's own)")]
    NtKbRange(u64),
    #[error("{0}")]
    Remote(String),
}

impl ConfigError {
    /// The setting an error is about.
    pub fn key(&self) -> &'static str {
        match self {
            ConfigError::EmptyPath => "path",
            ConfigError::BadVmName(_) => "name",
            ConfigError::Missing(k) => k,
            ConfigError::BadCid(_) => "cid",
            ConfigError::BadWindowSize(_) => "window_mb",
            ConfigError::BadWindowSlots(_) => "window_slots",
            ConfigError::Setting(e) => e.key(),
            ConfigError::WindowNeedsVhostUser => "window",
            ConfigError::Transport => "socket",
            ConfigError::BadMode(_) => "socket_mode",
            ConfigError::UnknownUser(_) => "socket_owner",
            ConfigError::UnknownGroup(_) => "socket_group",
            ConfigError::At { key, .. } => key,
            ConfigError::Conflict { .. } => "",
            ConfigError::NtKb(_) | ConfigError::NtKbRange(_) | ConfigError::Remote(_) => "",
            ConfigError::NotKeyValue(_)
            | ConfigError::UnknownKey(_)
            | ConfigError::UnknownListenerKey(_)
            | ConfigError::DuplicateKey(_)
            | ConfigError::File(_) => "",
        }
    }
}

pub use hira_control::settings::{
    SettingError, VmSettings, parse_max_sessions, parse_share, parse_size,
};

/// Takes a per-VM setting into `s`; a key given twice is the VM spec's duplicate.
fn take_setting(s: &mut VmSettings, k: &str, v: &str) -> Result<bool, ConfigError> {
    s.take(k, v).map_err(|e| match e {
        SettingError::Twice(k) => ConfigError::DuplicateKey(k),
        e => e.into(),
    })
}

/// A host-local listener: a Unix socket whose connections belong to one VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalListener {
    pub vm: String,
    pub path: PathBuf,
    /// The VM's settings this listener gives.
    pub settings: VmSettings,
    /// The GPU host the VM's sessions run on (`None`: this host).
    pub gpu_host: Option<String>,
    /// For a hybrid-vsock VM's listener (`VmSpec::listener`), the VM's CID; `None`
    /// for a host-local listener.
    pub hybrid_cid: Option<u32>,
}

impl Default for LocalListener {
    fn default() -> Self {
        LocalListener {
            vm: "local".into(),
            path: PathBuf::from(DEFAULT_LOCAL_SOCKET),
            settings: VmSettings::default(),
            gpu_host: None,
            hybrid_cid: None,
        }
    }
}

pub(crate) fn valid_vm_name(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

impl FromStr for LocalListener {
    type Err = ConfigError;

    /// Parses `[VM=]PATH[,mem-quota=SIZE][,share=N][,max-sessions=N][,host-mem=SIZE]
    /// [,gpu-host=NAME]`.
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let mut parts = s.split(',');
        let s = parts.next().unwrap_or_default();
        let mut settings = VmSettings::default();
        let mut gpu_host = None;
        for kv in parts {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| ConfigError::NotKeyValue(kv.to_string()))?;
            if k == "gpu-host" {
                if gpu_host.replace(v.to_string()).is_some() {
                    return Err(ConfigError::DuplicateKey(k.to_string()));
                }
                continue;
            }
            if !take_setting(&mut settings, k, v)? {
                return Err(ConfigError::UnknownListenerKey(k.to_string()));
            }
        }
        let (vm, path) = match s.split_once('=') {
            Some((vm, path)) => (vm.to_string(), path),
            None => ("local".to_string(), s),
        };
        if !valid_vm_name(&vm) {
            return Err(ConfigError::BadVmName(vm));
        }
        if path.is_empty() {
            return Err(ConfigError::EmptyPath);
        }
        Ok(LocalListener {
            vm,
            path: PathBuf::from(path),
            settings,
            gpu_host,
            hybrid_cid: None,
        })
    }
}

/// How a VM's vsock device reaches the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmTransport {
    /// Hira serves the vhost-user vsock device on this socket (QEMU's
    /// `vhost-user-vsock-pci`).
    VhostUser(PathBuf),
    /// The hypervisor's own hybrid vsock (cloud-hypervisor, Firecracker, started with
    /// `--vsock cid=N,socket=PATH`): guest connections to the Hira port arrive as Unix
    /// connections on `PATH_<port>`.
    Hybrid(PathBuf),
}

/// A VM the daemon serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmSpec {
    pub name: String,
    pub cid: u32,
    pub transport: VmTransport,
    /// The VM's shared data window (ivshmem) file and size, for vhost-user VMs.
    pub window: Option<(PathBuf, u64)>,
    /// How many sessions of the VM can hold a slot of the window at once (default 4);
    /// each slot holds a session's rings and its bulk-data window.
    pub window_slots: u64,
    /// Its quota, share and caps (none set: unlimited, share 1, the daemon-wide
    /// `max_sessions_per_vm`).
    pub settings: VmSettings,
    /// The GPU host its sessions run on (`None`: this host).
    pub gpu_host: Option<String>,
}

impl VmSpec {
    /// For a hybrid-vsock VM, the Unix socket the hypervisor forwards guests to.
    pub fn listener(&self) -> Option<LocalListener> {
        let VmTransport::Hybrid(path) = &self.transport else {
            return None;
        };
        let mut p = path.clone().into_os_string();
        p.push(format!("_{}", crate::vsock::HIRA_PORT));
        Some(LocalListener {
            vm: self.name.clone(),
            path: PathBuf::from(p),
            settings: self.settings,
            gpu_host: self.gpu_host.clone(),
            hybrid_cid: Some(self.cid),
        })
    }
}

/// The settings of one VM before validation, from `--vm` or a config file.
#[derive(Debug, Default)]
struct VmFields {
    name: Option<String>,
    socket: Option<String>,
    hybrid: Option<String>,
    cid: Option<String>,
    window: Option<String>,
    window_mb: Option<String>,
    window_slots: Option<String>,
    gpu_host: Option<String>,
    settings: VmSettings,
}

impl FromStr for VmSpec {
    type Err = ConfigError;

    /// Parses `name=NAME,socket=PATH,cid=N` or `name=NAME,hybrid=PATH,cid=N`.
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let mut f = VmFields::default();
        for kv in s.split(',') {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| ConfigError::NotKeyValue(kv.to_string()))?;
            let slot = match k {
                "name" => &mut f.name,
                "hybrid" => &mut f.hybrid,
                "socket" => &mut f.socket,
                "cid" => &mut f.cid,
                "window" => &mut f.window,
                "window-mb" => &mut f.window_mb,
                "window-slots" => &mut f.window_slots,
                "gpu-host" => &mut f.gpu_host,
                k if take_setting(&mut f.settings, k, v)? => continue,
                other => return Err(ConfigError::UnknownKey(other.to_string())),
            };
            if slot.replace(v.to_string()).is_some() {
                return Err(ConfigError::DuplicateKey(k.to_string()));
            }
        }
        f.into_spec()
    }
}

impl VmFields {
    /// Validates the settings into a VM.
    fn into_spec(self) -> Result<VmSpec, ConfigError> {
        let VmFields {
            name,
            socket,
            hybrid,
            cid,
            window,
            window_mb,
            window_slots,
            gpu_host,
            settings,
        } = self;
        let name = name.ok_or(ConfigError::Missing("name"))?;
        if !valid_vm_name(&name) {
            return Err(ConfigError::BadVmName(name));
        }
        let transport = match (socket, hybrid) {
            (Some(p), None) if !p.is_empty() => VmTransport::VhostUser(PathBuf::from(p)),
            (None, Some(p)) if !p.is_empty() => VmTransport::Hybrid(PathBuf::from(p)),
            (Some(_), None) | (None, Some(_)) => return Err(ConfigError::EmptyPath),
            _ => return Err(ConfigError::Transport),
        };
        let cid_text = cid.ok_or(ConfigError::Missing("cid"))?;
        let cid = cid_text
            .parse::<u32>()
            .ok()
            .filter(|c| (3..u32::MAX).contains(c))
            .ok_or(ConfigError::BadCid(cid_text))?;
        let window = match (window, window_mb) {
            (None, None) => None,
            (None, Some(_)) => return Err(ConfigError::Missing("window")),
            (Some(p), mb) => {
                if p.is_empty() {
                    return Err(ConfigError::EmptyPath);
                }
                if matches!(transport, VmTransport::Hybrid(_)) {
                    return Err(ConfigError::WindowNeedsVhostUser);
                }
                let mb_text = mb.unwrap_or_else(|| "64".into());
                let mb = mb_text
                    .parse::<u64>()
                    .ok()
                    .filter(|m| (4..=65536).contains(m))
                    .ok_or(ConfigError::BadWindowSize(mb_text))?;
                Some((PathBuf::from(p), mb << 20))
            }
        };
        let window_slots = match (&window, window_slots) {
            (_, None) => crate::window::DEFAULT_SLOTS,
            (None, Some(_)) => return Err(ConfigError::Missing("window")),
            (Some((_, size)), Some(text)) => text
                .parse::<u64>()
                .ok()
                .filter(|n| (1..=64).contains(n) && size / n >= 4 << 20)
                .ok_or(ConfigError::BadWindowSlots(text))?,
        };
        Ok(VmSpec {
            name,
            cid,
            transport,
            window,
            window_slots,
            settings,
            gpu_host,
        })
    }
}

/// The daemon's settings as a TOML file (`hira-vhost --config FILE`):
///
/// ```toml
/// api_server = "/usr/libexec/hira-api-server"   # optional
/// platform = "Portable"                          # optional
/// max_window_mb = 1024                           # optional
/// control_socket = "/run/hira/control.sock"     # optional
/// api_server_user = "nobody"                     # default when run as root
/// api_server_cache_dir = "/var/cache/hira"       # the drivers' kernel cache
/// socket_mode = "0660"                           # optional, also socket_owner/_group
/// handshake_timeout_ms = 10000                   # optional limits
/// max_connections_per_listener = 256
/// max_sessions_per_vm = 64
/// teardown_grace_ms = 5000
/// policy = "wfq"                                 # or fixed-rate, aimd, fifo
/// metrics_address = "127.0.0.1:9464"             # optional Prometheus endpoint
/// cgroup = "/sys/fs/cgroup/hira"                 # optional: per-VM host-memory caps
/// state_dir = "/var/lib/hira/sessions"           # optional: sessions kept across restarts
/// output_rate = "1M"                             # a session's host output, bytes a second
/// output_buffer = "1M"                           # and held for its guest at once
///
/// [[local]]
/// vm = "local"
/// path = "/run/hira/local.sock"
///
/// [[vm]]
/// name = "vm1"
/// socket = "/run/hira/vm1.vhost"   # or hybrid = "/run/hira/vm1.vsock"
/// cid = 3
/// window = "/dev/shm/hira-vm1"     # optional
/// window_mb = 256                   # optional
/// window_slots = 4                  # optional: sessions holding a slot at once
/// mem_quota = "2G"                  # optional: the VM's device memory (also [[local]])
/// share = 3                         # optional: the VM's share of device time (also [[local]])
/// max_sessions = 16                 # optional: the VM's cap on sessions (also [[local]])
/// host_mem = "8G"                   # optional: its API servers' host memory (needs cgroup)
/// gpu_host = "gpu-b"                # optional: its sessions run on that GPU host (also [[local]])
///
/// [tls]                             # mutual TLS with other hosts (docs/remote.md)
/// name = "host-a"                   # the name this host's certificate holds
/// cert = "/etc/hira/tls/host-a.crt"
/// key = "/etc/hira/tls/host-a.key"
/// ca = "/etc/hira/tls/ca.crt"       # signs every peer's certificate
/// listen = "10.0.0.2:5580"          # optional: serve remote sessions (a GPU host)
/// timeout_ms = 10000                # optional: a silent peer is gone after this long
///
/// [[peer]]                          # a VM host allowed to place sessions here
/// name = "host-a"                   # the name its certificate must hold
/// share = 2                         # optional: each of its VMs' share, quota and cap
///
/// [[gpu_host]]                      # a GPU host this host places sessions on
/// name = "gpu-b"                    # the name its certificate must hold
/// address = "10.0.0.3:5580"
/// ```
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub api_server: Option<PathBuf>,
    pub platform: Option<String>,
    pub max_window_mb: Option<u64>,
    pub control_socket: Option<PathBuf>,
    pub api_server_user: Option<String>,
    pub api_server_cache_dir: Option<PathBuf>,
    pub socket_mode: Option<String>,
    pub socket_owner: Option<String>,
    pub socket_group: Option<String>,
    pub handshake_timeout_ms: Option<u64>,
    pub max_connections_per_listener: Option<usize>,
    pub max_sessions_per_vm: Option<usize>,
    pub teardown_grace_ms: Option<u64>,
    pub policy: Option<String>,
    pub metrics_address: Option<String>,
    pub cgroup: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
    pub output_rate: Option<String>,
    pub output_buffer: Option<String>,
    #[serde(default)]
    local: Vec<toml::Spanned<LocalEntry>>,
    #[serde(default)]
    vm: Vec<toml::Spanned<VmEntry>>,
    tls: Option<TlsEntry>,
    #[serde(default)]
    peer: Vec<PeerEntry>,
    #[serde(default)]
    gpu_host: Vec<GpuHostEntry>,
    /// Byte offsets where each line of the file starts, for error messages.
    #[serde(skip)]
    line_starts: Vec<usize>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LocalEntry {
    vm: Option<String>,
    path: String,
    mem_quota: Option<String>,
    share: Option<u32>,
    max_sessions: Option<usize>,
    host_mem: Option<String>,
    gpu_host: Option<String>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsEntry {
    name: String,
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
    listen: Option<String>,
    timeout_ms: Option<u64>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PeerEntry {
    name: String,
    mem_quota: Option<String>,
    share: Option<u32>,
    max_sessions: Option<usize>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct GpuHostEntry {
    name: String,
    address: String,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct VmEntry {
    name: String,
    socket: Option<String>,
    hybrid: Option<String>,
    cid: u64,
    window: Option<String>,
    window_mb: Option<u64>,
    window_slots: Option<u64>,
    mem_quota: Option<String>,
    share: Option<u32>,
    max_sessions: Option<usize>,
    host_mem: Option<String>,
    gpu_host: Option<String>,
}

/// This host's certificate, key and CA for mutual TLS with other hosts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The name this host's certificate holds, which its peers pin.
    pub name: String,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// A VM host allowed to place sessions on this (GPU) host, and the settings each of
/// its VMs gets here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub name: String,
    pub settings: VmSettings,
}

/// A GPU host this host places sessions on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuHost {
    pub name: String,
    pub address: String,
}

/// Sessions across hosts: this host's TLS identity, whether it serves remote
/// sessions (and to whom), and where its own VMs' sessions run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    pub tls: Option<TlsFiles>,
    /// Where this host accepts VM hosts' sessions.
    pub listen: Option<String>,
    pub peers: Vec<Peer>,
    pub gpu_hosts: Vec<GpuHost>,
    /// How long a connection to another host may go unanswered (data unacknowledged,
    /// keepalive probes unanswered) before its sessions end as lost.
    pub timeout: Duration,
    /// The configuration's VMs placed on GPU hosts, VM name to GPU host name (VMs added
    /// at run time keep theirs in their state, `Vm::gpu_host`).
    pub placements: std::collections::BTreeMap<String, String>,
}

/// The default of [`Remote::timeout`].
pub const DEFAULT_REMOTE_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for Remote {
    fn default() -> Self {
        Remote {
            tls: None,
            listen: None,
            peers: Vec::new(),
            gpu_hosts: Vec::new(),
            timeout: DEFAULT_REMOTE_TIMEOUT,
            placements: std::collections::BTreeMap::new(),
        }
    }
}

impl Remote {
    /// Places VM `vm`'s sessions on GPU host `gpu`, which must be a `[[gpu_host]]`
    /// (or `auto`: by what each can take, this host last).
    pub fn place(&mut self, vm: &str, gpu: &str) -> Result<(), ConfigError> {
        self.check_placement(gpu)?;
        match self.placements.insert(vm.to_string(), gpu.to_string()) {
            Some(other) if other != gpu => Err(ConfigError::Remote(format!(
                "VM {vm:?} is placed on two GPU hosts ({other} and {gpu})"
            ))),
            _ => Ok(()),
        }
    }

    /// Refuses a placement that names no `[[gpu_host]]` (`auto` needs one at least).
    pub fn check_placement(&self, gpu: &str) -> Result<(), ConfigError> {
        if gpu == crate::remote::AUTO {
            if self.gpu_hosts.is_empty() {
                return Err(ConfigError::Remote(
                    "gpu-host=auto needs at least one [[gpu_host]]".into(),
                ));
            }
            return Ok(());
        }
        self.known(gpu).map(|_| ())
    }

    /// Refuses a GPU host that is not a `[[gpu_host]]`.
    pub fn known(&self, gpu: &str) -> Result<&GpuHost, ConfigError> {
        self.gpu_hosts
            .iter()
            .find(|g| g.name == gpu)
            .ok_or_else(|| {
                ConfigError::Remote(format!(
                    "gpu-host {gpu:?} is not one of the configuration's [[gpu_host]]s ({})",
                    self.gpu_hosts
                        .iter()
                        .map(|g| g.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
    }

    /// The name a remote tenant has on this GPU host: its VM host's name and its VM's.
    pub fn tenant(peer: &str, vm: &str) -> String {
        format!("{peer}:{vm}")
    }
}

impl FileConfig {
    /// Parses a config file's text.
    pub fn parse(text: &str) -> Result<FileConfig, ConfigError> {
        let mut f: FileConfig =
            toml::from_str(text).map_err(|e| ConfigError::File(e.to_string()))?;
        f.line_starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        Ok(f)
    }

    /// The 1-based line of byte offset `at`.
    fn line_of(&self, at: usize) -> usize {
        self.line_starts.partition_point(|&s| s <= at).max(1)
    }

    fn at<T>(
        &self,
        span: std::ops::Range<usize>,
        r: Result<T, ConfigError>,
    ) -> Result<T, ConfigError> {
        r.map_err(|e| ConfigError::At {
            line: self.line_of(span.start),
            key: e.key(),
            source: Box::new(e),
        })
    }

    /// The file's local listeners, validated.
    pub fn listeners(&self) -> Result<Vec<LocalListener>, ConfigError> {
        self.local
            .iter()
            .map(|entry| {
                let l = entry.get_ref();
                let r = match &l.vm {
                    Some(vm) => format!("{vm}={}", l.path).parse::<LocalListener>(),
                    None => l.path.parse::<LocalListener>(),
                };
                let r = r.and_then(|mut listener| {
                    listener.settings =
                        settings_of(&l.mem_quota, l.share, l.max_sessions, &l.host_mem)?;
                    listener.gpu_host = l.gpu_host.clone();
                    Ok(listener)
                });
                self.at(entry.span(), r)
            })
            .collect()
    }

    /// The file's VMs, validated exactly as `--vm` is.
    pub fn vms(&self) -> Result<Vec<VmSpec>, ConfigError> {
        self.vm
            .iter()
            .map(|entry| {
                let v = entry.get_ref();
                let r = settings_of(&v.mem_quota, v.share, v.max_sessions, &v.host_mem).and_then(
                    |settings| {
                        VmFields {
                            name: Some(v.name.clone()),
                            socket: v.socket.clone(),
                            hybrid: v.hybrid.clone(),
                            cid: Some(v.cid.to_string()),
                            window: v.window.clone(),
                            window_mb: v.window_mb.map(|m| m.to_string()),
                            window_slots: v.window_slots.map(|n| n.to_string()),
                            gpu_host: v.gpu_host.clone(),
                            settings,
                        }
                        .into_spec()
                    },
                );
                self.at(entry.span(), r)
            })
            .collect()
    }
}

impl FileConfig {
    /// The file's settings for sessions across hosts, validated: every name is a
    /// host name, each given once; a VM is placed only on a GPU host the file names;
    /// listening or placing needs `[tls]`.
    pub fn remote(&self) -> Result<Remote, ConfigError> {
        let bad = |m: String| Err(ConfigError::Remote(m));
        let host_name = |what: &str, n: &str| {
            if valid_vm_name(n) && crate::remote::tls::server_name(n).is_ok() {
                Ok(())
            } else {
                Err(ConfigError::Remote(format!(
                    "{what} name {n:?} must be a host name of letters, digits, '-' and '.'"
                )))
            }
        };
        let tls = match &self.tls {
            Some(t) => {
                host_name("[tls]", &t.name)?;
                Some(TlsFiles {
                    name: t.name.clone(),
                    cert: t.cert.clone(),
                    key: t.key.clone(),
                    ca: t.ca.clone(),
                })
            }
            None => None,
        };
        let mut peers: Vec<Peer> = Vec::new();
        for p in &self.peer {
            host_name("[[peer]]", &p.name)?;
            if peers.iter().any(|q| q.name == p.name) {
                return bad(format!("[[peer]] {:?} is given twice", p.name));
            }
            peers.push(Peer {
                name: p.name.clone(),
                settings: settings_of(&p.mem_quota, p.share, p.max_sessions, &None)?,
            });
        }
        let mut gpu_hosts: Vec<GpuHost> = Vec::new();
        for g in &self.gpu_host {
            host_name("[[gpu_host]]", &g.name)?;
            if gpu_hosts.iter().any(|h| h.name == g.name) {
                return bad(format!("[[gpu_host]] {:?} is given twice", g.name));
            }
            if g.address.parse::<std::net::SocketAddr>().is_err() {
                return bad(format!(
                    "[[gpu_host]] {:?}: address {:?} must be IP:PORT",
                    g.name, g.address
                ));
            }
            gpu_hosts.push(GpuHost {
                name: g.name.clone(),
                address: g.address.clone(),
            });
        }
        let listen = self.tls.as_ref().and_then(|t| t.listen.clone());
        if let Some(l) = &listen {
            if l.parse::<std::net::SocketAddr>().is_err() {
                return bad(format!("[tls] listen {l:?} must be IP:PORT"));
            }
            if peers.is_empty() {
                return bad("[tls] listen needs at least one [[peer]] to serve".into());
            }
        }
        if tls.is_none() && !gpu_hosts.is_empty() {
            return bad(
                "[[gpu_host]] needs [tls]: sessions cross hosts only over mutual TLS".into(),
            );
        }
        if listen.is_none() && !peers.is_empty() {
            return bad("[[peer]] needs [tls] listen: the address peers reach this host on".into());
        }
        let timeout = match self.tls.as_ref().and_then(|t| t.timeout_ms) {
            None => DEFAULT_REMOTE_TIMEOUT,
            Some(ms) if (1000..=3_600_000).contains(&ms) => Duration::from_millis(ms),
            Some(ms) => {
                return bad(format!(
                    "[tls] timeout_ms {ms} must be from 1000 (a second) to 3600000 (an hour)"
                ));
            }
        };
        Ok(Remote {
            tls,
            listen,
            peers,
            gpu_hosts,
            timeout,
            placements: std::collections::BTreeMap::new(),
        })
    }
}

/// A config file entry's per-VM settings, read as `--vm` reads them.
fn settings_of(
    mem_quota: &Option<String>,
    share: Option<u32>,
    max_sessions: Option<usize>,
    host_mem: &Option<String>,
) -> Result<VmSettings, ConfigError> {
    Ok(VmSettings::from_pairs([
        ("mem-quota", mem_quota.clone()),
        ("share", share.map(|n| n.to_string())),
        ("max-sessions", max_sessions.map(|n| n.to_string())),
        ("host-mem", host_mem.clone()),
    ])?)
}

/// Limits that keep one guest from exhausting the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// How long a new connection may take to send its `Hello`.
    pub handshake_timeout: Duration,
    /// Most connections one listener holds at once (handshaking or in session).
    pub max_connections_per_listener: usize,
    /// Most sessions (API servers) one VM has at once.
    pub max_sessions_per_vm: usize,
    /// How long an API server gets to release its objects after its guest left,
    /// before it is killed.
    pub teardown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            handshake_timeout: Duration::from_secs(10),
            max_connections_per_listener: 256,
            max_sessions_per_vm: 64,
            teardown_grace: Duration::from_secs(5),
        }
    }
}

/// Who may connect to the sockets the daemon creates (guest listeners, vhost-user
/// sockets) and open the window files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketAccess {
    /// Permission bits (default 0660: owner and group).
    pub mode: u32,
    /// Owner to give the files, if not the daemon's user.
    pub uid: Option<u32>,
    /// Group to give the files, if not the daemon's group.
    pub gid: Option<u32>,
}

impl Default for SocketAccess {
    fn default() -> Self {
        SocketAccess {
            mode: 0o660,
            uid: None,
            gid: None,
        }
    }
}

/// Parses an octal permission mode such as `0660`; only permission bits are allowed.
pub fn parse_mode(text: &str) -> Result<u32, ConfigError> {
    u32::from_str_radix(text.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| ConfigError::BadMode(text.to_string()))
}

/// Resolves a user name or number.
pub fn parse_user(text: &str) -> Result<u32, ConfigError> {
    if let Ok(uid) = text.parse::<u32>() {
        return Ok(uid);
    }
    match nix::unistd::User::from_name(text) {
        Ok(Some(u)) => Ok(u.uid.as_raw()),
        _ => Err(ConfigError::UnknownUser(text.to_string())),
    }
}

/// Resolves a group name or number.
pub fn parse_group(text: &str) -> Result<u32, ConfigError> {
    if let Ok(gid) = text.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(text) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        _ => Err(ConfigError::UnknownGroup(text.to_string())),
    }
}

/// The daemon's validated configuration.
#[derive(Debug, Clone, Default)]
pub struct Config {
    pub listeners: Vec<LocalListener>,
    /// VMs whose vsock device Hira serves over vhost-user.
    pub vhost_user_vms: Vec<VmSpec>,
    /// The API-server executable.
    pub api_server: PathBuf,
    /// Host platform name filter passed to API servers.
    pub platform: Option<String>,
    /// Largest data window accepted from a guest, in bytes.
    pub max_window: u64,
    pub limits: Limits,
    pub access: SocketAccess,
    /// The control socket, if any.
    pub control: Option<PathBuf>,
    pub sandbox: Sandbox,
    /// How device time is shared among VMs.
    pub policy: hira_policy::Kind,
    /// Where the Prometheus endpoint listens (`HOST:PORT`), if anywhere.
    pub metrics: Option<String>,
    /// The cgroup directory delegated to the daemon for per-VM host-memory caps.
    pub cgroup: Option<PathBuf>,
    /// Where the daemon suspends its sessions when it stops, and resumes them from
    /// when it starts (a restart or an upgrade that applications ride through).
    pub state_dir: Option<PathBuf>,
    /// `GLIBC_TUNABLES` for API servers (`None`: they inherit the daemon's).
    pub api_server_tunables: Option<String>,
    /// How much of the host library's output each session may send its guest.
    pub output: OutputBound,
    /// Sessions across hosts (`[tls]`, `[[peer]]`, `[[gpu_host]]`).
    pub remote: Remote,
    /// The TLS settings loaded from `remote.tls`.
    pub tls: Option<std::sync::Arc<crate::remote::tls::Tls>>,
}

/// How much of the host library's output (a kernel's `printf`) one session may send
/// its guest: its API server drops and counts the excess.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputBound {
    /// Bytes per second, sustained.
    pub rate: u64,
    /// Bytes held for the guest at once, and the burst above the rate.
    pub buffer: u64,
}

impl Default for OutputBound {
    fn default() -> Self {
        OutputBound {
            rate: hira_protocol::DEFAULT_OUTPUT_RATE,
            buffer: hira_protocol::DEFAULT_OUTPUT_BUFFER,
        }
    }
}

/// glibc's tunable for the size from which `memcpy` stores around the caches.
const NT_TUNABLE: &str = "glibc.cpu.x86_non_temporal_threshold";

/// `GLIBC_TUNABLES` for API servers from the daemon's own (`inherited`) and
/// `HIRA_SERVER_NT_KB` (`nt_kb`): glibc's non-temporal threshold set to that many KiB,
/// default the chunk of large streamed writes ([`hira_protocol::STREAM_NT_CHUNK`]),
/// so that the host copies those chunks as it would copy the whole transfer; `0`
/// leaves glibc's own. A threshold the operator set in `GLIBC_TUNABLES` stands.
pub fn api_server_tunables(
    inherited: Option<&str>,
    nt_kb: Option<&str>,
) -> Result<Option<String>, ConfigError> {
    let kb = match nt_kb {
        None => (hira_protocol::STREAM_NT_CHUNK / 1024) as u64,
        Some(v) => v
            .trim()
            .parse::<u64>()
            .map_err(|_| ConfigError::NtKb(v.to_string()))?,
    };
    if kb != 0 && !(64..=1 << 30).contains(&kb) {
        return Err(ConfigError::NtKbRange(kb));
    }
    let operator_set = inherited.is_some_and(|t| {
        t.split(':')
            .any(|kv| kv.split_once('=').is_some_and(|(k, _)| k == NT_TUNABLE))
    });
    if kb == 0 || operator_set || !cfg!(target_arch = "x86_64") {
        return Ok(None);
    }
    let ours = format!("{NT_TUNABLE}={:#x}", kb * 1024);
    Ok(Some(match inherited {
        Some(t) if !t.is_empty() => format!("{t}:{ours}"),
        _ => ours,
    }))
}

impl Config {
    /// One per-VM setting as every listener (`listener`) and VM spec (`vm`) gives it;
    /// a VM given two different values is an error.
    fn per_vm<T: Copy + PartialEq + std::fmt::Debug>(
        &self,
        get: impl Fn(&VmSettings) -> Option<T>,
        what: &'static str,
    ) -> Result<Vec<(String, T)>, ConfigError> {
        let set = self
            .listeners
            .iter()
            .map(|l| (&l.vm, get(&l.settings)))
            .chain(
                self.vhost_user_vms
                    .iter()
                    .map(|v| (&v.name, get(&v.settings))),
            );
        let mut out: Vec<(String, T)> = Vec::new();
        for (name, value) in set {
            let Some(x) = value else { continue };
            match out.iter().find(|(v, _)| v == name) {
                Some((_, other)) if *other != x => {
                    return Err(ConfigError::Conflict {
                        vm: name.clone(),
                        what,
                        first: format!("{other:?}"),
                        second: format!("{x:?}"),
                    });
                }
                Some(_) => {}
                None => out.push((name.clone(), x)),
            }
        }
        Ok(out)
    }

    /// Each VM's memory quota as its listeners and VM specs set it.
    pub fn mem_quotas(&self) -> Result<Vec<(String, u64)>, ConfigError> {
        self.per_vm(|s| s.mem_quota, "memory quotas")
    }

    /// Each VM's cap on sessions as its listeners and VM specs set it.
    pub fn max_sessions(&self) -> Result<Vec<(String, usize)>, ConfigError> {
        self.per_vm(|s| s.max_sessions, "session caps")
    }

    /// Each VM's cap on host memory as its listeners and VM specs set it.
    pub fn host_mems(&self) -> Result<Vec<(String, u64)>, ConfigError> {
        self.per_vm(|s| s.host_mem, "host-memory caps")
    }

    /// Each VM's share of device time as its listeners and VM specs set it.
    pub fn shares(&self) -> Result<Vec<(String, u32)>, ConfigError> {
        self.per_vm(|s| s.share, "shares")
    }
}

/// How API servers are confined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    /// User and group API servers run as (`None`: the daemon's own, when it is not
    /// root).
    pub user: Option<(u32, u32)>,
    /// The drivers' kernel cache, owned by that user.
    pub cache_dir: PathBuf,
}

impl Default for Sandbox {
    fn default() -> Self {
        Sandbox {
            user: None,
            cache_dir: PathBuf::from(DEFAULT_CACHE_DIR),
        }
    }
}

/// Default kernel cache of the API servers.
pub const DEFAULT_CACHE_DIR: &str = "/var/cache/hira";

/// Resolves the API servers' user: a name or `UID[:GID]`.
pub fn parse_sandbox_user(text: &str) -> Result<(u32, u32), ConfigError> {
    if let Some((u, g)) = text.split_once(':') {
        return Ok((parse_user(u)?, parse_group(g)?));
    }
    if let Ok(uid) = text.parse::<u32>() {
        return Ok((uid, uid));
    }
    match nix::unistd::User::from_name(text) {
        Ok(Some(u)) => Ok((u.uid.as_raw(), u.gid.as_raw())),
        _ => Err(ConfigError::UnknownUser(text.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn api_servers_copy_large_chunks_around_the_caches_unless_the_operator_says() {
        let t = |inherited, kb| api_server_tunables(inherited, kb);
        assert_eq!(
            t(None, None).unwrap().as_deref(),
            Some("glibc.cpu.x86_non_temporal_threshold=0x800000")
        );
        assert_eq!(
            t(Some("glibc.malloc.arena_max=2"), Some("16384"))
                .unwrap()
                .as_deref(),
            Some("glibc.malloc.arena_max=2:glibc.cpu.x86_non_temporal_threshold=0x1000000")
        );
        // The operator's own threshold, or 0, leaves API servers with the daemon's.
        assert_eq!(
            t(Some("glibc.cpu.x86_non_temporal_threshold=0x100000"), None).unwrap(),
            None
        );
        assert_eq!(t(None, Some("0")).unwrap(), None);
        for bad in ["8M", "-1", "1", ""] {
            let e = t(None, Some(bad)).unwrap_err().to_string();
            assert!(e.starts_with("HIRA_SERVER_NT_KB: "), "{bad:?}: {e}");
        }
    }

    #[test]
    fn bare_path_belongs_to_local_vm() {
        let l: LocalListener = "/tmp/a.sock".parse().unwrap();
        assert_eq!(l.vm, "local");
        assert_eq!(l.path, PathBuf::from("/tmp/a.sock"));
    }

    #[test]
    fn named_vm_is_parsed() {
        let l: LocalListener = "vm1=/tmp/b.sock".parse().unwrap();
        assert_eq!(l.vm, "vm1");
    }

    #[test]
    fn vm_name_with_slash_is_rejected() {
        assert_eq!(
            "a/b=/tmp/x".parse::<LocalListener>(),
            Err(ConfigError::BadVmName("a/b".into()))
        );
    }

    #[test]
    fn hybrid_vm_listens_on_the_port_suffixed_socket() {
        let v: VmSpec = "name=vm2,hybrid=/run/ch/vm2.vsock,cid=4".parse().unwrap();
        assert_eq!(v.cid, 4);
        let l = v.listener().unwrap();
        assert_eq!(l.path, PathBuf::from("/run/ch/vm2.vsock_5571"));
        assert_eq!(l.vm, "vm2");
    }

    #[test]
    fn reserved_cid_is_rejected() {
        assert_eq!(
            "name=a,hybrid=/x,cid=2".parse::<VmSpec>(),
            Err(ConfigError::BadCid("2".into()))
        );
    }

    #[test]
    fn unknown_vm_setting_is_named() {
        assert_eq!(
            "name=a,hybrid=/x,cid=3,shares=2".parse::<VmSpec>(),
            Err(ConfigError::UnknownKey("shares".into()))
        );
    }

    #[test]
    fn repeated_vm_setting_is_rejected() {
        assert_eq!(
            "name=a,name=b,hybrid=/x,cid=3".parse::<VmSpec>(),
            Err(ConfigError::DuplicateKey("name".into()))
        );
    }

    #[test]
    fn vhost_user_vm_has_no_unix_listener() {
        let v: VmSpec = "name=q,socket=/run/hira/q.sock,cid=3".parse().unwrap();
        assert_eq!(
            v.transport,
            VmTransport::VhostUser(PathBuf::from("/run/hira/q.sock"))
        );
        assert!(v.listener().is_none());
    }

    #[test]
    fn hosts_across_the_network_are_configured_with_names_tls_and_placements() {
        let f = FileConfig::parse(
            r#"
[tls]
name = "gpu-b"
cert = "/etc/hira/tls/gpu-b.crt"
key = "/etc/hira/tls/gpu-b.key"
ca = "/etc/hira/tls/ca.crt"
listen = "10.0.0.2:5580"
timeout_ms = 3000

[[peer]]
name = "host-a"
share = 2
max_sessions = 4

[[gpu_host]]
name = "gpu-c"
address = "10.0.0.3:5580"

[[local]]
vm = "vm1"
path = "/run/hira/vm1.sock"
gpu_host = "gpu-c"
"#,
        )
        .unwrap();
        let mut r = f.remote().unwrap();
        assert_eq!(r.tls.as_ref().unwrap().name, "gpu-b");
        assert_eq!(r.listen.as_deref(), Some("10.0.0.2:5580"));
        assert_eq!(r.timeout, Duration::from_secs(3));
        assert_eq!(r.peers[0].settings.share, Some(2));
        assert_eq!(r.peers[0].settings.max_sessions, Some(4));
        assert_eq!(f.listeners().unwrap()[0].gpu_host.as_deref(), Some("gpu-c"));
        r.place("vm1", "gpu-c").unwrap();
        assert!(r.place("vm1", "gpu-d").is_err(), "not a [[gpu_host]]");
        r.gpu_hosts.push(GpuHost {
            name: "gpu-d".into(),
            address: "10.0.0.4:5580".into(),
        });
        assert!(r.place("vm1", "gpu-d").is_err(), "one VM, two GPU hosts");
        assert_eq!(Remote::default().timeout, DEFAULT_REMOTE_TIMEOUT);
        assert_eq!(Remote::tenant("host-a", "vm1"), "host-a:vm1");
    }

    #[test]
    fn hosts_across_the_network_are_refused_when_half_configured() {
        let tls = "[tls]\nname = \"h\"\ncert = \"c\"\nkey = \"k\"\nca = \"a\"\n";
        for (text, why) in [
            (
                "[[gpu_host]]\nname = \"g\"\naddress = \"10.0.0.3:1\"\n".to_string(),
                "needs [tls]",
            ),
            (
                format!("{tls}listen = \"10.0.0.2:1\"\n"),
                "at least one [[peer]]",
            ),
            (
                format!("{tls}[[peer]]\nname = \"p\"\n"),
                "needs [tls] listen",
            ),
            (
                format!("{tls}[[gpu_host]]\nname = \"g\"\naddress = \"gpu:1\"\n"),
                "must be IP:PORT",
            ),
            (
                format!(
                    "{tls}listen = \"10.0.0.2:1\"\n[[peer]]\nname = \"p\"\n[[peer]]\nname = \"p\"\n"
                ),
                "given twice",
            ),
            (
                format!("{tls}listen = \"10.0.0.2:1\"\n[[peer]]\nname = \"a b\"\n"),
                "must be a host name",
            ),
            (format!("{tls}timeout_ms = 5\n"), "timeout_ms 5"),
        ] {
            let e = FileConfig::parse(&text).unwrap().remote().unwrap_err();
            assert!(e.to_string().contains(why), "{text}: {e}");
        }
        let l: LocalListener = "vm1=/run/vm1.sock,share=2,gpu-host=gpu-b".parse().unwrap();
        assert_eq!(l.gpu_host.as_deref(), Some("gpu-b"));
        assert_eq!(l.settings.share, Some(2));
        let v: VmSpec = "name=vm2,hybrid=/run/vm2.vsock,cid=5,gpu-host=gpu-b"
            .parse()
            .unwrap();
        assert_eq!(v.gpu_host.as_deref(), Some("gpu-b"));
        assert!(matches!(
            "name=vm2,hybrid=/x,cid=5,gpu-host=a,gpu-host=b".parse::<VmSpec>(),
            Err(ConfigError::DuplicateKey(_))
        ));
    }

    #[test]
    fn config_file_describes_listeners_and_vms() {
        let f = FileConfig::parse(
            "platform = \"Portable\"\n[[local]]\nvm = \"dev\"\npath = \"/tmp/dev.sock\"\n\
             [[vm]]\nname = \"vm1\"\nsocket = \"/run/hira/vm1.vhost\"\ncid = 3\nwindow = \"/dev/shm/w\"\nwindow_mb = 128\n",
        )
        .unwrap();
        assert_eq!(f.platform.as_deref(), Some("Portable"));
        assert_eq!(f.listeners().unwrap()[0].vm, "dev");
        let vms = f.vms().unwrap();
        assert_eq!(
            vms[0].window,
            Some((PathBuf::from("/dev/shm/w"), 128 << 20))
        );
        assert_eq!(
            vms[0].transport,
            VmTransport::VhostUser(PathBuf::from("/run/hira/vm1.vhost"))
        );
    }

    #[test]
    fn config_file_with_an_unknown_key_is_refused() {
        let e = FileConfig::parse("[[vm]]\nname = \"a\"\nsocket = \"/s\"\ncid = 3\nshares = 2\n")
            .unwrap_err();
        assert!(
            matches!(&e, ConfigError::File(m) if m.contains("shares")),
            "{e}"
        );
    }

    #[test]
    fn config_file_vm_is_validated_like_the_command_line() {
        let f = FileConfig::parse("[[vm]]\nname = \"a\"\nsocket = \"/s\"\ncid = 2\n").unwrap();
        let e = f.vms().unwrap_err();
        assert!(
            matches!(&e, ConfigError::At { source, .. } if **source == ConfigError::BadCid("2".into())),
            "{e}"
        );
    }

    #[test]
    fn config_file_errors_name_the_key_and_line() {
        let f = FileConfig::parse(
            "platform = \"x\"\n\n[[vm]]\nname = \"ok\"\nsocket = \"/s\"\ncid = 3\n\n[[vm]]\nname = \"bad\"\nsocket = \"/t\"\ncid = 1\n",
        )
        .unwrap();
        let e = f.vms().unwrap_err().to_string();
        assert!(e.starts_with("line 8, key `cid`"), "{e}");
    }

    #[test]
    fn window_defaults_to_64_mib() {
        let v: VmSpec = "name=q,socket=/s,cid=3,window=/dev/shm/q".parse().unwrap();
        assert_eq!(v.window, Some((PathBuf::from("/dev/shm/q"), 64 << 20)));
    }

    #[test]
    fn window_on_a_hybrid_vm_is_rejected() {
        assert_eq!(
            "name=q,hybrid=/s,cid=3,window=/w".parse::<VmSpec>(),
            Err(ConfigError::WindowNeedsVhostUser)
        );
    }

    #[test]
    fn sizes_and_memory_quotas_are_parsed_and_checked() {
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        for bad in ["0", "", "M", "12X", "-1", "99999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad:?} accepted");
        }
        let l: LocalListener = "vm1=/run/x.sock,mem-quota=1G".parse().unwrap();
        assert_eq!(
            (l.vm.as_str(), l.settings.mem_quota),
            ("vm1", Some(1 << 30))
        );
        assert_eq!(l.path, PathBuf::from("/run/x.sock"));
        assert_eq!(
            "vm1=/s,weight=3".parse::<LocalListener>(),
            Err(ConfigError::UnknownListenerKey("weight".into()))
        );
        assert!("vm1=/s,mem-quota=0".parse::<LocalListener>().is_err());
        let v: VmSpec = "name=q,socket=/s,cid=3,mem-quota=512M".parse().unwrap();
        assert_eq!(v.settings.mem_quota, Some(512 << 20));
        let f = FileConfig::parse(
            "[[local]]\nvm = \"a\"\npath = \"/a\"\nmem_quota = \"8M\"\n[[vm]]\nname = \"b\"\nhybrid = \"/b\"\ncid = 4\nmem_quota = \"1G\"\n",
        )
        .unwrap();
        assert_eq!(f.listeners().unwrap()[0].settings.mem_quota, Some(8 << 20));
        let vms = f.vms().unwrap();
        assert_eq!(vms[0].listener().unwrap().settings.mem_quota, Some(1 << 30));
        let bad = FileConfig::parse("[[local]]\npath = \"/a\"\nmem_quota = \"lots\"\n").unwrap();
        assert!(bad.listeners().unwrap_err().to_string().contains("line 1"));
        let twice = Config {
            listeners: vec![
                "a=/1,mem-quota=1M".parse().unwrap(),
                "a=/2,mem-quota=2M".parse().unwrap(),
            ],
            ..Config::default()
        };
        assert!(
            twice
                .mem_quotas()
                .unwrap_err()
                .to_string()
                .contains("two memory quotas")
        );
    }

    #[test]
    fn host_memory_caps_are_parsed_everywhere_a_vm_is_set() {
        let l: LocalListener = "vm1=/s,host-mem=8G".parse().unwrap();
        assert_eq!(l.settings.host_mem, Some(8 << 30));
        assert_eq!(
            "vm1=/s,host-mem=1G,host-mem=2G".parse::<LocalListener>(),
            Err(ConfigError::DuplicateKey("host-mem".into()))
        );
        assert!("vm1=/s,host-mem=0".parse::<LocalListener>().is_err());
        let v: VmSpec = "name=q,hybrid=/h,cid=3,host-mem=512M".parse().unwrap();
        assert_eq!(v.listener().unwrap().settings.host_mem, Some(512 << 20));
        let f = FileConfig::parse(
            "cgroup = \"/sys/fs/cgroup/hira\"\n[[local]]\nvm = \"a\"\npath = \"/a\"\nhost_mem = \"1G\"\n[[vm]]\nname = \"b\"\nsocket = \"/b\"\ncid = 4\nhost_mem = \"2G\"\n",
        )
        .unwrap();
        assert_eq!(f.cgroup, Some(PathBuf::from("/sys/fs/cgroup/hira")));
        assert_eq!(f.listeners().unwrap()[0].settings.host_mem, Some(1 << 30));
        assert_eq!(f.vms().unwrap()[0].settings.host_mem, Some(2 << 30));
        let twice = Config {
            listeners: vec![
                "a=/1,host-mem=1G".parse().unwrap(),
                "a=/2,host-mem=2G".parse().unwrap(),
            ],
            ..Config::default()
        };
        assert!(
            twice
                .host_mems()
                .unwrap_err()
                .to_string()
                .contains("host-memory caps")
        );
    }

    #[test]
    fn window_slots_are_set_and_checked() {
        let v: VmSpec = "name=q,socket=/s,cid=3,window=/w,window-mb=64,window-slots=16"
            .parse()
            .unwrap();
        assert_eq!(v.window_slots, 16);
        let d: VmSpec = "name=q,socket=/s,cid=3,window=/w".parse().unwrap();
        assert_eq!(d.window_slots, crate::window::DEFAULT_SLOTS);
        for bad in ["0", "65", "32", "x"] {
            assert_eq!(
                format!("name=q,socket=/s,cid=3,window=/w,window-mb=64,window-slots={bad}")
                    .parse::<VmSpec>(),
                Err(ConfigError::BadWindowSlots(bad.into())),
                "{bad} slots of a 64 MiB window"
            );
        }
        assert_eq!(
            "name=q,socket=/s,cid=3,window-slots=2".parse::<VmSpec>(),
            Err(ConfigError::Missing("window"))
        );
        let f = FileConfig::parse(
            "[[vm]]\nname = \"a\"\nsocket = \"/s\"\ncid = 3\nwindow = \"/w\"\nwindow_slots = 8\n",
        )
        .unwrap();
        assert_eq!(f.vms().unwrap()[0].window_slots, 8);
    }

    #[test]
    fn tiny_window_is_rejected() {
        assert_eq!(
            "name=q,socket=/s,cid=3,window=/w,window-mb=1".parse::<VmSpec>(),
            Err(ConfigError::BadWindowSize("1".into()))
        );
    }

    #[test]
    fn both_transports_at_once_are_rejected() {
        assert_eq!(
            "name=a,socket=/x,hybrid=/y,cid=3".parse::<VmSpec>(),
            Err(ConfigError::Transport)
        );
        assert_eq!(
            "name=a,cid=3".parse::<VmSpec>(),
            Err(ConfigError::Transport)
        );
    }

    #[test]
    fn missing_cid_is_named() {
        assert_eq!(
            "name=a,hybrid=/x".parse::<VmSpec>(),
            Err(ConfigError::Missing("cid"))
        );
    }

    #[test]
    fn empty_path_is_rejected() {
        assert_eq!("vm=".parse::<LocalListener>(), Err(ConfigError::EmptyPath));
    }
}
