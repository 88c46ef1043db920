//! Sessions are isolated: one API server per guest application, and a failure or
//! disconnect on one side tears down exactly that session.

use std::time::{Duration, Instant};

use crate::support::{Daemon, Vendors, c_program, run_with_timeout};

fn kill(pid: u32) {
    // SAFETY: sending SIGKILL to a process this test started or found as a child.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

#[test]
fn killing_one_api_server_fails_only_its_guest() {
    let daemon = Daemon::start(&["vm1", "vm2"]);
    let vendors = Vendors::hira();
    let exe = c_program("stencil");
    let iters = "40000";
    let mut a = daemon
        .guest(&vendors, "vm1", &exe)
        .arg(iters)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut b = daemon
        .guest(&vendors, "vm2", &exe)
        .arg(iters)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let servers = daemon.wait_api_servers(2, Duration::from_secs(20));
    assert_eq!(
        servers.len(),
        2,
        "two guest programs get two API-server processes:\n{}",
        daemon.log_text()
    );
    std::thread::sleep(Duration::from_millis(300));
    kill(servers[0]);
    let deadline = Instant::now() + Duration::from_secs(240);
    let (mut ra, mut rb) = (None, None);
    while ra.is_none() || rb.is_none() {
        assert!(
            Instant::now() < deadline,
            "a guest hung after its API server died"
        );
        if ra.is_none() {
            ra = a.try_wait().unwrap();
        }
        if rb.is_none() {
            rb = b.try_wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let outs = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()];
    let failed: Vec<_> = outs.iter().filter(|o| !o.status.success()).collect();
    let ok: Vec<_> = outs.iter().filter(|o| o.status.success()).collect();
    assert_eq!(failed.len(), 1, "exactly one guest loses its API server");
    assert_eq!(ok.len(), 1, "the other guest finishes");
    let err = String::from_utf8_lossy(&failed[0].stderr);
    assert_eq!(
        failed[0].status.code(),
        Some(2),
        "the guest exits through its own error path: {err}"
    );
    // Depending on where the kill lands: "clFinish(q) failed: -5", "build failed (-5)"...
    assert!(
        err.contains("-5"),
        "the guest sees CL_OUT_OF_RESOURCES: {err}"
    );
    let out = String::from_utf8_lossy(&ok[0].stdout);
    assert!(
        out.contains("iters=40000") && out.contains("maxdiff_ok=1"),
        "the survivor's result is correct: {out}"
    );
    assert!(
        daemon
            .wait_api_servers(0, Duration::from_secs(15))
            .is_empty(),
        "no API server outlives its session"
    );
}

#[test]
fn guest_killed_mid_call_leaves_no_api_server_and_no_host_objects() {
    let mut daemon = Daemon::start(&["vm1"]);
    let vendors = Vendors::hira();
    let exe = c_program("stencil");
    let mut guest = daemon
        .guest(&vendors, "vm1", &exe)
        .arg("1000000")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let servers = daemon.wait_api_servers(1, Duration::from_secs(20));
    assert_eq!(servers.len(), 1);
    std::thread::sleep(Duration::from_millis(500));
    guest.kill().unwrap();
    guest.wait().unwrap();
    assert!(
        daemon
            .wait_api_servers(0, Duration::from_secs(15))
            .is_empty(),
        "the API server exits when its guest disconnects"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let line = loop {
        let log = daemon.log_text();
        if let Some(l) = log.lines().find(|l| l.contains("teardown: released")) {
            break l.to_string();
        }
        assert!(Instant::now() < deadline, "no teardown report:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    };
    // The stencil holds a context, a queue, a program, a kernel and two buffers.
    let released: usize = line
        .split("released ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        released >= 6,
        "every object the guest held is released: {line}"
    );
    assert!(line.contains("(0 failed)"), "{line}");
    assert!(daemon.alive(), "the daemon keeps running");
    let again = run_with_timeout(
        &mut daemon.guest(&vendors, "vm1", &c_program("vecadd")),
        Duration::from_secs(60),
    );
    assert!(
        again.status.success(),
        "a new guest is served after the disconnect"
    );
}

#[test]
fn daemon_with_no_host_opencl_refuses_sessions_with_an_error() {
    let vendors = Vendors::hira();
    // The daemon's API servers see an empty vendor directory: no host OpenCL.
    let empty = tempfile::tempdir().unwrap();
    let mut d = Daemon::start_with_env(
        &["vm1"],
        &[("OCL_ICD_VENDORS", empty.path().to_str().unwrap())],
    );
    let out = run_with_timeout(
        &mut d.guest(&vendors, "vm1", &c_program("vecadd")),
        Duration::from_secs(60),
    );
    assert!(
        !out.status.success(),
        "no host platform means no OpenCL for the guest"
    );
    assert!(
        d.log_text().contains("no OpenCL platform")
            || d.log_text().contains("no usable host OpenCL"),
        "{}",
        d.log_text()
    );
    assert!(d.alive());
    assert!(d.wait_api_servers(0, Duration::from_secs(10)).is_empty());
}

#[test]
fn hybrid_vsock_connections_belong_to_their_vm() {
    // cloud-hypervisor and Firecracker forward a guest's connection to host port 5571
    // as a Unix connection on `<vsock socket>_5571`, carrying the guest's bytes as they
    // are: no descriptor passing, so no shared window.
    crate::support::ensure_built();
    let dir = tempfile::tempdir().unwrap();
    let vsock = dir.path().join("ch.vsock");
    let log = dir.path().join("daemon.log");
    let mut daemon = std::process::Command::new(env!("CARGO_BIN_EXE_hira-vhost"))
        .arg("--vm")
        .arg(format!("name=chvm,hybrid={},cid=5", vsock.display()))
        .env("RUST_LOG", "info")
        .env_remove("OCL_ICD_VENDORS")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let forwarded = dir.path().join("ch.vsock_5571");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(&forwarded).is_err() {
        assert!(
            Instant::now() < deadline,
            "no listener on {}",
            forwarded.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let vendors = Vendors::hira();
    let out = run_with_timeout(
        std::process::Command::new(c_program("vecadd"))
            .env("OCL_ICD_VENDORS", vendors.dir.path())
            .env("HIRA_SOCKET", &forwarded)
            .env("HIRA_WINDOW_MB", "0"),
        Duration::from_secs(60),
    );
    let _ = daemon.kill();
    let _ = daemon.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        out.status.success(),
        "{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("mismatches=0"));
    assert!(
        text.contains("VM \"chvm\" session") && text.contains("window 0 bytes"),
        "{text}"
    );
}

#[test]
fn bad_vm_specs_are_refused_with_a_clear_error() {
    for (spec, says) in [
        ("name=a,hybrid=/tmp/x,cid=1", "CID \"1\""),
        ("name=a,hybrid=/tmp/x", "lacks `cid`"),
        (
            "name=a,hybrid=/tmp/x,cid=3,weight=2",
            "unknown VM setting `weight`",
        ),
        ("name=a,socket=/tmp/x,hybrid=/tmp/y,cid=3", "exactly one of"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_hira-vhost"))
            .args(["--vm", spec])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{spec} was accepted");
        assert!(err.contains(says), "{spec}: {err}");
    }
}

#[test]
fn config_file_sets_up_listeners_and_bad_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("filevm.sock");
    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        format!(
            "[[local]]\nvm = \"filevm\"\npath = \"{}\"\n",
            sock.display()
        ),
    )
    .unwrap();
    let log = dir.path().join("log");
    let mut d = std::process::Command::new(env!("CARGO_BIN_EXE_hira-vhost"))
        .arg("--config")
        .arg(&good)
        .env("RUST_LOG", "info")
        .env_remove("OCL_ICD_VENDORS")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(
            Instant::now() < deadline,
            "no listener from the config file"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let vendors = Vendors::hira();
    let out = run_with_timeout(
        std::process::Command::new(c_program("vecadd"))
            .env("OCL_ICD_VENDORS", vendors.dir.path())
            .env("HIRA_SOCKET", &sock),
        Duration::from_secs(60),
    );
    let _ = d.kill();
    let _ = d.wait();
    assert!(out.status.success());
    assert!(
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("VM \"filevm\" session")
    );

    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[vm]]\nname = \"a\"\nsocket = \"/x\"\ncid = 3\nweight = 2\n",
    )
    .unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_hira-vhost"))
        .arg("--config")
        .arg(&bad)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("weight") && err.contains("bad.toml"),
        "{err}"
    );
}
