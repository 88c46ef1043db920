//! CUDA arrays, copies with an array side, and texture and surface objects, as the
//! API server runs them for a guest.
//!
//! - An array's bytes are charged to the VM's quota when it is made (its texels, as
//!   the driver needs them at the least), and given back when it is destroyed or its
//!   context ends.
//! - A copy with an array side comes whole, its host side (if any) packed row after
//!   row in the call's data; everything in its description is checked here before
//!   the driver's `cuMemcpy3D` sees it: memory types (a host address the guest named
//!   would be one of this process's), the packed side's pitch and size, the arrays'
//!   ids.
//! - Texture and surface objects are the host's values (kernels take them as
//!   arguments); a resource that names an array names the guest's id on the wire.
//!
//! A session holding these moves (`migrate.rs`): its arrays are made again with
//! their contents, and its objects again in the order they were made, each of which
//! must come out with the value the guest holds.

#![allow(non_snake_case)]

use std::ffi::c_void;

use hira_apis_cuda::{Kind, status};
use hira_apis_cuda_private::copy2d::{ARRAY, DEVICE, HOST, Memcpy3D, Position};
use hira_apis_cuda_private::texture::{
    Array3dDescriptor, ArrayDescriptor, RESOURCE_VIEW_DESC_SIZE, ResourceDesc, texel_bytes,
};
use hira_protocol::api::tag;
use hira_protocol::{Reader, Writer};

use super::{Bytes, Session};
use crate::backend::{Fail, FrameData};

fn unsupported() -> Fail {
    Fail::Status(status::NOT_SUPPORTED)
}

fn new_id(r: &mut Reader<'_>) -> Result<Option<u64>, Fail> {
    Ok(if r.u8()? != 0 { Some(r.u64()?) } else { None })
}

/// A structure the guest sent as bytes of exactly its size.
fn read_struct<T: Copy>(b: Option<&Bytes<'_>>) -> Result<Option<T>, Fail> {
    let Some(b) = b else { return Ok(None) };
    Session::check_len(Some(b), std::mem::size_of::<T>())?;
    // SAFETY: exactly `size_of::<T>()` bytes, read unaligned; `T` is a plain C
    // structure of integers and pointer-sized integers, valid for any bytes.
    Ok(Some(unsafe { b.ptr().cast::<T>().read_unaligned() }))
}

/// The texel bytes of an array as described: what the quota is charged.
fn array_bytes(d: &Array3dDescriptor) -> u64 {
    let texel = texel_bytes(d.format, d.channels).unwrap_or(0) as u64;
    (d.width as u64)
        .saturating_mul(texel)
        .saturating_mul(d.height.max(1) as u64)
        .saturating_mul(d.depth.max(1) as u64)
}

/// Makes an array with `make` (the driver's call on the host's out-pointer) in
/// context `ctx_id`, charging its bytes.
fn create_array(
    s: &Session,
    ctx_id: u64,
    id: Option<u64>,
    d: &Array3dDescriptor,
    make: impl FnOnce(*mut *mut c_void) -> i32,
    w: &mut Writer,
) -> Result<(), Fail> {
    let ctx = s.lookup(Kind::Context, ctx_id, true)?;
    if let Some(id) = id {
        s.check_new(Kind::Array, id)?;
    }
    s.make_current(ctx)?;
    let bytes = array_bytes(d);
    if s.quota.charge(bytes).is_err() {
        w.i32(status::OUT_OF_MEMORY);
        return Ok(());
    }
    let mut h: *mut c_void = std::ptr::null_mut();
    let st = make(if id.is_some() {
        &mut h
    } else {
        std::ptr::null_mut()
    });
    w.i32(st);
    match id.filter(|_| st == 0) {
        Some(id) => {
            s.bind(Kind::Array, id, h);
            s.textures().arrays.insert(
                id,
                HeldArray {
                    ctx: ctx_id,
                    bytes,
                    desc: *d,
                },
            );
        }
        None => s.quota.uncharge(bytes),
    }
    Ok(())
}

