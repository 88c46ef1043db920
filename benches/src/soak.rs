//! `hira-bench soak`: a bounded soak of the daemon under well-behaved and hostile
//! guests.
//!
//! One daemon with four VMs (local listeners). For the first half of the run only
//! well-behaved guests run: unmodified C programs looping through Hira, their output
//! compared with the native output, and `rtt` probes for call latency. For the second
//! half, hostile guests of every class the hardening work closes join them. Then
//! everything stops, the daemon is asked (control socket) to report when it is idle,
//! and its threads, descriptors and memory are compared with what it had before.

use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use hira_apis_opencl::{op, tag};
use hira_protocol::frame::HEADER_LEN;
use hira_protocol::handshake::Hello;
use hira_protocol::{FrameHeader, FrameKind, Writer};

use crate::env::{build_components, compile, wait_ready, workspace};

/// VMs the well-behaved guests (and most hostile ones) use.
const VMS: usize = 4;
/// The VM whose listener hostile guests flood with connections: a VM that exhausts
/// its own cap hurts only itself.
const FLOOD_VM: usize = VMS;

/// What a process looks like from /proc.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcUsage {
    pub threads: u64,
    pub fds: u64,
    pub rss_kib: u64,
}

impl ProcUsage {
    /// Field by field, `f` of the two (sum, least, greatest).
    fn combine(self, other: ProcUsage, f: fn(u64, u64) -> u64) -> ProcUsage {
        ProcUsage {
            threads: f(self.threads, other.threads),
            fds: f(self.fds, other.fds),
            rss_kib: f(self.rss_kib, other.rss_kib),
        }
    }

    pub fn of(pid: u32) -> ProcUsage {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0)
        };
        ProcUsage {
            threads: field("Threads:"),
            fds: std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64),
            rss_kib: field("VmRSS:"),
        }
    }
}

/// The daemon's usage once the control connection just used has closed: the least
/// of a few samples.
fn settled(pid: u32) -> ProcUsage {
    let mut least = ProcUsage::of(pid);
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(200));
        let u = ProcUsage::of(pid);
        least = least.combine(u, u64::min);
    }
    least
}

/// Everything one soak run reports.
#[derive(Debug, Default)]
struct Tally {
    runs: AtomicU64,
    wrong: AtomicU64,
    failed: AtomicU64,
    hostile_actions: AtomicU64,
    p99_quiet: Mutex<Vec<f64>>,
    p99_hostile: Mutex<Vec<f64>>,
}

struct Soak {
    programs: PathBuf,
    dir: tempfile::TempDir,
    hira_icd: tempfile::TempDir,
    daemon: Child,
}

impl Drop for Soak {
    fn drop(&mut self) {
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
    }
}

impl Soak {
    fn socket(&self, vm: usize) -> PathBuf {
        self.dir.path().join(format!("vm{vm}.sock"))
    }

    fn control(&self, request: &str) -> Result<String> {
        let mut s = UnixStream::connect(self.dir.path().join("control.sock"))?;
        writeln!(s, "{request}")?;
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(s), &mut line)?;
        Ok(line)
    }

    /// Live API servers: how many, and their threads, descriptors and memory summed.
    fn api_servers(&self) -> (usize, ProcUsage) {
        let Ok(text) = self.control("{\"cmd\":\"status\"}") else {
            return (0, ProcUsage::default());
        };
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        let pids: Vec<u32> = v["sessions"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s["api_server_pid"].as_u64().map(|p| p as u32))
                    .collect()
            })
            .unwrap_or_default();
        let sum = pids.iter().fold(ProcUsage::default(), |sum, &p| {
            sum.combine(ProcUsage::of(p), u64::saturating_add)
        });
        (pids.len(), sum)
    }

    fn guest(&self, vm: usize, program: &str, args: &[&str]) -> Command {
        let mut c = Command::new(self.programs.join(program));
        c.args(args)
            .env("OCL_ICD_VENDORS", self.hira_icd.path())
            .env("HIRA_SOCKET", self.socket(vm))
            .stdin(Stdio::null());
        c
    }
}

