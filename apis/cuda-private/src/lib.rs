//! The CUDA driver's private interfaces that NVIDIA's runtime (`libcudart`, which
//! nvcc links statically into every program by default) relies on, shared by Hira's
//! guest `libcuda.so.1` and the CPU test executor:
//!
//! - [`fatbin`]: the containers of device code the runtime registers;
//! - [`context`]: `cuCtxCreate_v4`'s parameters;
//! - [`procs`]: the entry point `cuGetProcAddress` gives for a name and version;
//! - [`export`]: the private tables of `cuGetExportTable`, integrity check included;
//! - [`launch`]: `cuLaunchKernelEx`'s configuration and attributes;
//! - [`graph`]: CUDA graphs and stream capture, kept where the program runs;
//! - [`copy2d`]: `cuMemcpy2D`'s description of a copy;
//! - [`texture`]: CUDA arrays', texture objects' and surface objects' descriptions;
//! - [`pointer`]: the values of `cuPointerGetAttribute(s)`;
//! - [`pool`]: stream-ordered allocation and memory pools, kept where the program runs;
//! - [`vmm`]: the virtual-memory-management calls' structures and signatures;
//! - [`variables`]: the names of a module's variables, from its PTX.

pub mod context;
pub mod copy2d;
pub mod export;
pub mod fatbin;
pub mod graph;
pub mod launch;
pub mod pointer;
pub mod pool;
pub mod procs;
pub mod texture;
pub mod variables;
pub mod vmm;

unsafe extern "C" {
    static stdout: *mut libc::FILE;
    static stderr: *mut libc::FILE;
}

/// Writes what the device printed (`printf` in a kernel) or what the driver reports
/// as NVIDIA's driver does: through the C library's `stdout` (descriptor 1) or
/// `stderr`, so that it lands among the program's own buffered output in the order
/// it was printed, as on a GPU when output goes to a file or a pipe.
pub fn print_to_stdio(fd: i32, data: &[u8]) {
    // SAFETY: the C library's streams, valid for the life of the process.
    let stream = unsafe { if fd == 2 { stderr } else { stdout } };
    if data.is_empty() || stream.is_null() {
        return;
    }
    // SAFETY: `data` is valid for its length; the stream is the C library's.
    unsafe { libc::fwrite(data.as_ptr().cast(), 1, data.len(), stream) };
}
