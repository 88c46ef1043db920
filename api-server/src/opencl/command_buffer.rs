//! `cl_khr_command_buffer`, forwarded where the host implements the version whose
//! entry points Hira knows: 0.9.0 (PoCL 3).
//!
//! The extension's functions are not in the ICD loader's exports, so they are looked
//! up once from the host platform (`clGetExtensionFunctionAddressForPlatform`) with
//! the C signatures of that version (`CL/cl_ext.h`, 0.9.0). Later versions add a
//! `properties` argument to every `clCommand*` function; on a host reporting any other
//! version, or none, the extension is taken out of the device's extension lists (so
//! the guest never sees it) and every call answers `CL_INVALID_OPERATION`.
//!
//! Enqueuing a command buffer runs its kernels on the device: it is a device command
//! like a kernel launch (timed, and held while the VM is ahead of its share), charged
//! to the queue it runs on.

#![allow(non_snake_case)]

use std::collections::HashMap;
use std::ffi::{CStr, c_void};
use std::sync::{LazyLock, Mutex, OnceLock};

use cl3::OpenCl;
use opencl_sys::{
    cl_command_buffer_khr, cl_command_buffer_properties_khr, cl_command_queue, cl_device_id,
    cl_event, cl_int, cl_kernel, cl_mem, cl_mutable_command_khr, cl_platform_id, cl_sync_point_khr,
    cl_uint,
};

use super::Session;

/// The version of `cl_khr_command_buffer` whose entry points this module calls.
/// `CL_MAKE_VERSION(0, 9, 0)`.
pub const VERSION: u32 = 9 << 12;
/// The extension's name.
pub const NAME: &str = "cl_khr_command_buffer";
use opencl_sys::CL_DEVICE_EXTENSIONS;
use opencl_sys::CL_DEVICE_EXTENSIONS_WITH_VERSION;
use opencl_sys::CL_INVALID_VALUE;

type Props = cl_command_buffer_properties_khr;
type Sync = cl_sync_point_khr;
type Mutable = cl_mutable_command_khr;

/// The host's entry points, with the 0.9.0 signatures.
#[derive(Debug)]
struct Fns {
    create: unsafe extern "C" fn(
        cl_uint,
        *const cl_command_queue,
        *const Props,
        *mut cl_int,
    ) -> cl_command_buffer_khr,
    finalize: unsafe extern "C" fn(cl_command_buffer_khr) -> cl_int,
    retain: unsafe extern "C" fn(cl_command_buffer_khr) -> cl_int,
    release: unsafe extern "C" fn(cl_command_buffer_khr) -> cl_int,
    enqueue: unsafe extern "C" fn(
        cl_uint,
        *mut cl_command_queue,
        cl_command_buffer_khr,
        cl_uint,
        *const cl_event,
        *mut cl_event,
    ) -> cl_int,
    barrier: unsafe extern "C" fn(
        cl_command_buffer_khr,
        cl_command_queue,
        cl_uint,
        *const Sync,
        *mut Sync,
        *mut Mutable,
    ) -> cl_int,
    copy_buffer: unsafe extern "C" fn(
        cl_command_buffer_khr,
        cl_command_queue,
        cl_mem,
        cl_mem,
        usize,
        usize,
        usize,
        cl_uint,
        *const Sync,
        *mut Sync,
        *mut Mutable,
    ) -> cl_int,
    copy_buffer_rect: unsafe extern "C" fn(
        cl_command_buffer_khr,
        cl_command_queue,
        cl_mem,
        cl_mem,
        *const usize,
        *const usize,
        *const usize,
        usize,
        usize,
        usize,
        usize,
        cl_uint,
        *const Sync,
        *mut Sync,
        *mut Mutable,
    ) -> cl_int,
    copy_buffer_to_image: unsafe extern "C" fn(
        cl_command_buffer_khr,
        cl_command_queue,
        cl_mem,
        cl_mem,
        usize,
        *const usize,
        *const usize,
        cl_uint,
        *const Sync,
        *mut Sync,
        *mut Mutable,
    ) -> cl_int,
    copy_image: unsafe extern "C" fn(
        cl_command_buffer_khr,
        cl_command_queue,
        cl_mem,
        cl_mem,
        *const usize,
        *const usize,
        *const usize,
        cl_uint,
        *const Sync,
        *mut Sync,
        *mut Mutable,
    ) -> cl_int,
    copy_image_to_buffer: unsafe extern "C" fn(
        cl_command_buffer_khr,
        cl_command_queue,
        cl_mem,
        cl_mem,
        *const usize,
        *const usize,
        usize,
        cl_uint,
        *const Sync,
        *mut Sync,
        *mut Mutable,
    ) -> cl_int,
    fill_buffer: unsafe extern "C" fn(
        cl_command_buffer_khr,
        cl_command_queue,
        cl_mem,
        *const c_void,
        usize,
        usize,
        usize,
        cl_uint,
        *const Sync,
        *mut Sync,
        *mut Mutable,
    ) -> cl_int,
    fill_image: unsafe extern "C" fn(
        cl_command_buffer_khr,
        cl_command_queue,
        cl_mem,
        *const c_void,
        *const usize,
        *const usize,
        cl_uint,
        *const Sync,
        *mut Sync,
        *mut Mutable,
    ) -> cl_int,
    ndrange: unsafe extern "C" fn(
        cl_command_buffer_khr,
        cl_command_queue,
        *const Props,
        cl_kernel,
        cl_uint,
        *const usize,
        *const usize,
        *const usize,
        cl_uint,
        *const Sync,
        *mut Sync,
        *mut Mutable,
    ) -> cl_int,
    info: unsafe extern "C" fn(
        cl_command_buffer_khr,
        cl_uint,
        usize,
        *mut c_void,
        *mut usize,
    ) -> cl_int,
}

