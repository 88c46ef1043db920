//! `hira-bench migrate`: each suite workload, run through Hira, is moved to a new API
//! server at random points while it runs; its output must be the native output, and
//! each move's pause (the time the guest's calls were held) and snapshot size are
//! reported.
//!
//! The points are random times within the workload's unmigrated run time, drawn from
//! a seeded generator (`--seed`), so a run can be repeated. A move asked for when the
//! session cannot move (a user event without a status, say) or after the program has
//! ended is counted as refused with its reason; it never fails the run. A wrong
//! output does.
//!
//! Two kinds of move: to a new API server of the same daemon (`hira-ctl migrate`),
//! and to another daemon (`hira-ctl migrate --to`: the session is suspended, placed
//! at the other daemon, and resumed there when the guest reconnects; its pause runs
//! until the session serves again at the other daemon).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::{Value, json};

use crate::env::BenchEnv;
use crate::suite::WORKLOADS;

/// One move.
#[derive(Debug, Clone, Copy)]
pub struct Move {
    pub pause_ms: f64,
    pub capture_ms: f64,
    pub restore_ms: f64,
    pub snapshot_bytes: u64,
}

/// One workload's moves.
#[derive(Debug, Default)]
pub struct WorkloadMoves {
    pub name: String,
    pub daemons: bool,
    pub runs: usize,
    pub outputs_match: bool,
    pub moves: Vec<Move>,
    /// Moves refused, with the reason.
    pub refused: Vec<String>,
}

fn ask(control: &Path, req: &Value) -> Result<Value> {
    let mut s = UnixStream::connect(control).context("connecting to the control socket")?;
    writeln!(s, "{req}")?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    Ok(serde_json::from_str(&line)?)
}

