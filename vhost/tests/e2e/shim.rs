//! Guest-shim behaviour that has no native counterpart to compare with.

use std::time::Duration;

use crate::support::{Daemon, Vendors, c_program, run_with_timeout};

/// Commands the daemon forwarded for each ended session of process `name`, in order,
/// from the daemon's control socket once every session has ended.
fn commands_of(daemon: &Daemon, name: &str) -> Vec<u64> {
    daemon
        .wait_idle(Duration::from_secs(30))
        .iter()
        .filter(|e| e["process"] == name)
        .map(|e| e["commands"].as_u64().unwrap())
        .collect()
}

#[test]
fn immutable_info_queries_are_answered_by_the_guest_cache() {
    let daemon = Daemon::start(&["vm1"]);
    let vendors = Vendors::hira();
    let exe = c_program("info_cache");
    let once = run_with_timeout(
        daemon.guest(&vendors, "vm1", &exe).arg("1"),
        Duration::from_secs(60),
    );
    assert!(once.status.success());
    let many = run_with_timeout(
        daemon.guest(&vendors, "vm1", &exe).arg("500"),
        Duration::from_secs(60),
    );
    assert!(many.status.success());
    assert!(String::from_utf8_lossy(&many.stdout).contains("queries=500 name_len_ok=1 units>0=1"));
    let counts = commands_of(&daemon, "info_cache");
    assert_eq!(counts.len(), 2);
    let (a, b) = (counts[0], counts[1]);
    assert!(a > 0);
    assert_eq!(
        a, b,
        "2,000 repeated device and platform queries reached the host"
    );
}

#[test]
fn unsupported_entries_fail_cleanly_and_are_logged_once() {
    let daemon = Daemon::start(&["vm1"]);
    let vendors = Vendors::hira();
    let out = run_with_timeout(
        daemon
            .guest(&vendors, "vm1", &c_program("unsupported"))
            .env("HIRA_LOG", "warn"),
        Duration::from_secs(60),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert_eq!(
        stdout,
        "clCreatePipe: null=1 CL_INVALID_OPERATION\nclCreatePipe: null=1 CL_INVALID_OPERATION\n\
         clSVMAlloc fine-grained: null=1\n"
    );
    assert_eq!(
        stderr
            .matches("clCreatePipe is not supported by Hira")
            .count(),
        1,
        "{stderr}"
    );
}
