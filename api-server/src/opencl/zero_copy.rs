//! Memory objects made on the guest's data window (`tag::WINDOW_MEM`, the guest's
//! `opencl/src/zero_copy.rs`): the host gets `CL_MEM_USE_HOST_PTR` with the region,
//! so on a device that shares memory with the host the object's storage is memory the
//! guest sees too. A map is the host's own map, whose pointer lies in the region: the
//! guest is told its offset in the window and reads and writes the bytes where they
//! are.
//!
//! The guest reuses a region once the host has destroyed the object; it learns that
//! from `hiraWindowReleased`, answered from the objects a destructor callback of this
//! server's has not yet removed.

#![allow(non_snake_case)]

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use log::warn;

use opencl_sys::{
    CL_INVALID_MEM_OBJECT, CL_INVALID_VALUE, CL_MAP_FAILURE, CL_MEM_ALLOC_HOST_PTR,
    CL_MEM_COPY_HOST_PTR, CL_MEM_OBJECT_BUFFER, CL_MEM_TYPE, CL_MEM_USE_HOST_PTR, cl_bool,
    cl_command_queue, cl_event, cl_int, cl_map_flags, cl_mem, cl_uint,
};

use hira_apis_opencl::Kind;

use super::Session;
use super::args::BytesIn;
use super::queues::info_value;

/// Where an object made on the window lies: in this process, and in the window.
#[derive(Debug, Clone, Copy)]
struct Placed {
    ptr: usize,
    offset: u64,
    len: usize,
}

/// A host mapping of an object made on the window that the guest has not unmapped:
/// a migration makes it again on the target, where the guest will unmap it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapped {
    /// The object's guest id.
    pub mem: u64,
    /// Window offset of the mapped pointer.
    pub offset: u64,
    pub flags: u64,
    pub origin: [usize; 3],
    pub region: [usize; 3],
}

impl Mapped {
    /// The mapping as a migration stand-in's state: offset, flags, origin, region.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(64);
        for x in [self.offset, self.flags]
            .into_iter()
            .chain(self.origin.iter().chain(&self.region).map(|&n| n as u64))
        {
            v.extend_from_slice(&x.to_le_bytes());
        }
        v
    }

    pub fn decode(mem: u64, b: &[u8]) -> Option<Mapped> {
        if b.len() != 64 {
            return None;
        }
        let n = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        let size = |i: usize| usize::try_from(n(i)).ok();
        Some(Mapped {
            mem,
            offset: n(0),
            flags: n(1),
            origin: [size(2)?, size(3)?, size(4)?],
            region: [size(5)?, size(6)?, size(7)?],
        })
    }
}

/// The objects made on the window that the host has not destroyed, by guest id, and
/// their mappings.
#[derive(Debug, Default, Clone)]
pub struct WindowObjects(Arc<Mutex<HashMap<u64, Placed>>>, Arc<Mutex<Vec<Mapped>>>);

impl WindowObjects {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Placed>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn maps(&self) -> std::sync::MutexGuard<'_, Vec<Mapped>> {
        self.1.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The mappings the guest has not unmapped.
    pub fn mapped(&self) -> Vec<Mapped> {
        self.maps().clone()
    }

    /// Records a mapping made again by a migration.
    pub fn remapped(&self, m: Mapped) {
        self.maps().push(m);
    }

    /// The window offset of host address `p`, if an object's storage holds it.
    pub(crate) fn offset_of(&self, p: usize) -> Option<u64> {
        self.lock()
            .values()
            .find(|o| p >= o.ptr && p < o.ptr + o.len)
            .map(|o| o.offset + (p - o.ptr) as u64)
    }

    /// The host address of window offset `offset`, if an object's storage holds it.
    fn address_of(&self, offset: u64) -> Option<usize> {
        self.lock()
            .values()
            .find(|o| offset >= o.offset && offset - o.offset < o.len as u64)
            .map(|o| o.ptr + (offset - o.offset) as usize)
    }

