//! The OpenCL API on Hira's wire: object kinds, opcodes (generated from
//! `protocol/api/opencl.api`), and the info queries whose values carry object handles.
//!
//! A guest never sees a host pointer. Every OpenCL object is named on the wire by a
//! 64-bit id scoped to one session (`hira_protocol::api::HOST_ID_BIT`).

pub mod extensions;
pub mod kernel_args;
pub mod sizes;

pub use hira_protocol::api::{HOST_ID_BIT, Replay, tag};

/// One OpenCL function as the wire knows it.
pub type OpInfo = hira_protocol::api::OpInfo<Kind>;

/// The kinds of OpenCL object a handle can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    Platform = 1,
    Device = 2,
    Context = 3,
    Queue = 4,
    Mem = 5,
    Sampler = 6,
    Program = 7,
    Kernel = 8,
    Event = 9,
    /// `cl_khr_command_buffer`'s recorded command sequence.
    CommandBuffer = 10,
}

impl Kind {
    /// The OpenCL error code for an invalid object of this kind.
    pub fn invalid_code(self) -> i32 {
        match self {
            Kind::Platform => -32,
            Kind::Device => -33,
            Kind::Context => -34,
            Kind::Queue => -36,
            Kind::Mem => -38,
            Kind::Sampler => -41,
            Kind::Program => -44,
            Kind::Kernel => -48,
            Kind::Event => -58,
            Kind::CommandBuffer => -1138,
        }
    }

    /// Whether objects of this kind are reference counted by the application. Root
    /// devices and platforms are not: the host owns them.
    pub fn refcounted(self) -> bool {
        !matches!(self, Kind::Platform | Kind::Device)
    }

    /// Order in which a session's objects are released at teardown: dependents first.
    pub fn teardown_rank(self) -> u8 {
        match self {
            Kind::Event => 0,
            // It holds the kernels, memory objects and queues it recorded.
            Kind::CommandBuffer => 1,
            Kind::Kernel => 2,
            Kind::Program => 3,
            Kind::Sampler => 4,
            Kind::Mem => 5,
            Kind::Queue => 6,
            Kind::Context => 7,
            Kind::Device => 8,
            Kind::Platform => 9,
        }
    }
}

impl TryFrom<u8> for Kind {
    type Error = u8;

    fn try_from(v: u8) -> Result<Self, u8> {
        Ok(match v {
            1 => Kind::Platform,
            2 => Kind::Device,
            3 => Kind::Context,
            4 => Kind::Queue,
            5 => Kind::Mem,
            6 => Kind::Sampler,
            7 => Kind::Program,
            8 => Kind::Kernel,
            9 => Kind::Event,
            10 => Kind::CommandBuffer,
            other => return Err(other),
        })
    }
}

/// The callback id sent for a callback argument when the application passed no
/// function but a non-null `user_data`: the host sees the same (NULL, non-NULL) pair
/// and answers it as natively (`CL_INVALID_VALUE` where the API says so). Id 0 is
/// (NULL, NULL).
pub const CALLBACK_DATA_ONLY: u64 = u64::MAX;

/// Set in `param_name` of `clGetKernelArgInfo` when the shim asks for itself (to learn
/// argument kinds): the API server answers from the argument information it always
/// builds with, where the application, whose program was built without
/// `-cl-kernel-arg-info`, gets `CL_KERNEL_ARG_INFO_NOT_AVAILABLE` as natively.
pub const ARG_INFO_FOR_SHIM: u32 = 1 << 31;

/// Notification types: the `opcode` of a `Notify` frame, naming which kind of
/// application callback it delivers.
pub mod notify {
    /// `u64` callback id, error info bytes, private info bytes.
    pub const CONTEXT: u16 = 1;
    /// `u64` callback id, `u64` program id.
    pub const PROGRAM: u16 = 2;
    /// `u64` callback id, `u64` event id, `i32` execution status.
    pub const EVENT: u16 = 3;
    /// `u64` callback id, `u64` memory object id (0 once it is gone).
    pub const MEM: u16 = 4;
    /// `u64` callback id: a context is being destroyed.
    pub const DESTRUCTOR: u16 = 5;
}

