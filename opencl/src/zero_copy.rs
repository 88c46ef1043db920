//! Memory objects that live in the data window.
//!
//! On a host device that shares memory with the host (`CL_DEVICE_HOST_UNIFIED_MEMORY`:
//! CPUs, integrated GPUs) a buffer or image the application makes without its own
//! memory (`CL_MEM_USE_HOST_PTR`) is made by the host on a region of the data window
//! instead (`tag::WINDOW_MEM`; the host passes `CL_MEM_USE_HOST_PTR` with the
//! region). Its storage is then memory both processes see: a map is the host's own
//! map of the object, whose pointer lies in the region, and the application gets the
//! same bytes through the guest's mapping of the window, with nothing copied either
//! way, as natively on such a device. Transfers, kernels and copies are the host's
//! as before; the application sees its own flags and no host pointer.
//!
//! A region is the object's until the host has destroyed it, which may be after the
//! application's last release (commands still using it, sub-buffers, images made from
//! it). Released objects wait in a list; when the window is short of room for a new
//! one, the guest asks the host which of them are gone (`hiraWindowReleased`) and
//! frees their regions.
//!
//! Objects may hold at most half of the window, so that transfers, which stage
//! through it, always find room; objects under [`MIN_BYTES`] are not worth a region.
//! `HIRA_ZERO_COPY=0` turns this off (every map then copies its region).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use hira_guest_driver::WindowRegion;
use hira_protocol::api::tag;
use opencl_sys::{
    CL_CONTEXT_DEVICES, CL_DEVICE_HOST_UNIFIED_MEMORY, CL_MEM_COPY_HOST_PTR, CL_MEM_OBJECT_IMAGE1D,
    CL_MEM_OBJECT_IMAGE1D_ARRAY, CL_MEM_OBJECT_IMAGE2D, CL_MEM_OBJECT_IMAGE2D_ARRAY,
    CL_MEM_OBJECT_IMAGE3D, CL_MEM_USE_HOST_PTR, cl_bool, cl_context, cl_device_id, cl_image_desc,
};

use crate::generated as g;
use crate::marshal::Call;
use crate::rt;

/// Smallest object placed in the window: below it a map's copy costs less than the
/// window space it would hold.
pub(crate) const MIN_BYTES: usize = 64 << 10;

/// Most released objects asked about in one `hiraWindowReleased`.
const MAX_ASKED: usize = 4096;

/// Bytes of the window that objects' regions hold, live or waiting for the host.
static HELD: AtomicUsize = AtomicUsize::new(0);

