//! A session's usage counters, shared between the daemon and the API server.
//!
//! With the data plane on shared-memory rings the daemon no longer sees a session's
//! frames, so the API server counts what it receives into one page the daemon created
//! and handed it at start; the daemon reads the page whenever it reports (the control
//! socket, its logs, the per-VM totals). Counting costs the API server a few relaxed
//! stores per frame and no message.
//!
//! Layout (little-endian, each `u64` unless said): `commands` at 0 (request frames
//! received), `bytes` at 8 (their bodies), `rejected` at 16 (frames refused before
//! execution), `last_opcode` (`u32`) at 24, the opcode of the last request plus one
//! (0: none yet), `memory` at 32 (device memory the session holds, as charged to its
//! VM's quota), `device_ns` at 40 (device time of its finished commands, from the host
//! API's own timestamps), `in_flight` at 48 (its measured commands enqueued and not
//! finished), `held` at 56 (those of them held back by the VM's scheduling decision),
//! `held_ns` at 64 (the time commands spent held: the queue delay the scheduler
//! added), `finished` at 72 (measured commands finished), and the commands running
//! now as a count at 88 and the sum of their start times at 96 (CLOCK_MONOTONIC ns),
//! under a sequence counter at 80 (odd while the API server updates them), so that
//! the device time of commands still running is known at any moment. What the
//! host's library printed for the session (a kernel's `printf`, a compiler's
//! diagnostics): `output_bytes` at 104, the bytes sent to the guest, and
//! `output_dropped` at 112, the bytes dropped over the session's bound.
//!
//! Only the API server writes the page; the daemon only reads numbers from it, so a
//! compromised API server can misstate its own session's usage and nothing else.
//!
//! A [`VmPage`] is the same kind of page, one per VM, mapped by the daemon and by
//! every API server of that VM: the VM's device-memory quota (the daemon writes it,
//! live) and the memory its sessions hold together (each API server charges and
//! uncharges atomically, so sessions of one VM share one quota without a message).
//! Layout: `quota` at 0 (bytes; 0: none), `used` at 8, the scheduling `decision` at 16
//! (0: run, 1: hold, 2: delay each command by `delay_ns` at 24), written by the daemon
//! at each scheduling tick and read by the API servers where commands reach the
//! device. Only that VM's API servers map it, so a compromised one can misstate its
//! own VM's memory and ignore its own VM's decisions, and nothing else.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const LEN: usize = 4096;

/// Maps the page behind `fd`, which must be at least a page long and sealed against
/// shrinking (so the mapping can never lose its backing).
fn map_page(fd: &OwnedFd) -> std::io::Result<crate::shm::Mapping> {
    let info = crate::shm::inspect(fd)?;
    if info.size < LEN as u64 || !info.sealed_against_shrinking() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "shared page too small or not sealed",
        ));
    }
    crate::shm::Mapping::map(fd, 0, LEN)
}

/// The atomic `u64` at `off` of a mapped page.
///
/// # Safety
/// `base` must be a live `LEN`-byte mapping for `'a`, accessed only atomically, and
/// `off` 8-aligned and below `LEN`.
unsafe fn word<'a>(base: *mut u8, off: usize) -> &'a AtomicU64 {
    debug_assert!(off.is_multiple_of(8) && off < LEN);
    // SAFETY: per the contract.
    unsafe { &*(base.add(off) as *const AtomicU64) }
}

/// Adds `delta` to a counter, never below zero.
fn add_signed(w: &AtomicU64, delta: i64) {
    if delta >= 0 {
        w.fetch_add(delta as u64, Ordering::Relaxed);
    } else {
        let d = delta.unsigned_abs();
        let _ = w.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            Some(v.saturating_sub(d))
        });
    }
}

/// CLOCK_MONOTONIC now, in ns: the clock the usage page's start times use (the same
/// in every process on the host).
pub fn monotonic_ns() -> u64 {
    // SAFETY: a zeroed timespec is a valid out-parameter for clock_gettime.
    let mut t: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: CLOCK_MONOTONIC is always available; `t` is valid for writes.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// A VM's scheduling decision as its page carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Commands reach the device at once.
    Run,
    /// Commands wait until the decision changes.
    Hold,
    /// Each command waits this many ns.
    Delay(u64),
}

