//! VMs added and removed while the daemon runs (`hira-ctl vm add|remove|list`, the
//! control socket's `vm_add`, `vm_remove`, `vm_list`), as a libvirt hook drives them.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{
    Daemon, LineProgram, Vendors, c_program, run_native, run_with_timeout, vm_entry,
};

fn vm_list(d: &Daemon) -> Vec<Value> {
    let out = d.ctl_ok(&["vm", "list", "--json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    v["vms"].as_array().unwrap().clone()
}

fn listed<'a>(list: &'a [Value], name: &str) -> Option<&'a Value> {
    list.iter().find(|v| v["name"] == name)
}

fn has_vm(status: &Value, name: &str) -> bool {
    status["vms"]
        .as_array()
        .unwrap()
        .iter()
        .any(|v| v["name"] == name)
}

/// The hybrid-vsock socket a VM's guests reach the daemon on, for `hybrid=PATH`.
fn forwarded(path: &Path) -> std::path::PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push("_5571");
    p.into()
}

#[test]
fn a_vm_added_at_run_time_serves_its_guests_and_leaves_no_trace_when_removed() {
    let state = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(
        &["vm0"],
        &[],
        &["--state-dir", state.path().to_str().unwrap()],
    );
    let vendors = Vendors::hira();
    let vsock = d.dir.path().join("vm7.vsock");
    let spec = format!("hybrid={},cid=7,share=3,mem-quota=64M", vsock.display());
    let out = d.ctl_ok(&["vm", "add", "vm7", &spec]);
    assert!(out.contains("vm7") && out.contains("hybrid"), "{out}");
    let list = vm_list(&d);
    let e = listed(&list, "vm7").unwrap_or_else(|| panic!("{list:?}"));
    assert_eq!(
        (&e["transport"], &e["cid"], &e["added"], &e["persistent"]),
        (&json!("hybrid"), &json!(7), &json!(true), &json!(true))
    );
    assert_eq!(listed(&list, "vm0").unwrap()["added"], false);
    let s = d.status();
    assert_eq!(vm_entry(&s, "vm7")["share"], 3);
    assert_eq!(vm_entry(&s, "vm7")["mem_quota"], 64 << 20);
    assert!(state.path().join("vm7.vm").exists());

    // Its guests get what they get natively.
    let exe = c_program("vecadd");
    let native = run_native(&exe, &[]);
    assert!(native.status.success());
    let o = run_with_timeout(
        std::process::Command::new(&exe)
            .env("OCL_ICD_VENDORS", vendors.dir.path())
            .env("HIRA_SOCKET", forwarded(&vsock))
            .env("HIRA_WINDOW_MB", "0"),
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.stdout, native.stdout);
    // Its session ends once the program has (waited for, not timed).
    let idle = d.control(json!({"cmd": "wait_idle"}));
    assert_eq!(idle["reached"], true, "{idle}");
    let ended = idle["status"]["ended"].as_array().unwrap().clone();
    assert!(ended.iter().any(|e| e["vm"] == "vm7"), "{ended:?}");

    // Removed under a live session: the session ends and its memory goes back.
    let mut cmd = std::process::Command::new(c_program("migrate"));
    cmd.env("OCL_ICD_VENDORS", vendors.dir.path())
        .env("HIRA_SOCKET", forwarded(&vsock))
        .env("HIRA_WINDOW_MB", "0");
    let mut p = LineProgram::start(cmd);
    assert!(p.ask("step").starts_with("step 1 "));
    assert!(vm_entry(&d.status(), "vm7")["mem_used"].as_u64().unwrap() > 0);
    let removed = d.control(json!({"cmd": "vm_remove", "vm": "vm7"}));
    assert_eq!(removed["removed"], "vm7", "{removed}");
    assert_eq!(removed["sessions_ended"], 1, "{removed}");
    // Its application's next call fails, as on a lost device.
    p.send("step");
    assert!(!p.wait().success());
    // No trace: not listed, not in the status, no socket, no kept spec, no session.
    let s = d.status();
    assert!(!has_vm(&s, "vm7"), "{s}");
    assert!(listed(&vm_list(&d), "vm7").is_none());
    assert!(!forwarded(&vsock).exists());
    assert!(!state.path().join("vm7.vm").exists());
    assert_eq!(s["sessions"].as_array().unwrap().len(), 0, "{s}");
    let o = run_with_timeout(
        std::process::Command::new(&exe)
            .env("OCL_ICD_VENDORS", vendors.dir.path())
            .env("HIRA_SOCKET", forwarded(&vsock))
            .env("HIRA_WINDOW_MB", "0"),
        Duration::from_secs(60),
    );
    assert!(!o.status.success(), "a removed VM served a guest");
    // The name, CID and socket are free again.
    d.ctl_ok(&["vm", "add", "vm7", &spec]);
    assert_eq!(vm_entry(&d.status(), "vm7")["mem_used"], 0);
}

