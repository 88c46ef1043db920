//! The workload suite runs in its short configuration, and every workload verifies its
//! result natively and through Hira, with the same output both ways.

use std::process::Command;

#[test]
fn every_workload_verifies_natively_and_through_hira() {
    suite_verifies(&[]);
}

/// With asynchronous forwarding off, and with every frame relayed by the daemon, each
/// workload's output is the same as natively too.
#[test]
fn every_workload_verifies_with_synchronous_forwarding_and_relayed_frames() {
    suite_verifies(&["--hira-env", "HIRA_SYNC=1"]);
    suite_verifies(&["--hira-env", "HIRA_RINGS=0"]);
}

fn suite_verifies(extra: &[&str]) {
    let out = tempfile::tempdir().unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_hira-bench"))
        .args([
            "suite",
            "--short",
            "--warmup",
            "0",
            "--repeats",
            "1",
            "--out",
        ])
        .arg(out.path())
        .args(extra)
        .output()
        .expect("hira-bench runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "suite failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let json = std::fs::read_to_string(out.path().join("results.json")).unwrap();
    for (name, _) in hira_benches::suite::WORKLOADS {
        let at = json
            .find(&format!("\"name\":\"{name}\""))
            .unwrap_or_else(|| panic!("{name} missing from {json}"));
        let row = &json[at..at + json[at..].find('}').unwrap()];
        for flag in [
            "\"native_verified\":true",
            "\"hira_verified\":true",
            "\"outputs_match\":true",
        ] {
            assert!(row.contains(flag), "{name}: {flag} expected in {row}");
        }
        assert!(
            !row.contains("\"calls\":0,"),
            "{name}: the shim counted its calls: {row}"
        );
    }
    assert!(
        stdout.contains("**geometric mean**"),
        "the table is printed:\n{stdout}"
    );
    for f in ["results.md", "results.svg"] {
        assert!(out.path().join(f).is_file(), "{f} written");
    }
}
