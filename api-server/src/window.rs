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

/// Whether `fd` is a memfd, a file a guest may have made (procfs names it
/// `/memfd:...`). Where procfs cannot tell, it counts as one.
fn is_memfd(fd: &OwnedFd) -> bool {
    use std::os::unix::ffi::OsStrExt;
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_or(true, |p| p.as_os_str().as_bytes().starts_with(b"/memfd:"))
}

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
        // make this process fault on the mapping. Files that are not memfds, such as a
        // VM window the daemon created in /dev/shm, cannot be sealed (tmpfs reports
        // them sealed against sealing only) and are not the guest's.
        // SAFETY: F_GET_SEALS only reads the descriptor's seals.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals >= 0 && seals & libc::F_SEAL_SHRINK == 0 && is_memfd(fd) {
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

#[cfg(test)]
mod tests {
    use std::os::fd::FromRawFd;

    use super::*;

    fn memfd(len: u64, seals: libc::c_int) -> OwnedFd {
        // SAFETY: a NUL-terminated name and valid flags.
        let fd = unsafe {
            libc::memfd_create(c"w".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        assert!(fd >= 0);
        // SAFETY: memfd_create returned it and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain calls on a descriptor this test owns.
        unsafe {
            assert_eq!(libc::ftruncate(fd.as_raw_fd(), len as libc::off_t), 0);
            assert_eq!(libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals), 0);
        }
        fd
    }

    #[test]
    fn a_memfd_maps_only_sealed_against_shrinking_and_a_tmpfs_file_maps_as_it_is() {
        assert!(WindowMap::map(&memfd(1 << 20, libc::F_SEAL_SHRINK), 1 << 20, 0).is_ok());
        assert!(matches!(
            WindowMap::map(&memfd(1 << 20, 0), 1 << 20, 0),
            Err(WindowError::Unsealed)
        ));
        assert!(matches!(
            WindowMap::map(&memfd(1 << 20, libc::F_SEAL_SEAL), 1 << 20, 0),
            Err(WindowError::Unsealed)
        ));
        // A VM's window where operators put it: a tmpfs file, which cannot be sealed.
        let Ok(dir) = tempfile::Builder::new().tempdir_in("/dev/shm") else {
            eprintln!("skipped the tmpfs case: this machine has no /dev/shm");
            return;
        };
        let f = std::fs::File::create_new(dir.path().join("window")).unwrap();
        f.set_len(2 << 20).unwrap();
        let fd = OwnedFd::from(f);
        let m = WindowMap::map(&fd, 1 << 20, 1 << 20).unwrap();
        assert_eq!(m.len(), 1 << 20);
        assert!(matches!(
            WindowMap::map(&fd, 2 << 20, 1 << 20),
            Err(WindowError::SizeMismatch { .. })
        ));
    }
}
