//! The VMs the daemon serves and each one's state: its sessions' usage (which their API
//! servers count), its quota, share and cap on sessions, its window and cgroup.
//!
//! Accounting never waits and never touches a frame: each session's API server counts
//! what it receives in a usage page the daemon reads (see
//! `hira_protocol::usage`), so nothing one session does (a guest that stops reading,
//! an API server stuck in a kernel) holds up another session of the same VM or
//! another VM. Policy
//! that delays a VM's commands (weighted fair queuing) acts where commands reach the
//! device, in the API server, with decisions made here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use hira_protocol::usage::{Gate, Usage, UsagePage, VmPage};

/// A VM's shared page and the descriptor each of its API servers gets.
#[derive(Debug)]
pub struct SharedVmPage {
    pub page: VmPage,
    pub fd: std::os::fd::OwnedFd,
}

/// A VM's counters, session cap and memory quota.
#[derive(Debug, Default)]
pub struct Vm {
    /// The VM's page (memory quota, memory its sessions hold), made on first use.
    page: Mutex<Option<Arc<SharedVmPage>>>,
    /// The VM's shared data window, if it has one.
    pub window: std::sync::OnceLock<crate::window::VmWindow>,
    /// The VM's cgroup (its API servers' host memory), when the daemon has one.
    pub cgroup: std::sync::OnceLock<crate::cgroup::VmCgroup>,
    /// Commands, bytes and device time of the VM's ended sessions.
    commands: AtomicU64,
    bytes: AtomicU64,
    device_ns: AtomicU64,
    held_ns: AtomicU64,
    /// The host library's output of ended sessions: sent to the guest, and dropped
    /// over the sessions' bound.
    output_bytes: AtomicU64,
    output_dropped: AtomicU64,
    /// The VM's share of device time (0 reads as 1).
    share: AtomicU32,
    /// The scheduler's last decision for the VM: 0 run, 1 hold, 2 delay.
    decision: AtomicU32,
    /// The VM's own cap on sessions (0: the daemon-wide one).
    max_sessions: AtomicUsize,
    sessions: AtomicUsize,
    /// The usage pages of the VM's live sessions, by session id.
    live: Mutex<HashMap<u64, Arc<UsagePage>>>,
    /// How many times the VM's vsock device was reset (its connections all cut).
    resets: AtomicU64,
    /// Removed at run time (`vm_remove`): no new session starts.
    removed: std::sync::atomic::AtomicBool,
    /// The GPU host its sessions run on (unset: this host).
    gpu_host: std::sync::OnceLock<String>,
}

/// A live session's usage, counted into its VM until this drops; then its final
/// counts join the VM's totals.
#[derive(Debug)]
pub struct Tracked {
    queue: Arc<Vm>,
    id: u64,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let page = self
            .queue
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
        if let Some(p) = page {
            let u = p.read();
            self.queue.commands.fetch_add(u.commands, Ordering::Relaxed);
            self.queue.bytes.fetch_add(u.bytes, Ordering::Relaxed);
            self.queue
                .device_ns
                .fetch_add(u.device_ns, Ordering::Relaxed);
            self.queue
                .output_bytes
                .fetch_add(u.output_bytes, Ordering::Relaxed);
            self.queue
                .output_dropped
                .fetch_add(u.output_dropped, Ordering::Relaxed);
        }
    }
}

/// One of a VM's session slots; the slot frees when this drops.
#[derive(Debug)]
pub struct SessionSlot {
    queue: Arc<Vm>,
}

