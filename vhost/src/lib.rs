//! Hira's host daemon.
//!
//! - [`config`]: the validated daemon configuration, listener specs and limits.
//! - [`listener`]: binds guest sockets (never over a live one) and accepts guest
//!   connections under caps; the listener a connection arrives on decides its VM,
//!   never anything the guest says.
//! - [`session`]: one guest application's session: the handshake, its API-server
//!   process, and, for a session without shared-memory rings, the relay that checks
//!   its frames in both directions.
//! - [`vms`]: each VM's state: its sessions' usage pages (which their API servers
//!   write) summed with what ended sessions left, its quota, share and session cap.
//! - [`scheduler`]: the thread that runs the sharing policy over the VMs' usage and
//!   publishes each VM's decision in its VM page, where its API servers apply it.
//! - [`served`]: what serves each VM (its listener or vhost-user device, its window),
//!   for the configured VMs and those added and removed at run time.
//! - [`control`]: the control socket (status, live settings, waiting for events,
//!   moving sessions), on the typed protocol of `hira-control`.
//! - [`metrics`]: the same figures for Prometheus.
//! - [`migrate`]: moving a session to a new API server or another daemon, and
//!   suspended sessions waiting for their guests.
//! - [`cgroup`]: the VMs' cgroups that cap their API servers' host memory.
//! - [`lifecycle`]: the live sessions and the orderly stop on SIGTERM/SIGINT.
//! - [`restart`]: sessions suspended into the state directory at a stop and taken
//!   back at the next start.
//! - [`spawn`]: starting API-server processes (they die with the daemon) and reaping
//!   them within a grace period.
//! - [`window`]: per-VM shared data windows (ivshmem) and their per-session slots.
//! - [`vsock`]: the virtio-vsock protocol (packet header, connection state machine,
//!   credit-based flow control, per-VM multiplexing) for the VM transport.

pub mod cgroup;
pub mod config;
pub mod control;
pub mod lifecycle;
pub mod listener;
pub mod metrics;
pub mod migrate;
pub mod remote;
pub mod restart;
pub mod scheduler;
pub mod served;
pub mod session;
pub mod spawn;
pub mod vms;
pub mod vsock;
pub mod window;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use log::{info, warn};
use signal_hook::consts::{SIGINT, SIGTERM};

pub use config::Config;