pub(crate) fn cuArrayCreate_v2<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    frame: &FrameData<'a>,
    w: &mut Writer,
) -> Result<(), Fail> {
    let ctx_id = r.u64()?;
    let id = new_id(r)?;
    let desc = Session::bytes_arg(r, frame)?;
    r.finish()?;
    let f = s.driver.cuArrayCreate_v2.ok_or_else(unsupported)?;
    let Some(d) = read_struct::<ArrayDescriptor>(desc.as_ref())? else {
        w.i32(status::INVALID_VALUE);
        return Ok(());
    };
    // SAFETY: an out-pointer (or NULL as the guest passed) and the description.
    let make = |out: *mut *mut c_void| unsafe { f(out, (&raw const d).cast()) };
    create_array(s, ctx_id, id, &d.into(), make, w)
}

pub(crate) fn cuArray3DCreate_v2<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    frame: &FrameData<'a>,
    w: &mut Writer,
) -> Result<(), Fail> {
    let ctx_id = r.u64()?;
    let id = new_id(r)?;
    let desc = Session::bytes_arg(r, frame)?;
    r.finish()?;
    let f = s.driver.cuArray3DCreate_v2.ok_or_else(unsupported)?;
    let Some(d) = read_struct::<Array3dDescriptor>(desc.as_ref())? else {
        w.i32(status::INVALID_VALUE);
        return Ok(());
    };
    // SAFETY: an out-pointer (or NULL as the guest passed) and the description.
    let make = |out: *mut *mut c_void| unsafe { f(out, (&raw const d).cast()) };
    create_array(s, ctx_id, id, &d, make, w)
}

pub(crate) fn cuArrayDestroy<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    _frame: &FrameData<'a>,
    w: &mut Writer,
) -> Result<(), Fail> {
    let id = r.u64()?;
    r.finish()?;
    let f = s.driver.cuArrayDestroy.ok_or_else(unsupported)?;
    let h = s.lookup(Kind::Array, id, false)?;
    // SAFETY: an array of this session's.
    let st = unsafe { f(h) };
    w.i32(st);
    if st == 0 {
        s.unbind(Kind::Array, id);
        if let Some(a) = s.textures().arrays.remove(&id) {
            s.quota.uncharge(a.bytes);
        }
    }
    Ok(())
}

/// A copy's side as the guest described it: checked and made the host's.
///
/// # Errors
/// `INVALID_VALUE` for a memory type the side may not have (a host address, unless
/// it is the packed data this call carries; unified addresses, which the guest
/// resolves), `INVALID_HANDLE` for an id that names no array of the session.
fn host_side(s: &Session, ty: u32, array: &mut *mut c_void, data_side: bool) -> Result<(), i32> {
    match ty {
        HOST if data_side => Ok(()),
        DEVICE => Ok(()),
        ARRAY => {
            let id = *array as usize as u64;
            *array = s
                .lookup(Kind::Array, id, false)
                .map_err(|_| status::INVALID_VALUE)?;
            if array.is_null() {
                return Err(status::INVALID_VALUE);
            }
            Ok(())
        }
        _ => Err(status::INVALID_VALUE),
    }
}

/// Checks a copy's description and the packed host bytes for one side
/// (`src_data`: the source is the host, else the destination; `None`: neither), and
/// makes the copy with the driver's `cuMemcpy3D` onto `data`.
fn copy_3d(
    s: &Session,
    ctx_id: u64,
    mut c: Memcpy3D,
    host: Option<bool>,
    data: *mut c_void,
    data_len: u64,
) -> Result<i32, Fail> {
    let f = s.extra.cuMemcpy3D_v2.ok_or_else(unsupported)?;
    let ctx = s.lookup(Kind::Context, ctx_id, true)?;
    let (w, h, d) = (c.width_in_bytes, c.height, c.depth);
    let packed = (w as u64)
        .checked_mul(h as u64)
        .and_then(|n| n.checked_mul(d as u64));
    if let Err(st) = host_side(s, c.src_memory_type, &mut c.src_array, host == Some(true))
        .and_then(|()| host_side(s, c.dst_memory_type, &mut c.dst_array, host == Some(false)))
    {
        return Ok(st);
    }
    c.reserved0 = std::ptr::null_mut();
    c.reserved1 = std::ptr::null_mut();
    match host {
        Some(src) => {
            let p = c.position(src);
            let is_host = if src {
                c.src_memory_type == HOST
            } else {
                c.dst_memory_type == HOST
            };
            // The host side is the call's own bytes, row after row, nothing else.
            let packed_rows = Position {
                x: 0,
                y: 0,
                z: 0,
                pitch: w,
                rows: h,
            };
            if !is_host || p != packed_rows || packed != Some(data_len) {
                return Err(Fail::Protocol(format!(
                    "a packed host side of {data_len} bytes does not match the copy's {w} x {h} x {d}"
                )));
            }
            if src {
                c.src_host = data;
            } else {
                c.dst_host = data;
            }
        }
        None if data_len != 0 => {
            return Err(Fail::Protocol(
                "data sent for a copy without a host side".into(),
            ));
        }
        None => {}
    }
    s.make_current(ctx)?;
    // SAFETY: the description checked above; its host side is this call's buffer of
    // exactly the bytes the copy touches, its other sides the session's device
    // memory and arrays, which the driver checks.
    Ok(unsafe { f(&c) })
}

