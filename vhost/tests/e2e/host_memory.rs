//! Per-VM host-memory caps: with `--cgroup DIR` each VM's API servers run in the VM's
//! own memory cgroup and `host-mem=SIZE` caps their host memory together; a VM over
//! its cap loses the API server that went over (its guest gets OpenCL's
//! CL_OUT_OF_RESOURCES), and nothing else; the cap changes live with `hira-ctl`.
//!
//! The capped test needs a memory cgroup this test may create (root with cgroup v2's
//! memory controller delegated, or the v1 memory hierarchy, or `HIRA_TEST_CGROUP`
//! naming one); without one it says why and skips.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::support::{Daemon, Vendors, ensure_built, run_with_timeout, vm_entry};

const MIB: u64 = 1 << 20;

/// A cgroup directory made for one test, removed (with its VMs' cgroups) at the end.
struct TestCgroup(PathBuf);

impl TestCgroup {
    fn find() -> Result<TestCgroup, String> {
        let name = format!("hira-test-{}", std::process::id());
        let mut candidates: Vec<PathBuf> = Vec::new();
        if let Some(p) = std::env::var_os("HIRA_TEST_CGROUP") {
            candidates.push(PathBuf::from(p).join(&name));
        }
        let v2 = Path::new("/sys/fs/cgroup");
        if std::fs::read_to_string(v2.join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"))
        {
            candidates.push(v2.join(&name));
        }
        candidates.push(PathBuf::from("/sys/fs/cgroup/memory").join(&name));
        let mut why = Vec::new();
        for c in candidates {
            let probe = hira_vhost::cgroup::Cgroups::open(&c)
                .and_then(|g| g.vm("probe"))
                .and_then(|vm| vm.set_limit(Some(1 << 30)));
            match probe {
                Ok(()) => return Ok(TestCgroup(c)),
                Err(e) => {
                    let _ = std::fs::remove_dir(&c);
                    why.push(format!("{}: {e}", c.display()));
                }
            }
        }
        Err(why.join("; "))
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        if let Ok(entries) = std::fs::read_dir(&self.0) {
            for e in entries.flatten() {
                if e.path().is_dir() {
                    let _ = std::fs::remove_dir(e.path());
                }
            }
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn a_vm_over_its_host_memory_cap_loses_only_that_api_server() {
    let root = match TestCgroup::find() {
        Ok(r) => r,
        Err(why) => {
            eprintln!("skipped: no memory cgroup this test can create ({why})");
            return;
        }
    };
    let cgroup = root.0.to_str().unwrap().to_string();
    let d = Daemon::start_with(
        &["capped,host-mem=256M", "free"],
        &[],
        &["--cgroup", &cgroup],
    );
    let vendors = Vendors::hira();
    let status = d.status();
    assert_eq!(vm_entry(&status, "capped")["host_mem"], 256 * MIB);
    assert_eq!(vm_entry(&status, "capped")["host_mem_kills"], 0);
    assert_eq!(vm_entry(&status, "free")["host_mem"], Value::Null);
    assert!(
        vm_entry(&status, "free")["host_mem_used"].is_u64(),
        "{status}"
    );

    // The VM's API server runs in the VM's cgroup and works under the cap.
    let mut a = d.allocator(&vendors, "capped");
    let pid = d.api_servers()[0];
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(own.contains("vm-capped"), "{own}");
    let small = a.ask(&format!("hostbuf {MIB}"));
    assert_eq!(small, "ok 0");
    assert_eq!(a.ask("use 0"), "ok");

    // Over the cap: the kernel kills that API server; the guest gets OpenCL's error
    // for a lost host, the daemon counts and explains it.
    assert_eq!(a.ask(&format!("hostbuf {}", 512 * MIB)), "err -5");
    assert_eq!(a.ask("buf 4096"), "err -5", "the session is over");
    drop(a);
    d.wait_idle(Duration::from_secs(60));
    let status = d.status();
    assert!(
        vm_entry(&status, "capped")["host_mem_kills"]
            .as_u64()
            .unwrap()
            >= 1,
        "{status}"
    );
    assert_eq!(status["api_server_crashes"], 1);
    let ended = status["ended"].as_array().unwrap();
    assert!(
        ended.iter().any(|e| e["vm"] == "capped"
            && e["api_server_end"]
                .as_str()
                .unwrap()
                .contains("host-memory cap")),
        "{status}"
    );

    // Another VM is not touched, and has no cap.
    let mut b = d.allocator(&vendors, "free");
    assert_eq!(b.ask(&format!("hostbuf {}", 512 * MIB)), "ok 0");

    // The VM itself goes on: a new guest works, and with the cap lifted live it gets
    // what was refused before.
    let list = d.ctl_ok(&["list"]);
    assert!(
        list.lines()
            .any(|l| l.starts_with("capped ") && l.contains("256.0 MiB")),
        "{list}"
    );
    let out = d.ctl_ok(&["set", "capped", "host-mem=none"]);
    assert!(out.contains("host memory"), "{out}");
    assert_eq!(vm_entry(&d.status(), "capped")["host_mem"], Value::Null);
    let mut c = d.allocator(&vendors, "capped");
    assert_eq!(c.ask(&format!("hostbuf {}", 512 * MIB)), "ok 0");
    // Raised live to a new cap above what it holds.
    d.ctl_ok(&["set", "capped", "host-mem=2G"]);
    assert_eq!(vm_entry(&d.status(), "capped")["host_mem"], 2048 * MIB);
    assert_eq!(c.ask("buf 4096"), "ok 1");
    let used = vm_entry(&d.status(), "capped")["host_mem_used"]
        .as_u64()
        .unwrap();
    assert!(
        used >= 512 * MIB,
        "the VM's API server holds its buffer: {used}"
    );
    drop((b, c));
    d.wait_idle(Duration::from_secs(60));
}

#[test]
fn host_memory_caps_need_a_cgroup() {
    ensure_built();
    // At startup: a clear error, not a cap silently ignored.
    let dir = tempfile::tempdir().unwrap();
    let o = run_with_timeout(
        crate::support::hira_vhost()
            .arg("--local-socket")
            .arg(format!(
                "v={},host-mem=64M",
                dir.path().join("v.sock").display()
            )),
        Duration::from_secs(60),
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--cgroup"), "{err}");
    // Live: refused the same way, and nothing changes.
    let d = Daemon::start(&["v"]);
    let o = d.ctl(&["set", "v", "host-mem=64M"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--cgroup"), "{err}");
    let status = d.status();
    assert_eq!(vm_entry(&status, "v")["host_mem"], Value::Null);
    assert_eq!(vm_entry(&status, "v")["host_mem_used"], Value::Null);
    assert!(!d.ctl(&["set", "v", "host-mem=0"]).status.success());
}
