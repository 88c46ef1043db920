//! `hira-ctl`: the operator's view of a running `hira-vhost`, through its control
//! socket (`hira-vhost --control-socket PATH`; one JSON request and answer per line,
//! see `vhost-device/src/control.rs`).
//!
//! - `hira-ctl [--socket PATH] list [--json]`: VMs, their sessions and API servers.
//! - `hira-ctl set VM share=N mem-quota=SIZE max-sessions=N host-mem=SIZE` (`64M`,
//!   `2G`, `none`): changes a VM's share of device time, device-memory quota, cap on
//!   sessions and cap on its API servers' host memory live.
//! - `hira-ctl top`: a refreshing view of each VM's share of device time, call rate,
//!   data rate and memory.
//! - `hira-ctl migrate SESSION|VM [--to CONTROL_SOCKET]`: moves a session (or each
//!   of a VM's sessions) to a new API server, of this daemon or of another one, with
//!   its objects and their contents; the application sees a pause.
//! - `hira-ctl checkpoint SESSION FILE` / `hira-ctl restore FILE`: suspends a session
//!   into a file, and lets a daemon (this one, a restarted one, another one) resume
//!   it when its guest reconnects; `checkpoint all DIR` / `restore DIR` for every
//!   session, around a daemon upgrade.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use serde_json::{Value, json};

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
        /// here and resumed there, its guest reconnecting to that daemon.
        #[arg(long, value_name = "CONTROL_SOCKET", conflicts_with = "to_device")]
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

/// One connection to the control socket.
struct Control {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Control {
    fn connect(path: &PathBuf) -> anyhow::Result<Control> {
        let s = UnixStream::connect(path).with_context(|| {
            format!(
                "cannot reach hira-vhost's control socket {} (is the daemon running with --control-socket?)",
                path.display()
            )
        })?;
        Ok(Control {
            reader: BufReader::new(s.try_clone()?),
            writer: s,
        })
    }

