//! Hira's guest shim for CUDA: `libcuda.so.1` with the driver API's C ABI, exporting
//! the versioned names programs link against, each call remoted to the host.
//!
//! - `generated`: one exported function per remoted call, from
//!   `protocol/api/cuda.api` by `hira-apigen` (CUDA profile).
//! - [`rt`]: the session (connection to the host), marshalling, the object ids the
//!   application holds as handles, each thread's context stack, kernels' parameter
//!   layouts.
//! - [`local`]: what the guest answers itself: the context stack, host memory the
//!   driver would pin (ordinary memory here), error names, `cuGetProcAddress`.
//! - [`private`]: what NVIDIA's runtime asks of a driver beyond `cuda.h`: the
//!   private tables of `cuGetExportTable`, libraries from its fatbin wrappers.
//!
//! Installed as `libcuda.so.1` on the library path (`scripts/guest-install`), it
//! takes the place of NVIDIA's driver library for unmodified programs.

mod checks;
mod graphs;
pub mod local;
mod notes;
pub mod private;
pub mod rt;
mod stream;

/// Generated exported functions.
pub mod generated {
    #![allow(
        clippy::missing_safety_doc,
        clippy::undocumented_unsafe_blocks,
        clippy::needless_ifs,
        clippy::collapsible_if
    )]
    use std::ffi::{c_char, c_int, c_uint, c_void};

    use hira_apis_cuda::{Kind, op};

    use crate::rt::{
        CUarray, CUcontext, CUevent, CUfunction, CUlibrary, CUmodule, CUresult, CUstream, Call,
    };

    include!(concat!(env!("OUT_DIR"), "/cuda_guest.rs"));
}
