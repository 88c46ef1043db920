//! Test support: builds the real components, compiles the C test programs, and runs
//! the real daemon, API servers and OpenCL library (PoCL).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use hira_protocol::frame::HEADER_LEN;
use hira_protocol::handshake::{Hello, Welcome};
use hira_protocol::{FrameHeader, FrameKind, Span, unix};

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The directory holding this build's binaries.
pub fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_hira-vhost"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The API servers' kernel cache of every daemon these tests start: not the packaged
/// default (`/var/cache/hira`), which the operator's quick start installs, gives to
/// its own sandbox user and purges while other tests run.
pub fn api_server_cache() -> PathBuf {
    PathBuf::from("/var/tmp/hira-e2e-cache")
}

/// `hira-vhost` as these tests start it (with their own kernel cache).
pub fn hira_vhost() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hira-vhost"));
    cmd.arg("--api-server-cache-dir").arg(api_server_cache());
    cmd
}

/// Builds the guest shim and the API server (cargo builds only this package's
/// binaries for its tests).
pub fn ensure_built() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(workspace()).args([
            "build",
            "-p",
            "hira-opencl",
            "-p",
            "hira-cuda",
            "-p",
            "hira-tests-cuda-cpu",
            "-p",
            "hira-tests-cuda-rust",
            "-p",
            "hira-api-server",
            "-p",
            "hira-ctl",
        ]);
        if bin_dir().ends_with("release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("cargo runs");
        assert!(
            status.success(),
            "building the guest shims, the CPU test executor, hira-api-server and hira-ctl failed"
        );
        assert!(shim().is_file(), "{} was not built", shim().display());
    });
}

pub fn shim() -> PathBuf {
    bin_dir().join("libhira_opencl.so")
}

