//! Virtual memory management (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`,
//! `cuMemSetAccess`, and their inverses), as the driver API documents it: a
//! reservation of device addresses (at the address asked for where it is free), a
//! physical allocation of whole granules, mapped whole at one place in a
//! reservation, and readable by kernels and copies only once access is set.
//! Hira's API server places every allocation of its guest this way.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_int, c_ulonglong};

use hira_apis_cuda_private::vmm::{
    ACCESS_READ, ACCESS_READWRITE, ALLOCATION_PINNED, AccessDesc, AllocationProp, LOCATION_DEVICE,
};

use super::{
    CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED,
    CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CUdeviceptr, CUresult, State, TOTAL_MEMORY, put, with,
};

/// The granularity of reservations and physical allocations: 2 MiB, as a GPU's.
pub(crate) const GRANULARITY: u64 = 2 << 20;
/// Where reservations start: apart from `cuMemAlloc`'s addresses.
const RESERVED_BASE: u64 = 0x100_0000_0000;
/// The end of the addresses reservations may take (1 TiB of them).
const RESERVED_END: u64 = RESERVED_BASE + (1 << 40);

/// A physical allocation: its size, its bytes while unmapped, where it is mapped.
struct Physical {
    size: u64,
    bytes: Option<Vec<u8>>,
    mapped_at: Option<u64>,
    /// `cuMemRelease` was called: it goes when unmapped.
    released: bool,
}

#[derive(Default)]
pub(crate) struct Vmm {
    /// Reservations: start -> size.
    reserved: BTreeMap<u64, u64>,
    physical: HashMap<u64, Physical>,
    /// Mappings: start -> physical handle.
    mappings: BTreeMap<u64, u64>,
    next_handle: u64,
}

fn aligned(v: u64) -> bool {
    v.is_multiple_of(GRANULARITY)
}

