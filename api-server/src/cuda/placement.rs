//! Where the guest's device memory lives. Every allocation is placed with the
//! driver's virtual-memory-management calls at addresses the API server reserved
//! (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`, `cuMemSetAccess`), so that a
//! migrated session can reserve the same addresses on its new API server and find
//! every allocation where kernels' arguments and device data point: device
//! addresses are raw numbers inside both.
//!
//! The driver maps memory in granules (2 MiB on NVIDIA's GPUs). Allocations of more
//! than half a granule get chunks of their own, rounded up to whole granules; smaller
//! ones share chunks of one granule, first fit at 512-byte alignment, as `cuMemAlloc`
//! sub-allocates. A chunk goes back to the driver when its last allocation is freed.
//! Hira answers `cuMemGetAddressRange` and the range attributes of
//! `cuPointerGetAttribute` for its allocations itself, as the driver would for an
//! allocation of `cuMemAlloc`.
//!
//! Where the driver lacks these calls, the device does not support them, or the
//! operator turned placement off (`HIRA_CUDA_PLACEMENT=driver`), allocations are the
//! driver's `cuMemAlloc`, and sessions holding device memory cannot migrate.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CStr, c_int};

use hira_apis_cuda::status;
use hira_apis_cuda_private::vmm::{self, AccessDesc, AllocationProp};

use super::Lib;

/// Alignment of an allocation (as `cuMemAlloc`'s).
const ALIGN: u64 = 512;

/// The driver's virtual-memory-management entry points.
#[derive(Clone, Copy)]
pub(crate) struct VmmCalls {
    granularity: vmm::GetAllocationGranularity,
    reserve: vmm::AddressReserve,
    address_free: vmm::AddressFree,
    create: vmm::Create,
    release: vmm::Release,
    map: vmm::Map,
    unmap: vmm::Unmap,
    set_access: vmm::SetAccess,
}

impl VmmCalls {
    /// The driver's, if it has them all.
    pub(crate) fn load(lib: &Lib) -> Option<VmmCalls> {
        fn get<T: Copy>(lib: &Lib, name: &CStr) -> Option<T> {
            // SAFETY: each name is given its cuda.h signature below.
            unsafe { lib.get(name) }
        }
        Some(VmmCalls {
            granularity: get(lib, c"cuMemGetAllocationGranularity")?,
            reserve: get(lib, c"cuMemAddressReserve")?,
            address_free: get(lib, c"cuMemAddressFree")?,
            create: get(lib, c"cuMemCreate")?,
            release: get(lib, c"cuMemRelease")?,
            map: get(lib, c"cuMemMap")?,
            unmap: get(lib, c"cuMemUnmap")?,
            set_access: get(lib, c"cuMemSetAccess")?,
        })
    }
}

/// Device memory mapped at an address of Hira's choice.
#[derive(Debug)]
pub(crate) struct Chunk {
    pub(crate) size: u64,
    pub(crate) dev: c_int,
    handle: u64,
    /// Shared by small allocations: free ranges (offset, length), in order.
    free: Option<Vec<(u64, u64)>>,
    live: u32,
}

/// One allocation of the guest's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Allocation {
    pub(crate) size: u64,
    /// The context it was made in (the guest's id).
    pub(crate) ctx: u64,
    /// The chunk it lies in; `None`: the driver's own `cuMemAlloc`.
    pub(crate) chunk: Option<u64>,
    /// A number no other allocation of the session had (`CU_POINTER_ATTRIBUTE_BUFFER_ID`).
    pub(crate) buffer_id: u64,
}

/// A chunk as migration moves it: where, how big, on which device, and whether
/// small allocations share it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ChunkInfo {
    pub(crate) at: u64,
    pub(crate) size: u64,
    pub(crate) dev: c_int,
    pub(crate) shared: bool,
}

#[derive(Default)]
pub(crate) struct Placement {
    chunks: BTreeMap<u64, Chunk>,
    allocations: BTreeMap<u64, Allocation>,
    granularity: HashMap<c_int, u64>,
    /// Whether each device supports virtual memory management.
    supported: HashMap<c_int, bool>,
    next_buffer_id: u64,
}

