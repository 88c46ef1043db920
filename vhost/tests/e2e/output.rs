//! What the host's library prints (a kernel's `printf`, the compiler's diagnostics)
//! reaches the guest program's own standard output and error, as natively, never the
//! daemon's log, and within each session's bound.

use std::time::{Duration, Instant};

use crate::support::{
    Daemon, Vendors, c_program, http_get, metric, run_native, run_with_timeout, vm_entry,
};

/// Runs `name` natively and through Hira (on rings, or relayed through the daemon);
/// both succeed with identical stdout and stderr. Returns the daemon's log.
fn same_output_as_native(name: &str, rings: bool) -> String {
    let exe = c_program(name);
    let native = run_native(&exe, &[]);
    let daemon = Daemon::start(&["vm1"]);
    let vendors = Vendors::hira();
    let mut cmd = daemon.guest(&vendors, "vm1", &exe);
    if !rings {
        cmd.env("HIRA_RINGS", "0");
    }
    let remote = run_with_timeout(&mut cmd, Duration::from_secs(300));
    assert_eq!(remote.status.code(), native.status.code());
    assert_eq!(
        String::from_utf8_lossy(&remote.stdout),
        String::from_utf8_lossy(&native.stdout),
        "{name}: stdout through Hira differs from the native run"
    );
    assert_eq!(
        String::from_utf8_lossy(&remote.stderr),
        String::from_utf8_lossy(&native.stderr),
        "{name}: stderr through Hira differs from the native run"
    );
    daemon.wait_idle(Duration::from_secs(60));
    daemon.log_text()
}

#[test]
fn kernel_printf_reaches_the_guests_stdout_in_order_and_not_the_daemons_log() {
    for rings in [true, false] {
        let log = same_output_as_native("printf", rings);
        assert!(!log.contains("kernel says"), "{log}");
        assert!(!log.contains("v=1,2,3,4"), "{log}");
    }
}

#[test]
fn the_compilers_diagnostics_reach_the_guests_stderr_and_not_the_daemons_log() {
    let exe = c_program("build_error");
    let native = run_native(&exe, &[]);
    let native_err = String::from_utf8_lossy(&native.stderr).into_owned();
    assert!(
        native_err.contains("error generated"),
        "the host compiler says nothing natively: {native_err}"
    );
    let log = same_output_as_native("build_error", true);
    assert!(!log.contains("error generated"), "{log}");
}

/// The bytes of `flood` lines in `out`.
fn flood_bytes(out: &[u8]) -> usize {
    String::from_utf8_lossy(out)
        .split_inclusive('\n')
        .filter(|l| l.starts_with("flood "))
        .map(str::len)
        .sum()
}

#[test]
fn a_kernel_that_prints_without_end_is_bounded_counted_and_leaves_the_daemons_log_alone() {
    let exe = c_program("printf_flood");
    let native = run_native(&exe, &["4"]);
    assert!(native.status.success());
    // What the kernel prints: 4 rounds of 256 work-items printing 500 lines each.
    // (Counted, not read from the native run: there its two workers' large writes
    // into the test's pipe may interleave and cut lines.)
    let printed: usize = 4
        * (0..256)
            .flat_map(|g| (0..500).map(move |i| format!("flood {g} {i}\n").len()))
            .sum::<usize>();
    assert!(
        flood_bytes(&native.stdout) > printed / 2,
        "the flood printed natively: {}",
        String::from_utf8_lossy(&native.stderr)
    );
    // Only warnings in the log: the daemon's own lines for the session stay out.
    let daemon = Daemon::start_with(
        &["vm1"],
        &[("RUST_LOG", "warn")],
        &[
            "--output-rate",
            "64K",
            "--output-buffer",
            "64K",
            "--metrics-address",
            "127.0.0.1:0",
        ],
    );
    let log_before = std::fs::metadata(&daemon.log).unwrap().len();
    let vendors = Vendors::hira();
    let started = Instant::now();
    let remote = run_with_timeout(
        daemon.guest(&vendors, "vm1", &exe).arg("4"),
        Duration::from_secs(300),
    );
    let elapsed = started.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&remote.stdout);
    let stderr = String::from_utf8_lossy(&remote.stderr);
    assert!(remote.status.success(), "{stderr}");
    assert!(
        stdout.ends_with("usable: 1\n"),
        "the session went on computing"
    );
    // The bucket's burst, then its rate: nothing more reached the guest.
    let delivered = flood_bytes(&remote.stdout);
    let bound = 65536.0 * (1.0 + elapsed);
    assert!(delivered > 0, "nothing of the flood reached the guest");
    assert!(
        (delivered as f64) <= bound,
        "{delivered} bytes in {elapsed:.2} s over a 64 KiB/s bound"
    );
    // Whole lines only.
    let odd: Vec<&str> = stdout
        .lines()
        .filter(|l| !(l.starts_with("flood ") && l.split(' ').count() == 3 || *l == "usable: 1"))
        .collect();
    assert!(odd.is_empty(), "lines cut short: {odd:?}");
    assert_eq!(
        stderr.matches("the rest is dropped and counted").count(),
        1,
        "the guest is told once: {stderr}"
    );
    daemon.wait_idle(Duration::from_secs(60));
    let status = daemon.status();
    let vm = vm_entry(&status, "vm1");
    let (sent, dropped) = (
        vm["output_bytes"].as_u64().unwrap(),
        vm["output_dropped"].as_u64().unwrap(),
    );
    assert_eq!(sent as usize, delivered, "what was sent is counted");
    assert_eq!(
        (sent + dropped) as usize,
        printed,
        "every byte the kernel printed is sent or counted as dropped"
    );
    // hira-ctl list shows it in the VM's row (its last column), and so do the metrics.
    let list = daemon.ctl_ok(&["list"]);
    let row = list
        .lines()
        .find(|l| l.starts_with("vm1 "))
        .unwrap_or_else(|| panic!("{list}"));
    assert!(
        list.lines().next().unwrap().ends_with("OUT-DROPPED"),
        "{list}"
    );
    assert!(
        row.ends_with(&format!("{:.1} MiB", dropped as f64 / 1048576.0)),
        "{list}"
    );
    let addr = status["metrics_address"].as_str().unwrap().to_string();
    let (_, body) = http_get(&addr, "/metrics");
    assert_eq!(
        metric(&body, "hira_vm_output_dropped_bytes_total{vm=\"vm1\"}"),
        dropped as f64
    );
    assert_eq!(
        metric(&body, "hira_vm_output_bytes_total{vm=\"vm1\"}"),
        sent as f64
    );
    assert_eq!(
        std::fs::metadata(&daemon.log).unwrap().len(),
        log_before,
        "the daemon's log grew:\n{}",
        daemon.log_text()
    );
}
