#![allow(non_snake_case)]
//! Calls the guest implements on top of remoted ones.
//!
//! Mapping gives the application guest memory: for `CL_MEM_USE_HOST_PTR` buffers the
//! application's own `host_ptr` (at the mapped offset, as the API requires), otherwise
//! a shadow allocation. Mapping for reading or writing fills it from the device;
//! unmapping after a write sends it back. These are the API's synchronisation points,
//! so the shadow is coherent whenever the application may look at it.

use std::ffi::c_void;
use std::sync::{LazyLock, Mutex};

use hira_apis_opencl::Kind;
use opencl_sys::{cl_bool, cl_command_queue, cl_event, cl_int, cl_map_flags, cl_mem, cl_uint};

use crate::generated as g;
pub use crate::icd::{clGetExtensionFunctionAddress, clGetExtensionFunctionAddressForPlatform};
use crate::marshal;
use crate::rt::{self, CL_INVALID_VALUE, CL_MEM_OBJECT_IMAGE1D_ARRAY};
use crate::stats;
pub use crate::svm::{
    clEnqueueSVMFree, clEnqueueSVMMap, clEnqueueSVMMemFill, clEnqueueSVMMemcpy,
    clEnqueueSVMMigrateMem, clEnqueueSVMUnmap, clSVMAlloc, clSVMFree, clSetKernelArgSVMPointer,
    clSetKernelExecInfo,
};
use crate::zero_copy;
use hira_guest_driver::WindowRegion;

use opencl_sys::CL_COMMAND_MAP_BUFFER;
use opencl_sys::CL_COMMAND_MAP_IMAGE;
use opencl_sys::CL_COMMAND_UNMAP_MEM_OBJECT;
use opencl_sys::CL_INVALID_MEM_OBJECT;
use opencl_sys::CL_INVALID_OPERATION;
use opencl_sys::CL_MAP_FAILURE;
use opencl_sys::CL_MAP_READ;
use opencl_sys::CL_MAP_WRITE;
use opencl_sys::CL_MAP_WRITE_INVALIDATE_REGION;
use opencl_sys::CL_MEM_HOST_NO_ACCESS;
use opencl_sys::CL_MEM_HOST_READ_ONLY;
use opencl_sys::CL_MEM_HOST_WRITE_ONLY;
use opencl_sys::CL_MEM_OBJECT_IMAGE2D_ARRAY;
use opencl_sys::CL_MEM_OBJECT_IMAGE3D;
use opencl_sys::CL_MEM_USE_HOST_PTR;

/// How a mapping's memory is filled from the device.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fill {
    /// Not at all (`CL_MAP_WRITE_INVALIDATE_REGION`).
    None,
    /// By reading the object.
    Read,
    /// Through a device-side copy into a scratch buffer, for an object the host may
    /// only write (`CL_MEM_HOST_WRITE_ONLY`): the host cannot read it, yet mapping it
    /// for writing shows its contents natively.
    Copy,
}

/// Checks a mapping against the object's host access flags, as the API does, and
/// says how the mapped memory is filled from the device.
fn map_access(id: u64, map_flags: u64) -> Result<Fill, cl_int> {
    let flags = rt::mem_extra(id).unwrap_or_default().flags;
    let reads = map_flags & CL_MAP_READ != 0;
    let writes = map_flags & (CL_MAP_WRITE | CL_MAP_WRITE_INVALIDATE_REGION) != 0;
    if (reads && flags & (CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_NO_ACCESS) != 0)
        || (writes && flags & (CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS) != 0)
    {
        return Err(CL_INVALID_OPERATION);
    }
    Ok(if map_flags & (CL_MAP_READ | CL_MAP_WRITE) == 0 {
        Fill::None
    } else if flags & CL_MEM_HOST_WRITE_ONLY != 0 {
        Fill::Copy
    } else {
        Fill::Read
    })
}