/// Why the daemon could not start; each names what failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Listen(#[from] listener::ListenError),
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error("cannot make VM {vm:?}'s page for its quota: {source}")]
    VmPage {
        vm: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot use the cgroup directory {}: {source}", path.display())]
    Cgroups {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot make VM {vm:?}'s cgroup: {source}")]
    VmCgroup {
        vm: String,
        #[source]
        source: std::io::Error,
    },
    #[error("host-mem caps need --cgroup DIR (a cgroup directory delegated to the daemon)")]
    HostMemNeedsCgroup,
    #[error("cannot cap VM {vm:?}'s host memory: {source}")]
    HostMemCap {
        vm: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the scheduler thread: {0}")]
    Scheduler(#[source] std::io::Error),
    #[error(transparent)]
    Vm(#[from] served::VmError),
    #[error("cannot serve metrics on {addr}: {source}")]
    Metrics {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot listen for remote sessions on {addr}: {source}")]
    Remote {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// Runs the daemon until SIGTERM or SIGINT, then stops in order: no new guests, every
/// session ended and its API server reaped, socket files removed.
pub fn run(config: Config) -> Result<(), StartError> {
    // Everything the daemon creates starts with at most the configured access, so no
    // socket is ever reachable more widely, not even for a moment.
    // SAFETY: umask only changes this process's file-creation mask.
    unsafe { libc::umask(!config.access.mode & 0o777) };
    let mut signals = Signals::new();
    let config = Arc::new(config);
    let vms = Arc::new(vms::Vms::default());
    let life = Arc::new(lifecycle::Lifecycle::default());
    // Every configured VM is known from the start, so the control socket can set
    // what it may use before its first guest arrives.
    for l in &config.listeners {
        vms.vm(&l.vm);
    }
    for vm in &config.vhost_user_vms {
        vms.vm(&vm.name);
    }
    for (vm, gpu) in &config.remote.placements {
        vms.vm(vm).place(gpu);
        info!("VM {vm:?}: sessions run on GPU host {gpu:?}");
    }
    for (vm, quota) in config.mem_quotas()? {
        vms.vm(&vm)
            .set_mem_quota(Some(quota))
            .map_err(|source| StartError::VmPage {
                vm: vm.clone(),
                source,
            })?;
        info!("VM {vm:?}: device-memory quota {quota} bytes");
    }
    for (vm, max) in config.max_sessions()? {
        vms.vm(&vm).set_max_sessions(max);
        info!("VM {vm:?}: at most {max} sessions");
    }
    let host_mems = config.host_mems()?;
    let cgroups = match &config.cgroup {
        Some(root) => {
            let cgroups = cgroup::Cgroups::open(root).map_err(|source| StartError::Cgroups {
                path: root.clone(),
                source,
            })?;
            for (name, queue) in vms.snapshot() {
                let c = cgroups.vm(&name).map_err(|source| StartError::VmCgroup {
                    vm: name.clone(),
                    source,
                })?;
                info!("VM {name:?}: API servers in cgroup {}", c.path().display());
                let _ = queue.cgroup.set(c);
            }
            Some(cgroups)
        }
        None if !host_mems.is_empty() => return Err(StartError::HostMemNeedsCgroup),
        None => None,
    };
    for (vm, cap) in host_mems {
        vms.vm(&vm)
            .set_host_mem(Some(cap))
            .map_err(|source| StartError::HostMemCap {
                vm: vm.clone(),
                source,
            })?;
        info!("VM {vm:?}: host memory capped at {cap} bytes");
    }
    for (vm, share) in config.shares()? {
        vms.vm(&vm).set_share(share);
        info!("VM {vm:?}: share {share}");
    }
    {
        let (vms, kind) = (vms.clone(), config.policy);
        std::thread::Builder::new()
            .name("scheduler".into())
            .spawn(move || scheduler::run(vms, kind))
            .map_err(StartError::Scheduler)?;
    }
    let served = Arc::new(served::Served::new(
        config.clone(),
        vms.clone(),
        life.clone(),
        cgroups,
    ));
    let mut listeners = Vec::new();
    for l in &config.listeners {
        listeners.push((listener::bind(&l.path, &config.access)?, l));
        info!("VM {:?}: listening on {}", l.vm, l.path.display());
    }
    // Each vhost-user VM's socket (and window) is made now, so it exists with its
    // access before the daemon reports readiness.
    for vm in &config.vhost_user_vms {
        served.serve_configured(vm)?;
    }
    let mut created: Vec<PathBuf> = Vec::new();
    if let Some(addr) = &config.metrics {
        let l = std::net::TcpListener::bind(addr).map_err(|source| StartError::Metrics {
            addr: addr.clone(),
            source,
        })?;
        if let Ok(a) = l.local_addr() {
            let _ = metrics::ADDRESS.set(a);
            info!("metrics on http://{a}/metrics");
        }
        let (life, vms) = (life.clone(), vms.clone());
        std::thread::spawn(move || metrics::serve(l, life, vms));
    }
    if let Some(path) = &config.control {
        // The control socket adds VMs and moves sessions: the daemon's user's alone,
        // whatever access the guests' sockets get (QEMU's group must not reach it).
        let owner_only = config::SocketAccess {
            mode: 0o600,
            uid: None,
            gid: None,
        };
        let l = listener::bind(path, &owner_only)?;
        created.push(path.clone());
        info!("control socket on {}", path.display());
        let (life, vms, served) = (life.clone(), vms.clone(), served.clone());
        std::thread::spawn(move || control::serve(l, life, vms, served));
    }
    for (l, spec) in listeners {
        served.serve_listener(spec, l);
    }
    if let (Some(addr), Some(tls)) = (&config.remote.listen, &config.tls) {
        let l = std::net::TcpListener::bind(addr).map_err(|source| StartError::Remote {
            addr: addr.clone(),
            source,
        })?;
        let peers: Vec<&str> = config
            .remote
            .peers
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        info!(
            "remote sessions on {addr} as {:?} (mutual TLS; peers {peers:?})",
            tls.name
        );
        let (tls, config, vms, life) = (tls.clone(), config.clone(), vms.clone(), life.clone());
        std::thread::spawn(move || remote::gpu_host::serve(l, tls, config, vms, life));
    }

    // VMs added at run time before the last stop are served again.
    let kept = served.add_kept();
    if kept > 0 {
        info!("{kept} VMs added at run time are served again");
    }
    // Sessions the last daemon suspended into the state directory wait for their
    // guests from the first moment guests can reach this one.
    if let Some(dir) = &config.state_dir {
        let n = restart::resume_all(&life, &vms, dir);
        if n > 0 {
            info!("{n} sessions from {} wait for their guests", dir.display());
        }
    }
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]);
    info!("ready");
    let signal = signals.wait();
    info!("signal {signal}: stopping");
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
    for path in created.iter().chain(&served.files()) {
        let _ = std::fs::remove_file(path);
    }
    // No guest reaches this daemon any more: the sessions it can suspend wait in the
    // state directory for the next one, their guests holding their calls.
    if let Some(dir) = &config.state_dir {
        let n = restart::suspend_all(&life, dir);
        info!("{n} sessions suspended into {}", dir.display());
    }
    let grace = config.limits.teardown_grace + Duration::from_secs(5);
    if !life.stop(grace) {
        warn!(
            "{} sessions did not end within {grace:?}; their API servers die with the daemon",
            life.sessions()
        );
    }
    // The VMs' cgroups go once their API servers are gone.
    for (_, queue) in vms.snapshot() {
        if let Some(c) = queue.cgroup.get() {
            c.remove();
        }
    }
    info!("stopped");
    Ok(())
}

/// SIGTERM and SIGINT, taken over from their default action before any thread starts.
struct Signals(signal_hook::iterator::Signals);

impl Signals {
    fn new() -> Self {
        Signals(
            signal_hook::iterator::Signals::new([SIGTERM, SIGINT])
                .expect("registering SIGTERM and SIGINT handlers cannot fail for these signals"),
        )
    }

    /// Blocks until one arrives.
    fn wait(&mut self) -> i32 {
        loop {
            if let Some(s) = self.0.forever().next() {
                return s;
            }
        }
    }
}
