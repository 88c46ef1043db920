//! Hardening: a guest cannot freeze its VM, exhaust the daemon, outlive its session,
//! or take over another daemon's socket; the daemon stops in order.

use std::io::{BufRead, Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Stdio;
use std::time::Duration;

use hira_apis_opencl::op;
use hira_protocol::handshake::{ErrorPayload, Hello, error_code};
use hira_protocol::{FrameHeader, FrameKind, Writer};

use crate::support::{Daemon, RawGuest, Vendors, c_program, rss_kib, run_with_timeout, wait_exit};

/// The first frame the daemon sends on `s` (blocking), or `None` at end of stream.
fn first_frame(s: &mut UnixStream) -> Option<(FrameHeader, Vec<u8>)> {
    let mut hb = [0u8; hira_protocol::frame::HEADER_LEN];
    s.read_exact(&mut hb).ok()?;
    let h = FrameHeader::decode(&hb).unwrap();
    let mut p = vec![0u8; h.len as usize];
    s.read_exact(&mut p).ok()?;
    Some((h, p))
}

fn error_code_of(frame: Option<(FrameHeader, Vec<u8>)>) -> u32 {
    let (h, p) = frame.expect("an error frame before the close");
    assert_eq!(h.kind, FrameKind::Error);
    ErrorPayload::decode(&p).unwrap().code
}

fn vecadd_runs(daemon: &Daemon) {
    let out = run_with_timeout(
        &mut daemon.guest(&Vendors::hira(), "vm1", &c_program("vecadd")),
        Duration::from_secs(120),
    );
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("mismatches=0"),
        "a well-behaved guest is served: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        daemon.log_text()
    );
}

#[test]
fn a_daemon_whose_icd_directory_is_outside_the_system_serves_from_its_sandbox() {
    // The operator's OCL_ICD_VENDORS names a directory under /tmp (a copy of the host's
    // ICD files): the API servers' sandbox keeps it readable, the start-up check made
    // inside the sandbox sees the platform, and sessions are served.
    let vendors = Vendors::native();
    let dir = vendors.dir.path().to_str().unwrap().to_string();
    let daemon = Daemon::start_with_env(&["vm1"], &[("OCL_ICD_VENDORS", &dir)]);
    vecadd_runs(&daemon);
    let status = daemon.control(serde_json::json!({"cmd": "status"}));
    let sandbox = status["sandbox"].to_string();
    assert!(
        sandbox.contains("opencl platform: "),
        "the sandbox check reports what API servers see: {sandbox}"
    );
}

#[test]
fn a_guest_that_stops_reading_slows_only_itself() {
    let daemon = Daemon::start(&["vm1"]);
    let mut g = RawGuest::session(&daemon.socket("vm1"));
    let server = daemon.wait_api_servers(1, Duration::from_secs(30))[0];
    // Requests on two guest threads whose replies are never read, until the host
    // stops taking them: backpressure reaches the guest's own socket.
    g.s.set_nonblocking(true).unwrap();
    let mut w = Writer::new();
    w.u32(1).u8(1).u8(1);
    let mut sent = 0u64;
    'flood: for i in 0u64.. {
        let h = FrameHeader::new(
            FrameKind::Request,
            op::clGetPlatformIDs,
            (i % 2 + 1) as u32,
            i + 1,
            w.as_slice().len(),
        );
        let mut frame = h.encode().to_vec();
        frame.extend_from_slice(w.as_slice());
        let mut at = 0;
        while at < frame.len() {
            match g.s.write(&frame[at..]) {
                Ok(n) => at += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && at == 0 => break 'flood,
                // Finish a frame already started, so that framing stays intact.
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("write failed: {e}"),
            }
        }
        sent += 1;
        assert!(sent < 10_000_000, "the host never pushed back");
    }
    // A second guest of the same VM stops in the middle of a frame.
    let mut partial = RawGuest::session(&daemon.socket("vm1"));
    let h = FrameHeader::new(FrameKind::Request, op::clGetPlatformIDs, 1, 1, 64);
    partial.s.write_all(&h.encode()[..10]).unwrap();
    // Another guest of the same VM is served while these two are stalled.
    vecadd_runs(&daemon);
    drop(partial);
    assert!(
        rss_kib(server) < 512 * 1024,
        "the stalled session's API server stays bounded: {} KiB after {sent} requests",
        rss_kib(server)
    );
    drop(g);
    assert!(
        wait_exit(server, Duration::from_secs(60)),
        "its API server ends"
    );
}

