//! The daemon's lifecycle: the live sessions, and an orderly stop.
//!
//! Every session registers its guest connection here. On SIGTERM or SIGINT the daemon
//! stops accepting, shuts every guest connection down (each session then ends its API
//! server and reaps it as on any disconnect) and waits, bounded, for the sessions to
//! finish.

use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Live sessions and the stop flag.
#[derive(Debug, Default)]
pub struct Lifecycle {
    stopping: AtomicBool,
    sessions: Mutex<HashMap<u64, UnixStream>>,
    ended: Condvar,
}

/// A registered session; it leaves the registry when dropped.
#[derive(Debug)]
pub struct Registration {
    life: Arc<Lifecycle>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut s = self.life.lock();
        s.remove(&self.id);
        drop(s);
        self.life.ended.notify_all();
    }
}

impl Lifecycle {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, UnixStream>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the daemon is stopping.
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Registers session `id` with (a clone of) its guest connection; `None` when the
    /// daemon is stopping.
    pub fn register(self: &Arc<Self>, id: u64, guest: &UnixStream) -> Option<Registration> {
        let clone = guest.try_clone().ok()?;
        let mut s = self.lock();
        if self.stopping() {
            return None;
        }
        s.insert(id, clone);
        Some(Registration {
            life: self.clone(),
            id,
        })
    }

    /// Live sessions.
    pub fn sessions(&self) -> usize {
        self.lock().len()
    }

    /// Stops accepting and ends every session; returns whether all ended within
    /// `timeout`.
    pub fn stop(&self, timeout: Duration) -> bool {
        let mut s = self.lock();
        self.stopping.store(true, Ordering::Release);
        for guest in s.values() {
            let _ = guest.shutdown(std::net::Shutdown::Both);
        }
        let deadline = Instant::now() + timeout;
        while !s.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            s = self
                .ended
                .wait_timeout(s, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_shuts_sessions_down_and_waits_for_them() {
        let life = Arc::new(Lifecycle::default());
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let reg = life.register(1, &ours).unwrap();
        let session = std::thread::spawn(move || {
            // The session sees its guest connection end, then finishes.
            let mut b = [0u8; 1];
            let n = std::io::Read::read(&mut theirs, &mut b).unwrap_or(0);
            let _ = n;
            drop(reg);
        });
        // The session reads from the far end; shutting `ours` down ends its read.
        assert!(life.stop(Duration::from_secs(30)));
        session.join().unwrap();
        assert_eq!(life.sessions(), 0);
        assert!(
            life.register(2, &ours).is_none(),
            "no new sessions once stopping"
        );
    }
}