#[test]
fn a_refused_vm_add_or_remove_changes_nothing_and_says_why() {
    let d = Daemon::start(&["vm0"]);
    let dir = d.dir.path();
    std::fs::write(dir.join("plain-file"), b"").unwrap();
    let a = dir.join("a.vsock");
    d.ctl_ok(&["vm", "add", "a", &format!("hybrid={},cid=5", a.display())]);
    let cases = [
        (
            "b",
            format!("hybrid={},cid=5", dir.join("b.vsock").display()),
            "CID 5",
        ),
        (
            "b",
            format!("hybrid={},cid=6", a.display()),
            "is VM \"a\"'s",
        ),
        (
            "vm0",
            format!("hybrid={},cid=8", dir.join("c.vsock").display()),
            "served already",
        ),
        (
            "b",
            format!("hybrid={},cid=9,weight=2", dir.join("b.vsock").display()),
            "unknown VM setting",
        ),
        (
            "b",
            format!("hybrid={},cid=2", dir.join("b.vsock").display()),
            "CID \"2\"",
        ),
        (
            "b",
            format!(
                "socket={},cid=9,window={}",
                dir.join("b.vhost").display(),
                dir.join("b.win").display()
            ),
            "",
        ),
        (
            "c",
            format!(
                "hybrid={},cid=10,host-mem=1G",
                dir.join("c.vsock").display()
            ),
            "--cgroup",
        ),
        // A name with a path in it; a socket whose directory cannot be made.
        (
            "../c",
            format!("hybrid={},cid=11", dir.join("c.vsock").display()),
            "1-64 characters",
        ),
        (
            "c",
            format!(
                "hybrid={},cid=12",
                dir.join("plain-file").join("c.vsock").display()
            ),
            "directory",
        ),
    ];
    for (name, spec, why) in &cases {
        let o = d.ctl(&["vm", "add", name, spec]);
        let err = String::from_utf8_lossy(&o.stderr);
        if why.is_empty() {
            // A valid one, to show the others were refused for their reason alone.
            assert!(o.status.success(), "{spec}: {err}");
            continue;
        }
        assert!(!o.status.success(), "{spec} was accepted");
        assert!(err.contains(why), "{spec}: {err}");
    }
    // Nothing of the refused ones exists.
    let list = vm_list(&d);
    let names: Vec<&str> = list.iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["a", "b", "vm0"]);
    assert!(!forwarded(&dir.join("c.vsock")).exists());
    assert!(dir.join("b.vhost").exists() && dir.join("b.win").exists());
    assert_eq!(listed(&list, "a").unwrap()["persistent"], false);
    // Configured VMs change with the configuration only; unknown ones are named.
    let e = d.control(json!({"cmd": "vm_remove", "vm": "vm0"}));
    assert!(
        e["error"].as_str().unwrap().contains("configuration"),
        "{e}"
    );
    let e = d.control(json!({"cmd": "vm_remove", "vm": "nope"}));
    assert!(e["error"].as_str().unwrap().contains("no VM"), "{e}");
    d.ctl_ok(&["vm", "remove", "b"]);
    assert!(!dir.join("b.vhost").exists() && !dir.join("b.win").exists());
}

#[test]
fn vms_added_at_run_time_are_served_again_after_a_restart() {
    let state = tempfile::tempdir().unwrap();
    let flags = ["--state-dir", state.path().to_str().unwrap()];
    let d = Daemon::start_with(&["vm0"], &[], &flags);
    let socket = d.dir.path().join("vm9.vhost");
    let window = d.dir.path().join("vm9.window");
    let spec = format!(
        "socket={},cid=9,window={},window-mb=8,share=5",
        socket.display(),
        window.display()
    );
    d.ctl_ok(&["vm", "add", "vm9", &spec]);
    let vsock = d.dir.path().join("vm8.vsock");
    d.ctl_ok(&[
        "vm",
        "add",
        "vm8",
        &format!("hybrid={},cid=8", vsock.display()),
    ]);
    assert_eq!(std::fs::metadata(&window).unwrap().len(), 8 << 20);
    let d = d.restart_with(&["vm0"], &flags);
    let list = vm_list(&d);
    for name in ["vm8", "vm9"] {
        let e = listed(&list, name).unwrap_or_else(|| panic!("{name}: {list:?}"));
        assert_eq!(
            (&e["added"], &e["persistent"]),
            (&json!(true), &json!(true))
        );
    }
    assert_eq!(vm_entry(&d.status(), "vm9")["share"], 5);
    assert!(socket.exists() && window.exists() && forwarded(&vsock).exists());
    // A guest of the VM served again is served.
    let exe = c_program("vecadd");
    let o = run_with_timeout(
        std::process::Command::new(&exe)
            .env("OCL_ICD_VENDORS", Vendors::hira().dir.path())
            .env("HIRA_SOCKET", forwarded(&vsock))
            .env("HIRA_WINDOW_MB", "0"),
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    d.ctl_ok(&["vm", "remove", "vm9"]);
    assert!(!socket.exists() && !window.exists());
    let d = d.restart_with(&["vm0"], &flags);
    let list = vm_list(&d);
    assert!(listed(&list, "vm9").is_none() && listed(&list, "vm8").is_some());
}