/// A mapping of a usage page.
#[derive(Debug)]
pub struct UsagePage {
    map: crate::shm::Mapping,
}

/// The counters as read at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub commands: u64,
    pub bytes: u64,
    pub rejected: u64,
    pub last_opcode: Option<u16>,
    /// Device memory the session holds, in bytes.
    pub memory: u64,
    /// Device time of the session's finished commands, in ns.
    pub device_ns: u64,
    /// Measured commands enqueued and not finished.
    pub in_flight: u64,
    /// Of those, the ones held back by the VM's scheduling decision.
    pub held: u64,
    /// Time commands spent held, in ns.
    pub held_ns: u64,
    /// Measured commands finished.
    pub finished: u64,
    /// Bytes the host's library printed that were sent to the guest.
    pub output_bytes: u64,
    /// Bytes it printed that exceeded the session's bound and were dropped.
    pub output_dropped: u64,
}

impl UsagePage {
    /// Creates a zeroed page in a fresh memfd (sealed against resizing) and maps it.
    pub fn create() -> std::io::Result<(UsagePage, OwnedFd)> {
        let fd = crate::shm::memfd(c"hira-usage", LEN as u64, crate::shm::FIXED)?;
        Ok((Self::map(&fd)?, fd))
    }

    /// Maps the page behind `fd`, which must be at least a page long and sealed
    /// against shrinking.
    pub fn map(fd: &OwnedFd) -> std::io::Result<UsagePage> {
        Ok(UsagePage { map: map_page(fd)? })
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `base` is this value's mapping; offsets used are constants below LEN.
        unsafe { word(self.map.as_ptr(), off) }
    }

    fn last(&self) -> &AtomicU32 {
        // SAFETY: as for `u64_at`.
        unsafe { &*(self.map.as_ptr().add(24) as *const AtomicU32) }
    }

    /// Counts a request of `bytes` body bytes (API server; one thread).
    pub fn command(&self, opcode: u16, bytes: u64) {
        self.u64_at(0).fetch_add(1, Ordering::Relaxed);
        self.u64_at(8).fetch_add(bytes, Ordering::Relaxed);
        self.last().store(u32::from(opcode) + 1, Ordering::Relaxed);
    }

    /// Counts a frame refused before execution (API server).
    pub fn rejected(&self) {
        self.u64_at(16).fetch_add(1, Ordering::Relaxed);
    }

    /// Records `delta` bytes more (or fewer) device memory held by the session (never
    /// below zero, whatever order charges and releases arrive in).
    pub fn memory(&self, delta: i64) {
        add_signed(self.u64_at(32), delta);
    }

    /// Adds the device time of a finished command (API server; any thread).
    pub fn device_time(&self, ns: u64) {
        self.u64_at(40).fetch_add(ns, Ordering::Relaxed);
        self.u64_at(72).fetch_add(1, Ordering::Relaxed);
    }

    /// A measured command was enqueued (`1`) or finished (`-1`).
    pub fn in_flight(&self, delta: i64) {
        add_signed(self.u64_at(48), delta);
    }

    /// A command was held back (`1`) or let through (`-1`).
    pub fn held(&self, delta: i64) {
        add_signed(self.u64_at(56), delta);
    }

    /// A held command was let through after `ns` ns.
    pub fn held_for(&self, ns: u64) {
        self.u64_at(64).fetch_add(ns, Ordering::Relaxed);
    }

    /// A measured command started running at `start` (CLOCK_MONOTONIC ns; `1`), or one
    /// that started at `start` stopped (`-1`). Callers serialise their updates.
    pub fn running(&self, start: u64, delta: i64) {
        let seq = self.u64_at(80);
        seq.fetch_add(1, Ordering::AcqRel);
        add_signed(self.u64_at(88), delta);
        if delta >= 0 {
            self.u64_at(96).fetch_add(start, Ordering::Relaxed);
        } else {
            add_signed(self.u64_at(96), -(start.min(i64::MAX as u64) as i64));
        }
        seq.fetch_add(1, Ordering::Release);
    }

