//! The README's commands run as written, so the page cannot rot. Its shell blocks
//! are read from `README.md`. The operator's quick start is `scripts/quickstart`
//! line for line (checked here), which the libvirt test runs
//! (`libvirt::the_operators_quick_start_runs_an_opencl_program_in_a_libvirt_domain`).
//! Every other command is run here, against a daemon this test starts: `scripts/test`
//! is what CI runs (this test is part of it) and `scripts/demo` runs in CI right after
//! it (`.ci/run`); `cargo build` lines are this build; `target/release/` is this
//! build's binaries. A command this test does not know fails it: a new line in the
//! README needs a way to run here.

use std::process::Command;
use std::time::Duration;

use super::support::*;

/// The README's shell commands, each with the heading it is under: continuation
/// lines joined, comments dropped.
fn readme_commands() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    let mut commands = Vec::new();
    let mut in_sh = false;
    let mut heading = String::new();
    let mut pending = String::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_sh = line == "```sh";
            continue;
        }
        if !in_sh {
            if let Some(h) = line.strip_prefix("## ") {
                heading = h.to_string();
            }
            continue;
        }
        if line.trim_start().starts_with('#') {
            continue;
        }
        let code = comment_cut(line).trim();
        match code.strip_suffix('\\') {
            Some(head) => pending.push_str(head),
            None => {
                pending.push_str(code);
                if !pending.trim().is_empty() {
                    let command = pending.split_whitespace().collect::<Vec<_>>().join(" ");
                    commands.push((heading.clone(), command));
                }
                pending.clear();
            }
        }
    }
    commands
}

/// A line without the comment after its command: two spaces or more, then `#`.
fn comment_cut(line: &str) -> &str {
    match line.find("  #") {
        Some(i) => &line[..i],
        None => line,
    }
}

/// The commands of `scripts/quickstart`, normalised as [`readme_commands`] does.
fn quickstart_lines() -> Vec<String> {
    std::fs::read_to_string(workspace().join("scripts/quickstart"))
        .unwrap()
        .lines()
        .map(|l| {
            comment_cut(l)
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        })
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

/// A command's words, with this build's binaries.
fn words(command: &str) -> Vec<String> {
    command
        .split_whitespace()
        .map(|w| match w.strip_prefix("target/release/") {
            Some(file) => bin_dir().join(file).display().to_string(),
            None => w.to_string(),
        })
        .collect()
}

fn run(words: &[String], env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(&words[0]);
    cmd.args(&words[1..]).current_dir(workspace());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = run_with_timeout(&mut cmd, Duration::from_secs(60));
    assert!(
        out.status.success(),
        "{words:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn every_command_in_the_readme_runs() {
    ensure_built();
    let dir = tempfile::tempdir().unwrap();
    let guest = dir.path().join("guest");
    let quickstart = quickstart_lines();
    let mut next_line = 0;
    let mut daemon: Option<Daemon> = None;
    let mut ran = Vec::new();
    for (heading, command) in readme_commands() {
        if heading == "Quick start: an operator" {
            // scripts/quickstart, line for line and in order.
            let at = quickstart[next_line..]
                .iter()
                .position(|l| *l == command)
                .unwrap_or_else(|| {
                    panic!("scripts/quickstart runs {command:?} (after line {next_line})")
                });
            next_line += at + 1;
            ran.push(command);
            continue;
        }
        let w = words(&command);
        match w[0].as_str() {
            // What CI runs: scripts/test is the run this test is part of; .ci/run
            // runs scripts/demo after it.
            "scripts/test" | "scripts/demo" => {
                let ci = std::fs::read_to_string(workspace().join(".ci/run")).unwrap();
                assert!(ci.contains(&w[0]), ".ci/run runs {}", w[0]);
            }
            // This build.
            "cargo" => {
                assert_eq!(w[1], "build", "{command}");
                for p in w.iter().skip_while(|a| *a != "-p").skip(1).step_by(2) {
                    let manifest = std::fs::read_to_string(
                        workspace()
                            .join(p.trim_start_matches("hira-"))
                            .join("Cargo.toml"),
                    )
                    .unwrap_or_default();
                    assert!(manifest.contains(&format!("name = \"{p}\"")), "package {p}");
                }
            }
            "scripts/guest-install" => {
                // Into a guest's root, as its usage says, rather than this machine's.
                let mut w = w.clone();
                w.insert(1, "--root".into());
                w.insert(2, guest.display().to_string());
                run(&w, &[]);
                assert!(guest.join("etc/OpenCL/vendors/hira.icd").exists());
            }
            "clinfo" => {
                // The guest's ICD file names its library in the guest's root; the
                // daemon is an operator's, serving host-local applications.
                let vendors = dir.path().join("vendors");
                std::fs::create_dir_all(&vendors).unwrap();
                let lib =
                    std::fs::read_to_string(guest.join("etc/OpenCL/vendors/hira.icd")).unwrap();
                let lib = guest.join(lib.trim().trim_start_matches('/'));
                std::fs::write(vendors.join("hira.icd"), lib.display().to_string()).unwrap();
                let d = daemon.get_or_insert_with(|| Daemon::start(&["local"]));
                let socket = d.dir.path().join("local.sock");
                let out = run(
                    &w,
                    &[
                        ("OCL_ICD_VENDORS", vendors.to_str().unwrap()),
                        ("HIRA_SOCKET", socket.to_str().unwrap()),
                    ],
                );
                assert!(out.contains("Platform #0"), "{out}");
            }
            _ => panic!("a README command this test cannot run yet: {command}"),
        }
        ran.push(command);
    }
    let libvirt = std::fs::read_to_string(workspace().join("vhost/tests/e2e/libvirt.rs")).unwrap();
    assert!(
        libvirt.contains("scripts/quickstart"),
        "a test runs the quick start"
    );
    assert!(ran.len() >= 15, "{ran:?}");
}