    /// How many objects are live (for tests and the migration's checks).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The host's destructor callback for an object on the window: it is gone, and so
/// is its claim on the region.
extern "C" fn destroyed(_mem: cl_mem, user_data: *mut c_void) {
    // SAFETY: `user_data` is the box `window_mem_made` leaked for this one call.
    let (id, objects) = *unsafe { Box::from_raw(user_data as *mut (u64, WindowObjects)) };
    objects.lock().remove(&id);
}

impl Session<'_> {
    /// The flags the host gets for an object made on the window: the guest's, with
    /// `CL_MEM_USE_HOST_PTR` in place of where its memory would come from.
    pub fn window_mem_flags(guest: u64) -> u64 {
        (guest & !(CL_MEM_ALLOC_HOST_PTR | CL_MEM_COPY_HOST_PTR)) | CL_MEM_USE_HOST_PTR
    }

    /// Object `id` was made on the window region `b` names: remembered until the
    /// host destroys it. Should the host refuse the destructor callback, the object
    /// stays remembered, and the guest never reuses its region.
    pub fn window_mem_made(&self, id: u64, mem: *mut c_void, b: &BytesIn<'_>) {
        let BytesIn::WindowMem(ptr, len, offset) = *b else {
            return;
        };
        let objects = self.b.window_objects.clone();
        objects.lock().insert(
            id,
            Placed {
                ptr: ptr as usize,
                offset,
                len,
            },
        );
        let data = Box::into_raw(Box::new((id, objects)));
        let status =
            self.rt()
                .clSetMemObjectDestructorCallback(mem as cl_mem, Some(destroyed), data.cast());
        if status != Some(0) {
            warn!(
                "the host refused a destructor callback ({status:?}): window region {offset} stays taken"
            );
            // SAFETY: the host did not take the box; it is still this call's.
            drop(unsafe { Box::from_raw(data) });
        }
    }

    /// The live objects on the window.
    pub fn window_objects(&self) -> &WindowObjects {
        &self.b.window_objects
    }

    /// The guest's id for host object `host` of `kind`, if it has one.
    fn guest_id(&self, kind: Kind, host: *mut c_void) -> Option<u64> {
        self.b
            .handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .id_of(kind, host as usize)
    }
}

/// Maps an object made on the window with the host's own map; `mapped` gets the
/// window offset of the pointer the host returned, `row_pitch` and `slice_pitch` an
/// image's pitches.
///
/// # Safety
/// As `clEnqueueMapBuffer`/`clEnqueueMapImage`; `origin` and `region` are null or
/// point to three `size_t` each, the outputs are null or point to one value each.
#[allow(clippy::too_many_arguments)]
pub unsafe fn hiraMapWindow(
    s: &mut Session<'_>,
    command_queue: cl_command_queue,
    mem: cl_mem,
    blocking_map: cl_bool,
    map_flags: cl_map_flags,
    origin: *const usize,
    region: *const usize,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
    mapped: *mut u64,
    row_pitch: *mut usize,
    slice_pitch: *mut usize,
) -> Option<cl_int> {
    if origin.is_null() || region.is_null() || mapped.is_null() {
        return Some(CL_INVALID_VALUE);
    }
    let rt = s.rt();
    let Some(ty) = info_value::<u32>(|n, p, r| rt.clGetMemObjectInfo(mem, CL_MEM_TYPE, n, p, r))
    else {
        return Some(CL_INVALID_MEM_OBJECT);
    };
    let mut err = 0;
    // SAFETY: origin and region hold three size_t each (the call's contract); the
    // outputs are this call's locals.
    let p = unsafe {
        if ty == CL_MEM_OBJECT_BUFFER {
            rt.clEnqueueMapBuffer(
                command_queue,
                mem,
                blocking_map,
                map_flags,
                *origin,
                *region,
                num_events_in_wait_list,
                event_wait_list,
                event,
                &mut err,
            )?
        } else {
            rt.clEnqueueMapImage(
                command_queue,
                mem,
                blocking_map,
                map_flags,
                origin,
                region,
                row_pitch,
                slice_pitch,
                num_events_in_wait_list,
                event_wait_list,
                event,
                &mut err,
            )?
        }
    };
    if err != 0 {
        return Some(err);
    }
    match s.window_objects().offset_of(p as usize) {
        Some(offset) => {
            // SAFETY: one value each, per the contract; origin and region hold three.
            unsafe {
                *mapped = offset;
                let mem = s.guest_id(Kind::Mem, mem.cast()).unwrap_or(0);
                s.window_objects().maps().push(Mapped {
                    mem,
                    offset,
                    flags: map_flags,
                    origin: *(origin as *const [usize; 3]),
                    region: *(region as *const [usize; 3]),
                });
            }
            Some(0)
        }
        None => {
            // Not the window's memory (a host that copies `CL_MEM_USE_HOST_PTR`
            // memory would still map into it): undone, and refused.
            // SAFETY: `event` is null or the slot the host just wrote.
            unsafe {
                if !event.is_null() && !(*event).is_null() {
                    rt.clReleaseEvent(*event);
                    *event = std::ptr::null_mut();
                }
            }
            rt.clEnqueueUnmapMemObject(
                command_queue,
                mem,
                p,
                0,
                std::ptr::null(),
                std::ptr::null_mut(),
            );
            Some(CL_MAP_FAILURE)
        }
    }
}