fn start(bin: &Path, programs: &Path) -> Result<Soak> {
    let dir = tempfile::tempdir()?;
    let hira_icd = tempfile::tempdir()?;
    std::fs::write(
        hira_icd.path().join("hira.icd"),
        format!("{}\n", bin.join("libhira_opencl.so").display()),
    )?;
    let notify_path = dir.path().join("notify.sock");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path)?;
    notify.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut cmd = Command::new(bin.join("hira-vhost"));
    for vm in 0..=FLOOD_VM {
        cmd.arg("--local-socket").arg(format!(
            "vm{vm}={}",
            dir.path().join(format!("vm{vm}.sock")).display()
        ));
    }
    cmd.arg("--control-socket")
        .arg(dir.path().join("control.sock"))
        .args([
            "--handshake-timeout-ms",
            "2000",
            "--teardown-grace-ms",
            "2000",
        ])
        .args([
            "--max-connections-per-listener",
            "128",
            "--max-sessions-per-vm",
            "48",
        ])
        .env("RUST_LOG", "warn")
        .env("NOTIFY_SOCKET", &notify_path)
        .env_remove("OCL_ICD_VENDORS")
        .stderr(std::fs::File::create(dir.path().join("daemon.log"))?);
    let daemon = cmd.spawn().context("hira-vhost starts")?;
    wait_ready(&notify)?;
    Ok(Soak {
        programs: programs.to_path_buf(),
        dir,
        hira_icd,
        daemon,
    })
}

/// The well-behaved programs: name, arguments, and whether output is compared.
const PROGRAMS: &[(&str, &[&str])] = &[
    ("vecadd", &[]),
    ("matmul", &[]),
    ("stencil", &["300"]),
    ("rtt", &["2000"]),
];

