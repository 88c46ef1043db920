//! The router's per-VM dispatch queues.
//!
//! Every command a guest sends passes through its VM's queue before it reaches the
//! API server. For now the queue is first in, first out across all of a VM's
//! sessions; the fair scheduler will replace [`VmQueue::admit`] with weighted fair
//! queuing between VMs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// A VM's dispatch queue and counters.
#[derive(Debug, Default)]
pub struct VmQueue {
    /// The VM's shared data window, if it has one.
    pub window: std::sync::OnceLock<crate::window::VmWindow>,
    tickets: Mutex<(u64, u64)>,
    cv: Condvar,
    pub commands: AtomicU64,
    pub bytes: AtomicU64,
}

/// The right to forward one command; the next command is admitted when it drops.
#[derive(Debug)]
pub struct Admission<'a> {
    queue: &'a VmQueue,
}

impl VmQueue {
    /// Waits for this command's turn (arrival order within the VM).
    pub fn admit(&self, bytes: u64) -> Admission<'_> {
        let mut t = self.tickets.lock().unwrap_or_else(|e| e.into_inner());
        let mine = t.0;
        t.0 += 1;
        while t.1 != mine {
            t = self.cv.wait(t).unwrap_or_else(|e| e.into_inner());
        }
        self.commands.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        Admission { queue: self }
    }
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        let mut t = self.queue.tickets.lock().unwrap_or_else(|e| e.into_inner());
        t.1 += 1;
        drop(t);
        self.queue.cv.notify_all();
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admissions_follow_arrival_order() {
        let q = Arc::new(VmQueue::default());
        let first = q.admit(1);
        let order = Arc::new(Mutex::new(Vec::new()));
        let (q2, o2) = (q.clone(), order.clone());
        let t = std::thread::spawn(move || {
            let _a = q2.admit(1);
            o2.lock().unwrap().push(2);
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        order.lock().unwrap().push(1);
        drop(first);
        t.join().unwrap();
        assert_eq!(*order.lock().unwrap(), vec![1, 2]);
        assert_eq!(q.commands.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn same_vm_name_shares_a_queue() {
        let r = Router::default();
        assert!(Arc::ptr_eq(&r.vm("a"), &r.vm("a")));
        assert!(!Arc::ptr_eq(&r.vm("a"), &r.vm("b")));
    }
}