    /// Counts what the host's library printed: `sent` bytes went to the guest,
    /// `dropped` exceeded the session's bound.
    pub fn output(&self, sent: u64, dropped: u64) {
        self.u64_at(104).fetch_add(sent, Ordering::Relaxed);
        self.u64_at(112).fetch_add(dropped, Ordering::Relaxed);
    }

    /// Device time of the commands running at `now` (CLOCK_MONOTONIC ns) so far.
    pub fn running_ns(&self, now: u64) -> u64 {
        for _ in 0..64 {
            let before = self.u64_at(80).load(Ordering::Acquire);
            let (n, sum) = (
                self.u64_at(88).load(Ordering::Acquire),
                self.u64_at(96).load(Ordering::Acquire),
            );
            if before.is_multiple_of(2) && self.u64_at(80).load(Ordering::Acquire) == before {
                return n.saturating_mul(now).saturating_sub(sum);
            }
            std::hint::spin_loop();
        }
        0
    }

    /// The counters now.
    pub fn read(&self) -> Usage {
        let last = self.last().load(Ordering::Relaxed);
        Usage {
            commands: self.u64_at(0).load(Ordering::Relaxed),
            bytes: self.u64_at(8).load(Ordering::Relaxed),
            rejected: self.u64_at(16).load(Ordering::Relaxed),
            last_opcode: last.checked_sub(1).and_then(|o| u16::try_from(o).ok()),
            memory: self.u64_at(32).load(Ordering::Relaxed),
            device_ns: self.u64_at(40).load(Ordering::Relaxed),
            in_flight: self.u64_at(48).load(Ordering::Relaxed),
            held: self.u64_at(56).load(Ordering::Relaxed),
            held_ns: self.u64_at(64).load(Ordering::Relaxed),
            finished: self.u64_at(72).load(Ordering::Relaxed),
            output_bytes: self.u64_at(104).load(Ordering::Relaxed),
            output_dropped: self.u64_at(112).load(Ordering::Relaxed),
        }
    }
}

/// A mapping of a VM's page: its device-memory quota and what its sessions hold.
#[derive(Debug)]
pub struct VmPage {
    map: crate::shm::Mapping,
}

/// Why a charge was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverQuota {
    pub used: u64,
    pub quota: u64,
}

impl VmPage {
    /// Creates a zeroed page (no quota, nothing used) and maps it.
    pub fn create() -> std::io::Result<(VmPage, OwnedFd)> {
        let fd = crate::shm::memfd(c"hira-vm", LEN as u64, crate::shm::FIXED)?;
        Ok((Self::map(&fd)?, fd))
    }

    /// Maps the page behind `fd` (at least a page, sealed against shrinking).
    pub fn map(fd: &OwnedFd) -> std::io::Result<VmPage> {
        Ok(VmPage { map: map_page(fd)? })
    }

    fn quota_word(&self) -> &AtomicU64 {
        // SAFETY: `base` is this value's mapping; 0 is aligned and inside it.
        unsafe { word(self.map.as_ptr(), 0) }
    }

    fn used_word(&self) -> &AtomicU64 {
        // SAFETY: as above, offset 8.
        unsafe { word(self.map.as_ptr(), 8) }
    }

    /// Sets the quota in bytes (`None`: no quota). Takes effect at the next charge;
    /// memory already held is never taken back.
    pub fn set_quota(&self, quota: Option<u64>) {
        self.quota_word()
            .store(quota.unwrap_or(0), Ordering::Relaxed);
    }

    /// The quota in bytes, if any.
    pub fn quota(&self) -> Option<u64> {
        Some(self.quota_word().load(Ordering::Relaxed)).filter(|&q| q != 0)
    }

    /// Device memory the VM's sessions hold now.
    pub fn used(&self) -> u64 {
        self.used_word().load(Ordering::Relaxed)
    }

