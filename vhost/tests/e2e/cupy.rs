//! CuPy, unmodified, through Hira: a part of CuPy's own test suite (elementwise
//! kernels, reductions, indexing, random numbers) run by pytest natively and through
//! Hira's `libcuda.so.1` on the same driver, with the same outcome for every test.
//!
//! CuPy compiles its kernels with NVRTC in the guest (`CUPY_COMPILE_WITH_PTX=1`: PTX,
//! which the CPU test executor interprets) and brings NVIDIA's runtime, cuRAND and
//! CUB with it. `scripts/test` installs CuPy's CUDA 13 wheel and its test suite (from
//! CuPy's source distribution) under `target/cupy`. Without a GPU the driver is the
//! CPU test executor, built optimised whatever this test's profile (a debug build
//! takes minutes for what this runs in one).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::cuda::{kit, real_gpu};
use crate::support::*;

/// The version `scripts/lib.sh` installs.
const CUPY: &str = "target/cupy/cupy-14.2.0";

/// The part of CuPy's suite run here: files, and a `-k` selection within them.
const TESTS: &[&str] = &[
    "tests/cupy_tests/core_tests/test_elementwise.py",
    "tests/cupy_tests/indexing_tests/test_indexing.py",
    "tests/cupy_tests/random_tests/test_sample.py",
    "tests/cupy_tests/math_tests/test_sumprod.py",
];
const SELECT: &str = "not test_sumprod.py or TestSumprod or TestCumsum";

/// A directory holding the optimised executor as `libcuda.so.1` (`None` on a GPU).
fn driver_dir() -> Option<PathBuf> {
    if real_gpu() {
        return None;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(cargo)
        .current_dir(workspace())
        .args(["build", "--release", "-p", "hira-tests-cuda-cpu"])
        .status()
        .expect("cargo runs");
    assert!(st.success(), "building the CPU test executor failed");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cupy-driver");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        workspace().join("target/release/libcuda.so"),
        dir.join("libcuda.so.1"),
    )
    .unwrap();
    Some(dir)
}

/// Each test's outcome (`PASSED`, `FAILED`, `SKIPPED`, `XFAIL`, ...), from pytest's
/// verbose lines (`ID OUTCOME [ NN%]`).
fn outcomes(stdout: &str) -> BTreeMap<String, String> {
    stdout
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (id, outcome) = (w.next()?, w.next()?);
            (id.contains("::") && outcome.chars().all(|c| c.is_ascii_uppercase()))
                .then(|| (id.to_string(), outcome.to_string()))
        })
        .collect()
}

/// Runs the selection with `libs` first on the library path.
fn pytest(libs: &Path, env: &[(&str, &str)], cache: &Path) -> (BTreeMap<String, String>, String) {
    let top = workspace().join(CUPY);
    let mut c = Command::new(workspace().join("target/cupy/venv/bin/python"));
    c.current_dir(&top)
        .args([
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-v",
            "--timeout",
            "900",
        ])
        .args(["-m", "not slow and not multi_gpu", "-k", SELECT])
        .args(TESTS)
        .env("LD_LIBRARY_PATH", libs)
        .env("CUPY_COMPILE_WITH_PTX", "1")
        .env("CUPY_ACCELERATORS", "")
        .env("CUPY_CACHE_DIR", cache);
    for (k, v) in env {
        c.env(k, v);
    }
    let o = run_with_timeout(&mut c, Duration::from_secs(3600));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let text = format!("{out}\n{}", String::from_utf8_lossy(&o.stderr));
    (outcomes(&out), text)
}

#[test]
fn cupys_own_tests_have_the_same_outcomes_natively_and_through_hira() {
    if !workspace().join(CUPY).is_dir() {
        eprintln!("skipped: CuPy and its tests are not installed (scripts/test installs them)");
        return;
    }
    let k = kit();
    let driver = driver_dir();
    // The API servers load the same driver.
    let lib_path = driver
        .as_ref()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let d = if driver.is_some() {
        crate::cuda::daemon_for_tests(&[("LD_LIBRARY_PATH", &lib_path)])
    } else {
        crate::cuda::daemon_for_tests(&[])
    };
    let tmp = tempfile::tempdir().unwrap();
    let native_libs = driver.clone().unwrap_or_else(|| tmp.path().join("none"));
    let started = std::time::Instant::now();
    let (native, native_text) = pytest(&native_libs, &[], &tmp.path().join("native"));
    let native_s = started.elapsed().as_secs_f64();
    let passed = native.values().filter(|o| *o == "PASSED").count();
    assert!(
        passed >= 150,
        "{passed} of {} passed natively:\n{native_text}",
        native.len()
    );
    let socket = d.socket("vm1");
    let started = std::time::Instant::now();
    let (hira, hira_text) = pytest(
        &k.shim_dir(),
        &[("HIRA_SOCKET", &socket.to_string_lossy())],
        &tmp.path().join("hira"),
    );
    let hira_s = started.elapsed().as_secs_f64();
    let mut counts = BTreeMap::new();
    for o in native.values() {
        *counts.entry(o.as_str()).or_insert(0) += 1;
    }
    eprintln!(
        "CuPy's tests: {counts:?} natively in {native_s:.0} s; through Hira in {hira_s:.0} s"
    );
    let differ: Vec<String> = native
        .iter()
        .filter(|(id, o)| hira.get(*id) != Some(o))
        .map(|(id, o)| format!("{id}: {o} natively, {:?} through Hira", hira.get(id)))
        .collect();
    assert!(
        differ.is_empty() && hira.len() == native.len(),
        "{} tests natively, {} through Hira; differing: {differ:#?}\n{hira_text}",
        native.len(),
        hira.len()
    );
}
