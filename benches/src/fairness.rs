//! `hira-bench fairness`: how the sharing policies divide device time, after the
//! HIRA/AvA methodology: guests in different VMs run kernels of very different lengths
//! (about 1 ms and 100 ms) back to back; the daemon's control socket is sampled for
//! each VM's device time (measured from the host's profiling timestamps), and each
//! window's unfairness is `|t1/s1 - t2/s2| / (t1/s1 + t2/s2)` for device times `t` and
//! shares `s` (for more VMs, the same over the most and least served). Reported as a
//! distribution over 500 ms and 1 s windows, with the work done against FIFO, and a
//! chart of each VM's share of device time over a run with a live share change.
//!
//! A CPU device (PoCL) is preemptively time-sliced by the host's scheduler, so with
//! equal shares FIFO is already fair there; shares other than 1:1, and a GPU, are
//! where the policy has something to do.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};

use crate::env::{compile, start_daemon, workspace};

/// One guest: its VM, share and kernel length.
#[derive(Debug, Clone)]
pub struct Guest {
    pub vm: String,
    pub share: u32,
    pub kernel_ms: f64,
}

/// One run's outcome.
#[derive(Debug, Clone)]
pub struct Run {
    pub scenario: String,
    pub policy: String,
    /// Which repetition of the scenario this is (FIFO and the policies alternate
    /// within one round, so that a noisy machine affects both alike).
    pub round: usize,
    /// Unfairness per window, for 500 ms and 1 s windows.
    pub unfair_500: Vec<f64>,
    pub unfair_1000: Vec<f64>,
    /// Work done: launches completed times their calibrated length, in seconds.
    pub work_s: f64,
    /// Each VM's part of the device time over the whole run.
    pub parts: BTreeMap<String, f64>,
    /// (seconds since start, each VM's share of device time in the last sample
    /// interval) for the chart.
    pub series: Vec<(f64, BTreeMap<String, f64>)>,
}

struct Daemon {
    child: Child,
    control: PathBuf,
    dir: tempfile::TempDir,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    fn start(bin: &Path, guests: &[Guest], policy: &str) -> Result<Daemon> {
        let dir = tempfile::tempdir()?;
        let control = dir.path().join("control.sock");
        let mut args: Vec<std::ffi::OsString> = Vec::new();
        for g in guests {
            args.push("--local-socket".into());
            args.push(
                format!(
                    "{}={},share={}",
                    g.vm,
                    dir.path().join(format!("{}.sock", g.vm)).display(),
                    g.share
                )
                .into(),
            );
        }
        args.extend(["--control-socket".into(), control.clone().into_os_string()]);
        args.extend(["--policy".into(), policy.into()]);
        let child = start_daemon(bin, dir.path(), args)?;
        Ok(Daemon {
            child,
            control,
            dir,
        })
    }

    fn ask(&self, req: &Value) -> Result<Value> {
        let mut s = UnixStream::connect(&self.control)?;
        writeln!(s, "{req}")?;
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line)?;
        let v: Value = serde_json::from_str(&line)?;
        if let Some(e) = v.get("error") {
            bail!("control socket: {e}");
        }
        Ok(v)
    }

    /// Each VM's device time so far, in ns.
    fn device(&self) -> Result<BTreeMap<String, u64>> {
        let s = self.ask(&json!({"cmd": "status"}))?;
        Ok(s["vms"]
            .as_array()
            .context("status lists VMs")?
            .iter()
            .map(|v| {
                (
                    v["name"].as_str().unwrap_or_default().to_string(),
                    v["device_ns"].as_u64().unwrap_or(0),
                )
            })
            .collect())
    }
}