use opencl_sys::CL_MEM_CONTEXT;

/// A scratch buffer of `len` bytes in `mem`'s context.
fn scratch(mem: cl_mem, len: usize) -> Result<cl_mem, cl_int> {
    let ctx: opencl_sys::cl_context = mem_query(g::clGetMemObjectInfo, mem, CL_MEM_CONTEXT)?;
    let mut err = 0;
    // SAFETY: a context handle just returned by the host.
    let tmp = unsafe { g::clCreateBuffer(ctx, 1, len.max(1), std::ptr::null_mut(), &mut err) };
    if err != 0 {
        return Err(err);
    }
    Ok(tmp)
}

use opencl_sys::CL_IMAGE_ROW_PITCH;
use opencl_sys::CL_IMAGE_SLICE_PITCH;

type MemInfoFn = unsafe extern "C" fn(cl_mem, u32, usize, *mut c_void, *mut usize) -> cl_int;

/// A fixed-size property of a memory object (`clGetMemObjectInfo`, `clGetImageInfo`).
fn mem_query<T: Copy>(query: MemInfoFn, mem: cl_mem, param: u32) -> Result<T, cl_int> {
    let mut v = std::mem::MaybeUninit::<T>::zeroed();
    // SAFETY: the property `param` is a `T`, written into local storage of its size.
    let status = unsafe {
        query(
            mem,
            param,
            size_of::<T>(),
            v.as_mut_ptr().cast(),
            std::ptr::null_mut(),
        )
    };
    if status != 0 {
        return Err(status);
    }
    // SAFETY: zero-initialised, then written by the host; the callers' types (integers,
    // handles) are valid for any bytes.
    Ok(unsafe { v.assume_init() })
}

/// A `size_t` image property.
fn image_info_size(image: cl_mem, param: u32) -> Result<usize, cl_int> {
    mem_query(g::clGetImageInfo, image, param)
}

enum Region {
    Buffer {
        offset: usize,
        size: usize,
    },
    Image {
        origin: [usize; 3],
        region: [usize; 3],
        row_pitch: usize,
        slice_pitch: usize,
    },
}

struct Mapping {
    mem: usize,
    ptr: usize,
    flags: u64,
    region: Region,
    /// The shadow allocation, when the pointer is not the application's own memory.
    shadow: Option<Shadow>,
    /// Mapped with a blocking call: nothing of the host writes into the shadow after
    /// the unmap, so it may serve the next mapping.
    blocking: bool,
    /// For an object in the data window (`zero_copy`): the host's own mapping, at
    /// this window offset.
    window: Option<u64>,
}

impl Mapping {
    /// Keeps the mapping until its unmap.
    fn keep(self) {
        MAPPINGS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(self);
    }
}

