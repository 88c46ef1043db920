//! Per-VM shared data windows (ivshmem).
//!
//! The daemon creates a shared-memory file per VM, which the operator gives QEMU as an
//! `ivshmem-plain` device. Each windowed session of the VM leases one slot of it, and
//! its API server maps only that slot. The slots are apart by allocation, not by
//! protection: an API server holds a descriptor of the whole file, and in the guest
//! whoever may map the device's BAR sees every slot. So the sessions of one VM are not
//! isolated from each other's data in the window (docs/threat-model.md); VMs are.

use std::fs::{File, OpenOptions};
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Slots per VM window unless configured (`window-slots`): this many sessions of a
/// VM can use the window (and rings) at once; the rest have their frames relayed.
pub const DEFAULT_SLOTS: u64 = 4;

/// A VM's window file and which slots are leased.
#[derive(Debug)]
pub struct VmWindow {
    path: PathBuf,
    slot_len: u64,
    leased: Mutex<Vec<Slot>>,
    /// Signalled when a slot is given back.
    freed: Condvar,
}

/// What a slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Free,
    Leased,
    /// Leased by a session whose guest has gone: free once its API server is reaped.
    Ending,
    /// Kept for a suspended session that will resume here: its rings are in it.
    Reserved,
    /// Leased, and reserved once the lease ends.
    LeasedReserved,
}

/// One session's slot, returned when dropped.
#[derive(Debug)]
pub struct Lease<'a> {
    window: &'a VmWindow,
    index: usize,
    pub offset: u64,
    pub len: u64,
}

impl VmWindow {
    /// Creates (or resizes) the window file: `size` bytes in `slots` slots, readable
    /// only by us.
    pub fn create(path: &Path, size: u64, slots: u64) -> std::io::Result<VmWindow> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        f.set_len(size)?;
        // Page-aligned slots, as the API server maps them.
        let slots = slots.max(1);
        let slot_len = (size / slots) & !4095;
        Ok(VmWindow {
            path: path.to_path_buf(),
            slot_len,
            leased: Mutex::new(vec![
                Slot::Free;
                if slot_len == 0 { 0 } else { slots as usize }
            ]),
            freed: Condvar::new(),
        })
    }

    /// A free slot, if any.
    pub fn lease(&self) -> Option<Lease<'_>> {
        self.lease_within(Duration::ZERO)
    }

    /// A free slot; if there is none but sessions whose guests have gone hold some,
    /// waits up to `wait` for one of them to end. A guest that runs programs one
    /// after another would otherwise find the slots taken by its own last programs'
    /// sessions, whose API servers are still releasing what they held, and have its
    /// next sessions relayed.
    pub fn lease_within(&self, wait: Duration) -> Option<Lease<'_>> {
        let deadline = Instant::now() + wait;
        let mut l = self.leased.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(index) = l.iter().position(|s| *s == Slot::Free) {
                l[index] = Slot::Leased;
                return Some(self.lease_of(index));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !l.contains(&Slot::Ending) {
                return None;
            }
            l = self
                .freed
                .wait_timeout(l, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn lease_of(&self, index: usize) -> Lease<'_> {
        Lease {
            window: self,
            index,
            offset: index as u64 * self.slot_len,
            len: self.slot_len,
        }
    }

    /// The slot at `offset` of `len` bytes, if that is one of this window's.
    fn index_of(&self, offset: u64, len: u64) -> Option<usize> {
        let n = self.leased.lock().unwrap_or_else(|e| e.into_inner()).len();
        (self.slot_len > 0 && len == self.slot_len && offset.is_multiple_of(self.slot_len))
            .then(|| (offset / self.slot_len) as usize)
            .filter(|&i| i < n)
    }

    /// Keeps the slot at `offset` for a suspended session that will resume here
    /// (once its current lease, if any, ends). False if there is no such slot or it
    /// is kept already.
    pub fn reserve(&self, offset: u64, len: u64) -> bool {
        let Some(i) = self.index_of(offset, len) else {
            return false;
        };
        let mut l = self.leased.lock().unwrap_or_else(|e| e.into_inner());
        l[i] = match l[i] {
            Slot::Free => Slot::Reserved,
            Slot::Leased | Slot::Ending => Slot::LeasedReserved,
            _ => return false,
        };
        true
    }

    /// Gives back a reservation that will not be used.
    pub fn unreserve(&self, offset: u64, len: u64) {
        if let Some(i) = self.index_of(offset, len) {
            let mut l = self.leased.lock().unwrap_or_else(|e| e.into_inner());
            l[i] = match l[i] {
                Slot::Reserved => Slot::Free,
                Slot::LeasedReserved => Slot::Leased,
                s => s,
            };
        }
    }

    /// The reserved slot at `offset`, for the session resuming in it.
    pub fn lease_reserved(&self, offset: u64, len: u64) -> Option<Lease<'_>> {
        let i = self.index_of(offset, len)?;
        let mut l = self.leased.lock().unwrap_or_else(|e| e.into_inner());
        (l[i] == Slot::Reserved).then(|| {
            l[i] = Slot::Leased;
        })?;
        Some(self.lease_of(i))
    }

    /// A descriptor of the window file, for the API server.
    pub fn open(&self) -> std::io::Result<OwnedFd> {
        Ok(File::options()
            .read(true)
            .write(true)
            .open(&self.path)?
            .into())
    }
}