/// Undoes the steps of making a chunk that succeeded, in reverse.
fn undo(v: &VmmCalls, at: Option<u64>, size: u64, handle: Option<u64>, mapped: bool) {
    // SAFETY: each undoes a step this API server made with these values.
    unsafe {
        if mapped && let Some(at) = at {
            (v.unmap)(at, size as usize);
        }
        if let Some(h) = handle {
            (v.release)(h);
        }
        if let Some(at) = at {
            (v.address_free)(at, size as usize);
        }
    }
}

/// Reserves `size` bytes of addresses (at `hint` where the driver grants it), and
/// maps new memory of device `dev` there, readable and writable by that device.
fn make_chunk(v: &VmmCalls, dev: c_int, size: u64, hint: u64) -> Result<(u64, u64), c_int> {
    let prop = AllocationProp::device(dev);
    let mut at = 0u64;
    // SAFETY: an out-pointer and values.
    let st = unsafe { (v.reserve)(&mut at, size as usize, 0, hint, 0) };
    if st != 0 {
        return Err(st);
    }
    let mut handle = 0u64;
    // SAFETY: an out-pointer, a size and a property structure of cuda.h's layout.
    let st = unsafe { (v.create)(&mut handle, size as usize, &prop, 0) };
    if st != 0 {
        undo(v, Some(at), size, None, false);
        return Err(st);
    }
    // SAFETY: the reservation and memory just made, of the same size.
    let st = unsafe { (v.map)(at, size as usize, 0, handle, 0) };
    if st != 0 {
        undo(v, Some(at), size, Some(handle), false);
        return Err(st);
    }
    let access = AccessDesc {
        location: prop.location,
        flags: vmm::ACCESS_READWRITE,
    };
    // SAFETY: the range just mapped and one descriptor.
    let st = unsafe { (v.set_access)(at, size as usize, &access, 1) };
    if st != 0 {
        undo(v, Some(at), size, Some(handle), true);
        return Err(st);
    }
    Ok((at, handle))
}

impl Placement {
    /// Whether device `dev` supports virtual memory management (`ask`ed once).
    pub(crate) fn supported(&mut self, dev: c_int, ask: impl FnOnce() -> bool) -> bool {
        *self.supported.entry(dev).or_insert_with(ask)
    }

    /// The driver's granularity of device `dev`.
    fn granularity(&mut self, v: &VmmCalls, dev: c_int) -> Result<u64, c_int> {
        if let Some(&g) = self.granularity.get(&dev) {
            return Ok(g);
        }
        let prop = AllocationProp::device(dev);
        let mut g = 0usize;
        // SAFETY: an out-pointer and a property structure of cuda.h's layout.
        let st = unsafe { (v.granularity)(&mut g, &prop, vmm::GRANULARITY_MINIMUM) };
        if st != 0 {
            return Err(st);
        }
        let g = (g as u64).max(ALIGN);
        self.granularity.insert(dev, g);
        Ok(g)
    }

    fn add(&mut self, at: u64, size: u64, ctx: u64, chunk: Option<u64>) {
        self.next_buffer_id += 1;
        self.allocations.insert(
            at,
            Allocation {
                size,
                ctx,
                chunk,
                buffer_id: self.next_buffer_id,
            },
        );
    }

