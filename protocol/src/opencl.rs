//! OpenCL-specific parts of the protocol: object kinds, opcodes and handle-carrying
//! info queries.
//!
//! A guest never sees a host pointer. Every OpenCL object is named on the wire by a
//! 64-bit id scoped to one session. Ids the guest assigns (for objects it creates, so
//! that creating calls can be forwarded without waiting) have the top bit clear; ids
//! the host assigns (devices, platforms, kernels made by `clCreateKernelsInProgram`)
//! have it set. 0 is the null handle.

pub mod extensions;
pub mod kernel_args;

/// Top bit of a host-assigned id.
pub const HOST_ID_BIT: u64 = 1 << 63;

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
            Kind::Kernel => 1,
            Kind::Program => 2,
            Kind::Sampler => 3,
            Kind::Mem => 4,
            Kind::Queue => 5,
            Kind::Context => 6,
            Kind::Device => 7,
            Kind::Platform => 8,
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

/// Argument tags for byte arguments.
pub mod tag {
    /// Bytes follow in the payload (`u32` length, then the bytes).
    pub const INLINE: u8 = 0;
    /// A `u16` index into the frame's data-window spans follows.
    pub const WINDOW: u8 = 1;
    /// The application passed NULL.
    pub const NULL: u8 = 2;
    /// A kernel argument naming an object: `u8` kind, `u64` id.
    pub const HANDLE: u8 = 3;
    /// Bytes too large for a frame or the window: `u64` token (inputs: then `u64`
    /// length) of bytes staged before the call with `hiraStage`, or, for an output,
    /// kept by the host after it for `hiraFetch`.
    pub const STAGED: u8 = 4;
    /// A `host_ptr` inside a shared-virtual-memory allocation: `u64` allocation id,
    /// `u64` offset; the host uses its own allocation.
    pub const SVM: u8 = 5;
    /// A buffer's initial contents that follow the creating call in `hiraFill`
    /// chunks through the data window: `u64` length. The host makes the buffer
    /// without them and writes each chunk as it comes.
    pub const STREAMED: u8 = 6;
}

/// One function of the API as the wire knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpInfo {
    pub opcode: u16,
    pub name: &'static str,
    /// The description allows forwarding this call without waiting for its reply.
    pub may_async: bool,
    /// The call may wait for the device (or for a user event another guest thread
    /// sets): a blocking flag, a synchronising call, or the `waits` flag.
    pub may_block: bool,
    /// What the call does to API objects, for migration's log.
    pub replay: Replay,
}

/// What a call does to API objects, as the API description says (`rets` and owned
/// `ouths` create, `hret` retains, `hrel` releases, the `configures` flag): the
/// record-and-replay log of a session keeps the calls that create and configure
/// objects still alive, and nothing else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replay {
    /// Neither creates, configures nor changes references (queries, transfers,
    /// launches).
    None,
    /// Makes one or more objects of this kind.
    Creates(Kind),
    /// Adds a reference to an object of this kind.
    Retains(Kind),
    /// Drops a reference to an object of this kind.
    Releases(Kind),
    /// Changes the state of its first object argument.
    Configures,
}

include!(concat!(env!("OUT_DIR"), "/opencl_ops.rs"));

/// Looks up an opcode; `None` for opcodes that name no function.
pub fn op_info(opcode: u16) -> Option<&'static OpInfo> {
    OPS.binary_search_by_key(&opcode, |o| o.opcode)
        .ok()
        .map(|i| &OPS[i])
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
        for k in 1..=9u8 {
            assert_eq!(Kind::try_from(k).unwrap() as u8, k);
        }
        assert_eq!(Kind::try_from(10), Err(10));
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