impl Lease<'_> {
    /// The session's guest has gone: a new session may wait for this slot.
    pub fn ending(&self) {
        let mut l = self.window.leased.lock().unwrap_or_else(|e| e.into_inner());
        if l[self.index] == Slot::Leased {
            l[self.index] = Slot::Ending;
        }
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let mut l = self.window.leased.lock().unwrap_or_else(|e| e.into_inner());
        l[self.index] = match l[self.index] {
            Slot::LeasedReserved => Slot::Reserved,
            _ => Slot::Free,
        };
        self.window.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_disjoint_page_aligned_and_reusable() {
        let dir = tempfile::tempdir().unwrap();
        let w = VmWindow::create(&dir.path().join("w"), 64 << 20, DEFAULT_SLOTS).unwrap();
        let a = w.lease().unwrap();
        let b = w.lease().unwrap();
        assert_eq!((a.offset, a.len, b.offset), (0, 16 << 20, 16 << 20));
        let (c, d) = (w.lease().unwrap(), w.lease().unwrap());
        assert!(w.lease().is_none(), "four slots");
        let freed = b.offset;
        drop(b);
        assert_eq!(w.lease().unwrap().offset, freed);
        drop((a, c, d));
    }

    #[test]
    fn a_new_session_waits_for_a_slot_whose_session_is_ending_and_for_no_other() {
        let dir = tempfile::tempdir().unwrap();
        let w = VmWindow::create(&dir.path().join("w"), 4 << 20, 2).unwrap();
        let (a, b) = (w.lease().unwrap(), w.lease().unwrap());
        // Both sessions live: no wait, however long allowed.
        let t = Instant::now();
        assert!(w.lease_within(Duration::from_secs(60)).is_none());
        assert!(t.elapsed() < Duration::from_secs(30));
        // One's guest has gone: its slot is waited for until its session ends.
        b.ending();
        let offset = b.offset;
        std::thread::scope(|s| {
            let waiter = s.spawn(|| w.lease_within(Duration::from_secs(60)).map(|l| l.offset));
            // (It waits on the slot, or finds it free if it looks only after.)
            drop(b);
            assert_eq!(waiter.join().unwrap(), Some(offset));
        });
        // Ending but never ended: the wait is bounded.
        let c = w.lease().unwrap();
        c.ending();
        assert!(w.lease_within(Duration::from_millis(10)).is_none());
        drop((a, c));
    }

    #[test]
    fn a_reserved_slot_goes_only_to_its_resuming_session() {
        let dir = tempfile::tempdir().unwrap();
        let w = VmWindow::create(&dir.path().join("w"), 4 << 20, 2).unwrap();
        let a = w.lease().unwrap();
        let (offset, len) = (a.offset, a.len);
        assert!(w.reserve(offset, len));
        assert!(!w.reserve(offset, len), "once");
        assert!(w.lease_reserved(offset, len).is_none(), "still leased");
        drop(a);
        let b = w.lease().unwrap();
        assert_ne!(b.offset, offset, "a new session gets another slot");
        assert!(w.lease().is_none());
        let r = w.lease_reserved(offset, len).unwrap();
        assert_eq!(r.offset, offset);
        drop(r);
        assert!(!w.reserve(offset + 1, len), "not a slot");
        assert!(w.reserve(offset, len));
        w.unreserve(offset, len);
        assert!(w.lease().is_some());
    }

    #[test]
    fn the_slot_count_is_configurable() {
        let dir = tempfile::tempdir().unwrap();
        let w = VmWindow::create(&dir.path().join("w"), 64 << 20, 8).unwrap();
        let leases: Vec<_> = (0..8).map(|_| w.lease().unwrap()).collect();
        assert!(w.lease().is_none(), "eight slots");
        assert_eq!((leases[7].offset, leases[7].len), (7 * (8 << 20), 8 << 20));
    }

    #[test]
    fn window_file_has_the_requested_size() {
        let dir = tempfile::tempdir().unwrap();
        VmWindow::create(&dir.path().join("w"), 8 << 20, 2).unwrap();
        assert_eq!(
            std::fs::metadata(dir.path().join("w")).unwrap().len(),
            8 << 20
        );
    }
}
