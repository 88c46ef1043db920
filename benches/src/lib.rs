//! Hira's benchmark harness.
//!
//! - [`env`]: builds Hira's components, starts a private `hira-vhost`, and prepares
//!   the two ICD views: native (the host's vendors) and remote (only Hira).
//! - [`measure`]: runs a program natively and through Hira, alternating, after a
//!   warm-up; collects wall times, exit status, output equality and, from the shim's
//!   `HIRA_STATS`, the calls made and bytes moved.
//! - [`suite`]: the workload suite in `benches/workloads/`, modelled on Rodinia.
//! - [`report`]: JSON, Markdown and SVG renderings of the results.
//! - [`overhead`]: the call round-trip and launch-loop measurements.
//! - [`soak`]: a bounded soak of the daemon with well-behaved and hostile guests.
//! - [`rodinia`]: the Rodinia OpenCL programs from a checkout, compared natively and
//!   through Hira output for output.
//! - [`cuda`]: the CUDA test programs natively and through Hira on one driver (the
//!   CPU test executor unless told the machine's).
//! - [`remote`]: the suite with its sessions on another host, at added delays.
//! - [`hosts`], [`delay`] (test infrastructure): hosts as network namespaces with a
//!   throwaway CA, and a relay that adds one-way delay between them.
//!
//! All figures are ratios against native runs made in the same invocation.

pub mod cuda;
pub mod delay;
pub mod env;
pub mod fairness;
pub mod hosts;
pub mod link;
pub mod measure;
pub mod migrate;
pub mod overhead;
pub mod remote;
pub mod report;
pub mod results;
pub mod rodinia;
pub mod samples;
pub mod soak;
pub mod suite;

/// Median of a non-empty slice (sorts it).
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Smallest and largest of a non-empty slice.
pub fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)))
}

/// Geometric mean of positive values.
pub fn geomean(v: &[f64]) -> f64 {
    (v.iter().map(|x| x.ln()).sum::<f64>() / v.len().max(1) as f64).exp()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_lengths() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 3.0);
    }

    #[test]
    fn geomean_of_ratios() {
        assert!((geomean(&[2.0, 8.0]) - 4.0).abs() < 1e-12);
    }
}