    /// Charges `bytes` to the VM if that keeps it within its quota.
    pub fn charge(&self, bytes: u64) -> Result<(), OverQuota> {
        let quota = self.quota();
        self.used_word()
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                let after = used.checked_add(bytes)?;
                match quota {
                    Some(q) if after > q => None,
                    _ => Some(after),
                }
            })
            .map(|_| ())
            .map_err(|used| OverQuota {
                used,
                quota: quota.unwrap_or(u64::MAX),
            })
    }

    /// Sets the scheduling decision (daemon).
    pub fn set_gate(&self, gate: Gate) {
        // SAFETY: `base` is this value's mapping; 16 and 24 are aligned and inside it.
        let (decision, delay) =
            unsafe { (word(self.map.as_ptr(), 16), word(self.map.as_ptr(), 24)) };
        match gate {
            Gate::Run => decision.store(0, Ordering::Release),
            Gate::Hold => decision.store(1, Ordering::Release),
            Gate::Delay(ns) => {
                delay.store(ns, Ordering::Relaxed);
                decision.store(2, Ordering::Release);
            }
        }
    }

    /// The scheduling decision now (API servers). Anything unknown reads as `Run`.
    pub fn gate(&self) -> Gate {
        // SAFETY: as in `set_gate`.
        let (decision, delay) =
            unsafe { (word(self.map.as_ptr(), 16), word(self.map.as_ptr(), 24)) };
        match decision.load(Ordering::Acquire) {
            1 => Gate::Hold,
            2 => Gate::Delay(delay.load(Ordering::Relaxed)),
            _ => Gate::Run,
        }
    }

    /// Gives back `bytes` charged earlier (never below zero).
    pub fn uncharge(&self, bytes: u64) {
        let _ = self
            .used_word()
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                Some(v.saturating_sub(bytes))
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_written_by_one_mapping_are_read_by_another() {
        let (writer, fd) = UsagePage::create().unwrap();
        let reader = UsagePage::map(&fd).unwrap();
        assert_eq!(reader.read(), Usage::default());
        writer.command(7, 100);
        writer.command(9, 20);
        writer.rejected();
        assert_eq!(
            reader.read(),
            Usage {
                commands: 2,
                bytes: 120,
                rejected: 1,
                last_opcode: Some(9),
                ..Usage::default()
            }
        );
        writer.device_time(1500);
        writer.in_flight(2);
        writer.in_flight(-1);
        writer.held(1);
        writer.held(-5);
        writer.held_for(700);
        writer.running(1_000, 1);
        writer.running(4_000, 1);
        assert_eq!(reader.running_ns(5_000), 4_000 + 1_000);
        writer.running(1_000, -1);
        assert_eq!(reader.running_ns(6_000), 2_000);
        writer.running(4_000, -1);
        assert_eq!(reader.running_ns(9_000), 0);
        let u = reader.read();
        assert_eq!(
            (u.device_ns, u.in_flight, u.held, u.held_ns),
            (1500, 1, 0, 700)
        );
        writer.memory(4096);
        writer.memory(-100_000);
        assert_eq!(reader.read().memory, 0, "never below zero");
        writer.output(30, 0);
        writer.output(12, 4000);
        let u = reader.read();
        assert_eq!((u.output_bytes, u.output_dropped), (42, 4000));
    }

    #[test]
    fn sessions_of_one_vm_share_its_quota() {
        let (daemon, fd) = VmPage::create().unwrap();
        let a = VmPage::map(&fd).unwrap();
        let b = VmPage::map(&fd).unwrap();
        assert_eq!(a.charge(1 << 40), Ok(()), "no quota: anything goes");
        a.uncharge(1 << 40);
        daemon.set_quota(Some(100));
        assert_eq!(a.charge(60), Ok(()));
        assert_eq!(
            b.charge(50),
            Err(OverQuota {
                used: 60,
                quota: 100
            })
        );
        assert_eq!(b.charge(40), Ok(()));
        assert_eq!(daemon.used(), 100);
        a.uncharge(60);
        assert_eq!(b.charge(50), Ok(()));
        daemon.set_quota(Some(10));
        assert_eq!(daemon.used(), 90, "a lower quota takes nothing back");
        assert!(a.charge(1).is_err());
        b.uncharge(1000);
        assert_eq!(daemon.used(), 0);
        assert_eq!(
            a.charge(u64::MAX).map_err(|e| e.used),
            Err(0),
            "no overflow"
        );
    }
}
