//! `hira-api-server`: started by `hira-vhost`, one process per guest application.

use std::os::fd::{FromRawFd, OwnedFd};

use anyhow::Context;
use clap::Parser;
use hira_api_server::Config;

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
    /// Session number assigned by hira-vhost, for logs.
    #[arg(long, default_value_t = 0)]
    session: u64,
    /// Print the host's OpenCL platforms, one per line, and exit (hira-vhost checks
    /// `--platform` against them at start).
    #[arg(long)]
    list_platforms: bool,
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
        Ok(Config {
            socket,
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
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args = Args::parse();
    if args.list_platforms {
        for name in hira_api_server::opencl::platform_names().map_err(anyhow::Error::msg)? {
            println!("{name}");
        }
        return Ok(());
    }
    let config = Config::try_from(args).context("invalid arguments")?;
    let report = hira_api_server::run(config).context("API server failed")?;
    log::info!(
        "teardown: released {} objects ({} failed)",
        report.released,
        report.failed
    );
    Ok(())
}
