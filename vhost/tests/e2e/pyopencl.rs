//! PyOpenCL, a widely used Python binding (from PyPI), under its own test suite (from
//! its source distribution; `scripts/test` installs both): the API-level test files
//! run natively and through Hira, and every test that passes natively passes through
//! Hira. The one exception allowed is a test Hira skips because the feature it needs
//! is masked (fine-grained SVM); nothing passes through Hira that does not natively.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::support::{Daemon, Vendors, run_with_timeout};

const TESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/pyopencl/test");
const FILES: &[&str] = &[
    "test_wrapper.py",
    "test_enqueue_copy.py",
    "test_arrays_in_structs.py",
    "test_clrandom.py",
];

/// `pytest -v` outcomes by test id, with the skip reason where there is one.
fn outcomes(stdout: &str) -> BTreeMap<String, (String, String)> {
    let mut out = BTreeMap::new();
    for line in stdout.lines() {
        // "file.py::test[params] OUTCOME (reason) [ 12%]"; params may hold spaces.
        let Some(line) = line.rsplit_once(" [").map(|(l, _)| l.trim_end()) else {
            continue;
        };
        for outcome in ["PASSED", "FAILED", "SKIPPED", "XFAIL", "XPASS", "ERROR"] {
            let tag = format!(" {outcome}");
            if let Some(at) = line.rfind(&tag)
                && line.contains("::")
            {
                let id = line[..at].to_string();
                let reason = line[at + tag.len()..].trim().to_string();
                out.insert(id, (outcome.to_string(), reason));
                break;
            }
        }
    }
    out
}

/// Tests skipped for a masked feature, from the `-rs` summary
/// ("SKIPPED [2] test_wrapper.py:1247: device does not support fine-grain SVM").
fn masked_skips(stdout: &str) -> usize {
    stdout
        .lines()
        .filter(|l| l.starts_with("SKIPPED [") && l.contains("fine-grain SVM"))
        .filter_map(|l| {
            l["SKIPPED [".len()..]
                .split(']')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .sum()
}

struct Run {
    outcomes: BTreeMap<String, (String, String)>,
    masked: usize,
}

fn pytest(cmd: &mut Command) -> Run {
    let out = run_with_timeout(
        cmd.args(["-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider"])
            .args(FILES)
            .current_dir(TESTS)
            .env("PYOPENCL_NO_CACHE", "1")
            .env("PYTHONDONTWRITEBYTECODE", "1"),
        Duration::from_secs(900),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    Run {
        outcomes: outcomes(&text),
        masked: masked_skips(&text),
    }
}

#[test]
fn pyopencl_test_suite_passes_through_hira_as_natively() {
    let importable = Command::new("python3")
        .args(["-c", "import pyopencl, pytest, mako"])
        .status()
        .is_ok_and(|s| s.success());
    if !importable || !Path::new(TESTS).join(FILES[0]).is_file() {
        eprintln!("skipped: PyOpenCL or its tests are not installed (scripts/test installs them)");
        return;
    }
    let native =
        pytest(Command::new("python3").env("OCL_ICD_VENDORS", Vendors::native().dir.path()));
    let daemon = Daemon::start(&["vm1"]);
    let hira_vendors = Vendors::hira();
    let mut cmd = daemon.guest(&hira_vendors, "vm1", Path::new("python3"));
    let hira = pytest(&mut cmd);

    let passed = native
        .outcomes
        .values()
        .filter(|(o, _)| o == "PASSED")
        .count();
    assert!(
        passed >= 50,
        "most of PyOpenCL's tests pass natively: {:#?}",
        native.outcomes
    );
    let mut bad = Vec::new();
    let mut skipped = 0;
    for (id, (n, _)) in &native.outcomes {
        let h = hira.outcomes.get(id).map_or("missing", |(o, _)| o.as_str());
        if n == "PASSED" && h == "SKIPPED" {
            skipped += 1;
        } else if (n == "PASSED" || h == "PASSED") && n != h {
            bad.push(format!("{id}: natively {n}, through Hira {h}"));
        }
    }
    // Every native pass that Hira skipped is one of its skips for a masked feature.
    assert!(
        skipped <= hira.masked.saturating_sub(native.masked),
        "{skipped} native passes skipped through Hira, {} for masked features",
        hira.masked
    );
    assert!(bad.is_empty(), "differences:\n{}", bad.join("\n"));
}
