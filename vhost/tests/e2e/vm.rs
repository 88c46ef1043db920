//! A real Linux guest under QEMU (TCG): Debian's cloud kernel and an initramfs built
//! by `scripts/vm-image` with busybox, the virtio and vsock modules, the OpenCL ICD
//! loader and Hira's ICD.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use crate::support::{
    Daemon, Vendors, bin_dir, c_program, ensure_built, run_with_timeout, shim, workspace,
};

#[test]
fn linux_guest_boots_with_vsock_and_its_loader_finds_the_hira_icd() {
    ensure_built();
    assert!(
        Command::new("qemu-system-x86_64")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "qemu-system-x86_64 is missing (scripts/test installs it)"
    );
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    std::fs::write(&run, "#!/bin/sh\nls /dev/vsock\ncut -d' ' -f1 /proc/modules | sort | tr '\\n' ' '; echo\nclinfo 2>&1 | head -3\n").unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o755)).unwrap();
    let image = bin_dir().join("hira-vm");
    let built = Command::new(workspace().join("scripts/vm-image"))
        .arg(&image)
        .arg(shim())
        .arg(&run)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "vm-image failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let mut qemu = Command::new("qemu-system-x86_64");
    qemu.args([
        "-accel",
        "tcg",
        "-m",
        "512",
        "-smp",
        "1",
        "-nographic",
        "-no-reboot",
        "-kernel",
    ])
    .arg(image.join("vmlinuz"))
    .arg("-initrd")
    .arg(image.join("initramfs.cpio.gz"))
    .args(["-append", "console=ttyS0 quiet panic=-1"]);
    let out = run_with_timeout(&mut qemu, Duration::from_secs(180));
    let console = String::from_utf8_lossy(&out.stdout);
    assert!(
        console.contains("HIRA-GUEST-UP") && console.contains("HIRA-GUEST-DONE"),
        "the guest booted and ran:\n{console}"
    );
    assert!(
        !console.contains("HIRA-GUEST-MODULE-FAILED"),
        "every module loaded:\n{console}"
    );
    for module in ["virtio_pci", "vsock", "vmw_vsock_virtio_transport"] {
        assert!(
            console.contains(&format!("{module} ")),
            "{module} is loaded:\n{console}"
        );
    }
    assert!(
        console.contains("/dev/vsock"),
        "the vsock device node exists:\n{console}"
    );
    // No transport to the host yet: the guest's loader loads Hira's ICD, which says
    // it cannot reach the host and lists no platform.
    assert!(
        console.contains("Hira OpenCL is unavailable"),
        "the loader loaded Hira's ICD:\n{console}"
    );
    assert!(
        console.contains("Number of platforms                               0"),
        "{console}"
    );
}

