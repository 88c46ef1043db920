//! The driver's virtual-memory-management calls (`cuMemAddressReserve`,
//! `cuMemCreate`, `cuMemMap`, `cuMemSetAccess` and their inverses): the structures
//! cuda.h 13.0 passes them, and their signatures. Hira's API server places every
//! allocation of its guest with them, so that a migrated session finds its memory at
//! the same device addresses; the CPU test executor serves them.

use std::ffi::{c_int, c_ulonglong};

/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
pub const ALLOCATION_PINNED: c_int = 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const LOCATION_DEVICE: c_int = 1;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
pub const ACCESS_READWRITE: c_int = 3;
/// `CU_MEM_ACCESS_FLAGS_PROT_READ`.
pub const ACCESS_READ: c_int = 1;
/// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`.
pub const GRANULARITY_MINIMUM: c_int = 0;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Location {
    pub kind: c_int,
    pub id: c_int,
}

/// `CUmemAllocationProp` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AllocationProp {
    pub kind: c_int,
    pub requested_handle_types: c_int,
    pub location: Location,
    pub win32_handle_meta_data: *mut std::ffi::c_void,
    /// `allocFlags`: compression type, GPUDirect RDMA capable, usage, reserved.
    pub alloc_flags: [u8; 8],
}

impl AllocationProp {
    /// Pinned device memory on device `dev`, as `cuMemAlloc` gives.
    pub fn device(dev: c_int) -> AllocationProp {
        AllocationProp {
            kind: ALLOCATION_PINNED,
            requested_handle_types: 0,
            location: Location {
                kind: LOCATION_DEVICE,
                id: dev,
            },
            win32_handle_meta_data: std::ptr::null_mut(),
            alloc_flags: [0; 8],
        }
    }
}

/// `CUmemAccessDesc` (12 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AccessDesc {
    pub location: Location,
    pub flags: c_int,
}

pub type GetAllocationGranularity =
    unsafe extern "C" fn(*mut usize, *const AllocationProp, c_int) -> c_int;
pub type AddressReserve = unsafe extern "C" fn(*mut u64, usize, usize, u64, c_ulonglong) -> c_int;
pub type AddressFree = unsafe extern "C" fn(u64, usize) -> c_int;
pub type Create =
    unsafe extern "C" fn(*mut u64, usize, *const AllocationProp, c_ulonglong) -> c_int;
pub type Release = unsafe extern "C" fn(u64) -> c_int;
pub type Map = unsafe extern "C" fn(u64, usize, usize, u64, c_ulonglong) -> c_int;
pub type Unmap = unsafe extern "C" fn(u64, usize) -> c_int;
pub type SetAccess = unsafe extern "C" fn(u64, usize, *const AccessDesc, usize) -> c_int;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structures_have_cuda_h_layouts() {
        assert_eq!(std::mem::size_of::<AllocationProp>(), 32);
        assert_eq!(std::mem::offset_of!(AllocationProp, location), 8);
        assert_eq!(std::mem::offset_of!(AllocationProp, alloc_flags), 24);
        assert_eq!(std::mem::size_of::<AccessDesc>(), 12);
    }
}
