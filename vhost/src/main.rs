//! `hira-vhost`: the Hira host daemon.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use std::time::Duration;

use hira_vhost::config::{
    self, Config, FileConfig, Limits, LocalListener, Sandbox, SocketAccess, VmSpec,
};

/// Serves Hira guests: accepts their connections, routes every call through the
/// per-VM policy and runs one API-server process per guest application.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Read settings from this TOML file (see docs/operating.md); flags add listeners and VMs
    /// to it and override its other settings.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Host-local guest listener, `[VM_NAME=]PATH` (repeatable). Connections on it
    /// belong to VM VM_NAME (default "local").
    #[arg(long = "local-socket", value_name = "[VM=]PATH")]
    local_sockets: Vec<String>,
    /// A VM (repeatable). `name=NAME,socket=PATH,cid=N`: Hira serves the vhost-user
    /// vsock device for QEMU's `vhost-user-vsock-pci` on PATH and the guest gets CID
    /// N. `name=NAME,hybrid=PATH,cid=N`: the VM runs under cloud-hypervisor or
    /// Firecracker with `--vsock cid=N,socket=PATH`, and Hira listens on PATH_5571.
    #[arg(long = "vm", value_name = "name=NAME,socket|hybrid=PATH,cid=N")]
    vms: Vec<String>,
    /// The API-server executable (default: hira-api-server next to this binary).
    #[arg(long)]
    api_server: Option<PathBuf>,
    /// Host platform to serve (the API servers list them: `hira-api-server --list-platforms`): the first whose name contains this text.
    #[arg(long)]
    platform: Option<String>,
    /// Largest data window a guest may share, in MiB (default 1024).
    #[arg(long)]
    max_window_mb: Option<u64>,
    /// User the API servers run as (a name, or UID[:GID]). Default when the daemon
    /// runs as root: nobody.
    #[arg(long, value_name = "USER")]
    api_server_user: Option<String>,
    /// The API servers' kernel cache directory, owned by their user (default
    /// /var/cache/hira).
    #[arg(long, value_name = "DIR")]
    api_server_cache_dir: Option<PathBuf>,
    /// The control socket (status queries; `hira-ctl` talks to it). Default: none.
    #[arg(long, value_name = "PATH")]
    control_socket: Option<PathBuf>,
    /// Permission bits of the sockets and window files the daemon creates, in octal
    /// (default 0660: only the owner and the group may connect).
    #[arg(long, value_name = "MODE")]
    socket_mode: Option<String>,
    /// User (name or number) to own the sockets and window files.
    #[arg(long, value_name = "USER")]
    socket_owner: Option<String>,
    /// Group (name or number) to own the sockets and window files.
    #[arg(long, value_name = "GROUP")]
    socket_group: Option<String>,
    /// Milliseconds a new connection may take to complete its handshake (default 10000).
    #[arg(long, value_name = "MS")]
    handshake_timeout_ms: Option<u64>,
    /// Most connections one listener holds at once (default 256).
    #[arg(long, value_name = "N")]
    max_connections_per_listener: Option<usize>,
    /// Most sessions (API servers) one VM has at once (default 64).
    #[arg(long, value_name = "N")]
    max_sessions_per_vm: Option<usize>,
    /// Milliseconds an API server gets to release its objects after its guest left,
    /// before it is killed (default 5000).
    #[arg(long, value_name = "MS")]
    teardown_grace_ms: Option<u64>,
    /// How VMs share device time: wfq (weighted fair queuing, the default),
    /// fixed-rate, aimd, or fifo (no policy).
    #[arg(long, value_name = "POLICY")]
    policy: Option<String>,
    /// Serve Prometheus metrics on this address (`HOST:PORT`, port 0: any free port,
    /// reported by the control socket). Default: none.
    #[arg(long, value_name = "HOST:PORT")]
    metrics_address: Option<String>,
    /// A cgroup directory delegated to the daemon (cgroup v2 with the memory
    /// controller, or the v1 memory hierarchy): each VM's API servers run in their own
    /// cgroup below it, which a VM's `host-mem=SIZE` caps. Default: none.
    #[arg(long, value_name = "DIR")]
    cgroup: Option<PathBuf>,
    /// When it stops (SIGTERM, SIGINT), the daemon suspends every session it can into
    /// a file in DIR, and when it starts it takes them back: applications hold their
    /// calls meanwhile and go on once it is up (a restart or an upgrade; guests wait
    /// up to their HIRA_RESUME_SECS, 60 s by default). Default: none (sessions end
    /// with the daemon).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Bytes per second of the host library's output (a kernel's `printf`, a
    /// compiler's diagnostics) each session may send its guest's standard output and
    /// error, with K, M or G (default 1M); the excess is dropped and counted.
    #[arg(long, value_name = "SIZE")]
    output_rate: Option<String>,
    /// Bytes of that output each session holds for its guest at once, and its burst
    /// above the rate (default 1M).
    #[arg(long, value_name = "SIZE")]
    output_buffer: Option<String>,
    /// Log lines as `text` (default) or `json` (one object per line: ts, level,
    /// target, msg). `RUST_LOG` sets the level.
    #[arg(long, value_name = "FORMAT")]
    log_format: Option<String>,
}