include!(concat!(env!("OUT_DIR"), "/opencl_ops.rs"));

/// Looks up an opcode; `None` for opcodes that name no function.
pub fn op_info(opcode: u16) -> Option<&'static OpInfo> {
    hira_protocol::api::find(OPS, opcode)
}

/// How the value of an info query carries handles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InfoHandles {
    /// One handle of this kind.
    One(Kind),
    /// An array of handles of this kind.
    Array(Kind),
    /// A zero-terminated context property list whose `CL_CONTEXT_PLATFORM` value is a
    /// platform handle.
    ContextProperties,
}

/// `CL_CONTEXT_PLATFORM`.
pub const CL_CONTEXT_PLATFORM: u64 = 0x1084;

/// `CL_DEVICE_PARTITION_EQUALLY`, `_BY_COUNTS` and `_BY_AFFINITY_DOMAIN`.
pub const CL_DEVICE_PARTITION_EQUALLY: u64 = 0x1086;
pub const CL_DEVICE_PARTITION_BY_COUNTS: u64 = 0x1087;
pub const CL_DEVICE_PARTITION_BY_AFFINITY_DOMAIN: u64 = 0x1088;
/// Longest partition property list either side reads (a count per compute unit of a
/// large host, and the type and terminators).
pub const MAX_PARTITION_WORDS: usize = 4096 + 3;

/// The shape of a device partition property list read so far, `words`: `Some(true)`
/// when it is whole (its last word ends it), `Some(false)` when it needs more, `None`
/// when it is not a list the specification defines (an unknown type, a missing
/// terminator). `EQUALLY` and `BY_AFFINITY_DOMAIN` take one value then 0;
/// `BY_COUNTS` takes counts to `CL_DEVICE_PARTITION_BY_COUNTS_LIST_END` (0), then 0.
/// A list is whole only where its shape ends it, so no shorter prefix of a whole
/// list is whole.
pub fn partition_words(words: &[u64]) -> Option<bool> {
    let (&kind, rest) = words.split_first()?;
    match kind {
        CL_DEVICE_PARTITION_EQUALLY | CL_DEVICE_PARTITION_BY_AFFINITY_DOMAIN => match rest {
            [] | [_] => Some(false),
            [_, 0] => Some(true),
            _ => None,
        },
        CL_DEVICE_PARTITION_BY_COUNTS => match rest.iter().position(|&c| c == 0) {
            None => Some(false),
            Some(end) if end + 1 == rest.len() => Some(false),
            Some(end) if end + 2 == rest.len() && rest[end + 1] == 0 => Some(true),
            Some(_) => None,
        },
        _ => None,
    }
}
/// `CL_PROGRAM_BINARIES`: its value is an array of pointers to caller buffers.
pub const CL_PROGRAM_BINARIES: u32 = 0x1166;
/// `CL_PROGRAM_BINARY_SIZES`.
pub const CL_PROGRAM_BINARY_SIZES: u32 = 0x1165;

