//! `hira-bench`: measures what remoting through Hira costs, against native OpenCL in
//! the same run, alternating native and remote runs so that machine noise hits both.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use clap::{Parser, Subcommand};

/// Hira's benchmark harness.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Round trip of a synchronous no-op call and the slowdown of a stencil that
    /// launches a kernel and waits for it, iteration after iteration.
    Overhead {
        /// Measured repeats of each program, native and remote alternating.
        #[arg(long, default_value_t = 5)]
        repeats: usize,
        /// Stencil iterations (kernel launches, each followed by clFinish).
        #[arg(long, default_value_t = 1000)]
        iterations: u32,
        /// Synchronous calls timed per round-trip run.
        #[arg(long, default_value_t = 20000)]
        calls: u32,
        /// Where to write the JSON results.
        #[arg(long, default_value = "target/hira-bench/overhead.json")]
        json: PathBuf,
    },
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("benches/ is inside the workspace")
        .to_path_buf()
}

/// The daemon, API server and shim of the same profile as this binary.
fn build_components() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .context("executable has a directory")?
        .to_path_buf();
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace()).args([
        "build",
        "-q",
        "-p",
        "hira-vhost",
        "-p",
        "hira-api-server",
        "-p",
        "hira-opencl",
    ]);
    if dir.ends_with("release") {
        cmd.arg("--release");
    } else {
        eprintln!("warning: not a release build; run with `cargo run --release`");
    }
    ensure!(cmd.status()?.success(), "building Hira failed");
    Ok(dir)
}

fn compile(out: &Path, name: &str) -> Result<PathBuf> {
    let exe = out.join(name);
    let src = workspace().join("tests/c").join(format!("{name}.c"));
    let st = Command::new("gcc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(["-lOpenCL", "-lpthread"])
        .status()?;
    ensure!(st.success(), "gcc {name}.c failed");
    Ok(exe)
}

struct Env {
    native: tempfile::TempDir,
    hira: tempfile::TempDir,
    socket: PathBuf,
    daemon: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
    }
}

fn setup(bin: &Path) -> Result<Env> {
    let native = tempfile::tempdir()?;
    for e in std::fs::read_dir("/etc/OpenCL/vendors").context("no /etc/OpenCL/vendors")? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "icd")
            && !std::fs::read_to_string(&p)?.contains("hira")
        {
            std::fs::copy(&p, native.path().join(p.file_name().unwrap()))?;
        }
    }
    let hira = tempfile::tempdir()?;
    std::fs::write(
        hira.path().join("hira.icd"),
        format!("{}\n", bin.join("libhira_opencl.so").display()),
    )?;
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("bench.sock");
    let daemon = Command::new(bin.join("hira-vhost"))
        .arg("--local-socket")
        .arg(format!("bench={}", socket.display()))
        .env("RUST_LOG", "warn")
        .env_remove("OCL_ICD_VENDORS")
        .stderr(Stdio::null())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        ensure!(Instant::now() < deadline, "hira-vhost did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Env {
        native,
        hira,
        socket,
        daemon,
        _dir: dir,
    })
}

