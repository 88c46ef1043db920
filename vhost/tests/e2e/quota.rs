//! Per-VM device-memory quotas: set from the listener flag and live with `hira-ctl`,
//! shared by all of a VM's sessions, refused with OpenCL's own errors, given back on
//! release and when an API server dies holding memory.

use std::time::Duration;

use serde_json::Value;

use crate::support::{Daemon, LineProgram, Vendors, vm_entry};

const MIB: u64 = 1 << 20;
const TIMEOUT: Duration = Duration::from_secs(120);

/// The number of the object a command made.
fn made(p: &mut LineProgram, cmd: &str) -> u32 {
    let a = p.ask(cmd);
    let id = a
        .strip_prefix("ok ")
        .unwrap_or_else(|| panic!("{cmd}: {a}"));
    id.parse().unwrap()
}

fn used(d: &Daemon) -> u64 {
    vm_entry(&d.status(), "q")["mem_used"].as_u64().unwrap()
}

#[test]
fn a_vms_sessions_share_its_memory_quota_set_live_with_hira_ctl() {
    let d = Daemon::start(&["q,mem-quota=8M", "other"]);
    let vendors = Vendors::hira();
    let mut a = d.allocator(&vendors, "q");
    let mut b = d.allocator(&vendors, "q");
    let mut other = d.allocator(&vendors, "other");
    assert_eq!(vm_entry(&d.status(), "q")["mem_quota"], 8 * MIB);

    // Up to the quota, and not a byte more, with OpenCL's own error.
    let first = made(&mut a, &format!("buf {}", 4 * MIB));
    let second = made(&mut a, &format!("hostbuf {}", 4 * MIB));
    assert_eq!(a.ask("buf 1"), "err -4", "CL_MEM_OBJECT_ALLOCATION_FAILURE");
    assert_eq!(used(&d), 8 * MIB);
    // A sub-buffer uses its parent's memory: allowed at the quota, and it works.
    let sub = made(&mut a, &format!("sub {first}"));
    assert_eq!(a.ask(&format!("use {sub}")), "ok");
    assert_eq!(a.ask("svm 4096"), "null", "clSVMAlloc over the quota");
    // The quota is the VM's: another session of it is refused too, another VM not.
    assert_eq!(b.ask("buf 4096"), "err -4");
    let big = made(&mut other, &format!("buf {}", 64 * MIB));
    assert_eq!(other.ask(&format!("use {big}")), "ok");

    // A release gives the memory back, to every session of the VM.
    assert_eq!(a.ask(&format!("free {second}")), "ok");
    assert_eq!(used(&d), 4 * MIB);
    let small = made(&mut b, "buf 4096");
    assert_eq!(b.ask(&format!("use {small}")), "ok");
    let sessions = d.status()["sessions"].as_array().unwrap().clone();
    let mut held: Vec<u64> = sessions
        .iter()
        .filter(|s| s["vm"] == "q")
        .map(|s| s["memory"].as_u64().unwrap())
        .collect();
    held.sort();
    assert_eq!(held, [4096, 4 * MIB], "each session's own memory");

    // Raised live: the next allocations see it (images and SVM are charged too).
    let out = d.ctl_ok(&["set", "q", "mem-quota=64M"]);
    assert!(out.contains("64.0 MiB"), "{out}");
    made(&mut a, &format!("buf {}", 32 * MIB));
    made(&mut a, "image 1024 1024");
    made(&mut a, &format!("svm {}", MIB));
    assert_eq!(used(&d), 4 * MIB + 4096 + 32 * MIB + 4 * MIB + MIB);
    let list = d.ctl_ok(&["list"]);
    assert!(
        list.lines()
            .any(|l| l.starts_with("q ") && l.contains("64.0 MiB")),
        "{list}"
    );
    // Lowered below what is held: nothing is taken back, nothing new is given.
    d.ctl_ok(&["set", "q", "mem-quota=1M"]);
    assert_eq!(a.ask("buf 4096"), "err -4");
    assert_eq!(a.ask(&format!("use {first}")), "ok");
    d.ctl_ok(&["set", "q", "mem-quota=none"]);
    let json: Value = serde_json::from_str(&d.ctl_ok(&["list", "--json"])).unwrap();
    assert_eq!(vm_entry(&json, "q")["mem_quota"], Value::Null);
    made(&mut a, &format!("buf {}", 16 * MIB));

    // Bad requests get clear errors and change nothing.
    for (args, says) in [
        (&["set", "q", "weight=3"][..], "unknown setting"),
        (&["set", "q", "share=0"], "1 to 1000"),
        (&["set", "q", "mem-quota=0"], "positive number"),
        (&["set", "nosuch", "mem-quota=1M"], "no VM"),
    ] {
        let o = d.ctl(args);
        assert!(!o.status.success(), "{args:?} accepted");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert_eq!(vm_entry(&d.status(), "q")["mem_quota"], Value::Null);

    // A guest that ends holding memory gets it released by its API server.
    drop(a);
    d.control(serde_json::json!({"cmd": "wait_live", "count": 2, "timeout_ms": 60_000}));
    assert_eq!(used(&d), 4096);
    // An API server that dies holding memory: the daemon gives the VM its memory back.
    made(&mut b, &format!("buf {}", 8 * MIB));
    let pid = d.status()["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["vm"] == "q")
        .and_then(|s| s["api_server_pid"].as_u64())
        .unwrap();
    // SAFETY: kill(2) on a pid of this test's own daemon's API server.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    drop(b);
    d.control(serde_json::json!({"cmd": "wait_live", "count": 1, "timeout_ms": 60_000}));
    assert_eq!(used(&d), 0);
    drop(other);
    d.wait_idle(TIMEOUT);
    assert_eq!(vm_entry(&d.status(), "other")["mem_used"], 0);
}