/// The host's entry points, once looked up (`None`: not forwarded).
static FNS: OnceLock<Option<Fns>> = OnceLock::new();

/// The queue each command buffer was made for, by host handle: the queue an enqueue
/// without queues runs on, for its device time.
static QUEUES: LazyLock<Mutex<HashMap<usize, usize>>> = LazyLock::new(Mutex::default);

fn made_on() -> std::sync::MutexGuard<'static, HashMap<usize, usize>> {
    QUEUES.lock().unwrap_or_else(|e| e.into_inner())
}

fn fns() -> Option<&'static Fns> {
    FNS.get().and_then(Option::as_ref)
}

/// Whether the host's command buffers are forwarded.
pub fn forwarded() -> bool {
    fns().is_some()
}

/// The version of the extension `device` reports (`CL_DEVICE_EXTENSIONS_WITH_VERSION`),
/// if it reports it.
fn device_version(rt: &OpenCl, device: cl_device_id) -> Option<u32> {
    let mut size = 0usize;
    let query = |size: usize, value: *mut c_void, ret: *mut usize| {
        rt.clGetDeviceInfo(device, CL_DEVICE_EXTENSIONS_WITH_VERSION, size, value, ret)
    };
    if query(0, std::ptr::null_mut(), &mut size) != Some(0) || size == 0 {
        return None;
    }
    let mut buf = vec![0u8; size];
    if query(size, buf.as_mut_ptr().cast(), std::ptr::null_mut()) != Some(0) {
        return None;
    }
    buf.chunks_exact(hira_apis_opencl::extensions::NAME_VERSION_LEN)
        .find(|e| e[4..].split(|&b| b == 0).next() == Some(NAME.as_bytes()))
        .map(|e| u32::from_le_bytes([e[0], e[1], e[2], e[3]]))
}

/// The function pointer `F` at address `p`.
///
/// # Safety
/// `F` must be a function pointer type whose signature is the one of the function at
/// `p`.
unsafe fn entry<F>(p: *mut c_void) -> F {
    assert_eq!(size_of::<F>(), size_of::<*mut c_void>());
    // SAFETY: per the contract, `p` is a function of type `F`, of a pointer's size.
    unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
}