/// Runs `exe` natively or through Hira; returns its stdout and wall time.
fn run(env: &Env, remote: bool, exe: &Path, args: &[String]) -> Result<(String, Duration)> {
    let mut cmd = Command::new(exe);
    cmd.args(args);
    if remote {
        cmd.env("OCL_ICD_VENDORS", env.hira.path())
            .env("HIRA_SOCKET", &env.socket);
    } else {
        cmd.env("OCL_ICD_VENDORS", env.native.path());
    }
    let t0 = Instant::now();
    let out = cmd.output()?;
    let dt = t0.elapsed();
    if !out.status.success() {
        bail!(
            "{} failed ({}): {}",
            exe.display(),
            if remote { "Hira" } else { "native" },
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok((String::from_utf8_lossy(&out.stdout).into_owned(), dt))
}

fn field(out: &str, key: &str) -> Result<f64> {
    out.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .with_context(|| format!("no {key} in {out:?}"))?
        .parse()
        .with_context(|| format!("bad {key} in {out:?}"))
}

/// The machine's floor for one round trip between two parties that sleep while they
/// wait: a 32-byte ping-pong over a Unix socket pair between two threads. Median ns.
fn socket_ping_pong(rounds: usize) -> Result<f64> {
    use std::io::{Read, Write};
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

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn overhead(repeats: usize, iterations: u32, calls: u32, json: &Path) -> Result<()> {
    ensure!(repeats > 0, "--repeats must be at least 1");
    let bin = build_components()?;
    let cdir = tempfile::tempdir()?;
    let rtt = compile(cdir.path(), "rtt")?;
    let stencil = compile(cdir.path(), "stencil")?;
    let env = setup(&bin)?;
    let calls_arg = [calls.to_string()];
    let iters_arg = [iterations.to_string()];
    // Warm-up: PoCL's kernel cache, page cache, the daemon's first spawn.
    for remote in [false, true] {
        run(&env, remote, &rtt, &["1000".into()])?;
        run(&env, remote, &stencil, &["10".into()])?;
    }
    let (mut sync_n, mut sync_h, mut async_n, mut async_h, mut p99_h) =
        (vec![], vec![], vec![], vec![], vec![]);
    let (mut st_n, mut st_h, mut floor) = (vec![], vec![], vec![]);
    for i in 0..repeats {
        eprint!("\rrepeat {}/{repeats}", i + 1);
        let (o, _) = run(&env, false, &rtt, &calls_arg)?;
        sync_n.push(field(&o, "sync_median_ns")?);
        async_n.push(field(&o, "async_mean_ns")?);
        let (o, _) = run(&env, true, &rtt, &calls_arg)?;
        sync_h.push(field(&o, "sync_median_ns")?);
        p99_h.push(field(&o, "sync_p99_ns")?);
        async_h.push(field(&o, "async_mean_ns")?);
        let (on, tn) = run(&env, false, &stencil, &iters_arg)?;
        let (oh, th) = run(&env, true, &stencil, &iters_arg)?;
        ensure!(on == oh, "stencil output differs through Hira:\n{on}\n{oh}");
        floor.push(socket_ping_pong(calls as usize)?);
        st_n.push(tn.as_secs_f64());
        st_h.push(th.as_secs_f64());
    }
    eprintln!();
    let ratios: Vec<f64> = st_h.iter().zip(&st_n).map(|(h, n)| h / n).collect();
    let (rmin, rmax) = ratios
        .iter()
        .fold((f64::MAX, 0f64), |(a, b), &r| (a.min(r), b.max(r)));
    let rows = [
        (
            "sync no-op call, median (us)",
            median(&mut sync_n) / 1e3,
            median(&mut sync_h) / 1e3,
        ),
        (
            "sync no-op call, p99 through Hira (us)",
            f64::NAN,
            median(&mut p99_h) / 1e3,
        ),
        (
            "machine floor: socket ping-pong between two threads (us)",
            median(&mut floor) / 1e3,
            f64::NAN,
        ),
        (
            "async call (clSetKernelArg), mean (us)",
            median(&mut async_n) / 1e3,
            median(&mut async_h) / 1e3,
        ),
        (
            "stencil wall time (s)",
            median(&mut st_n),
            median(&mut st_h),
        ),
    ];
    println!("| measure | native | Hira |\n|---|---|---|");
    for (name, n, h) in rows {
        let cell = |x: f64| {
            if x.is_nan() {
                "-".to_string()
            } else {
                format!("{x:.2}")
            }
        };
        println!("| {name} | {} | {} |", cell(n), cell(h));
    }
    let mut sorted = ratios.clone();
    let rmed = median(&mut sorted);
    println!(
        "\nstencil ({iterations} launches, clFinish after each): Hira/native = {rmed:.2} (min {rmin:.2}, max {rmax:.2}, {repeats} repeats)"
    );
    if let Some(d) = json.parent() {
        std::fs::create_dir_all(d)?;
    }
    std::fs::write(
        json,
        format!(
            "{{\"repeats\":{repeats},\"sync_rtt_us\":{{\"native\":{:.3},\"hira\":{:.3},\"hira_p99\":{:.3}}},\"floor_ping_pong_us\":{:.3},\"async_call_us\":{{\"native\":{:.3},\"hira\":{:.3}}},\"stencil\":{{\"iterations\":{iterations},\"native_s\":{:.4},\"hira_s\":{:.4},\"ratio_median\":{rmed:.3},\"ratio_min\":{rmin:.3},\"ratio_max\":{rmax:.3}}}}}\n",
            rows[0].1, rows[0].2, rows[1].2, rows[2].1, rows[3].1, rows[3].2, rows[4].1, rows[4].2
        ),
    )?;
    eprintln!("wrote {}", json.display());
    Ok(())
}

fn main() -> Result<()> {
    match Args::parse().command {
        Cmd::Overhead {
            repeats,
            iterations,
            calls,
            json,
        } => overhead(repeats, iterations, calls, &json),
    }
}
