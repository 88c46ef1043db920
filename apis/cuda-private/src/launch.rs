//! `cuLaunchKernelEx`'s configuration (`CUlaunchConfig`) and launch attributes
//! (`CUlaunchAttribute`), as cuda.h of CUDA 12 and 13 lays them out: read from a
//! program's memory by Hira's guest library and the CPU test executor, and from
//! guest bytes by the API server.

use std::ffi::{c_uint, c_void};

/// `CUlaunchAttribute`: a 4-byte id, 4 bytes of padding, a 64-byte value.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Attribute {
    pub id: u32,
    pub pad: [u8; 4],
    pub value: [u8; 64],
}

/// The bytes of one attribute.
pub const ATTRIBUTE_SIZE: usize = std::mem::size_of::<Attribute>();

/// The most attributes one launch may carry through Hira. The driver has 16 kinds
/// and one of each makes sense; a longer list is refused as the driver refuses a
/// malformed one.
pub const MAX_ATTRIBUTES: usize = 32;

/// `CUlaunchConfig`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_mem_bytes: c_uint,
    pub stream: *mut c_void,
    pub attrs: *const Attribute,
    pub num_attrs: c_uint,
}

/// What an attribute's value holds, for forwarding it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value {
    /// Numbers only (flags, dimensions, a device address range): forwarded as is.
    Data,
    /// A `CUevent` in its first 8 bytes (`PROGRAMMATIC_EVENT`, `LAUNCH_COMPLETION_EVENT`),
    /// then numbers.
    Event,
    /// Valid for graph nodes only (`DEVICE_UPDATABLE_KERNEL_NODE`, whose value holds
    /// a node handle the driver writes): not forwarded.
    GraphNode,
    /// An id cuda.h 13.0 does not define.
    Unknown,
}

/// `CU_LAUNCH_ATTRIBUTE_COOPERATIVE`.
pub const COOPERATIVE: u32 = 2;
/// `CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`.
pub const CLUSTER_DIMENSION: u32 = 4;
/// `CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION`.
pub const PREFERRED_CLUSTER_DIMENSION: u32 = 11;

/// What attribute `id` holds (`CUlaunchAttributeID` of CUDA 13.0).
pub fn value_of(id: u32) -> Value {
    match id {
        // IGNORE, ACCESS_POLICY_WINDOW (a device address range and ratios),
        // COOPERATIVE, SYNCHRONIZATION_POLICY, CLUSTER_DIMENSION,
        // CLUSTER_SCHEDULING_POLICY_PREFERENCE, PROGRAMMATIC_STREAM_SERIALIZATION,
        // PRIORITY, MEM_SYNC_DOMAIN_MAP, MEM_SYNC_DOMAIN,
        // PREFERRED_CLUSTER_DIMENSION, PREFERRED_SHARED_MEMORY_CARVEOUT,
        // NVLINK_UTIL_CENTRIC_SCHEDULING.
        0..=6 | 8..=11 | 14 | 16 => Value::Data,
        7 | 12 => Value::Event,
        13 => Value::GraphNode,
        _ => Value::Unknown,
    }
}

impl Attribute {
    /// The `CUevent` of an [`Value::Event`] attribute.
    pub fn event(&self) -> u64 {
        u64::from_le_bytes(self.value[..8].try_into().expect("8 bytes"))
    }

    /// Sets the `CUevent` of an [`Value::Event`] attribute.
    pub fn set_event(&mut self, event: u64) {
        self.value[..8].copy_from_slice(&event.to_le_bytes());
    }

    /// The first 4 bytes of the value as an integer (flags, `COOPERATIVE`).
    pub fn int(&self) -> i32 {
        i32::from_le_bytes(self.value[..4].try_into().expect("4 bytes"))
    }

    /// The three dimensions of a cluster attribute.
    pub fn dims(&self) -> [u32; 3] {
        let d = |i: usize| u32::from_le_bytes(self.value[4 * i..4 * i + 4].try_into().expect("4"));
        [d(0), d(1), d(2)]
    }

    /// The attributes `bytes` hold, whole ones only (`None` if the length is not a
    /// whole number of attributes or there are more than [`MAX_ATTRIBUTES`]).
    pub fn parse_all(bytes: &[u8]) -> Option<Vec<Attribute>> {
        if bytes.len() % ATTRIBUTE_SIZE != 0 || bytes.len() / ATTRIBUTE_SIZE > MAX_ATTRIBUTES {
            return None;
        }
        Some(
            bytes
                .chunks_exact(ATTRIBUTE_SIZE)
                .map(|c| Attribute {
                    id: u32::from_le_bytes(c[..4].try_into().expect("4 bytes")),
                    pad: [0; 4],
                    value: c[8..].try_into().expect("64 bytes"),
                })
                .collect(),
        )
    }

    /// The attribute's bytes, padding zeroed.
    pub fn to_bytes(&self) -> [u8; ATTRIBUTE_SIZE] {
        let mut b = [0u8; ATTRIBUTE_SIZE];
        b[..4].copy_from_slice(&self.id.to_le_bytes());
        b[8..].copy_from_slice(&self.value);
        b
    }
}

/// Reads a program's `CUlaunchConfig` and its attribute list.
///
/// # Safety
///
/// `config` is null or points to a `CUlaunchConfig` whose `attrs` is null or points
/// to `num_attrs` attributes, as `cuLaunchKernelEx` requires of its caller.
pub unsafe fn read(config: *const Config) -> Option<(Config, Vec<Attribute>)> {
    if config.is_null() {
        return None;
    }
    // SAFETY: the caller's configuration, as the API requires.
    let c = unsafe { std::ptr::read_unaligned(config) };
    let n = c.num_attrs as usize;
    if n == 0 {
        return Some((c, Vec::new()));
    }
    if c.attrs.is_null() || n > MAX_ATTRIBUTES {
        return None;
    }
    // SAFETY: `attrs` points to `num_attrs` attributes (checked non-null, bounded).
    let attrs = (0..n)
        .map(|i| unsafe { std::ptr::read_unaligned(c.attrs.add(i)) })
        .collect();
    Some((c, attrs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layouts_are_cuda_h_s() {
        assert_eq!(ATTRIBUTE_SIZE, 72);
        assert_eq!(std::mem::size_of::<Config>(), 56);
        assert_eq!(std::mem::offset_of!(Config, stream), 32);
        assert_eq!(std::mem::offset_of!(Config, num_attrs), 48);
    }

    #[test]
    fn attributes_round_trip_and_bad_lengths_are_refused() {
        let mut a = Attribute {
            id: 12,
            pad: [9; 4],
            value: [0; 64],
        };
        a.set_event(0xdead_beef);
        a.value[8] = 1;
        let b = a.to_bytes();
        let back = Attribute::parse_all(&b).unwrap();
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].event(), 0xdead_beef);
        assert_eq!(back[0].value, a.value);
        assert_eq!(value_of(back[0].id), Value::Event);
        assert!(Attribute::parse_all(&b[..71]).is_none());
        assert!(Attribute::parse_all(&vec![0; ATTRIBUTE_SIZE * (MAX_ATTRIBUTES + 1)]).is_none());
        assert_eq!(value_of(99), Value::Unknown);
        assert_eq!(value_of(13), Value::GraphNode);
        // SAFETY: a null configuration is answered, never read.
        assert!(unsafe { read(std::ptr::null()) }.is_none());
    }
}
