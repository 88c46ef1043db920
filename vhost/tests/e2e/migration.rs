//! Migration of live sessions to new API servers (`hira-ctl migrate`): a real
//! program's objects, their contents and its calls in flight move, and every answer
//! it gives is the one it gives natively.

use std::time::Duration;

use serde_json::{Value, json};

use super::support::*;

const TIMEOUT: Duration = Duration::from_secs(120);

/// The answers `tests/c/migrate.c` gives natively to `script`.
pub fn native(script: &[&str]) -> Vec<String> {
    let vendors = Vendors::native();
    let mut cmd = std::process::Command::new(c_program("migrate"));
    cmd.env("OCL_ICD_VENDORS", vendors.dir.path());
    let mut p = LineProgram::start(cmd);
    script.iter().map(|c| p.ask(c)).collect()
}

/// `tests/c/migrate.c` through Hira as a guest of VM `vm`, its objects made.
fn guest_program(d: &Daemon, vm: &str) -> LineProgram {
    let vendors = Vendors::hira();
    LineProgram::start(d.guest(&vendors, vm, &c_program("migrate")))
}

/// The one live session: its id and API-server pid.
fn the_session(d: &Daemon) -> (u64, u32) {
    let s = d.status();
    let live = s["sessions"].as_array().unwrap();
    assert_eq!(live.len(), 1, "{s}");
    (
        live[0]["id"].as_u64().unwrap(),
        live[0]["api_server_pid"].as_u64().unwrap() as u32,
    )
}

/// The program's answers to `script`, its session `id` moved to a new API server
/// after every command but `end`.
fn answers_moving_after_each(
    d: &Daemon,
    p: &mut LineProgram,
    id: u64,
    script: &[&str],
) -> Vec<String> {
    script
        .iter()
        .map(|cmd| {
            let answer = p.ask(cmd);
            if *cmd != "end" {
                moved(&migrate(d, id));
            }
            answer
        })
        .collect()
}

/// Moves session `id` through the control socket; the daemon's answer.
fn migrate(d: &Daemon, id: u64) -> Value {
    d.control(json!({"cmd": "migrate", "session": id}))
}

fn moved(answer: &Value) -> &Value {
    assert!(answer["moved"].is_object(), "migration failed: {answer}");
    &answer["moved"]
}

#[test]
fn a_session_moves_between_api_servers_with_its_objects_and_contents() {
    let script = ["step", "step", "check", "loop 5", "check", "end"];
    let expected = native(&script);
    let d = Daemon::start(&["vm0"]);
    let mut p = guest_program(&d, "vm0");
    let (id, first) = the_session(&d);
    let mut pids = vec![first];
    let mut got = Vec::new();
    for (i, cmd) in script.iter().enumerate() {
        got.push(p.ask(cmd));
        if i + 1 == script.len() {
            break;
        }
        // Alternately through hira-ctl and the control socket.
        let to = if i % 2 == 0 {
            let out = d.ctl_ok(&["migrate", &id.to_string()]);
            assert!(out.contains(&format!("session {id}: API server")), "{out}");
            the_session(&d).1
        } else {
            let a = migrate(&d, id);
            let m = moved(&a);
            assert_eq!(
                m["from_pid"].as_u64(),
                Some(u64::from(*pids.last().unwrap()))
            );
            assert!(m["snapshot_bytes"].as_u64().unwrap() > 4 * 16384, "{m}");
            m["to_pid"].as_u64().unwrap() as u32
        };
        assert_eq!(the_session(&d), (id, to));
        assert!(
            !pids.contains(&to),
            "a new API server each time: {pids:?} {to}"
        );
        // The old API server is gone once the migration answers.
        assert!(wait_exit(*pids.last().unwrap(), TIMEOUT));
        pids.push(to);
    }
    assert_eq!(
        got, expected,
        "answers through migrations differ from native"
    );
    let s = d.status();
    assert_eq!(
        s["sessions"][0]["migrations"],
        json!(script.len() - 1),
        "{s}"
    );
    drop(p);
    let ended = d.wait_idle(TIMEOUT);
    let e = ended.iter().find(|e| e["id"] == json!(id)).unwrap();
    assert_eq!(e["api_server_pid"], json!(pids.last().unwrap()), "{e}");
}