/// Compiles `tests/c/NAME.c` (once per test process) and returns the executable.
pub fn c_program(name: &str) -> PathBuf {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let out_dir = bin_dir().join("hira-c");
    std::fs::create_dir_all(&out_dir).unwrap();
    let exe = out_dir.join(name);
    let src = workspace().join("tests/c").join(format!("{name}.c"));
    let fresh = exe
        .metadata()
        .and_then(|m| m.modified())
        .ok()
        .zip(src.metadata().and_then(|m| m.modified()).ok())
        .is_some_and(|(e, s)| e > s);
    if !fresh {
        let o = Command::new("gcc")
            .args(["-O2", "-Wall", "-o"])
            .arg(&exe)
            .arg(&src)
            .args(["-lOpenCL", "-lpthread"])
            .output()
            .expect("gcc runs (install gcc and ocl-icd-opencl-dev)");
        assert!(
            o.status.success(),
            "gcc {name}.c failed:\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    exe
}

/// A directory of ICD files: the host's native vendors, or only Hira's.
pub struct Vendors {
    pub dir: tempfile::TempDir,
}

impl Vendors {
    /// Every vendor the host has installed, except Hira.
    pub fn native() -> Vendors {
        let dir = tempfile::tempdir().unwrap();
        let mut n = 0;
        for e in std::fs::read_dir("/etc/OpenCL/vendors")
            .expect("/etc/OpenCL/vendors exists (install pocl-opencl-icd)")
        {
            let p = e.unwrap().path();
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            if p.extension().is_some_and(|x| x == "icd") && !text.contains("hira") {
                std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
                n += 1;
            }
        }
        assert!(
            n > 0,
            "no native OpenCL ICD installed (install pocl-opencl-icd)"
        );
        Vendors { dir }
    }

    /// Only Hira's ICD.
    pub fn hira() -> Vendors {
        ensure_built();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("hira.icd"),
            format!("{}\n", shim().display()),
        )
        .unwrap();
        Vendors { dir }
    }
}

/// The daemon's sd_notify socket: a test waits for `READY=1` instead of polling.
pub struct Readiness {
    socket: std::os::unix::net::UnixDatagram,
    path: PathBuf,
}

impl Readiness {
    pub fn new(dir: &Path) -> Readiness {
        let path = dir.join("notify.sock");
        let socket = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        // Bounds a daemon that never gets ready; readiness normally comes at once.
        socket
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        Readiness { socket, path }
    }

    pub fn apply(&self, cmd: &mut Command) {
        cmd.env("NOTIFY_SOCKET", &self.path);
    }

    /// Blocks until the daemon reports `READY=1` (or fails the test if it exits).
    pub fn wait(&self, d: &mut Daemon) {
        let mut buf = [0u8; 512];
        loop {
            let n = match self.socket.recv(&mut buf) {
                Ok(n) => n,
                Err(e) => panic!(
                    "no readiness from hira-vhost ({e}); alive: {}\n{}",
                    d.alive(),
                    d.log_text()
                ),
            };
            if String::from_utf8_lossy(&buf[..n]).contains("READY=1") {
                return;
            }
        }
    }
}

/// A running `hira-vhost`, killed when dropped.
pub struct Daemon {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub log: PathBuf,
    /// Where VMs' window files are: in /dev/shm (tmpfs, as operators place them).
    pub shm: Option<tempfile::TempDir>,
    /// Released after the daemon is killed (fields drop after `drop`).
    _turn: Turn,
}

/// Tests run two at a time. The few that measure how the device is shared over
/// seconds take the machine [`alone`]: on two cores, another test's QEMU guest or
/// compiler leaves their guests' round trips gaps that no policy can fill for them
/// (seen in CI: a share of 3:1 measured as 0.51 of the device). Every daemon a test
/// starts holds a shared turn for its life.
static TURNS: parking_lot::RwLock<()> = parking_lot::const_rwlock(());

thread_local! {
    static ALONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The machine to this test alone, until the guard drops: waits until no other test
/// has a daemon, and keeps others from starting one meanwhile.
pub struct Alone(#[allow(dead_code)] parking_lot::RwLockWriteGuard<'static, ()>);

pub fn alone() -> Alone {
    let g = TURNS.write();
    ALONE.set(true);
    Alone(g)
}

impl Drop for Alone {
    fn drop(&mut self) {
        ALONE.set(false);
    }
}

/// A daemon's shared turn (none inside a test that has the machine alone). Taken
/// recursively: a test that runs two daemons never waits on a test waiting to be
/// alone.
struct Turn(#[allow(dead_code)] Option<parking_lot::RwLockReadGuard<'static, ()>>);

impl Turn {
    fn take() -> Turn {
        Turn((!ALONE.get()).then(|| TURNS.read_recursive()))
    }
}

/// A directory for VM window files in /dev/shm, where operators put them (tmpfs),
/// else none.
pub fn shm_dir() -> Option<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix("hira-e2e")
        .tempdir_in("/dev/shm")
        .ok()
}

impl Daemon {
    /// Starts the daemon with one local listener per VM name.
    pub fn start(vms: &[&str]) -> Daemon {
        Self::start_with_env(vms, &[])
    }

    /// Starts the daemon with extra environment variables.
    pub fn start_with_env(vms: &[&str], env: &[(&str, &str)]) -> Daemon {
        Self::start_with(vms, env, &[])
    }

    /// Starts the daemon with extra environment variables and flags, and waits for its
    /// readiness notification (sd_notify `READY=1`), sent once every listener is bound.
    /// A VM given as `NAME,OPTIONS` gets its listener with those options
    /// (`q,mem-quota=8M`).
    pub fn start_with(vms: &[&str], env: &[(&str, &str)], flags: &[&str]) -> Daemon {
        Self::start_in(tempfile::tempdir().unwrap(), vms, env, flags, None)
    }

    /// As [`Daemon::start_with`], the daemon in the mount namespace `ns` (a
    /// `/proc/PID/ns/mnt`), as another host's daemon sees its own `/dev/shm` and
    /// `/run`; its directory is this host's.
    pub fn start_in_mount_ns(ns: &Path, vms: &[&str], flags: &[&str]) -> Daemon {
        let ns = std::fs::File::open(ns).expect("the mount namespace opens");
        Self::start_in(tempfile::tempdir().unwrap(), vms, &[], flags, Some(ns))
    }

    /// Stops the daemon (SIGTERM, as an operator would) and starts a new one with
    /// listeners for `vms` on the same sockets.
    pub fn restart(self, vms: &[&str]) -> Daemon {
        self.restart_with(vms, &[])
    }

    /// As [`Daemon::restart`], the new daemon with `flags`.
    pub fn restart_with(mut self, vms: &[&str], flags: &[&str]) -> Daemon {
        // SAFETY: signals our own child, not yet reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().unwrap();
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap());
        let _ = std::fs::remove_file(dir.path().join("notify.sock"));
        Self::start_in(dir, vms, &[], flags, None)
    }

    fn start_in(
        dir: tempfile::TempDir,
        vms: &[&str],
        env: &[(&str, &str)],
        flags: &[&str],
        mount_ns: Option<std::fs::File>,
    ) -> Daemon {
        ensure_built();
        let turn = Turn::take();
        let log = dir.path().join("daemon.log");
        let mut cmd = hira_vhost();
        for vm in vms {
            let (name, options) = vm
                .split_once(',')
                .map_or((*vm, String::new()), |(n, o)| (n, format!(",{o}")));
            cmd.arg("--local-socket").arg(format!(
                "{name}={}{options}",
                dir.path().join(format!("{name}.sock")).display()
            ));
        }
        cmd.args(flags)
            .arg("--control-socket")
            .arg(dir.path().join("control.sock"));
        cmd.env("RUST_LOG", "info")
            .env_remove("OCL_ICD_VENDORS")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let ready = Readiness::new(dir.path());
        ready.apply(&mut cmd);
        if let Some(ns) = mount_ns {
            use std::os::fd::AsRawFd;
            use std::os::unix::process::CommandExt;
            // SAFETY: setns is async-signal-safe; the forked child is single-threaded
            // and has its own filesystem context, as joining a mount namespace needs.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNS) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = cmd.spawn().expect("hira-vhost starts");
        let mut d = Daemon {
            child,
            dir,
            log,
            shm: None,
            _turn: turn,
        };
        ready.wait(&mut d);
        d
    }

    /// Starts the daemon serving one vhost-user vsock device per `(name, cid)`.
    pub fn start_vms(vms: &[(&str, u32)]) -> Daemon {
        Self::start_vms_with(vms, false)
    }

    /// As [`Daemon::start_vms`], each VM with a 64 MiB shared data window when
    /// `windows` is set (see [`Daemon::window_file`]).
    pub fn start_vms_with(vms: &[(&str, u32)], windows: bool) -> Daemon {
        Self::start_vms_env(vms, windows, &[])
    }

    /// As [`Daemon::start_vms_with`], with extra environment.
    pub fn start_vms_env(vms: &[(&str, u32)], windows: bool, env: &[(&str, &str)]) -> Daemon {
        ensure_built();
        let turn = Turn::take();
        let dir = tempfile::tempdir().unwrap();
        let shm = shm_dir();
        let windows_in = shm.as_ref().map_or(dir.path(), |d| d.path()).to_path_buf();
        let log = dir.path().join("daemon.log");
        let mut cmd = hira_vhost();
        for (name, cid) in vms {
            let mut spec = format!(
                "name={name},socket={},cid={cid}",
                dir.path().join(format!("{name}.vhost")).display()
            );
            if windows {
                spec.push_str(&format!(
                    ",window={},window-mb=64",
                    windows_in.join(format!("{name}.window")).display()
                ));
            }
            cmd.arg("--vm").arg(spec);
        }
        cmd.env("RUST_LOG", "info")
            .env_remove("OCL_ICD_VENDORS")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        cmd.arg("--control-socket")
            .arg(dir.path().join("control.sock"));
        let ready = Readiness::new(dir.path());
        ready.apply(&mut cmd);
        let child = cmd.spawn().expect("hira-vhost starts");
        let mut d = Daemon {
            child,
            dir,
            log,
            shm,
            _turn: turn,
        };
        ready.wait(&mut d);
        d
    }

    /// A daemon the test started itself, with its directory and log.
    pub fn adopt(child: Child, dir: tempfile::TempDir, log: PathBuf) -> Daemon {
        Daemon {
            child,
            dir,
            log,
            shm: None,
            _turn: Turn::take(),
        }
    }

    /// The shared data window file of VM `name`.
    pub fn window_file(&self, name: &str) -> PathBuf {
        let dir = self.shm.as_ref().unwrap_or(&self.dir);
        dir.path().join(format!("{name}.window"))
    }

    /// The vhost-user socket of VM `name` started by [`Daemon::start_vms`].
    pub fn vhost_socket(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.vhost"))
    }

    pub fn socket(&self, vm: &str) -> PathBuf {
        self.dir.path().join(format!("{vm}.sock"))
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// One request to the daemon's control socket.
    pub fn control(&self, request: serde_json::Value) -> serde_json::Value {
        use std::io::BufRead;
        let mut s = UnixStream::connect(self.dir.path().join("control.sock"))
            .expect("the control socket accepts");
        writeln!(s, "{request}").unwrap();
        let mut line = String::new();
        std::io::BufReader::new(s).read_line(&mut line).unwrap();
        serde_json::from_str(&line).expect("the control socket answers JSON")
    }

    /// The daemon's status (live and ended sessions, VMs).
    pub fn status(&self) -> serde_json::Value {
        self.control(serde_json::json!({ "cmd": "status" }))
    }

    /// Pids of the API servers of the live sessions.
    pub fn api_servers(&self) -> Vec<u32> {
        self.status()["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|s| s["api_server_pid"].as_u64().map(|p| p as u32))
            .collect()
    }

    /// Waits (the daemon answers when it happens) until exactly `n` sessions are live
    /// with their API servers started; returns their API servers' pids.
    pub fn wait_api_servers(&self, n: usize, timeout: Duration) -> Vec<u32> {
        let a = self.control(serde_json::json!({
            "cmd": "wait_live", "count": n, "timeout_ms": timeout.as_millis() as u64
        }));
        a["status"]["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|s| s["api_server_pid"].as_u64().map(|p| p as u32))
            .collect()
    }

    /// Waits until no session is live; returns the sessions that ended, oldest first.
    pub fn wait_idle(&self, timeout: Duration) -> Vec<serde_json::Value> {
        let a = self.control(serde_json::json!({
            "cmd": "wait_idle", "timeout_ms": timeout.as_millis() as u64
        }));
        assert_eq!(
            a["reached"],
            true,
            "sessions still live: {a}\n{}",
            self.log_text()
        );
        a["status"]["ended"].as_array().unwrap().clone()
    }

    /// Runs `hira-ctl --socket <this daemon's control socket> ARGS`.
    /// Runs `hira-ctl ARGS`, which must succeed; its standard output.
    pub fn ctl_ok(&self, args: &[&str]) -> String {
        let o = self.ctl(args);
        assert!(
            o.status.success(),
            "hira-ctl {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// `tests/c/quota.c` (device memory on command) running as a guest of VM `vm`.
    pub fn allocator(&self, vendors: &Vendors, vm: &str) -> LineProgram {
        LineProgram::start(self.guest(vendors, vm, &c_program("quota")))
    }

    pub fn ctl(&self, args: &[&str]) -> Output {
        Command::new(bin_dir().join("hira-ctl"))
            .arg("--socket")
            .arg(self.dir.path().join("control.sock"))
            .args(args)
            .output()
            .expect("hira-ctl runs")
    }

    /// Whether the daemon process is still running.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// A command that runs `exe` as a guest of VM `vm` with only Hira's ICD visible.
    pub fn guest(&self, vendors: &Vendors, vm: &str, exe: &Path) -> Command {
        let mut c = Command::new(exe);
        c.env("OCL_ICD_VENDORS", vendors.dir.path())
            .env("HIRA_SOCKET", self.socket(vm));
        c
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Pids of processes whose parent is `parent` and whose name is `name`.
pub fn children_named(parent: u32, name: &str) -> Vec<u32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Format: pid (comm) state ppid ...
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = &stat[open + 1..close];
        let rest: Vec<&str> = stat[close + 2..].split(' ').collect();
        let ppid: u32 = rest.get(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        let state = rest.first().copied().unwrap_or("");
        if ppid == parent && name.starts_with(comm) && state != "Z" {
            v.push(pid);
        }
    }
    v
}

/// Runs a command to completion, failing the test if it takes longer than `timeout`.
/// Its output is read on a thread while this one waits for its exit on a pidfd.
/// Runs `exe` with `args` on the host's own OpenCL (Hira's ICD hidden), within two
/// minutes.
pub fn run_native(exe: &std::path::Path, args: &[&str]) -> Output {
    run_with_timeout(
        Command::new(exe)
            .args(args)
            .env("OCL_ICD_VENDORS", Vendors::native().dir.path()),
        Duration::from_secs(120),
    )
}

/// Runs `cmd` (a guest of `d`) while its session is moved to a new API server as
/// often as it can be: each time the program has made calls since the last move.
/// Returns its output, the moves, and the daemon's answers to the moves it refused.
pub fn run_moving_noting(d: &Daemon, cmd: &mut Command) -> (Output, usize, Vec<String>) {
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = std::thread::spawn(move || child.wait_with_output().unwrap());
    let (mut moves, mut last_commands) = (0, 0);
    let mut refused = Vec::new();
    while !out.is_finished() {
        let s = d.status();
        let session = s["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["guest_pid"] == serde_json::json!(pid) && x["serving"] == true)
            .cloned();
        match session {
            Some(x) if x["commands"].as_u64().unwrap_or(0) > last_commands => {
                last_commands = x["commands"].as_u64().unwrap_or(0);
                let a = d.control(serde_json::json!({"cmd": "migrate", "session": x["id"]}));
                if a.get("moved").is_some() {
                    moves += 1;
                    // The new API server counts from zero.
                    last_commands = 0;
                } else {
                    refused.push(a.to_string());
                }
            }
            // Wait for the program to make progress (or end) before the next move.
            _ => std::thread::yield_now(),
        }
    }
    (out.join().unwrap(), moves, refused)
}

pub fn run_with_timeout(cmd: &mut Command, timeout: Duration) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("command starts");
    let pid = child.id();
    let collector = std::thread::spawn(move || child.wait_with_output().unwrap());
    if !wait_exit(pid, timeout) {
        // SAFETY: `pid` is our child, not yet reaped (it has not exited).
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        let out = collector.join().unwrap();
        panic!(
            "command hung for {timeout:?}\nstdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    collector.join().unwrap()
}

/// A guest that speaks the wire protocol by hand, to send what a real shim never would:
/// on its socket (frames relayed by the daemon) or on the shared-memory rings.
pub struct RawGuest {
    pub s: UnixStream,
    call_id: u64,
    pub rings: Option<hira_ring::Ends>,
    /// The ring region's descriptor, to corrupt the region on purpose.
    pub region_fd: Option<std::os::fd::OwnedFd>,
    /// The API server's doorbell (the submission ring's data eventfd).
    pub doorbell: Option<std::os::fd::OwnedFd>,
    /// The ring reported the session over; read the socket from now on.
    rings_over: bool,
}

/// A sealed memfd of `len` bytes: the data window a guest passes at its hello.
pub fn window_memfd(len: u64) -> std::os::fd::OwnedFd {
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: memfd_create with a valid name and flags; the result is checked.
    let fd = unsafe {
        libc::memfd_create(
            c"raw-window".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    assert!(fd >= 0);
    // SAFETY: memfd_create just returned this descriptor.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    // SAFETY: resizing and sealing a descriptor this function owns.
    unsafe {
        assert_eq!(libc::ftruncate(fd.as_raw_fd(), len as libc::off_t), 0);
        assert_eq!(
            libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK),
            0
        );
    }
    fd
}

impl RawGuest {
    pub fn connect(path: &Path) -> RawGuest {
        let s = UnixStream::connect(path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        RawGuest {
            s,
            call_id: 0,
            rings: None,
            region_fd: None,
            doorbell: None,
            rings_over: false,
        }
    }

    /// Connects and completes a handshake with no data window.
    pub fn session(path: &Path) -> RawGuest {
        let mut g = RawGuest::connect(path);
        let hello = Hello::new(hira_apis_opencl::API, std::process::id(), "raw-guest", 0).encode();
        g.frame(FrameKind::Hello, 0, 0, 0, &[], &hello);
        let (h, _) = g.recv().expect("welcome");
        assert_eq!(h.kind, FrameKind::Welcome);
        g
    }

    /// Connects with a one-page data window and asks for the shared-memory rings.
    pub fn session_on_rings(path: &Path) -> RawGuest {
        use std::os::fd::AsRawFd;
        let mut g = RawGuest::connect(path);
        let mut hello = Hello::new(hira_apis_opencl::API, std::process::id(), "raw-guest", 4096);
        hello.rings = true;
        let hello = hello.encode();
        let header = FrameHeader::new(FrameKind::Hello, 0, 0, 0, hello.len());
        let window = window_memfd(4096);
        unix::send_frame_with_fd(&mut g.s, &header, &hello, Some(&window)).unwrap();
        let (h, p, mut fds) = unix::recv_frame_with_fds(&mut g.s).expect("welcome");
        assert_eq!(h.kind, FrameKind::Welcome);
        let welcome = Welcome::decode(&p).unwrap();
        assert!(welcome.ring_capacity > 0, "the host set up rings");
        let region_fd = fds.remove(0);
        let region = hira_ring::Region::map(&region_fd, welcome.ring_capacity as usize).unwrap();
        g.doorbell = Some(fds[0].try_clone().unwrap());
        g.rings =
            Some(hira_ring::guest_ends(std::sync::Arc::new(region), fds, g.s.as_raw_fd()).unwrap());
        g.region_fd = Some(region_fd);
        g
    }

    /// A session of either kind.
    pub fn session_on(path: &Path, rings: bool) -> RawGuest {
        if rings {
            RawGuest::session_on_rings(path)
        } else {
            RawGuest::session(path)
        }
    }

    /// Overwrites the `u64` at `offset` of the ring region (in its header page) and
    /// rings the API server's doorbell, as a hostile guest could.
    pub fn corrupt_region(&self, offset: usize, value: u64) {
        use std::os::fd::AsRawFd;
        let fd = self.region_fd.as_ref().expect("a ring session").as_raw_fd();
        // SAFETY: maps the region's first page, shared; written once and unmapped.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            std::ptr::write_volatile(p.cast::<u8>().add(offset).cast::<u64>(), value);
            libc::munmap(p, 4096);
            let one = 1u64;
            let bell = self.doorbell.as_ref().unwrap().as_raw_fd();
            libc::write(bell, (&one as *const u64).cast(), 8);
        }
    }

    /// Sends bytes as they are, on the rings or the socket.
    pub fn write_raw(&mut self, b: &[u8]) {
        match &mut self.rings {
            Some(r) => r.producer.write_all(b).unwrap(),
            None => self.s.write_all(b).unwrap(),
        }
    }

    pub fn frame(
        &mut self,
        kind: FrameKind,
        opcode: u16,
        flags: u8,
        call_id: u64,
        spans: &[Span],
        payload: &[u8],
    ) {
        let h = FrameHeader {
            len: (spans.len() * 16 + payload.len()) as u32,
            kind,
            flags,
            opcode,
            channel: 1,
            span_count: spans.len() as u16,
            call_id,
        };
        let mut b = h.encode().to_vec();
        for s in spans {
            b.extend_from_slice(&s.encode());
        }
        b.extend_from_slice(payload);
        self.write_raw(&b);
    }

    /// Sends a synchronous request and returns the reply frame.
    pub fn call(&mut self, opcode: u16, payload: &[u8]) -> (FrameHeader, Vec<u8>) {
        self.call_spans(opcode, &[], payload)
    }

    pub fn call_spans(
        &mut self,
        opcode: u16,
        spans: &[Span],
        payload: &[u8],
    ) -> (FrameHeader, Vec<u8>) {
        self.call_id += 1;
        let id = self.call_id;
        self.frame(FrameKind::Request, opcode, 0, id, spans, payload);
        loop {
            let (h, p) = self.recv().expect("a reply");
            // What the host's library printed meanwhile (a Notify of no call).
            if h.kind == FrameKind::Notify && h.call_id == 0 {
                continue;
            }
            assert_eq!(h.call_id, id, "reply pairs with the request");
            return (h, p);
        }
    }

    /// Reads exactly `b.len()` bytes from the completion ring, or from the socket once
    /// the ring has reported the session over (as the guest driver does).
    fn read_exact(&mut self, b: &mut [u8]) -> std::io::Result<()> {
        if let (Some(r), false) = (&mut self.rings, self.rings_over) {
            match r.consumer.read_exact(b) {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => self.rings_over = true,
                other => return other,
            }
        }
        self.s.read_exact(b)
    }

    /// The next frame, or `None` if the host closed the connection.
    pub fn recv(&mut self) -> Option<(FrameHeader, Vec<u8>)> {
        let mut hb = [0u8; HEADER_LEN];
        self.read_exact(&mut hb).ok()?;
        let h = FrameHeader::decode(&hb).expect("host frames decode");
        let mut p = vec![0u8; h.len as usize];
        self.read_exact(&mut p).ok()?;
        Some((h, p))
    }

    /// Reads frames until the host closes the connection; returns the error codes seen.
    pub fn drain_until_closed(&mut self) -> Vec<u32> {
        let mut codes = Vec::new();
        while let Some((h, p)) = self.recv() {
            if h.kind == FrameKind::Error {
                codes.push(
                    hira_protocol::handshake::ErrorPayload::decode(&p)
                        .unwrap()
                        .code,
                );
            }
        }
        codes
    }
}

/// Status of a reply payload.
pub fn status(p: &[u8]) -> i32 {
    i32::from_le_bytes(p[..4].try_into().unwrap())
}

/// Waits (on a pidfd, no polling) until process `pid` has exited; false on timeout.
/// A process that is already gone counts as exited.
pub fn wait_exit(pid: u32, timeout: Duration) -> bool {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) } as i32;
    if fd < 0 {
        return true;
    }
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `p` is one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, timeout.as_millis() as i32) };
    // SAFETY: `fd` is ours and closed once.
    unsafe { libc::close(fd) };
    n == 1
}

/// Resident memory of `pid` in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// A test program that answers one line on stdout per command line on stdin, and says
/// `ready` first (`tests/c/quota.c`, `busy.c`): tests order what guests do by its
/// answers, never by time. Killed when dropped.
pub struct LineProgram {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl LineProgram {
    /// Starts `cmd` and waits for its `ready`.
    pub fn start(mut cmd: Command) -> LineProgram {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the test program starts");
        let stdin = child.stdin.take().unwrap();
        let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut p = LineProgram {
            child,
            stdin,
            stdout,
        };
        assert_eq!(p.line(), "ready");
        p
    }

    /// Sends a command without waiting for its answer.
    pub fn send(&mut self, cmd: &str) {
        writeln!(self.stdin, "{cmd}").unwrap();
    }

    /// The next answer.
    pub fn line(&mut self) -> String {
        use std::io::BufRead;
        let mut l = String::new();
        self.stdout.read_line(&mut l).unwrap();
        assert!(!l.is_empty(), "the test program ended early");
        l.trim().to_string()
    }

    /// Sends a command and returns its answer.
    pub fn ask(&mut self, cmd: &str) -> String {
        self.send(cmd);
        self.line()
    }

    /// Waits for the program to end.
    pub fn wait(&mut self) -> std::process::ExitStatus {
        self.child.wait().unwrap()
    }
}

impl Drop for LineProgram {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// VM `name`'s entry in a control-socket `status` answer.
pub fn vm_entry<'a>(status: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    status["vms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no VM {name} in {status}"))
}

/// A GET on the metrics endpoint: status line and body.
pub fn http_get(addr: &str, path: &str) -> (String, String) {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(addr).expect("the metrics endpoint accepts");
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    (head.lines().next().unwrap().to_string(), body.to_string())
}

/// The value of the metric line that starts with `prefix`.
pub fn metric(body: &str, prefix: &str) -> f64 {
    body.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {prefix} in\n{body}"))
}
