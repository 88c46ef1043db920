//! The round trip of a synchronous no-op call, the cost of an asynchronously forwarded
//! call, this machine's floor for a socket round trip, and the slowdown of a stencil
//! that launches a kernel and waits for it, iteration after iteration: natively,
//! through Hira on the shared-memory rings, and relayed by the daemon
//! (`HIRA_RINGS=0`). Then the daemon's CPU time per call as payloads grow, bulk
//! transfer bandwidth against `memcpy`, and the round trip with 1 to 16 guests
//! calling at once.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::env::{BenchEnv, build_components, compile, workspace};
use crate::{median, min_max};

/// How a program reaches the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Native,
    /// Through Hira on the shared-memory data plane (the default).
    Rings,
    /// Through Hira with every frame relayed by the daemon (`HIRA_RINGS=0`).
    Relay,
}

/// Runs `exe` on `side`; returns its stdout and wall time.
fn run(env: &BenchEnv, side: Side, exe: &Path, args: &[String]) -> Result<(String, Duration)> {
    let mut cmd = env.command(side != Side::Native, exe, args);
    if side == Side::Relay {
        cmd.env("HIRA_RINGS", "0");
    }
    let t0 = Instant::now();
    let out = cmd.output()?;
    let dt = t0.elapsed();
    if !out.status.success() {
        bail!(
            "{} failed ({side:?}): {}",
            exe.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok((String::from_utf8_lossy(&out.stdout).into_owned(), dt))
}

/// Reads `key=value` from a program's output line.
pub fn field(out: &str, key: &str) -> Result<f64> {
    out.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .with_context(|| format!("no {key} in {out:?}"))?
        .parse()
        .with_context(|| format!("bad {key} in {out:?}"))
}

/// The machine's floor for one round trip between two parties that sleep while they
/// wait: a 32-byte ping-pong over a Unix socket pair between two threads. Median ns.
pub fn socket_ping_pong(rounds: usize) -> Result<f64> {
    let (mut a, mut b) = std::os::unix::net::UnixStream::pair()?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let mut buf = [0u8; 32];
        for _ in 0..rounds {
            b.read_exact(&mut buf)?;
            b.write_all(&buf)?;
        }
        Ok(())
    });
    let mut buf = [0u8; 32];
    let mut t = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t0 = Instant::now();
        a.write_all(&buf)?;
        a.read_exact(&mut buf)?;
        t.push(t0.elapsed().as_nanos() as f64);
    }
    echo.join()
        .map_err(|_| anyhow::anyhow!("echo thread panicked"))??;
    Ok(median(&mut t))
}

