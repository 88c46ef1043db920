//! The guest's shared data window, mapped into the API server.

use std::os::fd::{AsRawFd, OwnedFd};

use thiserror::Error;

/// Errors mapping the window.
#[derive(Debug, Error)]
pub enum WindowError {
    #[error("cannot stat the window descriptor")]
    Stat(#[source] std::io::Error),
    #[error("a {len}-byte window at offset {offset} does not fit the {actual}-byte region")]
    SizeMismatch { actual: u64, offset: u64, len: u64 },
    #[error("the window memfd is not sealed against shrinking")]
    Unsealed,
    #[error("cannot map the window")]
    Map(#[source] std::io::Error),
}

/// A mapping of the guest's window.
#[derive(Debug)]
pub struct WindowMap {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping lives as long as the value; concurrent access to its bytes is by
// raw pointer only, as shared memory with an untrusted peer must be.
unsafe impl Send for WindowMap {}
// SAFETY: as above.
unsafe impl Sync for WindowMap {}

impl WindowMap {
    /// Maps `len` bytes of `fd` from `offset` (page-aligned); they must lie in the file.
    pub fn map(fd: &OwnedFd, len: u64, offset: u64) -> Result<Self, WindowError> {
        // SAFETY: fstat fills a zeroed stat struct for a valid descriptor.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open; `st` is a valid out-pointer.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(WindowError::Stat(std::io::Error::last_os_error()));
        }
        let actual = st.st_size as u64;
        // A memfd must be sealed against shrinking, or the guest could truncate it and
        // make this process fault on the mapping. (Files that are not memfds, such as a
        // VM window the daemon created, cannot be sealed and are not the guest's.)
        // SAFETY: F_GET_SEALS only reads the descriptor's seals.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals >= 0 && seals & libc::F_SEAL_SHRINK == 0 {
            return Err(WindowError::Unsealed);
        }
        let fits = offset.checked_add(len).is_some_and(|end| end <= actual);
        if !fits || len == 0 || !offset.is_multiple_of(4096) {
            return Err(WindowError::SizeMismatch {
                actual,
                offset,
                len,
            });
        }
        // SAFETY: mapping `len` bytes at a page-aligned offset inside a valid
        // descriptor's file, shared, at an address the kernel picks.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(WindowError::Map(std::io::Error::last_os_error()));
        }
        Ok(WindowMap {
            base: base.cast(),
            len: len as usize,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Pointer to `offset` if `offset + len` lies inside the window.
    pub fn at(&self, offset: u64, len: u64) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        if end > self.len as u64 {
            return None;
        }
        // SAFETY: offset < len of the mapping, checked above.
        Some(unsafe { self.base.add(offset as usize) })
    }
}

impl Drop for WindowMap {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `map`.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}
