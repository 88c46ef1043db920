//! `libhira_opencl.so`: Hira's guest shim, a real OpenCL ICD.
//!
//! The system's OpenCL ICD loader finds this library through
//! `/etc/OpenCL/vendors/hira.icd` (or `OCL_ICD_VENDORS`), calls
//! [`clIcdGetPlatformIDsKHR`], and from then on reaches every function through the
//! dispatch table at the start of each object this library hands out.
//!
//! - [`icd`]: the dispatch table and the entry points the loader looks up by name;
//!   slots with no implementation fail cleanly with `CL_INVALID_OPERATION`.
//! - `generated`: one `extern "C"` function per remoted call, generated from
//!   `protocol/api/opencl.api` by `hira-apigen`.
//! - [`marshal`]: the request builder and reply reader the generated code uses, and
//!   info queries (with the cache of immutable ones).
//! - [`rt`]: the process-wide runtime: the connection, the guest objects that stand
//!   for host objects, reference counts, callbacks, panic containment.
//! - `checks`: the argument checks of calls forwarded without waiting, so they return
//!   the host's error codes themselves (the `check` flag of the API description).
//! - `includes`: `#include` resolution against the guest's files; builds ship the
//!   headers they need.
//! - `known`: event status and profiling answered from what replies that waited
//!   reported.
//! - [`local`]: calls the guest implements itself on top of remoted ones (map/unmap,
//!   extension lookups).
//! - [`svm`]: coarse-grained buffer SVM on guest memory and host allocations.
//! - [`sizes`]: byte counts of arguments, as the API defines them.
//! - `stream`: large transfers and initial contents streamed through the window in
//!   chunks.
//! - [`stats`]: per-call statistics printed at exit (`HIRA_STATS=1`).

mod checks;
pub mod icd;
mod icd_slots;
mod includes;
mod known;
pub mod local;
pub mod marshal;
mod nontemporal;
mod notes;
pub mod rt;
pub mod sizes;
pub mod stats;
mod stream;
pub mod svm;
mod zero_copy;

/// The remoted functions, generated from the API description.
#[allow(clippy::missing_safety_doc)]
pub mod generated {
    use std::ffi::{c_char, c_uchar, c_void};
    use std::mem::size_of;

    use hira_apis_opencl::{Kind, op};
    use libc::size_t;
    use opencl_sys::*;

    use crate::marshal::Call;
    use crate::sizes;

    use opencl_sys::CL_INVALID_EVENT_WAIT_LIST;

    include!(concat!(env!("OUT_DIR"), "/opencl_guest.rs"));
}

pub use icd::{
    clGetExtensionFunctionAddress, clGetExtensionFunctionAddressForPlatform, clIcdGetPlatformIDsKHR,
};