/// The live session of the guest process `pid`, once it is served.
fn session_of(control: &Path, pid: u32) -> Result<Option<u64>> {
    if !control.exists() {
        return Ok(None);
    }
    let status = ask(control, &json!({"cmd": "status"}))?;
    Ok(status["sessions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["guest_pid"] == json!(pid) && s["serving"] == json!(true))
        .and_then(|s| s["id"].as_u64()))
}

/// The highest session id the daemon at `control` has had, live or ended.
fn last_session(control: &Path) -> Result<u64> {
    let status = ask(control, &json!({"cmd": "status"}))?;
    Ok(["sessions", "ended"]
        .iter()
        .flat_map(|k| status[*k].as_array().into_iter().flatten())
        .filter_map(|s| s["id"].as_u64())
        .max()
        .unwrap_or(0))
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Moves the session of guest `pid` to the other daemon; `None` if it has none.
fn move_between(
    controls: [&Path; 2],
    pid: u32,
    ended: &dyn Fn() -> bool,
) -> Result<Option<Result<Move, String>>> {
    for (i, from) in controls.iter().enumerate() {
        let Some(id) = session_of(from, pid)? else {
            continue;
        };
        let to = controls[1 - i];
        // Sessions the other daemon has had so far: one after them that ended is
        // this program's, resumed there (the harness runs one program at a time).
        let known = last_session(to)?;
        let start = Instant::now();
        let a = ask(
            from,
            &json!({"cmd": "migrate", "session": id, "to": to.display().to_string()}),
        )?;
        let Some(s) = a.get("suspended") else {
            return Ok(Some(Err(a["error"]
                .as_str()
                .unwrap_or("unknown")
                .to_string())));
        };
        // Paused until the session serves at the other daemon.
        let deadline = start + Duration::from_secs(60);
        while session_of(to, pid)?.is_none() {
            if ended() {
                if last_session(to)? > known {
                    return Ok(Some(Err(
                        "moved, pause not measured: the program ended before it was seen serving there"
                            .into(),
                    )));
                }
                // Told to move on its way out: it had no more calls to make.
                return Ok(Some(Err("the program had ended".into())));
            }
            if Instant::now() > deadline {
                return Ok(Some(Err("the guest did not resume".into())));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let pause_ms = start.elapsed().as_secs_f64() * 1e3;
        let capture_ms = s["capture_ms"].as_f64().unwrap_or(0.0);
        return Ok(Some(Ok(Move {
            pause_ms,
            capture_ms,
            restore_ms: pause_ms - capture_ms,
            snapshot_bytes: s["snapshot_bytes"].as_u64().unwrap_or(0),
        })));
    }
    Ok(None)
}

/// Moves the session of guest `pid` at each of the times `at` after `started`
/// (sorted): to a new API server of the daemon at `control`, or with `other` (a second
/// daemon's control socket) to whichever daemon does not have it. Returns the moves
/// made and the reasons of those refused; stops asking once `ended` says the program
/// has ended.
pub fn move_at(
    control: &Path,
    other: Option<&Path>,
    pid: u32,
    started: Instant,
    at: &[Duration],
    ended: &dyn Fn() -> bool,
) -> Result<(Vec<Move>, Vec<String>)> {
    let (mut moves, mut refused) = (Vec::new(), Vec::new());
    for &t in at {
        // Random points of the run: this is when to act, not a wait for an event.
        if let Some(left) = t.checked_sub(started.elapsed()) {
            std::thread::sleep(left);
        }
        if ended() {
            refused.push("the program had ended".into());
            continue;
        }
        if let Some(other) = other {
            match move_between([control, other], pid, ended)? {
                Some(Ok(m)) => moves.push(m),
                Some(Err(e)) => refused.push(e),
                None => refused.push("no session yet or any more".into()),
            }
            continue;
        }
        let Some(id) = session_of(control, pid)? else {
            refused.push("no session yet or any more".into());
            continue;
        };
        let a = ask(control, &json!({"cmd": "migrate", "session": id}))?;
        match a.get("moved") {
            Some(m) => moves.push(Move {
                pause_ms: m["pause_ms"].as_f64().unwrap_or(0.0),
                capture_ms: m["capture_ms"].as_f64().unwrap_or(0.0),
                restore_ms: m["restore_ms"].as_f64().unwrap_or(0.0),
                snapshot_bytes: m["snapshot_bytes"].as_u64().unwrap_or(0),
            }),
            None => refused.push(a["error"].as_str().unwrap_or("unknown").to_string()),
        }
    }
    Ok((moves, refused))
}

/// Runs every workload `rounds` times through Hira with `points` moves at random
/// times each, after one native and one unmigrated Hira run; with `other` (a second
/// daemon's control socket), the moves go between the two daemons.
pub fn run(
    env: &BenchEnv,
    other: Option<&Path>,
    exes: &[PathBuf],
    short: bool,
    rounds: usize,
    points: usize,
    seed: u64,
) -> Result<Vec<WorkloadMoves>> {
    let control = env
        .control
        .clone()
        .context("the bench daemon has no control socket")?;
    let args: Vec<String> = if short {
        vec!["--short".into()]
    } else {
        vec![]
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    for ((name, _), exe) in WORKLOADS.iter().zip(exes) {
        eprint!("\r\x1b[2K{name}: native and unmigrated runs");
        let native = env.command(false, exe, &args).output()?;
        if !native.status.success() {
            bail!("{name} fails natively");
        }
        let start = Instant::now();
        let plain = env.command(true, exe, &args).output()?;
        let span = start.elapsed();
        let mut w = WorkloadMoves {
            name: name.to_string(),
            daemons: other.is_some(),
            outputs_match: plain.stdout == native.stdout && plain.status.success(),
            ..WorkloadMoves::default()
        };
        for round in 0..rounds {
            eprint!("\r\x1b[2K{name}: round {}/{rounds}", round + 1);
            let mut at: Vec<Duration> = (0..points)
                .map(|_| span.mul_f64(rng.random_range(0.05..0.95)))
                .collect();
            at.sort();
            let child = env
                .command(true, exe, &args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()?;
            let pid = child.id();
            let started = Instant::now();
            let collector = std::thread::spawn(move || child.wait_with_output());
            let (moves, refused) = move_at(&control, other, pid, started, &at, &|| {
                collector.is_finished()
            })?;
            w.moves.extend(moves);
            w.refused.extend(refused);
            let o = collector
                .join()
                .map_err(|_| anyhow::anyhow!("collector panicked"))??;
            w.runs += 1;
            w.outputs_match &= o.status.success() && o.stdout == native.stdout;
        }
        out.push(w);
    }
    eprintln!("\r\x1b[2K");
    Ok(out)
}

/// The report as Markdown.
pub fn report(results: &[WorkloadMoves], points: usize, seed: u64) -> String {
    let mut s = String::new();
    let daemons = results.first().is_some_and(|w| w.daemons);
    s.push_str(&format!(
        "Moves {} at {points} random points per run (seed {seed}); pause = the guest's calls held, from the request until the session serves again.\n\n",
        if daemons {
            "between two daemons (suspend, place, resume)"
        } else {
            "to a new API server of the same daemon"
        }
    ));
    s.push_str("| workload | runs | output = native | moves | refused | snapshot median / max | pause median / max (ms) | capture / restore median (ms) |\n|---|---|---|---|---|---|---|---|\n");
    let mut all: Vec<Move> = Vec::new();
    for w in results {
        let mut pause: Vec<f64> = w.moves.iter().map(|m| m.pause_ms).collect();
        let mut cap: Vec<f64> = w.moves.iter().map(|m| m.capture_ms).collect();
        let mut res: Vec<f64> = w.moves.iter().map(|m| m.restore_ms).collect();
        let mut size: Vec<f64> = w.moves.iter().map(|m| m.snapshot_bytes as f64).collect();
        let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} / {} | {:.1} / {:.1} | {:.1} / {:.1} |\n",
            w.name,
            w.runs,
            if w.outputs_match { "yes" } else { "**NO**" },
            w.moves.len(),
            w.refused.len(),
            kib(median(&mut size)),
            kib(max(&size)),
            median(&mut pause),
            max(&pause),
            median(&mut cap),
            median(&mut res),
        ));
        all.extend(&w.moves);
    }
    let mut reasons: Vec<&String> = results.iter().flat_map(|w| &w.refused).collect();
    reasons.sort();
    reasons.dedup();
    if !reasons.is_empty() {
        s.push_str("\nRefused moves, by reason:\n\n");
        for r in reasons {
            let n = results
                .iter()
                .flat_map(|w| &w.refused)
                .filter(|x| *x == r)
                .count();
            s.push_str(&format!("- {n}x {r}\n"));
        }
    }
    // Pause against state size, in size classes.
    s.push_str("\n| snapshot size | moves | pause median / max (ms) |\n|---|---|---|\n");
    let classes = [
        (0u64, 64u64 << 10),
        (64 << 10, 1 << 20),
        (1 << 20, 16 << 20),
        (16 << 20, 256 << 20),
        (256 << 20, u64::MAX),
    ];
    for (lo, hi) in classes {
        let mut p: Vec<f64> = all
            .iter()
            .filter(|m| (lo..hi).contains(&m.snapshot_bytes))
            .map(|m| m.pause_ms)
            .collect();
        if p.is_empty() {
            continue;
        }
        let max = p.iter().copied().fold(0.0, f64::max);
        let label = if hi == u64::MAX {
            format!("≥ {}", kib(lo as f64))
        } else {
            format!("{} – {}", kib(lo as f64), kib(hi as f64))
        };
        s.push_str(&format!(
            "| {label} | {} | {:.1} / {max:.1} |\n",
            p.len(),
            median(&mut p)
        ));
    }
    s
}

fn kib(b: f64) -> String {
    if b >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", b / 1024.0 / 1024.0)
    } else {
        format!("{:.0} KiB", b / 1024.0)
    }
}