    /// Places `size` bytes on device `dev` for context `ctx`.
    pub(crate) fn alloc(
        &mut self,
        v: &VmmCalls,
        dev: c_int,
        ctx: u64,
        size: u64,
    ) -> Result<u64, c_int> {
        let g = self.granularity(v, dev)?;
        let want = size.next_multiple_of(ALIGN);
        if want <= g / 2 {
            // First fit in a shared chunk of the device.
            let found = self.chunks.iter_mut().find_map(|(&at, c)| {
                let free = c.free.as_mut().filter(|_| c.dev == dev)?;
                let i = free.iter().position(|&(_, len)| len >= want)?;
                let (off, len) = free[i];
                if len == want {
                    free.remove(i);
                } else {
                    free[i] = (off + want, len - want);
                }
                c.live += 1;
                Some((at, at + off))
            });
            let (chunk, p) = match found {
                Some(f) => f,
                None => {
                    let (at, handle) = make_chunk(v, dev, g, 0)?;
                    self.chunks.insert(
                        at,
                        Chunk {
                            size: g,
                            dev,
                            handle,
                            free: Some(vec![(want, g - want)]),
                            live: 1,
                        },
                    );
                    (at, at)
                }
            };
            self.add(p, size, ctx, Some(chunk));
            return Ok(p);
        }
        let total = size
            .checked_next_multiple_of(g)
            .ok_or(status::OUT_OF_MEMORY)?;
        let (at, handle) = make_chunk(v, dev, total, 0)?;
        self.chunks.insert(
            at,
            Chunk {
                size: total,
                dev,
                handle,
                free: None,
                live: 1,
            },
        );
        self.add(at, size, ctx, Some(at));
        Ok(at)
    }

    /// An allocation the driver made (`cuMemAlloc`).
    pub(crate) fn driver_allocated(&mut self, at: u64, ctx: u64, size: u64) {
        self.add(at, size, ctx, None);
    }

    /// The allocation at `at`, if the guest has one there.
    pub(crate) fn get(&self, at: u64) -> Option<Allocation> {
        self.allocations.get(&at).copied()
    }

    /// The allocation holding `p`, as (start, allocation).
    pub(crate) fn holding(&self, p: u64) -> Option<(u64, Allocation)> {
        let (&at, a) = self.allocations.range(..=p).next_back()?;
        (p < at + a.size.max(1)).then_some((at, *a))
    }

    /// Whether `[p, p + n)` lies in one of the guest's allocations Hira placed;
    /// `None` where `p` is in no memory Hira placed (the driver's to check).
    pub(crate) fn within_allocation(&self, p: u64, n: u64) -> Option<bool> {
        let in_chunk = self
            .chunks
            .range(..=p)
            .next_back()
            .is_some_and(|(&at, c)| p < at + c.size);
        if !in_chunk {
            return None;
        }
        let end = p.checked_add(n)?;
        Some(
            self.holding(p)
                .is_some_and(|(at, a)| a.chunk.is_some() && end <= at + a.size),
        )
    }

    /// Forgets the allocation at `at`, giving its chunk back when it was the last
    /// in it. Returns it; `None` if the guest has none there.
    pub(crate) fn free(&mut self, v: Option<&VmmCalls>, at: u64) -> Option<Allocation> {
        let a = self.allocations.remove(&at)?;
        let Some(chunk_at) = a.chunk else {
            return Some(a);
        };
        let c = self
            .chunks
            .get_mut(&chunk_at)
            .expect("an allocation's chunk");
        c.live -= 1;
        if let Some(free) = c.free.as_mut() {
            let off = at - chunk_at;
            let len = a.size.next_multiple_of(ALIGN);
            let i = free.partition_point(|&(o, _)| o < off);
            free.insert(i, (off, len));
            // Merge with the neighbours.
            if i + 1 < free.len() && free[i].0 + free[i].1 == free[i + 1].0 {
                free[i].1 += free[i + 1].1;
                free.remove(i + 1);
            }
            if i > 0 && free[i - 1].0 + free[i - 1].1 == free[i].0 {
                free[i - 1].1 += free[i].1;
                free.remove(i);
            }
        }
        if c.live == 0 {
            let c = self.chunks.remove(&chunk_at).expect("found above");
            if let Some(v) = v {
                undo(v, Some(chunk_at), c.size, Some(c.handle), true);
            }
        }
        Some(a)
    }

    /// Frees every allocation of context `ctx` (destroyed, or the primary context
    /// reset: the driver frees its memory then). Returns the bytes.
    pub(crate) fn free_context(&mut self, v: Option<&VmmCalls>, ctx: u64) -> u64 {
        let gone: Vec<u64> = self
            .allocations
            .iter()
            .filter(|(_, a)| a.ctx == ctx)
            .map(|(&at, _)| at)
            .collect();
        gone.into_iter()
            .filter_map(|at| self.free(v, at))
            .map(|a| a.size)
            .sum()
    }

