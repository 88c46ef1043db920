//! Sessions are isolated: one API server per guest application, and a failure or
//! disconnect on one side tears down exactly that session.

use std::time::Duration;

use crate::support::{Daemon, Readiness, Vendors, c_program, run_with_timeout, wait_exit};

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
    let a = daemon
        .guest(&vendors, "vm1", &exe)
        .arg(iters)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let b = daemon
        .guest(&vendors, "vm2", &exe)
        .arg(iters)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Both guests are inside their launch loops before one API server is killed.
    let mut guests = Vec::new();
    for mut g in [a, b] {
        let mut err = std::io::BufReader::new(g.stderr.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut err, &mut line).unwrap();
        assert_eq!(line.trim(), "stencil: running", "{}", daemon.log_text());
        guests.push((g, err));
    }
    let servers = daemon.wait_api_servers(2, Duration::from_secs(20));
    assert_eq!(
        servers.len(),
        2,
        "two guest programs get two API-server processes:\n{}",
        daemon.log_text()
    );
    kill(servers[0]);
    let outs: Vec<std::process::Output> = guests
        .into_iter()
        .map(|(g, mut err)| {
            assert!(
                wait_exit(g.id(), Duration::from_secs(240)),
                "a guest hung after its API server died"
            );
            let mut out = g.wait_with_output().unwrap();
            std::io::Read::read_to_end(&mut err, &mut out.stderr).unwrap();
            out
        })
        .collect();
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
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Once the stencil says it runs, it holds every object and is inside its loop.
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(guest.stderr.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "stencil: running", "{}", daemon.log_text());
    let server = daemon.wait_api_servers(1, Duration::from_secs(30))[0];
    guest.kill().unwrap();
    guest.wait().unwrap();
    let ended = daemon.wait_idle(Duration::from_secs(60));
    assert!(
        wait_exit(server, Duration::from_secs(1)),
        "the API server was reaped"
    );
    let end = ended.last().expect("the session ended");
    // The stencil holds a context, a queue, a program, a kernel and two buffers.
    assert!(
        end["released"].as_u64().unwrap_or(0) >= 6,
        "every object the guest held is released: {end}"
    );
    assert_eq!(end["release_failures"], 0, "{end}");
    assert_eq!(end["api_server_end"], "exit status 0", "{end}");
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
    let ended = d.wait_idle(Duration::from_secs(30));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no OpenCL platform"),
        "the guest is told why: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert!(d.alive());
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
    let ready = Readiness::new(dir.path());
    let mut cmd = crate::support::hira_vhost();
    cmd.arg("--vm")
        .arg(format!("name=chvm,hybrid={},cid=5", vsock.display()))
        .env("RUST_LOG", "info")
        .env_remove("OCL_ICD_VENDORS")
        .stderr(std::fs::File::create(&log).unwrap());
    ready.apply(&mut cmd);
    let daemon = cmd.spawn().unwrap();
    let mut daemon = Daemon::adopt(daemon, dir, log.clone());
    ready.wait(&mut daemon);
    let forwarded = daemon.dir.path().join("ch.vsock_5571");
    let vendors = Vendors::hira();
    let out = run_with_timeout(
        std::process::Command::new(c_program("vecadd"))
            .env("OCL_ICD_VENDORS", vendors.dir.path())
            .env("HIRA_SOCKET", &forwarded)
            .env("HIRA_WINDOW_MB", "0"),
        Duration::from_secs(60),
    );
    let text = daemon.log_text();
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
        let out = crate::support::hira_vhost()
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
    let ready = Readiness::new(dir.path());
    let mut cmd = crate::support::hira_vhost();
    cmd.arg("--config")
        .arg(&good)
        .env("RUST_LOG", "info")
        .env_remove("OCL_ICD_VENDORS")
        .stderr(std::fs::File::create(&log).unwrap());
    ready.apply(&mut cmd);
    let d = cmd.spawn().unwrap();
    let mut d = Daemon::adopt(d, dir, log.clone());
    ready.wait(&mut d);
    let dir = &d.dir;
    let vendors = Vendors::hira();
    let out = run_with_timeout(
        std::process::Command::new(c_program("vecadd"))
            .env("OCL_ICD_VENDORS", vendors.dir.path())
            .env("HIRA_SOCKET", &sock),
        Duration::from_secs(60),
    );
    assert!(out.status.success());
    assert!(d.log_text().contains("VM \"filevm\" session"));

    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[vm]]\nname = \"a\"\nsocket = \"/x\"\ncid = 3\nweight = 2\n",
    )
    .unwrap();
    let o = crate::support::hira_vhost()
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

