//! API-server processes: started so that they die with the daemon, reaped within a
//! bounded grace period.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus};
use std::sync::mpsc;
use std::time::Duration;

use hira_protocol::usage::UsagePage;
use log::warn;

use crate::config::Config;

/// The descriptor number the API server finds its session socket on.
const CHILD_FD: i32 = 3;
/// The descriptor number the API server finds its usage page on.
const USAGE_FD: i32 = 4;
/// The descriptor number the API server finds its VM's page on.
const VM_PAGE_FD: i32 = 5;
/// The child's descriptors are parked at or above this before they move to their
/// numbers.
const PARK_FD: i32 = VM_PAGE_FD + 1;

/// Starts an API server for session `id` of the VM whose page is `vm_page`, in the
/// VM's cgroup when `cgroup` (its `cgroup.procs`, open for writing) is given; returns
/// the process, our end of its socket and the page it keeps the session's counters
/// in.
///
/// The child gets SIGKILL when the daemon thread that started it ends (the session
/// thread, which outlives the child in normal operation) or the daemon dies, so no
/// API server outlives the daemon, however the daemon ends.
pub fn api_server(
    config: &Config,
    id: u64,
    vm_page: &OwnedFd,
    cgroup: Option<std::os::fd::RawFd>,
) -> std::io::Result<(Child, UnixStream, UsagePage)> {
    let (ours, theirs) = UnixStream::pair()?;
    let theirs = OwnedFd::from(theirs);
    let raw = theirs.as_raw_fd();
    let (usage, usage_fd) = UsagePage::create()?;
    let usage_raw = usage_fd.as_raw_fd();
    let vm_raw = vm_page.as_raw_fd();
    let mut cmd = Command::new(&config.api_server);
    cmd.arg("--fd")
        .arg(CHILD_FD.to_string())
        .arg("--usage-fd")
        .arg(USAGE_FD.to_string())
        .arg("--vm-page-fd")
        .arg(VM_PAGE_FD.to_string())
        .arg("--session")
        .arg(id.to_string())
        .arg("--output-rate")
        .arg(config.output.rate.to_string())
        .arg("--output-buffer")
        .arg(config.output.buffer.to_string());
    if let Some(p) = &config.platform {
        cmd.arg("--platform").arg(p);
    }
    if let Some(t) = &config.api_server_tunables {
        cmd.env("GLIBC_TUNABLES", t);
    }
    sandbox_args(&mut cmd, config);
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs in the child between fork and exec and calls only
    // async-signal-safe functions (write, prctl, getppid, fcntl, dup2, _exit). dup2
    // clears close-on-exec on the new descriptor.
    unsafe {
        cmd.pre_exec(move || {
            // Joins the VM's cgroup ("0": the writing process) before anything can
            // allocate, so every byte the API server ever uses is the VM's.
            if let Some(fd) = cgroup
                && libc::write(fd, b"0".as_ptr().cast(), 1) != 1
            {
                return Err(std::io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The daemon may have died before the signal was armed.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            // Copies above every target first (closed at exec), so no dup2 onto a
            // target overwrites a descriptor still to be moved.
            let mut parked = [0; 3];
            for (slot, from) in parked.iter_mut().zip([raw, usage_raw, vm_raw]) {
                *slot = libc::fcntl(from, libc::F_DUPFD_CLOEXEC, PARK_FD);
                if *slot < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (from, to) in parked.into_iter().zip([CHILD_FD, USAGE_FD, VM_PAGE_FD]) {
                if libc::dup2(from, to) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    drop(theirs);
    drop(usage_fd);
    Ok((child, ours, usage))
}

/// Describes how an API server ended, for the log.
pub fn describe(status: Option<ExitStatus>, killed: bool) -> String {
    match status {
        None => "not reaped".into(),
        Some(s) if killed => format!("killed after the grace period, {s}"),
        Some(s) => match (s.code(), s.signal()) {
            (Some(0), _) => "exit status 0".into(),
            (Some(c), _) => format!("exit status {c}"),
            (_, Some(sig)) => format!(
                "died of signal {sig}{}",
                if s.core_dumped() {
                    " (core dumped)"
                } else {
                    ""
                }
            ),
            _ => s.to_string(),
        },
    }
}

/// Waits up to `grace` for `child` to exit, then kills it. Always reaps; returns how
/// the child ended, and whether it died of a signal the daemon did not send.
pub fn reap(child: Child, grace: Duration) -> (String, bool) {
    let pid = child.id();
    let (done, exited) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let mut child = child;
        let status = child.wait().ok();
        let _ = done.send(());
        status
    });
    let mut killed = false;
    if exited.recv_timeout(grace).is_err() {
        warn!("API server {pid} did not exit within {grace:?}; killing it");
        // SAFETY: the child has not been reaped (the waiter is still blocked in wait),
        // so `pid` still names it.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        killed = true;
    }
    let status = waiter.join().ok().flatten();
    let how = describe(status, killed);
    let crashed = status.is_some_and(|s| s.signal().is_some()) && !killed;
    if crashed {
        warn!("API server {pid} {how}");
    }
    (how, crashed)
}

/// Checks at start that `--platform` names a host platform, by asking the API-server
/// executable (the daemon itself loads no GPU library). The error lists what exists.
pub fn check_platform(config: &Config) -> Result<(), PlatformError> {
    let Some(wanted) = &config.platform else {
        return Ok(());
    };
    let out = Command::new(&config.api_server)
        .arg("--list-platforms")
        .output()
        .map_err(|source| PlatformError::Run {
            path: config.api_server.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(PlatformError::ListFailed {
            path: config.api_server.clone(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    let names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    if names.iter().any(|n| n.contains(wanted.as_str())) {
        return Ok(());
    }
    Err(PlatformError::NoMatch {
        wanted: wanted.clone(),
        found: if names.is_empty() {
            "none".to_string()
        } else {
            names
                .iter()
                .map(|n| format!("{n:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        },
    })
}

/// Why `--platform` cannot be checked or names no host platform.
#[derive(Debug, thiserror::Error)]
pub enum PlatformError {
    #[error("cannot run {}: {source}", path.display())]
    Run {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} --list-platforms failed: {stderr}", path.display())]
    ListFailed {
        path: std::path::PathBuf,
        stderr: String,
    },
    #[error(
        "--platform {wanted:?} matches no platform the API servers find on this host; they find: {found}"
    )]
    NoMatch { wanted: String, found: String },
}

fn sandbox_args(cmd: &mut Command, config: &Config) {
    if let Some((uid, gid)) = config.sandbox.user {
        cmd.arg("--sandbox-user").arg(format!("{uid}:{gid}"));
    }
    cmd.arg("--cache-dir").arg(&config.sandbox.cache_dir);
}

/// How each sandbox layer went on this machine and what API servers see from inside
/// it, from the latest probe (at start, and at each `vm add`; shown on the control
/// socket).
static SANDBOX_REPORT: std::sync::RwLock<Vec<String>> = std::sync::RwLock::new(Vec::new());

/// The latest probe's report.
pub fn sandbox_report() -> Vec<String> {
    SANDBOX_REPORT
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// Why the API servers' sandbox cannot serve sessions.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("cannot prepare the sandbox: {0}")]
    Io(#[from] std::io::Error),
    #[error(
        "inside their sandbox the API servers do not see {hidden} (they see: {inside}), \
         though outside it this host has them: their sessions would fail. The ICD files \
         (OCL_ICD_VENDORS, or /etc/OpenCL/vendors) or the libraries they name lie where \
         the sandbox does not let API servers read. Install the ICD under \
         /etc/OpenCL/vendors and its library in a system library directory, or name its \
         directories in OCL_ICD_VENDORS and LD_LIBRARY_PATH of hira-vhost (the sandbox \
         keeps those readable). A driver that lists no devices may also be failing to \
         write its kernel cache in api_server_cache_dir"
    )]
    HidesOpenCl { hidden: String, inside: String },
    #[error(
        "inside their sandbox the API servers do not see {hidden} (they see: {inside}), \
         though outside it this host has them: their CUDA sessions would fail. The CUDA \
         driver (libcuda.so.1) is found where the sandbox does not let API servers read, \
         or through a link that leads there (Landlock allows a directory, not where its \
         links lead). Install the driver in a system library directory, or copy it (not \
         a link) into a directory named in hira-vhost's LD_LIBRARY_PATH"
    )]
    HidesCuda { hidden: String, inside: String },
}

/// Creates the API servers' kernel cache (owned by their user, private to it), then
/// asks the API-server executable to enter its sandbox once and report how each layer
/// went (a layer this machine cannot apply is reported with its reason) and what it
/// sees from there of the host's OpenCL platforms and devices and CUDA driver and
/// devices, and compares that with what an API server sees outside the sandbox. Fails,
/// naming the cause, when the sandbox hides any of them: sessions could never use it.
/// Logs the report when it changed and keeps it for the control socket.
pub fn prepare_sandbox(config: &Config) -> Result<(), SandboxError> {
    use std::os::unix::fs::PermissionsExt;
    let dir = &config.sandbox.cache_dir;
    std::fs::create_dir_all(dir)?;
    if let Some((uid, gid)) = config.sandbox.user {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid))?;
        // What another sandbox user cached here (before `api_server_user` changed)
        // would make the drivers fail to write their caches, and with that to list
        // their devices.
        give_cache(dir, uid, gid)?;
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    let mut cmd = Command::new(&config.api_server);
    cmd.arg("--sandbox-check");
    sandbox_args(&mut cmd, config);
    let out = cmd.output()?;
    let report: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    if !out.status.success() {
        warn!(
            "API-server sandbox check failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    } else {
        let out = Command::new(&config.api_server).arg("--probe").output()?;
        let outside: Vec<String> = if out.status.success() {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::to_string)
                .collect()
        } else {
            Vec::new()
        };
        sees_the_same(&report, &outside)?;
    }
    let mut kept = SANDBOX_REPORT.write().unwrap_or_else(|e| e.into_inner());
    if *kept != report {
        for line in &report {
            if line.contains("NOT applied") {
                warn!("API-server sandbox: {line}");
            } else {
                log::info!("API-server sandbox: {line}");
            }
        }
        *kept = report;
    }
    Ok(())
}

/// Gives everything under the cache directory `dir` that another user owns to the
/// sandbox user `uid`:`gid`.
///
/// API servers write into this directory while the daemon walks it (at a `vm add`), so
/// the walk goes by descriptors: each directory is opened relative to its parent
/// without following links, and each entry is changed without following links, so a
/// name an API server swaps for a link cannot lead the daemon out of the directory.
/// Entries that vanish or change kind meanwhile are left alone, and the walk stops
/// [`CACHE_DEPTH`] levels down (the drivers' caches are a few levels deep).
fn give_cache(dir: &std::path::Path, uid: u32, gid: u32) -> std::io::Result<()> {
    use nix::fcntl::OFlag;
    use nix::sys::stat::Mode;
    let top = nix::dir::Dir::open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    give_entries(
        top,
        nix::unistd::Uid::from_raw(uid),
        nix::unistd::Gid::from_raw(gid),
        CACHE_DEPTH,
    )?;
    Ok(())
}

/// How deep [`give_cache`] goes.
const CACHE_DEPTH: u32 = 16;

fn give_entries(
    mut dir: nix::dir::Dir,
    uid: nix::unistd::Uid,
    gid: nix::unistd::Gid,
    depth: u32,
) -> nix::Result<()> {
    use nix::errno::Errno;
    use nix::fcntl::{AtFlags, OFlag};
    use nix::sys::stat::{Mode, SFlag};
    let names: Vec<std::ffi::CString> = dir
        .iter()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_owned())
        .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
        .collect();
    // Gone, or no longer a directory: an API server changed it meanwhile.
    let changed = |e: Errno| matches!(e, Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP);
    for name in names {
        let st = match nix::sys::stat::fstatat(&dir, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
        {
            Ok(st) => st,
            Err(e) if changed(e) => continue,
            Err(e) => return Err(e),
        };
        if st.st_uid != uid.as_raw() || st.st_gid != gid.as_raw() {
            match nix::unistd::fchownat(
                &dir,
                name.as_c_str(),
                Some(uid),
                Some(gid),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            ) {
                Ok(()) => {}
                Err(e) if changed(e) => continue,
                Err(e) => return Err(e),
            }
        }
        if st.st_mode & SFlag::S_IFMT.bits() == SFlag::S_IFDIR.bits() && depth > 0 {
            match nix::dir::Dir::openat(
                &dir,
                name.as_c_str(),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            ) {
                Ok(sub) => give_entries(sub, uid, gid, depth - 1)?,
                Err(e) if changed(e) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Fails when an OpenCL platform or device, or a CUDA device, that an API server
/// sees `outside` the sandbox is missing from what the sandbox check `report`ed.
fn sees_the_same(report: &[String], outside: &[String]) -> Result<(), SandboxError> {
    let missing = |prefix: &str| -> Vec<String> {
        outside
            .iter()
            .filter(|l| l.starts_with(prefix) && !report.contains(l))
            .map(|l| format!("{l:?}"))
            .collect()
    };
    let seen = |api: &str| -> String {
        let v: Vec<&str> = report
            .iter()
            .filter(|l| l.starts_with(api))
            .map(String::as_str)
            .collect();
        if v.is_empty() {
            "nothing".into()
        } else {
            v.join("; ")
        }
    };
    let hidden: Vec<String> = missing("opencl platform: ")
        .into_iter()
        .chain(missing("opencl device: "))
        .collect();
    if !hidden.is_empty() {
        return Err(SandboxError::HidesOpenCl {
            hidden: hidden.join(", "),
            inside: seen("opencl"),
        });
    }
    let hidden = missing("cuda device: ");
    if !hidden.is_empty() {
        return Err(SandboxError::HidesCuda {
            hidden: hidden.join(", "),
            inside: seen("cuda"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cache_another_user_left_goes_to_the_sandbox_user_and_links_are_not_followed() {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: changing owners needs root (CI runs as root)");
            return;
        }
        let cache = tempfile::tempdir().unwrap();
        let outside = tempfile::NamedTempFile::new().unwrap();
        let deep = cache.path().join("pocl/kcache/ab");
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join("program.so"), b"x").unwrap();
        std::os::unix::fs::symlink(outside.path(), cache.path().join("pocl/link")).unwrap();
        for p in [
            "pocl",
            "pocl/kcache",
            "pocl/kcache/ab",
            "pocl/kcache/ab/program.so",
        ] {
            std::os::unix::fs::chown(cache.path().join(p), Some(65534), Some(65534)).unwrap();
        }
        give_cache(cache.path(), 4321, 4322).unwrap();
        for p in [
            "pocl",
            "pocl/kcache",
            "pocl/kcache/ab",
            "pocl/kcache/ab/program.so",
            "pocl/link",
        ] {
            let m = cache.path().join(p).symlink_metadata().unwrap();
            assert_eq!((m.uid(), m.gid()), (4321, 4322), "{p}");
        }
        let m = outside.path().metadata().unwrap();
        assert_eq!(
            (m.uid(), m.gid()),
            (0, 0),
            "the link's target is not changed"
        );
    }

    fn lines(l: &[&str]) -> Vec<String> {
        l.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_sandbox_that_hides_a_platform_or_device_the_host_has_is_refused_with_the_cause() {
        let pocl = "opencl platform: Portable Computing Language";
        let cpu = "opencl device: Portable Computing Language: cpu";
        let report = lines(&[
            "landlock: applied",
            "opencl: no platform",
            "cuda: no driver",
        ]);
        let text = sees_the_same(&report, &lines(&[pocl, cpu]))
            .unwrap_err()
            .to_string();
        assert!(
            text.contains("\"opencl platform: Portable Computing Language\""),
            "{text}"
        );
        assert!(text.contains("they see: opencl: no platform"), "{text}");
        assert!(text.contains("OCL_ICD_VENDORS"), "the fix is named: {text}");
        // A device the sandbox hides (its library unreadable) is refused too.
        let text = sees_the_same(&lines(&[pocl]), &lines(&[pocl, cpu]))
            .unwrap_err()
            .to_string();
        assert!(text.contains("cpu"), "{text}");
        let gpu = "cuda device: 0: NVIDIA H100";
        let text = sees_the_same(
            &lines(&[pocl, "cuda: cuInit failed with 304"]),
            &lines(&[pocl, "cuda driver: 13000", gpu]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            text.contains("NVIDIA H100") && text.contains("cuInit failed with 304"),
            "{text}"
        );
        assert!(text.contains("LD_LIBRARY_PATH"), "the fix is named: {text}");
    }

    #[test]
    fn what_is_seen_inside_or_nowhere_passes() {
        let seen = lines(&[
            "opencl platform: P",
            "opencl device: P: d",
            "cuda device: 0: g",
        ]);
        assert!(sees_the_same(&seen, &seen).is_ok());
        let none = lines(&["opencl: no platform", "cuda: no driver"]);
        assert!(sees_the_same(&none, &none).is_ok(), "a host without either");
        assert!(
            sees_the_same(&none, &[]).is_ok(),
            "a probe outside that failed reports nothing hidden"
        );
    }
}
