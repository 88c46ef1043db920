//! `cuPointerGetAttribute(s)`: the size of each attribute's value (`CUpointer_attribute`
//! of CUDA 13.0; booleans are `int`s, as the driver writes them), for the guest to
//! write what the host answered into the application's variables.

/// `CU_POINTER_ATTRIBUTE_CONTEXT`.
pub const CONTEXT: i32 = 1;
/// `CU_POINTER_ATTRIBUTE_BUFFER_ID`.
pub const BUFFER_ID: i32 = 7;
/// `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR`.
pub const RANGE_START_ADDR: i32 = 11;
/// `CU_POINTER_ATTRIBUTE_RANGE_SIZE`.
pub const RANGE_SIZE: i32 = 12;
/// `CU_POINTER_ATTRIBUTE_P2P_TOKENS`: two numbers for a kernel driver.
pub const P2P_TOKENS: i32 = 5;
/// `CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE`.
pub const MEMPOOL_HANDLE: i32 = 17;
/// The most attributes one call may ask for through Hira (there are 21).
pub const MAX_ATTRIBUTES: usize = 64;
/// The widest value (`CUDA_POINTER_ATTRIBUTE_P2P_TOKENS`).
pub const MAX_VALUE: usize = 16;

/// Bytes attribute `attr`'s value takes, `None` for an id cuda.h 13.0 lacks.
pub fn value_size(attr: i32) -> Option<usize> {
    Some(match attr {
        // CONTEXT, DEVICE_POINTER, HOST_POINTER, BUFFER_ID, RANGE_START_ADDR,
        // RANGE_SIZE, MEMPOOL_HANDLE, MAPPING_SIZE, MAPPING_BASE_ADDR,
        // MEMORY_BLOCK_ID.
        1 | 3 | 4 | 7 | 11 | 12 | 17 | 18 | 19 | 20 => 8,
        // MEMORY_TYPE, SYNC_MEMOPS, IS_MANAGED, DEVICE_ORDINAL,
        // IS_LEGACY_CUDA_IPC_CAPABLE, MAPPED, ALLOWED_HANDLE_TYPES,
        // IS_GPU_DIRECT_RDMA_CAPABLE, ACCESS_FLAGS, IS_HW_DECOMPRESS_CAPABLE.
        2 | 6 | 8 | 9 | 10 | 13 | 14 | 15 | 16 | 21 => 4,
        P2P_TOKENS => 16,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_attribute_of_cuda_13_has_a_size() {
        for a in 1..=21 {
            let n = value_size(a).unwrap();
            assert!(n <= MAX_VALUE && [4, 8, 16].contains(&n), "{a}");
        }
        assert_eq!(value_size(0), None);
        assert_eq!(value_size(22), None);
    }
}