/// Where a mapping's data lives in the guest when it is not the application's memory.
enum Shadow {
    /// Process memory.
    Heap(Box<[u8]>),
    /// A region of the data window, for a blocking mapping: the host writes the mapped
    /// data there and reads it back from there at the unmap, with no copy in the guest
    /// (`marshal::in_place`). Held until the unmap.
    Window(WindowRegion<'static>),
}

impl Shadow {
    /// For a mapping of `len` bytes: a window region if the mapping is blocking and the
    /// window has room for it and as much again besides (transfers need it too), else
    /// process memory.
    fn new(len: usize, blocking: bool) -> Shadow {
        let region = || {
            let window = rt::conn().ok()?.window()?;
            let free_enough = window.unallocated() >= len.checked_mul(2)?;
            free_enough.then(|| window.alloc(len)).flatten()
        };
        match blocking.then(region).flatten() {
            Some(r) => Shadow::Window(r),
            None => Shadow::Heap(shadow(len)),
        }
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        match self {
            Shadow::Heap(b) => b.as_mut_ptr(),
            Shadow::Window(r) => r.ptr(),
        }
    }
}

/// Shadows of finished blocking mappings, kept for the next ones: a fresh shadow's
/// pages are each faulted in as the data arrives (5,120 faults for a 20 MiB image,
/// which in a virtual machine take longer than copying it), a kept one's are there.
static SPARE: Mutex<Vec<Box<[u8]>>> = Mutex::new(Vec::new());
/// Most shadow bytes kept, and most shadows.
const SPARE_BYTES: usize = 128 << 20;
const SPARE_COUNT: usize = 4;

/// A shadow of at least `len` bytes: a kept one no more than twice as large, else a
/// new one. Its contents are whatever it held (a map fills what it maps, and an
/// invalidating map's contents are undefined natively too).
fn shadow(len: usize) -> Box<[u8]> {
    let len = len.max(1);
    let mut spare = SPARE.lock().unwrap_or_else(|e| e.into_inner());
    let fit = spare
        .iter()
        .enumerate()
        .filter(|(_, b)| b.len() >= len && b.len() / 2 <= len)
        .min_by_key(|(_, b)| b.len())
        .map(|(i, _)| i);
    match fit {
        Some(i) => spare.swap_remove(i),
        None => {
            drop(spare);
            vec![0u8; len].into_boxed_slice()
        }
    }
}

/// Keeps a finished mapping's shadow for the next one, within the bounds.
fn keep_shadow(b: Box<[u8]>) {
    if b.len() > SPARE_BYTES {
        return;
    }
    let mut spare = SPARE.lock().unwrap_or_else(|e| e.into_inner());
    spare.push(b);
    while spare.len() > SPARE_COUNT || spare.iter().map(|b| b.len()).sum::<usize>() > SPARE_BYTES {
        // The oldest goes first.
        spare.remove(0);
    }
}

static MAPPINGS: LazyLock<Mutex<Vec<Mapping>>> = LazyLock::new(|| Mutex::new(Vec::new()));

fn mem_id(mem: cl_mem) -> Result<u64, cl_int> {
    match rt::lookup(mem) {
        Some((id, Kind::Mem)) => Ok(id),
        _ => Err(CL_INVALID_MEM_OBJECT),
    }
}

/// Maps a buffer region into guest memory.
///
/// # Safety
/// Arguments follow the `clEnqueueMapBuffer` contract.
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn clEnqueueMapBuffer(
    command_queue: cl_command_queue,
    buffer: cl_mem,
    blocking_map: cl_bool,
    map_flags: cl_map_flags,
    offset: usize,
    size: usize,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
    errcode_ret: *mut cl_int,
) -> *mut c_void {
    rt::handle_call("clEnqueueMapBuffer", errcode_ret, || {
        let id = mem_id(buffer)?;
        if zero_copy::in_window(id) {
            let (ptr, off, ..) = map_window(
                command_queue,
                buffer,
                id,
                blocking_map,
                map_flags,
                [offset, 0, 0],
                [size, 1, 1],
                (num_events_in_wait_list, event_wait_list, event),
            )?;
            rt::note_command_type(event, CL_COMMAND_MAP_BUFFER);
            Mapping {
                mem: buffer as usize,
                ptr: ptr as usize,
                flags: map_flags,
                region: Region::Buffer { offset, size },
                shadow: None,
                blocking: blocking_map != 0,
                window: Some(off),
            }
            .keep();
            return Ok(ptr);
        }
        let fill = map_access(id, map_flags)?;
        let extra = rt::mem_extra(id).unwrap_or_default();
        let (ptr, shadow) = if extra.flags & CL_MEM_USE_HOST_PTR != 0 && extra.host_ptr != 0 {
            ((extra.host_ptr + offset) as *mut u8, None)
        } else {
            let mut b = Shadow::new(size, blocking_map != 0);
            (b.as_mut_ptr(), Some(b))
        };
        let status = marshal::in_place(|| -> Result<cl_int, cl_int> {
            // SAFETY: `ptr` covers `size` bytes (the shadow, or the application's host
            // memory which the API requires to cover the buffer); the rest is forwarded.
            Ok(unsafe {
                if fill == Fill::Copy {
                    let tmp = scratch(buffer, size)?;
                    let mut copied: cl_event = std::ptr::null_mut();
                    let mut st = g::clEnqueueCopyBuffer(
                        command_queue,
                        buffer,
                        tmp,
                        offset,
                        0,
                        size,
                        num_events_in_wait_list,
                        event_wait_list,
                        &mut copied,
                    );
                    if st == 0 {
                        st = g::clEnqueueReadBuffer(
                            command_queue,
                            tmp,
                            blocking_map,
                            0,
                            size,
                            ptr.cast(),
                            1,
                            &copied,
                            event,
                        );
                        g::clReleaseEvent(copied);
                    }
                    // Released now, freed once the commands using it are done.
                    g::clReleaseMemObject(tmp);
                    st
                } else if fill == Fill::Read {
                    g::clEnqueueReadBuffer(
                        command_queue,
                        buffer,
                        blocking_map,
                        offset,
                        size,
                        ptr.cast(),
                        num_events_in_wait_list,
                        event_wait_list,
                        event,
                    )
                } else {
                    g::clEnqueueMarkerWithWaitList(
                        command_queue,
                        num_events_in_wait_list,
                        event_wait_list,
                        event,
                    )
                }
            })
        })?;
        if status != 0 {
            return Err(status);
        }
        rt::note_command_type(event, CL_COMMAND_MAP_BUFFER);
        // What the mapping brought from the device: the region, or nothing.
        stats::data(if fill == Fill::None { 0 } else { size }, 0);
        Mapping {
            mem: buffer as usize,
            ptr: ptr as usize,
            flags: map_flags,
            region: Region::Buffer { offset, size },
            shadow,
            blocking: blocking_map != 0,
            window: None,
        }
        .keep();
        Ok(ptr.cast())
    })
}

/// Maps an image region into a tightly packed guest shadow.
///
/// # Safety
/// Arguments follow the `clEnqueueMapImage` contract.
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn clEnqueueMapImage(
    command_queue: cl_command_queue,
    image: cl_mem,
    blocking_map: cl_bool,
    map_flags: cl_map_flags,
    origin: *const usize,
    region: *const usize,
    image_row_pitch: *mut usize,
    image_slice_pitch: *mut usize,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
    errcode_ret: *mut cl_int,
) -> *mut c_void {
    rt::handle_call("clEnqueueMapImage", errcode_ret, || {
        let id = mem_id(image)?;
        if origin.is_null() || region.is_null() || image_row_pitch.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        // SAFETY: both point to three size_t per the API.
        let (o, r) = unsafe {
            (
                *(origin as *const [usize; 3]),
                *(region as *const [usize; 3]),
            )
        };
        if zero_copy::in_window(id) {
            let (ptr, off, row, slice) = map_window(
                command_queue,
                image,
                id,
                blocking_map,
                map_flags,
                o,
                r,
                (num_events_in_wait_list, event_wait_list, event),
            )?;
            rt::note_command_type(event, CL_COMMAND_MAP_IMAGE);
            // SAFETY: checked non-null above / optional per the API.
            unsafe { write_pitches(image_row_pitch, image_slice_pitch, row, slice) };
            Mapping {
                mem: image as usize,
                ptr: ptr as usize,
                flags: map_flags,
                region: Region::Image {
                    origin: o,
                    region: r,
                    row_pitch: row,
                    slice_pitch: slice,
                },
                shadow: None,
                blocking: blocking_map != 0,
                window: Some(off),
            }
            .keep();
            return Ok(ptr);
        }
        let fill = map_access(id, map_flags)?;
        let kind = rt::image_type(image)?;
        let elem = rt::image_elem_size(image)?;
        let extra = rt::mem_extra(id).unwrap_or_default();
        let arrayed = matches!(
            kind,
            CL_MEM_OBJECT_IMAGE1D_ARRAY | CL_MEM_OBJECT_IMAGE2D_ARRAY | CL_MEM_OBJECT_IMAGE3D
        );
        let (ptr, row, slice, shadow) =
            if extra.flags & CL_MEM_USE_HOST_PTR != 0 && extra.host_ptr != 0 {
                // The application's own memory, laid out with the image's pitches.
                let row = image_info_size(image, CL_IMAGE_ROW_PITCH)?;
                let slice = if arrayed {
                    image_info_size(image, CL_IMAGE_SLICE_PITCH)?
                } else {
                    0
                };
                // A 1D array's second coordinate picks the slice.
                let steps = if kind == CL_MEM_OBJECT_IMAGE1D_ARRAY {
                    [elem, slice, 0]
                } else {
                    [elem, row, slice]
                };
                let at = o
                    .iter()
                    .zip(steps)
                    .try_fold(0usize, |acc, (&c, step)| {
                        acc.checked_add(c.checked_mul(step)?)
                    })
                    .ok_or(CL_INVALID_VALUE)?;
                ((extra.host_ptr + at) as *mut u8, row, slice, None)
            } else {
                let row = r[0].checked_mul(elem).ok_or(CL_INVALID_VALUE)?;
                // The slices of a 1D image array are its rows.
                let slice = match kind {
                    CL_MEM_OBJECT_IMAGE1D_ARRAY => row,
                    CL_MEM_OBJECT_IMAGE2D_ARRAY | CL_MEM_OBJECT_IMAGE3D => {
                        row.checked_mul(r[1]).ok_or(CL_INVALID_VALUE)?
                    }
                    _ => 0,
                };
                let total = row
                    .checked_mul(r[1])
                    .and_then(|v| v.checked_mul(r[2]))
                    .ok_or(CL_INVALID_VALUE)?;
                let mut s = Shadow::new(total, blocking_map != 0);
                (s.as_mut_ptr(), row, slice, Some(s))
            };
        let status = marshal::in_place(|| -> Result<cl_int, cl_int> {
            // SAFETY: `ptr` (the shadow, or the application's memory, which the API
            // requires to hold the whole image) covers the region with the pitches
            // passed.
            Ok(unsafe {
                if fill == Fill::Copy {
                    // The region, tight, into a scratch buffer; from there into the mapping
                    // with its pitches (a 1D array's slices are rows).
                    let tight_row = r[0].checked_mul(elem).ok_or(CL_INVALID_VALUE)?;
                    let tight = tight_row
                        .checked_mul(r[1])
                        .and_then(|v| v.checked_mul(r[2]))
                        .ok_or(CL_INVALID_VALUE)?;
                    let tmp = scratch(image, tight)?;
                    let mut copied: cl_event = std::ptr::null_mut();
                    let mut st = g::clEnqueueCopyImageToBuffer(
                        command_queue,
                        image,
                        tmp,
                        origin,
                        region,
                        0,
                        num_events_in_wait_list,
                        event_wait_list,
                        &mut copied,
                    );
                    if st == 0 {
                        let (host_row, host_slice) = if kind == CL_MEM_OBJECT_IMAGE1D_ARRAY {
                            (slice, 0)
                        } else {
                            (row, slice)
                        };
                        let zero = [0usize; 3];
                        let rect = [tight_row, r[1], r[2]];
                        st = g::clEnqueueReadBufferRect(
                            command_queue,
                            tmp,
                            blocking_map,
                            zero.as_ptr(),
                            zero.as_ptr(),
                            rect.as_ptr(),
                            tight_row,
                            tight_row * r[1],
                            host_row,
                            host_slice,
                            ptr.cast(),
                            1,
                            &copied,
                            event,
                        );
                        g::clReleaseEvent(copied);
                    }
                    g::clReleaseMemObject(tmp);
                    st
                } else if fill == Fill::Read {
                    g::clEnqueueReadImage(
                        command_queue,
                        image,
                        blocking_map,
                        origin,
                        region,
                        row,
                        slice,
                        ptr.cast(),
                        num_events_in_wait_list,
                        event_wait_list,
                        event,
                    )
                } else {
                    g::clEnqueueMarkerWithWaitList(
                        command_queue,
                        num_events_in_wait_list,
                        event_wait_list,
                        event,
                    )
                }
            })
        })?;
        if status != 0 {
            return Err(status);
        }
        rt::note_command_type(event, CL_COMMAND_MAP_IMAGE);
        if fill != Fill::None {
            let bytes = r.iter().try_fold(elem, |acc, &d| acc.checked_mul(d));
            stats::data(bytes.unwrap_or(0), 0);
        }
        // SAFETY: checked non-null above / optional per the API.
        unsafe {
            write_pitches(
                image_row_pitch,
                image_slice_pitch,
                row,
                if arrayed { slice } else { 0 },
            )
        };
        Mapping {
            mem: image as usize,
            ptr: ptr as usize,
            flags: map_flags,
            region: Region::Image {
                origin: o,
                region: r,
                row_pitch: row,
                slice_pitch: slice,
            },
            shadow,
            blocking: blocking_map != 0,
            window: None,
        }
        .keep();
        Ok(ptr.cast())
    })
}

/// Gives the application a mapped image's pitches.
///
/// # Safety
/// `row_out` must be valid for a write; `slice_out` null or valid for a write.
unsafe fn write_pitches(row_out: *mut usize, slice_out: *mut usize, row: usize, slice: usize) {
    // SAFETY: per the contract.
    unsafe {
        *row_out = row;
        if !slice_out.is_null() {
            *slice_out = slice;
        }
    }
}

/// Maps `region` at `origin` of object `id`, which lives in the data window, with the
/// host's own map (a buffer's offset and size are the first of each); returns the
/// guest pointer, its window offset, and an image's row and slice pitches.
#[allow(clippy::too_many_arguments)]
fn map_window(
    queue: cl_command_queue,
    mem: cl_mem,
    id: u64,
    blocking: cl_bool,
    flags: cl_map_flags,
    origin: [usize; 3],
    region: [usize; 3],
    (n, list, event): (cl_uint, *const cl_event, *mut cl_event),
) -> Result<(*mut c_void, u64, usize, usize), cl_int> {
    let (mut off, mut row, mut slice) = (0u64, 0usize, 0usize);
    // SAFETY: `origin` and `region` hold three values each; the outputs are locals;
    // the wait list and event follow the API's contract, checked by the call.
    let status = unsafe {
        g::hiraMapWindow(
            queue,
            mem,
            blocking,
            flags,
            origin.as_ptr(),
            region.as_ptr(),
            n,
            list,
            event,
            &mut off,
            &mut row,
            &mut slice,
        )
    };
    if status != 0 {
        return Err(status);
    }
    // The host's pointer lies in the object's region (it checked); so must the guest's.
    let ptr = zero_copy::address(id, off, 1).ok_or(CL_MAP_FAILURE)?;
    Ok((ptr, off, row, slice))
}

/// Unmaps a region mapped by one of the functions above, sending written data back.
///
/// # Safety
/// Arguments follow the `clEnqueueUnmapMemObject` contract.
pub unsafe extern "C" fn clEnqueueUnmapMemObject(
    command_queue: cl_command_queue,
    memobj: cl_mem,
    mapped_ptr: *mut c_void,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    rt::status_call("clEnqueueUnmapMemObject", || {
        mem_id(memobj)?;
        let m = {
            let mut maps = MAPPINGS.lock().unwrap_or_else(|e| e.into_inner());
            let i = maps
                .iter()
                .position(|m| m.mem == memobj as usize && m.ptr == mapped_ptr as usize)
                .ok_or(CL_INVALID_VALUE)?;
            maps.swap_remove(i)
        };
        if let Some(off) = m.window {
            // SAFETY: the wait list and event follow the API's contract.
            let status = unsafe {
                g::hiraUnmapWindow(
                    command_queue,
                    memobj,
                    off,
                    num_events_in_wait_list,
                    event_wait_list,
                    event,
                )
            };
            if status == 0 {
                rt::note_command_type(event, CL_COMMAND_UNMAP_MEM_OBJECT);
            }
            return Ok(status);
        }
        let wrote = m.flags & (CL_MAP_WRITE | CL_MAP_WRITE_INVALIDATE_REGION) != 0;
        let ptr = m.ptr as *const c_void;
        // SAFETY: `ptr` is the mapping's memory, still allocated (the shadow is held
        // in `m` until after the call), covering the mapped region.
        let status = marshal::in_place(|| unsafe {
            match (&m.region, wrote) {
                (Region::Buffer { offset, size }, true) => g::clEnqueueWriteBuffer(
                    command_queue,
                    memobj,
                    1,
                    *offset,
                    *size,
                    ptr,
                    num_events_in_wait_list,
                    event_wait_list,
                    event,
                ),
                (
                    Region::Image {
                        origin,
                        region,
                        row_pitch,
                        slice_pitch,
                    },
                    true,
                ) => g::clEnqueueWriteImage(
                    command_queue,
                    memobj,
                    1,
                    origin.as_ptr(),
                    region.as_ptr(),
                    *row_pitch,
                    *slice_pitch,
                    ptr,
                    num_events_in_wait_list,
                    event_wait_list,
                    event,
                ),
                (_, false) => g::clEnqueueMarkerWithWaitList(
                    command_queue,
                    num_events_in_wait_list,
                    event_wait_list,
                    event,
                ),
            }
        });
        match m.shadow {
            // A blocking unmap has sent what it wrote; a non-blocking one's data was
            // copied when the call was made (or is a marker's: none).
            Some(Shadow::Heap(b)) if m.blocking => keep_shadow(b),
            other => drop(other),
        }
        if status == 0 {
            rt::note_command_type(event, CL_COMMAND_UNMAP_MEM_OBJECT);
            // What the unmap sent back: the region written, or nothing.
            let sent = match (&m.region, wrote) {
                (Region::Buffer { size, .. }, true) => *size,
                (Region::Image { region, .. }, true) => rt::image_elem_size(memobj)
                    .ok()
                    .and_then(|e| region.iter().try_fold(e, |acc, &d| acc.checked_mul(d)))
                    .unwrap_or(0),
                (_, false) => 0,
            };
            stats::data(0, sent);
        }
        Ok(status)
    })
}

#[cfg(test)]
mod shadow_tests {
    use super::*;

    #[test]
    fn a_finished_mappings_shadow_serves_the_next_one_of_a_similar_size_within_bounds() {
        let a = shadow(1 << 20);
        let at = a.as_ptr() as usize;
        keep_shadow(a);
        // Much smaller: a new one, the kept one stays.
        let small = shadow(1000);
        assert_ne!(small.as_ptr() as usize, at);
        // Similar: the kept one, no new pages.
        let again = shadow((1 << 20) - 4096);
        assert_eq!(again.as_ptr() as usize, at);
        assert!(again.len() >= (1 << 20) - 4096);
        // Bounded in number and bytes, the oldest dropped first.
        for _ in 0..SPARE_COUNT + 3 {
            keep_shadow(shadow(4096));
        }
        keep_shadow(vec![0u8; SPARE_BYTES + 1].into_boxed_slice());
        let spare = SPARE.lock().unwrap();
        assert!(spare.len() <= SPARE_COUNT);
        assert!(spare.iter().map(|b| b.len()).sum::<usize>() <= SPARE_BYTES);
    }
}
