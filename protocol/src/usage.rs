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
//! (0: none yet).
//!
//! Only the API server writes the page; the daemon only reads numbers from it, so a
//! compromised API server can misstate its own session's usage and nothing else.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const LEN: usize = 4096;

/// A mapping of a usage page.
#[derive(Debug)]
pub struct UsagePage {
    base: *mut u8,
}

// SAFETY: the mapping lives as long as the value and is only accessed atomically.
unsafe impl Send for UsagePage {}
// SAFETY: as above.
unsafe impl Sync for UsagePage {}

impl Drop for UsagePage {
    fn drop(&mut self) {
        // SAFETY: `base` is the `LEN`-byte mapping made in `map`.
        unsafe { libc::munmap(self.base.cast(), LEN) };
    }
}

/// The counters as read at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub commands: u64,
    pub bytes: u64,
    pub rejected: u64,
    pub last_opcode: Option<u16>,
}

impl UsagePage {
    /// Creates a zeroed page in a fresh memfd (sealed against resizing) and maps it.
    pub fn create() -> std::io::Result<(UsagePage, OwnedFd)> {
        // SAFETY: valid C string and flags; the result is checked.
        let fd = unsafe {
            libc::memfd_create(
                c"hira-usage".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: memfd_create just returned this descriptor to this process.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain system calls on a descriptor this function owns.
        let ok = unsafe {
            libc::ftruncate(fd.as_raw_fd(), LEN as libc::off_t) == 0
                && libc::fcntl(
                    fd.as_raw_fd(),
                    libc::F_ADD_SEALS,
                    libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
                ) == 0
        };
        if !ok {
            return Err(std::io::Error::last_os_error());
        }
        Ok((Self::map(&fd)?, fd))
    }

    /// Maps the page behind `fd`, which must be at least a page long and sealed
    /// against shrinking.
    pub fn map(fd: &OwnedFd) -> std::io::Result<UsagePage> {
        // SAFETY: a zeroed stat struct is a valid out-parameter for fstat.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open; `st` is valid for writes.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: F_GET_SEALS only reads the descriptor's seals.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if (st.st_size as u64) < LEN as u64 || seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "usage page too small or not sealed",
            ));
        }
        // SAFETY: maps one page of a file at least that long, shared.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(UsagePage { base: base.cast() })
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        // SAFETY: an aligned offset inside the mapped page, which lives as long as
        // `self`; the page is only accessed atomically.
        unsafe { &*(self.base.add(off) as *const AtomicU64) }
    }

    fn last(&self) -> &AtomicU32 {
        // SAFETY: as for `u64_at`.
        unsafe { &*(self.base.add(24) as *const AtomicU32) }
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

    /// The counters now.
    pub fn read(&self) -> Usage {
        let last = self.last().load(Ordering::Relaxed);
        Usage {
            commands: self.u64_at(0).load(Ordering::Relaxed),
            bytes: self.u64_at(8).load(Ordering::Relaxed),
            rejected: self.u64_at(16).load(Ordering::Relaxed),
            last_opcode: last.checked_sub(1).and_then(|o| u16::try_from(o).ok()),
        }
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
                last_opcode: Some(9)
            }
        );
    }
}