fn read_copy(b: Option<&Bytes<'_>>) -> Result<Memcpy3D, Fail> {
    read_struct::<Memcpy3D>(b)?
        .ok_or_else(|| Fail::Protocol("a copy without its description".into()))
}

pub(crate) fn hiraMemcpy3DIn<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    frame: &FrameData<'a>,
    w: &mut Writer,
) -> Result<(), Fail> {
    let ctx_id = r.u64()?;
    let copy = Session::bytes_arg(r, frame)?;
    let data = Session::bytes_arg(r, frame)?;
    let data_len = r.u64()?;
    r.finish()?;
    let c = read_copy(copy.as_ref())?;
    Session::check_len(data.as_ref(), data_len as usize)?;
    // The bytes out of the guest's reach (the window is shared) before the driver
    // reads them.
    let mut bytes = data.as_ref().map(Bytes::to_vec).unwrap_or_default();
    let host = (data_len > 0).then_some(true);
    let st = copy_3d(s, ctx_id, c, host, bytes.as_mut_ptr().cast(), data_len)?;
    w.i32(st);
    Ok(())
}

pub(crate) fn hiraMemcpy3DOut<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    frame: &FrameData<'a>,
    w: &mut Writer,
) -> Result<(), Fail> {
    let ctx_id = r.u64()?;
    let copy = Session::bytes_arg(r, frame)?;
    let to = Session::out_arg(r)?;
    let data_len = r.u64()?;
    r.finish()?;
    let c = read_copy(copy.as_ref())?;
    let mut out = Session::out_buffer(to, frame, data_len as usize)?;
    let st = copy_3d(s, ctx_id, c, Some(false), out.ptr().cast(), data_len)?;
    w.i32(st);
    if st == 0 {
        out.reply(w);
    }
    Ok(())
}

/// A resource description with the host's array in place of the guest's id; `Err`
/// with the driver's status for an id that names no array.
fn resource_in(s: &Session, b: Option<&Bytes<'_>>) -> Result<Result<ResourceDesc, i32>, Fail> {
    let Some(mut res) = read_struct::<ResourceDesc>(b)? else {
        return Ok(Err(status::INVALID_VALUE));
    };
    let mapped = res.map_array(|id| {
        s.lookup(Kind::Array, id as usize as u64, false)
            .ok()
            .filter(|h| !h.is_null())
    });
    Ok(mapped.map(|()| res).ok_or(status::INVALID_HANDLE))
}

/// Makes a texture (`surface` false) or surface object with `make` and answers with
/// its value, noting it in context `ctx_id` with `descs`, its descriptions as the
/// guest sent them (a migration makes it again from them).
fn create_object(
    s: &Session,
    ctx_id: u64,
    want: bool,
    surface: bool,
    descs: &[Option<Vec<u8>>],
    make: impl FnOnce(*mut u64) -> i32,
    w: &mut Writer,
) -> Result<(), Fail> {
    let ctx = s.lookup(Kind::Context, ctx_id, true)?;
    s.make_current(ctx)?;
    let mut v = 0u64;
    let st = make(if want { &mut v } else { std::ptr::null_mut() });
    w.i32(st);
    if st == 0 && want {
        w.u64(v);
        let mut request = Writer::new();
        request.u64(ctx_id).u8(1);
        for d in descs {
            match d {
                Some(b) => request.u8(tag::INLINE).bytes(b),
                None => request.u8(tag::NULL),
            };
        }
        let mut t = s.textures();
        t.made += 1;
        let seq = t.made;
        t.objects.insert(
            (surface, v),
            HeldObject {
                ctx: ctx_id,
                seq,
                request: request.into_vec(),
            },
        );
    }
    Ok(())
}