/// Unfairness of device times `t` under `shares`: spread of the normalised times.
pub fn unfairness(t: &BTreeMap<String, u64>, shares: &BTreeMap<String, u32>) -> Option<f64> {
    let norm: Vec<f64> = shares
        .iter()
        .map(|(vm, s)| t.get(vm).copied().unwrap_or(0) as f64 / f64::from(*s))
        .collect();
    let (lo, hi) = norm
        .iter()
        .fold((f64::MAX, 0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    (hi + lo > 0.0).then(|| (hi - lo) / (hi + lo))
}

/// Per-window unfairness from cumulative samples `(seconds, device ns per VM)`.
fn windows(
    samples: &[(f64, BTreeMap<String, u64>)],
    shares: &BTreeMap<String, u32>,
    window: f64,
) -> Vec<f64> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, (t, _)) in samples.iter().enumerate() {
        if t - samples[start].0 >= window {
            let delta: BTreeMap<String, u64> = samples[i]
                .1
                .iter()
                .map(|(vm, ns)| {
                    let before = samples[start].1.get(vm).copied().unwrap_or(0);
                    (vm.clone(), ns.saturating_sub(before))
                })
                .collect();
            if let Some(u) = unfairness(&delta, shares) {
                out.push(u);
            }
            start = i;
        }
    }
    out
}

/// Calibrated iteration counts by kernel length, measured natively.
fn calibrate(spin: &Path, native: &Path, ms: f64) -> Result<u64> {
    let o = Command::new(spin)
        .args(["calibrate", &ms.to_string()])
        .env("OCL_ICD_VENDORS", native)
        .output()?;
    ensure!(o.status.success(), "spin calibrate failed");
    Ok(String::from_utf8_lossy(&o.stdout).trim().parse()?)
}

/// Runs one scenario under one policy for `secs`; `change` sets a VM's share to a new
/// value halfway through.
#[allow(clippy::too_many_arguments)]
fn run_one(
    bin: &Path,
    spin: &Path,
    hira_vendors: &Path,
    scenario: &str,
    guests: &[Guest],
    iterations: &BTreeMap<String, u64>,
    policy: &str,
    secs: f64,
    change: Option<(&str, u32)>,
    round: usize,
) -> Result<Run> {
    let d = Daemon::start(bin, guests, policy)?;
    let mut children = Vec::new();
    for g in guests {
        let n = iterations[&g.vm];
        let child = Command::new(spin)
            .args([n.to_string(), secs.to_string()])
            .env("OCL_ICD_VENDORS", hira_vendors)
            .env("HIRA_SOCKET", d.dir.path().join(format!("{}.sock", g.vm)))
            .stdout(Stdio::piped())
            .spawn()?;
        children.push(child);
    }
    let mut shares: BTreeMap<String, u32> =
        guests.iter().map(|g| (g.vm.clone(), g.share)).collect();
    let mut samples: Vec<(f64, BTreeMap<String, u64>)> = Vec::new();
    let mut shares_at: Vec<BTreeMap<String, u32>> = Vec::new();
    let start = Instant::now();
    let mut changed = false;
    // Sample until every guest has exited.
    loop {
        let t = start.elapsed().as_secs_f64();
        samples.push((t, d.device()?));
        shares_at.push(shares.clone());
        if let Some((vm, share)) = change
            && !changed
            && t >= secs / 2.0
        {
            d.ask(&json!({"cmd": "set", "vm": vm, "share": share}))?;
            shares.insert(vm.to_string(), share);
            changed = true;
        }
        if children
            .iter_mut()
            .all(|c| matches!(c.try_wait(), Ok(Some(_))))
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut work_s = 0.0;
    for (g, c) in guests.iter().zip(children) {
        let o = c.wait_with_output()?;
        ensure!(o.status.success(), "a spin guest failed");
        let launches: f64 = String::from_utf8_lossy(&o.stdout).trim().parse()?;
        work_s += launches * g.kernel_ms / 1000.0;
    }
    // The measured part: after the first second (programs built, queues warm) and
    // before the first guest stops.
    let end = secs - 0.2;
    let kept: Vec<(f64, BTreeMap<String, u64>)> = samples
        .iter()
        .filter(|(t, _)| *t >= 1.0 && *t <= end)
        .cloned()
        .collect();
    let split = |w: f64| -> Vec<f64> {
        match change {
            // Windows are taken on each side of the change, each with its shares.
            Some(_) => {
                let half = secs / 2.0;
                let before: Vec<_> = kept.iter().filter(|(t, _)| *t < half).cloned().collect();
                let after: Vec<_> = kept
                    .iter()
                    .filter(|(t, _)| *t >= half + 0.5)
                    .cloned()
                    .collect();
                let mut v = windows(&before, &shares_at[0], w);
                v.extend(windows(&after, &shares, w));
                v
            }
            None => windows(&kept, &shares, w),
        }
    };
    let total = |i: usize| -> BTreeMap<String, u64> {
        kept.get(i).map(|s| s.1.clone()).unwrap_or_default()
    };
    let (first, last) = (total(0), total(kept.len().saturating_sub(1)));
    let sum: u64 = last
        .iter()
        .map(|(vm, ns)| ns - first.get(vm).copied().unwrap_or(0))
        .sum();
    let parts = last
        .iter()
        .map(|(vm, ns)| {
            let d = ns - first.get(vm).copied().unwrap_or(0);
            (
                vm.clone(),
                if sum == 0 { 0.0 } else { d as f64 / sum as f64 },
            )
        })
        .collect();
    let series = samples
        .windows(5)
        .step_by(2)
        .map(|w| {
            let (a, b) = (&w[0], &w[4]);
            let delta: BTreeMap<String, u64> =
                b.1.iter()
                    .map(|(vm, ns)| {
                        (
                            vm.clone(),
                            ns.saturating_sub(a.1.get(vm).copied().unwrap_or(0)),
                        )
                    })
                    .collect();
            let all: u64 = delta.values().sum();
            let parts = delta
                .into_iter()
                .map(|(vm, ns)| {
                    (
                        vm,
                        if all == 0 {
                            0.0
                        } else {
                            ns as f64 / all as f64
                        },
                    )
                })
                .collect();
            (b.0, parts)
        })
        .collect();
    Ok(Run {
        scenario: scenario.to_string(),
        policy: policy.to_string(),
        round,
        unfair_500: split(0.5),
        unfair_1000: split(1.0),
        work_s,
        parts,
        series,
    })
}

fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[((s.len() - 1) as f64 * q).round() as usize]
}

