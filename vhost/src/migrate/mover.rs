//! Moving one session: carried out on the session's own thread, which owns its API
//! server, as the control socket asks through the session's door.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

use hira_protocol::handshake::{ErrorPayload, error_code, migrate};
use hira_protocol::{FrameHeader, FrameKind, unix};
use log::{info, warn};

use crate::config::Config;
use crate::lifecycle::Registration;
use crate::migrate::{MigrateError, Placement};
use crate::session::relay::RelayLink;
use crate::session::{GuestOut, send_error};
use crate::spawn;
use crate::vms::Vm;

/// Longest a migration waits for the old API server's capture, and for the new one
/// to restore.
pub(crate) const CAPTURE_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

pub(crate) const RESTORE_LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

/// What moving a host-local session on rings to a new API server needs, and what it
/// changes.
pub(crate) struct Mover<'a> {
    pub(crate) config: &'a Config,
    pub(crate) id: u64,
    pub(crate) vm: &'a str,
    /// What resumes the session after a suspension.
    pub(crate) token: hira_protocol::handshake::Token,
    /// A VM session's slot of the VM's window.
    pub(crate) slot: Option<crate::migrate::VmSlot>,
    pub(crate) guest_w: &'a Mutex<GuestOut>,
    pub(crate) queue: &'a Arc<Vm>,
    pub(crate) vm_page: &'a OwnedFd,
    pub(crate) cgroup: Option<std::os::fd::RawFd>,
    /// The hello the API server got, as it got it.
    pub(crate) hello: (FrameHeader, Vec<u8>),
    pub(crate) window: Option<OwnedFd>,
    /// The guest's ring region and eventfds.
    pub(crate) rings: Vec<OwnedFd>,
    pub(crate) link: Arc<RelayLink>,
    /// The session's frames are relayed (no rings): the capture goes in-band and
    /// the snapshot comes back in pieces.
    pub(crate) relayed: bool,
    /// Both ends keep the relayed stream until acknowledged (a VM guest over vsock):
    /// the session outlives its connection being cut.
    pub(crate) resend: bool,
    /// Bytes of whole frames taken in from the guest since the `Welcome`.
    pub(crate) taken: u64,
    /// What this end last acknowledged to the guest.
    pub(crate) ack_sent: u64,
    /// What the guest acknowledged of this end's stream.
    pub(crate) guest_acked: Arc<std::sync::atomic::AtomicU64>,
    /// A suspension of a relayed session waiting for the guest's last frame
    /// (`DRAINED`), and until when.
    pub(crate) draining: Option<(crate::migrate::Suspension, std::time::Instant)>,
    /// The API server (none once the session was suspended).
    pub(crate) child: &'a mut Option<std::process::Child>,
    pub(crate) server: &'a mut UnixStream,
    pub(crate) usage: &'a mut Arc<hira_protocol::usage::UsagePage>,
    pub(crate) tracked: &'a mut crate::vms::Tracked,
    pub(crate) carried: &'a mut hira_protocol::usage::Usage,
    pub(crate) registration: &'a Registration,
}

pub(crate) fn notify(to: &mut UnixStream, opcode: u16, fds: &[&OwnedFd]) -> std::io::Result<()> {
    let h = FrameHeader::new(FrameKind::Notify, opcode, 0, 0, 0);
    unix::send_frame_with_fds(to, &h, &[], fds)
}

