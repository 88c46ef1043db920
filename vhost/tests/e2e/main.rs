//! End-to-end tests: real C OpenCL programs, clinfo, and hostile guests against the
//! real daemon, API servers and host OpenCL (PoCL); CUDA programs against the host's
//! driver (the CPU test executor where there is no GPU, see `cuda.rs`).

mod cuda;
mod cudart;
mod cupy;
mod dataplane;
mod hardening;
mod host_memory;
mod isolation;
mod kernel_args;
mod libvirt;
mod malformed;
mod migration;
mod output;
mod piglit;
mod programs;
mod pyopencl;
mod quota;
mod readme;
mod remote;
mod scheduling;
mod shim;
mod support;
mod vm;
mod vms;
mod vsock;
