//! The README's commands run as written, so the page cannot rot. Its shell blocks
//! are read from `README.md`, and every command in them is run here, with two
//! substitutions an operator's machine does not need: the paths it names under
//! `/run/hira` and `/dev/shm` go to a private directory, and `target/release/` is this
//! build's binaries. `scripts/test` is what CI runs (this test is part of it) and
//! `scripts/demo` runs in CI right after it (`.ci/run`); `cargo build` lines are this
//! build; `hira-ctl top` runs one refresh. A command this test does not know fails
//! it: a new line in the README needs a way to run here.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::support::*;

/// The README's shell commands: continuation lines joined, comments dropped.
fn readme_commands() -> Vec<String> {
    let text = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    let mut commands = Vec::new();
    let mut in_sh = false;
    let mut pending = String::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_sh = line == "```sh";
            continue;
        }
        if !in_sh || line.trim_start().starts_with('#') {
            continue;
        }
        // A comment after the command: two spaces or more, then `#`.
        let code = match line.find("  #") {
            Some(i) => &line[..i],
            None => line,
        };
        let code = code.trim();
        match code.strip_suffix('\\') {
            Some(head) => pending.push_str(head),
            None => {
                pending.push_str(code);
                if !pending.trim().is_empty() {
                    commands.push(pending.split_whitespace().collect::<Vec<_>>().join(" "));
                }
                pending.clear();
            }
        }
    }
    commands
}

/// A command's words, with the operator's paths under `dir` and this build's binaries.
fn words(command: &str, dir: &Path) -> Vec<String> {
    let d = dir.display().to_string();
    command
        .replace("/run/hira/", &format!("{d}/run-"))
        .replace("/dev/shm/", &format!("{d}/shm-"))
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

/// The daemon the operator's quick start starts (`... &`), ready (sd_notify).
struct Started(Child);

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_daemon(words: &[String], dir: &Path) -> Started {
    let ready = dir.join("notify.sock");
    let socket = std::os::unix::net::UnixDatagram::bind(&ready).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    // Killed and reaped when dropped, also if it never gets ready.
    let started = Started(
        Command::new(&words[0])
            .args(&words[1..])
            .env("NOTIFY_SOCKET", &ready)
            .env_remove("OCL_ICD_VENDORS")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("daemon.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let mut buf = [0u8; 512];
    loop {
        let n = socket.recv(&mut buf).unwrap_or_else(|e| {
            panic!(
                "no readiness from {words:?} ({e}): {}",
                std::fs::read_to_string(dir.join("daemon.log")).unwrap_or_default()
            )
        });
        if String::from_utf8_lossy(&buf[..n]).contains("READY=1") {
            return started;
        }
    }
}

#[test]
fn every_command_in_the_readme_runs() {
    ensure_built();
    let dir = tempfile::tempdir().unwrap();
    let guest = dir.path().join("guest");
    let control = dir.path().join("run-control.sock");
    let control = control.to_str().unwrap();
    let mut daemon = None;
    let mut ran = Vec::new();
    for command in readme_commands() {
        let w = words(&command, dir.path());
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
                // The guest's ICD file names its library in the guest's root.
                let vendors = dir.path().join("vendors");
                std::fs::create_dir_all(&vendors).unwrap();
                let lib =
                    std::fs::read_to_string(guest.join("etc/OpenCL/vendors/hira.icd")).unwrap();
                let lib = guest.join(lib.trim().trim_start_matches('/'));
                std::fs::write(vendors.join("hira.icd"), lib.display().to_string()).unwrap();
                let socket = dir.path().join("run-local.sock");
                let out = run(
                    &w,
                    &[
                        ("OCL_ICD_VENDORS", vendors.to_str().unwrap()),
                        ("HIRA_SOCKET", socket.to_str().unwrap()),
                    ],
                );
                assert!(out.contains("Platform #0"), "{out}");
            }
            bin if bin.ends_with("/hira-vhost") => {
                assert_eq!(w.last().map(String::as_str), Some("&"), "{command}");
                daemon = Some(start_daemon(&w[..w.len() - 1], dir.path()));
            }
            bin if bin.ends_with("/hira-ctl") => {
                assert!(daemon.is_some(), "{command}: the daemon runs first");
                let mut w = w.clone();
                w.insert(1, "--socket".into());
                w.insert(2, control.to_string());
                if w[3] == "top" {
                    w.extend(["--iterations".into(), "1".into()]);
                }
                let out = run(&w, &[]);
                if w[3] == "status" {
                    assert!(out.contains("opencl platform: "), "{out}");
                }
                if w[3] == "list" {
                    assert!(out.contains("vm1"), "{out}");
                }
            }
            _ => panic!("a README command this test cannot run yet: {command}"),
        }
        ran.push(command);
    }
    assert!(ran.len() >= 10, "{ran:?}");
}