impl TryFrom<Args> for Config {
    type Error = anyhow::Error;

    fn try_from(a: Args) -> anyhow::Result<Config> {
        let file = match &a.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                FileConfig::parse(&text).with_context(|| format!("in {}", path.display()))?
            }
            None => FileConfig::default(),
        };
        let mut remote = file.remote()?;
        let mut listeners = file.listeners()?;
        for s in &a.local_sockets {
            listeners.push(s.parse::<LocalListener>()?);
        }
        let mut vms = file.vms()?;
        for s in &a.vms {
            vms.push(s.parse::<VmSpec>()?);
        }
        for (i, v) in vms.iter().enumerate() {
            anyhow::ensure!(
                !vms[..i].iter().any(|w| w.name == v.name || w.cid == v.cid),
                "VM {:?} (CID {}) is given twice",
                v.name,
                v.cid
            );
        }
        if listeners.is_empty() && vms.is_empty() {
            listeners.push(LocalListener::default());
        }
        listeners.extend(vms.iter().filter_map(VmSpec::listener));
        let vhost_user_vms: Vec<VmSpec> =
            vms.into_iter().filter(|v| v.listener().is_none()).collect();
        let api_server = match a.api_server.or(file.api_server) {
            Some(p) => p,
            None => std::env::current_exe()
                .context("cannot locate this executable")?
                .with_file_name("hira-api-server"),
        };
        anyhow::ensure!(
            api_server.is_file(),
            "API server {} does not exist",
            api_server.display()
        );
        let max_window_mb = a.max_window_mb.or(file.max_window_mb).unwrap_or(1024);
        anyhow::ensure!(
            max_window_mb <= 64 * 1024,
            "max window of {max_window_mb} MiB is over 64 GiB"
        );
        let defaults = Limits::default();
        let ms = |v: Option<u64>, d: Duration| v.map_or(d, Duration::from_millis);
        let limits = Limits {
            handshake_timeout: ms(
                a.handshake_timeout_ms.or(file.handshake_timeout_ms),
                defaults.handshake_timeout,
            ),
            max_connections_per_listener: a
                .max_connections_per_listener
                .or(file.max_connections_per_listener)
                .unwrap_or(defaults.max_connections_per_listener),
            max_sessions_per_vm: a
                .max_sessions_per_vm
                .or(file.max_sessions_per_vm)
                .unwrap_or(defaults.max_sessions_per_vm),
            teardown_grace: ms(
                a.teardown_grace_ms.or(file.teardown_grace_ms),
                defaults.teardown_grace,
            ),
        };
        anyhow::ensure!(
            limits.max_connections_per_listener > 0 && limits.max_sessions_per_vm > 0,
            "max_connections_per_listener and max_sessions_per_vm must be at least 1"
        );
        anyhow::ensure!(
            !limits.handshake_timeout.is_zero(),
            "handshake_timeout_ms must be at least 1"
        );
        let mut access = SocketAccess::default();
        if let Some(m) = a.socket_mode.or(file.socket_mode) {
            access.mode = config::parse_mode(&m)?;
        }
        if let Some(u) = a.socket_owner.or(file.socket_owner) {
            access.uid = Some(config::parse_user(&u)?);
        }
        if let Some(g) = a.socket_group.or(file.socket_group) {
            access.gid = Some(config::parse_group(&g)?);
        }
        let size = |flag: &str, v: Option<String>, default: u64| -> anyhow::Result<u64> {
            v.map_or(Ok(default), |v| {
                config::parse_size(&v).with_context(|| format!("{flag} {v:?}"))
            })
        };
        let output = config::OutputBound {
            rate: size(
                "output_rate",
                a.output_rate.or(file.output_rate),
                hira_protocol::DEFAULT_OUTPUT_RATE,
            )?,
            buffer: size(
                "output_buffer",
                a.output_buffer.or(file.output_buffer),
                hira_protocol::DEFAULT_OUTPUT_BUFFER,
            )?,
        };
        let tls = match &remote.tls {
            Some(files) => Some(std::sync::Arc::new(
                hira_vhost::remote::tls::Tls::load(files).context("[tls]")?,
            )),
            None => None,
        };
        let placed = listeners
            .iter()
            .map(|l| (&l.vm, &l.gpu_host))
            .chain(vhost_user_vms.iter().map(|v| (&v.name, &v.gpu_host)));
        for (vm, gpu) in placed {
            if let Some(gpu) = gpu {
                anyhow::ensure!(
                    tls.is_some(),
                    "VM {vm:?}: gpu-host needs [tls] (sessions cross hosts only over mutual TLS)"
                );
                remote.place(vm, gpu)?;
            }
        }
        Ok(Config {
            remote,
            tls,
            output,
            listeners,
            vhost_user_vms,
            api_server,
            platform: a.platform.or(file.platform),
            max_window: max_window_mb * 1024 * 1024,
            limits,
            access,
            control: a.control_socket.or(file.control_socket),
            metrics: a.metrics_address.or(file.metrics_address),
            cgroup: a.cgroup.or(file.cgroup),
            state_dir: a.state_dir.or(file.state_dir),
            api_server_tunables: config::api_server_tunables(
                std::env::var("GLIBC_TUNABLES").ok().as_deref(),
                std::env::var("HIRA_SERVER_NT_KB").ok().as_deref(),
            )?,
            policy: match a.policy.or(file.policy) {
                Some(p) => p.parse()?,
                None => hira_policy::Kind::Wfq,
            },
            sandbox: Sandbox {
                user: match a.api_server_user.or(file.api_server_user) {
                    Some(u) => Some(config::parse_sandbox_user(&u)?),
                    // SAFETY: geteuid has no preconditions.
                    None if unsafe { libc::geteuid() } == 0 => {
                        Some(config::parse_sandbox_user("nobody")?)
                    }
                    None => None,
                },
                cache_dir: a
                    .api_server_cache_dir
                    .or(file.api_server_cache_dir)
                    .unwrap_or_else(|| PathBuf::from(config::DEFAULT_CACHE_DIR)),
            },
        })
    }
}

fn main() -> anyhow::Result<()> {
    // Sessions run on threads that come and go; with glibc's default of an arena per
    // thread (up to 8 per core) their freed buffers stay stranded in idle arenas.
    // Two arenas keep the daemon's memory where its live sessions put it.
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only tunes the allocator; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
    let args = Args::parse();
    let mut logger =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    match args.log_format.as_deref() {
        None | Some("text") => {}
        // One JSON object per line, for log shippers.
        Some("json") => {
            logger.format(|buf, record| {
                use std::io::Write;
                let line = serde_json::json!({
                    "ts": buf.timestamp_micros().to_string(),
                    "level": record.level().as_str(),
                    "target": record.target(),
                    "msg": record.args().to_string(),
                });
                writeln!(buf, "{line}")
            });
        }
        Some(other) => anyhow::bail!("--log-format {other:?}: use text or json"),
    }
    logger.init();
    let config = Config::try_from(args).context("invalid configuration")?;
    hira_vhost::spawn::check_platform(&config).context("invalid configuration")?;
    hira_vhost::spawn::prepare_sandbox(&config).context("cannot prepare the API-server sandbox")?;
    hira_vhost::run(config).context("hira-vhost failed")
}
