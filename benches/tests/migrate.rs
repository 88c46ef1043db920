//! Every suite workload (short configuration) is moved at random points while it
//! runs, to new API servers of its daemon and to another daemon, and its output is the
//! native one each time.

use std::process::Command;

#[test]
fn every_workload_gives_native_output_while_it_moves() {
    moves_keep_outputs(&[]);
}

#[test]
fn every_workload_gives_native_output_while_it_moves_between_daemons() {
    moves_keep_outputs(&["--between-daemons"]);
}

fn moves_keep_outputs(extra: &[&str]) {
    let out = tempfile::tempdir().unwrap();
    let md = out.path().join("migrate.md");
    let run = Command::new(env!("CARGO_BIN_EXE_hira-bench"))
        .args([
            "migrate", "--short", "--rounds", "2", "--points", "3", "--out",
        ])
        .arg(&md)
        .args(extra)
        .output()
        .expect("hira-bench runs");
    let report = std::fs::read_to_string(&md).unwrap_or_default();
    assert!(
        run.status.success(),
        "{report}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    // | workload | runs | output = native | moves | refused | ...
    let mut moves = 0;
    let mut rows = 0;
    for name in hira_benches::suite::WORKLOADS.iter().map(|(n, _)| n) {
        let row = report
            .lines()
            .find(|l| l.starts_with(&format!("| {name} |")))
            .unwrap_or_else(|| panic!("{name} missing from\n{report}"));
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        assert_eq!(cells[3], "yes", "{name}: outputs differ:\n{report}");
        moves += cells[4].parse::<u32>().unwrap();
        rows += 1;
    }
    assert_eq!(rows, hira_benches::suite::WORKLOADS.len());
    // Moves land at random times; across these runs some find the programs running.
    assert!(moves > 0, "no session was moved:\n{report}");
}