pub(crate) fn cuTexObjectCreate<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    frame: &FrameData<'a>,
    w: &mut Writer,
) -> Result<(), Fail> {
    let ctx_id = r.u64()?;
    let want = r.u8()? != 0;
    let res = Session::bytes_arg(r, frame)?;
    let tex = Session::bytes_arg(r, frame)?;
    let view = Session::bytes_arg(r, frame)?;
    r.finish()?;
    let f = s.driver.cuTexObjectCreate.ok_or_else(unsupported)?;
    Session::check_len(tex.as_ref(), 104)?;
    Session::check_len(view.as_ref(), RESOURCE_VIEW_DESC_SIZE)?;
    let descs = [
        res.as_ref().map(Bytes::to_vec),
        tex.as_ref().map(Bytes::to_vec),
        view.as_ref().map(Bytes::to_vec),
    ];
    let res = match resource_in(s, res.as_ref())? {
        Ok(res) => res,
        Err(st) => {
            w.i32(st);
            return Ok(());
        }
    };
    let (tex, view) = (
        tex.as_ref().map(Bytes::to_vec),
        view.as_ref().map(Bytes::to_vec),
    );
    let ptr = |b: &Option<Vec<u8>>| b.as_ref().map_or(std::ptr::null(), |v| v.as_ptr().cast());
    let (tex_p, view_p) = (ptr(&tex), ptr(&view));
    // SAFETY: an out-pointer (or NULL) and descriptions of the sizes cuda.h gives
    // them, or NULL as the guest passed; the array is the session's.
    let make = |out: *mut u64| unsafe { f(out, (&raw const res).cast(), tex_p, view_p) };
    create_object(s, ctx_id, want, false, &descs, make, w)
}

pub(crate) fn cuSurfObjectCreate<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    frame: &FrameData<'a>,
    w: &mut Writer,
) -> Result<(), Fail> {
    let ctx_id = r.u64()?;
    let want = r.u8()? != 0;
    let res = Session::bytes_arg(r, frame)?;
    r.finish()?;
    let f = s.driver.cuSurfObjectCreate.ok_or_else(unsupported)?;
    let descs = [res.as_ref().map(Bytes::to_vec)];
    let res = match resource_in(s, res.as_ref())? {
        Ok(res) => res,
        Err(st) => {
            w.i32(st);
            return Ok(());
        }
    };
    // SAFETY: an out-pointer (or NULL) and the description; the array is the session's.
    let make = |out: *mut u64| unsafe { f(out, (&raw const res).cast()) };
    create_object(s, ctx_id, want, true, &descs, make, w)
}

/// Destroys a texture or surface object of this session's with `destroy`.
fn destroy_object(
    s: &Session,
    r: &mut Reader<'_>,
    w: &mut Writer,
    surface: bool,
    destroy: Option<unsafe extern "C" fn(u64) -> i32>,
) -> Result<(), Fail> {
    let ctx_id = r.u64()?;
    let v = r.u64()?;
    r.finish()?;
    let f = destroy.ok_or_else(unsupported)?;
    let ctx = s.lookup(Kind::Context, ctx_id, true)?;
    // Only the session's own objects: another value could be another session's
    // object in this process's driver (none shares it, but nothing is assumed).
    if !s.textures().objects.contains_key(&(surface, v)) {
        w.i32(status::INVALID_VALUE);
        return Ok(());
    }
    s.make_current(ctx)?;
    // SAFETY: an object this session made.
    let st = unsafe { f(v) };
    w.i32(st);
    if st == 0 {
        s.textures().objects.remove(&(surface, v));
    }
    Ok(())
}

