//! What the tests of `hira-bench`'s program comparisons share.

use std::ffi::OsStr;
use std::process::Command;

/// Runs `hira-bench ARGS --src SRC` into a fresh directory and checks its table:
/// `rows` rows, each containing `built` (the columns of a build and its runs) and
/// "identical". Returns the whole report.
pub fn assert_all_identical(args: &[&str], src: &OsStr, rows: usize, built: &str) -> String {
    let out = tempfile::tempdir().unwrap();
    let st = Command::new(env!("CARGO_BIN_EXE_hira-bench"))
        .args(args)
        .arg("--src")
        .arg(src)
        .arg("--out")
        .arg(out.path())
        .status()
        .unwrap();
    let results = std::fs::read_to_string(out.path().join("results.md")).unwrap();
    assert!(st.success(), "{results}");
    // The table, after the stamp saying what produced it.
    let got = table_rows(&results, "|");
    assert_eq!(got.len(), rows, "{results}");
    assert!(
        got.iter()
            .all(|r| r.contains(built) && r.contains("identical")),
        "{results}"
    );
    results
}

/// The rows of the first Markdown table in `text` whose header starts with `header`.
pub fn table_rows<'a>(text: &'a str, header: &str) -> Vec<&'a str> {
    text.lines()
        .skip_while(|l| !l.starts_with(header))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .collect()
}
