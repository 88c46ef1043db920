//! The workload suite (`benches/workloads/*.c`), modelled on Rodinia's categories.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::env::{BenchEnv, compile, workspace};
use crate::measure::{Measurement, measure};

/// How much of a workload's time is spent crossing the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    /// Many short calls: interposition cost dominates.
    Dominant,
    Moderate,
    /// Few long calls: interposition cost is rare.
    Rare,
}

impl Category {
    pub fn label(self) -> &'static str {
        match self {
            Category::Dominant => "interposition-dominant",
            Category::Moderate => "moderate",
            Category::Rare => "interposition-rare",
        }
    }
}

/// The suite, in report order.
pub const WORKLOADS: &[(&str, Category)] = &[
    ("gaussian", Category::Dominant),
    ("stencil3d", Category::Dominant),
    ("myocyte", Category::Dominant),
    ("nw", Category::Moderate),
    ("lud", Category::Moderate),
    ("srad", Category::Moderate),
    ("backprop", Category::Rare),
    ("pathfinder", Category::Rare),
    ("nn", Category::Rare),
    ("kmeans", Category::Rare),
];

/// Compiles every workload into `out`.
pub fn compile_all(out: &Path) -> Result<Vec<PathBuf>> {
    let src = workspace().join("benches/workloads");
    WORKLOADS
        .iter()
        .map(|(name, _)| {
            let exe = out.join(name);
            compile(&src.join(format!("{name}.c")), &exe)?;
            Ok(exe)
        })
        .collect()
}

/// Measures every workload.
pub fn run(
    env: &BenchEnv,
    exes: &[PathBuf],
    short: bool,
    warmup: usize,
    repeats: usize,
) -> Result<Vec<Measurement>> {
    let args: Vec<String> = if short {
        vec!["--short".into()]
    } else {
        vec![]
    };
    let total = WORKLOADS.len();
    let mut out = Vec::new();
    for (i, ((name, _), exe)) in WORKLOADS.iter().zip(exes).enumerate() {
        let mut progress = |step: &str| eprint!("\r\x1b[2K[{}/{total}] {step}", i + 1);
        out.push(measure(
            env,
            name,
            exe,
            &args,
            warmup,
            repeats,
            &mut progress,
        )?);
    }
    eprint!("\r\x1b[2K");
    Ok(out)
}