/// Looks the entry points up on `platform` if every device of `devices` that has the
/// extension reports version 0.9.0 and at least one has it. Called once, at start.
pub fn resolve(rt: &OpenCl, platform: cl_platform_id, devices: &[cl_device_id]) {
    let versions: Vec<u32> = devices
        .iter()
        .filter_map(|&d| device_version(rt, d))
        .collect();
    if versions.is_empty() || versions.iter().any(|&v| v != VERSION) {
        if !versions.is_empty() {
            log::info!(
                "{NAME} not forwarded: the host reports version {:#x}, Hira knows {VERSION:#x}",
                versions[0]
            );
        }
        let _ = FNS.set(None);
        return;
    }
    let look = |name: &CStr| -> Option<*mut c_void> {
        rt.clGetExtensionFunctionAddressForPlatform(platform, name.as_ptr())
            .filter(|p| !p.is_null())
    };
    let found = (|| {
        // SAFETY: each pointer is the host's entry point of that name, whose C
        // signature in version 0.9.0 (checked above) is the one it is cast to.
        unsafe {
            Some(Fns {
                create: entry(look(c"clCreateCommandBufferKHR")?),
                finalize: entry(look(c"clFinalizeCommandBufferKHR")?),
                retain: entry(look(c"clRetainCommandBufferKHR")?),
                release: entry(look(c"clReleaseCommandBufferKHR")?),
                enqueue: entry(look(c"clEnqueueCommandBufferKHR")?),
                barrier: entry(look(c"clCommandBarrierWithWaitListKHR")?),
                copy_buffer: entry(look(c"clCommandCopyBufferKHR")?),
                copy_buffer_rect: entry(look(c"clCommandCopyBufferRectKHR")?),
                copy_buffer_to_image: entry(look(c"clCommandCopyBufferToImageKHR")?),
                copy_image: entry(look(c"clCommandCopyImageKHR")?),
                copy_image_to_buffer: entry(look(c"clCommandCopyImageToBufferKHR")?),
                fill_buffer: entry(look(c"clCommandFillBufferKHR")?),
                fill_image: entry(look(c"clCommandFillImageKHR")?),
                ndrange: entry(look(c"clCommandNDRangeKernelKHR")?),
                info: entry(look(c"clGetCommandBufferInfoKHR")?),
            })
        }
    })();
    if found.is_none() {
        log::info!("{NAME} not forwarded: the host platform does not give its entry points");
    }
    let _ = FNS.set(found);
}

/// Takes the extension out of a device's extension list (`CL_DEVICE_EXTENSIONS`) or
/// name-version array (`..._WITH_VERSION`) when it is not forwarded.
pub fn mask_unforwarded(param: u32, buf: &mut Vec<u8>) {
    if forwarded() {
        return;
    }
    super::info::remove_extension(
        NAME,
        param,
        (CL_DEVICE_EXTENSIONS, CL_DEVICE_EXTENSIONS_WITH_VERSION),
        buf,
    );
}

/// Takes one more reference to a command buffer.
pub(crate) fn retain(p: *mut c_void) -> Option<cl_int> {
    // SAFETY: `p` is a live command buffer of the host (the handle table's).
    fns().map(|f| unsafe { (f.retain)(p) })
}

/// Releases one reference to a command buffer.
pub(crate) fn release(p: *mut c_void) -> Option<cl_int> {
    // SAFETY: as for `retain`.
    let r = fns().map(|f| unsafe { (f.release)(p) });
    if r == Some(0) {
        // The host may reuse the handle once the last reference is gone; a stale
        // queue stays harmless as the next buffer made there replaces it.
        made_on().remove(&(p as usize));
    }
    r
}