#[test]
fn a_silent_or_partial_handshake_is_cut_at_the_deadline() {
    let daemon = Daemon::start_with(&["vm1"], &[], &["--handshake-timeout-ms", "300"]);
    let mut silent = UnixStream::connect(daemon.socket("vm1")).unwrap();
    assert_eq!(
        error_code_of(first_frame(&mut silent)),
        error_code::HANDSHAKE
    );
    assert!(
        first_frame(&mut silent).is_none(),
        "then the connection closes"
    );
    let mut partial = UnixStream::connect(daemon.socket("vm1")).unwrap();
    let hello = Hello::new(hira_apis_opencl::API, 1, "partial", 0).encode();
    let h = FrameHeader::new(FrameKind::Hello, 0, 0, 0, hello.len());
    partial.write_all(&h.encode()[..10]).unwrap();
    assert!(
        first_frame(&mut partial).is_none_or(|(h, _)| h.kind == FrameKind::Error),
        "a partial hello gets an error or a close"
    );
    assert!(
        daemon.api_servers().is_empty(),
        "no API server for a guest that never said hello"
    );
    vecadd_runs(&daemon);
}

#[test]
fn connections_and_sessions_over_their_caps_are_refused() {
    let daemon = Daemon::start_with(
        &["vm1"],
        &[],
        &[
            "--max-connections-per-listener",
            "2",
            "--max-sessions-per-vm",
            "1",
        ],
    );
    let g = RawGuest::session(&daemon.socket("vm1"));
    // The second connection may handshake but the VM has its one session.
    let mut second = RawGuest::connect(&daemon.socket("vm1"));
    let hello = Hello::new(hira_apis_opencl::API, 1, "second", 0).encode();
    second.frame(FrameKind::Hello, 0, 0, 0, &[], &hello);
    assert_eq!(error_code_of(second.recv()), error_code::POLICY);
    assert!(second.recv().is_none());
    drop(second);
    // Its session has left (and freed its connection slot): only the first is live.
    let a = daemon.control(serde_json::json!({
        "cmd": "wait_live", "count": 1, "started": false, "timeout_ms": 30000
    }));
    assert_eq!(a["reached"], true, "{a}");
    // Two connections open: a third is over the listener's cap.
    let _idle = UnixStream::connect(daemon.socket("vm1")).unwrap();
    let mut third = UnixStream::connect(daemon.socket("vm1")).unwrap();
    let code = error_code_of(first_frame(&mut third));
    assert_eq!(code, error_code::POLICY);
    assert_eq!(daemon.api_servers().len(), 1);
    drop(g);
}

