//! The guest's shared data window, mapped into the API server.

use std::os::fd::OwnedFd;

use hira_protocol::shm;

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
    map: shm::Mapping,
}

impl WindowMap {
    /// Maps `len` bytes of `fd` from `offset` (page-aligned); they must lie in the file.
    pub fn map(fd: &OwnedFd, len: u64, offset: u64) -> Result<Self, WindowError> {
        let info = shm::inspect(fd).map_err(WindowError::Stat)?;
        // A memfd must be sealed against shrinking, or the guest could truncate it and
        // make this process fault on the mapping. Files that are not memfds, such as a
        // VM window the daemon created in /dev/shm, cannot be sealed and are not the
        // guest's.
        if info.memfd && !info.sealed_against_shrinking() {
            return Err(WindowError::Unsealed);
        }
        let fits = offset.checked_add(len).is_some_and(|end| end <= info.size);
        if !fits || len == 0 || !offset.is_multiple_of(4096) {
            return Err(WindowError::SizeMismatch {
                actual: info.size,
                offset,
                len,
            });
        }
        let map = shm::Mapping::map(fd, offset, len as usize).map_err(WindowError::Map)?;
        Ok(WindowMap { map })
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Pointer to `offset` if `offset + len` lies inside the window.
    pub fn at(&self, offset: u64, len: u64) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        if end > self.len() as u64 {
            return None;
        }
        // SAFETY: offset < len of the mapping, checked above.
        Some(unsafe { self.map.as_ptr().add(offset as usize) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memfd(len: u64, seals: libc::c_int) -> OwnedFd {
        shm::memfd(c"w", len, seals).unwrap()
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