impl Drop for SessionSlot {
    fn drop(&mut self) {
        self.queue.sessions.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Vm {
    /// Applies the device-memory quota of `s` (none: no quota), and its cap on
    /// sessions and share where it sets them.
    pub fn apply(&self, s: &hira_control::settings::VmSettings) -> std::io::Result<()> {
        self.set_mem_quota(s.mem_quota)?;
        if let Some(n) = s.max_sessions {
            self.set_max_sessions(n);
        }
        if let Some(share) = s.share {
            self.set_share(share);
        }
        Ok(())
    }

    /// Places the VM's sessions on GPU host `gpu` (once; a VM's placement is fixed
    /// while it is served).
    pub fn place(&self, gpu: &str) {
        let _ = self.gpu_host.set(gpu.to_string());
    }

    /// The GPU host the VM's sessions run on, if not this host.
    pub fn gpu_host(&self) -> Option<&str> {
        self.gpu_host.get().map(String::as_str)
    }

    /// The VM is being removed: its new guests are refused from now on.
    pub fn remove(&self) {
        self.removed.store(true, Ordering::SeqCst);
    }

    /// Whether the VM was removed.
    pub fn removed(&self) -> bool {
        self.removed.load(Ordering::SeqCst)
    }

    /// The VM's vsock device was reset: every connection of it is about to be cut.
    pub fn device_reset(&self) {
        self.resets.fetch_add(1, Ordering::SeqCst);
    }

    /// How many times the VM's vsock device was reset so far.
    pub fn resets(&self) -> u64 {
        self.resets.load(Ordering::SeqCst)
    }

    /// Counts session `id`'s usage, as its API server keeps it in `page`, into the VM
    /// while the returned value lives.
    pub fn track(self: &Arc<Self>, id: u64, page: Arc<UsagePage>) -> Tracked {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, page);
        Tracked {
            queue: self.clone(),
            id,
        }
    }

    /// Commands and bytes of the VM's sessions, ended and live.
    pub fn totals(&self) -> (u64, u64) {
        let t = self.usage();
        (t.commands, t.bytes)
    }

    /// The VM's sessions' counters added up: commands, bytes and device time of ended
    /// and live sessions (with the time of commands still running); memory, commands
    /// in flight and held of live ones.
    pub fn usage(&self) -> Usage {
        let now = hira_protocol::usage::monotonic_ns();
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let mut t = Usage {
            commands: self.commands.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            device_ns: self.device_ns.load(Ordering::Relaxed),
            held_ns: self.held_ns.load(Ordering::Relaxed),
            output_bytes: self.output_bytes.load(Ordering::Relaxed),
            output_dropped: self.output_dropped.load(Ordering::Relaxed),
            ..Usage::default()
        };
        for p in live.values() {
            let u = p.read();
            t.commands += u.commands;
            t.bytes += u.bytes;
            t.device_ns += u.device_ns + p.running_ns(now);
            t.held_ns += u.held_ns;
            t.memory += u.memory;
            t.in_flight += u.in_flight;
            t.held += u.held;
            t.output_bytes += u.output_bytes;
            t.output_dropped += u.output_dropped;
        }
        t
    }

    /// Each live session's counters, by session id (device time of finished commands
    /// only: what the scheduler charges).
    pub fn live_usage(&self) -> Vec<(u64, Usage)> {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(id, p)| (*id, p.read()))
            .collect()
    }

    /// The VM's own cap on sessions, if it has one.
    pub fn max_sessions(&self) -> Option<usize> {
        Some(self.max_sessions.load(Ordering::Relaxed)).filter(|&n| n > 0)
    }

    /// Sets the VM's cap on sessions (live sessions over a lowered cap keep running;
    /// new ones are refused until the VM is under it).
    pub fn set_max_sessions(&self, n: usize) {
        self.max_sessions.store(n, Ordering::Relaxed);
    }

    /// The VM's share of device time.
    pub fn share(&self) -> u32 {
        self.share.load(Ordering::Relaxed).max(1)
    }

    /// Sets the VM's share of device time (at least 1); the scheduler uses it from its
    /// next tick.
    pub fn set_share(&self, share: u32) {
        self.share.store(share.max(1), Ordering::Relaxed);
    }

    /// Writes the scheduler's decision where the VM's API servers apply it.
    pub fn set_gate(&self, gate: Gate) -> std::io::Result<()> {
        let code = match gate {
            Gate::Run => 0,
            Gate::Hold => 1,
            Gate::Delay(_) => 2,
        };
        if self.decision.swap(code, Ordering::Relaxed) != code || code == 2 {
            self.page()?.page.set_gate(gate);
        }
        Ok(())
    }

    /// The scheduler's last decision for the VM, as a word.
    pub fn decision(&self) -> &'static str {
        match self.decision.load(Ordering::Relaxed) {
            1 => "hold",
            2 => "delay",
            _ => "run",
        }
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

    /// The VM's page, shared with its API servers.
    pub fn page(&self) -> std::io::Result<Arc<SharedVmPage>> {
        let mut p = self.page.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(page) = &*p {
            return Ok(page.clone());
        }
        let (page, fd) = VmPage::create()?;
        let shared = Arc::new(SharedVmPage { page, fd });
        *p = Some(shared.clone());
        Ok(shared)
    }