/// An object's region, counted in [`HELD`] until it goes back to the window.
struct Region(WindowRegion<'static>);

impl Drop for Region {
    fn drop(&mut self) {
        HELD.fetch_sub(self.0.len, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct Placed {
    /// Objects on window memory, by id: their own region, or their parent's for a
    /// sub-buffer.
    objects: HashMap<u64, Arc<Region>>,
    /// The objects that own their region (not sub-buffers).
    roots: std::collections::HashSet<u64>,
    /// Regions of objects the application released, until the host has destroyed
    /// them.
    released: Vec<(u64, Arc<Region>)>,
    /// Whether each context's devices all share memory with the host, once asked.
    unified: HashMap<u64, bool>,
}

static PLACED: LazyLock<Mutex<Placed>> = LazyLock::new(|| Mutex::new(Placed::default()));

fn placed() -> MutexGuard<'static, Placed> {
    PLACED.lock().unwrap_or_else(|e| e.into_inner())
}

/// A region the creating call has named, to be the new object's if the host makes it.
pub(crate) struct Pending(Arc<Region>);

/// Whether an image description allows a window region: no host-side layout of its
/// own (pitches 0), no buffer or mipmaps under it, and a type with storage of its own.
///
/// # Safety
/// `desc` must be null or point to a `cl_image_desc`.
pub(crate) unsafe fn plain_desc(desc: *const cl_image_desc) -> bool {
    if desc.is_null() {
        return false;
    }
    // SAFETY: non-null, a `cl_image_desc` per the contract.
    let d = unsafe { &*desc };
    matches!(
        d.image_type,
        CL_MEM_OBJECT_IMAGE1D
            | CL_MEM_OBJECT_IMAGE1D_ARRAY
            | CL_MEM_OBJECT_IMAGE2D
            | CL_MEM_OBJECT_IMAGE2D_ARRAY
            | CL_MEM_OBJECT_IMAGE3D
    ) && d.image_row_pitch == 0
        && d.image_slice_pitch == 0
        && d.num_mip_levels == 0
        && d.num_samples == 0
        && d.buffer.is_null()
}

/// Whether every device of `context` shares memory with the host (asked once per
/// context; a context the guest cannot ask about does not qualify).
fn unified(context: cl_context) -> bool {
    let Some((id, _)) = rt::lookup(context.cast()) else {
        return false;
    };
    if let Some(&u) = placed().unified.get(&id) {
        return u;
    }
    let ask = || -> Option<bool> {
        let mut bytes = 0usize;
        // SAFETY: a size query, then a read into a vector of that size.
        unsafe {
            if g::clGetContextInfo(
                context,
                CL_CONTEXT_DEVICES,
                0,
                std::ptr::null_mut(),
                &mut bytes,
            ) != 0
            {
                return None;
            }
            let mut devices: Vec<cl_device_id> =
                vec![std::ptr::null_mut(); bytes / size_of::<cl_device_id>()];
            if g::clGetContextInfo(
                context,
                CL_CONTEXT_DEVICES,
                bytes,
                devices.as_mut_ptr().cast(),
                std::ptr::null_mut(),
            ) != 0
            {
                return None;
            }
            let mut all = !devices.is_empty();
            for d in devices {
                let mut u: cl_bool = 0;
                let st = g::clGetDeviceInfo(
                    d,
                    CL_DEVICE_HOST_UNIFIED_MEMORY,
                    size_of::<cl_bool>(),
                    (&mut u as *mut cl_bool).cast(),
                    std::ptr::null_mut(),
                );
                all &= st == 0 && u != 0;
            }
            Some(all)
        }
    };
    let u = ask().unwrap_or(false);
    placed().unified.insert(id, u);
    u
}

/// Places the storage of an object being made by `c` in the window, if it qualifies:
/// the application gave no memory of its own to use, `layout_ok` (a buffer, or an
/// image with a plain description), `bytes` computes its size, the context's devices
/// share memory with the host, and the window has room. Then the argument is written
/// (`tag::WINDOW_MEM`), with the initial contents copied in for
/// `CL_MEM_COPY_HOST_PTR`, and the region is returned for [`made`]; else nothing is
/// written and the caller sends the argument as usual.
///
/// # Safety
/// `host_ptr` must be null or valid for the object's size in reads, as the API
/// requires with `CL_MEM_COPY_HOST_PTR`.
pub(crate) unsafe fn place(
    c: &mut Call,
    context: cl_context,
    flags: u64,
    host_ptr: *const u8,
    layout_ok: bool,
    bytes: impl FnOnce() -> Result<usize, i32>,
) -> Option<Pending> {
    if !layout_ok
        || flags & CL_MEM_USE_HOST_PTR != 0
        || !hira_guest_driver::settings::settings().zero_copy
    {
        return None;
    }
    let copy = flags & CL_MEM_COPY_HOST_PTR != 0;
    if copy == host_ptr.is_null() {
        // The host reports the error.
        return None;
    }
    let len = bytes().ok().filter(|&n| n >= MIN_BYTES)?;
    let window = rt::conn().ok()?.window()?;
    if !unified(context) {
        return None;
    }
    let region = alloc(window, len)?;
    if copy {
        // SAFETY: `host_ptr` holds `len` bytes per the contract; the region was just
        // allocated with at least `len`.
        unsafe { std::ptr::copy_nonoverlapping(host_ptr, region.0.ptr(), len) };
    }
    c.w.u8(tag::WINDOW_MEM)
        .u64(region.0.offset as u64)
        .u64(len as u64);
    Some(Pending(Arc::new(region)))
}

/// A region of `len` bytes for an object, within the objects' half of the window;
/// asks the host about released objects first when that half is full.
fn alloc(window: &'static hira_guest_driver::Window, len: usize) -> Option<Region> {
    let budget = window.len() / 2;
    let fits = || held().checked_add(len).is_some_and(|n| n <= budget);
    if !fits() {
        reclaim();
        if !fits() {
            return None;
        }
    }
    let region = window.alloc(len)?;
    HELD.fetch_add(region.len, Ordering::Relaxed);
    Some(Region(region))
}

/// Asks the host which released objects it has destroyed, and frees their regions.
fn reclaim() {
    let ids: Vec<u64> = {
        let p = placed();
        p.released
            .iter()
            .take(MAX_ASKED)
            .map(|&(id, _)| id)
            .collect()
    };
    if ids.is_empty() {
        return;
    }
    let mut gone = vec![0u8; ids.len()];
    // SAFETY: `ids` holds `ids.len()` u64s and `gone` as many bytes.
    let status = unsafe {
        g::hiraWindowReleased(
            ids.len() as u32,
            ids.as_ptr().cast(),
            gone.as_mut_ptr().cast(),
        )
    };
    if status != 0 {
        return;
    }
    let gone: std::collections::HashSet<u64> = ids
        .iter()
        .zip(&gone)
        .filter(|&(_, &g)| g != 0)
        .map(|(&id, _)| id)
        .collect();
    // Dropping the last reference gives a region back.
    let freed: Vec<_> = {
        let mut p = placed();
        let (gone, kept) = std::mem::take(&mut p.released)
            .into_iter()
            .partition(|(id, _)| gone.contains(id));
        p.released = kept;
        gone
    };
    drop(freed);
}

/// Records that the host made object `id` on the region `c` named.
pub(crate) fn made(id: u64, pending: Pending) {
    let mut p = placed();
    p.objects.insert(id, pending.0);
    p.roots.insert(id);
}

/// Records sub-buffer `id` of `parent`, on its parent's region if the parent is in the
/// window.
pub(crate) fn sub_buffer(id: u64, parent: u64) {
    let mut p = placed();
    if let Some(r) = p.objects.get(&parent).cloned() {
        p.objects.insert(id, r);
    }
}

/// Whether object `id` lives in the window.
pub(crate) fn in_window(id: u64) -> bool {
    placed().objects.contains_key(&id)
}

/// The guest address of `offset` in the window of object `id`, if `len` bytes from
/// there lie inside the object's region.
pub(crate) fn address(id: u64, offset: u64, len: usize) -> Option<*mut c_void> {
    let p = placed();
    let r = &p.objects.get(&id)?.0;
    let at = usize::try_from(offset).ok()?.checked_sub(r.offset)?;
    (at.checked_add(len)? <= r.len).then(|| {
        // SAFETY: `at + len` lies inside the region, checked above.
        unsafe { r.ptr().add(at).cast() }
    })
}

/// The application released object `id` for the last time: its region waits until the
/// host has destroyed it.
pub(crate) fn released(id: u64) {
    let mut p = placed();
    let Some(r) = p.objects.remove(&id) else {
        return;
    };
    if p.roots.remove(&id) {
        p.released.push((id, r));
    }
}

/// Bytes of the window that objects hold now, live or waiting for the host.
pub fn held() -> usize {
    HELD.load(Ordering::Relaxed)
}