#[test]
fn an_api_server_that_crashes_is_recorded_with_its_signal_and_last_call() {
    let daemon = Daemon::start(&["vm1"]);
    let mut g = crate::support::RawGuest::session(&daemon.socket("vm1"));
    let mut w = hira_protocol::Writer::new();
    w.u32(1).u8(1).u8(1);
    let (_, p) = g.call(hira_apis_opencl::op::clGetPlatformIDs, w.as_slice());
    assert_eq!(crate::support::status(&p), 0);
    let server = daemon.wait_api_servers(1, Duration::from_secs(30))[0];
    // As the kernel's OOM killer would: a SIGSEGV or SIGABRT sent by kill() is taken
    // by the handlers of Rust or of LLVM (which the host compiler loads) and survived.
    // SAFETY: signalling the API server this test's daemon started.
    unsafe { libc::kill(server as i32, libc::SIGKILL) };
    let codes = g.drain_until_closed();
    assert_eq!(
        codes,
        vec![hira_protocol::handshake::error_code::SERVER_GONE],
        "the guest is told its API server is gone"
    );
    let ended = daemon.wait_idle(Duration::from_secs(30));
    let end = ended.last().unwrap();
    assert!(
        end["api_server_end"].as_str().unwrap().contains("signal 9"),
        "{end}"
    );
    assert_eq!(end["last_call"], "clGetPlatformIDs", "{end}");
    assert_eq!(daemon.status()["api_server_crashes"], 1);
}

#[test]
fn an_application_that_recreates_its_context_recovers_from_a_lost_api_server() {
    use std::io::{BufRead, Write};
    let daemon = Daemon::start(&["vm1"]);
    let vendors = Vendors::hira();
    let mut guest = daemon
        .guest(&vendors, "vm1", &c_program("device_loss"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(guest.stdout.take().unwrap());
    let mut seen = String::new();
    while !seen.ends_with("ready\n") {
        assert_ne!(out.read_line(&mut seen).unwrap(), 0, "guest ended: {seen}");
    }
    let server = daemon.wait_api_servers(1, Duration::from_secs(30))[0];
    // As the kernel's OOM killer would (LLVM, loaded by the host compiler, catches
    // SIGABRT once a kernel was built).
    // SAFETY: signalling the API server this test's daemon started.
    unsafe { libc::kill(server as i32, libc::SIGKILL) };
    let ended = daemon.wait_idle(Duration::from_secs(30));
    assert!(
        ended[0]["api_server_end"]
            .as_str()
            .unwrap()
            .contains("signal 9"),
        "{ended:?}"
    );
    guest.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let status = guest.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut guest.stderr.take().unwrap(), &mut err).unwrap();
    let expected = "next call after the loss: -5\n\
                    old queue: -5\n\
                    devices found again: 0 (some)\n\
                    new context on the old device handle: 0\n\
                    new context computes: mismatches=0\n\
                    old queue after recovery: -5\n";
    assert_eq!(rest, expected, "stderr:\n{err}\n{}", daemon.log_text());
    assert!(status.success(), "{status:?}\n{err}");
    assert!(err.contains("API server was lost"), "{err}");
    assert_eq!(daemon.status()["api_server_crashes"], 1);
}
