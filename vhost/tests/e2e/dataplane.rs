//! The data plane: a host-local guest and its API server exchange frames on shared-
//! memory rings; the daemon keeps the control plane (admission, spawning, accounting,
//! teardown) and carries no frame. `HIRA_RINGS=0` keeps the relayed path.

use std::time::Duration;

use hira_apis_opencl::op;
use hira_protocol::FrameKind;
use hira_protocol::handshake::{ErrorPayload, error_code};

use crate::support::{Daemon, RawGuest, Vendors, c_program, run_native, run_with_timeout};

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
fn programs_match_native_relayed_and_with_synchronous_forwarding() {
    // The suite's programs run on rings with asynchronous forwarding by default;
    // these run relayed (as VM guests without a window do) and with every call
    // forwarded synchronously (`HIRA_SYNC=1`), and must give the same output.
    let daemon = Daemon::start(&["vm1"]);
    let vendors = Vendors::hira();
    let native_vendors = Vendors::native();
    let programs = [
        ("vecadd", ""),
        ("matmul", ""),
        ("stencil", "300"),
        ("events", ""),
        ("mapping", ""),
        ("threads", ""),
        ("api_coverage", ""),
        ("cl3x", ""),
        ("usergate", ""),
        ("errors", "sync"),
    ];
    for (name, args) in programs {
        let exe = c_program(name);
        let args: Vec<&str> = args.split_whitespace().collect();
        let native = run_with_timeout(
            std::process::Command::new(&exe)
                .args(&args)
                .env("OCL_ICD_VENDORS", native_vendors.dir.path()),
            Duration::from_secs(120),
        );
        for (key, value) in [("HIRA_RINGS", "0"), ("HIRA_SYNC", "1")] {
            let remote = run_with_timeout(
                daemon
                    .guest(&vendors, "vm1", &exe)
                    .args(&args)
                    .env(key, value),
                Duration::from_secs(120),
            );
            assert_eq!(
                native.status.code(),
                remote.status.code(),
                "{name} with {key}={value}: {}",
                String::from_utf8_lossy(&remote.stderr)
            );
            assert_eq!(
                String::from_utf8_lossy(&native.stdout),
                String::from_utf8_lossy(&remote.stdout),
                "{name} with {key}={value}"
            );
        }
    }
}

#[test]
fn a_blocking_write_returns_once_its_data_is_sent() {
    // tests/c/early_write.c: a blocking write behind a user-event barrier returns at
    // once with its data taken (natively it would wait for the barrier), and lands in
    // order; with an event, or on an out-of-order queue, a blocking write has
    // completed when it returns, as natively.
    let daemon = Daemon::start(&["vm1"]);
    let vendors = Vendors::hira();
    let exe = c_program("early_write");
    for rings in ["1", "0"] {
        let o = run_with_timeout(
            daemon.guest(&vendors, "vm1", &exe).env("HIRA_RINGS", rings),
            Duration::from_secs(120),
        );
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            "ok\n",
            "HIRA_RINGS={rings}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(o.status.success());
    }
}

