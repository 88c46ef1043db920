//! `hira-bench rodinia` end to end on a real Rodinia checkout: a few programs built
//! with their own Makefiles, run natively and through Hira, outputs compared.
//!
//! Rodinia is not vendored and CI cannot fetch it (no network): the test runs when
//! `HIRA_RODINIA` names a checkout and says so when it skips.

use std::process::Command;

#[test]
fn rodinia_programs_give_identical_output_through_hira() {
    let Some(src) = std::env::var_os("HIRA_RODINIA") else {
        eprintln!(
            "skipped: set HIRA_RODINIA to a Rodinia 3.1 checkout (not vendored; CI has no network)"
        );
        return;
    };
    let out = tempfile::tempdir().unwrap();
    let st = Command::new(env!("CARGO_BIN_EXE_hira-bench"))
        .args(["rodinia", "--only", "srad,nn,hotspot,b+tree", "--src"])
        .arg(&src)
        .arg("--out")
        .arg(out.path())
        .status()
        .unwrap();
    let results = std::fs::read_to_string(out.path().join("results.md")).unwrap();
    assert!(st.success(), "{results}");
    // Four rows, every one built and identical.
    let rows: Vec<&str> = results.lines().skip(2).collect();
    assert_eq!(rows.len(), 4, "{results}");
    assert!(
        rows.iter()
            .all(|r| r.contains("| yes |") && r.contains("identical"))
    );
}

#[test]
fn rodinia_cuda_programs_built_by_nvcc_give_identical_output_through_hira() {
    let Some(src) = std::env::var_os("HIRA_RODINIA") else {
        eprintln!(
            "skipped: set HIRA_RODINIA to a Rodinia 3.1 checkout (not vendored; CI has no network)"
        );
        return;
    };
    let out = tempfile::tempdir().unwrap();
    let st = Command::new(env!("CARGO_BIN_EXE_hira-bench"))
        .args([
            "rodinia",
            "--api",
            "cuda",
            "--only",
            "bfs,hotspot,nw,pathfinder",
            "--src",
        ])
        .arg(&src)
        .arg("--out")
        .arg(out.path())
        .status()
        .unwrap();
    let results = std::fs::read_to_string(out.path().join("results.md")).unwrap();
    assert!(st.success(), "{results}");
    let rows: Vec<&str> = results.lines().skip(2).collect();
    assert_eq!(rows.len(), 4, "{results}");
    assert!(
        rows.iter()
            .all(|r| r.contains("| yes |") && r.contains("identical"))
    );
}
