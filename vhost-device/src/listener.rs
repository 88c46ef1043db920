//! Guest listeners.

use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use log::{error, warn};

use crate::config::Config;
use crate::router::{Router, VmQueue};
use crate::session;

/// Errors setting up a listener.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("cannot create the directory of {0}")]
    Dir(String, #[source] std::io::Error),
    #[error("{0} exists and is not a socket")]
    NotSocket(String),
    #[error("cannot listen on {0}")]
    Bind(String, #[source] std::io::Error),
}

/// Binds a Unix listener at `path`, replacing a stale socket file.
pub fn bind(path: &Path) -> Result<UnixListener, ListenError> {
    let shown = path.display().to_string();
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| ListenError::Dir(shown.clone(), e))?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(ListenError::NotSocket(shown));
        }
        let _ = std::fs::remove_file(path);
    }
    UnixListener::bind(path).map_err(|e| ListenError::Bind(shown, e))
}

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

/// Runs a session for a guest connection of VM `vm` on a thread of its own.
pub fn start_session(stream: UnixStream, vm: &str, config: &Arc<Config>, queue: &Arc<VmQueue>) {
    let id = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
    let (config, queue, vm) = (config.clone(), queue.clone(), vm.to_string());
    let spawned = std::thread::Builder::new()
        .name(format!("session-{id}"))
        .spawn(move || session::run(stream, id, &vm, &config, &queue));
    if let Err(e) = spawned {
        error!("cannot start a thread for session {id}: {e}");
    }
}

/// Accepts connections for `vm` forever; each session runs on its own thread.
pub fn accept_loop(listener: UnixListener, vm: String, config: Arc<Config>, router: Arc<Router>) {
    let queue = router.vm(&vm);
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                warn!("accept on VM {vm:?} failed: {e}");
                continue;
            }
        };
        start_session(stream, &vm, &config, &queue);
    }
}
