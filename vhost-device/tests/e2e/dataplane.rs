//! The data plane: a host-local guest and its API server exchange frames on shared-
//! memory rings; the daemon keeps the control plane (admission, spawning, accounting,
//! teardown) and carries no frame. `HIRA_RINGS=0` keeps the relayed path.

use std::time::Duration;

use hira_protocol::FrameKind;
use hira_protocol::handshake::{ErrorPayload, error_code};
use hira_protocol::opencl::op;

use crate::support::{Daemon, RawGuest, Vendors, c_program, run_with_timeout};

/// Sends `n` requests with 1 MiB bodies (clFinish with trailing bytes, which the API
/// server refuses as malformed once it has read them) on an open session, with the
/// daemon stopped (SIGSTOP) throughout when `daemon_stopped`; returns the commands the
/// VM was charged for them.
fn big_requests(daemon: &Daemon, rings: bool, n: u64, daemon_stopped: bool) -> u64 {
    let mut g = RawGuest::session_on(&daemon.socket("vm1"), rings);
    let commands_before = daemon.status()["vms"][0]["commands"].as_u64().unwrap_or(0);
    let pid = daemon.child.id() as i32;
    if daemon_stopped {
        // SAFETY: signals the daemon this test started.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    }
    let body = vec![0x5Au8; 1 << 20];
    let mut codes = Vec::new();
    for _ in 0..n {
        let (h, p) = g.call(op::clFinish, &body);
        codes.push((h.kind, ErrorPayload::decode(&p).map(|e| e.code).ok()));
    }
    if daemon_stopped {
        // SAFETY: as above.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    }
    assert!(
        codes
            .iter()
            .all(|c| *c == (FrameKind::Error, Some(error_code::MALFORMED))),
        "{codes:?}"
    );
    daemon.status()["vms"][0]["commands"].as_u64().unwrap() - commands_before
}

#[test]
fn on_rings_calls_complete_with_the_daemon_stopped_and_are_still_counted() {
    let daemon = Daemon::start(&["vm1"]);
    // The daemon takes no part in a ring session's calls: 8 MiB of requests and
    // their replies go through while it cannot run at all.
    let rings_commands = big_requests(&daemon, true, 8, true);
    let relayed_commands = big_requests(&daemon, false, 8, false);
    assert_eq!(
        (rings_commands, relayed_commands),
        (8, 8),
        "every command is charged to the VM, on rings or relayed"
    );
}

#[test]
fn relayed_sessions_still_match_native() {
    // The suite's programs run on rings by default; these run relayed, as host-local
    // guests that ask for it and as every VM guest without a kernel module do.
    let daemon = Daemon::start(&["vm1"]);
    for (name, args) in [
        ("vecadd", ""),
        ("usergate", ""),
        ("events", ""),
        ("threads", ""),
    ] {
        let exe = c_program(name);
        let args: Vec<&str> = args.split_whitespace().collect();
        let native = run_with_timeout(
            std::process::Command::new(&exe)
                .args(&args)
                .env("OCL_ICD_VENDORS", Vendors::native().dir.path()),
            Duration::from_secs(120),
        );
        let relayed = run_with_timeout(
            daemon
                .guest(&Vendors::hira(), "vm1", &exe)
                .args(&args)
                .env("HIRA_RINGS", "0"),
            Duration::from_secs(120),
        );
        assert_eq!(native.status.code(), relayed.status.code(), "{name}");
        assert_eq!(
            String::from_utf8_lossy(&native.stdout),
            String::from_utf8_lossy(&relayed.stdout),
            "{name}"
        );
    }
}
