//! Native-versus-Hira measurement of one program.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};

use crate::env::BenchEnv;
use crate::median;

/// One run's outcome.
#[derive(Debug, Clone)]
pub struct Run {
    pub seconds: f64,
    pub success: bool,
    pub stdout: String,
}

/// A program measured natively and through Hira.
#[derive(Debug, Clone)]
pub struct Measurement {
    pub name: String,
    pub native: Vec<f64>,
    pub hira: Vec<f64>,
    /// Hira time over native time, per repeat.
    pub ratios: Vec<f64>,
    /// Every run exited successfully (the suite's programs verify their results).
    pub native_ok: bool,
    pub hira_ok: bool,
    /// Every run printed the same standard output natively and through Hira.
    pub outputs_match: bool,
    /// API calls the program made and bytes that crossed to the host and back,
    /// counted by the shim in the last Hira run.
    pub calls: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Of those calls, the ones the program waited on the host for.
    pub round_trips: u64,
}

impl Measurement {
    /// A measurement with no runs yet, everything verified so far.
    pub fn empty(name: &str) -> Measurement {
        Measurement {
            name: name.to_string(),
            native: vec![],
            hira: vec![],
            ratios: vec![],
            native_ok: true,
            hira_ok: true,
            outputs_match: true,
            calls: 0,
            bytes_sent: 0,
            bytes_received: 0,
            round_trips: 0,
        }
    }

    /// A measurement whose native runs took 1 s each and whose Hira runs took `ratios`.
    pub fn with_ratios(name: &str, ratios: &[f64]) -> Measurement {
        Measurement {
            native: vec![1.0; ratios.len()],
            hira: ratios.to_vec(),
            ratios: ratios.to_vec(),
            ..Measurement::empty(name)
        }
    }

    pub fn median_ratio(&self) -> f64 {
        median(&mut self.ratios.clone())
    }

    pub fn min_ratio(&self) -> f64 {
        self.ratios.iter().copied().fold(f64::INFINITY, f64::min)
    }

    pub fn max_ratio(&self) -> f64 {
        self.ratios.iter().copied().fold(0.0, f64::max)
    }

    pub fn median_native(&self) -> f64 {
        median(&mut self.native.clone())
    }

    pub fn median_hira(&self) -> f64 {
        median(&mut self.hira.clone())
    }

    /// Everything verified and agreed.
    pub fn verified(&self) -> bool {
        self.native_ok && self.hira_ok && self.outputs_match
    }
}

fn run(
    env: &BenchEnv,
    remote: bool,
    exe: &Path,
    args: &[String],
    stats: Option<&Path>,
) -> Result<Run> {
    let mut cmd = env.command(remote, exe, args);
    if let Some(p) = stats {
        cmd.env("HIRA_STATS", p);
    }
    let t0 = Instant::now();
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {}", exe.display()))?;
    Ok(Run {
        seconds: t0.elapsed().as_secs_f64(),
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
    })
}

/// Parses the shim's totals line: `hira-stats: total calls=N bytes_sent=N
/// bytes_received=N round_trips=N`.
pub fn parse_stats_totals(text: &str) -> Option<(u64, u64, u64)> {
    Some((
        stats_field(text, "calls")?,
        stats_field(text, "bytes_sent")?,
        stats_field(text, "bytes_received")?,
    ))
}

/// One field `key=N` of the shim's totals line.
pub fn stats_field(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("hira-stats: total "))?;
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

/// Runs `exe` `warmup` times each way unmeasured, then `repeats` times each way,
/// alternating which goes first. `progress` is told each step.
pub fn measure(
    env: &BenchEnv,
    name: &str,
    exe: &Path,
    args: &[String],
    warmup: usize,
    repeats: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<Measurement> {
    let stats = tempfile::NamedTempFile::new()?;
    for i in 0..warmup {
        progress(&format!("{name}: warm-up {}/{warmup}", i + 1));
        run(env, false, exe, args, None)?;
        run(env, true, exe, args, None)?;
    }
    let mut m = Measurement::empty(name);
    for i in 0..repeats {
        progress(&format!("{name}: repeat {}/{repeats}", i + 1));
        let (n, h) = if i % 2 == 0 {
            let n = run(env, false, exe, args, None)?;
            (n, run(env, true, exe, args, Some(stats.path()))?)
        } else {
            let h = run(env, true, exe, args, Some(stats.path()))?;
            (run(env, false, exe, args, None)?, h)
        };
        m.native_ok &= n.success;
        m.hira_ok &= h.success;
        m.outputs_match &= n.stdout == h.stdout;
        m.ratios.push(h.seconds / n.seconds);
        m.native.push(n.seconds);
        m.hira.push(h.seconds);
    }
    let text = std::fs::read_to_string(stats.path()).unwrap_or_default();
    if let Some((calls, sent, received)) = parse_stats_totals(&text) {
        (m.calls, m.bytes_sent, m.bytes_received) = (calls, sent, received);
    }
    m.round_trips = stats_field(&text, "round_trips").unwrap_or(0);
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_totals_line_is_parsed() {
        let t =
            "hira-stats: clFinish 3\nhira-stats: total calls=12 bytes_sent=345 bytes_received=6\n";
        assert_eq!(parse_stats_totals(t), Some((12, 345, 6)));
        assert_eq!(parse_stats_totals("nothing"), None);
    }

    fn m(ratios: &[f64]) -> Measurement {
        Measurement::with_ratios("w", ratios)
    }

    #[test]
    fn ratio_summary_uses_median_min_and_max() {
        let x = m(&[1.5, 1.1, 2.0]);
        assert_eq!(
            (x.median_ratio(), x.min_ratio(), x.max_ratio()),
            (1.5, 1.1, 2.0)
        );
    }

    #[test]
    fn output_mismatch_fails_verification() {
        let mut x = m(&[1.0]);
        x.outputs_match = false;
        assert!(!x.verified());
    }
}