impl Mover<'_> {
    /// Has the API server capture the session into a fresh memfd; on success it
    /// waits for the verdict. Returns the memfd and the snapshot's length.
    fn capture(&mut self) -> Result<(OwnedFd, u64), MigrateError> {
        let snapshot = crate::migrate::snapshot_file().map_err(MigrateError::SnapshotFile)?;
        let (tx, rx) = std::sync::mpsc::channel();
        *self.link.answers.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        let sent = if self.relayed {
            // The pieces come back through the relay thread into the memfd.
            let f = snapshot.try_clone().map_err(MigrateError::SnapshotFile)?;
            *self.link.snapshot.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(std::fs::File::from(f));
            notify(self.server, migrate::CAPTURE, &[])
        } else {
            notify(self.server, migrate::CAPTURE, &[&snapshot])
        };
        sent.map_err(MigrateError::ApiServer)?;
        let (op, answer) = match rx.recv_timeout(CAPTURE_LIMIT) {
            Ok(a) => a,
            Err(_) => {
                let _ = notify(self.server, migrate::ABORT, &[]);
                return Err(MigrateError::CaptureTimeout);
            }
        };
        if op == migrate::FAILED {
            return Err(MigrateError::ApiServerRefused(
                String::from_utf8_lossy(&answer).into_owned(),
            ));
        }
        let len = answer
            .get(..8)
            .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or_default()));
        if self.relayed {
            // The relay wrote the pieces through a descriptor sharing this one's
            // offset: whoever reads the snapshot next reads it from its start.
            // SAFETY: repositions a descriptor this process owns.
            unsafe { libc::lseek(snapshot.as_raw_fd(), 0, libc::SEEK_SET) };
        }
        Ok((snapshot, len))
    }

    /// Suspends the session: captured, placed where a daemon will resume it (the
    /// caller's part), then its API server goes and the guest is told to reconnect.
    /// Returns whether the session left (else it goes on here).
    fn suspend(&mut self, s: crate::migrate::Suspension) -> bool {
        let start = std::time::Instant::now();
        let (snapshot, bytes) = match self.capture() {
            Ok(c) => c,
            Err(e) => {
                let _ = s.captured.send(Err(e));
                return false;
            }
        };
        let from_pid = self.child.as_ref().map_or(0, std::process::Child::id);
        let captured = snapshot
            .try_clone()
            .map(|snapshot| crate::migrate::Captured {
                snapshot,
                bytes,
                token: self.token,
                vm: self.vm.to_string(),
                slot: self.slot,
                from_pid,
                capture_ms: start.elapsed().as_secs_f64() * 1e3,
            });
        let sent = match captured {
            Ok(c) => s.captured.send(Ok(c)).is_ok(),
            Err(e) => {
                let _ = s.captured.send(Err(MigrateError::SnapshotFile(e)));
                false
            }
        };
        let placed = if sent {
            s.placed
                .recv_timeout(crate::migrate::PLACE_LIMIT)
                .unwrap_or_else(|_| Placement::Failed("the snapshot was not placed in time".into()))
        } else {
            Placement::Failed("nobody took the snapshot".into())
        };
        let endpoint = match placed {
            Placement::At(e) => e,
            Placement::Failed(e) => {
                warn!(
                    "session {}: suspension abandoned, the session stays: {e}",
                    self.id
                );
                let _ = notify(self.server, migrate::ABORT, &[]);
                return false;
            }
        };
        // The guest hears where to go before the old API server leaves (whose end
        // the relay then keeps to itself: the guest's socket closes after this word).
        self.link
            .quiet
            .store(true, std::sync::atomic::Ordering::Release);
        send_error(self.guest_w, None, error_code::MOVED, &endpoint);
        let _ = notify(self.server, migrate::COMMIT, &[]);
        if let Some(old) = self.child.take() {
            spawn::reap(old, self.config.limits.teardown_grace);
        }
        self.registration.suspended();
        let _ = s.done.send(());
        info!(
            "session {}: suspended ({bytes} bytes) after {:?}; its guest reconnects to {}",
            self.id,
            start.elapsed(),
            if endpoint.is_empty() {
                "its endpoint"
            } else {
                &endpoint
            }
        );
        true
    }

    /// Moves the session to a new API server (on the host's device of index
    /// `device`, if given), or leaves it where it is.
    fn migrate(&mut self, device: Option<u32>) -> Result<crate::migrate::Moved, MigrateError> {
        let start = std::time::Instant::now();
        let (snapshot, snapshot_bytes) = self.capture()?;
        let captured = start.elapsed();
        match self.start_next(&snapshot, device) {
            Ok((child, server, usage)) => {
                let to_pid = child.id();
                // The relay goes on with the new server once the old one closes.
                *self.link.next.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(server.try_clone().map_err(MigrateError::Handover)?);
                let pause = start.elapsed();
                let _ = notify(self.server, migrate::COMMIT, &[]);
                let old = self.child.replace(child);
                let from_pid = old.as_ref().map_or(0, std::process::Child::id);
                *self.server = server;
                let how = old.map_or_else(String::new, |o| {
                    spawn::reap(o, self.config.limits.teardown_grace).0
                });
                let old_usage = self.usage.read();
                self.queue.session_ended(&old_usage);
                self.carried.commands += old_usage.commands;
                self.carried.bytes += old_usage.bytes;
                self.carried.rejected += old_usage.rejected;
                *self.usage = Arc::new(usage);
                *self.tracked = self.queue.track(self.id, self.usage.clone());
                self.registration.moved(to_pid);
                info!(
                    "session {}: moved from API server {from_pid} ({how}) to {to_pid}; {snapshot_bytes} bytes, paused {pause:?}",
                    self.id
                );
                Ok(crate::migrate::Moved {
                    session: self.id,
                    from_pid,
                    to_pid,
                    snapshot_bytes,
                    pause_ms: pause.as_secs_f64() * 1e3,
                    capture_ms: captured.as_secs_f64() * 1e3,
                    restore_ms: (pause - captured).as_secs_f64() * 1e3,
                })
            }
            Err(e) => {
                let _ = notify(self.server, migrate::ABORT, &[]);
                Err(e)
            }
        }
    }

    /// Starts the API server that takes over, and waits until it has restored the
    /// snapshot.
    fn start_next(
        &mut self,
        snapshot: &OwnedFd,
        device: Option<u32>,
    ) -> Result<
        (
            std::process::Child,
            UnixStream,
            hira_protocol::usage::UsagePage,
        ),
        MigrateError,
    > {
        let (mut child, mut server, usage) =
            spawn::api_server(self.config, self.id, self.vm_page, self.cgroup)
                .map_err(MigrateError::Spawn)?;
        let handed = (|| -> Result<(), MigrateError> {
            let mut fds = vec![snapshot];
            fds.extend(self.rings.iter());
            let payload = device.map(u32::to_le_bytes);
            let payload: &[u8] = payload.as_ref().map_or(&[], |p| p);
            let h = FrameHeader::new(FrameKind::Notify, migrate::ADOPT, 0, 0, payload.len());
            unix::send_frame_with_fds(&mut server, &h, payload, &fds)
                .map_err(MigrateError::Handover)?;
            unix::send_frame_with_fd(
                &mut server,
                &self.hello.0,
                &self.hello.1,
                self.window.as_ref(),
            )
            .map_err(MigrateError::Handover)?;
            server
                .set_read_timeout(Some(RESTORE_LIMIT))
                .map_err(MigrateError::Handover)?;
            let (h, p, _) = unix::recv_frame_with_fds(&mut server).map_err(MigrateError::Answer)?;
            server
                .set_read_timeout(None)
                .map_err(MigrateError::Handover)?;
            if h.kind != FrameKind::Welcome {
                return Err(MigrateError::ApiServerRefused(
                    ErrorPayload::decode(&p)
                        .map(|e| e.message)
                        .unwrap_or_else(|_| "the new API server failed".into()),
                ));
            }
            Ok(())
        })();
        match handed {
            Ok(()) => Ok((child, server, usage)),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                // What it charged to the VM while restoring goes back.
                self.queue.session_ended(&usage.read());
                Err(e)
            }
        }
    }
}