/// The CPUs this thread may run on, and the set itself (to restore it later).
fn allowed_cpus() -> Result<(Vec<usize>, libc::cpu_set_t)> {
    // SAFETY: fills a local set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    ensure!(
        r == 0,
        "sched_getaffinity: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: each `c` is below CPU_SETSIZE.
    let cpus = (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect();
    Ok((cpus, set))
}

/// A new eventfd, counter at zero.
fn eventfd() -> Result<std::os::fd::OwnedFd> {
    // SAFETY: a plain system call.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    ensure!(fd >= 0, "eventfd: {}", std::io::Error::last_os_error());
    // SAFETY: a new descriptor that nothing else owns.
    Ok(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// Pins the calling thread to `cpu` (best effort: a measurement, not a guarantee).
fn pin_to(cpu: usize) {
    // SAFETY: an empty set with one CPU below CPU_SETSIZE added, then a system call.
    unsafe {
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut one);
        libc::sched_setaffinity(0, std::mem::size_of_val(&one), &one);
    }
}

/// The machine's floor for one round trip between two threads that share one core,
/// as a guest and its API server do once the host has more busy threads than cores:
/// two threads pinned to the same CPU pass a turn back and forth, each waiting by
/// yielding the CPU (`sleep` false) or by sleeping on an eventfd the other writes.
/// Mean ns per round trip.
pub fn one_core_hand_off(rounds: u32, sleep: bool) -> Result<f64> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    let cpu = *allowed_cpus()?.0.first().context("no CPU to run on")?;
    let fds = [eventfd()?, eventfd()?];
    let raw: Vec<i32> = fds.iter().map(std::os::fd::AsRawFd::as_raw_fd).collect();
    // Whose turn it is: 0 or 1.
    let turn = Arc::new(AtomicU32::new(0));
    let side = move |me: u32, turn: Arc<AtomicU32>| {
        pin_to(cpu);
        let start = Instant::now();
        for _ in 0..rounds {
            while turn.load(Ordering::Acquire) != me {
                if sleep {
                    let mut v = 0u64;
                    // SAFETY: reads 8 bytes into a local from an eventfd kept open.
                    unsafe { libc::read(raw[me as usize], (&raw mut v).cast(), 8) };
                } else {
                    std::thread::yield_now();
                }
            }
            turn.store(1 - me, Ordering::Release);
            if sleep {
                let v = 1u64;
                // SAFETY: writes 8 bytes from a local to an eventfd kept open.
                unsafe { libc::write(raw[1 - me as usize], (&raw const v).cast(), 8) };
            }
        }
        start.elapsed()
    };
    let other = {
        let turn = turn.clone();
        let side = side.clone();
        std::thread::spawn(move || side(1, turn))
    };
    let took = std::thread::spawn(move || side(0, turn))
        .join()
        .map_err(|_| anyhow::anyhow!("hand-off thread panicked"))?;
    other
        .join()
        .map_err(|_| anyhow::anyhow!("hand-off thread panicked"))?;
    drop(fds);
    Ok(took.as_nanos() as f64 / f64::from(rounds))
}

/// The machine's cost of waking a thread asleep on an idle CPU, which every hop that
/// sleeps pays (a PoCL worker woken for a command, a side of a call that stopped
/// spinning): one thread sleeps on an eventfd, pinned to one CPU; another, pinned to a
/// second CPU and polling between rounds so that its own CPU never idles, waits until
/// the first CPU has been idle for `idle` and writes the eventfd. Median ns from the
/// write to the sleeper running; `None` with fewer than two CPUs to pin to. On a
/// virtual machine a halted virtual CPU must be scheduled again by the hypervisor
/// (tens of microseconds where the guest kernel does not poll before it halts).
pub fn idle_cpu_wake(rounds: usize, idle: Duration) -> Result<Option<f64>> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let (cpus, set) = allowed_cpus()?;
    let &[waker_cpu, sleeper_cpu, ..] = cpus.as_slice() else {
        return Ok(None);
    };
    let fd = eventfd()?;
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    let epoch = Instant::now();
    // When the last write went out, and how many rounds the sleeper has seen (the
    // waker writes again only after the sleeper has taken the last one).
    let sent = Arc::new(AtomicU64::new(0));
    let seen = Arc::new(AtomicU64::new(0));
    let sleeper = {
        let (sent, seen) = (sent.clone(), seen.clone());
        std::thread::spawn(move || -> Vec<f64> {
            pin_to(sleeper_cpu);
            let mut t = Vec::with_capacity(rounds);
            for i in 0..rounds {
                let mut v = 0u64;
                // SAFETY: reads 8 bytes into a local from an eventfd kept open.
                while unsafe { libc::read(raw, (&raw mut v).cast(), 8) } != 8 {}
                let now = epoch.elapsed().as_nanos() as u64;
                t.push(now.saturating_sub(sent.load(Ordering::Acquire)) as f64);
                seen.store(i as u64 + 1, Ordering::Release);
            }
            t
        })
    };
    pin_to(waker_cpu);
    for i in 0..rounds as u64 {
        while seen.load(Ordering::Acquire) < i {
            std::hint::spin_loop();
        }
        let quiet = Instant::now();
        while quiet.elapsed() < idle {
            std::hint::spin_loop();
        }
        sent.store(epoch.elapsed().as_nanos() as u64, Ordering::Release);
        let v = 1u64;
        // SAFETY: writes 8 bytes from a local to an eventfd kept open.
        unsafe { libc::write(raw, (&raw const v).cast(), 8) };
    }
    let mut t = sleeper
        .join()
        .map_err(|_| anyhow::anyhow!("sleeping thread panicked"))?;
    // The waker's own affinity goes back to every CPU it had.
    // SAFETY: restores the set read above.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    drop(fd);
    Ok(Some(median(&mut t)))
}

