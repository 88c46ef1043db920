//! Guest listeners: binding sockets safely, accepting connections under caps.

use std::io::Write;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hira_protocol::handshake::error_code;
use log::{error, warn};

use crate::config::{Config, SocketAccess};
use crate::lifecycle::Lifecycle;
use crate::session;
use crate::vms::{Vm, Vms};

/// Errors setting up a listener.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("cannot create the directory of {0}")]
    Dir(String, #[source] std::io::Error),
    #[error("{0} exists and is not a socket")]
    NotSocket(String),
    #[error("another process is serving {0}; stop it first or choose another path")]
    InUse(String),
    #[error("cannot listen on {0}")]
    Bind(String, #[source] std::io::Error),
    #[error("cannot set the owner or mode of {0}")]
    Access(String, #[source] std::io::Error),
}

/// Makes room for a socket at `path`: refuses if a live process accepts on it,
/// removes a stale socket file, refuses any other kind of file.
pub fn claim(path: &Path) -> Result<(), ListenError> {
    let shown = path.display().to_string();
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| ListenError::Dir(shown.clone(), e))?;
    }
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !meta.file_type().is_socket() {
        return Err(ListenError::NotSocket(shown));
    }
    if UnixStream::connect(path).is_ok() {
        return Err(ListenError::InUse(shown));
    }
    let _ = std::fs::remove_file(path);
    Ok(())
}

/// Gives `path` the configured owner, group and mode.
pub fn apply_access(path: &Path, access: &SocketAccess) -> Result<(), ListenError> {
    let shown = || path.display().to_string();
    if access.uid.is_some() || access.gid.is_some() {
        std::os::unix::fs::chown(path, access.uid, access.gid)
            .map_err(|e| ListenError::Access(shown(), e))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(access.mode))
        .map_err(|e| ListenError::Access(shown(), e))
}

/// Binds a Unix listener at `path` with the configured access. The socket is created
/// with mode 0600 (the daemon's umask is set at start) so nobody else can connect
/// before its owner and mode are set.
pub fn bind(path: &Path, access: &SocketAccess) -> Result<UnixListener, ListenError> {
    claim(path)?;
    let l =
        UnixListener::bind(path).map_err(|e| ListenError::Bind(path.display().to_string(), e))?;
    apply_access(path, access)?;
    Ok(l)
}

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

/// A connection counted against its listener's cap until dropped.
#[derive(Debug)]
pub struct ConnectionSlot(Option<Arc<AtomicUsize>>);

impl ConnectionSlot {
    /// A connection that counts against no listener (vsock connections are capped
    /// by their device).
    pub fn uncounted() -> Self {
        ConnectionSlot(None)
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        if let Some(c) = &self.0 {
            c.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Runs a session for a guest connection of VM `vm` on a thread of its own.
pub fn start_session(
    stream: UnixStream,
    slot: ConnectionSlot,
    vm: &str,
    config: &Arc<Config>,
    queue: &Arc<Vm>,
    life: &Arc<Lifecycle>,
) {
    if queue.removed() {
        refuse(&stream, error_code::SERVER_GONE, "the VM was removed");
        return;
    }
    let id = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
    let (config, queue, vm, life) = (config.clone(), queue.clone(), vm.to_string(), life.clone());
    let spawned = std::thread::Builder::new()
        .name(format!("session-{id}"))
        .spawn(move || {
            let ctx = session::Context {
                id,
                vm: &vm,
                config: &config,
                queue: &queue,
                life: &life,
            };
            session::run(stream, slot, ctx)
        });
    if let Err(e) = spawned {
        error!("cannot start a thread for session {id}: {e}");
    }
}

/// Tells a guest it was refused, without ever blocking on it.
pub fn refuse(mut stream: &UnixStream, code: u32, message: &str) {
    let _ = stream.set_nonblocking(true);
    let _ = stream.write_all(&session::error_frame(None, code, message));
}

/// Logs at most one line per interval, counting what it held back.
#[derive(Debug)]
struct RateLimitedLog {
    last: Option<Instant>,
    held: u64,
}

impl RateLimitedLog {
    const INTERVAL: Duration = Duration::from_secs(10);

    fn warn(&mut self, message: impl FnOnce(u64) -> String) {
        let now = Instant::now();
        if self
            .last
            .is_none_or(|t| now.duration_since(t) >= Self::INTERVAL)
        {
            warn!("{}", message(self.held));
            self.last = Some(now);
            self.held = 0;
        } else {
            self.held += 1;
        }
    }
}

/// Whether an accept error means the process or system is out of a resource, so
/// that retrying at once would spin.
fn is_exhaustion(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Accepts connections for `vm` until the daemon stops or the VM is removed; each session runs on its
/// own thread. Over the listener's cap, a connection gets an `Error` frame and is
/// closed. When descriptors run out it backs off instead of spinning.
pub fn accept_loop(
    listener: UnixListener,
    vm: String,
    config: Arc<Config>,
    vms: Arc<Vms>,
    life: Arc<Lifecycle>,
) {
    let queue = vms.vm(&vm);
    let open = Arc::new(AtomicUsize::new(0));
    let max = config.limits.max_connections_per_listener;
    let mut backoff = Duration::ZERO;
    let mut log = RateLimitedLog {
        last: None,
        held: 0,
    };
    loop {
        let accepted = listener.accept();
        if queue.removed() {
            // The VM was removed (which shut this listener down to wake us).
            return;
        }
        let stream = match accepted {
            Ok((s, _)) => {
                backoff = Duration::ZERO;
                s
            }
            Err(e) if is_exhaustion(&e) => {
                backoff = (backoff * 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
                log.warn(|held| {
                    format!("accept on VM {vm:?} failed: {e}; backing off {backoff:?} ({held} more since the last report)")
                });
                // Waiting for descriptors to free up; nothing to wake us sooner.
                std::thread::sleep(backoff);
                continue;
            }
            Err(e) => {
                log.warn(|held| format!("accept on VM {vm:?} failed: {e} ({held} more)"));
                continue;
            }
        };
        if life.stopping() {
            refuse(&stream, error_code::SERVER_GONE, "the daemon is stopping");
            continue;
        }
        let taken = open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok();
        if !taken {
            log.warn(|held| {
                format!("VM {vm:?}: listener has its maximum of {max} connections; refusing ({held} more)")
            });
            refuse(
                &stream,
                error_code::POLICY,
                &format!("this listener has its maximum of {max} connections"),
            );
            continue;
        }
        start_session(
            stream,
            ConnectionSlot(Some(open.clone())),
            &vm,
            &config,
            &queue,
            &life,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_socket_is_not_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("live.sock");
        let _live = UnixListener::bind(&path).unwrap();
        assert!(matches!(claim(&path), Err(ListenError::InUse(_))));
        assert!(path.exists(), "the live socket is left in place");
    }

    #[test]
    fn a_stale_socket_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stale.sock");
        drop(UnixListener::bind(&path).unwrap());
        let l = bind(&path, &SocketAccess::default()).unwrap();
        drop(l);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o660, "default mode is owner and group only");
    }

    #[test]
    fn a_regular_file_is_never_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        std::fs::write(&path, b"keep").unwrap();
        assert!(matches!(claim(&path), Err(ListenError::NotSocket(_))));
        assert_eq!(std::fs::read(&path).unwrap(), b"keep");
    }
}