/// Info queries whose values hold object handles, by function and parameter. The API
/// server rewrites host pointers in these values into session ids; the guest rewrites
/// ids into its own objects.
pub const INFO_HANDLES: &[(&str, u32, InfoHandles)] = &[
    ("clGetDeviceInfo", 0x1031, InfoHandles::One(Kind::Platform)),
    ("clGetDeviceInfo", 0x1042, InfoHandles::One(Kind::Device)),
    ("clGetContextInfo", 0x1081, InfoHandles::Array(Kind::Device)),
    ("clGetContextInfo", 0x1082, InfoHandles::ContextProperties),
    (
        "clGetCommandQueueInfo",
        0x1090,
        InfoHandles::One(Kind::Context),
    ),
    (
        "clGetCommandQueueInfo",
        0x1091,
        InfoHandles::One(Kind::Device),
    ),
    (
        "clGetCommandQueueInfo",
        0x1095,
        InfoHandles::One(Kind::Queue),
    ),
    (
        "clGetMemObjectInfo",
        0x1106,
        InfoHandles::One(Kind::Context),
    ),
    ("clGetMemObjectInfo", 0x1107, InfoHandles::One(Kind::Mem)),
    ("clGetImageInfo", 0x1118, InfoHandles::One(Kind::Mem)),
    ("clGetSamplerInfo", 0x1151, InfoHandles::One(Kind::Context)),
    ("clGetProgramInfo", 0x1161, InfoHandles::One(Kind::Context)),
    ("clGetProgramInfo", 0x1163, InfoHandles::Array(Kind::Device)),
    ("clGetKernelInfo", 0x1193, InfoHandles::One(Kind::Context)),
    ("clGetKernelInfo", 0x1194, InfoHandles::One(Kind::Program)),
    ("clGetEventInfo", 0x11D0, InfoHandles::One(Kind::Queue)),
    ("clGetEventInfo", 0x11D4, InfoHandles::One(Kind::Context)),
    (
        "clGetCommandBufferInfoKHR",
        0x1294,
        InfoHandles::Array(Kind::Queue),
    ),
];

/// Whether `(function, param)` carries handles, and how.
pub fn info_handles(function: &str, param: u32) -> Option<InfoHandles> {
    INFO_HANDLES
        .iter()
        .find(|(f, p, _)| *f == function && *p == param)
        .map(|(_, _, h)| *h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcodes_are_sorted_and_unique() {
        assert!(OPS.windows(2).all(|w| w[0].opcode < w[1].opcode));
    }

    #[test]
    fn unknown_opcode_has_no_info() {
        assert!(op_info(0).is_none());
        assert!(op_info(u16::MAX).is_none());
    }

    #[test]
    fn known_opcode_is_found_by_number() {
        let info = op_info(op::clGetDeviceInfo).unwrap();
        assert_eq!(info.name, "clGetDeviceInfo");
    }

    #[test]
    fn kind_round_trips_through_u8() {
        for k in 1..=10u8 {
            assert_eq!(Kind::try_from(k).unwrap() as u8, k);
        }
        assert_eq!(Kind::try_from(11), Err(11));
    }

    #[test]
    fn context_devices_carry_a_device_array() {
        assert_eq!(
            info_handles("clGetContextInfo", 0x1081),
            Some(InfoHandles::Array(Kind::Device))
        );
        assert_eq!(info_handles("clGetDeviceInfo", 0x1000), None);
    }
}

#[cfg(test)]
mod partition_tests {
    use super::*;

    /// Whether `words` is exactly one whole list: every shorter prefix needs more.
    fn whole(words: &[u64]) -> bool {
        (1..words.len()).all(|i| partition_words(&words[..i]) == Some(false))
            && partition_words(words) == Some(true)
    }

    #[test]
    fn partition_lists_have_the_shapes_the_specification_gives() {
        assert!(whole(&[CL_DEVICE_PARTITION_EQUALLY, 1, 0]));
        assert!(whole(&[CL_DEVICE_PARTITION_BY_AFFINITY_DOMAIN, 0x20, 0]));
        assert!(whole(&[CL_DEVICE_PARTITION_BY_COUNTS, 1, 1, 0, 0]));
        assert!(whole(&[CL_DEVICE_PARTITION_BY_COUNTS, 0, 0]));
        assert_eq!(partition_words(&[]), None);
        assert_eq!(partition_words(&[0]), None, "no type");
        assert_eq!(partition_words(&[0x1234, 1, 0]), None, "unknown type");
        assert_eq!(
            partition_words(&[CL_DEVICE_PARTITION_EQUALLY, 1, 5]),
            None,
            "a second value"
        );
        assert_eq!(
            partition_words(&[CL_DEVICE_PARTITION_BY_COUNTS, 1, 0, 7]),
            None,
            "no 0 after the list's end"
        );
        assert_eq!(
            partition_words(&[CL_DEVICE_PARTITION_BY_COUNTS, 1, 2]),
            Some(false)
        );
    }
}