/// CPU time all the machine's CPUs have spent busy since boot (`/proc/stat`).
fn machine_busy() -> Result<Duration> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let cpu = stat.lines().next().context("empty /proc/stat")?;
    let f = cpu
        .split_whitespace()
        .skip(1)
        .map(str::parse::<u64>)
        .collect::<std::result::Result<Vec<_>, _>>()?;
    ensure!(f.len() >= 8, "short cpu line in /proc/stat: {cpu}");
    // user nice system idle iowait irq softirq steal: all but idle and iowait.
    let ticks = f[0] + f[1] + f[2] + f[5] + f[6] + f[7];
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Ok(Duration::from_nanos(ticks * 1_000_000_000 / hz))
}

/// What `n` guests calling at once measured.
#[derive(Clone, Copy, Default)]
struct Concurrent {
    /// The median of the guests' median synchronous round trips (µs).
    rtt_us: f64,
    /// Calls per second, all guests together.
    calls_per_s: f64,
    /// The whole machine's busy CPU time per call (µs): the guests, their API
    /// servers, the daemon and anything else that ran.
    cpu_per_call_us: f64,
}

/// Runs `n` copies of the round-trip program on `side`, set up first and then
/// released together (each prints `ready` and waits for a line), so that all of
/// them call at once.
fn concurrent_rtt(
    env: &BenchEnv,
    side: Side,
    exe: &Path,
    n: usize,
    calls: u32,
) -> Result<Concurrent> {
    use std::io::{BufRead, BufReader};
    let mut children = (0..n)
        .map(|_| {
            let mut cmd = env.command(
                side != Side::Native,
                exe,
                &[calls.to_string(), "sync".to_string(), "barrier".to_string()],
            );
            if side == Side::Relay {
                cmd.env("HIRA_RINGS", "0");
            }
            cmd.stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .context("rtt starts")
        })
        .collect::<Result<Vec<_>>>()?;
    let mut outs = Vec::with_capacity(n);
    for c in &mut children {
        let mut out = BufReader::new(c.stdout.take().context("rtt's stdout")?);
        let mut line = String::new();
        out.read_line(&mut line)?;
        ensure!(
            line == "ready\n",
            "rtt did not get ready ({side:?}): {line:?}"
        );
        outs.push(out);
    }
    let (busy, start) = (machine_busy()?, std::time::Instant::now());
    for c in &mut children {
        c.stdin.take().context("rtt's stdin")?.write_all(b"go\n")?;
    }
    let mut medians = Vec::with_capacity(n);
    for (c, mut out) in children.into_iter().zip(outs) {
        let mut o = String::new();
        out.read_to_string(&mut o)?;
        let status = c.wait_with_output()?.status;
        ensure!(status.success(), "a concurrent rtt failed ({side:?})");
        medians.push(field(&o, "sync_median_ns")? / 1e3);
    }
    let (wall, busy) = (start.elapsed(), machine_busy()?.saturating_sub(busy));
    let total = f64::from(calls) * n as f64;
    Ok(Concurrent {
        rtt_us: median(&mut medians),
        calls_per_s: total / wall.as_secs_f64(),
        cpu_per_call_us: busy.as_secs_f64() * 1e6 / total,
    })
}

