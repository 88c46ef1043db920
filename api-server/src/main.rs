//! `hira-api-server`: started by `hira-vhost`, one process per guest application.

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use hira_api_server::Config;
use hira_api_server::output::{self, Bound, HostOutput};
use hira_api_server::sandbox::{self, SandboxConfig};
use hira_protocol::usage::{UsagePage, VmPage};

/// Executes one guest application's remoted API calls on the host. Started by
/// hira-vhost with the session socket as an inherited file descriptor; not meant to be
/// run by hand.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// File descriptor of the session socket inherited from hira-vhost.
    #[arg(long, default_value_t = 3)]
    fd: i32,
    /// Use the first host OpenCL platform whose name contains this text (default: the
    /// first platform that is not Hira itself).
    #[arg(long)]
    platform: Option<String>,
    /// File descriptor of the usage page hira-vhost reads this session's counters from.
    #[arg(long)]
    usage_fd: Option<i32>,
    /// File descriptor of the VM's page (its memory quota and what its sessions hold),
    /// shared with hira-vhost and the VM's other API servers.
    #[arg(long)]
    vm_page_fd: Option<i32>,
    /// Session number assigned by hira-vhost, for logs.
    #[arg(long, default_value_t = 0)]
    session: u64,
    /// Print the host's OpenCL platforms, one per line, and exit (hira-vhost checks
    /// `--platform` against them at start).
    #[arg(long)]
    list_platforms: bool,
    /// Run as this user and group (`UID:GID`); needs to be started as root.
    #[arg(long, value_name = "UID:GID")]
    sandbox_user: Option<String>,
    /// The driver's kernel cache (writable inside the sandbox; HOME and XDG_CACHE_HOME).
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<std::path::PathBuf>,
    /// Enter the sandbox, print how each layer went, and exit (hira-vhost runs this
    /// once at start to report what the machine allows).
    #[arg(long)]
    sandbox_check: bool,
    /// Print what this process sees of the host's OpenCL and CUDA (platforms,
    /// devices, the driver), as `--sandbox-check` does from inside the sandbox, and
    /// exit (hira-vhost compares the two).
    #[arg(long)]
    probe: bool,
    /// Bytes per second of the host library's output (a kernel's `printf`) the
    /// session may send its guest; the excess is dropped and counted.
    #[arg(long, value_name = "BYTES", default_value_t = output::DEFAULT_RATE)]
    output_rate: u64,
    /// Bytes of the host library's output held for the guest at once (and the burst
    /// above the rate).
    #[arg(long, value_name = "BYTES", default_value_t = output::DEFAULT_BUFFER)]
    output_buffer: u64,
}

/// Prints what this process sees of the host's OpenCL and CUDA, a line each.
fn probe() {
    for line in hira_api_server::opencl::probe()
        .into_iter()
        .chain(hira_api_server::cuda::probe())
    {
        println!("{line}");
    }
}

/// The directories the operator's OpenCL setting names: `OCL_ICD_VENDORS` (a directory
/// of `.icd` files) and the directories of the libraries those files name by path.
fn icd_paths() -> Vec<std::path::PathBuf> {
    let Some(vendors) = std::env::var_os("OCL_ICD_VENDORS").map(std::path::PathBuf::from) else {
        return Vec::new();
    };
    if !vendors.is_dir() {
        return Vec::new();
    }
    let mut paths = vec![vendors.clone()];
    let icds = std::fs::read_dir(&vendors).into_iter().flatten().flatten();
    for icd in icds.filter(|e| e.path().extension().is_some_and(|x| x == "icd")) {
        let Ok(text) = std::fs::read_to_string(icd.path()) else {
            continue;
        };
        let library = std::path::PathBuf::from(text.trim());
        if !library.is_absolute() {
            // Found on the library path, which is readable already.
            continue;
        }
        // The directory named, and the one a link there leads to.
        let real = std::fs::canonicalize(&library).ok();
        for file in std::iter::once(library.as_path()).chain(real.as_deref()) {
            if let Some(dir) = file.parent().filter(|d| d.is_dir()) {
                paths.push(dir.to_path_buf());
            }
        }
    }
    paths
}

