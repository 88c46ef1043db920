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
//!    and CUDA runtimes and this server use fail with `EPERM` and are logged once
//!    each ([`log_refused`]); the most dangerous ones (`ptrace`, `mount`, `bpf`,
//!    module loading...) are not on the list at all.
//!
//! `HIRA_SANDBOX_SKIP` (comma-separated layer names) turns layers off, for an
//! operator bringing up a driver; a skipped layer is reported as not applied.
//!
//! A layer the machine cannot apply (no Landlock in the kernel, no privilege to make
//! namespaces) is reported with its reason; `hira-vhost` logs the report of a probe
//! at start, once, and each API server logs it at debug level.

use std::collections::BTreeMap;
use std::os::fd::IntoRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use landlock::{
    ABI, Access, AccessFs, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetStatus,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

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

/// Why a layer of the sandbox was not applied.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("skipped: HIRA_SANDBOX_SKIP")]
    Skipped,
    #[error("names no layer: {0:?} (known: namespaces, user, landlock, seccomp)")]
    UnknownLayer(String),
    #[error("{call}: {source}")]
    Os {
        call: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("no sandbox user configured; running as root")]
    RootWithoutUser,
    #[error("started as uid {uid}, cannot switch to uid {to}")]
    CannotSwitch { uid: u32, to: u32 },
    #[error("the switch did not take")]
    SwitchDidNotTake,
    #[error("{0}")]
    Ruleset(#[from] landlock::RulesetError),
    #[error("{}: {source}", path.display())]
    Rule {
        path: PathBuf,
        #[source]
        source: landlock::RulesetError,
    },
    #[error("the kernel does not enforce Landlock")]
    LandlockNotEnforced,
    #[error("this architecture: {0}")]
    Arch(#[source] seccompiler::BackendError),
    #[error("{0}")]
    Seccomp(#[from] seccompiler::Error),
    #[error("{0}")]
    Filter(#[from] seccompiler::BackendError),
}

/// The OS error of the call that just failed.
fn os(call: &'static str) -> LayerError {
    LayerError::Os {
        call,
        source: std::io::Error::last_os_error(),
    }
}

/// How each layer went: `Ok` with what was applied, or `Err` with why not.
#[derive(Debug, Default)]
pub struct SandboxReport {
    pub layers: Vec<(&'static str, Result<String, LayerError>)>,
}

impl SandboxReport {
    fn add(&mut self, layer: &'static str, r: Result<String, LayerError>) {
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

/// The sandbox's layers, as `HIRA_SANDBOX_SKIP` names them.
const LAYERS: [&str; 4] = ["namespaces", "user", "landlock", "seccomp"];

/// The names in a `HIRA_SANDBOX_SKIP` list that are no layer.
fn unknown_layers(skip: &str) -> Vec<String> {
    skip.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty() && !LAYERS.contains(n))
        .map(str::to_string)
        .collect()
}

/// Enters every layer the machine allows. Must run while the process has one thread.
pub fn enter(config: &SandboxConfig) -> SandboxReport {
    let mut report = SandboxReport::default();
    // Files the driver creates (its kernel cache) are this user's alone, whatever
    // mask the daemon runs with.
    // SAFETY: umask only changes this process's file-creation mask.
    unsafe { libc::umask(0o077) };
    // Layers the operator turned off (`HIRA_SANDBOX_SKIP`, for bringing up a driver
    // the sandbox stops): reported as not applied, with the reason.
    let skip = std::env::var("HIRA_SANDBOX_SKIP").unwrap_or_default();
    // A name that is no layer is said, not silently ignored: the operator meant to
    // turn something off.
    for name in unknown_layers(&skip) {
        report.add("HIRA_SANDBOX_SKIP", Err(LayerError::UnknownLayer(name)));
    }
    let layer = |name: &str, apply: &dyn Fn() -> Result<String, LayerError>| {
        if skip.split(',').any(|l| l.trim() == name) {
            Err(LayerError::Skipped)
        } else {
            apply()
        }
    };
    report.add("namespaces", layer("namespaces", &namespaces));
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
    report.add("user", layer("user", &|| drop_privileges(config.user)));
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
            Err(os("prctl"))
        },
    );
    report.add("landlock", layer("landlock", &|| landlock(config)));
    report.add("seccomp", layer("seccomp", &seccomp));
    report
}

fn namespaces() -> Result<String, LayerError> {
    // SAFETY: unshare takes flags and affects only this process.
    let r = unsafe { libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWIPC | libc::CLONE_NEWNET) };
    if r == 0 {
        Ok("mount, IPC, network".into())
    } else {
        Err(os("unshare"))
    }
}

fn drop_privileges(user: Option<(u32, u32)>) -> Result<String, LayerError> {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let Some((to_uid, to_gid)) = user else {
        return if uid == 0 {
            Err(LayerError::RootWithoutUser)
        } else {
            Ok(format!("already unprivileged (uid {uid})"))
        };
    };
    if uid != 0 {
        return if uid == to_uid {
            Ok(format!("uid {uid}"))
        } else {
            Err(LayerError::CannotSwitch { uid, to: to_uid })
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
        return Err(os("setuid/setgid"));
    }
    // SAFETY: getuid/geteuid have no preconditions.
    if unsafe { libc::getuid() != to_uid || libc::geteuid() != to_uid } {
        return Err(LayerError::SwitchDidNotTake);
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

fn landlock(config: &SandboxConfig) -> Result<String, LayerError> {
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
    // This process's own threads in procfs, writable: NVIDIA's CUDA driver names
    // the threads it starts by writing /proc/self/task/<tid>/comm, and other
    // sandboxes of it report `cuInit` failing with CUDA_ERROR_OPERATING_SYSTEM
    // (304) when it cannot (not isolated here: seccomp stopped it first).
    // Landlock binds a rule to the directory's inode, and procfs makes a new inode
    // when a dentry that nothing holds is evicted: the descriptor kept open below
    // holds it for the process's life. Only this process's tasks lie beneath; the
    // kernel's own checks still decide which of their files may be written.
    if let Some(task) = own_task_dir() {
        rules.push((task, read | AccessFs::WriteFile));
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
        .and_then(|r| r.create())?;
    let mut granted = BTreeMap::new();
    for (path, access) in rules {
        let Ok(fd) = PathFd::new(&path) else {
            continue;
        };
        ruleset = ruleset
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|source| LayerError::Rule {
                path: path.clone(),
                source,
            })?;
        granted.insert(path, ());
    }
    let status = ruleset.restrict_self()?;
    match status.ruleset {
        RulesetStatus::FullyEnforced => Ok(format!("{} paths", granted.len())),
        RulesetStatus::PartiallyEnforced => Ok(format!(
            "{} paths, some access rights not supported by this kernel",
            granted.len()
        )),
        RulesetStatus::NotEnforced => Err(LayerError::LandlockNotEnforced),
    }
}

/// `/proc/<pid>/task` of this process, its dentry held open for the process's life
/// (see its Landlock rule).
fn own_task_dir() -> Option<PathBuf> {
    let path = PathBuf::from(format!("/proc/{}/task", std::process::id()));
    let held = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(&path)
        .ok()?;
    // Left open on purpose: the rule lasts as long as the process.
    let _ = held.into_raw_fd();
    Some(path)
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
    // NVIDIA's driver (CUDA 13, driver 580: `cuInit` fails with
    // CUDA_ERROR_OPERATING_SYSTEM without them): Unix-domain sockets (socket is
    // allowed for that domain only, see `seccomp`; abstract names are this
    // server's own in its network namespace, paths are Landlock's), NUMA
    // placement, and links it makes where Landlock allows.
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_accept4,
    libc::SYS_connect,
    libc::SYS_get_mempolicy,
    libc::SYS_symlinkat,
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
    libc::SYS_symlink,
];
#[cfg(not(target_arch = "x86_64"))]
const ALLOWED_LEGACY: &[i64] = &[];

fn seccomp() -> Result<String, LayerError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(LayerError::Arch)?;
    // socket(2) for the Unix domain only (the server has no network of its own).
    let unix_only = SeccompRule::new(vec![SeccompCondition::new(
        0,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::Eq,
        libc::AF_UNIX as u64,
    )?])?;
    let rules = ALLOWED
        .iter()
        .chain(ALLOWED_LEGACY)
        .map(|&nr| (nr, vec![]))
        .chain([(libc::SYS_socket, vec![unix_only])])
        .collect();
    // A refused call traps to `on_refused`, which fails it with EPERM as the filter
    // would and notes which call it was, so the operator learns what a driver
    // needed (`log_refused`); where the handler cannot be installed, the filter
    // fails the call itself.
    let refuse = if refusal::install() {
        SeccompAction::Trap
    } else {
        SeccompAction::Errno(libc::EPERM as u32)
    };
    let filter = SeccompFilter::new(rules, refuse, SeccompAction::Allow, arch)?;
    let program: BpfProgram = filter.try_into()?;
    // Every thread started later inherits the filter; none exists yet.
    seccompiler::apply_filter(&program)?;
    Ok(format!(
        "{} system calls allowed, socket for the Unix domain only",
        ALLOWED.len() + ALLOWED_LEGACY.len() + 1
    ))
}

/// System calls the seccomp filter refused, noted by a SIGSYS handler.
///
/// Hand-written rather than taken from a crate: seccompiler builds the filter but
/// has no handler, and the handler must be async-signal-safe (atomics only).
mod refusal {
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

    /// One bit per system call number below 512; larger numbers share the last bit.
    const WORDS: usize = 8;
    static REFUSED: [AtomicU64; WORDS] = [const { AtomicU64::new(0) }; WORDS];
    static LOGGED: [AtomicU64; WORDS] = [const { AtomicU64::new(0) }; WORDS];
    /// How many distinct calls were refused: the cheap test for something new.
    static DISTINCT: AtomicU32 = AtomicU32::new(0);
    static SEEN: AtomicU32 = AtomicU32::new(0);

    /// Offset of `si_syscall` in a SIGSYS `siginfo_t` on 64-bit Linux: three ints,
    /// padding, then `si_call_addr`.
    const SI_SYSCALL: usize = 24;

    fn note(nr: i32) {
        let bit = usize::try_from(nr)
            .unwrap_or(usize::MAX)
            .min(WORDS * 64 - 1);
        let mask = 1u64 << (bit % 64);
        if REFUSED[bit / 64].fetch_or(mask, Ordering::Relaxed) & mask == 0 {
            DISTINCT.fetch_add(1, Ordering::Release);
        }
    }

    extern "C" fn on_refused(
        _sig: libc::c_int,
        info: *mut libc::siginfo_t,
        ctx: *mut libc::c_void,
    ) {
        // SAFETY: the kernel passes a SIGSYS siginfo, whose si_syscall is an int at
        // SI_SYSCALL, and the interrupted thread's ucontext.
        unsafe {
            note(info.cast::<u8>().add(SI_SYSCALL).cast::<i32>().read());
            let uc = ctx.cast::<libc::ucontext_t>();
            // The refused call returns -EPERM, as the filter's errno action would.
            #[cfg(target_arch = "x86_64")]
            {
                (*uc).uc_mcontext.gregs[libc::REG_RAX as usize] = -i64::from(libc::EPERM);
            }
            #[cfg(target_arch = "aarch64")]
            {
                (*uc).uc_mcontext.regs[0] = (-i64::from(libc::EPERM)) as u64;
            }
        }
    }

    /// Installs the SIGSYS handler; false where this architecture has none here.
    pub fn install() -> bool {
        if !cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
            return false;
        }
        // SAFETY: a zeroed sigaction with a handler of the SA_SIGINFO signature.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_refused as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGSYS, &sa, std::ptr::null_mut()) == 0
        }
    }

    /// System calls refused since the last call, each once in the process's life.
    pub fn take_new() -> Vec<u32> {
        // Called after every call: a load, and a store only when something is new.
        let n = DISTINCT.load(Ordering::Acquire);
        if SEEN.load(Ordering::Relaxed) == n {
            return Vec::new();
        }
        SEEN.store(n, Ordering::Relaxed);
        let mut out = Vec::new();
        for (w, (refused, logged)) in REFUSED.iter().zip(&LOGGED).enumerate() {
            let r = refused.load(Ordering::Relaxed);
            let new = r & !logged.fetch_or(r, Ordering::Relaxed);
            for b in 0..64 {
                if new & (1 << b) != 0 {
                    out.push((w * 64 + b) as u32);
                }
            }
        }
        out
    }
}

/// Logs, once each, the system calls the seccomp filter refused since the last
/// call (a driver that needs one fails with its own error, often a generic one
/// such as CUDA_ERROR_OPERATING_SYSTEM; this names the cause). Cheap when nothing
/// new was refused: one atomic load.
pub fn log_refused() {
    for nr in refusal::take_new() {
        log::warn!(
            "the sandbox refused system call {nr} ({}) with EPERM",
            std::env::consts::ARCH
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_lists_name_only_layers() {
        assert!(unknown_layers("").is_empty());
        assert!(unknown_layers("seccomp, landlock").is_empty());
        assert_eq!(unknown_layers("seccomp,landlok,,user"), vec!["landlok"]);
    }

    /// Runs `body` in a forked child (sandbox layers are for life) and returns its
    /// exit code.
    fn in_child(body: impl FnOnce() -> i32) -> i32 {
        // SAFETY: the child only makes system calls, may start a thread, and exits
        // with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let code = body();
            // SAFETY: ends the child without running the parent's test harness.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "the child was killed: {status:#x}");
        libc::WEXITSTATUS(status)
    }

    /// In a child process (the filter is for life): a call off the list fails with
    /// EPERM, as before, and is named once.
    #[test]
    fn a_refused_call_fails_with_eperm_and_is_named_once() {
        let code = in_child(|| {
            if seccomp().is_err() {
                return 10;
            }
            // A Unix-domain socket is allowed, any other domain is not.
            // SAFETY: socket(2) with plain integers; the results are checked.
            let unix = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
            if unix < 0 {
                return 15;
            }
            // SAFETY: as above.
            let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
            if fd != -1 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EPERM) {
                return 11;
            }
            if refusal::take_new() != [libc::SYS_socket as u32] {
                return 12;
            }
            // SAFETY: as above.
            unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
            if !refusal::take_new().is_empty() {
                return 13;
            }
            // An allowed call is untouched.
            // SAFETY: getpid has no preconditions.
            if unsafe { libc::getpid() } <= 0 {
                return 14;
            }
            0
        });
        assert_eq!(code, 0, "see the codes above");
    }

    /// In a child process: under the Landlock rules a thread can name itself
    /// through procfs (NVIDIA's driver does, in `cuInit`), and procfs stays
    /// read-only elsewhere.
    #[test]
    fn threads_can_name_themselves_through_procfs_and_nothing_else_there_is_writable() {
        let code = in_child(|| {
            match landlock(&SandboxConfig::default()) {
                Ok(_) => {}
                Err(LayerError::LandlockNotEnforced) => return 20,
                Err(_) => return 10,
            }
            let named = std::thread::spawn(|| {
                // SAFETY: gettid has no preconditions.
                let tid = unsafe { libc::gettid() };
                std::fs::write(format!("/proc/self/task/{tid}/comm"), "hira-named")
                    .and_then(|()| std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")))
            })
            .join();
            match named {
                Ok(Ok(n)) if n.trim() == "hira-named" => {}
                _ => return 11,
            }
            match std::fs::write("/proc/self/oom_score_adj", "1") {
                Err(e) if e.raw_os_error() == Some(libc::EACCES) => 0,
                _ => 12,
            }
        });
        if code == 20 {
            eprintln!("skipped: this kernel does not enforce Landlock");
            return;
        }
        assert_eq!(code, 0, "see the codes above");
    }
}