/// Measures and prints the overhead table, and writes it as JSON to `json`.
pub fn overhead(repeats: usize, iterations: u32, calls: u32, json: &Path) -> Result<()> {
    ensure!(repeats > 0, "--repeats must be at least 1");
    let bin = build_components()?;
    let cdir = tempfile::tempdir()?;
    let c = |name: &str| -> Result<PathBuf> {
        let exe = cdir.path().join(name);
        compile(&workspace().join("tests/c").join(format!("{name}.c")), &exe)?;
        Ok(exe)
    };
    let (rtt, stencil, payload, bandwidth) =
        (c("rtt")?, c("stencil")?, c("payload")?, c("bandwidth")?);
    let mut env = BenchEnv::start(&bin)?;
    let calls_arg = [calls.to_string()];
    let iters_arg = [iterations.to_string()];
    // Warm-up: PoCL's kernel cache, page cache, the daemon's first spawn.
    let sides = [Side::Native, Side::Rings, Side::Relay];
    for side in sides {
        run(&env, side, &rtt, &["1000".into()])?;
        run(&env, side, &stencil, &["10".into()])?;
    }
    // Per side: sync median, sync p99, async mean, stencil seconds, blocking 4-byte
    // write median, empty kernel + clFinish median.
    let mut m: [[Vec<f64>; 6]; 3] = Default::default();
    let mut floor = vec![];
    let mut stencil_out = None;
    for i in 0..repeats {
        eprint!("\r\x1b[2Krepeat {}/{repeats}", i + 1);
        for (k, side) in sides.into_iter().enumerate() {
            let (o, _) = run(&env, side, &rtt, &calls_arg)?;
            m[k][0].push(field(&o, "sync_median_ns")? / 1e3);
            m[k][1].push(field(&o, "sync_p99_ns")? / 1e3);
            m[k][2].push(field(&o, "async_mean_ns")? / 1e3);
            m[k][4].push(field(&o, "write4_median_ns")? / 1e3);
            m[k][5].push(field(&o, "kernel_finish_median_ns")? / 1e3);
            let (o, t) = run(&env, side, &stencil, &iters_arg)?;
            let first = stencil_out.get_or_insert_with(|| o.clone());
            ensure!(
                *first == o,
                "stencil output differs ({side:?}):\n{first}\n{o}"
            );
            m[k][3].push(t.as_secs_f64());
        }
        floor.push(socket_ping_pong(calls as usize)? / 1e3);
    }
    eprint!("\r\x1b[2K");
    let ratio = |k: usize| -> (f64, f64, f64) {
        let mut r: Vec<f64> = m[k][3].iter().zip(&m[0][3]).map(|(h, n)| h / n).collect();
        let (lo, hi) = min_max(&r);
        (median(&mut r), lo, hi)
    };
    let med = |k: usize, j: usize| median(&mut m[k][j].clone());
    let rows = [
        (
            "sync no-op call, median (us)",
            [med(0, 0), med(1, 0), med(2, 0)],
        ),
        (
            "sync no-op call, p99 (us)",
            [med(0, 1), med(1, 1), med(2, 1)],
        ),
        (
            "async call (clSetKernelArg), mean (us)",
            [med(0, 2), med(1, 2), med(2, 2)],
        ),
        (
            "blocking 4-byte write, median (us)",
            [med(0, 4), med(1, 4), med(2, 4)],
        ),
        (
            "empty kernel + clFinish, median (us)",
            [med(0, 5), med(1, 5), med(2, 5)],
        ),
        ("stencil wall time (s)", [med(0, 3), med(1, 3), med(2, 3)]),
    ];
    let floor = median(&mut floor);
    println!(
        "| measure | native | Hira (rings) | Hira (relayed, HIRA_RINGS=0) |\n|---|---|---|---|"
    );
    for (name, v) in &rows {
        println!("| {name} | {:.2} | {:.2} | {:.2} |", v[0], v[1], v[2]);
    }
    println!("| machine floor: socket ping-pong between two threads (us) | {floor:.2} | - | - |");
    // Native's own figure moves from repeat to repeat (PoCL's worker wake-up): the
    // difference within a repeat shows what Hira adds.
    let mut added: Vec<f64> = m[1][5].iter().zip(&m[0][5]).map(|(h, n)| h - n).collect();
    let (added_lo, added_hi) = min_max(&added);
    let added_kernel = median(&mut added);
    println!(
        "\nempty kernel + clFinish, Hira (rings) minus native in the same repeat: median {added_kernel:.2} us (min {added_lo:.2}, max {added_hi:.2})"
    );
    let (rr, rr_lo, rr_hi) = ratio(1);
    let (rl, rl_lo, rl_hi) = ratio(2);
    println!(
        "\nstencil ({iterations} launches, clFinish after each), Hira/native: rings {rr:.2} (min {rr_lo:.2}, max {rr_hi:.2}), relayed {rl:.2} (min {rl_lo:.2}, max {rl_hi:.2}); {repeats} repeats"
    );
    // The daemon's CPU time per call as payloads grow: blocking writes with their
    // data inline in the frames (no window spans), on rings and relayed. A run's
    // daemon CPU includes the session's start and end (the handshake, starting the
    // API server): the cost per call is the difference between a long and a short
    // run, per call more.
    env.hira_env = vec![("HIRA_INLINE_MAX".into(), "1073741824".into())];
    let (short_calls, daemon_calls) = (1000u32, 5000u32);
    let mut daemon_us = Vec::new();
    for size in [16usize, 64 * 1024] {
        let mut row = [0f64; 2];
        for (k, side) in [Side::Rings, Side::Relay].into_iter().enumerate() {
            let mut per_call = Vec::new();
            for _ in 0..repeats {
                let mut used = [Duration::ZERO; 2];
                for (u, calls) in used.iter_mut().zip([short_calls, daemon_calls]) {
                    let before = env.daemon_cpu()?;
                    run(&env, side, &payload, &[calls.to_string(), size.to_string()])?;
                    *u = env.daemon_cpu()?.saturating_sub(before);
                }
                let extra = used[1].as_secs_f64() - used[0].as_secs_f64();
                per_call.push(extra * 1e6 / f64::from(daemon_calls - short_calls));
            }
            row[k] = median(&mut per_call);
        }
        daemon_us.push((size, row));
    }
    println!(
        "\ndaemon CPU per call (blocking writes, data inline; the daemon's process CPU clock for a run of {daemon_calls} calls less one of {short_calls}, per call more; median of {repeats})\n\n| payload per call | Hira (rings) (us) | Hira (relayed) (us) |\n|---|---|---|"
    );
    for (size, row) in &daemon_us {
        println!("| {size} B | {:.2} | {:.2} |", row[0], row[1]);
    }
    env.hira_env.clear();
    // Bulk transfers: blocking writes (then clFinish) and reads of one buffer, against
    // memcpy between two buffers of the same size in the same process.
    let mut bulk = Vec::new();
    for mib in [16usize, 64, 256] {
        // memcpy, native write, native read, Hira write, Hira read (MiB/s), then
        // Hira's write and read as shares of the memcpy of their own run (the
        // machine's copy bandwidth moves from run to run; a share within one
        // process does not move with it).
        let mut v: [Vec<f64>; 7] = Default::default();
        for _ in 0..repeats {
            for (k, side) in [Side::Native, Side::Rings].into_iter().enumerate() {
                let (o, _) = run(&env, side, &bandwidth, &[mib.to_string(), "5".into()])?;
                ensure!(field(&o, "ok")? == 1.0, "bandwidth data differs ({side:?})");
                let memcpy = field(&o, "memcpy_mibs")?;
                let (write, read) = (field(&o, "write_mibs")?, field(&o, "read_mibs")?);
                v[0].push(memcpy);
                v[1 + 2 * k].push(write);
                v[2 + 2 * k].push(read);
                if side == Side::Rings {
                    v[5].push(write / memcpy);
                    v[6].push(read / memcpy);
                }
            }
        }
        bulk.push((mib, v.map(|mut x| median(&mut x))));
    }
    println!(
        "
bulk transfers (blocking write + clFinish, blocking read; MiB/s, median of 5 after one unmeasured, median of {repeats} runs; the share of memcpy is the median of each run's share of its own memcpy)\n\n| size | memcpy | native write | Hira write | native read | Hira read |\n|---|---|---|---|---|---|"
    );
    for (mib, b) in &bulk {
        println!(
            "| {mib} MiB | {:.0} | {:.0} | {:.0} ({:.0}% of memcpy) | {:.0} | {:.0} ({:.0}% of memcpy) |",
            b[0],
            b[1],
            b[3],
            100.0 * b[5],
            b[2],
            b[4],
            100.0 * b[6]
        );
    }
    // Concurrent guests: the synchronous round trip as 1 to 16 processes call at
    // once (each its own session and API server through Hira).
    // Each guest calls long enough for the machine's CPU ticks (10 ms) to measure.
    let concurrent_calls = 50_000;
    let mut concurrency = Vec::new();
    for n in [1usize, 2, 4, 8, 16] {
        let mut row = [Concurrent::default(); 2];
        for (k, side) in [Side::Native, Side::Rings].into_iter().enumerate() {
            let mut v: [Vec<f64>; 3] = Default::default();
            for _ in 0..repeats.min(3) {
                let c = concurrent_rtt(&env, side, &rtt, n, concurrent_calls)?;
                v[0].push(c.rtt_us);
                v[1].push(c.calls_per_s);
                v[2].push(c.cpu_per_call_us);
            }
            row[k] = Concurrent {
                rtt_us: median(&mut v[0]),
                calls_per_s: median(&mut v[1]),
                cpu_per_call_us: median(&mut v[2]),
            };
        }
        concurrency.push((n, row));
    }
    println!(
        "\nsync no-op call with concurrent guests, released together ({concurrent_calls} calls each; median of {} runs; {} cores)\n\n| guests | native round trip (us) | Hira round trip (us) | Hira calls/s, all guests | Hira machine CPU per call (us) |\n|---|---|---|---|---|",
        repeats.min(3),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    for (n, row) in &concurrency {
        println!(
            "| {n} | {:.2} | {:.2} | {:.0} | {:.2} |",
            row[0].rtt_us, row[1].rtt_us, row[1].calls_per_s, row[1].cpu_per_call_us
        );
    }
    // What a call costs at least once its two sides share a core.
    let mut hand_off: [Vec<f64>; 2] = Default::default();
    for _ in 0..repeats {
        for (k, sleep) in [false, true].into_iter().enumerate() {
            hand_off[k].push(one_core_hand_off(50_000, sleep)? / 1e3);
        }
    }
    let (yield_us, eventfd_us) = (median(&mut hand_off[0]), median(&mut hand_off[1]));
    println!(
        "\nmachine floor once a call's two sides share a core (two threads pinned to one CPU passing a turn, median of {repeats}): {yield_us:.2} us a round trip yielding to each other, {eventfd_us:.2} us sleeping on eventfds"
    );
    let idle_wake = idle_cpu_wake(2_000, Duration::from_micros(200))?.map(|ns| ns / 1e3);
    if let Some(us) = idle_wake {
        println!(
            "machine floor for a hop that sleeps (a thread asleep on an idle CPU woken from another, median of 2,000): {us:.2} us"
        );
    }
    if let Some(d) = json.parent() {
        std::fs::create_dir_all(d)?;
    }
    let concurrency_json: Vec<String> = concurrency
        .iter()
        .map(|(n, row)| {
            format!(
                "{{\"guests\":{n},\"native_us\":{:.3},\"rings_us\":{:.3},\"rings_calls_per_s\":{:.0},\"rings_cpu_per_call_us\":{:.3}}}",
                row[0].rtt_us, row[1].rtt_us, row[1].calls_per_s, row[1].cpu_per_call_us
            )
        })
        .collect();
    let daemon_json: Vec<String> = daemon_us
        .iter()
        .map(|(size, row)| {
            format!(
                "{{\"payload\":{size},\"rings_us\":{:.3},\"relayed_us\":{:.3}}}",
                row[0], row[1]
            )
        })
        .collect();
    let bulk_json: Vec<String> = bulk
        .iter()
        .map(|(mib, b)| {
            format!(
                "{{\"mib\":{mib},\"memcpy_mibs\":{:.1},\"native_write_mibs\":{:.1},\"native_read_mibs\":{:.1},\"hira_write_mibs\":{:.1},\"hira_read_mibs\":{:.1},\"hira_write_share\":{:.3},\"hira_read_share\":{:.3}}}",
                b[0], b[1], b[2], b[3], b[4], b[5], b[6]
            )
        })
        .collect();
    let trio = |v: &[f64; 3]| {
        format!(
            "{{\"native\":{:.3},\"rings\":{:.3},\"relayed\":{:.3}}}",
            v[0], v[1], v[2]
        )
    };
    std::fs::write(
        json,
        format!(
            "{{\"repeats\":{repeats},\"sync_rtt_us\":{},\"sync_p99_us\":{},\"async_call_us\":{},\"write4_us\":{},\"kernel_finish_us\":{},\"kernel_finish_added_us\":{added_kernel:.3},\"floor_ping_pong_us\":{floor:.3},\"stencil\":{{\"iterations\":{iterations},\"seconds\":{},\"ratio_rings\":{rr:.3},\"ratio_relayed\":{rl:.3}}},\"daemon_cpu_per_call\":[{}],\"concurrent_sync_rtt\":[{}],\"one_core_hand_off_us\":{{\"yield\":{yield_us:.3},\"eventfd\":{eventfd_us:.3}}},\"idle_cpu_wake_us\":{},\"bulk\":[{}]}}\n",
            trio(&rows[0].1),
            trio(&rows[1].1),
            trio(&rows[2].1),
            trio(&rows[3].1),
            trio(&rows[4].1),
            trio(&rows[5].1),
            daemon_json.join(","),
            concurrency_json.join(","),
            idle_wake.map_or_else(|| "null".to_string(), |us| format!("{us:.3}")),
            bulk_json.join(","),
        ),
    )?;
    eprintln!("wrote {}", json.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_by_key() {
        assert_eq!(
            field("a=1 sync_median_ns=2500 b=3", "sync_median_ns").unwrap(),
            2500.0
        );
        assert!(field("a=1", "missing").is_err());
    }

    #[test]
    fn an_idle_cpu_wake_is_timed_for_every_round() {
        // Each round waits for the sleeper to take the last: a lost wake-up hangs.
        match idle_cpu_wake(200, Duration::from_micros(50)).unwrap() {
            Some(ns) => {
                eprintln!("{ns:.0} ns to wake a thread on an idle CPU");
                assert!(ns.is_finite() && ns > 0.0);
            }
            None => assert!(std::thread::available_parallelism().map_or(1, |n| n.get()) < 2),
        }
    }

    #[test]
    fn a_hand_off_on_one_core_passes_every_turn_both_ways() {
        // Each side waits for its turn 5,000 times: a lost turn or wake-up hangs.
        for sleep in [false, true] {
            let ns = one_core_hand_off(5_000, sleep).unwrap();
            eprintln!("sleep={sleep}: {ns:.0} ns a round trip");
            assert!(ns.is_finite() && ns > 0.0);
        }
    }
}