#[test]
fn large_transfers_stream_through_a_few_window_pages_and_match_native() {
    // tests/c/stream.c: buffers created from 12-40 MiB of host memory, blocking writes
    // and reads at odd offsets, a kernel right after a streamed write, two threads.
    // The output must be the native one with the default window, a window of 4 MiB
    // (chunks of 512 KiB), writes from 16 MiB copied around the caches by the guest
    // and the API server (8 MiB chunks: `nontemporal.rs`, at odd offsets of the
    // application's memory), every call synchronous, and frames relayed. The
    // buffers' storage is in the window by default (`zero_copy`); the pages touched are
    // measured with it off, where every transfer streams.
    let daemon = Daemon::start(&["vm1"]);
    let vendors = Vendors::hira();
    let exe = c_program("stream");
    let native = run_native(&exe, &[]);
    assert!(native.status.success());
    let native = String::from_utf8_lossy(&native.stdout).to_string();
    assert!(native.contains("same 1 flags"), "{native}");
    for env in [
        None,
        Some(("HIRA_ZERO_COPY", "0")),
        Some(("HIRA_WINDOW_MB", "4")),
        Some(("HIRA_STREAM_NT_MIN_KB", "16384")),
        Some(("HIRA_SYNC", "1")),
        Some(("HIRA_RINGS", "0")),
    ] {
        let mut cmd = daemon.guest(&vendors, "vm1", &exe);
        cmd.arg("shmem");
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let o = run_with_timeout(&mut cmd, Duration::from_secs(180));
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{env:?}: {stderr}");
        assert_eq!(String::from_utf8_lossy(&o.stdout), native, "{env:?}");
        if env == Some(("HIRA_ZERO_COPY", "0")) {
            // Streamed, a 40 MiB transfer uses four 4 MiB chunks of the window again
            // and again; whole, it would touch 40 MiB of window pages.
            let kib: u64 = stderr
                .lines()
                .find_map(|l| l.strip_prefix("shmem "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("no shmem line: {stderr}"));
            assert!(kib < 32 * 1024, "{kib} KiB of shared memory touched");
        }
    }
}

#[test]
fn event_status_and_profiling_after_a_wait_are_answered_in_the_guest() {
    // tests/c/known.c: after clFinish or clWaitForEvents, the status and profiling
    // queries of the events waited for (queues with and without profiling, sizes too
    // small, size-only queries) print what they print natively, and none of them
    // crossed to the host: the reply of the call that waited reported them.
    let daemon = Daemon::start(&["vm1"]);
    let vendors = Vendors::hira();
    let exe = c_program("known");
    let native = run_native(&exe, &[]);
    assert!(native.status.success());
    let stats_dir = tempfile::tempdir().unwrap();
    for rings in ["1", "0"] {
        let stats = stats_dir.path().join(format!("stats-{rings}"));
        let o = run_with_timeout(
            daemon
                .guest(&vendors, "vm1", &exe)
                .env("HIRA_RINGS", rings)
                .env("HIRA_STATS", &stats),
            Duration::from_secs(120),
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&native.stdout),
            "HIRA_RINGS={rings}"
        );
        let table = std::fs::read_to_string(&stats).unwrap();
        for function in ["clGetEventInfo", "clGetEventProfilingInfo"] {
            assert!(stats_column(&table, function, 2) > 0, "{table}");
            assert_eq!(
                stats_column(&table, function, 5),
                0,
                "{function} sent nothing:\n{table}"
            );
        }
    }
}