/// # Safety
/// As `clCreateCommandBufferKHR`.
pub unsafe fn clCreateCommandBufferKHR(
    _s: &mut Session<'_>,
    num_queues: cl_uint,
    queues: *const cl_command_queue,
    properties: *const Props,
    errcode_ret: *mut cl_int,
) -> Option<cl_command_buffer_khr> {
    let f = fns()?;
    // SAFETY: forwarded contract.
    let b = unsafe { (f.create)(num_queues, queues, properties, errcode_ret) };
    if !b.is_null() && num_queues > 0 && !queues.is_null() {
        // SAFETY: `queues` holds `num_queues` handles.
        made_on().insert(b as usize, unsafe { *queues } as usize);
    }
    Some(b)
}

/// # Safety
/// As `clRetainCommandBufferKHR`.
pub unsafe fn clRetainCommandBufferKHR(
    _s: &mut Session<'_>,
    b: cl_command_buffer_khr,
) -> Option<cl_int> {
    retain(b)
}

/// # Safety
/// As `clReleaseCommandBufferKHR`.
pub unsafe fn clReleaseCommandBufferKHR(
    _s: &mut Session<'_>,
    b: cl_command_buffer_khr,
) -> Option<cl_int> {
    release(b)
}

/// Runs a command buffer: a device command, timed and held by the VM's decision like
/// a kernel launch, on the first queue named or the one it was made for.
///
/// # Safety
/// As `clEnqueueCommandBufferKHR`.
pub unsafe fn clEnqueueCommandBufferKHR(
    s: &mut Session<'_>,
    num_queues: cl_uint,
    queues: *mut cl_command_queue,
    b: cl_command_buffer_khr,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> Option<cl_int> {
    let f = fns()?;
    let queue = if num_queues > 0 && !queues.is_null() {
        // SAFETY: `queues` holds `num_queues` handles.
        unsafe { *queues }
    } else {
        made_on()
            .get(&(b as usize))
            .map_or(std::ptr::null_mut(), |&q| q as cl_command_queue)
    };
    let gate = if queue.is_null() {
        None
    } else {
        s.admit(queue)
    };
    let mut wait: Vec<cl_event> = Vec::new();
    let (n, list) = match &gate {
        Some(g) => {
            if num_events_in_wait_list > 0 && !event_wait_list.is_null() {
                // SAFETY: the list holds `num_events_in_wait_list` events.
                wait.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(event_wait_list, num_events_in_wait_list as usize)
                });
            }
            wait.push(g.event);
            (num_events_in_wait_list + 1, wait.as_ptr())
        }
        None => (num_events_in_wait_list, event_wait_list),
    };
    let mut own: cl_event = std::ptr::null_mut();
    let slot = if event.is_null() { &mut own } else { event };
    // SAFETY: forwarded contract; `slot` is valid for one write.
    let status = unsafe { (f.enqueue)(num_queues, queues, b, n, list, slot) };
    if queue.is_null() {
        if !own.is_null() {
            // SAFETY: the event this call made for itself.
            s.rt().clReleaseEvent(own);
        }
    } else {
        // SAFETY: `slot` points to the guest's event slot or `own`, which the host
        // wrote (or left null) above.
        let made = unsafe { *slot };
        s.device_command(queue, status, gate, made, event.is_null());
    }
    Some(status)
}

/// The recording calls that go to the host as they are: each takes the session and
/// the call's arguments, and calls the host's entry point `$field` with them.
macro_rules! forwarded {
    ($($name:ident => $field:ident ($($arg:ident: $ty:ty),* $(,)?);)*) => {$(
        #[doc = concat!("# Safety\nAs `", stringify!($name), "`.")]
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $name(_s: &mut Session<'_>, $($arg: $ty),*) -> Option<cl_int> {
            // SAFETY: forwarded contract.
            fns().map(|f| unsafe { (f.$field)($($arg),*) })
        }
    )*};
}