    fn ask(&mut self, req: &Value) -> anyhow::Result<Value> {
        writeln!(self.writer, "{req}")?;
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            bail!("the daemon closed the control socket");
        }
        let v: Value = serde_json::from_str(&line).context("the daemon's answer is not JSON")?;
        if let Some(e) = v.get("error").and_then(Value::as_str) {
            bail!("{e}");
        }
        Ok(v)
    }
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

fn quota(v: &Value) -> String {
    v.as_u64().map_or_else(|| "none".into(), size)
}

fn u(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

fn print_list(status: &Value) {
    let empty = Vec::new();
    let vms = status["vms"].as_array().unwrap_or(&empty);
    let sessions = status["sessions"].as_array().unwrap_or(&empty);
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
    for vm in vms {
        let host = vm["host_mem_used"]
            .as_u64()
            .map_or_else(|| "-".to_string(), size);
        let cap = if vm["host_mem_used"].is_null() {
            "-".to_string()
        } else {
            quota(&vm["host_mem"])
        };
        println!(
            "{:<16} {:>8} {:>6} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
            s(vm, "name"),
            u(vm, "sessions"),
            u(vm, "share"),
            format!("{:.3} s", u(vm, "device_ns") as f64 / 1e9),
            u(vm, "commands"),
            size(u(vm, "bytes")),
            size(u(vm, "mem_used")),
            quota(&vm["mem_quota"]),
            host,
            cap,
            size(u(vm, "output_bytes")),
            size(u(vm, "output_dropped")),
        );
    }
    if let Some(parked) = status["parked"].as_array().filter(|p| !p.is_empty()) {
        println!("\nsuspended sessions waiting for their guests:");
        for p in parked {
            println!("  VM {} ({})", s(p, "vm"), size(u(p, "snapshot_bytes")));
        }
    }
    let detached = u(status, "detached");
    if detached > 0 {
        println!(
            "\n{detached} session(s) waiting for their guests to connect again after a device reset"
        );
    }
    if sessions.is_empty() {
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
    for se in sessions {
        let api = se
            .get("api_server_pid")
            .and_then(Value::as_u64)
            .map_or_else(|| "-".into(), |p| p.to_string());
        println!(
            "{:>8} {:<16} {:<7} {:<20} {:>9} {:>11} {:>12} {:>12} {:>5} {:>12}",
            u(se, "id"),
            s(se, "vm"),
            s(se, "api"),
            s(se, "process"),
            u(se, "guest_pid"),
            api,
            u(se, "commands"),
            size(u(se, "memory")),
            u(se, "migrations"),
            size(u(se, "output_dropped")),
        );
    }
}

/// `mem-quota=2G` → the `set` request's field.
fn setting(kv: &str) -> anyhow::Result<(&'static str, Value)> {
    let (k, v) = kv
        .split_once('=')
        .with_context(|| format!("`{kv}` is not KEY=VALUE"))?;
    match k {
        "mem-quota" if v == "none" => Ok(("mem_quota", Value::Null)),
        "mem-quota" => {
            let bytes = hira_vhost::config::parse_size(v)?;
            Ok(("mem_quota", json!(bytes)))
        }
        "share" => Ok(("share", json!(hira_vhost::config::parse_share(v)?))),
        "max-sessions" => Ok((
            "max_sessions",
            json!(hira_vhost::config::parse_max_sessions(v)?),
        )),
        "host-mem" if v == "none" => Ok(("host_mem", Value::Null)),
        "host-mem" => Ok(("host_mem", json!(hira_vhost::config::parse_size(v)?))),
        other => {
            bail!("unknown setting `{other}` (known: share, mem-quota, max-sessions, host-mem)")
        }
    }
}

fn top(c: &mut Control, interval: Duration, iterations: Option<u64>) -> anyhow::Result<()> {
    let mut last: Option<(Instant, Value)> = None;
    let mut n = 0u64;
    loop {
        let status = c.ask(&json!({"cmd": "status"}))?;
        let now = Instant::now();
        let mut out = String::from("\x1b[H\x1b[2J");
        out += &format!(
            "hira-vhost: {} live sessions, {} API servers crashed   (every {} ms)\n\n",
            status["sessions"].as_array().map_or(0, Vec::len),
            u(&status, "api_server_crashes"),
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
        let empty = Vec::new();
        let vms = status["vms"].as_array().unwrap_or(&empty);
        // Each VM's part of the device time all VMs used since the last refresh.
        let device_delta = |vm: &Value| -> u64 {
            let before = last.as_ref().and_then(|(_, prev)| {
                prev["vms"]
                    .as_array()
                    .and_then(|a| a.iter().find(|v| s(v, "name") == s(vm, "name")))
                    .map(|b| u(b, "device_ns"))
            });
            u(vm, "device_ns").saturating_sub(before.unwrap_or(u(vm, "device_ns")))
        };
        let device_all: u64 = vms.iter().map(device_delta).sum();
        for vm in vms {
            let name = s(vm, "name");
            let device = if device_all == 0 {
                "-".to_string()
            } else {
                format!("{:.1}", 100.0 * device_delta(vm) as f64 / device_all as f64)
            };
            let (calls, bytes) = match &last {
                Some((t, prev)) => {
                    let secs = now.duration_since(*t).as_secs_f64().max(1e-3);
                    let before = prev["vms"]
                        .as_array()
                        .and_then(|a| a.iter().find(|v| s(v, "name") == name));
                    let d = |key: &str| {
                        let b = before.map_or(0, |b| u(b, key));
                        u(vm, key).saturating_sub(b) as f64 / secs
                    };
                    (
                        format!("{:.0}", d("commands")),
                        format!("{}/s", size(d("bytes") as u64)),
                    )
                }
                None => ("-".into(), "-".into()),
            };
            out += &format!(
                "{:<16} {:>8} {:>6} {:>9} {:>8} {:>10} {:>12} {:>12} {:>12}\n",
                name,
                u(vm, "sessions"),
                u(vm, "share"),
                device,
                s(vm, "decision"),
                calls,
                bytes,
                size(u(vm, "mem_used")),
                quota(&vm["mem_quota"]),
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
fn sessions_of(status: &Value, target: &str) -> anyhow::Result<Vec<u64>> {
    let live = status["sessions"].as_array().cloned().unwrap_or_default();
    if let Ok(id) = target.parse::<u64>() {
        return Ok(vec![id]);
    }
    let ids: Vec<u64> = live
        .iter()
        .filter(|s| s["vm"].as_str() == Some(target))
        .filter_map(|s| s["id"].as_u64())
        .collect();
    if ids.is_empty() {
        bail!("no live session is {target:?} or belongs to a VM of that name");
    }
    Ok(ids)
}

fn migrate(
    c: &mut Control,
    target: &str,
    to: Option<&std::path::Path>,
    device: Option<u32>,
    json: bool,
) -> anyhow::Result<()> {
    let status = c.ask(&json!({"cmd": "status"}))?;
    let mut failed = 0;
    for id in sessions_of(&status, target)? {
        let mut req = json!({"cmd": "migrate", "session": id});
        if let Some(to) = to {
            req["to"] = json!(to.display().to_string());
        }
        if let Some(d) = device {
            req["device"] = json!(d);
        }
        match c.ask(&req) {
            Ok(answer) if json => println!("{answer}"),
            Ok(answer) if to.is_some() => {
                let s = &answer["suspended"];
                println!(
                    "session {id}: suspended here ({}, captured in {:.1} ms) and waiting at {} for its guest",
                    size(u(s, "snapshot_bytes")),
                    s["capture_ms"].as_f64().unwrap_or(0.0),
                    answer["to"].as_str().unwrap_or("?"),
                );
            }
            Ok(answer) => {
                let m = &answer["moved"];
                println!(
                    "session {id}: API server {} -> {}, snapshot {}, paused {:.1} ms (capture {:.1}, restore {:.1})",
                    u(m, "from_pid"),
                    u(m, "to_pid"),
                    size(u(m, "snapshot_bytes")),
                    m["pause_ms"].as_f64().unwrap_or(0.0),
                    m["capture_ms"].as_f64().unwrap_or(0.0),
                    m["restore_ms"].as_f64().unwrap_or(0.0),
                );
            }
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

fn checkpoint(socket: &PathBuf, session: u64, file: &PathBuf) -> anyhow::Result<()> {
    let mut s = UnixStream::connect(socket)
        .with_context(|| format!("cannot reach the control socket {}", socket.display()))?;
    writeln!(s, "{}", json!({"cmd": "checkpoint", "session": session}))?;
    let (_, payload, fds) = hira_protocol::unix::recv_frame_with_fds(&mut s)
        .map_err(|e| anyhow::anyhow!("the daemon's answer: {e}"))?;
    let v: Value = serde_json::from_slice(&payload).context("the daemon's answer is not JSON")?;
    if let Some(e) = v["error"].as_str() {
        bail!("session {session}: not suspended: {e}");
    }
    let susp = &v["suspended"];
    let stored = (|| -> anyhow::Result<()> {
        let snapshot = fds.into_iter().next().context("no snapshot came")?;
        let token: [u8; 16] = hira_vhost::migrate::token_from_hex(s_(susp, "token"))
            .context("the daemon sent no token")?;
        let mut out = std::fs::File::create(file)
            .with_context(|| format!("cannot create {}", file.display()))?;
        let slot: Option<hira_vhost::migrate::VmSlot> =
            serde_json::from_value(susp["slot"].clone()).unwrap_or(None);
        hira_vhost::migrate::file::write_header(&mut out, &token, s_(susp, "vm"), slot)?;
        std::io::copy(&mut std::fs::File::from(snapshot), &mut out)?;
        out.sync_all()?;
        Ok(())
    })();
    let ack = match &stored {
        Ok(()) => json!({"stored": true}),
        Err(e) => json!({"stored": false, "error": format!("{e:#}")}),
    };
    writeln!(s, "{ack}")?;
    let line = hira_vhost::control::read_line_unbuffered(&mut s)?;
    let end: Value = serde_json::from_str(&line)?;
    stored?;
    if let Some(e) = end["error"].as_str() {
        bail!("session {session}: {e}");
    }
    println!(
        "session {session}: suspended into {} ({}, VM {}); `hira-ctl restore {}` resumes it",
        file.display(),
        size(u(susp, "snapshot_bytes")),
        s_(susp, "vm"),
        file.display()
    );
    Ok(())
}

/// `checkpoint VM|all DIR`: each session into DIR/SESSION.hira.
fn checkpoint_all(
    c: &mut Control,
    socket: &PathBuf,
    target: &str,
    dir: &std::path::Path,
) -> anyhow::Result<()> {
    let status = c.ask(&json!({"cmd": "status"}))?;
    let ids: Vec<u64> = if target == "all" {
        status["sessions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["id"].as_u64())
            .collect()
    } else {
        sessions_of(&status, target)?
    };
    std::fs::create_dir_all(dir)?;
    let mut failed = 0;
    for id in ids {
        if let Err(e) = checkpoint(socket, id, &dir.join(format!("{id}.hira"))) {
            eprintln!("{e:#}");
            failed += 1;
        }
    }
    anyhow::ensure!(failed == 0, "{failed} session(s) were not suspended");
    Ok(())
}

fn s_<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str().unwrap_or("")
}

fn restore(socket: &std::path::Path, file: &std::path::Path) -> anyhow::Result<()> {
    let mut f =
        std::fs::File::open(file).with_context(|| format!("cannot open {}", file.display()))?;
    let (token, vm, slot) = hira_vhost::migrate::file::read_header(&mut f)
        .with_context(|| format!("{} is not a session file", file.display()))?;
    let at = std::io::Seek::stream_position(&mut f)?;
    let bytes = f.metadata()?.len().saturating_sub(at);
    let parked = hira_vhost::control::park_at(socket, &vm, &token, slot, bytes, &mut f)
        .map_err(anyhow::Error::msg)?;
    println!(
        "a session of VM {vm} waits for its guest ({})",
        size(u(&parked, "snapshot_bytes"))
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let socket = args
        .socket
        .or_else(|| std::env::var_os("HIRA_CONTROL_SOCKET").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET));
    let mut c = Control::connect(&socket)?;
    match args.cmd {
        Cmd::List { json } => {
            let status = c.ask(&json!({"cmd": "status"}))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                print_list(&status);
            }
        }
        Cmd::Set { vm, settings } => {
            let mut req = json!({"cmd": "set", "vm": vm});
            for kv in &settings {
                let (k, v) = setting(kv)?;
                req[k] = v;
            }
            let answer = c.ask(&req)?;
            let v = &answer["vm"];
            print!(
                "VM {}: share {}, memory {} of quota {}",
                s(v, "name"),
                u(v, "share"),
                size(u(v, "mem_used")),
                quota(&v["mem_quota"])
            );
            match v["host_mem_used"].as_u64() {
                Some(b) => println!(", host memory {} of cap {}", size(b), quota(&v["host_mem"])),
                None => println!(),
            }
        }
        Cmd::Migrate {
            target,
            to,
            to_device,
            json,
        } => migrate(&mut c, &target, to.as_deref(), to_device, json)?,
        Cmd::Checkpoint { target, file } => match target.parse::<u64>() {
            Ok(session) => checkpoint(&socket, session, &file)?,
            Err(_) => checkpoint_all(&mut c, &socket, &target, &file)?,
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
        assert_eq!(
            setting("mem-quota=64M").unwrap(),
            ("mem_quota", json!(64u64 << 20))
        );
        assert_eq!(
            setting("mem-quota=none").unwrap(),
            ("mem_quota", Value::Null)
        );
        assert!(setting("mem-quota=0").is_err());
        assert_eq!(setting("share=3").unwrap(), ("share", json!(3)));
        assert!(setting("share=0").is_err());
        assert!(
            setting("weight=3")
                .unwrap_err()
                .to_string()
                .contains("known")
        );
        assert!(setting("mem-quota").is_err());
    }
}