fn sandbox_config(a: &Args) -> anyhow::Result<SandboxConfig> {
    let user = match &a.sandbox_user {
        Some(s) => {
            let (u, g) = s
                .split_once(':')
                .context("--sandbox-user must be UID:GID")?;
            Some((u.parse().context("bad UID")?, g.parse().context("bad GID")?))
        }
        None => None,
    };
    Ok(SandboxConfig {
        user,
        cache_dir: a.cache_dir.clone(),
        // The library path the operator gave API servers (where a driver library
        // outside the system's directories lives), and the ICD directory and the
        // libraries its files name, stay readable in the sandbox.
        read_paths: std::env::var_os("LD_LIBRARY_PATH")
            .map(|p| {
                std::env::split_paths(&p)
                    .filter(|d| d.is_dir())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
            .into_iter()
            .chain(icd_paths())
            .collect(),
    })
}

impl TryFrom<Args> for Config {
    type Error = anyhow::Error;

    fn try_from(a: Args) -> anyhow::Result<Config> {
        anyhow::ensure!(
            a.fd >= 3,
            "--fd must name an inherited descriptor (3 or above), got {}",
            a.fd
        );
        // SAFETY: fcntl(F_GETFD) only inspects the descriptor number.
        let valid = unsafe { libc::fcntl(a.fd, libc::F_GETFD) } >= 0;
        anyhow::ensure!(valid, "--fd {} is not an open descriptor", a.fd);
        // SAFETY: the descriptor is open (checked above) and was handed to this process
        // for it alone to own.
        let socket = unsafe { OwnedFd::from_raw_fd(a.fd) };
        let inherited = |fd: i32, flag: &str| -> anyhow::Result<OwnedFd> {
            anyhow::ensure!(fd >= 3 && fd != a.fd, "{flag} {fd} is not usable");
            // SAFETY: fcntl(F_GETFD) only inspects the descriptor number.
            let valid = unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0;
            anyhow::ensure!(valid, "{flag} {fd} is not an open descriptor");
            // SAFETY: open (checked above), handed to this process alone.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        };
        let usage = match a.usage_fd {
            Some(fd) => {
                let fd = inherited(fd, "--usage-fd")?;
                Some(Arc::new(
                    UsagePage::map(&fd).context("cannot map the usage page")?,
                ))
            }
            None => None,
        };
        let vm_page = match a.vm_page_fd {
            Some(fd) => {
                anyhow::ensure!(a.usage_fd != Some(fd), "--vm-page-fd {fd} is not usable");
                let fd = inherited(fd, "--vm-page-fd")?;
                Some(VmPage::map(&fd).context("cannot map the VM page")?)
            }
            None => None,
        };
        anyhow::ensure!(
            a.output_rate > 0 && a.output_buffer > 0,
            "--output-rate and --output-buffer must be positive"
        );
        Ok(Config {
            output: None,
            started: std::time::Instant::now(),
            socket,
            usage,
            vm_page,
            platform: a.platform,
            session: a.session,
        })
    }
}

fn main() -> anyhow::Result<()> {
    // Set before any thread exists or any OpenCL library is loaded: if Hira's own ICD
    // is installed on the host, it must not remote the API server's calls to itself.
    // SAFETY: single-threaded at this point; nothing reads the environment concurrently.
    unsafe { std::env::set_var("HIRA_DISABLE", "1") };
    // This process's own lines go to the standard error it was started with (the
    // daemon's log), also once descriptor 2 carries the host library's output to the
    // guest.
    let log = output::log_sink().context("cannot duplicate standard error")?;
    let panic_log = log.try_clone().context("cannot duplicate standard error")?;
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .target(env_logger::Target::Pipe(Box::new(log)))
        .init();
    std::panic::set_hook(Box::new(move |info| {
        use std::io::Write;
        let thread = std::thread::current();
        let _ = writeln!(
            &panic_log,
            "thread '{}' {info}",
            thread.name().unwrap_or("<unnamed>")
        );
    }));
    let args = Args::parse();
    if args.list_platforms {
        for name in hira_api_server::opencl::platform_names().map_err(anyhow::Error::msg)? {
            println!("{name}");
        }
        return Ok(());
    }
    if args.probe {
        probe();
        return Ok(());
    }
    let sandbox_config = sandbox_config(&args)?;
    if args.sandbox_check {
        for line in sandbox::enter(&sandbox_config).lines() {
            println!("{line}");
        }
        // What a session's API server will see of the host's OpenCL and CUDA, from
        // inside the sandbox (hira-vhost compares it with what it sees outside).
        probe();
        return Ok(());
    }
    let bound = Bound {
        rate: args.output_rate,
        buffer: args.output_buffer,
    };
    let mut config = Config::try_from(args).context("invalid arguments")?;
    // Before the host library is loaded.
    let output = HostOutput::capture(bound, config.usage.clone())
        .context("cannot take the host library's output")?;
    // Before anything from the guest is read, and while this process has one thread.
    for line in sandbox::enter(&sandbox_config).lines() {
        log::debug!("sandbox {line}");
    }
    output
        .start()
        .context("cannot read the host library's output")?;
    config.output = Some(output);
    match hira_api_server::run(config).context("API server failed")? {
        hira_api_server::Outcome::Ended(report) => log::info!(
            "teardown: released {} objects ({} failed)",
            report.released,
            report.failed
        ),
        hira_api_server::Outcome::Moved => {}
    }
    Ok(())
}