forwarded! {
    clFinalizeCommandBufferKHR => finalize(b: cl_command_buffer_khr);
    clCommandBarrierWithWaitListKHR => barrier(
        b: cl_command_buffer_khr, q: cl_command_queue, n: cl_uint, wait: *const Sync,
        sync: *mut Sync, mutable: *mut Mutable,
    );
    clCommandCopyBufferKHR => copy_buffer(
        b: cl_command_buffer_khr, q: cl_command_queue, src: cl_mem, dst: cl_mem,
        src_offset: usize, dst_offset: usize, size: usize, n: cl_uint, wait: *const Sync,
        sync: *mut Sync, mutable: *mut Mutable,
    );
    clCommandCopyBufferRectKHR => copy_buffer_rect(
        b: cl_command_buffer_khr, q: cl_command_queue, src: cl_mem, dst: cl_mem,
        src_origin: *const usize, dst_origin: *const usize, region: *const usize,
        src_row_pitch: usize, src_slice_pitch: usize, dst_row_pitch: usize,
        dst_slice_pitch: usize, n: cl_uint, wait: *const Sync, sync: *mut Sync,
        mutable: *mut Mutable,
    );
    clCommandCopyBufferToImageKHR => copy_buffer_to_image(
        b: cl_command_buffer_khr, q: cl_command_queue, src: cl_mem, dst: cl_mem,
        src_offset: usize, dst_origin: *const usize, region: *const usize, n: cl_uint,
        wait: *const Sync, sync: *mut Sync, mutable: *mut Mutable,
    );
    clCommandCopyImageKHR => copy_image(
        b: cl_command_buffer_khr, q: cl_command_queue, src: cl_mem, dst: cl_mem,
        src_origin: *const usize, dst_origin: *const usize, region: *const usize, n: cl_uint,
        wait: *const Sync, sync: *mut Sync, mutable: *mut Mutable,
    );
    clCommandCopyImageToBufferKHR => copy_image_to_buffer(
        b: cl_command_buffer_khr, q: cl_command_queue, src: cl_mem, dst: cl_mem,
        src_origin: *const usize, region: *const usize, dst_offset: usize, n: cl_uint,
        wait: *const Sync, sync: *mut Sync, mutable: *mut Mutable,
    );
    clCommandFillBufferKHR => fill_buffer(
        b: cl_command_buffer_khr, q: cl_command_queue, buffer: cl_mem,
        pattern: *const c_void, pattern_size: usize, offset: usize, size: usize, n: cl_uint,
        wait: *const Sync, sync: *mut Sync, mutable: *mut Mutable,
    );
    clCommandFillImageKHR => fill_image(
        b: cl_command_buffer_khr, q: cl_command_queue, image: cl_mem,
        fill_color: *const c_void, origin: *const usize, region: *const usize, n: cl_uint,
        wait: *const Sync, sync: *mut Sync, mutable: *mut Mutable,
    );
}

/// Records a kernel launch with the kernel's arguments as they are now; a later
/// change of them must not be what a migrated session's replay records (see
/// `migrate`).
///
/// # Safety
/// As `clCommandNDRangeKernelKHR`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn clCommandNDRangeKernelKHR(
    s: &mut Session<'_>,
    b: cl_command_buffer_khr,
    q: cl_command_queue,
    properties: *const Props,
    kernel: cl_kernel,
    work_dim: cl_uint,
    offset: *const usize,
    global: *const usize,
    local: *const usize,
    n: cl_uint,
    wait: *const Sync,
    sync: *mut Sync,
    mutable: *mut Mutable,
) -> Option<cl_int> {
    let f = fns()?;
    // SAFETY: forwarded contract.
    let status = unsafe {
        (f.ndrange)(
            b, q, properties, kernel, work_dim, offset, global, local, n, wait, sync, mutable,
        )
    };
    if status == 0 {
        s.recorded_kernel(kernel);
    }
    Some(status)
}

/// # Safety
/// As `clGetCommandBufferInfoKHR`.
pub unsafe fn clGetCommandBufferInfoKHR(
    b: cl_command_buffer_khr,
    param: cl_uint,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> Option<cl_int> {
    if b.is_null() {
        return Some(CL_INVALID_VALUE);
    }
    // SAFETY: forwarded contract.
    fns().map(|f| unsafe { (f.info)(b, param, size, value, size_ret) })
}