/// Runs every scenario under FIFO and WFQ (and the rate-control modes for the first),
/// `repeat` rounds each.
pub fn run(bin: &Path, out: &Path, secs: f64, repeat: usize) -> Result<Vec<Run>> {
    let native = tempfile::tempdir()?;
    for e in std::fs::read_dir("/etc/OpenCL/vendors")? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "icd")
            && !std::fs::read_to_string(&p)?.contains("hira")
        {
            std::fs::copy(&p, native.path().join(p.file_name().context("named")?))?;
        }
    }
    let hira = tempfile::tempdir()?;
    std::fs::write(
        hira.path().join("hira.icd"),
        format!("{}\n", bin.join("libhira_opencl.so").display()),
    )?;
    std::fs::create_dir_all(out)?;
    let spin = out.join("spin");
    compile(&workspace().join("tests/c/spin.c"), &spin)?;
    let g = |vm: &str, share: u32, kernel_ms: f64| Guest {
        vm: vm.into(),
        share,
        kernel_ms,
    };
    let two = vec![g("short", 1, 1.0), g("long", 1, 100.0)];
    let three_to_one = vec![g("short", 3, 1.0), g("long", 1, 100.0)];
    let four = vec![
        g("short1", 1, 1.0),
        g("long1", 1, 100.0),
        g("short2", 1, 1.0),
        g("long2", 1, 100.0),
    ];
    let mut iterations = BTreeMap::new();
    let short_n = calibrate(&spin, native.path(), 1.0)?;
    let long_n = calibrate(&spin, native.path(), 100.0)?;
    for guest in two.iter().chain(&four) {
        let n = if guest.kernel_ms < 10.0 {
            short_n
        } else {
            long_n
        };
        iterations.insert(guest.vm.clone(), n);
    }
    let mut runs = Vec::new();
    let scenarios: [(&str, &Vec<Guest>, &[&str]); 3] = [
        (
            "2 VMs, 1 ms vs 100 ms, equal shares",
            &two,
            &["fifo", "wfq", "fixed-rate", "aimd"],
        ),
        (
            "2 VMs, 1 ms (share 3) vs 100 ms (share 1)",
            &three_to_one,
            &["fifo", "wfq"],
        ),
        (
            "4 VMs, 1 ms and 100 ms, equal shares",
            &four,
            &["fifo", "wfq"],
        ),
    ];
    for (name, guests, policies) in scenarios {
        for round in 0..repeat.max(1) {
            for p in policies {
                eprintln!("fairness: {name}, {p}, round {}", round + 1);
                runs.push(run_one(
                    bin,
                    &spin,
                    hira.path(),
                    name,
                    guests,
                    &iterations,
                    p,
                    secs,
                    None,
                    round,
                )?);
            }
        }
    }
    eprintln!("fairness: live share change");
    runs.push(run_one(
        bin,
        &spin,
        hira.path(),
        "2 VMs, equal shares, then short's share set to 3 with hira-ctl halfway",
        &two,
        &iterations,
        "wfq",
        secs,
        Some(("short", 3)),
        0,
    )?);
    Ok(runs)
}