#[test]
fn a_vms_own_session_cap_is_applied_and_changed_live() {
    let daemon = Daemon::start(&["capped,max-sessions=1", "other"]);
    let _g = RawGuest::session(&daemon.socket("capped"));
    let refused = |vm: &str| {
        let mut g = RawGuest::connect(&daemon.socket(vm));
        let hello = Hello::new(hira_apis_opencl::API, 1, "next", 0).encode();
        g.frame(FrameKind::Hello, 0, 0, 0, &[], &hello);
        match g.recv() {
            Some((h, p)) if h.kind == FrameKind::Error => {
                ErrorPayload::decode(&p).unwrap().code == error_code::POLICY
            }
            _ => false,
        }
    };
    assert!(refused("capped"), "a second session of a VM capped at one");
    let _o = RawGuest::session(&daemon.socket("other"));
    let o = daemon.ctl(&["set", "capped", "max-sessions=2"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let _second = RawGuest::session(&daemon.socket("capped"));
    let a = daemon.control(serde_json::json!({
        "cmd": "wait_live", "count": 3, "timeout_ms": 30000
    }));
    assert_eq!(a["reached"], true, "{a}");
}

#[test]
fn a_second_daemon_does_not_take_over_a_live_socket() {
    let daemon = Daemon::start(&["vm1"]);
    let out = crate::support::hira_vhost()
        .arg("--local-socket")
        .arg(format!("vm1={}", daemon.socket("vm1").display()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the second daemon must refuse");
    assert!(err.contains("another process is serving"), "{err}");
    vecadd_runs(&daemon);
    let mode = std::fs::metadata(daemon.socket("vm1")).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o660,
        "guest sockets are not world-accessible"
    );
}

#[test]
fn sigterm_ends_sessions_removes_sockets_and_exits_zero() {
    let mut daemon = Daemon::start(&["vm1"]);
    let g = RawGuest::session(&daemon.socket("vm1"));
    let server = daemon.wait_api_servers(1, Duration::from_secs(30))[0];
    // SAFETY: signalling the daemon this test started.
    unsafe { libc::kill(daemon.child.id() as i32, libc::SIGTERM) };
    let status = daemon.child.wait().unwrap();
    assert!(
        status.success(),
        "exit status {status}:\n{}",
        daemon.log_text()
    );
    assert!(!daemon.socket("vm1").exists(), "the socket file is removed");
    assert!(
        wait_exit(server, Duration::from_secs(1)),
        "the API server was reaped"
    );
    drop(g);
}

/// A guest whose kernel never ends, once it has launched it.
fn endless_guest(daemon: &Daemon) -> std::process::Child {
    let vendors = Vendors::hira();
    let mut guest = daemon
        .guest(&vendors, "vm1", &c_program("endless"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(guest.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    if line.trim() != "launched" {
        let out = guest.wait_with_output().unwrap();
        panic!(
            "{:?} {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            daemon.log_text()
        );
    }
    guest
}

#[test]
fn api_servers_die_with_a_killed_daemon() {
    let mut daemon = Daemon::start(&["vm1"]);
    // An API server busy in an endless kernel does not notice its socket closing.
    let mut guest = endless_guest(&daemon);
    let server = daemon.wait_api_servers(1, Duration::from_secs(30))[0];
    daemon.child.kill().unwrap();
    daemon.child.wait().unwrap();
    assert!(
        wait_exit(server, Duration::from_secs(30)),
        "the API server is not orphaned"
    );
    let _ = guest.kill();
    let _ = guest.wait();
}

#[test]
fn an_api_server_stuck_in_a_kernel_is_ended_after_its_guest_leaves() {
    let daemon = Daemon::start_with(&["vm1"], &[], &["--teardown-grace-ms", "1000"]);
    let mut guest = endless_guest(&daemon);
    let server = daemon.api_servers()[0];
    guest.kill().unwrap();
    guest.wait().unwrap();
    assert!(
        wait_exit(server, Duration::from_secs(60)),
        "the stuck API server is killed after the grace period:\n{}",
        daemon.log_text()
    );
    vecadd_runs(&daemon);
}

/// A Hello offering a `len`-byte memfd window, sealed against shrinking or not;
/// returns the window length the host accepted.
fn offered_window(daemon: &Daemon, len: u64, sealed: bool) -> u64 {
    use std::os::fd::FromRawFd;
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: a NUL-terminated name and valid flags.
    let raw = unsafe { libc::memfd_create(c"test-window".as_ptr(), flags) };
    assert!(raw >= 0);
    // SAFETY: a fresh descriptor nothing else owns.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
    std::fs::File::from(fd.try_clone().unwrap())
        .set_len(len)
        .unwrap();
    if sealed {
        // SAFETY: adding a seal to our own memfd.
        let sealed = unsafe { libc::fcntl(raw, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) };
        assert_eq!(sealed, 0);
    }
    let mut s = UnixStream::connect(daemon.socket("vm1")).unwrap();
    let hello = Hello::new(hira_apis_opencl::API, 1, "windowed", len).encode();
    let h = FrameHeader::new(FrameKind::Hello, 0, 0, 0, hello.len());
    hira_protocol::unix::send_frame_with_fd(&mut s, &h, &hello, Some(&fd)).unwrap();
    let (h, p) = first_frame(&mut s).expect("a welcome");
    assert_eq!(h.kind, FrameKind::Welcome);
    hira_protocol::handshake::Welcome::decode(&p)
        .unwrap()
        .window_len
}

#[test]
fn a_window_that_could_shrink_is_refused() {
    let daemon = Daemon::start(&["vm1"]);
    assert_eq!(
        offered_window(&daemon, 1 << 20, false),
        0,
        "unsealed: inline only"
    );
    assert_eq!(
        offered_window(&daemon, 1 << 20, true),
        1 << 20,
        "sealed: accepted"
    );
}

/// A field of `/proc/<pid>/status`.
fn proc_status(pid: u32, field: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
        .trim()
        .to_string()
}

#[test]
fn api_servers_run_unprivileged_with_no_new_privs_and_seccomp() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: the daemon must run as root to start API servers as another user");
        return;
    }
    let daemon = Daemon::start(&["vm1"]);
    let mut g = RawGuest::session(&daemon.socket("vm1"));
    // A call that loads the host OpenCL inside the sandbox and answers.
    let mut w = Writer::new();
    w.u32(1).u8(1).u8(1);
    let (_, p) = g.call(op::clGetPlatformIDs, w.as_slice());
    assert_eq!(crate::support::status(&p), 0, "OpenCL works in the sandbox");
    let server = daemon.wait_api_servers(1, Duration::from_secs(30))[0];
    // Layers this machine's kernel cannot apply are reported, never silently missing.
    let report: Vec<String> = daemon.status()["sandbox"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().to_string())
        .collect();
    let applied = |layer: &str| {
        let line = report
            .iter()
            .find(|l| l.starts_with(&format!("{layer}:")))
            .unwrap_or_else(|| panic!("no report for {layer}: {report:?}"));
        if !line.contains(": applied") {
            eprintln!("note: this machine cannot apply {line}");
        }
        line.contains(": applied")
    };
    for layer in ["user", "no_new_privs", "seccomp"] {
        assert!(applied(layer), "{layer} is applied: {report:?}");
    }
    let nobody = nix::unistd::User::from_name("nobody")
        .unwrap()
        .unwrap()
        .uid
        .as_raw();
    let uids: Vec<u32> = proc_status(server, "Uid")
        .split_whitespace()
        .map(|u| u.parse().unwrap())
        .collect();
    assert_eq!(uids, vec![nobody; 4], "real, effective, saved and fs uid");
    assert_eq!(proc_status(server, "CapEff"), "0000000000000000");
    assert_eq!(proc_status(server, "CapPrm"), "0000000000000000");
    assert_eq!(proc_status(server, "CapBnd"), "0000000000000000");
    assert_eq!(proc_status(server, "NoNewPrivs"), "1");
    assert_eq!(
        proc_status(server, "Seccomp"),
        "2",
        "a seccomp filter is active"
    );
    let groups = proc_status(server, "Groups");
    assert!(groups.is_empty(), "no supplementary groups: {groups}");
    // Its network namespace is not the daemon's, where the machine allows one.
    if applied("namespaces") {
        let ns = |pid: u32| std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
        assert_ne!(ns(server), ns(daemon.child.id()), "own network namespace");
    }
    // A host file the guest cannot see (a mount namespace hides its directory from
    // the guest process), in a directory the API server's Landlock ruleset lets it
    // read (/usr): natively the compiler reads it (its errors are in the build log).
    // Through Hira the `#include` names the guest's file system, where the file does
    // not exist, so the API server never opens the host's.
    let Ok(dir) = tempfile::Builder::new()
        .prefix("hira-secret")
        .tempdir_in("/usr/local/share")
    else {
        eprintln!("note: /usr/local/share is not writable here: host-file include not checked");
        return;
    };
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let secret = dir.path().join("secret.h");
    std::fs::write(&secret, "host secret that is not C;\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let marker = format!("{}:1:", secret.display());
    let exe = c_program("include_host_file");
    let native = std::process::Command::new(&exe)
        .arg(&secret)
        .arg(&marker)
        .env(
            "OCL_ICD_VENDORS",
            crate::support::Vendors::native().dir.path(),
        )
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&native.stdout).contains("contents_in_log=1"),
        "natively the compiler reads the file: {}",
        String::from_utf8_lossy(&native.stdout)
    );
    let hidden = |args: &[&std::ffi::OsStr]| {
        let mut c = std::process::Command::new("unshare");
        c.args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg("mount -t tmpfs tmpfs \"$0\" && exec \"$@\"")
            .arg(dir.path())
            .args(args);
        c
    };
    let can_hide = hidden(&[
        "test".as_ref(),
        "!".as_ref(),
        "-e".as_ref(),
        secret.as_ref(),
    ])
    .status()
    .is_ok_and(|s| s.success());
    if can_hide {
        let hira = Vendors::hira();
        let mut guest = hidden(&[exe.as_ref(), secret.as_ref(), marker.as_ref()]);
        guest
            .env("OCL_ICD_VENDORS", hira.dir.path())
            .env("HIRA_SOCKET", daemon.socket("vm1"));
        let out = run_with_timeout(&mut guest, Duration::from_secs(120));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("contents_in_log=0") && text.contains("build=-11"),
            "the API server does not read a host file the guest cannot see: {text}"
        );
    } else {
        eprintln!("note: no mount namespace here (needs root): host-file include not checked");
    }
}

/// Total CPU time (user + system) of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    // Fields 14 and 15 of stat (utime, stime), counted from the state field (3).
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

#[test]
fn running_out_of_descriptors_backs_off_instead_of_spinning() {
    let mut daemon = Daemon::start_with(&["vm1"], &[], &["--handshake-timeout-ms", "1500"]);
    let pid = daemon.child.id();
    // A guest in its handshake: its session ends (freeing descriptors) at the
    // deadline, which bounds how long the daemon runs out of them below.
    let mut first = UnixStream::connect(daemon.socket("vm1")).unwrap();
    // The control connection stays open, so that its descriptor in the daemon does
    // not free up while the daemon is to have none.
    let mut control = UnixStream::connect(daemon.dir.path().join("control.sock")).unwrap();
    writeln!(
        control,
        "{}",
        serde_json::json!({"cmd": "wait_live", "count": 1, "started": false, "timeout_ms": 30000})
    )
    .unwrap();
    let mut answer = String::new();
    std::io::BufReader::new(control.try_clone().unwrap())
        .read_line(&mut answer)
        .unwrap();
    assert!(answer.contains("\"reached\":true"), "{answer}");
    // From now on the daemon cannot open a descriptor: its limit is its lowest free
    // descriptor number.
    let open: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    let lowest_free = (0u32..).find(|n| !open.contains(n)).unwrap();
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit on the daemon this test started, with valid rlimit structs.
    let got = unsafe { libc::prlimit(pid as i32, libc::RLIMIT_NOFILE, std::ptr::null(), &mut old) };
    assert_eq!(got, 0, "{}", std::io::Error::last_os_error());
    let low = libc::rlimit {
        rlim_cur: lowest_free as libc::rlim_t,
        rlim_max: old.rlim_max,
    };
    // SAFETY: as above.
    let set = unsafe { libc::prlimit(pid as i32, libc::RLIMIT_NOFILE, &low, std::ptr::null_mut()) };
    assert_eq!(set, 0, "{}", std::io::Error::last_os_error());
    let before = cpu_ticks(pid);
    // A second guest waits in the listen backlog: every accept fails with EMFILE.
    let mut second = UnixStream::connect(daemon.socket("vm1")).unwrap();
    assert_eq!(
        error_code_of(first_frame(&mut first)),
        error_code::HANDSHAKE,
        "the first guest is cut at its deadline"
    );
    let spent = cpu_ticks(pid) - before;
    // SAFETY: as above, restoring the limit.
    unsafe { libc::prlimit(pid as i32, libc::RLIMIT_NOFILE, &old, std::ptr::null_mut()) };
    // The second guest is accepted once descriptors free up (and, with few of them
    // left, may be refused with an error); the daemon serves guests again.
    assert!(first_frame(&mut second).is_none_or(|(h, _)| h.kind == FrameKind::Error));
    let text = daemon.log_text();
    let reports = text.lines().filter(|l| l.contains("backing off")).count();
    assert!(reports >= 1, "the exhaustion is reported:\n{text}");
    assert!(reports <= 3, "rate-limited reports, not a flood: {reports}");
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    assert!(
        spent < hz / 2,
        "the accept loop does not spin: {spent} ticks of CPU in 1.5 s out of descriptors"
    );
    assert!(daemon.alive());
    drop(control);
    vecadd_runs(&daemon);
}
