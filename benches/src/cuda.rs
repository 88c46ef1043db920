//! `hira-bench cuda`: the CUDA test programs (`tests/cuda/*.c`, driver API) and the
//! runtime-API programs (`tests/cudart/*.cu`, built by nvcc with NVIDIA's runtime
//! linked statically) natively and through Hira on one driver, alternating, with
//! their outputs compared.
//!
//! Without a GPU the driver is the CPU test executor (`tests/cuda-cpu`): its kernels
//! are interpreted, so a ratio there says what remoting costs next to a very slow
//! device, not next to a GPU. `--driver system` uses the machine's driver.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};

use crate::env::{self, BenchEnv};
use crate::measure::{self, Measurement};

/// The programs measured (the suite of the CUDA end-to-end tests).
pub const PROGRAMS: &[&str] = &[
    "vector_add",
    "matmul",
    "streams",
    "contexts",
    "transfer",
    "launches",
];

/// The runtime-API programs measured, with their arguments: `launches` is the
/// runtime's launch overhead (40,000 `<<<>>>` launches of a tiny kernel), and
/// `graph_launches` the same 40,000 launches as 2,000 launches of a captured graph.
pub const RUNTIME_PROGRAMS: &[(&str, &[&str])] = &[
    ("vector_add", &[]),
    ("launches", &["40000"]),
    ("graph_launches", &["40000"]),
];

/// nvcc: `HIRA_NVCC`, else the one `scripts/test` installs from PyPI.
pub fn nvcc() -> std::path::PathBuf {
    std::env::var_os("HIRA_NVCC").map_or_else(
        || env::workspace().join("target/nvcc13/root/nvidia/cu13/bin/nvcc"),
        std::path::PathBuf::from,
    )
}

/// Hira's `libcuda.so.1` in `dir/shim`, and the directory of the driver programs
/// load natively (and API servers load): `driver` (`system`: the library path's, an
/// empty path), else the CPU test executor of this build, copied to `dir/executor`.
pub fn libraries(
    bin: &Path,
    dir: &Path,
    driver: Option<&str>,
) -> Result<(String, std::path::PathBuf)> {
    let copy = |lib: &Path, to: &Path| -> Result<()> {
        std::fs::create_dir_all(to)?;
        for name in ["libcuda.so.1", "libcuda.so"] {
            std::fs::copy(lib, to.join(name)).with_context(|| format!("{}", lib.display()))?;
        }
        Ok(())
    };
    let shim = dir.join("shim");
    copy(&bin.join("libhira_cuda.so"), &shim)?;
    let driver_dir = match driver {
        Some("system") => String::new(),
        Some(d) => d.to_string(),
        None => {
            let d = dir.join("executor");
            copy(&bin.join("libcuda.so"), &d)?;
            eprintln!(
                "driver: the CPU test executor (not a GPU): ratios compare remoting with PTX interpretation"
            );
            d.display().to_string()
        }
    };
    Ok((driver_dir, shim))
}

/// Builds the programs and the kernels' PTX in `dir`, and measures each.
pub fn run(
    bin: &Path,
    dir: &Path,
    driver: Option<&str>,
    warmup: usize,
    repeats: usize,
) -> Result<Vec<Measurement>> {
    let sdk = cuda::nvrtc::sdk().map_err(anyhow::Error::msg)?;
    let (driver_dir, shim) = libraries(bin, dir, driver)?;
    let src = std::fs::read_to_string(env::workspace().join("tests/cuda/kernels.cu"))?;
    let ptx = dir.join("kernels.ptx");
    std::fs::write(
        &ptx,
        cuda::nvrtc::compile(&sdk, &src, &sdk.arch).map_err(anyhow::Error::msg)?,
    )?;
    let bench = BenchEnv::start_cuda(bin, &driver_dir, &shim)?;
    let mut out = Vec::new();
    for p in PROGRAMS {
        let exe = dir.join(p);
        let st = Command::new("gcc")
            .args(["-O2", "-o"])
            .arg(&exe)
            .arg(env::workspace().join(format!("tests/cuda/{p}.c")))
            .arg("-I")
            .arg(&sdk.include)
            .arg("-L")
            .arg(&shim)
            .args(["-lcuda", "-lm"])
            .status()
            .context("gcc runs")?;
        ensure!(st.success(), "gcc {p}.c failed");
        let mut progress = |s: &str| eprint!("\r\x1b[2K{s}");
        let args = [ptx.display().to_string()];
        out.push(measure::measure(
            &bench,
            p,
            &exe,
            &args,
            warmup,
            repeats,
            &mut progress,
        )?);
        eprint!("\r\x1b[2K");
    }
    let nvcc = nvcc();
    ensure!(
        nvcc.is_file(),
        "{} is missing (scripts/test installs nvcc 13 from PyPI; HIRA_NVCC names another)",
        nvcc.display()
    );
    for (p, args) in RUNTIME_PROGRAMS {
        let exe = dir.join(format!("cudart-{p}"));
        let st = Command::new(&nvcc)
            .arg("-o")
            .arg(&exe)
            .arg(env::workspace().join(format!("tests/cudart/{p}.cu")))
            .status()
            .context("nvcc runs")?;
        ensure!(st.success(), "nvcc {p}.cu failed");
        let mut progress = |s: &str| eprint!("\r\x1b[2K{s}");
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        out.push(measure::measure(
            &bench,
            &format!("cudart/{p}"),
            &exe,
            &args,
            warmup,
            repeats,
            &mut progress,
        )?);
        eprint!("\r\x1b[2K");
    }
    Ok(out)
}
