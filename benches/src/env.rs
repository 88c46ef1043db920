//! The environment a benchmark runs in.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, ensure};

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("benches/ is inside the workspace")
        .to_path_buf()
}

/// Builds the daemon, API server and shim in the profile of the running binary and
/// returns the directory holding them.
pub fn build_components() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let mut dir = exe
        .parent()
        .context("executable has a directory")?
        .to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace()).args([
        "build",
        "-q",
        "-p",
        "hira-vhost",
        "-p",
        "hira-api-server",
        "-p",
        "hira-opencl",
        "-p",
        "hira-cuda",
        "-p",
        "hira-tests-cuda-cpu",
    ]);
    if dir.ends_with("release") {
        cmd.arg("--release");
    } else {
        eprintln!("note: a debug build measures debug Hira; use `cargo run --release` for figures");
    }
    ensure!(cmd.status()?.success(), "building Hira failed");
    Ok(dir)
}

/// Compiles a C OpenCL program with gcc.
pub fn compile(src: &Path, out: &Path) -> Result<()> {
    let st = Command::new("gcc")
        .args(["-O2", "-o"])
        .arg(out)
        .arg(src)
        .args(["-lOpenCL", "-lpthread", "-lm"])
        .status()
        .context("gcc runs")?;
    ensure!(st.success(), "gcc {} failed", src.display());
    Ok(())
}

/// Blocks until `hira-vhost` reports `READY=1` on its sd_notify socket.
pub fn wait_ready(notify: &std::os::unix::net::UnixDatagram) -> Result<()> {
    let mut buf = [0u8; 256];
    loop {
        let n = notify
            .recv(&mut buf)
            .context("hira-vhost did not report readiness")?;
        if String::from_utf8_lossy(&buf[..n]).contains("READY=1") {
            return Ok(());
        }
    }
}

/// Starts `hira-vhost` from `bin` with `args`, its sd_notify socket in `dir`, and
/// waits until it reports readiness (no polling of its sockets).
pub fn start_daemon<I, S>(bin: &Path, dir: &Path, args: I) -> Result<Child>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    start_daemon_in(None, bin, dir, args)
}

/// As [`start_daemon`], in network namespace `netns` when given.
pub fn start_daemon_in<I, S>(netns: Option<&str>, bin: &Path, dir: &Path, args: I) -> Result<Child>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let notify_path = dir.join("notify.sock");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path)?;
    notify.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(bin.join("hira-vhost"));
            c
        }
        None => Command::new(bin.join("hira-vhost")),
    };
    let daemon = cmd
        .args(args)
        .env("RUST_LOG", "error")
        .env("NOTIFY_SOCKET", &notify_path)
        .env_remove("OCL_ICD_VENDORS")
        .stderr(Stdio::null())
        .spawn()
        .context("hira-vhost starts")?;
    wait_ready(&notify)?;
    Ok(daemon)
}

/// A private daemon and the two ICD views.
pub struct BenchEnv {
    pub native: tempfile::TempDir,
    pub hira: tempfile::TempDir,
    pub socket: PathBuf,
    /// The daemon's control socket.
    pub control: Option<PathBuf>,
    /// Extra environment for runs through Hira (`HIRA_SYNC=1`, `HIRA_RINGS=0`, ...).
    pub hira_env: Vec<(String, String)>,
    /// CUDA runs: the library path natively (the driver's directory; empty: the
    /// system's) and through Hira (Hira's libcuda.so.1).
    pub cuda: Option<(String, PathBuf)>,
    daemon: Child,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for BenchEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BenchEnv")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

impl Drop for BenchEnv {
    fn drop(&mut self) {
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
    }
}

impl BenchEnv {
    /// Starts `hira-vhost` from `bin` on a private socket.
    pub fn start(bin: &Path) -> Result<BenchEnv> {
        let dir = tempfile::tempdir()?;
        let socket = dir.path().join("bench.sock");
        let control = dir.path().join("control.sock");
        let daemon = start_daemon(
            bin,
            dir.path(),
            [
                "--local-socket".to_string(),
                format!("bench={}", socket.display()),
                "--control-socket".to_string(),
                control.display().to_string(),
            ],
        )?;
        Self::with_daemon(bin, daemon, dir, socket, Some(control))
    }