/// The guest image with `programs` in /hira and a `run` script for `script`.
pub(crate) fn image_with(name: &str, script: &str, programs: &[&str]) -> std::path::PathBuf {
    let dir = bin_dir().join(format!("hira-vm-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let run = dir.join("run");
    std::fs::write(&run, format!("#!/bin/sh\n{script}")).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut cmd = Command::new(workspace().join("scripts/vm-image"));
    cmd.arg(&dir).arg(shim()).arg(&run);
    for p in programs {
        cmd.arg(c_program(p));
    }
    let built = cmd.output().unwrap();
    assert!(
        built.status.success(),
        "vm-image failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    dir
}

/// A guest script running each of `programs` between markers with its exit status
/// (standard error left out).
pub(crate) fn marked_script(programs: &[&str]) -> String {
    programs
        .iter()
        .map(|p| format!("echo '=== {p}'\n/hira/{p} 2>/dev/null\necho \"=== exit $?\"\n"))
        .collect()
}

/// What [`marked_script`] prints for `programs` run natively.
pub(crate) fn marked_native(programs: &[&str]) -> String {
    let native_vendors = Vendors::native();
    programs
        .iter()
        .map(|p| {
            let mut cmd = Command::new(c_program(p));
            cmd.env("OCL_ICD_VENDORS", native_vendors.dir.path());
            let o = run_with_timeout(&mut cmd, Duration::from_secs(120));
            format!(
                "=== {p}\n{}=== exit {}\n",
                String::from_utf8_lossy(&o.stdout),
                o.status.code().unwrap_or(-1)
            )
        })
        .collect()
}

/// QEMU booting `image` with Hira's vhost-user vsock device on `vhost`, and the
/// daemon's window file as an ivshmem device.
pub(crate) fn qemu_with_window(
    image: &std::path::Path,
    vhost: &std::path::Path,
    window: &std::path::Path,
) -> Command {
    let mut q = qemu(image, vhost);
    q.arg("-object")
        .arg(format!(
            "memory-backend-file,id=hirawin,mem-path={},size=64M,share=on",
            window.display()
        ))
        .args(["-device", "ivshmem-plain,memdev=hirawin"]);
    q
}

/// QEMU booting `image` with Hira's vhost-user vsock device on `vhost`.
pub(crate) fn qemu(image: &std::path::Path, vhost: &std::path::Path) -> Command {
    let mut q = qemu_without_vsock(image, vhost);
    q.args(["-device", "vhost-user-vsock-pci,chardev=vsock0"]);
    q
}

/// QEMU booting `image` with the chardev for Hira's vhost-user vsock device on
/// `vhost` but not the device.
pub(crate) fn qemu_without_vsock(image: &std::path::Path, vhost: &std::path::Path) -> Command {
    let mut q = Command::new("qemu-system-x86_64");
    q.args([
        "-accel",
        "tcg",
        "-smp",
        "1",
        "-nographic",
        "-no-reboot",
        "-m",
        "512M",
    ])
    .args([
        "-object",
        "memory-backend-memfd,id=mem,size=512M,share=on",
        "-numa",
        "node,memdev=mem",
    ])
    .arg("-chardev")
    .arg(format!("socket,id=vsock0,path={}", vhost.display()))
    .arg("-kernel")
    .arg(image.join("vmlinuz"))
    .arg("-initrd")
    .arg(image.join("initramfs.cpio.gz"))
    .args(["-append", "console=ttyS0 quiet panic=-1"]);
    q
}

/// What the guest printed between its start and end markers, with serial line ends.
pub(crate) fn guest_output(console: &str) -> String {
    let start = console
        .find("HIRA-GUEST-UP")
        .map_or(0, |i| i + "HIRA-GUEST-UP".len());
    let end = console.find("HIRA-GUEST-DONE").unwrap_or(console.len());
    console[start..end]
        .replace("\r\n", "\n")
        .trim_start_matches('\n')
        .to_string()
}

const PROGRAMS: &[(&str, &str)] = &[
    ("vecadd", ""),
    ("matmul", ""),
    ("stencil", "300"),
    ("events", ""),
    ("mapping", ""),
    ("threads", ""),
    ("build_error", ""),
    ("api_coverage", ""),
    ("cl3x", ""),
    ("usergate", ""),
    ("stream", "small"),
    ("known", ""),
    ("printf", ""),
];

/// Programs whose standard error is compared too: what the host's library printed
/// reaches the guest's descriptor 2.
const STDERR_PROGRAMS: &[&str] = &["build_error"];

/// Runs every program of [`PROGRAMS`] in a guest, once per environment of `envs`
/// (such as `HIRA_SYNC=1`), and compares with native runs.
fn programs_match_native(window: bool, envs: &[&str]) -> Daemon {
    ensure_built();
    let daemon = Daemon::start_vms_with(&[("qvm", 3)], window);
    let script: String =
        envs.iter()
            .flat_map(|env| {
                PROGRAMS.iter().map(move |(p, args)| {
                format!(
                    "echo '=== {p}'\n{env} /hira/{p} {args} 2>/dev/null\necho \"=== exit $?\"\n"
                )
            })
            .chain(STDERR_PROGRAMS.iter().map(move |p| {
                format!("echo '=== {p} stderr'\n{env} /hira/{p} 2>&1 >/dev/null\n")
            }))
            })
            .collect();
    let names: Vec<&str> = PROGRAMS.iter().map(|(p, _)| *p).collect();
    let image = image_with(
        if window {
            "programs-window"
        } else {
            "programs"
        },
        &script,
        &names,
    );
    let mut q = if window {
        qemu_with_window(
            &image,
            &daemon.vhost_socket("qvm"),
            &daemon.window_file("qvm"),
        )
    } else {
        qemu(&image, &daemon.vhost_socket("qvm"))
    };
    let out = run_with_timeout(&mut q, Duration::from_secs(300));
    let console = String::from_utf8_lossy(&out.stdout);
    let mut expected = String::new();
    let native_vendors = Vendors::native();
    for (p, args) in PROGRAMS {
        let mut cmd = Command::new(c_program(p));
        cmd.env("OCL_ICD_VENDORS", native_vendors.dir.path());
        if !args.is_empty() {
            cmd.arg(args);
        }
        let o = run_with_timeout(&mut cmd, Duration::from_secs(120));
        expected.push_str(&format!(
            "=== {p}\n{}=== exit {}\n",
            String::from_utf8_lossy(&o.stdout),
            o.status.code().unwrap_or(-1)
        ));
    }
    for p in STDERR_PROGRAMS {
        let mut cmd = Command::new(c_program(p));
        cmd.env("OCL_ICD_VENDORS", native_vendors.dir.path());
        let o = run_with_timeout(&mut cmd, Duration::from_secs(120));
        assert!(!o.stderr.is_empty(), "{p} says nothing on stderr natively");
        expected.push_str(&format!(
            "=== {p} stderr\n{}",
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    let expected = expected.repeat(envs.len());
    assert_eq!(
        guest_output(&console),
        expected,
        "guest output differs from native; daemon log:\n{}",
        daemon.log_text()
    );
    assert!(
        daemon.log_text().contains("VM \"qvm\" session"),
        "sessions belong to the VM"
    );
    daemon
}

/// CUDA programs in a QEMU guest (Hira's libcuda.so.1 installed by guest-install),
/// on the rings in the VM's window: the same output as natively on the host's driver
/// (the CPU test executor in CI, loaded by the API servers).
#[test]
fn cuda_programs_in_a_vm_match_native() {
    let k = crate::cuda::kit();
    let driver = k
        .driver_dir()
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    let daemon = Daemon::start_vms_env(&[("qvm", 3)], true, &[("LD_LIBRARY_PATH", &driver)]);
    let programs = ["vector_add", "matmul", "streams", "contexts", "transfer"];
    let script: String = programs
        .iter()
        .map(|p| {
            format!(
                "echo '=== {p}'\n/hira/{p} /hira/kernels.ptx 2>/dev/null\necho \"=== exit $?\"\n"
            )
        })
        .collect();
    let dir = bin_dir().join("hira-vm-cuda");
    std::fs::create_dir_all(&dir).unwrap();
    let run = dir.join("run");
    std::fs::write(&run, format!("#!/bin/sh\n{script}")).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut cmd = Command::new(workspace().join("scripts/vm-image"));
    cmd.arg(&dir).arg(shim()).arg(&run).arg(&k.ptx);
    for p in programs {
        cmd.arg(k.exe(p));
    }
    let built = cmd.output().unwrap();
    assert!(
        built.status.success(),
        "vm-image failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let mut q = qemu_with_window(
        &dir,
        &daemon.vhost_socket("qvm"),
        &daemon.window_file("qvm"),
    );
    let out = run_with_timeout(&mut q, Duration::from_secs(300));
    let console = String::from_utf8_lossy(&out.stdout);
    let mut expected = String::new();
    for p in programs {
        let o = crate::cuda::native(p);
        expected.push_str(&format!(
            "=== {p}\n{}=== exit {}\n",
            String::from_utf8_lossy(&o.stdout),
            o.status.code().unwrap_or(-1)
        ));
    }
    assert_eq!(
        guest_output(&console),
        expected,
        "guest output differs from native; daemon log:\n{}",
        daemon.log_text()
    );
    let ended = daemon.wait_idle(Duration::from_secs(30));
    assert!(
        ended.iter().filter(|e| e["vm"] == "qvm").count() == programs.len()
            && ended
                .iter()
                .filter(|e| e["vm"] == "qvm")
                .all(|e| e["data_plane"] == "rings" && e["api"] == "CUDA"),
        "every program a CUDA session of the VM on rings: {ended:?}"
    );
}

#[test]
fn guest_programs_over_the_vhost_user_vsock_device_match_native() {
    let daemon = programs_match_native(false, &[""]);
    assert!(
        daemon.log_text().contains("window 0 bytes"),
        "no window without ivshmem"
    );
    // Without a window slot there is no room for rings: every frame is relayed.
    let ended = daemon.wait_idle(Duration::from_secs(30));
    assert!(
        ended
            .iter()
            .filter(|e| e["vm"] == "qvm")
            .all(|e| e["data_plane"] == "relayed"),
        "{ended:?}"
    );
}

#[test]
fn guest_programs_with_the_ivshmem_window_match_native() {
    // Asynchronous forwarding on (the default) and off.
    let daemon = programs_match_native(true, &["", "HIRA_SYNC=1"]);
    let ended = daemon.wait_idle(Duration::from_secs(30));
    let sessions: Vec<_> = ended.iter().filter(|e| e["vm"] == "qvm").collect();
    assert_eq!(
        sessions.len(),
        2 * (PROGRAMS.len() + STDERR_PROGRAMS.len()),
        "{ended:?}"
    );
    // With a window slot, each session's frames travel on rings at the end of the
    // slot, woken by doorbells over vsock; the daemon relays the doorbells only.
    for s in &sessions {
        assert_eq!(s["data_plane"], "rings", "{s}");
    }
    // vecadd moves 768 KiB of buffers; through the window almost none of it is in
    // its frames, and all its calls are counted.
    let vecadd = sessions
        .iter()
        .find(|s| s["process"] == "vecadd")
        .expect("a vecadd session");
    assert!(vecadd["commands"].as_u64().unwrap() > 10, "{vecadd}");
    assert!(
        vecadd["bytes"].as_u64().unwrap() < 64 * 1024,
        "vecadd's data went through the window: {vecadd}"
    );
}

#[test]
fn killing_one_vm_leaves_nothing_of_it_and_the_other_vm_finishes() {
    ensure_built();
    let mut daemon = Daemon::start_vms(&[("doomed", 3), ("survivor", 4)]);
    let long = image_with("long", "/hira/stencil 10000000 2>&1\n", &["stencil"]);
    let short = image_with("short", "/hira/stencil 2000 2>&1\n", &["stencil"]);
    let mut doomed = qemu(&long, &daemon.vhost_socket("doomed"))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert_eq!(
        daemon.wait_api_servers(1, Duration::from_secs(120)).len(),
        1,
        "the doomed VM never started a session:\n{}",
        daemon.log_text()
    );
    let survivor = std::thread::spawn({
        let mut q = qemu(&short, &daemon.vhost_socket("survivor"));
        move || run_with_timeout(&mut q, Duration::from_secs(300))
    });
    // Both VMs run a session when the doomed one is killed.
    assert_eq!(
        daemon.wait_api_servers(2, Duration::from_secs(120)).len(),
        2,
        "the survivor never started a session:\n{}",
        daemon.log_text()
    );
    doomed.kill().unwrap();
    doomed.wait().unwrap();
    let out = survivor.join().unwrap();
    let console = guest_output(&String::from_utf8_lossy(&out.stdout));
    assert!(
        console.contains("iters=2000") && console.contains("maxdiff_ok=1"),
        "the other VM finished correctly:\n{console}"
    );
    let ended = daemon.wait_idle(Duration::from_secs(60));
    let doomed_end = ended
        .iter()
        .find(|e| e["vm"] == "doomed")
        .unwrap_or_else(|| panic!("the killed VM's session ended: {ended:?}"));
    assert!(
        doomed_end["released"].as_u64().unwrap_or(0) > 0 && doomed_end["release_failures"] == 0,
        "the killed VM's objects were released: {doomed_end}"
    );
    assert!(daemon.alive());
}

#[test]
fn hostile_guest_traffic_does_not_stop_the_daemon_serving_vms() {
    ensure_built();
    let mut daemon = Daemon::start_vms(&[("hostile", 3), ("good", 4)]);
    let hostile = image_with(
        "hostile",
        "/hira/vsock_garbage\n/hira/vecadd 2>&1\n",
        &["vsock_garbage", "vecadd"],
    );
    let good = image_with("good", "/hira/vecadd 2>&1\n", &["vecadd"]);
    let h = std::thread::spawn({
        let mut q = qemu(&hostile, &daemon.vhost_socket("hostile"));
        move || run_with_timeout(&mut q, Duration::from_secs(300))
    });
    let g = std::thread::spawn({
        let mut q = qemu(&good, &daemon.vhost_socket("good"));
        move || run_with_timeout(&mut q, Duration::from_secs(300))
    });
    let hung = |vm: &str| panic!("the {vm} VM hung; daemon log:\n{}", daemon.log_text());
    let g = g.join().unwrap_or_else(|_| hung("good"));
    let h = h.join().unwrap_or_else(|_| hung("hostile"));
    let hostile_out = guest_output(&String::from_utf8_lossy(&h.stdout));
    let good_out = guest_output(&String::from_utf8_lossy(&g.stdout));
    assert!(
        hostile_out.contains("garbage: host answered with an error frame, then closed"),
        "{hostile_out}"
    );
    assert!(hostile_out.contains("port 22: refused"), "{hostile_out}");
    assert!(
        hostile_out.contains("mismatches=0"),
        "the hostile VM is still served afterwards:\n{hostile_out}"
    );
    assert!(
        good_out.contains("mismatches=0"),
        "the other VM is served:\n{good_out}"
    );
    assert!(daemon.alive());
}

/// A QEMU guest's console as lines, read on a thread; and its input.
pub(crate) struct Console {
    input: Box<dyn std::io::Write + Send>,
    lines: std::sync::mpsc::Receiver<String>,
    child: Option<std::process::Child>,
}

impl Console {
    fn start(mut q: Command) -> Console {
        let mut child = q
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("qemu starts");
        let input = Box::new(child.stdin.take().unwrap());
        let out = child.stdout.take().unwrap();
        Console {
            input,
            lines: Self::read_lines(out),
            child: Some(child),
        }
    }

    /// The console of a QEMU serial port on the FIFOs `PATH.in` and `PATH.out` (a
    /// `pipe` chardev, as libvirt's `<serial type='pipe'>` makes it). Both are opened
    /// for reading and writing, so that neither open waits for QEMU and its output is
    /// kept in the FIFO until read.
    pub(crate) fn fifos(path: &std::path::Path) -> Console {
        let open = |suffix: &str| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(format!("{}.{suffix}", path.display()))
                .expect("the console's FIFO opens")
        };
        Console {
            input: Box::new(open("in")),
            lines: Self::read_lines(open("out")),
            child: None,
        }
    }

    fn read_lines(out: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
        use std::io::BufRead;
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out)
                .split(b'\n')
                .map_while(Result::ok)
            {
                let l = String::from_utf8_lossy(&l)
                    .trim_end_matches('\r')
                    .to_string();
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        lines
    }

    /// The next console line that starts with `prefix` (kernel messages skipped).
    pub(crate) fn line_starting(&self, prefix: &str) -> String {
        loop {
            let l = self
                .lines
                .recv_timeout(Duration::from_secs(300))
                .unwrap_or_else(|_| panic!("the guest said nothing starting with {prefix:?}"));
            if l.starts_with(prefix) {
                return l;
            }
        }
    }

    pub(crate) fn ask(&mut self, cmd: &str) -> String {
        use std::io::Write;
        writeln!(self.input, "{cmd}").unwrap();
        self.input.flush().unwrap();
        let word = cmd.split(' ').next().unwrap();
        self.line_starting(word)
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The guest script running `tests/c/migrate.c` on commands from the console
/// (without echo).
pub(crate) const MIGRATE_SCRIPT: &str = "stty -echo\n/hira/migrate\necho \"=== exit $?\"\n";

/// A daemon serving VM qvm (with a shared window if `window`) and a QEMU guest of
/// it running `tests/c/migrate.c` from its image `image`, ready for commands.
fn migrate_guest(image: &str, window: bool) -> (Daemon, Console) {
    let daemon = Daemon::start_vms_with(&[("qvm", 3)], window);
    let image = image_with(image, MIGRATE_SCRIPT, &["migrate"]);
    let vhost = daemon.vhost_socket("qvm");
    let q = if window {
        qemu_with_window(&image, &vhost, &daemon.window_file("qvm"))
    } else {
        qemu(&image, &vhost)
    };
    let console = Console::start(q);
    console.line_starting("ready");
    (daemon, console)
}

#[test]
fn a_vm_guests_session_moves_between_api_servers_while_it_runs() {
    // On rings in the VM's shared window, and relayed over vsock without one.
    for window in [true, false] {
        vm_session_moves(window);
    }
}

fn vm_session_moves(window: bool) {
    ensure_built();
    let script = ["step", "pend", "go", "loop 3", "unmap", "check", "end"];
    let expected = crate::migration::native(&script);
    let (daemon, mut console) = migrate_guest("migrate-moves", window);
    let session = || {
        let s = daemon.status();
        let live = s["sessions"].as_array().unwrap().clone();
        assert_eq!(live.len(), 1, "{s}");
        (
            live[0]["id"].as_u64().unwrap(),
            live[0]["api_server_pid"].as_u64().unwrap(),
        )
    };
    let mut got = Vec::new();
    for cmd in script {
        got.push(console.ask(cmd));
        if cmd == "end" {
            break;
        }
        // Between every two commands the VM's session moves to a new API server,
        // its rings in the VM's shared window and its objects with it.
        let (id, pid) = session();
        let a = daemon.control(serde_json::json!({"cmd": "migrate", "session": id}));
        assert!(a["moved"].is_object(), "{a}\n{}", daemon.log_text());
        assert_ne!(session().1, pid);
    }
    assert_eq!(got, expected, "daemon log:\n{}", daemon.log_text());
    assert_eq!(console.line_starting("=== exit"), "=== exit 0");
}

#[test]
fn a_vm_guests_session_is_suspended_and_resumed_over_vsock() {
    // On rings in the VM's shared window, and relayed over vsock without one (the
    // guest sends its last frame before the capture and holds the rest).
    for window in [true, false] {
        vm_session_suspends(window);
    }
}

fn vm_session_suspends(window: bool) {
    ensure_built();
    let script = ["step", "pend", "loop 2", "check", "end"];
    let expected = crate::migration::native(&script);
    let (daemon, mut console) = migrate_guest(
        if window {
            "migrate-suspend"
        } else {
            "migrate-suspend-relayed"
        },
        window,
    );
    let file = daemon.dir.path().join("vm-session.hira");
    let mut got = Vec::new();
    for (i, cmd) in script.iter().enumerate() {
        if i == 1 || i == 3 {
            // Suspended into a file (its rings stay in the VM's window, its slot
            // kept; or relayed), then restored: the guest reconnects over vsock and
            // goes on.
            let s = daemon.status();
            let id = s["sessions"][0]["id"].as_u64().unwrap();
            daemon.ctl_ok(&["checkpoint", &id.to_string(), file.to_str().unwrap()]);
            use std::io::Write;
            writeln!(console.input, "{cmd}").unwrap();
            daemon.ctl_ok(&["restore", file.to_str().unwrap()]);
            got.push(console.line_starting(cmd.split(' ').next().unwrap()));
            continue;
        }
        got.push(console.ask(cmd));
    }
    assert_eq!(got, expected, "daemon log:\n{}", daemon.log_text());
    assert_eq!(console.line_starting("=== exit"), "=== exit 0");
}

/// A QMP connection to a QEMU (`-qmp unix:PATH,server=on,wait=off`).
struct Qmp {
    r: std::io::BufReader<std::os::unix::net::UnixStream>,
    w: std::os::unix::net::UnixStream,
}

impl Qmp {
    fn connect(path: &std::path::Path) -> Qmp {
        let mut s = None;
        // QEMU creates the socket as it starts: wait for it to accept.
        for _ in 0..3000 {
            if let Ok(c) = std::os::unix::net::UnixStream::connect(path) {
                s = Some(c);
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let s = s.expect("QEMU's QMP socket accepts");
        s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
        let mut q = Qmp {
            r: std::io::BufReader::new(s.try_clone().unwrap()),
            w: s,
        };
        q.next(); // the greeting
        q.execute("qmp_capabilities", serde_json::json!({}));
        q
    }

    fn next(&mut self) -> serde_json::Value {
        use std::io::BufRead;
        let mut l = String::new();
        self.r.read_line(&mut l).expect("QMP answers");
        serde_json::from_str(&l).unwrap_or_else(|_| panic!("QMP said {l:?}"))
    }

    /// Runs a command; events that come before its answer are dropped.
    fn execute(&mut self, cmd: &str, args: serde_json::Value) -> serde_json::Value {
        use std::io::Write;
        writeln!(
            self.w,
            "{}",
            serde_json::json!({"execute": cmd, "arguments": args})
        )
        .unwrap();
        loop {
            let v = self.next();
            if v.get("return").is_some() || v.get("error").is_some() {
                assert!(v.get("error").is_none(), "{cmd}: {v}");
                return v;
            }
        }
    }

    /// Waits for the event `name` whose data satisfies `pred`.
    fn event(&mut self, name: &str, pred: impl Fn(&serde_json::Value) -> bool) {
        loop {
            let v = self.next();
            if v["event"] == name && pred(&v["data"]) {
                return;
            }
        }
    }
}

/// Unplugs the VM's vsock device and plugs a new one in, on a new vhost-user
/// connection to `daemon` (QEMU closes a device's connection when it goes), as an
/// operator would with QMP: nobody tells Hira.
fn replug_vsock(q: &mut Qmp, daemon: &Daemon) {
    replug_vsock_again(q, daemon, 0);
}

/// The `round`th replug of the VM's vsock device (from 0): its chardev was
/// `vsock{round}` and becomes `vsock{round + 1}`.
fn replug_vsock_again(q: &mut Qmp, daemon: &Daemon, round: u32) {
    let (old, new) = (format!("vsock{round}"), format!("vsock{}", round + 1));
    q.execute("device_del", serde_json::json!({"id": "hiravsock"}));
    q.event("DEVICE_DELETED", |d| d["device"] == "hiravsock");
    q.execute("chardev-remove", serde_json::json!({"id": old}));
    q.execute(
        "chardev-add",
        serde_json::json!({"id": new, "backend": {"type": "socket", "data": {
            "addr": {"type": "unix", "data": {"path": daemon.vhost_socket("qvm")}},
            "server": false}}}),
    );
    q.execute(
        "device_add",
        serde_json::json!({"driver": "vhost-user-vsock-pci", "chardev": new, "id": "hiravsock", "addr": "0x6"}),
    );
}

/// QEMU booting `image` for VM qvm of `daemon` (its window as ivshmem), with QMP.
fn qemu_with_qmp(daemon: &Daemon, image: &std::path::Path, qmp: &std::path::Path) -> Console {
    let window = daemon.window_file("qvm");
    Console::start(qemu_migratable(
        image,
        &daemon.vhost_socket("qvm"),
        Some(&window),
        qmp,
        true,
        None,
    ))
}

#[test]
fn a_vm_reconnects_after_its_vsock_device_is_unplugged_and_plugged_back() {
    // The daemon's vhost-user backend takes a new connection from the same QEMU once
    // the first ends: a program run after that is served as one run before.
    ensure_built();
    let daemon = Daemon::start_vms_with(&[("qvm", 3)], true);
    let script = "stty -echo\n/hira/vecadd 2>&1\necho '=== first'\nread again\n/hira/vecadd 2>&1\necho \"=== exit $?\"\n";
    let image = image_with("replug", script, &["vecadd"]);
    let work = tempfile::tempdir().unwrap();
    let qmp = work.path().join("q.qmp");
    let mut console = qemu_with_qmp(&daemon, &image, &qmp);
    let mut q = Qmp::connect(&qmp);
    let first = console.line_starting("vecadd");
    console.line_starting("=== first");
    replug_vsock(&mut q, &daemon);
    {
        use std::io::Write;
        writeln!(console.input, "again").unwrap();
    }
    let second = console.line_starting("vecadd");
    assert!(first.contains("mismatches=0"), "{first}");
    assert_eq!(second, first, "daemon log:\n{}", daemon.log_text());
    assert_eq!(console.line_starting("=== exit"), "=== exit 0");
}

#[test]
fn a_vm_session_on_rings_outlives_a_reset_of_the_vsock_device() {
    // Nobody announced it: the VM's vsock device is unplugged and plugged back while
    // the program is between two commands. The session lives in the VM's window; its
    // API server waits, the guest connects again on its next call and goes on,
    // exactly as natively.
    ensure_built();
    let script = ["step", "pend", "loop 2", "check", "end"];
    let expected = crate::migration::native(&script);
    let daemon = Daemon::start_vms_with(&[("qvm", 3)], true);
    let image = image_with("reset-vsock", MIGRATE_SCRIPT, &["migrate"]);
    let work = tempfile::tempdir().unwrap();
    let qmp = work.path().join("q.qmp");
    let mut console = qemu_with_qmp(&daemon, &image, &qmp);
    let mut q = Qmp::connect(&qmp);
    console.line_starting("ready");
    let mut got = vec![console.ask(script[0]), console.ask(script[1])];
    let pid = daemon.status()["sessions"][0]["api_server_pid"].clone();
    replug_vsock(&mut q, &daemon);
    for cmd in &script[2..] {
        got.push(console.ask(cmd));
        if *cmd == "loop 2" {
            // The same API server serves it: the session was never restarted.
            assert_eq!(daemon.status()["sessions"][0]["api_server_pid"], pid);
        }
    }
    assert_eq!(got, expected, "daemon log:\n{}", daemon.log_text());
    assert_eq!(console.line_starting("=== exit"), "=== exit 0");
    assert!(
        daemon.log_text().contains("its guest reconnected"),
        "{}",
        daemon.log_text()
    );
    assert_eq!(daemon.status()["reconnections"], 1);
}

#[test]
fn a_relayed_vm_session_outlives_a_reset_of_the_vsock_device_with_calls_in_flight() {
    // No shared window: every frame is relayed over vsock. The VM's vsock device is
    // unplugged and plugged back, unannounced, while the program runs a loop of
    // launches and reads, so frames are lost in flight with the connection. Both
    // ends kept what they sent: the guest reconnects, each sends again what the
    // other did not take, and every call runs exactly once (a launch run twice or
    // lost would change the sums), as natively, on the same API server.
    ensure_built();
    let script = ["step", "loop 400", "check", "end"];
    let expected = crate::migration::native(&script);
    let daemon = Daemon::start_vms_with(&[("qvm", 3)], false);
    let image = image_with("reset-relayed", MIGRATE_SCRIPT, &["migrate"]);
    let work = tempfile::tempdir().unwrap();
    let qmp = work.path().join("q.qmp");
    let mut console = Console::start(qemu_migratable(
        &image,
        &daemon.vhost_socket("qvm"),
        None,
        &qmp,
        true,
        None,
    ));
    let mut q = Qmp::connect(&qmp);
    console.line_starting("ready");
    let mut got = vec![console.ask(script[0])];
    let session = &daemon.status()["sessions"][0];
    let (pid, before) = (
        session["api_server_pid"].clone(),
        session["commands"].as_u64().unwrap(),
    );
    {
        use std::io::Write;
        writeln!(console.input, "{}", script[1]).unwrap();
    }
    // Cut twice while the loop runs: once its first hundred calls have reached the
    // host, and once the next five hundred have.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    for (round, calls) in [(0, 100), (1, 600)] {
        while daemon.status()["sessions"][0]["commands"].as_u64().unwrap() < before + calls {
            assert!(
                std::time::Instant::now() < deadline,
                "the loop stalled before {calls} calls; daemon log:\n{}",
                daemon.log_text()
            );
            std::thread::yield_now();
        }
        replug_vsock_again(&mut q, &daemon, round);
    }
    got.push(console.line_starting("loop"));
    assert_eq!(daemon.status()["sessions"][0]["api_server_pid"], pid);
    for cmd in &script[2..] {
        got.push(console.ask(cmd));
    }
    assert_eq!(got, expected, "daemon log:\n{}", daemon.log_text());
    assert_eq!(console.line_starting("=== exit"), "=== exit 0");
    let log = daemon.log_text();
    assert_eq!(log.matches("its guest reconnected").count(), 2, "{log}");
    let status = daemon.status();
    assert_eq!(
        (
            status["reconnections"].as_u64(),
            status["detached"].as_u64()
        ),
        (Some(2), Some(0))
    );
}

/// QEMU for the live-migration test: the guest image, Hira's window as ivshmem, the
/// vhost-user chardev to `vhost` with the vsock device only if `with_vsock`, QMP on
/// `qmp`, and `incoming` to receive a migration.
fn qemu_migratable(
    image: &std::path::Path,
    vhost: &std::path::Path,
    window: Option<&std::path::Path>,
    qmp: &std::path::Path,
    with_vsock: bool,
    incoming: Option<&std::path::Path>,
) -> Command {
    let mut q = qemu_without_vsock(image, vhost);
    if let Some(window) = window {
        q.arg("-object")
            .arg(format!(
                "memory-backend-file,id=hirawin,mem-path={},size=64M,share=on",
                window.display()
            ))
            .args(["-device", "ivshmem-plain,memdev=hirawin,addr=0x5,master=on"]);
    }
    q.arg("-qmp")
        .arg(format!("unix:{},server=on,wait=off", qmp.display()));
    if with_vsock {
        q.args([
            "-device",
            "vhost-user-vsock-pci,chardev=vsock0,id=hiravsock,addr=0x6",
        ]);
    }
    if let Some(p) = incoming {
        q.arg("-incoming").arg(format!("unix:{}", p.display()));
    }
    q
}

#[test]
fn a_vm_using_hira_live_migrates_to_another_qemu_and_daemon() {
    // With the shared window (rings) and without it (frames relayed over vsock).
    for window in [true, false] {
        vm_live_migrates(window);
    }
}

fn vm_live_migrates(window: bool) {
    ensure_built();
    let script = ["step", "pend", "loop 2", "check", "end"];
    let expected = crate::migration::native(&script);
    let a = Daemon::start_vms_with(&[("qvm", 3)], window);
    let b = Daemon::start_vms_with(&[("qvm", 3)], window);
    let (window_a, window_b) = if window {
        (Some(a.window_file("qvm")), Some(b.window_file("qvm")))
    } else {
        (None, None)
    };
    let image = image_with(
        if window {
            "migrate-live"
        } else {
            "migrate-live-relayed"
        },
        &MIGRATE_SCRIPT.replace("/hira/migrate", "HIRA_RESUME_SECS=600 /hira/migrate"),
        &["migrate"],
    );
    let work = tempfile::tempdir().unwrap();
    let (qmp_a, qmp_b, mig) = (
        work.path().join("a.qmp"),
        work.path().join("b.qmp"),
        work.path().join("mig.sock"),
    );
    let mut source = Console::start(qemu_migratable(
        &image,
        &a.vhost_socket("qvm"),
        window_a.as_deref(),
        &qmp_a,
        true,
        None,
    ));
    let mut qa = Qmp::connect(&qmp_a);
    source.line_starting("ready");
    let mut got = vec![source.ask(script[0]), source.ask(script[1])];
    // 1. The VM's session moves to daemon b: suspended here, its snapshot parked
    //    there with its window slot kept; the guest is told to reconnect.
    let id = a.status()["sessions"][0]["id"].as_u64().unwrap();
    let to = b.dir.path().join("control.sock");
    a.ctl_ok(&["migrate", &id.to_string(), "--to", to.to_str().unwrap()]);
    // 2. QEMU cannot migrate a vhost-user vsock device: it leaves the source VM.
    qa.execute("device_del", serde_json::json!({"id": "hiravsock"}));
    qa.event("DEVICE_DELETED", |d| d["device"] == "hiravsock");
    // 3. The destination QEMU, without it, takes the VM (its memory and the window's
    //    contents, rings included).
    let mut dest = Console::start(qemu_migratable(
        &image,
        &b.vhost_socket("qvm"),
        window_b.as_deref(),
        &qmp_b,
        false,
        Some(&mig),
    ));
    let mut qb = Qmp::connect(&qmp_b);
    qa.execute(
        "migrate-set-capabilities",
        serde_json::json!({"capabilities": [{"capability": "events", "state": true}]}),
    );
    qa.execute(
        "migrate",
        serde_json::json!({"uri": format!("unix:{}", mig.display())}),
    );
    qa.event("MIGRATION", |d| d["status"] == "completed");
    drop(qa);
    drop(source);
    qb.event("RESUME", |_| true);
    // 4. The vsock device joins the destination VM, attached to daemon b: the guest
    //    reconnects there and resumes its session.
    qb.execute(
        "device_add",
        serde_json::json!({"driver": "vhost-user-vsock-pci", "chardev": "vsock0", "id": "hiravsock", "addr": "0x6"}),
    );
    for cmd in &script[2..] {
        got.push(dest.ask(cmd));
    }
    assert_eq!(got, expected, "daemon b log:\n{}", b.log_text());
    assert_eq!(dest.line_starting("=== exit"), "=== exit 0");
    assert!(a.status()["sessions"].as_array().unwrap().is_empty());
    // The session ran on at b: resumed there, from its parked snapshot.
    assert!(b.log_text().contains("resuming"), "{}", b.log_text());
}

#[test]
fn a_vm_added_at_run_time_runs_its_guests_programs_and_goes_without_a_trace() {
    // As a libvirt hook does: the VM is added when its domain is prepared (after the
    // daemon started, with its vhost-user device and ivshmem window), its guest runs
    // OpenCL programs (identical to native, on shared-memory rings), the domain is
    // destroyed (QEMU killed), and the VM removed: nothing of it stays.
    ensure_built();
    let daemon = Daemon::start(&["local"]);
    let shm = crate::support::shm_dir();
    let window = shm
        .as_ref()
        .map_or(daemon.dir.path(), |d| d.path())
        .join("late.window");
    let socket = daemon.dir.path().join("late.vhost");
    daemon.ctl_ok(&[
        "vm",
        "add",
        "late",
        &format!(
            "socket={},cid=3,window={},window-mb=64,share=2",
            socket.display(),
            window.display()
        ),
    ]);
    let programs = ["vecadd", "events"];
    let script = marked_script(&programs);
    let image = image_with("late", &script, &programs);
    let mut q = qemu_with_window(&image, &socket, &window);
    let out = run_with_timeout(&mut q, Duration::from_secs(300));
    let console = guest_output(&String::from_utf8_lossy(&out.stdout));
    let expected = marked_native(&programs);
    assert_eq!(console, expected, "{}", daemon.log_text());
    let ended = daemon.wait_idle(Duration::from_secs(60));
    let ours: Vec<_> = ended.iter().filter(|e| e["vm"] == "late").collect();
    assert_eq!(ours.len(), 2, "{ended:?}");
    assert!(ours.iter().all(|e| e["data_plane"] == "rings"), "{ours:?}");
    let removed = daemon.control(serde_json::json!({"cmd": "vm_remove", "vm": "late"}));
    assert_eq!(removed["removed"], "late", "{removed}");
    assert!(!socket.exists() && !window.exists());
    let status = daemon.status();
    assert!(
        status["vms"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["name"] != "late"),
        "{status}"
    );
}
