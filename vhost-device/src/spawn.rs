//! API-server processes.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::time::Duration;

use log::warn;

use crate::config::Config;

/// The descriptor number the API server finds its session socket on.
const CHILD_FD: i32 = 3;

/// Starts an API server for session `id`; returns the process and our end of its socket.
pub fn api_server(config: &Config, id: u64) -> std::io::Result<(Child, UnixStream)> {
    let (ours, theirs) = UnixStream::pair()?;
    let theirs = OwnedFd::from(theirs);
    let raw = theirs.as_raw_fd();
    let mut cmd = Command::new(&config.api_server);
    cmd.arg("--fd")
        .arg(CHILD_FD.to_string())
        .arg("--session")
        .arg(id.to_string());
    if let Some(p) = &config.platform {
        cmd.arg("--platform").arg(p);
    }
    // SAFETY: the closure runs in the child between fork and exec and calls only
    // dup2, which is async-signal-safe. dup2 clears close-on-exec on the new fd.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(raw, CHILD_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    drop(theirs);
    Ok((child, ours))
}

/// Waits up to `grace` for `child` to exit, then kills it. Always reaps.
pub fn reap(child: Child, grace: Duration) {
    let pid = child.id();
    let (done, exited) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let mut child = child;
        let _ = child.wait();
        let _ = done.send(());
    });
    if exited.recv_timeout(grace).is_err() {
        warn!("API server {pid} did not exit in {grace:?}; killing it");
        // SAFETY: the child has not been reaped (the waiter is still blocked in wait),
        // so `pid` still names it.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    let _ = waiter.join();
}
