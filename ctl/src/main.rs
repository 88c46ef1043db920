//! `hira-ctl`: the operator's view of a running `hira-vhost`, through its control
//! socket (`hira-vhost --control-socket PATH`; the typed protocol of the
//! `hira-control` crate, its wire format in docs/control.md).
//!
//! - `hira-ctl [--socket PATH] list [--json]`: VMs, their sessions and API servers.
//! - `hira-ctl set VM share=N mem-quota=SIZE max-sessions=N host-mem=SIZE` (`64M`,
//!   `2G`, `none`): changes a VM's share of device time, device-memory quota, cap on
//!   sessions and cap on its API servers' host memory live.
//! - `hira-ctl top`: a refreshing view of each VM's share of device time, call rate,
//!   data rate and memory.
//! - `hira-ctl migrate SESSION|VM [--to CONTROL_SOCKET|GPU-HOST]`: moves a session
//!   (or each of a VM's sessions) to a new API server, of this daemon, of another one,
//!   or of another GPU host, with its objects and their contents; the application
//!   sees a pause.
//! - `hira-ctl drain [--to GPU-HOST]`: a GPU host takes no new remote sessions, and
//!   its remote sessions move to another GPU host.
//! - `hira-ctl vm add NAME KEY=VALUE[,KEY=VALUE...]` (the keys `--vm` takes after
//!   `name=`), `hira-ctl vm remove NAME`, `hira-ctl vm list`: VMs served from now
//!   on, and no longer (a libvirt hook's calls).
//! - `hira-ctl libvirt-hook DOMAIN OPERATION ...`: libvirt's QEMU hook
//!   (`ctl/src/libvirt.rs`).
//! - `hira-ctl checkpoint SESSION FILE` / `hira-ctl restore FILE`: suspends a session
//!   into a file, and lets a daemon (this one, a restarted one, another one) resume
//!   it when its guest reconnects; `checkpoint all DIR` / `restore DIR` for every
//!   session, around a daemon upgrade.

use std::io::Write;
use std::path::{Path, PathBuf};

mod libvirt;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use hira_control::session_file;
use hira_control::settings::{parse_max_sessions, parse_share, parse_size};
use hira_control::{
    Client, DrainAnswer, MovedAnswer, Request, SessionStatus, SetAnswer, SetVm, Status,
    SuspendedAnswer, VmAddedAnswer, VmEntry, VmList, VmRemovedAnswer, VmStatus,
};

/// The control socket the packaged configuration uses.
const DEFAULT_SOCKET: &str = "/run/hira/control.sock";