#[test]
fn sub_devices_and_what_was_made_on_them_move() {
    // The first sub-devices are released before the second are made, so the host's
    // ids of the second are not the first a fresh server would give.
    let script = ["split", "sub", "sub", "step", "sub", "end"];
    let expected = native(&script);
    assert!(
        expected[1].contains("parent 1 units 1 queue 1"),
        "{expected:?}"
    );
    let d = Daemon::start(&["vm0"]);
    let mut p = guest_program(&d, "vm0");
    let (id, _) = the_session(&d);
    let got = answers_moving_after_each(&d, &mut p, id, &script);
    assert_eq!(
        got, expected,
        "answers through migrations differ from native"
    );
    drop(p);
    let ended = d.wait_idle(TIMEOUT);
    let e = ended.iter().find(|e| e["id"] == json!(id)).unwrap();
    // The sub-devices, their context, queue, kernel and buffer were released.
    assert_eq!(e["release_failures"], json!(0), "{e}");
}

#[test]
fn a_recorded_command_buffer_moves_and_runs_as_natively() {
    let script = ["record", "replay", "step", "replay", "replay", "end"];
    let expected = native(&script);
    let d = Daemon::start(&["vm0"]);
    let mut p = guest_program(&d, "vm0");
    let (id, _) = the_session(&d);
    let got = answers_moving_after_each(&d, &mut p, id, &script);
    assert_eq!(
        got, expected,
        "answers through migrations differ from native"
    );
}

#[test]
fn a_kernel_whose_arguments_change_after_a_command_buffer_recorded_it_keeps_its_session() {
    // The replay of the recording would take the kernel's new arguments: the session
    // stays where it is, with the reason, and goes on.
    let d = Daemon::start(&["vm0"]);
    let mut p = guest_program(&d, "vm0");
    let (id, _) = the_session(&d);
    assert_eq!(p.ask("record"), "record ok");
    let a = migrate(&d, id);
    assert!(
        a["moved"].is_object(),
        "a recorded command buffer moves: {a}"
    );
    assert_eq!(p.ask("rearg"), "rearg ok");
    let a = migrate(&d, id);
    let why = a["error"]
        .as_str()
        .unwrap_or_else(|| panic!("it moved: {a}"));
    assert!(why.contains("command buffer recorded"), "{why}");
    let answer = p.ask("replay");
    assert!(answer.starts_with("replay "), "{answer}");
    assert_eq!(p.ask("end"), "end ok");
}

#[test]
fn a_session_moves_while_its_calls_run() {
    for sync in [false, true] {
        let script = ["loop 40", "check", "step", "end"];
        let expected = native(&script);
        let d = Daemon::start(&["vm0"]);
        let vendors = Vendors::hira();
        let mut cmd = d.guest(&vendors, "vm0", &c_program("migrate"));
        if sync {
            cmd.env("HIRA_SYNC", "1");
        }
        let mut p = LineProgram::start(cmd);
        let (id, _) = the_session(&d);
        // The program is in its loop (40 rounds of launches and blocking reads) while
        // it moves, twice; wherever the moves land, every call runs once.
        p.send(script[0]);
        moved(&migrate(&d, id));
        moved(&migrate(&d, id));
        let mut got = vec![p.line()];
        for cmd in &script[1..] {
            got.push(p.ask(cmd));
        }
        assert_eq!(got, expected, "HIRA_SYNC={sync}");
    }
}

#[test]
fn pending_user_events_and_mapped_buffers_move() {
    let script = ["step", "pend", "go", "unmap", "check", "end"];
    let expected = native(&script);
    let d = Daemon::start(&["vm0"]);
    let mut p = guest_program(&d, "vm0");
    let (id, _) = the_session(&d);
    // A buffer is mapped from the start; a user event has no status between "pend"
    // and "go": the session moves in every state.
    assert_eq!(answers_moving_after_each(&d, &mut p, id, &script), expected);
}

#[test]
fn a_session_that_cannot_move_now_stays_and_moves_later() {
    let d = Daemon::start(&["vm0"]);
    let vendors = Vendors::hira();
    // A launch waits behind the program's own user event: the device cannot drain.
    let mut p = LineProgram::start(d.guest(&vendors, "vm0", &c_program("busy")));
    let (id, pid) = the_session(&d);
    assert_eq!(p.ask("gate"), "ok");
    let a = migrate(&d, id);
    let e = a["error"].as_str().unwrap_or_else(|| panic!("{a}"));
    assert!(e.contains("user event"), "{e}");
    assert_eq!(the_session(&d), (id, pid), "the session stays where it was");
    assert_eq!(p.ask("open"), "ok");
    assert_eq!(p.ask("once 1000"), "ok");
    let m = migrate(&d, id);
    assert_ne!(moved(&m)["to_pid"], json!(pid));
    assert_eq!(p.ask("once 1000"), "ok");
}