    /// Gives every chunk back (the session ends). Returns (released, failed).
    pub(crate) fn release_all(&mut self, v: Option<&VmmCalls>) -> (usize, usize) {
        let Some(v) = v else {
            return (0, 0);
        };
        let mut n = (0, 0);
        for (at, c) in std::mem::take(&mut self.chunks) {
            // SAFETY: a chunk this API server made and still holds.
            let ok = unsafe {
                (v.unmap)(at, c.size as usize) == 0
                    && (v.release)(c.handle) == 0
                    && (v.address_free)(at, c.size as usize) == 0
            };
            if ok { n.0 += 1 } else { n.1 += 1 }
        }
        self.allocations.clear();
        n
    }

    /// Whether the driver placed any of the guest's memory (then it cannot move).
    pub(crate) fn driver_placed(&self) -> bool {
        self.allocations.values().any(|a| a.chunk.is_none())
    }

    pub(crate) fn chunks(&self) -> Vec<ChunkInfo> {
        self.chunks
            .iter()
            .map(|(&at, c)| ChunkInfo {
                at,
                size: c.size,
                dev: c.dev,
                shared: c.free.is_some(),
            })
            .collect()
    }

    pub(crate) fn allocations(&self) -> Vec<(u64, Allocation)> {
        self.allocations.iter().map(|(&at, a)| (at, *a)).collect()
    }

    /// Makes a chunk again at the same addresses (migration).
    pub(crate) fn restore_chunk(&mut self, v: &VmmCalls, c: ChunkInfo) -> Result<(), String> {
        let (at, handle) = make_chunk(v, c.dev, c.size, c.at)
            .map_err(|st| format!("mapping {} bytes failed with {st}", c.size))?;
        if at != c.at {
            undo(v, Some(at), c.size, Some(handle), true);
            return Err(format!(
                "the driver would not reserve {:#x} ({} bytes) again",
                c.at, c.size
            ));
        }
        self.chunks.insert(
            at,
            Chunk {
                size: c.size,
                dev: c.dev,
                handle,
                free: c.shared.then(|| vec![(0, c.size)]),
                live: 0,
            },
        );
        Ok(())
    }