/// The table: one row per scenario and policy, over all its rounds (unfairness windows
/// pooled, device-time parts averaged, work against FIFO as the median of each round's
/// ratio to the FIFO run of the same round, with the range when there are several).
pub fn markdown(runs: &[Run]) -> String {
    let mut s = String::from(
        "| scenario | policy | unfairness 500 ms: median / p90 / max | 1 s: median / p90 / max | device-time parts | work vs FIFO |\n|---|---|---|---|---|---|\n",
    );
    let mut rows: Vec<(&str, &str)> = Vec::new();
    for r in runs {
        if !rows.contains(&(r.scenario.as_str(), r.policy.as_str())) {
            rows.push((&r.scenario, &r.policy));
        }
    }
    let q = |v: &[f64]| {
        format!(
            "{:.3} / {:.3} / {:.3}",
            quantile(v, 0.5),
            quantile(v, 0.9),
            quantile(v, 1.0)
        )
    };
    for (scenario, policy) in rows {
        let mine: Vec<&Run> = runs
            .iter()
            .filter(|r| r.scenario == scenario && r.policy == policy)
            .collect();
        let pooled = |f: fn(&Run) -> &Vec<f64>| -> Vec<f64> {
            mine.iter().flat_map(|r| f(r).iter().copied()).collect()
        };
        let mut parts: BTreeMap<&str, f64> = BTreeMap::new();
        for r in &mine {
            for (vm, p) in &r.parts {
                *parts.entry(vm).or_default() += p / mine.len() as f64;
            }
        }
        let parts: Vec<String> = parts
            .iter()
            .map(|(vm, p)| format!("{vm} {:.0}%", p * 100.0))
            .collect();
        let ratios: Vec<f64> = mine
            .iter()
            .filter_map(|r| {
                runs.iter()
                    .find(|f| f.scenario == scenario && f.policy == "fifo" && f.round == r.round)
                    .map(|f| r.work_s / f.work_s)
            })
            .collect();
        let work = match ratios.len() {
            0 => "-".to_string(),
            1 => format!("{:.2}", ratios[0]),
            n => format!(
                "{:.2} ({:.2}-{:.2}, {n} rounds)",
                quantile(&ratios, 0.5),
                quantile(&ratios, 0.0),
                quantile(&ratios, 1.0)
            ),
        };
        s += &format!(
            "| {scenario} | {policy} | {} | {} | {} | {work} |\n",
            q(&pooled(|r| &r.unfair_500)),
            q(&pooled(|r| &r.unfair_1000)),
            parts.join(", "),
        );
    }
    s
}