#[test]
fn a_failed_restore_leaves_the_guest_on_its_api_server() {
    let script = ["step", "step", "check", "end"];
    let expected = native(&script);
    let d = Daemon::start(&["vm0"]);
    let mut p = guest_program(&d, "vm0");
    let (id, pid) = the_session(&d);
    let mut got = vec![p.ask(script[0])];
    // The program holds about 450 KiB of device memory. Under a 700 KiB quota the
    // new API server cannot make it all again while the old one still holds it.
    d.ctl_ok(&["set", "vm0", "mem-quota=700K"]);
    let a = migrate(&d, id);
    let e = a["error"].as_str().unwrap_or_else(|| panic!("{a}"));
    assert!(e.contains("restore"), "{e}");
    assert_eq!(the_session(&d), (id, pid));
    got.push(p.ask(script[1]));
    // What the failed server had charged went back: the quota holds only the source.
    let used = vm_entry(&d.status(), "vm0")["mem_used"].as_u64().unwrap();
    assert!(used < 700 << 10, "{used}");
    d.ctl_ok(&["set", "vm0", "mem-quota=none"]);
    moved(&migrate(&d, id));
    got.push(p.ask(script[2]));
    got.push(p.ask(script[3]));
    assert_eq!(got, expected);
}

#[test]
fn migrating_what_is_not_a_live_session_is_refused() {
    let d = Daemon::start(&["vm0"]);
    let a = migrate(&d, 12345);
    assert!(a["error"].as_str().unwrap().contains("not live"), "{a}");
    let a = d.control(json!({"cmd": "migrate"}));
    assert!(a["error"].as_str().unwrap().contains("session"), "{a}");
    let o = d.ctl(&["migrate", "no-such-vm"]);
    assert!(!o.status.success());
    // A session whose frames the daemon relays moves between API servers (the
    // capture in its stream of frames).
    let vendors = Vendors::hira();
    let mut cmd = d.guest(&vendors, "vm0", &c_program("migrate"));
    cmd.env("HIRA_RINGS", "0");
    let mut p = LineProgram::start(cmd);
    let (id, _) = the_session(&d);
    let script = ["step", "loop 3", "check", "end"];
    let expected = native(&script);
    assert_eq!(answers_moving_after_each(&d, &mut p, id, &script), expected);
}

/// Suspends session `id` into `file` with hira-ctl.
fn checkpoint(d: &Daemon, id: u64, file: &std::path::Path) {
    let out = d.ctl_ok(&["checkpoint", &id.to_string(), file.to_str().unwrap()]);
    assert!(out.contains("suspended into"), "{out}");
}