    /// An allocation again in its restored chunk (migration).
    pub(crate) fn restore_allocation(&mut self, at: u64, a: Allocation) -> Result<(), String> {
        let chunk_at = a.chunk.ok_or("an allocation of the driver's")?;
        let c = self
            .chunks
            .get_mut(&chunk_at)
            .ok_or_else(|| format!("no chunk at {chunk_at:#x}"))?;
        let fits = at >= chunk_at && at + a.size <= chunk_at + c.size;
        if !fits {
            return Err(format!("an allocation at {at:#x} outside its chunk"));
        }
        if let Some(free) = c.free.as_mut() {
            let off = at - chunk_at;
            let len = a.size.next_multiple_of(ALIGN);
            let i = free
                .iter()
                .position(|&(o, l)| o <= off && off + len <= o + l)
                .ok_or_else(|| format!("allocations overlap at {at:#x}"))?;
            let (o, l) = free.remove(i);
            if off + len < o + l {
                free.insert(i, (off + len, o + l - off - len));
            }
            if o < off {
                free.insert(i, (o, off - o));
            }
        }
        c.live += 1;
        self.next_buffer_id = self.next_buffer_id.max(a.buffer_id);
        self.allocations.insert(at, a);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    // A driver that reserves addresses in order from 1 TiB (or at the hint) and
    // counts the chunks live: enough to check the bookkeeping without a device.
    static NEXT: AtomicU64 = AtomicU64::new(1 << 40);
    thread_local! {
        // Per test: each runs on a thread of its own.
        static LIVE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

    unsafe extern "C" fn granularity(g: *mut usize, _: *const AllocationProp, _: c_int) -> c_int {
        // SAFETY: the caller's out-pointer.
        unsafe { g.write(2 << 20) };
        0
    }
    unsafe extern "C" fn reserve(p: *mut u64, size: usize, _: usize, hint: u64, _: u64) -> c_int {
        let at = if hint != 0 {
            hint
        } else {
            NEXT.fetch_add(size as u64, Ordering::SeqCst)
        };
        // SAFETY: the caller's out-pointer.
        unsafe { p.write(at) };
        0
    }
    unsafe extern "C" fn address_free(_: u64, _: usize) -> c_int {
        0
    }
    unsafe extern "C" fn create(h: *mut u64, _: usize, _: *const AllocationProp, _: u64) -> c_int {
        LIVE.set(LIVE.get() + 1);
        // SAFETY: the caller's out-pointer.
        unsafe { h.write(7) };
        0
    }
    unsafe extern "C" fn release(_: u64) -> c_int {
        LIVE.set(LIVE.get() - 1);
        0
    }
    unsafe extern "C" fn map(_: u64, _: usize, _: usize, _: u64, _: u64) -> c_int {
        0
    }
    unsafe extern "C" fn unmap(_: u64, _: usize) -> c_int {
        0
    }
    unsafe extern "C" fn set_access(_: u64, _: usize, _: *const AccessDesc, _: usize) -> c_int {
        0
    }

    fn calls() -> VmmCalls {
        VmmCalls {
            granularity,
            reserve,
            address_free,
            create,
            release,
            map,
            unmap,
            set_access,
        }
    }

    #[test]
    fn small_allocations_share_chunks_and_large_ones_have_their_own() {
        let v = calls();
        let mut p = Placement::default();
        let a = p.alloc(&v, 0, 1, 100).unwrap();
        let b = p.alloc(&v, 0, 1, 1000).unwrap();
        let c = p.alloc(&v, 0, 1, 100).unwrap();
        assert_eq!((b - a, c - b), (512, 1024), "first fit at 512 bytes");
        let big = p.alloc(&v, 0, 1, 3 << 20).unwrap();
        assert_eq!(p.chunks().len(), 2);
        assert_eq!(
            p.chunks().iter().find(|c| c.at == big).unwrap().size,
            4 << 20
        );
        assert_eq!(p.within_allocation(b + 10, 990), Some(true));
        assert_eq!(
            p.within_allocation(b + 10, 991),
            Some(false),
            "past its end"
        );
        assert_eq!(
            p.within_allocation(big + (3 << 20), 1),
            Some(false),
            "the rounding"
        );
        assert_eq!(p.within_allocation(1, 1), None, "not Hira's memory");
        // A freed range serves again, merged with its free neighbours.
        assert_eq!(p.free(Some(&v), b).unwrap().size, 1000);
        assert_eq!(p.alloc(&v, 0, 1, 600).unwrap(), b);
        assert!(
            p.free(Some(&v), b + 1).is_none(),
            "not an allocation's start"
        );
        let before = LIVE.get();
        assert_eq!(p.free_context(Some(&v), 1), 100 + 600 + 100 + (3 << 20));
        assert!(p.chunks().is_empty() && p.allocations().is_empty());
        assert_eq!(LIVE.get(), before - 2, "both chunks released");
    }

    #[test]
    fn a_restore_rebuilds_chunks_and_their_free_ranges() {
        let v = calls();
        let mut p = Placement::default();
        let a = p.alloc(&v, 0, 1, 100).unwrap();
        let b = p.alloc(&v, 0, 2, 5000).unwrap();
        let chunks = p.chunks();
        let allocations = p.allocations();
        let mut q = Placement::default();
        for c in &chunks {
            q.restore_chunk(&v, *c).unwrap();
        }
        for (at, al) in &allocations {
            q.restore_allocation(*at, *al).unwrap();
        }
        assert_eq!(q.allocations(), allocations);
        // The next small allocation lands where it would have on the source.
        assert_eq!(
            q.alloc(&v, 0, 1, 10).unwrap(),
            p.alloc(&v, 0, 1, 10).unwrap()
        );
        assert!(
            q.restore_allocation(a, allocations[0].1).is_err(),
            "overlap"
        );
        assert_eq!(q.get(b).unwrap().ctx, 2);
    }
}
