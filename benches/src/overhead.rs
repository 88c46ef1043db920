//! The round trip of a synchronous no-op call, the cost of an asynchronously forwarded
//! call, this machine's floor for a socket round trip, and the slowdown of a stencil
//! that launches a kernel and waits for it, iteration after iteration.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::env::{BenchEnv, build_components, compile, workspace};
use crate::median;

/// Runs `exe` natively or through Hira; returns its stdout and wall time.
fn run(env: &BenchEnv, remote: bool, exe: &Path, args: &[String]) -> Result<(String, Duration)> {
    let t0 = Instant::now();
    let out = env.command(remote, exe, args).output()?;
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
    let (rtt, stencil) = (c("rtt")?, c("stencil")?);
    let env = BenchEnv::start(&bin)?;
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
        eprint!("\r\x1b[2Krepeat {}/{repeats}", i + 1);
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
    eprint!("\r\x1b[2K");
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
    let rmed = median(&mut ratios.clone());
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
}
