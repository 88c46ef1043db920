//! The API server's sandbox, entered before it reads anything from its guest.
//!
//! In order (each layer needs the privileges the previous ones still have):
//!
//! 1. Private mount, IPC and network namespaces (needs CAP_SYS_ADMIN).
//! 2. The capability bounding set emptied, then the configured unprivileged user and
//!    group taken (supplementary groups dropped), so no capability is left.
//! 3. `no_new_privs`: nothing this process executes can gain privileges.
//! 4. A Landlock ruleset: the file system is reduced to the libraries and driver
//!    files (read and execute), the GPU device nodes and the kernel cache.
//! 5. A seccomp allow-list (`seccompiler`): system calls outside what the OpenCL
//!    runtime and this server use fail with `EPERM`; the most dangerous ones
//!    (`ptrace`, `mount`, `bpf`, module loading...) are not on the list at all.
//!
//! A layer the machine cannot apply (no Landlock in the kernel, no privilege to make
//! namespaces) is reported with its reason; `hira-vhost` logs the report of a probe
//! at start, once, and each API server logs it at debug level.

use std::collections::BTreeMap;
use std::path::PathBuf;

use landlock::{
    ABI, Access, AccessFs, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetStatus,
};
use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

/// What the sandbox should be.
#[derive(Debug, Clone, Default)]
pub struct SandboxConfig {
    /// User and group to run as (only a process started as root can switch).
    pub user: Option<(u32, u32)>,
    /// The driver's kernel cache, writable; also HOME and XDG_CACHE_HOME.
    pub cache_dir: Option<PathBuf>,
    /// Extra paths the driver may read (vendor files outside the defaults).
    pub read_paths: Vec<PathBuf>,
}

/// How each layer went: `Ok` with what was applied, or `Err` with why not.
#[derive(Debug, Default)]
pub struct SandboxReport {
    pub layers: Vec<(&'static str, Result<String, String>)>,
}

impl SandboxReport {
    fn add(&mut self, layer: &'static str, r: Result<String, String>) {
        self.layers.push((layer, r));
    }

    /// One line per layer.
    pub fn lines(&self) -> Vec<String> {
        self.layers
            .iter()
            .map(|(l, r)| match r {
                Ok(what) => format!("{l}: applied ({what})"),
                Err(why) => format!("{l}: NOT applied: {why}"),
            })
            .collect()
    }
}

fn errno() -> String {
    std::io::Error::last_os_error().to_string()
}

/// Enters every layer the machine allows. Must run while the process has one thread.
pub fn enter(config: &SandboxConfig) -> SandboxReport {
    let mut report = SandboxReport::default();
    // Files the driver creates (its kernel cache) are this user's alone, whatever
    // mask the daemon runs with.
    // SAFETY: umask only changes this process's file-creation mask.
    unsafe { libc::umask(0o077) };
    report.add("namespaces", namespaces());
    if let Some(dir) = &config.cache_dir {
        // SAFETY: called while the process is single-threaded (the caller's contract),
        // so nothing reads the environment concurrently.
        unsafe {
            std::env::set_var("HOME", dir);
            std::env::set_var("XDG_CACHE_HOME", dir);
        }
    }
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    report.add("user", drop_privileges(config.user));
    // Changing credentials clears the parent-death signal hira-vhost armed: arm it
    // again, so that this process still dies with the daemon, and leave if the
    // daemon is already gone.
    // SAFETY: plain-integer prctl and getppid.
    unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        );
        if libc::getppid() != parent {
            libc::_exit(1);
        }
    }
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) takes plain integers.
    let nnp = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    report.add(
        "no_new_privs",
        if nnp == 0 {
            Ok("set".into())
        } else {
            Err(errno())
        },
    );
    report.add("landlock", landlock(config));
    report.add("seccomp", seccomp());
    report
}

fn namespaces() -> Result<String, String> {
    // SAFETY: unshare takes flags and affects only this process.
    let r = unsafe { libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWIPC | libc::CLONE_NEWNET) };
    if r == 0 {
        Ok("mount, IPC, network".into())
    } else {
        Err(format!("unshare: {}", errno()))
    }
}

