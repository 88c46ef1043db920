#![allow(non_snake_case)]
//! Coarse-grained buffer SVM in the guest.
//!
//! A guest allocation is guest memory mapped at the address of its twin, a real host
//! SVM allocation named by a guest id: the pointer the application gets is the one
//! kernels see, so pointers stored in SVM memory (linked structures) mean the same on
//! both sides, as shared virtual memory requires. If that address is taken in the
//! guest process, the host allocates again. Any pointer into an allocation travels as
//! (id, offset). Mapping copies the host's bytes into the guest memory,
//! unmapping after a write copies them back (`clEnqueueSVMMemcpy` on the host, deferred
//! like buffer transfers); kernels get host pointers (`clSetKernelArgSVMPointer`,
//! `CL_KERNEL_EXEC_INFO_SVM_PTRS`). Fine-grained sharing and SVM atomics cannot cross
//! a VM boundary and are not reported.

use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::sync::{LazyLock, Mutex};

use opencl_sys::{
    cl_bool, cl_command_queue, cl_context, cl_event, cl_int, cl_kernel, cl_map_flags, cl_uint,
};

use crate::generated as g;
use crate::rt::{self, CL_INVALID_VALUE};

use opencl_sys::CL_COMMAND_SVM_MAP;
use opencl_sys::CL_COMMAND_SVM_MEMCPY;
use opencl_sys::CL_COMMAND_SVM_MIGRATE_MEM;
use opencl_sys::CL_COMMAND_SVM_UNMAP;
use opencl_sys::CL_INVALID_ARG_VALUE;
use opencl_sys::CL_INVALID_BUFFER_SIZE;
use opencl_sys::CL_INVALID_OPERATION;
use opencl_sys::CL_KERNEL_EXEC_INFO_SVM_FINE_GRAIN_SYSTEM;
use opencl_sys::CL_KERNEL_EXEC_INFO_SVM_PTRS;
use opencl_sys::CL_MAP_READ;
use opencl_sys::CL_MAP_WRITE;
use opencl_sys::CL_MAP_WRITE_INVALIDATE_REGION;
use opencl_sys::CL_MEM_COPY_OVERLAP;
use opencl_sys::CL_MEM_SVM_ATOMICS;
use opencl_sys::CL_MEM_SVM_FINE_GRAIN_BUFFER;
/// Host allocations tried before `clSVMAlloc` gives up finding an address that is
/// free in the guest process too.
const PLACEMENT_TRIES: usize = 8;

struct Alloc {
    id: u64,
    size: usize,
}

/// Guest pages mapped for SVM, with the number of allocations on each (small host
/// allocations can share a page).
static PAGES: LazyLock<Mutex<HashMap<usize, u32>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

/// The pages covering `addr..addr + size`.
fn pages_of(addr: usize, size: usize) -> std::ops::Range<usize> {
    let ps = page_size();
    let first = addr / ps;
    let last = (addr + size).div_ceil(ps);
    first..last
}

