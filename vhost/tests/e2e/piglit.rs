//! piglit's OpenCL tests (the Mesa project's suite, Debian package `piglit`, which
//! `scripts/test` installs): every API and custom test, and a sample of the program
//! tests, run natively and through Hira. A test passes through Hira exactly when it
//! passes natively; the only other difference allowed is a test that crashes natively (in
//! the host implementation) and fails cleanly through Hira, where the crash is the
//! API server's.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use crate::support::{Daemon, Vendors, run_with_timeout};

const PIGLIT: &str = "/usr/lib/x86_64-linux-gnu/piglit";

/// What piglit reported: its last `"result": "..."`, or how the process ended.
fn result(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout);
    let reported = text
        .lines()
        .filter_map(|l| l.split("\"result\": \"").nth(1))
        .filter_map(|r| r.split('"').next())
        .next_back();
    match reported {
        Some(r) => r.to_string(),
        None if out.status.success() => "no result".into(),
        None => "crash".into(),
    }
}

fn piglit() -> Option<PathBuf> {
    let dir = Path::new(PIGLIT);
    if dir.join("bin").is_dir() {
        Some(dir.to_path_buf())
    } else {
        eprintln!("skipped: piglit is not installed (scripts/test installs it)");
        None
    }
}

/// Runs each `(program, args)` natively and through one daemon and asserts the rule
/// above, and that at least `min_passed` pass both ways.
fn assert_agree(runs: &[(PathBuf, Vec<String>)], cwd: &Path, min_passed: usize) {
    let daemon = Daemon::start(&["vm1"]);
    let native = Vendors::native();
    let hira = Vendors::hira();
    let mut bad = Vec::new();
    let mut all = Vec::new();
    let mut passed = 0;
    for (exe, args) in runs {
        let name = format!(
            "{} {}",
            exe.file_name().unwrap().to_string_lossy(),
            args.join(" ")
        );
        let n = result(&run_with_timeout(
            Command::new(exe)
                .args(args)
                .arg("-auto")
                .current_dir(cwd)
                .env("OCL_ICD_VENDORS", native.dir.path()),
            Duration::from_secs(300),
        ));
        let h = result(&run_with_timeout(
            daemon
                .guest(&hira, "vm1", exe)
                .args(args)
                .arg("-auto")
                .current_dir(cwd),
            Duration::from_secs(300),
        ));
        all.push(format!("{name}: {n} / {h}"));
        passed += usize::from(n == "pass" && h == "pass");
        if n != h && !(n == "crash" && h == "fail") {
            bad.push(format!("{name}: natively {n}, through Hira {h}"));
        }
    }
    assert!(bad.is_empty(), "differences:\n{}", bad.join("\n"));
    assert!(
        passed >= min_passed,
        "most pass natively:\n{}",
        all.join("\n")
    );
}

#[test]
fn piglit_opencl_api_and_custom_tests_match_native() {
    let Some(root) = piglit() else { return };
    let mut tests: Vec<PathBuf> = std::fs::read_dir(root.join("bin"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            // The interop test needs EGL; the program tester runs below.
            name.starts_with("cl-") && !name.contains("interop") && name != "cl-program-tester"
        })
        .collect();
    tests.sort();
    assert!(tests.len() >= 50, "piglit has its OpenCL tests: {tests:?}");
    let runs: Vec<(PathBuf, Vec<String>)> = tests.into_iter().map(|t| (t, vec![])).collect();
    assert_agree(&runs, &root, 40);
}

#[test]
fn piglit_opencl_program_tests_match_native() {
    let Some(root) = piglit() else { return };
    let tester = root.join("bin/cl-program-tester");
    // A sample across what the tester covers: builds (with and without errors,
    // options, include directories) and kernels executed with argument checks.
    let programs = [
        "build/define-GENTYPE.cl",
        "build/disable-warnings.cl",
        "build/fail/add-different-size-vector.cl",
        "build/fail/warnings-as-errors.cl",
        "build/include-directories.cl",
        "build/macro-definitions-with-values.cl",
        "build/math-intrinsics.cl",
        "execute/builtin/atomic/atomic_add-global-return.cl",
        "execute/get-global-id.cl",
        "execute/global-offset.cl",
        "execute/image-read-2d.cl",
        "execute/local-memory.cl",
        "execute/sampler.cl",
        "execute/scalar-arithmetic-int.cl",
        "execute/scalar-load-int.program_test",
        "execute/sha256-Ch.cl",
        "execute/sizeof.cl",
        "execute/vector-conversion.cl",
    ];
    let dir = root.join("tests/cl/program");
    let runs: Vec<(PathBuf, Vec<String>)> = programs
        .iter()
        .filter(|p| dir.join(p).is_file())
        .map(|p| (tester.clone(), vec![(*p).to_string()]))
        .collect();
    assert_eq!(runs.len(), programs.len(), "piglit has these program tests");
    assert_agree(&runs, &dir, 8);
}