/// Longest a relayed session's guest may take to send its last frame before a
/// suspension; the suspension is abandoned after.
pub(crate) const DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Tells a relayed session's guest that it may send again here.
pub(crate) fn resumed_here(m: &Mover<'_>) {
    let h = FrameHeader::new(FrameKind::Notify, migrate::RESUMED, 0, 0, 0);
    let mut g = m.guest_w.lock().unwrap_or_else(|e| e.into_inner());
    let _ = g.write_all(&h.encode());
}

/// A relayed session's guest sent its last frame: the suspension goes on. Returns
/// whether the session was suspended (and so is over here).
pub(crate) fn drained(door: &crate::migrate::Door, m: &mut Mover<'_>) -> bool {
    let Some((s, _)) = m.draining.take() else {
        return false;
    };
    if m.suspend(s) {
        door.close(crate::migrate::Closed::Suspended(m.id));
        return true;
    }
    resumed_here(m);
    false
}

/// Carries out the migrations asked for. Returns whether the session was suspended
/// (and so is over here).
pub(crate) fn answer_door(door: &crate::migrate::Door, m: &mut Mover<'_>) -> bool {
    if m.draining
        .as_ref()
        .is_some_and(|(_, until)| std::time::Instant::now() >= *until)
        && let Some((s, _)) = m.draining.take()
    {
        let _ = s.captured.send(Err(MigrateError::GuestKeptSending));
        resumed_here(m);
    }
    let mut asks = door.take().into_iter();
    while let Some(ask) = asks.next() {
        match ask {
            crate::migrate::Ask::Migrate(reply, device) => {
                let res = m.migrate(device);
                if let Err(e) = &res {
                    warn!("session {}: migration failed, the session stays: {e}", m.id);
                }
                let _ = reply.send(res);
            }
            crate::migrate::Ask::Suspend(s) if m.relayed => {
                if m.draining.is_some() {
                    let _ = s.captured.send(Err(MigrateError::Suspending));
                    continue;
                }
                // The guest stops sending first (its last frame says so), so that
                // every frame it sent reaches the API server that is captured.
                let h = FrameHeader::new(FrameKind::Notify, migrate::SUSPENDING, 0, 0, 0);
                let told = {
                    let mut g = m.guest_w.lock().unwrap_or_else(|e| e.into_inner());
                    g.write_all(&h.encode())
                };
                match told {
                    Ok(()) => m.draining = Some((s, std::time::Instant::now() + DRAIN_LIMIT)),
                    Err(e) => {
                        let _ = s.captured.send(Err(MigrateError::Guest(e)));
                    }
                }
            }
            crate::migrate::Ask::Suspend(s) => {
                if m.suspend(s) {
                    door.close(crate::migrate::Closed::Suspended(m.id));
                    for rest in asks {
                        rest.refuse(crate::migrate::Closed::Suspended(m.id));
                    }
                    return true;
                }
            }
        }
    }
    false
}