/// Maps guest memory over `addr..addr + size` unless another mapping is there; pages
/// already holding SVM memory are shared.
fn place(addr: usize, size: usize) -> bool {
    let ps = page_size();
    let mut pages = PAGES.lock().unwrap_or_else(|e| e.into_inner());
    let mut mapped: Vec<usize> = Vec::new();
    let range = pages_of(addr, size);
    let mut page = range.start;
    let mut ok = true;
    while page < range.end {
        if pages.contains_key(&page) {
            page += 1;
            continue;
        }
        let mut end = page;
        while end < range.end && !pages.contains_key(&end) {
            end += 1;
        }
        let want = (page * ps) as *mut c_void;
        // SAFETY: a fresh anonymous mapping; MAP_FIXED_NOREPLACE never replaces one.
        let got = unsafe {
            libc::mmap(
                want,
                (end - page) * ps,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if got != want {
            if got != libc::MAP_FAILED {
                // An old kernel that ignores the flag placed it elsewhere.
                // SAFETY: the mapping just made.
                unsafe { libc::munmap(got, (end - page) * ps) };
            }
            ok = false;
            break;
        }
        mapped.extend(page..end);
        page = end;
    }
    if !ok {
        for p in mapped {
            // SAFETY: pages mapped above and used by nothing yet.
            unsafe { libc::munmap((p * ps) as *mut c_void, ps) };
        }
        return false;
    }
    for p in range {
        *pages.entry(p).or_insert(0) += 1;
    }
    true
}

/// Gives back the guest memory of an allocation.
fn unplace(addr: usize, size: usize) {
    let ps = page_size();
    let mut pages = PAGES.lock().unwrap_or_else(|e| e.into_inner());
    for p in pages_of(addr, size) {
        if let Some(n) = pages.get_mut(&p) {
            *n -= 1;
            if *n == 0 {
                pages.remove(&p);
                // SAFETY: a page mapped by `place` that no allocation uses any more.
                unsafe { libc::munmap((p * ps) as *mut c_void, ps) };
            }
        }
    }
}

/// Allocations by guest address.
static ALLOCS: LazyLock<Mutex<BTreeMap<usize, Alloc>>> =
    LazyLock::new(|| Mutex::new(BTreeMap::new()));

/// Mapped regions: (address, size, written).
static MAPS: LazyLock<Mutex<Vec<(usize, usize, bool)>>> = LazyLock::new(|| Mutex::new(Vec::new()));

/// The allocation holding `ptr..ptr + len`: (id, offset, allocation start).
fn find(ptr: *const c_void, len: usize) -> Option<(u64, usize, usize)> {
    let p = ptr as usize;
    let allocs = ALLOCS.lock().unwrap_or_else(|e| e.into_inner());
    let (&base, a) = allocs.range(..=p).next_back()?;
    let off = p - base;
    (off.checked_add(len)? <= a.size).then_some((a.id, off, base))
}

/// A buffer's `host_ptr` inside an SVM allocation must not reach past it
/// (`CL_INVALID_BUFFER_SIZE`, as natively). With `CL_MEM_USE_HOST_PTR` such a buffer
/// aliases the SVM allocation on the host ([`aliased`]).
pub(crate) fn check_buffer_host_ptr(ptr: *const c_void, size: usize) -> Result<(), cl_int> {
    if ptr.is_null() || find(ptr, 0).is_none() {
        return Ok(());
    }
    find(ptr, size).map(|_| ()).ok_or(CL_INVALID_BUFFER_SIZE)
}

/// For a buffer created with `CL_MEM_USE_HOST_PTR` on SVM memory: the allocation and
/// offset its host side aliases.
pub(crate) fn aliased(flags: u64, ptr: *const c_void) -> Option<(u64, usize)> {
    use opencl_sys::CL_MEM_USE_HOST_PTR;
    if flags & CL_MEM_USE_HOST_PTR == 0 || ptr.is_null() {
        return None;
    }
    find(ptr, 0).map(|(id, off, _)| (id, off))
}

/// Allocates coarse-grained SVM.
///
/// # Safety
/// As `clSVMAlloc`.
pub unsafe extern "C" fn clSVMAlloc(
    context: cl_context,
    flags: u64,
    size: usize,
    alignment: cl_uint,
) -> *mut c_void {
    rt::guard_raw(|| {
        if size == 0
            || flags & (CL_MEM_SVM_FINE_GRAIN_BUFFER | CL_MEM_SVM_ATOMICS) != 0
            || (alignment != 0 && !alignment.is_power_of_two())
        {
            return 0;
        }
        let mut misplaced = Vec::new();
        let mut placed = 0;
        for _ in 0..PLACEMENT_TRIES {
            let id = rt::new_id();
            let mut addr: u64 = 0;
            // SAFETY: a context handle from the application, checked by the generated
            // call; `addr` receives the host address.
            if unsafe { g::hiraSVMAlloc(context, flags, size, alignment, id, &mut addr) } != 0 {
                break;
            }
            let addr = addr as usize;
            if addr != 0 && addr.checked_add(size).is_some() && place(addr, size) {
                ALLOCS
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(addr, Alloc { id, size });
                placed = addr;
                break;
            }
            // Taken in this process: keep it allocated on the host (so the host does
            // not hand it out again) until an address is found.
            misplaced.push(id);
        }
        for id in misplaced {
            // SAFETY: as above.
            unsafe { g::hiraSVMFree(context, id) };
        }
        placed
    }) as *mut c_void
}

/// Frees an allocation of [`clSVMAlloc`].
///
/// # Safety
/// As `clSVMFree`.
pub unsafe extern "C" fn clSVMFree(context: cl_context, svm_pointer: *mut c_void) {
    rt::guard_raw(|| {
        let a = ALLOCS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(svm_pointer as usize));
        if let Some(a) = a {
            // SAFETY: as `clSVMFree`.
            unsafe { g::hiraSVMFree(context, a.id) };
            unplace(svm_pointer as usize, a.size);
        }
        0
    });
}

/// A marker standing for a command the guest carries out itself.
unsafe fn marker(
    q: cl_command_queue,
    n: cl_uint,
    wait: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    // SAFETY: forwarded arguments.
    unsafe { g::clEnqueueMarkerWithWaitList(q, n, wait, event) }
}

/// Copies between SVM allocations and host memory.
///
/// # Safety
/// As `clEnqueueSVMMemcpy`.
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn clEnqueueSVMMemcpy(
    command_queue: cl_command_queue,
    blocking_copy: cl_bool,
    dst_ptr: *mut c_void,
    src_ptr: *const c_void,
    size: usize,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    rt::status_call("clEnqueueSVMMemcpy", || {
        if dst_ptr.is_null() || src_ptr.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        let (d, s) = (dst_ptr as usize, src_ptr as usize);
        if d < s.saturating_add(size) && s < d.saturating_add(size) {
            return Err(CL_MEM_COPY_OVERLAP);
        }
        let (n, wait) = (num_events_in_wait_list, event_wait_list);
        // SAFETY: for every branch, the pointers cover `size` bytes per the contract.
        Ok(unsafe {
            match (find(dst_ptr, size), find(src_ptr, size)) {
                (Some((did, doff, _)), Some((sid, soff, _))) => g::hiraSVMCopy(
                    command_queue,
                    blocking_copy,
                    did,
                    doff,
                    sid,
                    soff,
                    size,
                    n,
                    wait,
                    event,
                ),
                (Some((id, off, _)), None) => g::hiraSVMWrite(
                    command_queue,
                    blocking_copy,
                    id,
                    off,
                    size,
                    src_ptr,
                    n,
                    wait,
                    event,
                ),
                (None, Some((id, off, _))) => g::hiraSVMRead(
                    command_queue,
                    blocking_copy,
                    id,
                    off,
                    size,
                    dst_ptr,
                    n,
                    wait,
                    event,
                ),
                (None, None) => {
                    // Host memory to host memory: once the wait list is done.
                    if n > 0 {
                        let st = g::clWaitForEvents(n, wait);
                        if st != 0 {
                            return Err(st);
                        }
                    }
                    std::ptr::copy_nonoverlapping(src_ptr.cast::<u8>(), dst_ptr.cast::<u8>(), size);
                    let st = marker(command_queue, 0, std::ptr::null(), event);
                    if st == 0 {
                        rt::note_command_type(event, CL_COMMAND_SVM_MEMCPY);
                    }
                    st
                }
            }
        })
    })
}

/// Fills an SVM region with a pattern.
///
/// # Safety
/// As `clEnqueueSVMMemFill`.
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn clEnqueueSVMMemFill(
    command_queue: cl_command_queue,
    svm_ptr: *mut c_void,
    pattern: *const c_void,
    pattern_size: usize,
    size: usize,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    rt::status_call("clEnqueueSVMMemFill", || {
        let (id, off, _) = find(svm_ptr, size).ok_or(CL_INVALID_VALUE)?;
        if pattern.is_null()
            || pattern_size == 0
            || !pattern_size.is_power_of_two()
            || pattern_size > 128
        {
            return Err(CL_INVALID_VALUE);
        }
        // SAFETY: `pattern` holds `pattern_size` bytes per the contract.
        Ok(unsafe {
            g::hiraSVMFill(
                command_queue,
                id,
                off,
                pattern,
                pattern_size,
                size,
                num_events_in_wait_list,
                event_wait_list,
                event,
            )
        })
    })
}

/// Maps an SVM region: the host's bytes are copied into the guest memory.
///
/// # Safety
/// As `clEnqueueSVMMap`.
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn clEnqueueSVMMap(
    command_queue: cl_command_queue,
    blocking_map: cl_bool,
    flags: cl_map_flags,
    svm_ptr: *mut c_void,
    size: usize,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    rt::status_call("clEnqueueSVMMap", || {
        if size == 0 {
            return Err(CL_INVALID_VALUE);
        }
        let (id, off, _) = find(svm_ptr, size).ok_or(CL_INVALID_VALUE)?;
        let writes = flags & (CL_MAP_WRITE | CL_MAP_WRITE_INVALIDATE_REGION) != 0;
        let fill = flags & (CL_MAP_READ | CL_MAP_WRITE) != 0
            && flags & CL_MAP_WRITE_INVALIDATE_REGION == 0;
        // SAFETY: the guest memory of the allocation covers the region.
        let status = unsafe {
            if fill {
                g::hiraSVMRead(
                    command_queue,
                    blocking_map,
                    id,
                    off,
                    size,
                    svm_ptr,
                    num_events_in_wait_list,
                    event_wait_list,
                    event,
                )
            } else {
                marker(
                    command_queue,
                    num_events_in_wait_list,
                    event_wait_list,
                    event,
                )
            }
        };
        if status == 0 {
            rt::note_command_type(event, CL_COMMAND_SVM_MAP);
            MAPS.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((svm_ptr as usize, size, writes));
        }
        Ok(status)
    })
}

/// Unmaps an SVM region: after a write, the guest's bytes go back to the host.
///
/// # Safety
/// As `clEnqueueSVMUnmap`.
pub unsafe extern "C" fn clEnqueueSVMUnmap(
    command_queue: cl_command_queue,
    svm_ptr: *mut c_void,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    rt::status_call("clEnqueueSVMUnmap", || {
        let (ptr, size, writes) = {
            let mut maps = MAPS.lock().unwrap_or_else(|e| e.into_inner());
            let i = maps
                .iter()
                .position(|m| m.0 == svm_ptr as usize)
                .ok_or(CL_INVALID_VALUE)?;
            maps.swap_remove(i)
        };
        let (id, off, _) = find(ptr as *const c_void, size).ok_or(CL_INVALID_VALUE)?;
        // SAFETY: the guest memory covers the mapped region; a non-blocking write
        // copies it before returning.
        let status = unsafe {
            if writes {
                g::hiraSVMWrite(
                    command_queue,
                    0,
                    id,
                    off,
                    size,
                    ptr as *const c_void,
                    num_events_in_wait_list,
                    event_wait_list,
                    event,
                )
            } else {
                marker(
                    command_queue,
                    num_events_in_wait_list,
                    event_wait_list,
                    event,
                )
            }
        };
        if status == 0 {
            rt::note_command_type(event, CL_COMMAND_SVM_UNMAP);
        }
        Ok(status)
    })
}

/// Migration is a placement hint: the host keeps the memory; the command orders like a
/// marker.
///
/// # Safety
/// As `clEnqueueSVMMigrateMem`.
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn clEnqueueSVMMigrateMem(
    command_queue: cl_command_queue,
    num_svm_pointers: cl_uint,
    svm_pointers: *mut *const c_void,
    sizes: *const usize,
    _flags: u64,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    rt::status_call("clEnqueueSVMMigrateMem", || {
        if num_svm_pointers == 0 || svm_pointers.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        for i in 0..num_svm_pointers as usize {
            // SAFETY: arrays of `num_svm_pointers` entries per the contract.
            let (p, len) = unsafe {
                (
                    *svm_pointers.add(i),
                    if sizes.is_null() { 0 } else { *sizes.add(i) },
                )
            };
            find(p, len).ok_or(CL_INVALID_VALUE)?;
        }
        // SAFETY: forwarded arguments.
        let status = unsafe {
            marker(
                command_queue,
                num_events_in_wait_list,
                event_wait_list,
                event,
            )
        };
        if status == 0 {
            rt::note_command_type(event, CL_COMMAND_SVM_MIGRATE_MEM);
        }
        Ok(status)
    })
}

/// Sets a kernel's pointer argument to a pointer into an SVM allocation (or NULL).
///
/// # Safety
/// As `clSetKernelArgSVMPointer`.
pub unsafe extern "C" fn clSetKernelArgSVMPointer(
    kernel: cl_kernel,
    arg_index: cl_uint,
    arg_value: *const c_void,
) -> cl_int {
    rt::status_call("clSetKernelArgSVMPointer", || {
        let (id, off) = if arg_value.is_null() {
            (0, 0)
        } else {
            let (id, off, _) = find(arg_value, 0).ok_or(CL_INVALID_ARG_VALUE)?;
            (id, off)
        };
        // SAFETY: a kernel handle from the application, checked by the generated call.
        let status = unsafe { g::hiraSetKernelArgSVM(kernel, arg_index, id, off) };
        if status == 0 {
            crate::checks::arg_was_set(kernel, arg_index);
        }
        Ok(status)
    })
}

/// Extra kernel execution information: the SVM pointers a kernel reaches indirectly.
///
/// # Safety
/// As `clSetKernelExecInfo`.
pub unsafe extern "C" fn clSetKernelExecInfo(
    kernel: cl_kernel,
    param_name: u32,
    param_value_size: usize,
    param_value: *const c_void,
) -> cl_int {
    rt::status_call("clSetKernelExecInfo", || {
        match param_name {
            // NULL and 0 unset the pointers set before.
            CL_KERNEL_EXEC_INFO_SVM_PTRS if param_value.is_null() && param_value_size == 0 => {
                // SAFETY: no pairs are read for a count of 0.
                Ok(unsafe { g::hiraSetKernelExecInfoSVM(kernel, 0, std::ptr::null()) })
            }
            _ if param_value.is_null() => Err(CL_INVALID_VALUE),
            CL_KERNEL_EXEC_INFO_SVM_PTRS => {
                if param_value_size == 0 || !param_value_size.is_multiple_of(size_of::<usize>()) {
                    return Err(CL_INVALID_VALUE);
                }
                let n = param_value_size / size_of::<usize>();
                let mut pairs = Vec::with_capacity(n * 16);
                for i in 0..n {
                    // SAFETY: `param_value` holds `n` pointers per the contract.
                    let p = unsafe {
                        (param_value as *const *const c_void)
                            .add(i)
                            .read_unaligned()
                    };
                    let (id, off, _) = find(p, 0).ok_or(CL_INVALID_VALUE)?;
                    pairs.extend_from_slice(&id.to_le_bytes());
                    pairs.extend_from_slice(&(off as u64).to_le_bytes());
                }
                // SAFETY: `pairs` holds `n` (id, offset) pairs of 16 bytes.
                Ok(unsafe {
                    g::hiraSetKernelExecInfoSVM(kernel, n as cl_uint, pairs.as_ptr().cast())
                })
            }
            CL_KERNEL_EXEC_INFO_SVM_FINE_GRAIN_SYSTEM => {
                if param_value_size != size_of::<cl_bool>() {
                    return Err(CL_INVALID_VALUE);
                }
                rt::lookup(kernel.cast()).ok_or(-48)?;
                // SAFETY: a cl_bool per the check above.
                let on = unsafe { (param_value as *const cl_bool).read_unaligned() } != 0;
                // No device reports fine-grained system SVM through Hira.
                Ok(if on { CL_INVALID_OPERATION } else { 0 })
            }
            _ => Err(CL_INVALID_VALUE),
        }
    })
}

type FreeFn = unsafe extern "C" fn(cl_command_queue, cl_uint, *mut *mut c_void, *mut c_void);

/// What is left to do when an enqueued free has run.
struct FreeJob {
    queue: cl_command_queue,
    pointers: Vec<*mut c_void>,
    /// Guest memory to release: (address, size); none when the application frees it
    /// in its callback.
    release: Vec<(usize, usize)>,
    callback: Option<FreeFn>,
    user_data: *mut c_void,
    /// The event was made for this job alone.
    own_event: bool,
}

extern "C" fn free_done(event: cl_event, _status: cl_int, data: *mut c_void) {
    // SAFETY: the box `clEnqueueSVMFree` leaked for this one callback.
    let mut job = unsafe { Box::from_raw(data as *mut FreeJob) };
    for (p, size) in job.release.drain(..) {
        unplace(p, size);
    }
    if let Some(f) = job.callback {
        // SAFETY: the application's callback with the arguments the API defines.
        unsafe {
            f(
                job.queue,
                job.pointers.len() as cl_uint,
                job.pointers.as_mut_ptr(),
                job.user_data,
            )
        };
    }
    if job.own_event {
        // SAFETY: the event made for this job.
        unsafe { g::clReleaseEvent(event) };
    }
}

/// Frees SVM allocations once the commands before it are done; the host side by the
/// enqueued command, the guest memory (or the application's callback, which then
/// frees it) when that command completes.
///
/// # Safety
/// As `clEnqueueSVMFree`.
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn clEnqueueSVMFree(
    command_queue: cl_command_queue,
    num_svm_pointers: cl_uint,
    svm_pointers: *mut *mut c_void,
    pfn_free_func: Option<FreeFn>,
    user_data: *mut c_void,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> cl_int {
    rt::status_call("clEnqueueSVMFree", || {
        if num_svm_pointers == 0 || svm_pointers.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        // SAFETY: `num_svm_pointers` entries per the contract.
        let pointers: Vec<*mut c_void> = (0..num_svm_pointers as usize)
            .map(|i| unsafe { *svm_pointers.add(i) })
            .collect();
        let mut ids = Vec::with_capacity(pointers.len() * 8);
        {
            let allocs = ALLOCS.lock().unwrap_or_else(|e| e.into_inner());
            for p in &pointers {
                let a = allocs.get(&(*p as usize)).ok_or(CL_INVALID_VALUE)?;
                ids.extend_from_slice(&a.id.to_le_bytes());
            }
        }
        let mut own: cl_event = std::ptr::null_mut();
        let ev: *mut cl_event = if event.is_null() { &mut own } else { event };
        // SAFETY: `ids` holds one u64 per pointer; the rest is forwarded.
        let status = unsafe {
            g::hiraSVMEnqueueFree(
                command_queue,
                num_svm_pointers,
                ids.as_ptr().cast(),
                num_events_in_wait_list,
                event_wait_list,
                ev,
            )
        };
        if status != 0 {
            return Ok(status);
        }
        // Without a callback Hira releases the guest memory; with one, the
        // application does (calling clSVMFree, which then frees only guest memory).
        let release = if pfn_free_func.is_none() {
            let mut allocs = ALLOCS.lock().unwrap_or_else(|e| e.into_inner());
            pointers
                .iter()
                .filter_map(|p| allocs.remove(&(*p as usize)).map(|a| (*p as usize, a.size)))
                .collect()
        } else {
            Vec::new()
        };
        let job = Box::into_raw(Box::new(FreeJob {
            queue: command_queue,
            pointers,
            release,
            callback: pfn_free_func,
            user_data,
            own_event: event.is_null(),
        }));
        // SAFETY: `*ev` is the event of the enqueued free; the job is taken back by
        // `free_done`.
        let st = unsafe { g::clSetEventCallback(*ev, 0, Some(free_done), job.cast()) };
        if st != 0 {
            // SAFETY: the host never got the job.
            drop(unsafe { Box::from_raw(job) });
        }
        Ok(0)
    })
}
