//! Compiling CUDA C++ to PTX with NVRTC, for tests: NVRTC needs no GPU and no driver.
//! `libnvrtc.so.12` comes from PyPI's `nvidia-cuda-nvrtc-cu12` (installed by
//! `scripts/test` under `target/cuda-sdk`, see [`sdk`]).

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::PathBuf;

/// Where the CUDA headers and NVRTC are: `HIRA_CUDA_SDK`, else `target/cuda-sdk` of
/// this workspace (`scripts/lib.sh`'s `ensure_cuda_sdk` puts them there).
///
/// On a GPU machine whose toolkit is newer, `HIRA_NVRTC` names that toolkit's NVRTC
/// library instead (the headers stay the SDK's, which the guest library is built
/// against) and `HIRA_CUDA_ARCH` the virtual architecture kernels are compiled for:
/// NVRTC 13 no longer compiles for `compute_52`, the default.
pub fn sdk() -> Result<Sdk, String> {
    let root = std::env::var_os("HIRA_CUDA_SDK").map_or_else(
        || {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../target/cuda-sdk"
            ))
        },
        PathBuf::from,
    );
    let sdk = Sdk {
        include: root.join("nvidia/cuda_runtime/include"),
        nvrtc: std::env::var_os("HIRA_NVRTC").map_or_else(
            || root.join("nvidia/cuda_nvrtc/lib/libnvrtc.so.12"),
            PathBuf::from,
        ),
        arch: std::env::var("HIRA_CUDA_ARCH").unwrap_or_else(|_| "compute_52".into()),
    };
    if !sdk.include.join("cuda.h").is_file() || !sdk.nvrtc.is_file() {
        return Err(format!(
            "the CUDA headers and NVRTC are not under {} (scripts/test installs them: \
             pip install --target target/cuda-sdk nvidia-cuda-runtime-cu12 nvidia-cuda-nvrtc-cu12)",
            root.display()
        ));
    }
    Ok(sdk)
}

/// The CUDA headers and NVRTC library tests build with.
#[derive(Debug, Clone)]
pub struct Sdk {
    /// Holds `cuda.h`.
    pub include: PathBuf,
    /// `libnvrtc.so.12`.
    pub nvrtc: PathBuf,
    /// The virtual architecture test kernels are compiled for (`compute_52`).
    pub arch: String,
}

type Prog = *mut c_void;

/// Compiles `source` for `arch` (`compute_52`) and returns the PTX.
pub fn compile(sdk: &Sdk, source: &str, arch: &str) -> Result<String, String> {
    let path = CString::new(sdk.nvrtc.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: dlopen of a library path; the handle is kept for the process.
    let lib = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if lib.is_null() {
        return Err(format!("cannot load {}", sdk.nvrtc.display()));
    }
    macro_rules! sym {
        ($name:literal, $ty:ty) => {{
            // SAFETY: a C string naming an NVRTC function of this signature.
            let p = unsafe { libc::dlsym(lib, concat!($name, "\0").as_ptr().cast()) };
            if p.is_null() {
                return Err(format!("NVRTC has no {}", $name));
            }
            // SAFETY: the symbol has the C signature `$ty` (nvrtc.h).
            unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
        }};
    }
    let create = sym!(
        "nvrtcCreateProgram",
        unsafe extern "C" fn(
            *mut Prog,
            *const c_char,
            *const c_char,
            c_int,
            *const *const c_char,
            *const *const c_char,
        ) -> c_int
    );
    let compile = sym!(
        "nvrtcCompileProgram",
        unsafe extern "C" fn(Prog, c_int, *const *const c_char) -> c_int
    );
    let log_size = sym!(
        "nvrtcGetProgramLogSize",
        unsafe extern "C" fn(Prog, *mut usize) -> c_int
    );
    let log = sym!(
        "nvrtcGetProgramLog",
        unsafe extern "C" fn(Prog, *mut c_char) -> c_int
    );
    let ptx_size = sym!(
        "nvrtcGetPTXSize",
        unsafe extern "C" fn(Prog, *mut usize) -> c_int
    );
    let ptx = sym!(
        "nvrtcGetPTX",
        unsafe extern "C" fn(Prog, *mut c_char) -> c_int
    );
    let destroy = sym!(
        "nvrtcDestroyProgram",
        unsafe extern "C" fn(*mut Prog) -> c_int
    );
    let src = CString::new(source).map_err(|e| e.to_string())?;
    let opt = CString::new(format!("--gpu-architecture={arch}")).map_err(|e| e.to_string())?;
    let opts = [opt.as_ptr()];
    let mut prog: Prog = std::ptr::null_mut();
    // SAFETY: NVRTC's documented calling sequence, with buffers of the sizes it gives.
    unsafe {
        if create(
            &mut prog,
            src.as_ptr(),
            c"kernels.cu".as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        ) != 0
        {
            return Err("nvrtcCreateProgram failed".into());
        }
        let status = compile(prog, 1, opts.as_ptr());
        let mut n = 0usize;
        log_size(prog, &mut n);
        let mut buf = vec![0u8; n.max(1)];
        log(prog, buf.as_mut_ptr().cast());
        if status != 0 {
            destroy(&mut prog);
            let text = CStr::from_bytes_until_nul(&buf)
                .map_or_else(|_| String::new(), |c| c.to_string_lossy().into_owned());
            return Err(format!("NVRTC failed ({status}): {text}"));
        }
        ptx_size(prog, &mut n);
        let mut out = vec![0u8; n.max(1)];
        ptx(prog, out.as_mut_ptr().cast());
        destroy(&mut prog);
        Ok(CStr::from_bytes_until_nul(&out)
            .map_err(|e| e.to_string())?
            .to_string_lossy()
            .into_owned())
    }
}