/// Device 0 as a location, the only device this executor has.
fn device_location(kind: c_int, id: c_int) -> Result<(), CUresult> {
    match (kind, id) {
        (LOCATION_DEVICE, 0) => Ok(()),
        (LOCATION_DEVICE, _) => Err(CUDA_ERROR_INVALID_DEVICE),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

impl Vmm {
    fn overlaps_reservation(&self, at: u64, size: u64) -> bool {
        let end = at + size;
        self.reserved
            .range(..end)
            .next_back()
            .is_some_and(|(&s, &n)| s + n > at)
    }

    /// The reservation `[at, at + size)` lies in, if one holds all of it.
    fn within_reservation(&self, at: u64, size: u64) -> bool {
        self.reserved
            .range(..=at)
            .next_back()
            .is_some_and(|(&s, &n)| at + size <= s + n)
    }

    fn reserve(&mut self, size: u64, align: u64, hint: u64) -> Option<u64> {
        let align = align.max(GRANULARITY);
        if hint != 0
            && hint.is_multiple_of(align)
            && hint >= RESERVED_BASE
            && hint.checked_add(size).is_some_and(|e| e <= RESERVED_END)
            && !self.overlaps_reservation(hint, size)
        {
            return Some(hint);
        }
        // The lowest free range: after each reservation, or at the base.
        let mut at = RESERVED_BASE;
        for (&s, &n) in &self.reserved {
            if at + size <= s {
                break;
            }
            at = (s + n).next_multiple_of(align);
        }
        (at + size <= RESERVED_END).then_some(at)
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const AllocationProp,
    option: c_int,
) -> CUresult {
    with(|_| {
        if prop.is_null() || !(0..=1).contains(&option) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: the caller's structure, not null.
        let p = unsafe { prop.read() };
        if let Err(e) = device_location(p.location.kind, p.location.id) {
            return e;
        }
        // SAFETY: the caller's out-pointer.
        unsafe { put(granularity, GRANULARITY as usize) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    addr: CUdeviceptr,
    flags: c_ulonglong,
) -> CUresult {
    with(|s| {
        let (size, align) = (size as u64, alignment as u64);
        if ptr.is_null() || size == 0 || !aligned(size) || flags != 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        if align != 0 && (!align.is_power_of_two() || !aligned(align)) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        match s.vmm.reserve(size, align, addr) {
            Some(at) => {
                s.vmm.reserved.insert(at, size);
                // SAFETY: checked not null.
                unsafe { put(ptr, at) }
            }
            None => CUDA_ERROR_OUT_OF_MEMORY,
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    with(|s| {
        if s.vmm.reserved.get(&ptr) != Some(&(size as u64)) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let end = ptr + size as u64;
        if s.vmm.mappings.range(ptr..end).next().is_some() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        s.vmm.reserved.remove(&ptr);
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const AllocationProp,
    flags: c_ulonglong,
) -> CUresult {
    with(|s| {
        let size = size as u64;
        if handle.is_null() || prop.is_null() || size == 0 || !aligned(size) || flags != 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: the caller's structure, not null.
        let p = unsafe { prop.read() };
        if p.kind != ALLOCATION_PINNED {
            return CUDA_ERROR_INVALID_VALUE;
        }
        if let Err(e) = device_location(p.location.kind, p.location.id) {
            return e;
        }
        if s.mem.used + size > TOTAL_MEMORY {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        s.mem.used += size;
        s.vmm.next_handle += 1;
        let h = s.vmm.next_handle;
        s.vmm.physical.insert(
            h,
            Physical {
                size,
                bytes: Some(vec![0; size as usize]),
                mapped_at: None,
                released: false,
            },
        );
        // SAFETY: checked not null.
        unsafe { put(handle, h) }
    })
}

/// Frees physical allocation `h` if it is released and unmapped.
fn collect(s: &mut State, h: u64) {
    if let Some(p) = s.vmm.physical.get(&h)
        && p.released
        && p.mapped_at.is_none()
    {
        s.mem.used -= p.size;
        s.vmm.physical.remove(&h);
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    with(|s| match s.vmm.physical.get_mut(&handle) {
        Some(p) if !p.released => {
            p.released = true;
            collect(s, handle);
            CUDA_SUCCESS
        }
        _ => CUDA_ERROR_INVALID_VALUE,
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: u64,
    flags: c_ulonglong,
) -> CUresult {
    with(|s| {
        let size = size as u64;
        if flags != 0 || !aligned(ptr) || !aligned(size) || size == 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        if !s.vmm.within_reservation(ptr, size) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let end = ptr + size;
        let taken = s
            .vmm
            .mappings
            .range(..end)
            .next_back()
            .is_some_and(|(_, h)| {
                s.vmm.physical[h]
                    .mapped_at
                    .is_some_and(|at| at + s.vmm.physical[h].size > ptr)
            });
        if taken {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let Some(p) = s.vmm.physical.get_mut(&handle) else {
            return CUDA_ERROR_INVALID_VALUE;
        };
        if p.released {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // Part of a physical allocation, or one mapped twice: not in this executor.
        if offset != 0 || size != p.size || p.mapped_at.is_some() {
            return CUDA_ERROR_NOT_SUPPORTED;
        }
        let bytes = p.bytes.take().expect("unmapped memory keeps its bytes");
        p.mapped_at = Some(ptr);
        s.vmm.mappings.insert(ptr, handle);
        s.mem.allocs.insert(ptr, bytes);
        s.mem.mapped.insert(ptr);
        s.mem.no_access.insert(ptr);
        CUDA_SUCCESS
    })
}

/// The mappings that exactly cover `[ptr, ptr + size)`, in order.
fn covering(s: &State, ptr: u64, size: u64) -> Option<Vec<u64>> {
    let mut at = ptr;
    let mut out = Vec::new();
    while at < ptr + size {
        let h = *s.vmm.mappings.get(&at)?;
        out.push(at);
        at += s.vmm.physical[&h].size;
    }
    (at == ptr + size && !out.is_empty()).then_some(out)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const AccessDesc,
    count: usize,
) -> CUresult {
    with(|s| {
        if desc.is_null() || count == 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let Some(ranges) = covering(s, ptr, size as u64) else {
            return CUDA_ERROR_INVALID_VALUE;
        };
        let mut access = false;
        for i in 0..count {
            // SAFETY: `count` descriptors, as the caller passed them.
            let d = unsafe { desc.add(i).read_unaligned() };
            if let Err(e) = device_location(d.location.kind, d.location.id) {
                return e;
            }
            access = match d.flags {
                0 => false,
                ACCESS_READ | ACCESS_READWRITE => true,
                _ => return CUDA_ERROR_INVALID_VALUE,
            };
        }
        for at in ranges {
            if access {
                s.mem.no_access.remove(&at);
            } else {
                s.mem.no_access.insert(at);
            }
        }
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    with(|s| {
        let Some(ranges) = covering(s, ptr, size as u64) else {
            return CUDA_ERROR_INVALID_VALUE;
        };
        for at in ranges {
            let h = s.vmm.mappings.remove(&at).expect("covered");
            let bytes = s.mem.allocs.remove(&at).expect("mapped");
            s.mem.mapped.remove(&at);
            s.mem.no_access.remove(&at);
            let p = s.vmm.physical.get_mut(&h).expect("mapped memory exists");
            p.mapped_at = None;
            p.bytes = Some(bytes);
            collect(s, h);
        }
        CUDA_SUCCESS
    })
}