fn drop_privileges(user: Option<(u32, u32)>) -> Result<String, String> {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let Some((to_uid, to_gid)) = user else {
        return if uid == 0 {
            Err("no sandbox user configured; running as root".into())
        } else {
            Ok(format!("already unprivileged (uid {uid})"))
        };
    };
    if uid != 0 {
        return if uid == to_uid {
            Ok(format!("uid {uid}"))
        } else {
            Err(format!(
                "started as uid {uid}, cannot switch to uid {to_uid}"
            ))
        };
    }
    // Empty the bounding set first (this needs CAP_SETPCAP, which root still has).
    for cap in 0..64 {
        // SAFETY: prctl(PR_CAPBSET_DROP) takes plain integers; unknown caps fail.
        unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
    }
    // SAFETY: plain-integer prctl; clears ambient capabilities.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
    // SAFETY: setgroups with an empty list, then setgid/setuid with plain ids.
    let ok = unsafe {
        libc::setgroups(0, std::ptr::null()) == 0
            && libc::setresgid(to_gid, to_gid, to_gid) == 0
            && libc::setresuid(to_uid, to_uid, to_uid) == 0
    };
    if !ok {
        return Err(format!("setuid/setgid: {}", errno()));
    }
    // SAFETY: getuid/geteuid have no preconditions.
    if unsafe { libc::getuid() != to_uid || libc::geteuid() != to_uid } {
        return Err("the switch did not take".into());
    }
    Ok(format!("uid {to_uid}, gid {to_gid}, no capabilities"))
}

/// Paths the OpenCL runtime reads: libraries, loader configuration, CPU and device
/// information. Missing ones are skipped.
const READ_PATHS: &[&str] = &[
    "/usr",
    "/lib",
    "/lib64",
    "/lib32",
    "/etc/OpenCL",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/proc",
    "/sys/devices/system/cpu",
    "/sys/bus/pci",
    "/sys/devices",
    "/sys/module",
    "/dev/null",
    "/dev/zero",
    "/dev/urandom",
];