    /// OpenCL runs against `daemon` (started by the caller, its files in `dir`), whose
    /// guests connect to `socket`.
    pub fn with_daemon(
        bin: &Path,
        daemon: Child,
        dir: tempfile::TempDir,
        socket: PathBuf,
        control: Option<PathBuf>,
    ) -> Result<BenchEnv> {
        let native = tempfile::tempdir()?;
        let mut n = 0;
        for e in std::fs::read_dir("/etc/OpenCL/vendors")
            .context("no /etc/OpenCL/vendors: install pocl-opencl-icd")?
        {
            let p = e?.path();
            if p.extension().is_some_and(|x| x == "icd")
                && !std::fs::read_to_string(&p)?.contains("hira")
            {
                std::fs::copy(
                    &p,
                    native.path().join(p.file_name().expect("file has a name")),
                )?;
                n += 1;
            }
        }
        ensure!(n > 0, "no native OpenCL ICD installed");
        let hira = tempfile::tempdir()?;
        std::fs::write(
            hira.path().join("hira.icd"),
            format!("{}\n", bin.join("libhira_opencl.so").display()),
        )?;
        Ok(BenchEnv {
            native,
            hira,
            socket,
            control,
            hira_env: Vec::new(),
            cuda: None,
            daemon,
            _dir: dir,
        })
    }

    /// Starts `hira-vhost` for CUDA programs: its API servers load the driver from
    /// `driver_dir` (the system's when empty), as the native runs do; runs through
    /// Hira load Hira's libcuda.so.1 from `shim_dir`.
    pub fn start_cuda(bin: &Path, driver_dir: &str, shim_dir: &Path) -> Result<BenchEnv> {
        let dir = tempfile::tempdir()?;
        let socket = dir.path().join("bench.sock");
        let control = dir.path().join("control.sock");
        // SAFETY: set before any thread of this process reads the environment; the
        // daemon inherits it.
        unsafe { std::env::set_var("LD_LIBRARY_PATH", driver_dir) };
        let daemon = start_daemon(
            bin,
            dir.path(),
            [
                "--local-socket".to_string(),
                format!("bench={}", socket.display()),
                "--control-socket".to_string(),
                control.display().to_string(),
            ],
        )?;
        Ok(BenchEnv {
            native: tempfile::tempdir()?,
            hira: tempfile::tempdir()?,
            socket,
            control: Some(control),
            hira_env: Vec::new(),
            cuda: Some((driver_dir.to_string(), shim_dir.to_path_buf())),
            daemon,
            _dir: dir,
        })
    }

    /// CPU time the daemon process has used so far, all its threads, live and ended
    /// (not its API servers), from its process CPU clock (nanoseconds).
    pub fn daemon_cpu(&self) -> Result<Duration> {
        let pid = libc::pid_t::try_from(self.daemon.id())?;
        let mut clock: libc::clockid_t = 0;
        // SAFETY: writes the clock id into a local.
        let r = unsafe { libc::clock_getcpuclockid(pid, &mut clock) };
        ensure!(
            r == 0,
            "clock_getcpuclockid: {}",
            std::io::Error::from_raw_os_error(r)
        );
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: writes the time into a local.
        let r = unsafe { libc::clock_gettime(clock, &mut t) };
        ensure!(r == 0, "clock_gettime: {}", std::io::Error::last_os_error());
        Ok(Duration::new(
            u64::try_from(t.tv_sec)?,
            u32::try_from(t.tv_nsec)?,
        ))
    }

    /// A command running `exe` natively or through Hira.
    pub fn command(&self, remote: bool, exe: &Path, args: &[String]) -> Command {
        let mut cmd = Command::new(exe);
        cmd.args(args);
        if let Some((driver, shim)) = &self.cuda {
            if remote {
                cmd.env("LD_LIBRARY_PATH", shim)
                    .env("HIRA_SOCKET", &self.socket)
                    .envs(self.hira_env.iter().map(|(k, v)| (k, v)));
            } else {
                cmd.env("LD_LIBRARY_PATH", driver);
            }
            return cmd;
        }
        if remote {
            cmd.env("OCL_ICD_VENDORS", self.hira.path())
                .env("HIRA_SOCKET", &self.socket)
                .envs(self.hira_env.iter().map(|(k, v)| (k, v)));
        } else {
            cmd.env("OCL_ICD_VENDORS", self.native.path());
        }
        cmd
    }
}
