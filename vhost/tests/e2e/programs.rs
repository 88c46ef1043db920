//! Unmodified OpenCL programs produce byte-identical output through Hira.

use std::time::Duration;

use crate::support::{Daemon, Vendors, c_program, run_native, run_with_timeout};

/// Runs `name` natively and through Hira; both must succeed with identical stdout.
fn same_as_native(name: &str, args: &[&str]) {
    let exe = c_program(name);
    let native = run_native(&exe, args);
    assert!(
        native.status.success(),
        "{name} fails natively: {}",
        String::from_utf8_lossy(&native.stderr)
    );
    let daemon = Daemon::start(&["vm1"]);
    let hira_vendors = Vendors::hira();
    let remote = run_with_timeout(
        daemon.guest(&hira_vendors, "vm1", &exe).args(args),
        Duration::from_secs(300),
    );
    assert!(
        remote.status.success(),
        "{name} fails through Hira: {}\ndaemon log:\n{}",
        String::from_utf8_lossy(&remote.stderr),
        daemon.log_text()
    );
    assert!(!native.stdout.is_empty(), "{name} printed nothing");
    assert_eq!(
        String::from_utf8_lossy(&remote.stdout),
        String::from_utf8_lossy(&native.stdout),
        "{name}: output through Hira differs from the native run"
    );
    let exe_name = exe.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        daemon
            .log_text()
            .contains(&format!(": {exe_name} (guest pid")),
        "the run went through the daemon:\n{}",
        daemon.log_text()
    );
}

#[test]
fn vector_add_matches_native() {
    same_as_native("vecadd", &[]);
}

#[test]
fn tiled_matmul_with_local_memory_matches_native() {
    same_as_native("matmul", &[]);
}

#[test]
fn stencil_with_1000_launches_and_finishes_matches_native() {
    same_as_native("stencil", &["1000"]);
}

#[test]
fn events_profiling_user_events_and_callbacks_match_native() {
    same_as_native("events", &[]);
}

#[test]
fn map_unmap_and_use_host_ptr_match_native() {
    same_as_native("mapping", &[]);
}

#[test]
fn two_threads_on_two_queues_match_native() {
    same_as_native("threads", &[]);
}

#[test]
fn build_failure_and_build_log_match_native() {
    same_as_native("build_error", &[]);
}

#[test]
fn images_samplers_binaries_linking_and_rect_transfers_match_native() {
    same_as_native("api_coverage", &[]);
}

#[test]
fn opencl_2_1_and_3_0_entry_points_match_native() {
    same_as_native("cl3x", &[]);
}

#[test]
fn non_blocking_transfers_gated_by_a_user_event_do_not_stall() {
    same_as_native("usergate", &[]);
}

