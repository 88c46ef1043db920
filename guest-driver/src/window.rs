//! The shared data window: a memfd mapped by the guest and, through the fd it passes at
//! handshake, by the host. Bulk arguments are copied into a region of it and named in
//! the frame by a span, so they cross no socket.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Mutex;

use thiserror::Error;

/// Errors setting up the window.
#[derive(Debug, Error)]
pub enum WindowError {
    #[error("memfd_create failed")]
    Create(#[source] std::io::Error),
    #[error("sizing the window to {1} bytes failed")]
    Resize(#[source] std::io::Error, u64),
    #[error("mapping the window failed")]
    Map(#[source] std::io::Error),
}

/// A mapped window and its allocator.
#[derive(Debug)]
pub struct Window {
    /// The memfd to pass to the host (none for a VM's ivshmem window).
    fd: Option<OwnedFd>,
    /// The whole mapping, unmapped on drop.
    map: *mut u8,
    map_len: usize,
    /// This session's part of it.
    base: *mut u8,
    len: usize,
    /// Allocated regions as (offset, len), sorted by offset.
    used: Mutex<Vec<(usize, usize)>>,
}

// SAFETY: the mapping is shared memory owned by this value for its whole life; regions
// are handed out disjointly under the `used` lock, so threads never alias a region.
unsafe impl Send for Window {}
// SAFETY: as above; all mutation of allocator state goes through the mutex.
unsafe impl Sync for Window {}

/// A region of the window, returned to the allocator when dropped.
#[derive(Debug)]
pub struct WindowRegion<'a> {
    window: &'a Window,
    pub offset: usize,
    pub len: usize,
}

impl Window {
    /// Creates and maps a window of `len` bytes.
    pub fn create(len: u64) -> Result<Window, WindowError> {
        // SAFETY: the name is a NUL-terminated string literal; flags are valid.
        let raw = unsafe {
            libc::memfd_create(
                c"hira-window".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(WindowError::Create(std::io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a freshly created fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: `fd` is a valid memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(WindowError::Resize(std::io::Error::last_os_error(), len));
        }
        // The host refuses a window that could shrink under its mapping.
        // SAFETY: `fd` is a valid memfd created with MFD_ALLOW_SEALING.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) } != 0 {
            return Err(WindowError::Resize(std::io::Error::last_os_error(), len));
        }
        // SAFETY: mapping a valid fd of `len` bytes, shared, at an address the kernel picks.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(WindowError::Map(std::io::Error::last_os_error()));
        }
        Ok(Window {
            fd: Some(fd),
            map: base as *mut u8,
            map_len: len as usize,
            base: base as *mut u8,
            len: len as usize,
            used: Mutex::new(Vec::new()),
        })
    }

    /// This session's slot (`offset`, `len`) of the VM's shared window: BAR 2 of the
    /// ivshmem device (PCI 1af4:1110), mapped through sysfs. `None` if there is no
    /// such device, the process may not open it, or the slot does not fit.
    pub fn ivshmem(offset: u64, len: u64) -> Option<Window> {
        let file = std::fs::File::from(ivshmem_bar()?);
        let map_len = file.metadata().ok()?.len() as usize;
        let end = offset.checked_add(len)?;
        if len == 0 || end > map_len as u64 {
            return None;
        }
        // SAFETY: mapping the whole BAR file, shared, at an address the kernel picks.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return None;
        }
        Some(Window {
            fd: None,
            map: map as *mut u8,
            map_len,
            // SAFETY: offset + len <= map_len, checked above.
            base: unsafe { (map as *mut u8).add(offset as usize) },
            len: len as usize,
            used: Mutex::new(Vec::new()),
        })
    }

    /// The memfd to pass to the host, for a window this process created.
    pub fn fd(&self) -> Option<&OwnedFd> {
        self.fd.as_ref()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Allocates `len` bytes (first fit, 64-byte aligned), or `None` if no gap is big
    /// enough right now; callers then send inline.
    pub fn alloc(&self, len: usize) -> Option<WindowRegion<'_>> {
        let len = len.max(1).checked_add(63)? & !63;
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        let mut at = 0usize;
        let mut index = used.len();
        for (i, &(off, l)) in used.iter().enumerate() {
            if off - at >= len {
                index = i;
                break;
            }
            at = off + l;
        }
        if index == used.len() && self.len.checked_sub(at)? < len {
            return None;
        }
        used.insert(index, (at, len));
        Some(WindowRegion {
            window: self,
            offset: at,
            len,
        })
    }

    fn free(&self, offset: usize) {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        used.retain(|&(o, _)| o != offset);
    }
}

/// BAR 2 of the VM's ivshmem device (PCI 1af4:1110), opened for mapping through
/// sysfs; `None` if there is no such device or the process may not open it.
pub fn ivshmem_bar() -> Option<OwnedFd> {
    let dev = std::fs::read_dir("/sys/bus/pci/devices")
        .ok()?
        .flatten()
        .find(|d| {
            let id = |f: &str| std::fs::read_to_string(d.path().join(f)).unwrap_or_default();
            id("vendor").trim() == "0x1af4" && id("device").trim() == "0x1110"
        })?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dev.path().join("resource2"))
        .ok()?;
    Some(file.into())
}

impl WindowRegion<'_> {
    /// Start of the region in this process.
    pub fn ptr(&self) -> *mut u8 {
        // SAFETY: offset + len lies inside the mapping, by construction in `alloc`.
        unsafe { self.window.base.add(self.offset) }
    }
}

impl Drop for WindowRegion<'_> {
    fn drop(&mut self) {
        self.window.free(self.offset);
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `create` or `ivshmem`; no
        // region outlives the window because regions borrow it.
        unsafe { libc::munmap(self.map as *mut libc::c_void, self.map_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_do_not_overlap() {
        let w = Window::create(4096).unwrap();
        let a = w.alloc(100).unwrap();
        let b = w.alloc(100).unwrap();
        assert!(a.offset + a.len <= b.offset);
    }

    #[test]
    fn freed_region_is_reused() {
        let w = Window::create(4096).unwrap();
        let first = w.alloc(4000).unwrap().offset;
        let again = w.alloc(4000).unwrap();
        assert_eq!(again.offset, first);
    }

    #[test]
    fn request_larger_than_free_space_fails() {
        let w = Window::create(4096).unwrap();
        let _hold = w.alloc(3000).unwrap();
        assert!(w.alloc(2000).is_none());
    }

    #[test]
    fn region_memory_is_writable() {
        let w = Window::create(4096).unwrap();
        let r = w.alloc(16).unwrap();
        // SAFETY: the region covers at least 16 bytes of the mapping.
        unsafe { std::ptr::write_bytes(r.ptr(), 0x5A, 16) };
        // SAFETY: as above.
        assert_eq!(unsafe { *r.ptr().add(15) }, 0x5A);
    }
}