#[test]
fn a_checkpointed_session_resumes_when_restored() {
    let script = ["step", "step", "check", "end"];
    let expected = native(&script);
    let d = Daemon::start(&["vm0"]);
    let mut p = guest_program(&d, "vm0");
    let (id, _) = the_session(&d);
    let mut got = vec![p.ask(script[0])];
    let file = d.dir.path().join("session.hira");
    checkpoint(&d, id, &file);
    // The session is gone from the daemon (what is live are the guest's attempts to
    // resume, refused before any API server starts); the application waits.
    let s = d.status();
    assert!(
        s["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["api_server_pid"].is_null()),
        "{s}"
    );
    p.send(script[1]);
    d.ctl_ok(&["restore", file.to_str().unwrap()]);
    got.push(p.line());
    got.push(p.ask(script[2]));
    got.push(p.ask(script[3]));
    assert_eq!(got, expected);
    let s = d.status();
    assert_eq!(
        (&s["suspensions"], &s["resumptions"]),
        (&json!(1), &json!(1)),
        "{s}"
    );
}

#[test]
fn sessions_survive_a_daemon_restart_through_checkpoints() {
    let script = ["step", "loop 3", "check", "end"];
    let expected = native(&script);
    let d = Daemon::start(&["vm0", "vm1"]);
    let mut p = guest_program(&d, "vm0");
    let mut q = guest_program(&d, "vm1");
    let first: Vec<u64> = d.api_servers().into_iter().map(u64::from).collect();
    let (mut got_p, mut got_q) = (vec![p.ask(script[0])], vec![q.ask(script[0])]);
    // The upgrade procedure: every session into a directory, the daemon stopped and
    // a new one started on the same sockets while the applications wait, then the
    // directory restored.
    let dir = d.dir.path().join("upgrade");
    let out = d.ctl_ok(&["checkpoint", "all", dir.to_str().unwrap()]);
    assert_eq!(out.matches("suspended into").count(), 2, "{out}");
    p.send(script[1]);
    q.send(script[1]);
    let d = d.restart(&["vm0", "vm1"]);
    d.ctl_ok(&["restore", dir.to_str().unwrap()]);
    got_p.push(p.line());
    got_q.push(q.line());
    let now = d.api_servers();
    assert_eq!(now.len(), 2);
    assert!(now.iter().all(|p| !first.contains(&u64::from(*p))));
    for cmd in &script[2..] {
        got_p.push(p.ask(cmd));
        got_q.push(q.ask(cmd));
    }
    assert_eq!(got_p, expected);
    assert_eq!(got_q, expected);
}

#[test]
fn a_daemon_with_a_state_dir_is_restarted_under_running_applications() {
    // `--state-dir`: at SIGTERM the daemon suspends its sessions into the directory
    // itself, and the next one takes them back as it starts; the applications (one on
    // rings, one relayed) hold their calls meanwhile and go on, every call once.
    let script = ["step", "pend", "loop 3", "check", "end"];
    let expected = native(&script);
    let state = tempfile::tempdir().unwrap();
    let flags = ["--state-dir", state.path().to_str().unwrap()];
    let d = Daemon::start_with(&["vm0", "vm1"], &[], &flags);
    let mut p = guest_program(&d, "vm0");
    let vendors = Vendors::hira();
    let mut relayed = d.guest(&vendors, "vm1", &c_program("migrate"));
    relayed.env("HIRA_RINGS", "0");
    let mut q = LineProgram::start(relayed);
    let first: Vec<u64> = d.api_servers().into_iter().map(u64::from).collect();
    let (mut got_p, mut got_q) = (vec![p.ask(script[0])], vec![q.ask(script[0])]);
    got_p.push(p.ask(script[1]));
    got_q.push(q.ask(script[1]));
    p.send(script[2]);
    q.send(script[2]);
    // Left over from an earlier stop: a file cut short, and one that is no session.
    std::fs::write(state.path().join("9.part"), b"HIRASESS").unwrap();
    std::fs::write(state.path().join("junk.hira"), b"not a session").unwrap();
    let d = d.restart_with(&["vm0", "vm1"], &flags);
    got_p.push(p.line());
    got_q.push(q.line());
    // A guest reconnects when it next reads: at once if the restart caught its loop
    // in flight, else at its next call.
    got_p.push(p.ask(script[3]));
    got_q.push(q.ask(script[3]));
    let now = d.api_servers();
    assert_eq!(now.len(), 2);
    assert!(now.iter().all(|p| !first.contains(&u64::from(*p))));
    for cmd in &script[4..] {
        got_p.push(p.ask(cmd));
        got_q.push(q.ask(cmd));
    }
    assert_eq!(got_p, expected, "{}", d.log_text());
    assert_eq!(got_q, expected, "{}", d.log_text());
    // Every session file was taken back, none is left for a later start to resume
    // again; the cut one is gone, the one that is no session stays (with a warning).
    let left: Vec<_> = std::fs::read_dir(state.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["junk.hira"]);
    assert!(
        d.log_text().contains("junk.hira: not resumed"),
        "{}",
        d.log_text()
    );
}

/// A forwarder of one Unix socket to another that carries bytes and nothing else
/// (no descriptors), as `ssh -L` between two hosts does; serves its first `n`
/// connections.
pub(crate) fn forward(listen: &std::path::Path, to: std::path::PathBuf, n: usize) {
    let l = std::os::unix::net::UnixListener::bind(listen).unwrap();
    std::thread::spawn(move || {
        for c in l.incoming().take(n) {
            let c = c.unwrap();
            let t = std::os::unix::net::UnixStream::connect(&to).unwrap();
            let (mut c2, mut t2) = (c.try_clone().unwrap(), t.try_clone().unwrap());
            let up = std::thread::spawn(move || {
                let _ = std::io::copy(&mut c2, &mut t2);
                let _ = t2.shutdown(std::net::Shutdown::Write);
            });
            let (mut t, mut c) = (t, c);
            let _ = std::io::copy(&mut t, &mut c);
            let _ = c.shutdown(std::net::Shutdown::Write);
            let _ = up.join();
        }
    });
}

#[test]
fn a_session_moves_to_another_daemon() {
    let script = ["step", "step", "check", "end"];
    let expected = native(&script);
    let a = Daemon::start(&["vm0"]);
    let b = Daemon::start(&["vm0"]);
    let mut p = guest_program(&a, "vm0");
    let (id, _) = the_session(&a);
    let mut got = vec![p.ask(script[0])];
    // b's control socket reached through a byte-only forwarder, as from another
    // host: the snapshot travels as bytes.
    let to = a.dir.path().join("forwarded-b.sock");
    forward(&to, b.dir.path().join("control.sock"), 1);
    let out = a.ctl_ok(&["migrate", &id.to_string(), "--to", to.to_str().unwrap()]);
    assert!(out.contains("waiting at"), "{out}");
    got.push(p.ask(script[1]));
    // It runs at b now, and a has nothing left of it.
    let (_, pid) = the_session(&b);
    assert!(a.status()["sessions"].as_array().unwrap().is_empty());
    got.push(p.ask(script[2]));
    got.push(p.ask(script[3]));
    assert_eq!(got, expected);
    drop(p);
    b.wait_idle(TIMEOUT);
    assert!(wait_exit(pid, TIMEOUT));
}

#[test]
fn a_relayed_session_is_suspended_with_its_calls_in_flight_and_resumes_elsewhere() {
    // HIRA_RINGS=0: every frame travels on the guest's socket, relayed by the daemon.
    // Before the capture the guest sends its last frame on that connection
    // (`DRAINED`) and holds the rest, so a suspension in the middle of a stream of
    // calls loses none: checkpointed and restored at the same daemon, then moved to
    // another daemon, the program answers as natively.
    let script = ["step", "loop 200", "loop 200", "check", "end"];
    let expected = native(&script);
    let a = Daemon::start(&["vm0"]);
    let b = Daemon::start(&["vm0"]);
    let vendors = Vendors::hira();
    let mut cmd = a.guest(&vendors, "vm0", &c_program("migrate"));
    cmd.env("HIRA_RINGS", "0");
    let mut p = LineProgram::start(cmd);
    let (id, _) = the_session(&a);
    let mut got = vec![p.ask(script[0])];
    // The program is sending its 200 steps while the session is suspended.
    p.send(script[1]);
    let file = a.dir.path().join("relayed.hira");
    checkpoint(&a, id, &file);
    a.ctl_ok(&["restore", file.to_str().unwrap()]);
    got.push(p.line());
    let (id, _) = the_session(&a);
    p.send(script[2]);
    let out = a.ctl_ok(&[
        "migrate",
        &id.to_string(),
        "--to",
        b.dir.path().join("control.sock").to_str().unwrap(),
    ]);
    assert!(out.contains("waiting at"), "{out}");
    got.push(p.line());
    let (_, pid) = the_session(&b);
    got.push(p.ask(script[3]));
    got.push(p.ask(script[4]));
    assert_eq!(got, expected);
    drop(p);
    b.wait_idle(TIMEOUT);
    assert!(wait_exit(pid, TIMEOUT));
}

#[test]
fn a_resume_without_a_parked_session_or_its_descriptors_is_refused() {
    use hira_protocol::handshake::Hello;
    use hira_protocol::{FrameHeader, FrameKind, unix};
    let d = Daemon::start(&["vm0"]);
    let window = window_memfd(1 << 20);
    for with_rings in [false, true] {
        let mut s = std::os::unix::net::UnixStream::connect(d.socket("vm0")).unwrap();
        let mut h = Hello::new(hira_apis_opencl::API, 1, "resumer", 1 << 20);
        h.rings = true;
        h.resume = Some([0x5a; 16]);
        let body = h.encode();
        let header = FrameHeader::new(FrameKind::Hello, 0, 0, 0, body.len());
        // Eventfds the guest made itself, and a region of the right size, sealed.
        let region = hira_protocol::shm::memfd(
            c"region",
            hira_ring::region_len(hira_ring::DEFAULT_CAPACITY) as u64,
            hira_protocol::shm::FIXED,
        )
        .unwrap();
        let efds = hira_ring::eventfds().unwrap();
        let mut fds = vec![&window];
        if with_rings {
            fds.push(&region);
            fds.extend(efds.iter());
        }
        unix::send_frame_with_fds(&mut s, &header, &body, &fds).unwrap();
        let (rh, rp, _) = unix::recv_frame_with_fds(&mut s).unwrap();
        assert_eq!(rh.kind, FrameKind::Error);
        let e = hira_protocol::handshake::ErrorPayload::decode(&rp).unwrap();
        let want = if with_rings {
            "no suspended session"
        } else {
            "ring region and eventfds"
        };
        assert!(e.message.contains(want), "{}", e.message);
    }
    // The daemon serves on.
    let mut p = guest_program(&d, "vm0");
    assert_eq!(p.ask("step"), native(&["step"])[0]);
}

#[test]
fn a_session_moves_to_another_device() {
    // PoCL with two CPU devices stands in for a host with two GPUs.
    let two = [("POCL_DEVICES", "pthread pthread")];
    let script = ["devices", "step", "devices", "step", "check", "end"];
    let vendors = Vendors::native();
    let mut cmd = std::process::Command::new(c_program("migrate"));
    cmd.env("OCL_ICD_VENDORS", vendors.dir.path()).envs(two);
    let mut native = LineProgram::start(cmd);
    let expected: Vec<String> = script.iter().map(|c| native.ask(c)).collect();
    assert_eq!(expected[0], "devices 0 of 2");
    let d = Daemon::start_with_env(&["vm0"], &two);
    let mut p = guest_program(&d, "vm0");
    let (id, _) = the_session(&d);
    let mut got = vec![p.ask(script[0]), p.ask(script[1])];
    let out = d.ctl_ok(&["migrate", &id.to_string(), "--to-device", "1"]);
    assert!(out.contains("->"), "{out}");
    // The application's device handle now names the host's second device.
    got.push(p.ask(script[2]));
    assert_eq!(got[2], "devices 1 of 2");
    // A device the host does not have is refused; the session stays.
    let pid = the_session(&d).1;
    let a = d.control(json!({"cmd": "migrate", "session": id, "device": 5}));
    let e = a["error"].as_str().unwrap_or_else(|| panic!("{a}"));
    assert!(e.contains("no device 5"), "{e}");
    assert_eq!(the_session(&d), (id, pid));
    for cmd in &script[3..] {
        got.push(p.ask(cmd));
    }
    assert_eq!(got[..2], expected[..2]);
    assert_eq!(
        got[3..],
        expected[3..],
        "the work gives the same results there"
    );
}

/// Runs `program args` natively and through Hira while its session is moved to a
/// new API server as often as it can be (each time the program has made calls since
/// the last move), and checks that the output is the native one. Returns the moves.
fn moves_while_running(program: &str, args: &[&str], env: &[(&str, &str)]) -> usize {
    let vendors = Vendors::native();
    let mut cmd = std::process::Command::new(c_program(program));
    cmd.args(args).env("OCL_ICD_VENDORS", vendors.dir.path());
    let expected = run_with_timeout(&mut cmd, TIMEOUT);
    assert!(expected.status.success(), "{program} fails natively");
    let d = Daemon::start(&["vm0"]);
    let hira = Vendors::hira();
    let mut cmd = d.guest(&hira, "vm0", &c_program(program));
    cmd.args(args).envs(env.iter().copied());
    let (got, moves, refused) = crate::support::run_moving_noting(&d, &mut cmd);
    assert_eq!(
        String::from_utf8_lossy(&got.stdout),
        String::from_utf8_lossy(&expected.stdout),
        "{program}: stderr {}",
        String::from_utf8_lossy(&got.stderr)
    );
    assert_eq!(got.status.code(), expected.status.code());
    // A move may be refused because the session was ending, never because what it
    // holds could not be carried or made again.
    let failed: Vec<&String> = refused
        .iter()
        .filter(|r| r.contains("cannot migrate") || r.contains("cannot restore"))
        .collect();
    assert!(failed.is_empty(), "{program}: {failed:?}");
    moves
}

#[test]
fn programs_give_native_output_while_they_move_again_and_again() {
    // Threads on their own queues, event callbacks and user events, maps, a launch
    // behind a user event, 300 stencil launches, builds with headers. Where the moves land depends on
    // timing (usually each program moves at least once); wherever they land, the
    // output is the native one. (Moves at chosen points: the tests above.)
    for (p, args) in [
        ("threads", &[][..]),
        ("events", &[]),
        ("mapping", &[]),
        ("usergate", &[]),
        ("stencil", &["300"]),
        // Builds with the application's headers (heartwall's and srad's builds could
        // not be replayed before the headers were kept with them).
        ("includes", &[]),
    ] {
        for env in [&[][..], &[("HIRA_RINGS", "0")]] {
            let n = moves_while_running(p, args, env);
            eprintln!("{p} {env:?}: moved {n} times");
        }
    }
}
