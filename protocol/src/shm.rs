//! Shared memory between Hira's processes: memfds sealed as their users need, what a
//! process checks of a file another one passed it, and mappings that unmap themselves.
//!
//! Every mapping of memory another process can write goes through [`Mapping`]; the
//! bytes behind it are reached only by raw-pointer copies and atomics, as memory shared
//! with an untrusted peer must be. Whether a file must be sealed before it is mapped is
//! the caller's rule (a guest's memfd must be; the daemon's VM window file cannot be),
//! made on the [`FileInfo`] that [`inspect`] reads.

use std::ffi::CStr;
use std::io::{Error, ErrorKind};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

/// The seals that keep a file's size fixed for good: no shrinking, no growing, no
/// further sealing.
pub const FIXED: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
/// The seal that keeps every mapping of a file backed: no shrinking.
pub const NO_SHRINK: libc::c_int = libc::F_SEAL_SHRINK;

/// A fresh zero-filled memfd named `name`, `len` bytes long, with `seals` added (none:
/// a memfd that cannot be sealed at all).
pub fn memfd(name: &CStr, len: u64, seals: libc::c_int) -> std::io::Result<OwnedFd> {
    let flags = if seals == 0 {
        libc::MFD_CLOEXEC
    } else {
        libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING
    };
    // SAFETY: a valid C string and valid flags; the result is checked.
    let raw = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    if raw < 0 {
        return Err(Error::last_os_error());
    }
    // SAFETY: memfd_create just returned this descriptor to this process.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let len = libc::off_t::try_from(len).map_err(|_| Error::from(ErrorKind::InvalidInput))?;
    // SAFETY: plain system calls on a descriptor this function owns.
    let ok = unsafe {
        libc::ftruncate(fd.as_raw_fd(), len) == 0
            && (seals == 0 || libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) == 0)
    };
    if !ok {
        return Err(Error::last_os_error());
    }
    Ok(fd)
}

/// What a file passed by another process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileInfo {
    pub size: u64,
    /// Its seals (`None`: a file that has none, not being in shared memory).
    pub seals: Option<libc::c_int>,
    /// Whether it is a memfd, a file any process may have made (procfs names it
    /// `/memfd:...`; where procfs cannot tell, it counts as one). A file in tmpfs
    /// (`/dev/shm`) is not: it reports itself sealed against sealing only, and cannot
    /// be sealed further.
    pub memfd: bool,
}

impl FileInfo {
    /// Whether the file can no longer shrink, so that no mapping of it can fault.
    pub fn sealed_against_shrinking(&self) -> bool {
        self.seals.is_some_and(|s| s & libc::F_SEAL_SHRINK != 0)
    }
}

/// Reads what `fd` is.
pub fn inspect(fd: &impl AsFd) -> std::io::Result<FileInfo> {
    use std::os::unix::ffi::OsStrExt;
    let raw = fd.as_fd().as_raw_fd();
    // SAFETY: a zeroed stat struct is a valid out-parameter for fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `raw` is open for as long as `fd` is borrowed; `st` is valid for writes.
    if unsafe { libc::fstat(raw, &mut st) } != 0 {
        return Err(Error::last_os_error());
    }
    // SAFETY: F_GET_SEALS only reads the descriptor's seals.
    let seals = unsafe { libc::fcntl(raw, libc::F_GET_SEALS) };
    let memfd = std::fs::read_link(format!("/proc/self/fd/{raw}"))
        .map_or(true, |p| p.as_os_str().as_bytes().starts_with(b"/memfd:"));
    Ok(FileInfo {
        size: st.st_size as u64,
        seals: (seals >= 0).then_some(seals),
        memfd,
    })
}

/// A shared read-write mapping of part of a file, unmapped when dropped.
#[derive(Debug)]
pub struct Mapping {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping lives as long as the value; its bytes are only reached through
// atomics and raw-pointer copies, as memory shared with another process must be.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` from `offset` (page-aligned), which must lie inside the
    /// file as it is now; `InvalidInput` otherwise.
    pub fn map(fd: &impl AsFd, offset: u64, len: usize) -> std::io::Result<Mapping> {
        let size = inspect(fd)?.size;
        let fits = offset
            .checked_add(len as u64)
            .is_some_and(|end| end <= size);
        if len == 0 || !fits || !offset.is_multiple_of(4096) {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("{len} bytes at {offset} do not lie in a file of {size} bytes"),
            ));
        }
        let off =
            libc::off_t::try_from(offset).map_err(|_| Error::from(ErrorKind::InvalidInput))?;
        // SAFETY: maps `len` bytes inside a file at least that long, shared, at an
        // address the kernel picks.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_fd().as_raw_fd(),
                off,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(Error::last_os_error());
        }
        Ok(Mapping {
            base: base.cast(),
            len,
        })
    }

    /// The first byte of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.base
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly the mapping made in `map`.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// Bytes from which [`zeroed`] asks for transparent huge pages.
const HUGE_FROM: usize = 4 << 20;

