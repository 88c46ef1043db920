//! Sessions that ride through a restart of the daemon (`--state-dir DIR`).
//!
//! When the daemon stops, every live session it can suspend is captured into
//! `DIR/SESSION.hira` (the format of `hira-ctl checkpoint`, see
//! [`hira_control::session_file`]) and its guest is told to reconnect where it connected.
//! When the daemon starts, it parks each file of DIR for its guest (and removes the
//! file, so that no session resumes twice); the guest, holding its calls meanwhile,
//! reconnects with its token and goes on where it stopped. This is `hira-ctl
//! checkpoint all DIR`, a restart and `hira-ctl restore DIR`, done by the daemon
//! itself, so that `systemctl restart` or a package upgrade needs no procedure.
//!
//! A session that cannot be suspended (see `docs/migration.md`) ends with the daemon,
//! as without a state directory.

use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::time::Duration;

use log::{info, warn};

use crate::lifecycle::Lifecycle;
use crate::migrate::{Captured, MigrateError, PlaceError};
use crate::vms::Vms;
use hira_control::session_file as file;

/// How long one session may take to be captured (a relayed guest has 10 s to stop
/// sending; a large state takes its copy).
const SUSPEND_LIMIT: Duration = Duration::from_secs(120);

/// Suspends every live session into a file of `dir`; returns how many were.
pub fn suspend_all(life: &Lifecycle, dir: &Path) -> usize {
    if let Err(e) = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        warn!(
            "state directory {}: {e}; sessions end with the daemon",
            dir.display()
        );
        return 0;
    }
    let mut kept = 0;
    for (id, door) in life.doors() {
        let path = dir.join(format!("{id}.hira"));
        match door.suspend(SUSPEND_LIMIT, |c| store(c, &path).map(|()| String::new())) {
            Ok(c) => {
                kept += 1;
                info!(
                    "session {id} suspended into {} ({} bytes) for the next daemon",
                    path.display(),
                    c.bytes
                );
            }
            Err(e) => warn!("session {id} ends with the daemon: {e}"),
        }
    }
    kept
}

/// Writes `c` to `path` whole, or not at all.
fn store(c: &Captured, path: &Path) -> Result<(), PlaceError> {
    let part = path.with_extension("part");
    let written = (|| -> std::io::Result<()> {
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&part)?;
        file::write_header(&mut out, &c.token, &c.vm, c.slot)?;
        let mut snapshot = std::fs::File::from(c.snapshot.try_clone()?);
        snapshot.seek(SeekFrom::Start(0))?;
        std::io::copy(&mut snapshot, &mut out)?;
        out.flush()?;
        out.sync_all()?;
        std::fs::rename(&part, path)
    })();
    written.map_err(|source| {
        let _ = std::fs::remove_file(&part);
        PlaceError::Write {
            path: path.to_path_buf(),
            source,
        }
    })
}

/// Parks every session file of `dir` for its guest and removes it; returns how
/// many were parked. A file that cannot be taken stays, with a warning.
pub fn resume_all(life: &Lifecycle, vms: &Vms, dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut parked = 0;
    let paths: Vec<_> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
    // A file a stopping daemon did not finish writing never resumes anything.
    for p in paths
        .iter()
        .filter(|p| p.extension().is_some_and(|x| x == "part"))
    {
        let _ = std::fs::remove_file(p);
    }
    let mut files: Vec<_> = paths
        .into_iter()
        .filter(|p| p.extension().is_some_and(|x| x == "hira"))
        .collect();
    files.sort();
    for path in files {
        match park(life, vms, &path) {
            Ok(vm) => {
                let _ = std::fs::remove_file(&path);
                parked += 1;
                info!(
                    "a session of VM {vm:?} from {} waits for its guest",
                    path.display()
                );
            }
            Err(e) => warn!("{}: not resumed: {e}", path.display()),
        }
    }
    parked
}

/// Why a session file was not parked.
#[derive(Debug, thiserror::Error)]
enum ResumeError {
    #[error("{0}")]
    File(#[from] std::io::Error),
    #[error(transparent)]
    Park(#[from] MigrateError),
}

/// Parks the session of file `path`; returns its VM.
fn park(life: &Lifecycle, vms: &Vms, path: &Path) -> Result<String, ResumeError> {
    let mut f = std::fs::File::open(path)?;
    let (token, vm, slot) = file::read_header(&mut f)?;
    let at = f.stream_position()?;
    let bytes = f.metadata()?.len().saturating_sub(at);
    let slot = crate::migrate::reserve_slot(vms, &vm, slot)?;
    crate::migrate::park_from(life, &vm, token, slot, bytes, &mut f)?;
    Ok(vm)
}
