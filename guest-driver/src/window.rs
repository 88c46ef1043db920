//! The shared data window: a memfd mapped by the guest and, through the fd it passes at
//! handshake, by the host. Bulk arguments are copied into a region of it and named in
//! the frame by a span, so they cross no socket.

use std::os::fd::OwnedFd;
use std::sync::Mutex;

use hira_protocol::shm;
use thiserror::Error;

/// Errors setting up the window.
#[derive(Debug, Error)]
pub enum WindowError {
    #[error("cannot make the window's memfd: {0}")]
    Create(#[source] std::io::Error),
    #[error("mapping the window failed: {0}")]
    Map(#[source] std::io::Error),
}

/// A mapped window and its allocator.
#[derive(Debug)]
pub struct Window {
    /// The memfd to pass to the host (none for a VM's ivshmem window).
    fd: Option<OwnedFd>,
    /// The whole mapping, held until the window goes (regions borrow the window, so
    /// none outlives it).
    _mapping: shm::Mapping,
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
    /// Creates and maps a window of `len` bytes, sealed against shrinking (the host
    /// refuses a window that could shrink under its mapping).
    pub fn create(len: u64) -> Result<Window, WindowError> {
        let fd = shm::memfd(c"hira-window", len, shm::NO_SHRINK).map_err(WindowError::Create)?;
        let map = shm::Mapping::map(&fd, 0, len as usize).map_err(WindowError::Map)?;
        Ok(Window {
            fd: Some(fd),
            base: map.as_ptr(),
            len: len as usize,
            _mapping: map,
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
        let map = shm::Mapping::map(&file, 0, map_len).ok()?;
        Some(Window {
            fd: None,
            // SAFETY: offset + len <= map_len, checked above.
            base: unsafe { map.as_ptr().add(offset as usize) },
            len: len as usize,
            _mapping: map,
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

    /// Bytes not allocated now (in any number of gaps).
    pub fn unallocated(&self) -> usize {
        let used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        self.len - used.iter().map(|&(_, l)| l).sum::<usize>()
    }

    /// The offset in this window of the `len` bytes at `ptr`, if they lie inside it.
    pub fn offset_of(&self, ptr: *const u8, len: usize) -> Option<usize> {
        let offset = (ptr as usize).checked_sub(self.base as usize)?;
        (offset.checked_add(len)? <= self.len).then_some(offset)
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
    fn only_bytes_inside_the_window_have_an_offset() {
        let w = Window::create(8192).unwrap();
        let r = w.alloc(100).unwrap();
        let p = r.ptr();
        // SAFETY: only compared, never dereferenced.
        let inside = unsafe { p.add(8) };
        assert_eq!(w.offset_of(inside, 92), Some(r.offset + 8));
        assert_eq!(w.offset_of(p, 8193 - r.offset), None, "past the end");
        let outside = [0u8; 4];
        assert_eq!(w.offset_of(outside.as_ptr(), 4), None);
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