/// Drops the lines that state the platform's ICD suffix, the one place Hira shows
/// itself by default.
fn without_platform_identity(clinfo: &str) -> String {
    clinfo
        .lines()
        .filter(|l| !l.contains("function suffix"))
        .map(|l| match l.find("Success [") {
            Some(i) => &l[..i + "Success".len()],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn tagged_identity_names_hira_in_the_platform() {
    let daemon = Daemon::start(&["vm1"]);
    let vendors = Vendors::hira();
    let mut cmd = std::process::Command::new("clinfo");
    cmd.arg("-l")
        .env("OCL_ICD_VENDORS", vendors.dir.path())
        .env("HIRA_SOCKET", daemon.socket("vm1"))
        .env("HIRA_IDENTITY", "tagged");
    let out = run_with_timeout(&mut cmd, Duration::from_secs(120));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Hira remote OpenCL ("), "{text}");
}

#[test]
fn clinfo_reports_every_device_property_as_native() {
    let native = run_with_timeout(
        std::process::Command::new("clinfo").env("OCL_ICD_VENDORS", Vendors::native().dir.path()),
        Duration::from_secs(120),
    );
    assert!(
        native.status.success(),
        "clinfo fails natively (install clinfo)"
    );
    let daemon = Daemon::start(&["vm1"]);
    let vendors = Vendors::hira();
    let mut cmd = std::process::Command::new("clinfo");
    cmd.env("OCL_ICD_VENDORS", vendors.dir.path())
        .env("HIRA_SOCKET", daemon.socket("vm1"));
    let remote = run_with_timeout(&mut cmd, Duration::from_secs(120));
    assert!(remote.status.success());
    let (n, r) = (
        String::from_utf8_lossy(&native.stdout),
        String::from_utf8_lossy(&remote.stdout),
    );
    assert!(
        r.lines()
            .any(|l| l.contains("function suffix") && l.trim_end().ends_with("HIRA")),
        "the platform is Hira's (ICD suffix):\n{r}"
    );
    assert!(
        r.contains("Device Name"),
        "clinfo lists a device through Hira"
    );
    assert!(n.lines().count() > 100, "clinfo printed a full report");
    assert_eq!(
        without_platform_identity(&r),
        without_platform_identity(&as_hira_masks(&n))
    );
}

/// The native clinfo report with what Hira masks (fine-grained shared virtual memory
/// and SVM atomics, native kernels, extensions with entry points Hira
/// does not forward) reported absent.
fn as_hira_masks(native: &str) -> String {
    use hira_apis_opencl::extensions::{mask_list, passed_through};
    let mut svm_block = 0u32;
    native
        .lines()
        .map(str::to_string)
        .filter_map(|l| {
            let Some(at) = l.find(" cl_").map(|i| i + 1) else {
                return Some(l.to_string());
            };
            let (head, list) = l.split_at(at);
            let first = list.split_whitespace().next().unwrap_or("");
            if list.contains(" 0x") {
                // One entry of an extensions-with-version list.
                return passed_through(first).then(|| l.to_string());
            }
            Some(format!("{head}{}", mask_list(list)))
        })
        .map(|l| {
            if l.contains("Shared Virtual Memory (SVM) capabilities") {
                svm_block = 4;
                return l.to_string();
            }
            let t = l.trim_start();
            let in_svm = svm_block > 0;
            svm_block = svm_block.saturating_sub(1);
            let masked = t.starts_with("Run native kernels")
                || (in_svm
                    && (t.starts_with("Fine-grained buffer sharing") || t.starts_with("Atomics")));
            match l.strip_suffix("Yes") {
                Some(head) if masked => format!("{head}No"),
                _ => l.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn invalid_arguments_return_the_native_error_codes() {
    // Every call of `errors` prints its status: calls forwarded without waiting
    // (kernel arguments, launches, non-blocking transfers) and property lists whose
    // values are zero must answer exactly as the host does natively.
    same_as_native("errors", &["sync"]);
}

#[test]
fn kernels_include_the_applications_own_headers_as_natively() {
    same_as_native("includes", &[]);
}

#[test]
fn transfers_larger_than_the_data_window_match_native() {
    same_as_native("large", &[]);
}

#[test]
fn coarse_grained_svm_with_pointers_in_svm_memory_matches_native() {
    same_as_native("svm", &[]);
}

#[test]
fn device_partitioning_and_sub_devices_match_native() {
    same_as_native("subdevices", &[]);
}

#[test]
fn pocls_content_size_extension_is_forwarded_as_natively() {
    same_as_native("content_size", &[]);
}

#[test]
fn command_buffers_record_finalize_run_and_answer_as_natively() {
    same_as_native("command_buffer", &[]);
}

#[test]
fn kernel_argument_kinds_are_learnt_in_one_round_trip_and_long_type_names_still_work() {
    same_as_native("arg_types", &[]);
    // Which calls waited for the host: each kernel's argument count and information
    // in one round trip, and only the kernel whose type names do not fit the first
    // answer asked its count, then one query at a time (four per argument, two
    // arguments).
    let daemon = Daemon::start(&["vm1"]);
    let vendors = Vendors::hira();
    let o = run_with_timeout(
        daemon
            .guest(&vendors, "vm1", &c_program("arg_types"))
            .env("HIRA_STATS", "1"),
        Duration::from_secs(300),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    let by_call = err
        .lines()
        .find(|l| l.starts_with("hira-stats: round trips by call:"))
        .unwrap_or_else(|| panic!("no round trips by call: {err}"));
    let count = |name: &str| -> u64 {
        by_call
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{name}="))?.parse().ok())
            .unwrap_or(0)
    };
    assert_eq!(count("hiraKernelArgInfo"), 2, "{by_call}");
    assert_eq!(count("clGetKernelArgInfo"), 8, "{by_call}");
    assert_eq!(count("clGetKernelInfo"), 1, "{by_call}");
}
