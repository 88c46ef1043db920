//! What NVIDIA's runtime (`libcudart`, linked into nvcc's programs) asks of the
//! driver beyond `cuda.h`: the private tables of `cuGetExportTable`
//! (`hira_apis_cuda_private::export`), served here in the guest, where the integrity
//! check's inputs (this process, its threads, the tables' addresses) are; and the
//! library calls with the runtime's fatbin wrapper.
//!
//! The tables' answers that need the host come from the remoted calls: the primary
//! context (retained once per device for the table; NVIDIA's driver hands it out
//! without a retain, which the host's driver API cannot), the devices' UUIDs and
//! PCI ids.

#![allow(clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;

use hira_apis_cuda::status;

use crate::generated;
use crate::rt::{self, CUcontext, CUfunction, CUlibrary, CUresult};

/// The primary context handed out by the table, by device.
static PRIMARY: Mutex<Option<HashMap<c_int, usize>>> = Mutex::new(None);

struct Private;

impl hira_apis_cuda_private::export::Driver for Private {
    fn driver_version(&self) -> c_int {
        let mut v = 0;
        // SAFETY: an out-pointer.
        unsafe { generated::cuDriverGetVersion(&mut v) };
        v
    }

    fn primary_context(&self, dev: c_int) -> Result<*mut c_void, CUresult> {
        let mut known = PRIMARY.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&c) = known.get_or_insert_with(HashMap::new).get(&dev) {
            return Ok(c as *mut c_void);
        }
        let mut c: CUcontext = std::ptr::null_mut();
        // SAFETY: an out-pointer and a device number the host checks.
        match unsafe { generated::cuDevicePrimaryCtxRetain(&mut c, dev) } {
            status::SUCCESS => {
                known
                    .get_or_insert_with(HashMap::new)
                    .insert(dev, c as usize);
                Ok(c)
            }
            e => Err(e),
        }
    }

    fn current_context(&self) -> *mut c_void {
        rt::current() as usize as *mut c_void
    }

    fn devices(&self) -> Result<Vec<hira_apis_cuda_private::export::Device>, CUresult> {
        let mut n = 0;
        // SAFETY: out-pointers; every answer is the host driver's, cached.
        unsafe {
            check(generated::cuDeviceGetCount(&mut n))?;
            let mut out = Vec::new();
            for dev in 0..n {
                let mut uuid = [0u8; 16];
                check(generated::cuDeviceGetUuid(uuid.as_mut_ptr().cast(), dev))?;
                // CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, _PCI_BUS_ID, _PCI_DEVICE_ID.
                let mut a = [0; 3];
                for (v, attr) in a.iter_mut().zip([50, 33, 34]) {
                    check(generated::cuDeviceGetAttribute(v, attr, dev))?;
                }
                out.push(hira_apis_cuda_private::export::Device {
                    uuid,
                    pci_domain: a[0],
                    pci_bus: a[1],
                    pci_device: a[2],
                });
            }
            Ok(out)
        }
    }

    fn load_module(&self, module: *mut *mut c_void, image: *const c_void) -> CUresult {
        // SAFETY: the runtime's out-pointer and image (a fatbin wrapper).
        unsafe { generated::cuModuleLoadData(module, image) }
    }
}

fn check(st: CUresult) -> Result<(), CUresult> {
    if st == status::SUCCESS {
        Ok(())
    } else {
        Err(st)
    }
}

static PRIVATE: Private = Private;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetExportTable(
    table: *mut *const c_void,
    id: *const [u8; 16],
) -> CUresult {
    hira_apis_cuda_private::export::install(&PRIVATE);
    // SAFETY: the caller's out-pointer and 16-byte id.
    unsafe { hira_apis_cuda_private::export::get_export_table(table, id) }
}

/// The primary context of `dev` was reset: what the runtime kept in it ends.
pub(crate) fn primary_reset(dev: c_int) {
    let known = PRIMARY
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|k| k.get(&dev).copied());
    if let Some(c) = known {
        hira_apis_cuda_private::export::context_ended(c as *mut c_void);
    }
}

/// `cuLibraryLoadData`: the code (PTX, a cubin, a fatbin or the runtime's wrapper of
/// one) goes to the host, whose driver picks the image its device runs. Options tune
/// how the host's driver keeps the code and compiles it; they are not forwarded, as
/// for `cuModuleLoadDataEx`.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLibraryLoadData(
    library: *mut CUlibrary,
    code: *const c_void,
    _jit_options: *mut c_int,
    _jit_values: *mut *mut c_void,
    _num_jit: c_uint,
    _lib_options: *mut c_int,
    _lib_values: *mut *mut c_void,
    _num_lib: c_uint,
) -> CUresult {
    if library.is_null() || code.is_null() {
        return status::INVALID_VALUE;
    }
    // SAFETY: the caller's out-pointer and code, as the API requires.
    unsafe { generated::hiraLibraryLoad(library, code) }
}

/// A kernel's function in the current context is the kernel itself: the host's
/// driver launches and queries either.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetFunction(
    func: *mut CUfunction,
    kernel: CUfunction,
) -> CUresult {
    if !rt::initialized() {
        return status::NOT_INITIALIZED;
    }
    if func.is_null() {
        return status::INVALID_VALUE;
    }
    if rt::current() == 0 {
        return status::INVALID_CONTEXT;
    }
    if !rt::has_layout(kernel as usize as u64) {
        return status::INVALID_HANDLE;
    }
    // SAFETY: checked not null.
    unsafe { func.write(kernel) };
    status::SUCCESS
}

/// `cuProfilerStart`/`Stop` (cudaProfiler.h) with no profiler attached, as NVIDIA's
/// driver answers them then: success in a context. A profiler of the guest has no
/// device to attach to; the host's is the operator's.
fn profiler() -> CUresult {
    if !rt::initialized() {
        return status::NOT_INITIALIZED;
    }
    if rt::current() == 0 {
        return status::INVALID_CONTEXT;
    }
    status::SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn cuProfilerStart() -> CUresult {
    profiler()
}

#[unsafe(no_mangle)]
pub extern "C" fn cuProfilerStop() -> CUresult {
    profiler()
}
