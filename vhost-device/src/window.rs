//! Per-VM shared data windows (ivshmem).
//!
//! The daemon creates a shared-memory file per VM, which the operator gives QEMU as an
//! `ivshmem-plain` device. Each windowed session of the VM leases one slot of it, so
//! processes of one VM never share bytes; the API server maps only its session's slot.

use std::fs::{File, OpenOptions};
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Slots per VM window unless configured (`window-slots`): this many sessions of a
/// VM can use the window (and rings) at once; the rest have their frames relayed.
pub const DEFAULT_SLOTS: u64 = 4;

/// A VM's window file and which slots are leased.
#[derive(Debug)]
pub struct VmWindow {
    path: PathBuf,
    slot_len: u64,
    leased: Mutex<Vec<bool>>,
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
            leased: Mutex::new(vec![false; if slot_len == 0 { 0 } else { slots as usize }]),
        })
    }

    /// A free slot, if any.
    pub fn lease(&self) -> Option<Lease<'_>> {
        let mut l = self.leased.lock().unwrap_or_else(|e| e.into_inner());
        let index = l.iter().position(|used| !used)?;
        l[index] = true;
        Some(Lease {
            window: self,
            index,
            offset: index as u64 * self.slot_len,
            len: self.slot_len,
        })
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

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let mut l = self.window.leased.lock().unwrap_or_else(|e| e.into_inner());
        l[self.index] = false;
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