/// Talks to a running hira-vhost through its control socket.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// The daemon's control socket (default: $HIRA_CONTROL_SOCKET, else
    /// /run/hira/control.sock).
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// The daemon's state: what its API servers see from inside their sandbox (each
    /// layer, the host's OpenCL platforms and devices, the CUDA driver and devices,
    /// as the latest probe found them: at start and at each `vm add`), its VMs and
    /// sessions, and its counters.
    Status {
        /// Print the daemon's whole answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Lists VMs with their sessions, API servers, calls and memory.
    List {
        /// Print the daemon's whole answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Changes a VM's settings while it runs: `share=N` (1-1000, its weight in device
    /// time against other VMs), `mem-quota=SIZE` (K, M, G, T: binary units; `none`
    /// removes the quota), `max-sessions=N` (1-4096, its cap on API servers),
    /// `host-mem=SIZE` (its API servers' host memory together; the daemon needs
    /// `--cgroup`; `none` removes the cap).
    Set {
        vm: String,
        #[arg(value_name = "KEY=VALUE", required = true)]
        settings: Vec<String>,
    },
    /// Moves a live session (a number, as `list` shows it) or each session of a VM
    /// (a name) to a new API server: its objects, their contents and the calls in
    /// flight go along; the application sees a pause. A session that cannot move
    /// stays where it was, and the reason is printed.
    Migrate {
        target: String,
        /// Another daemon's control socket on this host: the session is suspended
        /// here and resumed there, its guest reconnecting to that daemon. Or, for a
        /// session placed here from another host, a GPU host of the daemon's
        /// configuration (`[[gpu_host]]`): it resumes there, its guest staying put.
        #[arg(
            long,
            value_name = "CONTROL_SOCKET|GPU-HOST",
            conflicts_with = "to_device"
        )]
        to: Option<PathBuf>,
        /// The host device (its index in the host's list) the session moves to; the
        /// session must use one device.
        #[arg(long, value_name = "INDEX")]
        to_device: Option<u32>,
        /// Print the daemon's answers as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Suspends a live session into FILE: its application waits (up to its
    /// HIRA_RESUME_SECS, 60 s by default) until `hira-ctl restore FILE` on a daemon
    /// it can reach, such as this daemon restarted or upgraded, resumes it. With a
    /// VM's name (or `all`), suspends each of its sessions (every session) into a
    /// file SESSION.hira in the directory FILE, for a daemon upgrade.
    Checkpoint { target: String, file: PathBuf },
    /// Hands a session suspended with `checkpoint` to the daemon, which resumes it
    /// when its guest reconnects; with a directory, each `*.hira` file in it.
    Restore { file: PathBuf },
    /// Drains this GPU host for maintenance: it takes no new sessions from other
    /// hosts (their VM hosts place them elsewhere), and each session placed here
    /// moves to GPU host `--to` (by default, the configured one that can take the
    /// most); sessions of this host's own VMs stay. Lasts until the daemon restarts.
    Drain {
        #[arg(long, value_name = "GPU-HOST")]
        to: Option<String>,
        /// Print the daemon's answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// VMs served from now on, and no longer, without restarting the daemon.
    #[command(subcommand)]
    Vm(VmCmd),
    /// libvirt's QEMU hook (`/etc/libvirt/hooks/qemu` execs it with its arguments):
    /// adds a domain's VM when it is prepared and removes it when it is released, for
    /// domains whose metadata has Hira's `<vm spec=...>` element
    /// (`deploy/libvirt/domain.xml`).
    LibvirtHook {
        #[arg(num_args = 0.., allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// A refreshing view of each VM's share of device time, calls per second, data
    /// rate and memory.
    Top {
        /// Time between refreshes, in milliseconds.
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
        /// Stop after this many refreshes (default: until interrupted).
        #[arg(long)]
        iterations: Option<u64>,
    },
}

#[derive(Subcommand, Debug)]
enum VmCmd {
    /// Serves VM NAME: SPEC has the keys `--vm` takes after `name=`, separated by
    /// commas: `socket=PATH` (QEMU vhost-user) or `hybrid=PATH` (cloud-hypervisor,
    /// Firecracker), `cid=N`, and optionally `window=FILE`, `window-mb=M`,
    /// `window-slots=S`, `share=N`, `mem-quota=SIZE`, `max-sessions=N`,
    /// `host-mem=SIZE`. Kept across restarts where the daemon has a state directory.
    Add { name: String, spec: String },
    /// Stops serving VM NAME (added with `vm add`): its sessions end, their memory
    /// goes back, its sockets and window file go.
    Remove {
        name: String,
        /// How long its sessions may take to end, in milliseconds.
        #[arg(long, default_value_t = 10_000)]
        timeout_ms: u64,
    },
    /// The VMs served: transport, socket, CID, window, sessions.
    List {
        /// Print the daemon's answer as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn print_vm(v: &VmEntry) {
    println!(
        "{:<16} {:<10} {:>6} {:>8} {:<9} {} {}",
        v.name,
        v.transport,
        v.cid.map_or_else(|| "-".into(), |c| c.to_string()),
        v.sessions,
        match (v.added, v.persistent) {
            (false, _) => "config",
            (true, true) => "added",
            (true, false) => "added(*)",
        },
        v.socket,
        v.window.as_deref().unwrap_or(""),
    );
    if let Some(g) = &v.gpu_host {
        println!("{:<16} sessions run on GPU host {g}", "");
    }
}

fn vm(c: &mut Client, cmd: VmCmd) -> anyhow::Result<()> {
    match cmd {
        VmCmd::Add { name, spec } => {
            anyhow::ensure!(
                !spec.split(',').any(|kv| kv.starts_with("name=")),
                "give the name once, as NAME"
            );
            let VmAddedAnswer { added } = c.ask(&Request::VmAdd {
                spec: format!("name={name},{spec}"),
            })?;
            print_vm(&added);
            if !added.persistent {
                println!("(*) the daemon has no state directory: gone at its next start");
            }
        }
        VmCmd::Remove { name, timeout_ms } => {
            let VmRemovedAnswer {
                removed,
                sessions_ended,
            } = c.ask(&Request::VmRemove {
                vm: name,
                timeout_ms: Some(timeout_ms),
            })?;
            println!("VM {removed} removed; {sessions_ended} sessions ended");
        }
        VmCmd::List { json } => {
            let list: VmList = c.ask(&Request::VmList)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(());
            }
            println!(
                "{:<16} {:<10} {:>6} {:>8} {:<9} SOCKET WINDOW",
                "VM", "TRANSPORT", "CID", "SESSIONS", "FROM"
            );
            for v in &list.vms {
                print_vm(v);
            }
        }
    }
    Ok(())
}

/// `1536` → `1.5 KiB`.
fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn quota(v: Option<u64>) -> String {
    v.map_or_else(|| "none".into(), size)
}

/// `hira-ctl status`: the probe's view, then the daemon's counts.
fn print_status(s: &hira_control::Status) {
    println!("API servers' sandbox and what they see from it (the latest probe):");
    for line in &s.sandbox {
        println!("  {line}");
    }
    let live = s.sessions.iter().filter(|x| x.session.serving).count();
    println!(
        "VMs {}, sessions {} ({live} serving), parked {}, detached {}",
        s.vms.len(),
        s.sessions.len(),
        s.parked.len(),
        s.detached
    );
    println!(
        "migrations {}, suspensions {}, resumptions {}, reconnections {}, API-server crashes {}",
        s.migrations, s.suspensions, s.resumptions, s.reconnections, s.api_server_crashes
    );
    if let Some(a) = &s.metrics_address {
        println!("metrics: http://{a}/metrics");
    }
}

fn print_list(status: &Status) {
    println!(
        "{:<16} {:>8} {:>6} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
        "VM",
        "SESSIONS",
        "SHARE",
        "DEVICE-TIME",
        "CALLS",
        "DATA",
        "MEMORY",
        "MEM-QUOTA",
        "HOST-MEM",
        "HOST-CAP",
        "OUTPUT",
        "OUT-DROPPED"
    );
    for vm in &status.vms {
        let host = vm.host_mem_used.map_or_else(|| "-".to_string(), size);
        let cap = if vm.host_mem_used.is_none() {
            "-".to_string()
        } else {
            quota(vm.host_mem)
        };
        println!(
            "{:<16} {:>8} {:>6} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
            vm.name,
            vm.sessions,
            vm.share,
            format!("{:.3} s", vm.device_ns as f64 / 1e9),
            vm.commands,
            size(vm.bytes),
            size(vm.mem_used),
            quota(vm.mem_quota),
            host,
            cap,
            size(vm.output_bytes),
            size(vm.output_dropped),
        );
    }
    if !status.parked.is_empty() {
        println!("\nsuspended sessions waiting for their guests:");
        for p in &status.parked {
            println!("  VM {} ({})", p.vm, size(p.snapshot_bytes));
        }
    }
    let detached = status.detached;
    if detached > 0 {
        println!(
            "\n{detached} session(s) waiting for their guests to connect again after a device reset"
        );
    }
    if status.sessions.is_empty() {
        println!("\nno live sessions");
        return;
    }
    println!(
        "\n{:>8} {:<16} {:<7} {:<20} {:>9} {:>11} {:>12} {:>12} {:>5} {:>12}",
        "SESSION",
        "VM",
        "API",
        "PROCESS",
        "GUEST-PID",
        "API-SERVER",
        "CALLS",
        "MEMORY",
        "MOVES",
        "OUT-DROPPED"
    );
    for SessionStatus {
        session: se,
        commands,
        memory,
        output_dropped,
        ..
    } in &status.sessions
    {
        // A session placed on another host has its API server there.
        let api = match (&se.gpu_host, se.api_server_pid) {
            (Some(g), _) => format!("@{g}"),
            (None, p) => p.map_or_else(|| "-".into(), |p| p.to_string()),
        };
        println!(
            "{:>8} {:<16} {:<7} {:<20} {:>9} {:>11} {:>12} {:>12} {:>5} {:>12}",
            se.id,
            se.vm,
            se.api,
            se.process,
            se.guest_pid,
            api,
            commands,
            size(*memory),
            se.migrations,
            size(*output_dropped),
        );
    }
}

/// `mem-quota=2G` into the `set` request.
fn setting(req: &mut SetVm, kv: &str) -> anyhow::Result<()> {
    let (k, v) = kv
        .split_once('=')
        .with_context(|| format!("`{kv}` is not KEY=VALUE"))?;
    let size_or_none = |v: &str| match v {
        "none" => Ok(None),
        v => parse_size(v).map(Some),
    };
    match k {
        "mem-quota" => req.mem_quota = Some(size_or_none(v)?),
        "share" => req.share = Some(parse_share(v)?),
        "max-sessions" => req.max_sessions = Some(parse_max_sessions(v)?),
        "host-mem" => req.host_mem = Some(size_or_none(v)?),
        other => {
            bail!("unknown setting `{other}` (known: share, mem-quota, max-sessions, host-mem)")
        }
    }
    Ok(())
}

fn top(c: &mut Client, interval: Duration, iterations: Option<u64>) -> anyhow::Result<()> {
    let mut last: Option<(Instant, Status)> = None;
    let mut n = 0u64;
    loop {
        let status = c.status()?;
        let now = Instant::now();
        let mut out = String::from("\x1b[H\x1b[2J");
        out += &format!(
            "hira-vhost: {} live sessions, {} API servers crashed   (every {} ms)\n\n",
            status.sessions.len(),
            status.api_server_crashes,
            interval.as_millis()
        );
        out += &format!(
            "{:<16} {:>8} {:>6} {:>9} {:>8} {:>10} {:>12} {:>12} {:>12}\n",
            "VM",
            "SESSIONS",
            "SHARE",
            "DEVICE%",
            "DECISION",
            "CALLS/S",
            "DATA/S",
            "MEMORY",
            "MEM-QUOTA"
        );
        let vms = &status.vms;
        // The same VM in the last refresh.
        let before = |vm: &VmStatus| -> Option<&VmStatus> {
            let (_, prev) = last.as_ref()?;
            prev.vms.iter().find(|v| v.name == vm.name)
        };
        // Each VM's part of the device time all VMs used since the last refresh.
        let device_delta = |vm: &VmStatus| -> u64 {
            vm.device_ns
                .saturating_sub(before(vm).map_or(vm.device_ns, |b| b.device_ns))
        };
        let device_all: u64 = vms.iter().map(device_delta).sum();
        for vm in vms {
            let name = &vm.name;
            let device = if device_all == 0 {
                "-".to_string()
            } else {
                format!("{:.1}", 100.0 * device_delta(vm) as f64 / device_all as f64)
            };
            let (calls, bytes) = match &last {
                Some((t, _)) => {
                    let secs = now.duration_since(*t).as_secs_f64().max(1e-3);
                    let b = before(vm);
                    let calls = vm.commands.saturating_sub(b.map_or(0, |b| b.commands));
                    let bytes = vm.bytes.saturating_sub(b.map_or(0, |b| b.bytes));
                    (
                        format!("{:.0}", calls as f64 / secs),
                        format!("{}/s", size((bytes as f64 / secs) as u64)),
                    )
                }
                None => ("-".into(), "-".into()),
            };
            out += &format!(
                "{:<16} {:>8} {:>6} {:>9} {:>8} {:>10} {:>12} {:>12} {:>12}\n",
                name,
                vm.sessions,
                vm.share,
                device,
                vm.decision,
                calls,
                bytes,
                size(vm.mem_used),
                quota(vm.mem_quota),
            );
        }
        print!("{out}");
        std::io::stdout().flush()?;
        last = Some((now, status));
        n += 1;
        if iterations.is_some_and(|max| n >= max) {
            return Ok(());
        }
        std::thread::sleep(interval);
    }
}

/// The sessions `target` names: one by number, or a VM's by name.
fn sessions_of(status: &Status, target: &str) -> anyhow::Result<Vec<u64>> {
    if let Ok(id) = target.parse::<u64>() {
        return Ok(vec![id]);
    }
    let ids: Vec<u64> = status
        .sessions
        .iter()
        .filter(|s| s.session.vm == target)
        .map(|s| s.session.id)
        .collect();
    if ids.is_empty() {
        bail!("no live session is {target:?} or belongs to a VM of that name");
    }
    Ok(ids)
}

fn migrate(
    c: &mut Client,
    target: &str,
    to: Option<&Path>,
    device: Option<u32>,
    json: bool,
) -> anyhow::Result<()> {
    let status = c.status()?;
    let mut failed = 0;
    for id in sessions_of(&status, target)? {
        let req = Request::Migrate {
            session: id,
            timeout_ms: None,
            device,
            to: to.map(|p| p.display().to_string()),
        };
        let answer = if to.is_some() {
            c.ask::<SuspendedAnswer>(&req).map(|a| {
                let s = &a.suspended;
                let line = format!(
                    "session {id}: suspended here ({}, captured in {:.1} ms) and waiting at {} for its guest",
                    size(s.snapshot_bytes),
                    s.capture_ms,
                    a.to.as_deref().unwrap_or("?"),
                );
                (serde_json::to_string(&a), line)
            })
        } else {
            c.ask::<MovedAnswer>(&req).map(|a| {
                let m = &a.moved;
                let line = format!(
                    "session {id}: API server {} -> {}, snapshot {}, paused {:.1} ms (capture {:.1}, restore {:.1})",
                    m.from_pid,
                    m.to_pid,
                    size(m.snapshot_bytes),
                    m.pause_ms,
                    m.capture_ms,
                    m.restore_ms,
                );
                (serde_json::to_string(&a), line)
            })
        };
        match answer {
            Ok((as_json, _)) if json => println!("{}", as_json?),
            Ok((_, line)) => println!("{line}"),
            Err(e) => {
                eprintln!("session {id}: not moved: {e}");
                failed += 1;
            }
        }
    }
    if failed > 0 {
        bail!("{failed} session(s) could not move");
    }
    Ok(())
}

fn checkpoint(c: &Client, session: u64, file: &Path) -> anyhow::Result<()> {
    let susp = c
        .checkpoint(session, |susp, snapshot| -> anyhow::Result<()> {
            let mut out = std::fs::File::create(file)
                .with_context(|| format!("cannot create {}", file.display()))?;
            session_file::write_header(&mut out, &susp.token.0, &susp.vm, susp.slot)?;
            std::io::copy(&mut std::fs::File::from(snapshot), &mut out)?;
            out.sync_all()?;
            Ok(())
        })
        .with_context(|| format!("session {session}: not suspended"))?;
    println!(
        "session {session}: suspended into {} ({}, VM {}); `hira-ctl restore {}` resumes it",
        file.display(),
        size(susp.snapshot_bytes),
        susp.vm,
        file.display()
    );
    Ok(())
}

/// `checkpoint VM|all DIR`: each session into DIR/SESSION.hira.
fn checkpoint_all(c: &mut Client, target: &str, dir: &Path) -> anyhow::Result<()> {
    let status = c.status()?;
    let ids: Vec<u64> = if target == "all" {
        status.sessions.iter().map(|s| s.session.id).collect()
    } else {
        sessions_of(&status, target)?
    };
    std::fs::create_dir_all(dir)?;
    let mut failed = 0;
    for id in ids {
        if let Err(e) = checkpoint(c, id, &dir.join(format!("{id}.hira"))) {
            eprintln!("{e:#}");
            failed += 1;
        }
    }
    anyhow::ensure!(failed == 0, "{failed} session(s) were not suspended");
    Ok(())
}

fn restore(socket: &Path, file: &Path) -> anyhow::Result<()> {
    let mut f =
        std::fs::File::open(file).with_context(|| format!("cannot open {}", file.display()))?;
    let (token, vm, slot) = session_file::read_header(&mut f)
        .with_context(|| format!("{} is not a session file", file.display()))?;
    let at = std::io::Seek::stream_position(&mut f)?;
    let bytes = f.metadata()?.len().saturating_sub(at);
    let parked = hira_control::park_at(socket, &vm, &token, slot, bytes, &mut f)
        .with_context(|| format!("{} refused", socket.display()))?;
    println!(
        "a session of VM {vm} waits for its guest ({})",
        size(parked.snapshot_bytes)
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let socket = args
        .socket
        .or_else(|| std::env::var_os("HIRA_CONTROL_SOCKET").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET));
    if let Cmd::LibvirtHook { args } = &args.cmd {
        // Connects only for a domain that uses Hira.
        return libvirt::hook(args, socket);
    }
    let mut c = Client::connect(&socket)?;
    match args.cmd {
        Cmd::LibvirtHook { .. } => unreachable!("answered above"),
        Cmd::Status { json } => {
            let status = c.status()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                print_status(&status);
            }
        }
        Cmd::List { json } => {
            let status = c.status()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                print_list(&status);
            }
        }
        Cmd::Set { vm, settings } => {
            let mut req = SetVm {
                vm,
                ..SetVm::default()
            };
            for kv in &settings {
                setting(&mut req, kv)?;
            }
            let SetAnswer { vm: v } = c.ask(&Request::Set(req))?;
            print!(
                "VM {}: share {}, memory {} of quota {}",
                v.name,
                v.share,
                size(v.mem_used),
                quota(v.mem_quota)
            );
            match v.host_mem_used {
                Some(b) => println!(", host memory {} of cap {}", size(b), quota(v.host_mem)),
                None => println!(),
            }
        }
        Cmd::Migrate {
            target,
            to,
            to_device,
            json,
        } => migrate(&mut c, &target, to.as_deref(), to_device, json)?,
        Cmd::Drain { to, json } => {
            let a: DrainAnswer = c.ask(&Request::Drain { to })?;
            if json {
                println!("{}", serde_json::to_string(&a)?);
            } else {
                for (id, gpu) in &a.moved {
                    println!("session {id}: moved to GPU host {gpu}");
                }
                for (id, why) in &a.failed {
                    println!("session {id}: not moved: {why}");
                }
                println!(
                    "draining: {} moved, {} not, {} of this host's own VMs stay",
                    a.moved.len(),
                    a.failed.len(),
                    a.stayed
                );
            }
            if !a.failed.is_empty() {
                bail!("{} session(s) could not move", a.failed.len());
            }
        }
        Cmd::Checkpoint { target, file } => match target.parse::<u64>() {
            Ok(session) => checkpoint(&c, session, &file)?,
            Err(_) => checkpoint_all(&mut c, &target, &file)?,
        },
        Cmd::Restore { file } if file.is_dir() => {
            let mut files: Vec<PathBuf> = std::fs::read_dir(&file)?
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "hira"))
                .collect();
            files.sort();
            anyhow::ensure!(!files.is_empty(), "no *.hira file in {}", file.display());
            for f in files {
                restore(&socket, &f)?;
            }
        }
        Cmd::Restore { file } => restore(&socket, &file)?,
        Cmd::Vm(cmd) => vm(&mut c, cmd)?,
        Cmd::Top {
            interval_ms,
            iterations,
        } => top(
            &mut c,
            Duration::from_millis(interval_ms.max(100)),
            iterations,
        )?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(size(512), "512 B");
        assert_eq!(size(3 << 29), "1.5 GiB");
        let set = |kv: &str| {
            let mut req = SetVm::default();
            setting(&mut req, kv).map(|()| req)
        };
        assert_eq!(
            set("mem-quota=64M").unwrap().mem_quota,
            Some(Some(64 << 20))
        );
        assert_eq!(set("mem-quota=none").unwrap().mem_quota, Some(None));
        assert!(set("mem-quota=0").is_err());
        assert_eq!(set("share=3").unwrap().share, Some(3));
        assert!(set("share=0").is_err());
        assert!(set("weight=3").unwrap_err().to_string().contains("known"));
        assert!(set("mem-quota").is_err());
    }
}