/// Unmaps the mapping of an object made on the window at window offset `mapped`.
///
/// # Safety
/// As `clEnqueueUnmapMemObject`.
pub unsafe fn hiraUnmapWindow(
    s: &mut Session<'_>,
    command_queue: cl_command_queue,
    mem: cl_mem,
    mapped: u64,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> Option<cl_int> {
    let Some(p) = s.window_objects().address_of(mapped) else {
        return Some(CL_INVALID_VALUE);
    };
    // The host checks that `p` is a mapping of `mem`.
    let status = s.rt().clEnqueueUnmapMemObject(
        command_queue,
        mem,
        p as *mut c_void,
        num_events_in_wait_list,
        event_wait_list,
        event,
    );
    if status == Some(0) {
        let id = s.guest_id(Kind::Mem, mem.cast()).unwrap_or(0);
        let mut maps = s.window_objects().maps();
        if let Some(i) = maps.iter().position(|m| m.mem == id && m.offset == mapped) {
            maps.remove(i);
        }
    }
    status
}

/// For each of `count` object ids (`ids`, u64s), whether the host has destroyed it:
/// a byte each in `gone`, 1 if so.
///
/// # Safety
/// `ids` is null or holds `count` u64s, `gone` null or `count` bytes.
pub unsafe fn hiraWindowReleased(
    s: &mut Session<'_>,
    count: cl_uint,
    ids: *const c_void,
    gone: *mut c_void,
) -> Option<cl_int> {
    let n = count as usize;
    if n == 0 {
        return Some(0);
    }
    if ids.is_null() || gone.is_null() {
        return Some(CL_INVALID_VALUE);
    }
    // SAFETY: per the contract (the generated decoder checked both lengths).
    let (ids, gone) = unsafe {
        (
            std::slice::from_raw_parts(ids.cast::<u8>(), n * 8),
            std::slice::from_raw_parts_mut(gone.cast::<u8>(), n),
        )
    };
    let live = s.window_objects().lock();
    for (id, g) in ids.chunks_exact(8).zip(gone) {
        let id = u64::from_le_bytes(id.try_into().expect("8 bytes"));
        *g = u8::from(!live.contains_key(&id));
    }
    Some(0)
}

#[cfg(test)]
mod tests {
    use std::os::fd::OwnedFd;

    use hira_apis_opencl::{op, tag};
    use hira_protocol::{Reader, Writer};
    use opencl_sys::{CL_MAP_READ, CL_MAP_WRITE, CL_MEM_READ_WRITE};

    use super::*;
    use crate::backend::{Backend, Fail, FrameData};
    use crate::opencl::{OpenClBackend, test_backend};
    use crate::window::WindowMap;

    const WINDOW: u64 = 1 << 20;

    fn window() -> (OwnedFd, WindowMap) {
        let fd =
            hira_protocol::shm::memfd(c"zero-copy-test", WINDOW, hira_protocol::shm::NO_SHRINK)
                .unwrap();
        let map = WindowMap::map(&fd, WINDOW, 0).unwrap();
        (fd, map)
    }

    /// Runs one call; its reply, or the failure that ends a session.
    fn call(
        b: &OpenClBackend,
        window: &WindowMap,
        opcode: u16,
        w: Writer,
    ) -> Result<Vec<u8>, Fail> {
        let data = FrameData {
            spans: &[],
            window: Some(window),
            no_reply: false,
        };
        let mut out = Writer::new();
        b.execute(opcode, w.as_slice(), &data, &mut out)?;
        Ok(out.as_slice().to_vec())
    }

    fn status(reply: &[u8]) -> i32 {
        i32::from_le_bytes(reply[..4].try_into().unwrap())
    }

    /// Context 1 and queue 2 on the host's first device.
    fn context_and_queue(b: &OpenClBackend, window: &WindowMap) {
        let mut w = Writer::new();
        w.u32(1).u8(1).u8(1);
        let out = call(b, window, op::clGetPlatformIDs, w).unwrap();
        let platform = u64::from_le_bytes(out[8..16].try_into().unwrap());
        let mut w = Writer::new();
        w.u64(platform).u64(0xFFFF_FFFF).u32(1).u8(1).u8(1);
        let out = call(b, window, op::clGetDeviceIDs, w).unwrap();
        let device = u64::from_le_bytes(out[8..16].try_into().unwrap());
        let mut w = Writer::new();
        w.u64(1).u8(0).u32(1).u8(1).u32(1).u64(device).u64(0);
        assert_eq!(status(&call(b, window, op::clCreateContext, w).unwrap()), 0);
        let mut w = Writer::new();
        w.u64(2).u64(1).u64(device).u8(0);
        let out = call(b, window, op::clCreateCommandQueueWithProperties, w).unwrap();
        assert_eq!(status(&out), 0);
    }

    /// Buffer `id` of `len` bytes on the window at `offset`.
    fn window_buffer(id: u64, offset: u64, len: u64) -> Writer {
        let mut w = Writer::new();
        w.u64(id)
            .u64(1)
            .u64(CL_MEM_READ_WRITE)
            .u64(len)
            .u8(tag::WINDOW_MEM)
            .u64(offset)
            .u64(len);
        w
    }

    /// `hiraMapWindow` of bytes `offset..offset + len` of buffer `mem`, blocking.
    fn map(mem: u64, flags: u64, offset: usize, len: usize) -> Writer {
        let mut w = Writer::new();
        let three = |v: [usize; 3]| {
            v.iter()
                .flat_map(|n| (*n as u64).to_le_bytes())
                .collect::<Vec<u8>>()
        };
        w.u64(2).u64(mem).u32(1).u64(flags);
        w.u8(tag::INLINE).bytes(&three([offset, 0, 0]));
        w.u8(tag::INLINE).bytes(&three([len, 1, 1]));
        w.u32(0).u8(0).u64(0).u8(1).u8(1).u8(1);
        w
    }

    fn unmap(mem: u64, offset: u64) -> Writer {
        let mut w = Writer::new();
        w.u64(2).u64(mem).u64(offset).u32(0).u8(0).u64(0);
        w
    }

    fn released(ids: &[u64]) -> Writer {
        let mut w = Writer::new();
        let bytes: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
        w.u32(ids.len() as u32)
            .u8(tag::INLINE)
            .bytes(&bytes)
            .u8(tag::INLINE);
        w
    }

    #[test]
    fn a_buffer_on_the_window_maps_where_it_is_and_is_reported_gone_once_destroyed() {
        let t = test_backend();
        let b = &t.backend;
        let (_fd, win) = window();
        context_and_queue(b, &win);
        let out = call(b, &win, op::clCreateBuffer, window_buffer(7, 4096, 65536)).unwrap();
        assert_eq!(status(&out), 0);
        // Bytes the guest writes into the window are the object's.
        let at = win.at(4096 + 100, 4).unwrap();
        // SAFETY: four bytes inside the mapped window.
        unsafe { std::ptr::copy_nonoverlapping([1u8, 2, 3, 4].as_ptr(), at, 4) };
        let out = call(
            b,
            &win,
            op::hiraMapWindow,
            map(7, CL_MAP_READ | CL_MAP_WRITE, 96, 64),
        )
        .unwrap();
        let mut r = Reader::new(&out);
        assert_eq!(r.i32().unwrap(), 0);
        assert_eq!(
            r.u64().unwrap(),
            4096 + 96,
            "the map is the host's, in place"
        );
        assert_eq!(b.window_objects.mapped().len(), 1);
        let out = call(b, &win, op::hiraUnmapWindow, unmap(7, 4096 + 96)).unwrap();
        assert_eq!(status(&out), 0);
        assert!(b.window_objects.mapped().is_empty());
        // Unmapped once: the host refuses it again.
        let out = call(b, &win, op::hiraUnmapWindow, unmap(7, 4096 + 96)).unwrap();
        assert_ne!(status(&out), 0);
        let out = call(b, &win, op::hiraWindowReleased, released(&[7, 99])).unwrap();
        assert_eq!(status(&out), 0);
        assert!(out.ends_with(&[0, 1]), "{out:?}: 7 lives, 99 never did");
        let mut w = Writer::new();
        w.u64(7);
        call(b, &win, op::clReleaseMemObject, w).unwrap();
        // The unmap's command held the object until it ran.
        let mut w = Writer::new();
        w.u64(2);
        assert_eq!(status(&call(b, &win, op::clFinish, w).unwrap()), 0);
        let out = call(b, &win, op::hiraWindowReleased, released(&[7])).unwrap();
        assert!(out.ends_with(&[1]), "{out:?}");
        assert!(b.window_objects.is_empty());
    }

    #[test]
    fn window_memory_outside_the_window_or_a_map_of_other_memory_is_refused() {
        let t = test_backend();
        let b = &t.backend;
        let (_fd, win) = window();
        context_and_queue(b, &win);
        for (offset, len) in [(WINDOW - 4096, 8192), (u64::MAX - 10, 64), (0, 0)] {
            let r = call(b, &win, op::clCreateBuffer, window_buffer(8, offset, len));
            assert!(matches!(r, Err(Fail::Protocol(_))), "{offset} {len}: {r:?}");
        }
        // A buffer of the host's own memory: its map is undone and refused.
        let mut w = Writer::new();
        w.u64(9)
            .u64(1)
            .u64(CL_MEM_READ_WRITE)
            .u64(4096)
            .u8(tag::NULL);
        assert_eq!(status(&call(b, &win, op::clCreateBuffer, w).unwrap()), 0);
        let out = call(b, &win, op::hiraMapWindow, map(9, CL_MAP_READ, 0, 64)).unwrap();
        assert_eq!(status(&out), CL_MAP_FAILURE);
        assert!(b.window_objects.mapped().is_empty());
        // Offsets no object holds, and outputs the call cannot write.
        let out = call(b, &win, op::hiraUnmapWindow, unmap(9, 12345)).unwrap();
        assert_eq!(status(&out), CL_INVALID_VALUE);
        let mut w = map(9, CL_MAP_READ, 0, 64);
        let mut bytes = w.as_slice().to_vec();
        let n = bytes.len();
        bytes[n - 3] = 0;
        w = Writer::new();
        for byte in bytes {
            w.u8(byte);
        }
        let out = call(b, &win, op::hiraMapWindow, w).unwrap();
        assert_eq!(status(&out), CL_INVALID_VALUE);
        let mut w = Writer::new();
        w.u32(2).u8(tag::NULL).u8(tag::NULL);
        let out = call(b, &win, op::hiraWindowReleased, w).unwrap();
        assert_ne!(status(&out), 0);
    }
}