pub(crate) fn cuTexObjectDestroy<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    _frame: &FrameData<'a>,
    w: &mut Writer,
) -> Result<(), Fail> {
    destroy_object(s, r, w, false, s.driver.cuTexObjectDestroy)
}

pub(crate) fn cuSurfObjectDestroy<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    _frame: &FrameData<'a>,
    w: &mut Writer,
) -> Result<(), Fail> {
    destroy_object(s, r, w, true, s.driver.cuSurfObjectDestroy)
}

/// A resource description out of the host, with the guest's id in place of the
/// host's array.
fn resource_out(
    s: &Session,
    r: &mut Reader<'_>,
    frame: &FrameData<'_>,
    w: &mut Writer,
    get: Option<unsafe extern "C" fn(*mut c_void, u64) -> i32>,
) -> Result<(), Fail> {
    let ctx_id = r.u64()?;
    let to = Session::out_arg(r)?;
    let v = r.u64()?;
    r.finish()?;
    let f = get.ok_or_else(unsupported)?;
    let ctx = s.lookup(Kind::Context, ctx_id, true)?;
    let mut out = Session::out_buffer(to, frame, std::mem::size_of::<ResourceDesc>())?;
    s.make_current(ctx)?;
    let mut res = ResourceDesc::default();
    // SAFETY: a description's worth of bytes; the driver checks the value.
    let st = unsafe { f((&raw mut res).cast(), v) };
    w.i32(st);
    if st == 0 {
        res.map_array(|h| Some(s.id_of(Kind::Array, h) as usize as *mut c_void));
        let p = out.ptr();
        if !p.is_null() {
            // SAFETY: the buffer holds a description's bytes.
            unsafe { p.cast::<ResourceDesc>().write_unaligned(res) };
        }
        out.reply(w);
    }
    Ok(())
}

pub(crate) fn cuTexObjectGetResourceDesc<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    frame: &FrameData<'a>,
    w: &mut Writer,
) -> Result<(), Fail> {
    resource_out(s, r, frame, w, s.driver.cuTexObjectGetResourceDesc)
}

pub(crate) fn cuSurfObjectGetResourceDesc<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    frame: &FrameData<'a>,
    w: &mut Writer,
) -> Result<(), Fail> {
    resource_out(s, r, frame, w, s.driver.cuSurfObjectGetResourceDesc)
}

/// An array of the session's.
pub(crate) struct HeldArray {
    /// Its context's id.
    pub(crate) ctx: u64,
    /// The bytes charged.
    pub(crate) bytes: u64,
    /// Its description (depth 0 for a 2D array, height 0 for a 1D one).
    pub(crate) desc: Array3dDescriptor,
}

/// A texture or surface object of the session's.
pub(crate) struct HeldObject {
    /// Its context's id.
    pub(crate) ctx: u64,
    /// The order in which the session's objects were made.
    pub(crate) seq: u64,
    /// The request that makes it again (its context, its descriptions as the guest
    /// sent them, inline).
    pub(crate) request: Vec<u8>,
}

/// A session's arrays and texture and surface objects.
#[derive(Default)]
pub(crate) struct Textures {
    /// Arrays by guest id.
    pub(crate) arrays: std::collections::HashMap<u64, HeldArray>,
    /// Texture (`false`) and surface (`true`) objects by value.
    pub(crate) objects: std::collections::HashMap<(bool, u64), HeldObject>,
    /// Objects made so far.
    pub(crate) made: u64,
}

impl Textures {
    /// Forgets the arrays and objects of a context that ended: the arrays' ids and
    /// the bytes to give back.
    pub(crate) fn context_ended(&mut self, ctx: u64) -> (Vec<u64>, u64) {
        let ids: Vec<u64> = self
            .arrays
            .iter()
            .filter(|(_, a)| a.ctx == ctx)
            .map(|(&id, _)| id)
            .collect();
        let bytes = ids
            .iter()
            .filter_map(|id| self.arrays.remove(id))
            .map(|a| a.bytes)
            .sum();
        self.objects.retain(|_, o| o.ctx != ctx);
        (ids, bytes)
    }
}
