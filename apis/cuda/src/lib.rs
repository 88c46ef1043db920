//! The CUDA driver API on Hira's wire: object kinds and opcodes (generated from
//! `protocol/api/cuda.api`).
//!
//! Objects (contexts, modules, functions, streams, events, libraries, arrays) are named by 64-bit
//! session ids (`hira_protocol::api::HOST_ID_BIT`); a guest application sees the id
//! as the handle's value. Device pointers are not objects: they are the host's
//! device addresses, which only the session's own contexts can reach. Nor are texture
//! and surface objects: kernels take them as arguments, so they are the host's
//! values too.

pub use hira_protocol::api::{HOST_ID_BIT, Replay};

/// One CUDA function as the wire knows it.
pub type OpInfo = hira_protocol::api::OpInfo<Kind>;

/// The kinds of CUDA object a handle can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    Context = 1,
    Module = 2,
    Function = 3,
    Stream = 4,
    Event = 5,
    /// A library (`cuLibraryLoadData`): code loaded for every context.
    Library = 6,
    /// A CUDA array (`cuArrayCreate`, `cuArray3DCreate`): texels laid out as the
    /// device likes, reached by copies and by texture and surface objects.
    Array = 7,
}

impl Kind {
    /// The driver's error for an invalid object of this kind.
    pub fn invalid_code(self) -> i32 {
        match self {
            Kind::Context => status::INVALID_CONTEXT,
            _ => status::INVALID_HANDLE,
        }
    }
}

/// `CUresult` values Hira itself returns.
pub mod status {
    pub const SUCCESS: i32 = 0;
    pub const INVALID_VALUE: i32 = 1;
    pub const OUT_OF_MEMORY: i32 = 2;
    pub const NOT_INITIALIZED: i32 = 3;
    pub const NO_DEVICE: i32 = 100;
    pub const INVALID_CONTEXT: i32 = 201;
    pub const INVALID_HANDLE: i32 = 400;
    pub const NOT_FOUND: i32 = 500;
    pub const NOT_READY: i32 = 600;
    pub const NOT_SUPPORTED: i32 = 801;
    pub const UNKNOWN: i32 = 999;
}

/// The special stream handles: the NULL stream, `CU_STREAM_LEGACY`,
/// `CU_STREAM_PER_THREAD`; they pass as they are.
pub const SPECIAL_STREAMS: [u64; 3] = [0, 1, 2];

include!(concat!(env!("OUT_DIR"), "/cuda_ops.rs"));

/// Looks up an opcode; `None` for opcodes that name no function.
pub fn op_info(opcode: u16) -> Option<&'static OpInfo> {
    hira_protocol::api::find(OPS, opcode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_comes_from_the_description() {
        assert_eq!(API, hira_protocol::handshake::ApiId(2));
        assert_eq!(op_info(op::cuMemAlloc_v2).unwrap().name, "cuMemAlloc_v2");
        assert!(OPS.windows(2).all(|w| w[0].opcode < w[1].opcode));
        assert_eq!(
            op_info(op::cuCtxDestroy_v2).unwrap().replay,
            Replay::Releases(Kind::Context)
        );
        assert!(op_info(op::cuCtxSynchronize).unwrap().may_block);
    }
}