/// A zeroed buffer of `len` bytes for a frame's body or a transfer. A large one is
/// mapped fresh by the allocator, and filling it faulted each 4 KiB page in on its
/// own: for a 64 MiB transfer, 16,384 faults, which cost more than the copy itself.
/// Advised as huge-page memory (where the kernel's `transparent_hugepage` mode is
/// `madvise` or `always`), it faults in 2 MiB at a time.
pub fn zeroed(len: usize) -> Vec<u8> {
    let v = vec![0u8; len];
    if len >= HUGE_FROM {
        let page = 2 << 20;
        let start = (v.as_ptr() as usize).next_multiple_of(page);
        let end = (v.as_ptr() as usize + len) & !(page - 1);
        if end > start {
            // SAFETY: advice on whole pages inside the vector's own allocation; it
            // changes how they are backed, never their contents.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memfds_carry_the_seals_asked_for() {
        let fixed = memfd(c"t", 8192, FIXED).unwrap();
        let i = inspect(&fixed).unwrap();
        assert_eq!((i.size, i.seals, i.memfd), (8192, Some(FIXED), true));
        assert!(i.sealed_against_shrinking());
        // SAFETY: a plain call on a descriptor this test owns.
        assert_ne!(unsafe { libc::ftruncate(fixed.as_raw_fd(), 4096) }, 0);
        let window = memfd(c"t", 4096, NO_SHRINK).unwrap();
        // SAFETY: as above; growing is allowed, shrinking not.
        unsafe {
            assert_eq!(libc::ftruncate(window.as_raw_fd(), 8192), 0);
            assert_ne!(libc::ftruncate(window.as_raw_fd(), 0), 0);
        }
        let plain = inspect(&memfd(c"t", 4096, 0).unwrap()).unwrap();
        assert!(plain.memfd && !plain.sealed_against_shrinking());
    }

    #[test]
    fn a_mapping_lies_inside_its_file_and_sees_what_others_write() {
        let fd = memfd(c"t", 3 * 4096, FIXED).unwrap();
        let a = Mapping::map(&fd, 4096, 8192).unwrap();
        let b = Mapping::map(&fd, 0, 3 * 4096).unwrap();
        // SAFETY: both pointers lie inside their mappings.
        unsafe {
            a.as_ptr().add(10).write_volatile(42);
            assert_eq!(b.as_ptr().add(4096 + 10).read_volatile(), 42);
        }
        for (off, len) in [(8192, 8192), (100, 4096), (0, 0), (u64::MAX - 4095, 4096)] {
            let e = Mapping::map(&fd, off, len).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{off} {len}");
        }
    }

    #[test]
    fn a_tmpfs_file_is_not_a_memfd_and_cannot_be_sealed() {
        let Ok(dir) = tempfile_in_shm() else {
            eprintln!("skipped: this machine has no /dev/shm");
            return;
        };
        let path = dir.join("window");
        let f = std::fs::File::create_new(&path).unwrap();
        f.set_len(4096).unwrap();
        let i = inspect(&f).unwrap();
        std::fs::remove_file(&path).unwrap();
        std::fs::remove_dir(&dir).unwrap();
        assert!(!i.memfd && !i.sealed_against_shrinking(), "{i:?}");
        assert_eq!(i.seals, Some(libc::F_SEAL_SEAL));
    }

    /// A fresh directory in /dev/shm (the crate has no tempfile dependency).
    fn tempfile_in_shm() -> std::io::Result<std::path::PathBuf> {
        let dir = std::path::PathBuf::from(format!(
            "/dev/shm/hira-shm-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir(&dir)?;
        Ok(dir)
    }

    #[test]
    fn a_large_zeroed_buffer_is_zeroed_and_whole() {
        for len in [0, 10, HUGE_FROM - 1, HUGE_FROM, HUGE_FROM + 12_345] {
            let v = zeroed(len);
            assert_eq!(v.len(), len);
            assert!(v.iter().all(|&b| b == 0));
        }
    }
}
