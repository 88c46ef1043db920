//! Guest-shim behaviour that has no native counterpart to compare with.

use std::time::{Duration, Instant};

use crate::support::{Daemon, Vendors, c_program, run_with_timeout};

/// Commands the daemon forwarded for each session of process `name`, in order, from
/// the line that opens each session and the line that closes it.
fn commands_of(daemon: &Daemon, name: &str, sessions: usize) -> Vec<u64> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let log = daemon.log_text();
        let ids: Vec<String> = log
            .lines()
            .filter(|l| l.contains(&format!(": {name} (guest pid")))
            .filter_map(|l| {
                l.split("session ")
                    .nth(1)?
                    .split(':')
                    .next()
                    .map(str::to_string)
            })
            .collect();
        let counts: Vec<u64> = ids
            .iter()
            .filter_map(|id| {
                let marker = format!("session {id}: ended after ");
                let line = log.lines().find(|l| l.contains(&marker))?;
                line[line.find(&marker)? + marker.len()..]
                    .split(' ')
                    .next()?
                    .parse()
                    .ok()
            })
            .collect();
        if counts.len() == sessions {
            return counts;
        }
        assert!(
            Instant::now() < deadline,
            "{sessions} sessions of {name} did not end:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
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
    let counts = commands_of(&daemon, "info_cache", 2);
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
        "clCreateSubDevices: CL_INVALID_OPERATION\nclCreateSubDevices: CL_INVALID_OPERATION\n\
         clCreatePipe: null=1 CL_INVALID_OPERATION\nclSVMAlloc: null=1\n"
    );
    assert_eq!(
        stderr
            .matches("clCreateSubDevices is not supported by Hira")
            .count(),
        1,
        "{stderr}"
    );
    assert!(
        stderr.contains("clSVMAlloc is not supported by Hira"),
        "{stderr}"
    );
}
