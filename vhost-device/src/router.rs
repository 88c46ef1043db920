//! The router's per-VM state: every command a guest sends is accounted to its VM, and
//! each VM's sessions are capped.
//!
//! Accounting never waits: a command is counted and forwarded by its own session's
//! thread, so nothing one session does (a guest that stops reading, an API server
//! stuck in a kernel) holds up another session of the same VM or another VM. Policy
//! that delays a VM's commands (weighted fair queuing) acts where commands reach the
//! device, in the API server, with decisions made here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A VM's counters and session cap.
#[derive(Debug, Default)]
pub struct VmQueue {
    /// The VM's shared data window, if it has one.
    pub window: std::sync::OnceLock<crate::window::VmWindow>,
    pub commands: AtomicU64,
    pub bytes: AtomicU64,
    sessions: AtomicUsize,
}

/// One of a VM's session slots; the slot frees when this drops.
#[derive(Debug)]
pub struct SessionSlot {
    queue: Arc<VmQueue>,
}

impl Drop for SessionSlot {
    fn drop(&mut self) {
        self.queue.sessions.fetch_sub(1, Ordering::AcqRel);
    }
}

impl VmQueue {
    /// Accounts one command of `bytes` to the VM. Never blocks.
    pub fn admit(&self, bytes: u64) {
        self.commands.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Takes a session slot if the VM has fewer than `max` sessions.
    pub fn open_session(self: &Arc<Self>, max: usize) -> Option<SessionSlot> {
        self.sessions
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| SessionSlot {
                queue: self.clone(),
            })
    }

    /// Sessions the VM has now.
    pub fn sessions(&self) -> usize {
        self.sessions.load(Ordering::Acquire)
    }
}

/// All VMs' queues.
#[derive(Debug, Default)]
pub struct Router {
    vms: Mutex<HashMap<String, Arc<VmQueue>>>,
}

impl Router {
    /// The queue of VM `name`, created on first use.
    pub fn vm(&self, name: &str) -> Arc<VmQueue> {
        self.vms
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(name.to_string())
            .or_default()
            .clone()
    }

    /// Every VM's queue, by name.
    pub fn snapshot(&self) -> Vec<(String, Arc<VmQueue>)> {
        let mut v: Vec<_> = self
            .vms
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, q)| (k.clone(), q.clone()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_slots_are_capped_and_freed() {
        let q = Arc::new(VmQueue::default());
        let a = q.open_session(2).expect("first slot");
        let _b = q.open_session(2).expect("second slot");
        assert!(
            q.open_session(2).is_none(),
            "a third session is over the cap"
        );
        drop(a);
        assert_eq!(q.sessions(), 1);
        assert!(
            q.open_session(2).is_some(),
            "a freed slot can be taken again"
        );
    }

    #[test]
    fn admission_counts_commands_and_bytes() {
        let q = VmQueue::default();
        q.admit(10);
        q.admit(5);
        assert_eq!(q.commands.load(Ordering::Relaxed), 2);
        assert_eq!(q.bytes.load(Ordering::Relaxed), 15);
    }

    #[test]
    fn same_vm_name_shares_a_queue() {
        let r = Router::default();
        assert!(Arc::ptr_eq(&r.vm("a"), &r.vm("a")));
        assert!(!Arc::ptr_eq(&r.vm("a"), &r.vm("b")));
    }
}