#[test]
fn maps_move_only_their_regions_and_read_only_unmaps_send_nothing_back() {
    // tests/c/map_regions.c: regions of a 4 MiB buffer, a 4 MiB 2D array, a 1 MiB 3D
    // image and a 1D array, mapped for reading, writing and invalidating, give the
    // native results; the shim's statistics count as object data exactly the regions
    // the program says it mapped for reading or writing (maps) and wrote (unmaps).
    let daemon = Daemon::start(&["vm1"]);
    let vendors = Vendors::hira();
    let exe = c_program("map_regions");
    let native = run_native(&exe, &[]);
    assert!(native.status.success());
    let expected = String::from_utf8_lossy(&native.stdout).into_owned();
    let (map_in, unmap_out): (u64, u64) = expected
        .lines()
        .find_map(|l| l.strip_prefix("data: maps bring in "))
        .and_then(|l| {
            let (a, b) = l.split_once(" bytes, unmaps send back ")?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .unwrap_or_else(|| panic!("no data line: {expected}"));
    assert!(!expected.contains("WRONG"), "{expected}");
    let stats_dir = tempfile::tempdir().unwrap();
    // With the objects in the data window (the default on PoCL, a device sharing
    // memory with the host), every map is the host's own and nothing is copied: all
    // four objects are at least the 64 KiB that go there. Without, the regions cross.
    for (rings, zero_copy) in [("1", "1"), ("1", "0"), ("0", "0")] {
        let stats = stats_dir.path().join(format!("stats-{rings}-{zero_copy}"));
        let o = run_with_timeout(
            daemon
                .guest(&vendors, "vm1", &exe)
                .env("HIRA_RINGS", rings)
                .env("HIRA_ZERO_COPY", zero_copy)
                .env("HIRA_STATS", &stats),
            Duration::from_secs(120),
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(String::from_utf8_lossy(&o.stdout), expected);
        let table = std::fs::read_to_string(&stats).unwrap();
        let column = |function: &str, at: usize| stats_column(&table, function, at);
        if zero_copy == "1" {
            for (function, at) in [
                ("clEnqueueMapBuffer", 7),
                ("clEnqueueMapImage", 7),
                ("clEnqueueUnmapMemObject", 8),
            ] {
                assert_eq!(column(function, at), 0, "{function}: {table}");
            }
            let crossed = column("clEnqueueMapBuffer", 6)
                + column("clEnqueueMapImage", 6)
                + column("clEnqueueUnmapMemObject", 5);
            assert!(crossed < 64 * 1024, "{table}");
            continue;
        }
        assert_eq!(
            column("clEnqueueMapBuffer", 7) + column("clEnqueueMapImage", 7),
            map_in,
            "{table}"
        );
        assert_eq!(column("clEnqueueUnmapMemObject", 8), unmap_out, "{table}");
        assert_eq!(column("clEnqueueMapImage", 8), 0, "{table}");
        // Everything that crossed for the maps is the regions and a little framing:
        // not the 9 MiB of the objects.
        let received = column("clEnqueueMapBuffer", 6) + column("clEnqueueMapImage", 6);
        assert!(received < map_in + 64 * 1024, "{table}");
        let sent = column("clEnqueueUnmapMemObject", 5);
        assert!(sent < unmap_out + 64 * 1024, "{table}");
    }
}

#[test]
fn objects_in_the_window_are_mapped_in_place_and_their_regions_serve_again() {
    // tests/c/window_objects.c: 24 rounds of an 8 MiB buffer (mapped, a sub-buffer of
    // it mapped, a kernel on it), a 2 MiB image array (a region mapped), released
    // while a read of the buffer still waits behind a user event. In a 40 MiB window
    // (20 MiB for objects) every object still lives in the window, so no map copies
    // anything: regions come back once the host has destroyed their objects. In a
    // 24 MiB one a new buffer finds the region of the one its read still waits on
    // taken (the late reads give their round's data), and goes elsewhere. Off, the
    // same output.
    let daemon = Daemon::start(&["vm1"]);
    let vendors = Vendors::hira();
    let exe = c_program("window_objects");
    let native = run_native(&exe, &[]);
    assert!(native.status.success());
    let expected = String::from_utf8_lossy(&native.stdout).into_owned();
    assert_eq!(expected.lines().count(), 48, "{expected}");
    let stats_dir = tempfile::tempdir().unwrap();
    for (window, zero_copy) in [("40", "1"), ("24", "1"), ("40", "0")] {
        let stats = stats_dir.path().join(format!("stats-{window}-{zero_copy}"));
        let o = run_with_timeout(
            daemon
                .guest(&vendors, "vm1", &exe)
                .env("HIRA_WINDOW_MB", window)
                .env("HIRA_ZERO_COPY", zero_copy)
                .env("HIRA_STATS", &stats),
            Duration::from_secs(180),
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            expected,
            "HIRA_WINDOW_MB={window} HIRA_ZERO_COPY={zero_copy}"
        );
        let table = std::fs::read_to_string(&stats).unwrap();
        let column = |function: &str, at: usize| stats_column(&table, function, at);
        let moved = column("clEnqueueMapBuffer", 7)
            + column("clEnqueueMapImage", 7)
            + column("clEnqueueUnmapMemObject", 8);
        if window == "40" && zero_copy == "1" {
            assert_eq!(moved, 0, "{table}");
        } else if zero_copy == "0" {
            assert!(moved > 24 * (8 << 20), "{table}");
        }
    }
}

#[test]
fn an_enqueue_of_a_finalized_idle_command_buffer_goes_without_waiting() {
    // tests/c/command_buffer.c "bench": each round enqueues the recorded buffer after
    // the same thread's clFinish of its queue, so the guest knows the host runs it:
    // every enqueue is forwarded without a reply (nothing received), and the kernels
    // count as natively.
    let daemon = Daemon::start(&["vm1"]);
    let vendors = Vendors::hira();
    let exe = c_program("command_buffer");
    let stats_dir = tempfile::tempdir().unwrap();
    let stats = stats_dir.path().join("stats");
    let o = run_with_timeout(
        daemon
            .guest(&vendors, "vm1", &exe)
            .args(["bench", "8", "5"])
            .env("HIRA_STATS", &stats),
        Duration::from_secs(120),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("counted right"), "{out}");
    let table = std::fs::read_to_string(&stats).unwrap();
    assert_eq!(
        stats_column(&table, "clEnqueueCommandBufferKHR", 2),
        5,
        "{table}"
    );
    assert_eq!(
        stats_column(&table, "clEnqueueCommandBufferKHR", 6),
        0,
        "an enqueue waited for a reply:\n{table}"
    );
}

/// Column `at` of `function`'s row of the shim's statistics (`HIRA_STATS=PATH`):
/// `hira-stats: NAME calls total-ms mean-us bytes-sent bytes-received data-in data-out`,
/// the total milliseconds rounded down.
fn stats_column(table: &str, function: &str, at: usize) -> u64 {
    table
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(function))
        .and_then(|l| l.split_whitespace().nth(at))
        .and_then(|v| v.split('.').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {function} row with a column {at}:\n{table}"))
}