    /// Sets the VM's device-memory quota (`None`: unlimited); live sessions see it
    /// at their next allocation.
    pub fn set_mem_quota(&self, quota: Option<u64>) -> std::io::Result<()> {
        self.page()?.page.set_quota(quota);
        Ok(())
    }

    /// Sets the cap on the host memory of the VM's API servers together (`None`:
    /// none); fails when the daemon runs without `--cgroup`.
    pub fn set_host_mem(&self, cap: Option<u64>) -> std::io::Result<()> {
        match self.cgroup.get() {
            Some(c) => c.set_limit(cap),
            None => Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "host-memory caps need the daemon to run with --cgroup DIR",
            )),
        }
    }

    /// The host memory the VM's API servers use now, their cap and how many of them
    /// the kernel killed for it (all `None` without a cgroup).
    pub fn host_memory(&self) -> (Option<u64>, Option<u64>, Option<u64>) {
        match self.cgroup.get() {
            Some(c) => (c.usage(), c.limit(), c.oom_kills()),
            None => (None, None, None),
        }
    }

    /// The VM's memory quota and what its sessions hold now, in bytes.
    pub fn memory(&self) -> (Option<u64>, u64) {
        match &*self.page.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(p) => (p.page.quota(), p.page.used()),
            None => (None, 0),
        }
    }

    /// Gives back what an ended session still held (an API server that died before
    /// releasing its objects); its usage page is final once the process is reaped.
    pub fn session_ended(&self, final_usage: &Usage) {
        if final_usage.memory > 0
            && let Some(p) = &*self.page.lock().unwrap_or_else(|e| e.into_inner())
        {
            p.page.uncharge(final_usage.memory);
        }
    }

    /// What live session `id` has counted so far.
    pub fn usage_of(&self, id: u64) -> Option<Usage> {
        let now = hira_protocol::usage::monotonic_ns();
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .map(|p| {
                let mut u = p.read();
                u.device_ns += p.running_ns(now);
                u
            })
    }
}

/// All VMs' queues.
#[derive(Debug, Default)]
pub struct Vms {
    vms: Mutex<HashMap<String, Arc<Vm>>>,
}

impl Vms {
    /// The queue of VM `name`, created on first use.
    pub fn vm(&self, name: &str) -> Arc<Vm> {
        self.vms
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(name.to_string())
            .or_default()
            .clone()
    }

    /// The queue of VM `name`, if the daemon serves it or has seen it.
    pub fn get(&self, name: &str) -> Option<Arc<Vm>> {
        self.vms
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    /// Forgets VM `name` (removed at run time): a VM of that name added later starts
    /// afresh.
    pub fn forget(&self, name: &str) {
        self.vms
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
    }

    /// Every VM's queue, by name.
    pub fn snapshot(&self) -> Vec<(String, Arc<Vm>)> {
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
        let q = Arc::new(Vm::default());
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
    fn live_and_ended_sessions_count_into_their_vm() {
        let q = Arc::new(Vm::default());
        let (a, _fa) = UsagePage::create().unwrap();
        let (b, _fb) = UsagePage::create().unwrap();
        let (a, b) = (Arc::new(a), Arc::new(b));
        let ta = q.track(1, a.clone());
        let _tb = q.track(2, b.clone());
        a.command(1, 10);
        b.command(1, 5);
        assert_eq!(q.totals(), (2, 15));
        drop(ta);
        // An ended session's counts stay with the VM; later ones of the page do not.
        a.command(1, 100);
        b.command(1, 1);
        assert_eq!(q.totals(), (3, 16));
    }

    #[test]
    fn a_dead_sessions_memory_goes_back_to_its_vm() {
        let q = Arc::new(Vm::default());
        q.set_mem_quota(Some(1000)).unwrap();
        let api_server = VmPage::map(&q.page().unwrap().fd).unwrap();
        api_server.charge(700).unwrap();
        assert_eq!(q.memory(), (Some(1000), 700));
        q.session_ended(&Usage {
            memory: 700,
            ..Usage::default()
        });
        assert_eq!(q.memory(), (Some(1000), 0));
        q.set_mem_quota(None).unwrap();
        assert_eq!(q.memory(), (None, 0));
    }

    #[test]
    fn same_vm_name_shares_a_queue() {
        let r = Vms::default();
        assert!(Arc::ptr_eq(&r.vm("a"), &r.vm("a")));
        assert!(!Arc::ptr_eq(&r.vm("a"), &r.vm("b")));
    }
}