fn native_output(programs: &Path, name: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(programs.join(name)).args(args).output()?;
    ensure!(out.status.success(), "{name} fails natively");
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn rtt_p99(out: &str) -> Option<f64> {
    out.split_whitespace()
        .find_map(|w| w.strip_prefix("sync_p99_ns="))
        .and_then(|v| v.parse::<f64>().ok())
}

fn well_behaved(
    soak: &Soak,
    vm: usize,
    which: usize,
    reference: &str,
    stop: &AtomicBool,
    hostile: &AtomicBool,
    tally: &Tally,
) {
    let (name, args) = PROGRAMS[which];
    while !stop.load(Ordering::Acquire) {
        let out = soak.guest(vm, name, args).output();
        tally.runs.fetch_add(1, Ordering::Relaxed);
        let Ok(out) = out else {
            tally.failed.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            tally.failed.fetch_add(1, Ordering::Relaxed);
            eprintln!(
                "soak: {name} failed in vm{vm} ({}): {} {}",
                out.status,
                text.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
            continue;
        }
        if name == "rtt" {
            if let Some(p) = rtt_p99(&text) {
                let list = if hostile.load(Ordering::Acquire) {
                    &tally.p99_hostile
                } else {
                    &tally.p99_quiet
                };
                list.lock().unwrap_or_else(|e| e.into_inner()).push(p);
            }
        } else if text != reference {
            tally.wrong.fetch_add(1, Ordering::Relaxed);
            eprintln!("soak: {name} in vm{vm} printed a different result:\n{text}");
        }
    }
}

fn hello(s: &mut UnixStream) -> std::io::Result<()> {
    let hello = Hello::new(hira_apis_opencl::API, std::process::id(), "hostile", 0).encode();
    let h = FrameHeader::new(FrameKind::Hello, 0, 0, 0, hello.len());
    s.write_all(&h.encode())?;
    s.write_all(&hello)?;
    let mut hb = [0u8; HEADER_LEN];
    s.read_exact(&mut hb)?;
    let h = FrameHeader::decode(&hb).map_err(std::io::Error::other)?;
    let mut p = vec![0u8; h.len as usize];
    s.read_exact(&mut p)
}

fn request(opcode: u16, channel: u32, call: u64, payload: &[u8]) -> Vec<u8> {
    let mut f = FrameHeader::new(FrameKind::Request, opcode, channel, call, payload.len())
        .encode()
        .to_vec();
    f.extend_from_slice(payload);
    f
}

/// One round of hostile guest `class` against VM `vm`.
fn hostile_round(soak: &Soak, class: usize, vm: usize, stop: &AtomicBool) -> Result<()> {
    let path = soak.socket(vm);
    let pause = |d: Duration| {
        // Hostile guests hold their connections for a while; nothing to wait for.
        let until = Instant::now() + d;
        while Instant::now() < until && !stop.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    match class {
        // Stops reading replies while flooding requests on two threads.
        0 => {
            let mut s = UnixStream::connect(&path)?;
            hello(&mut s)?;
            s.set_nonblocking(true)?;
            let mut w = Writer::new();
            w.u32(1).u8(1).u8(1);
            for i in 0..200_000u64 {
                let f = request(
                    op::clGetPlatformIDs,
                    (i % 2 + 1) as u32,
                    i + 1,
                    w.as_slice(),
                );
                if s.write_all(&f).is_err() {
                    break;
                }
            }
            pause(Duration::from_secs(5));
        }
        // Says nothing, or half a header.
        1 => {
            let _silent = UnixStream::connect(&path)?;
            let mut half = UnixStream::connect(&path)?;
            half.write_all(&[0x48, 0x49, 0x52])?;
            pause(Duration::from_secs(3));
        }
        // Opens connections until refused (on its own VM).
        2 => {
            let path = soak.socket(FLOOD_VM);
            let held: Vec<UnixStream> = (0..160)
                .filter_map(|_| UnixStream::connect(&path).ok())
                .collect();
            pause(Duration::from_secs(2));
            drop(held);
        }
        // Garbage instead of a hello; garbage frames, forged ids and guest bytes for
        // pointers after one.
        3 => {
            let mut g = UnixStream::connect(&path)?;
            let _ = g.write_all(&[0xAB; 256]);
            let mut s = UnixStream::connect(&path)?;
            hello(&mut s)?;
            let mut w = Writer::new();
            w.u64(0xDEAD_BEEF).u32(0x1081).u64(0).u8(0);
            s.write_all(&request(op::clGetContextInfo, 1, 1, w.as_slice()))?;
            let mut w = Writer::new();
            w.u64(77).u32(0).u64(8).u8(tag::INLINE).bytes(&[0x41; 8]);
            s.write_all(&request(op::clSetKernelArg, 1, 2, w.as_slice()))?;
            s.write_all(&request(9999, 1, 3, &[1, 2, 3]))?;
            s.write_all(&[0xFF; 64])?;
            let mut sink = [0u8; 4096];
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
        }
        // A kernel that never ends, then the guest vanishes.
        4 => {
            let mut c = soak
                .guest(vm, "endless", &[])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()?;
            let mut line = [0u8; 9];
            let _ = c.stdout.take().map(|mut o| o.read_exact(&mut line));
            let _ = c.kill();
            let _ = c.wait();
        }
        // A window memfd that could shrink under the host.
        _ => {
            // SAFETY: a NUL-terminated name and valid flags.
            let raw = unsafe { libc::memfd_create(c"soak".as_ptr(), libc::MFD_CLOEXEC) };
            ensure!(raw >= 0, "memfd_create failed");
            // SAFETY: a fresh descriptor nothing else owns.
            let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
            std::fs::File::from(fd.try_clone()?).set_len(1 << 20)?;
            let mut s = UnixStream::connect(&path)?;
            let hello = Hello::new(hira_apis_opencl::API, 1, "unsealed", 1 << 20).encode();
            let h = FrameHeader::new(FrameKind::Hello, 0, 0, 0, hello.len());
            hira_protocol::unix::send_frame_with_fd(&mut s, &h, &hello, Some(&fd))?;
            pause(Duration::from_secs(1));
        }
    }
    Ok(())
}

/// Runs the soak for `seconds` (half quiet, half with hostile guests), with
/// `guests` well-behaved guests; writes a Markdown report to `out`.
pub fn soak(seconds: u64, guests: usize, out: &Path) -> Result<()> {
    let bin = build_components()?;
    let programs = workspace().join("target/hira-bench/soak-programs");
    std::fs::create_dir_all(&programs)?;
    for name in ["vecadd", "matmul", "stencil", "rtt", "endless"] {
        compile(
            &workspace().join(format!("tests/c/{name}.c")),
            &programs.join(name),
        )?;
    }
    let references: Vec<String> = PROGRAMS
        .iter()
        .map(|(n, a)| native_output(&programs, n, a))
        .collect::<Result<_>>()?;
    let soak = Arc::new(start(&bin, &programs)?);
    let daemon = soak.daemon.id();
    let at_launch = ProcUsage::of(daemon);
    // Warm-up: every program once on every VM and one round of every hostile class,
    // so that what the daemon allocates once (per-VM state, logger, records of ended
    // sessions) is in the baseline; then wait until it is idle.
    let never = AtomicBool::new(false);
    for vm in 0..VMS {
        for (name, args) in PROGRAMS {
            let out = soak.guest(vm, name, args).output()?;
            ensure!(
                out.status.success(),
                "{name} fails through Hira in the warm-up"
            );
        }
    }
    for class in 0..6 {
        let _ = hostile_round(&soak, class, 0, &never);
    }
    let idle = soak.control("{\"cmd\":\"wait_idle\",\"timeout_ms\":120000}")?;
    ensure!(
        idle.contains("\"reached\":true"),
        "the daemon did not become idle: {idle}"
    );
    let at_start = settled(daemon);
    let stop = Arc::new(AtomicBool::new(false));
    let hostile = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let mut threads = Vec::new();
    for g in 0..guests {
        let (soak, stop, hostile, tally) =
            (soak.clone(), stop.clone(), hostile.clone(), tally.clone());
        let which = g % PROGRAMS.len();
        let reference = references[which].clone();
        threads.push(std::thread::spawn(move || {
            well_behaved(&soak, g % VMS, which, &reference, &stop, &hostile, &tally)
        }));
    }
    let half = Duration::from_secs(seconds / 2);
    let started = Instant::now();
    while started.elapsed() < half {
        std::thread::sleep(Duration::from_secs(1));
    }
    let mut peak = ProcUsage::of(daemon);
    let mut servers_peak = (0usize, ProcUsage::default());
    hostile.store(true, Ordering::Release);
    let stop_hostile = Arc::new(AtomicBool::new(false));
    let mut hostiles = Vec::new();
    for class in 0..6 {
        let (soak, stop_h, tally) = (soak.clone(), stop_hostile.clone(), tally.clone());
        hostiles.push(std::thread::spawn(move || {
            let mut round = 0usize;
            while !stop_h.load(Ordering::Acquire) {
                let _ = hostile_round(&soak, class, round % VMS, &stop_h);
                tally.hostile_actions.fetch_add(1, Ordering::Relaxed);
                round += 1;
            }
        }));
    }
    while started.elapsed() < half * 2 {
        std::thread::sleep(Duration::from_secs(1));
        let now = ProcUsage::of(daemon);
        let servers = soak.api_servers();
        if servers.1.rss_kib > servers_peak.1.rss_kib {
            servers_peak = servers;
        }
        peak = peak.combine(now, u64::max);
    }
    stop_hostile.store(true, Ordering::Release);
    stop.store(true, Ordering::Release);
    for t in hostiles.into_iter().chain(threads) {
        let _ = t.join();
    }
    let idle = soak.control("{\"cmd\":\"wait_idle\",\"timeout_ms\":120000}")?;
    ensure!(
        idle.contains("\"reached\":true"),
        "the daemon did not become idle: {idle}"
    );
    let at_end = settled(daemon);
    let servers_end = soak.api_servers();
    let status = soak.control("{\"cmd\":\"status\"}")?;
    let crashes = status
        .split("\"api_server_crashes\":")
        .nth(1)
        .and_then(|v| v.split(|c: char| !c.is_ascii_digit()).next())
        .unwrap_or("?")
        .to_string();
    let med = |v: &Mutex<Vec<f64>>| {
        let mut v = v.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if v.is_empty() {
            return f64::NAN;
        }
        crate::median(&mut v) / 1000.0
    };
    let report = format!(
        "## Soak: {seconds} s, {guests} well-behaved guests on {VMS} VMs, 6 hostile classes in the second half (connection floods on a fifth VM)\n\n\
         | measure | value |\n|---|---|\n\
         | well-behaved program runs | {} |\n\
         | runs that failed | {} |\n\
         | runs with output different from native | {} |\n\
         | hostile guest rounds | {} |\n\
         | API servers that crashed | {crashes} |\n\
         | sync call p99 (µs), median over `rtt` runs, quiet half | {:.1} |\n\
         | sync call p99 (µs), median over `rtt` runs, with hostile guests | {:.1} |\n\n\
         | daemon | threads | fds | RSS (MiB) |\n|---|---|---|---|\n\
         | launched | {} | {} | {:.1} |\n\
         | start (idle after a warm-up round) | {} | {} | {:.1} |\n\
         | peak | {} | {} | {:.1} |\n\
         | end (idle, hostile guests gone) | {} | {} | {:.1} |\n\n\
         | API servers | count | threads | fds | RSS (MiB) |\n|---|---|---|---|---|\n\
         | largest sample during the hostile half (sum) | {} | {} | {} | {:.1} |\n\
         | end | {} | {} | {} | {:.1} |\n",
        tally.runs.load(Ordering::Relaxed),
        tally.failed.load(Ordering::Relaxed),
        tally.wrong.load(Ordering::Relaxed),
        tally.hostile_actions.load(Ordering::Relaxed),
        med(&tally.p99_quiet),
        med(&tally.p99_hostile),
        at_launch.threads,
        at_launch.fds,
        at_launch.rss_kib as f64 / 1024.0,
        at_start.threads,
        at_start.fds,
        at_start.rss_kib as f64 / 1024.0,
        peak.threads,
        peak.fds,
        peak.rss_kib as f64 / 1024.0,
        at_end.threads,
        at_end.fds,
        at_end.rss_kib as f64 / 1024.0,
        servers_peak.0,
        servers_peak.1.threads,
        servers_peak.1.fds,
        servers_peak.1.rss_kib as f64 / 1024.0,
        servers_end.0,
        servers_end.1.threads,
        servers_end.1.fds,
        servers_end.1.rss_kib as f64 / 1024.0,
    );
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(out, &report)?;
    println!("{report}");
    ensure!(
        tally.failed.load(Ordering::Relaxed) == 0 && tally.wrong.load(Ordering::Relaxed) == 0,
        "well-behaved guests failed"
    );
    Ok(())
}