/// GPU device nodes (read and write). Missing ones are skipped.
const DEVICE_PATHS: &[&str] = &["/dev/dri", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/kfd"];

fn landlock(config: &SandboxConfig) -> Result<String, String> {
    let abi = ABI::V2;
    let read = AccessFs::from_read(abi);
    let all = AccessFs::from_all(abi);
    let mut rules: Vec<(PathBuf, landlock::BitFlags<AccessFs>)> = READ_PATHS
        .iter()
        .map(|p| (PathBuf::from(p), read))
        .chain(config.read_paths.iter().map(|p| (p.clone(), read)))
        .chain(DEVICE_PATHS.iter().map(|p| (PathBuf::from(p), all)))
        .collect();
    // NVIDIA's numbered device nodes.
    if let Ok(dir) = std::fs::read_dir("/dev") {
        for e in dir.flatten() {
            if e.file_name().to_string_lossy().starts_with("nvidia") {
                rules.push((e.path(), all));
            }
        }
    }
    // This executable, wherever it is installed.
    if let Ok(exe) = std::env::current_exe() {
        rules.push((exe, read));
    }
    if let Some(dir) = &config.cache_dir {
        rules.push((dir.clone(), all));
    }
    let mut ruleset = Ruleset::default()
        .handle_access(all)
        .and_then(|r| r.create())
        .map_err(|e| e.to_string())?;
    let mut granted = BTreeMap::new();
    for (path, access) in rules {
        let Ok(fd) = PathFd::new(&path) else {
            continue;
        };
        ruleset = ruleset
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        granted.insert(path, ());
    }
    let status = ruleset.restrict_self().map_err(|e| e.to_string())?;
    match status.ruleset {
        RulesetStatus::FullyEnforced => Ok(format!("{} paths", granted.len())),
        RulesetStatus::PartiallyEnforced => Ok(format!(
            "{} paths, some access rights not supported by this kernel",
            granted.len()
        )),
        RulesetStatus::NotEnforced => Err("the kernel does not enforce Landlock".into()),
    }
}

/// System calls the API server and an OpenCL runtime (PoCL with its in-process LLVM,
/// or a GPU vendor's driver) make. Found by tracing the test suite's programs through
/// the API server (`strace -f`), plus what GPU drivers need (ioctl, mmap of device
/// nodes). Not included, among others: ptrace, process_vm_*, mount, umount2,
/// pivot_root, chroot, unshare, setns, bpf, perf_event_open, kexec_*, init_module,
/// finit_module, delete_module, keyctl, add_key, request_key, reboot, swapon, acct,
/// setuid and friends, personality, userfaultfd.
const ALLOWED: &[i64] = &[
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_openat,
    libc::SYS_close,
    libc::SYS_close_range,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_statfs,
    libc::SYS_fstatfs,
    libc::SYS_lseek,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    libc::SYS_readlinkat,
    libc::SYS_getdents64,
    libc::SYS_getcwd,
    libc::SYS_chdir,
    libc::SYS_mkdirat,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_unlinkat,
    libc::SYS_ftruncate,
    libc::SYS_fallocate,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_flock,
    libc::SYS_fcntl,
    libc::SYS_ioctl,
    libc::SYS_dup,
    libc::SYS_dup3,
    libc::SYS_pipe2,
    libc::SYS_ppoll,
    libc::SYS_pselect6,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait,
    libc::SYS_eventfd2,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    libc::SYS_mlock,
    libc::SYS_munlock,
    libc::SYS_brk,
    libc::SYS_membarrier,
    libc::SYS_memfd_create,
    libc::SYS_futex,
    libc::SYS_set_robust_list,
    libc::SYS_get_robust_list,
    libc::SYS_rseq,
    libc::SYS_set_tid_address,
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_wait4,
    libc::SYS_waitid,
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_getppid,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    libc::SYS_getresuid,
    libc::SYS_getresgid,
    libc::SYS_getgroups,
    libc::SYS_getrlimit,
    libc::SYS_prlimit64,
    libc::SYS_getrusage,
    libc::SYS_uname,
    libc::SYS_sysinfo,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_setaffinity,
    libc::SYS_sched_getparam,
    libc::SYS_sched_getscheduler,
    libc::SYS_sched_setscheduler,
    libc::SYS_sched_get_priority_max,
    libc::SYS_sched_get_priority_min,
    libc::SYS_getpriority,
    libc::SYS_setpriority,
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    libc::SYS_clock_gettime,
    libc::SYS_clock_getres,
    libc::SYS_gettimeofday,
    libc::SYS_times,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sigaltstack,
    libc::SYS_tgkill,
    libc::SYS_kill,
    libc::SYS_getrandom,
    libc::SYS_prctl,
    libc::SYS_sendmsg,
    libc::SYS_recvmsg,
    libc::SYS_sendto,
    libc::SYS_recvfrom,
    libc::SYS_shutdown,
    libc::SYS_socketpair,
    libc::SYS_getsockopt,
    libc::SYS_setsockopt,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_execve,
    libc::SYS_umask,
    libc::SYS_fchmod,
    libc::SYS_utimensat,
    libc::SYS_mincore,
];

/// The older x86-64 forms of some of the calls above.
#[cfg(target_arch = "x86_64")]
const ALLOWED_LEGACY: &[i64] = &[
    libc::SYS_open,
    libc::SYS_stat,
    libc::SYS_lstat,
    libc::SYS_access,
    libc::SYS_readlink,
    libc::SYS_rename,
    libc::SYS_unlink,
    libc::SYS_rmdir,
    libc::SYS_mkdir,
    libc::SYS_pipe,
    libc::SYS_poll,
    libc::SYS_select,
    libc::SYS_epoll_wait,
    libc::SYS_dup2,
    libc::SYS_time,
    libc::SYS_arch_prctl,
    libc::SYS_vfork,
    libc::SYS_chmod,
];
#[cfg(not(target_arch = "x86_64"))]
const ALLOWED_LEGACY: &[i64] = &[];

fn seccomp() -> Result<String, String> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| e.to_string())?;
    let rules = ALLOWED
        .iter()
        .chain(ALLOWED_LEGACY)
        .map(|&nr| (nr, vec![]))
        .collect();
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Errno(libc::EPERM as u32),
        SeccompAction::Allow,
        arch,
    )
    .map_err(|e| e.to_string())?;
    let program: BpfProgram = filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| e.to_string())?;
    // Every thread started later inherits the filter; none exists yet.
    seccompiler::apply_filter(&program).map_err(|e| e.to_string())?;
    Ok(format!(
        "{} system calls allowed",
        ALLOWED.len() + ALLOWED_LEGACY.len()
    ))
}