/// JSON of every run.
pub fn json(runs: &[Run]) -> Value {
    Value::Array(
        runs.iter()
            .map(|r| {
                json!({
                    "scenario": r.scenario, "policy": r.policy, "round": r.round,
                    "unfairness_500ms": r.unfair_500, "unfairness_1s": r.unfair_1000,
                    "work_s": r.work_s, "parts": r.parts,
                    "series": r.series.iter().map(|(t, p)| json!({"t": t, "parts": p})).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}

/// A chart of each VM's share of device time over the run with the live share change.
pub fn svg(runs: &[Run]) -> String {
    let Some(r) = runs.iter().find(|r| r.scenario.contains("halfway")) else {
        return String::new();
    };
    let (w, h, left, top) = (720.0, 320.0, 50.0, 40.0);
    let (pw, ph) = (w - left - 20.0, h - top - 40.0);
    let tmax = r.series.last().map_or(1.0, |s| s.0).max(1.0);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{left}\" y=\"20\" font-size=\"14\">Share of device time per VM (wfq; short's share 1 then 3)</text>\n"
    );
    for k in 0..=4 {
        let y = top + ph - ph * f64::from(k) / 4.0;
        s += &format!(
            "<line x1=\"{left}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"#ddd\"/><text x=\"10\" y=\"{}\">{}%</text>\n",
            left + pw,
            y + 4.0,
            k * 25
        );
    }
    let colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
    let vms: Vec<String> = r.parts.keys().cloned().collect();
    for (i, vm) in vms.iter().enumerate() {
        let pts: Vec<String> = r
            .series
            .iter()
            .map(|(t, p)| {
                format!(
                    "{:.1},{:.1}",
                    left + pw * t / tmax,
                    top + ph - ph * p.get(vm).copied().unwrap_or(0.0)
                )
            })
            .collect();
        s += &format!(
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>\n<text x=\"{}\" y=\"{}\" fill=\"{}\">{vm}</text>\n",
            colours[i % 4],
            pts.join(" "),
            left + 10.0 + 80.0 * i as f64,
            h - 10.0,
            colours[i % 4]
        );
    }
    let xc = left + pw * (tmax / 2.0) / tmax;
    s += &format!(
        "<line x1=\"{xc}\" y1=\"{top}\" x2=\"{xc}\" y2=\"{}\" stroke=\"#888\" stroke-dasharray=\"4\"/><text x=\"{}\" y=\"{}\">hira-ctl set short share=3</text>\n</svg>\n",
        top + ph,
        xc + 4.0,
        top + 12.0
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unfairness_is_relative_to_shares() {
        let t = |a: u64, b: u64| BTreeMap::from([("a".to_string(), a), ("b".to_string(), b)]);
        let s = |a: u32, b: u32| BTreeMap::from([("a".to_string(), a), ("b".to_string(), b)]);
        assert_eq!(unfairness(&t(50, 50), &s(1, 1)), Some(0.0));
        assert_eq!(unfairness(&t(75, 25), &s(3, 1)), Some(0.0));
        assert!((unfairness(&t(90, 10), &s(1, 1)).unwrap() - 0.8).abs() < 1e-9);
        assert_eq!(unfairness(&t(0, 0), &s(1, 1)), None);
    }

    #[test]
    fn windows_cut_cumulative_samples() {
        let at = |t: f64, a: u64, b: u64| {
            (
                t,
                BTreeMap::from([("a".to_string(), a), ("b".to_string(), b)]),
            )
        };
        let samples = vec![
            at(0.0, 0, 0),
            at(0.5, 50, 50),
            at(1.0, 100, 60),
            at(1.5, 150, 70),
        ];
        let shares = BTreeMap::from([("a".to_string(), 1), ("b".to_string(), 1)]);
        let w = windows(&samples, &shares, 0.5);
        assert_eq!(w.len(), 3);
        assert_eq!(w[0], 0.0);
        assert!((w[1] - 40.0 / 60.0).abs() < 1e-9);
    }
}
