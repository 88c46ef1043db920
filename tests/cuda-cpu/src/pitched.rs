//! Pitched memory, 2D and 3D copies and 2D memsets (`cuMemAllocPitch`, `cuMemcpy2D`,
//! `cuMemcpy3D`, `cuMemsetD2D*`) between host and device memory and CUDA arrays, as
//! the driver API documents them. An array's side of a copy is its device memory,
//! row after row ([`crate::texture`]), the copy checked against the array's extent.

use std::ffi::{c_uint, c_void};

use hira_apis_cuda_private::copy2d::{ARRAY, DEVICE, Memcpy2D, Memcpy3D, Refused, Side};

use super::{
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS,
    CUdeviceptr, CUresult, Handle, State, copy_from_device, copy_on_device, copy_to_device, put,
    stream_ok, with_ctx, with_ctx_flushing,
};

/// The pitch rows get: a multiple of 512 bytes, as NVIDIA's driver gives on GPUs of
/// this compute capability.
const PITCH_ALIGN: usize = 512;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: c_uint,
) -> CUresult {
    with_ctx(|s, _| {
        if dptr.is_null() || pitch.is_null() || width == 0 || height == 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        if ![4, 8, 16].contains(&element_size) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let Some(p) = width.checked_next_multiple_of(PITCH_ALIGN) else {
            return CUDA_ERROR_INVALID_VALUE;
        };
        let Some(size) = p.checked_mul(height) else {
            return CUDA_ERROR_OUT_OF_MEMORY;
        };
        match s.mem.alloc(size) {
            // SAFETY: both checked not null.
            Some(a) => unsafe {
                put(pitch, p);
                put(dptr, a)
            },
            None => CUDA_ERROR_OUT_OF_MEMORY,
        }
    })
}

/// Copies `w` bytes of each of `h` rows of each of `d` slices from `src` to `dst`.
fn copy_rows(s: &mut State, src: Side, dst: Side, (w, h, d): (usize, usize, usize)) -> CUresult {
    let mut row = vec![0u8; w];
    for k in 0..h * d {
        let (from, to) = (src.row(k, h), dst.row(k, h));
        let st = match (src.device, dst.device) {
            (true, true) => copy_on_device(s, to, from, w),
            (false, true) => copy_to_device(s, to, from as usize as *const c_void, w),
            (true, false) => copy_from_device(s, to as usize as *mut c_void, from, w),
            (false, false) => {
                // SAFETY: host rows the application described.
                unsafe {
                    std::ptr::copy_nonoverlapping(from as usize as *const u8, row.as_mut_ptr(), w);
                    std::ptr::copy_nonoverlapping(row.as_ptr(), to as usize as *mut u8, w);
                }
                CUDA_SUCCESS
            }
        };
        if st != CUDA_SUCCESS {
            return st;
        }
    }
    CUDA_SUCCESS
}

/// A copy of `size` (width in bytes, height, depth) between `sides`: every device
/// row is checked before any is copied.
fn copy_checked(
    s: &mut State,
    sides: Result<(Side, Side), Refused>,
    size: (usize, usize, usize),
) -> CUresult {
    let (w, h, d) = size;
    if w == 0 || h == 0 || d == 0 {
        return CUDA_SUCCESS;
    }
    let (src, dst) = match sides {
        Ok(sides) => sides,
        Err(Refused::Array) => return CUDA_ERROR_NOT_SUPPORTED,
        Err(Refused::Invalid) => return CUDA_ERROR_INVALID_VALUE,
    };
    for side in [src, dst] {
        let span = side.span(w, h, d).and_then(|n| usize::try_from(n).ok());
        match span {
            Some(n) if !side.device || s.mem.find(side.at, n).is_some() => {}
            _ => return CUDA_ERROR_INVALID_VALUE,
        }
    }
    copy_rows(s, src, dst, size)
}

/// An array's side of a copy of `size` from texel row `y` of slice `z`, byte `x`:
/// the array's memory, its row bytes and rows per slice, if the copy stays inside.
fn array_side(
    s: &State,
    array: *mut c_void,
    (x, y, z): (usize, usize, usize),
    (w, h, d): (usize, usize, usize),
) -> Result<(u64, usize, usize), CUresult> {
    let a = crate::texture::array(s, array).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let row = a.row_bytes();
    let (rows, slices) = a.rows();
    let inside = |at: usize, n: usize, limit: usize| at.checked_add(n).is_some_and(|e| e <= limit);
    if !(inside(x, w, row) && inside(y, h, rows) && inside(z, d, slices)) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok((a.base, row, rows))
}

/// Makes a copy's array side (`src`, else the destination) the array's device
/// memory, its pitch the array's row bytes and its rows per slice the array's.
fn array_as_device(s: &State, c: &mut Memcpy3D, src: bool) -> Result<(), CUresult> {
    let size = (c.width_in_bytes, c.height, c.depth);
    let at = c.position(src);
    let (ty, array, device, pitch, rows) = if src {
        (
            &mut c.src_memory_type,
            c.src_array,
            &mut c.src_device,
            &mut c.src_pitch,
            &mut c.src_height,
        )
    } else {
        (
            &mut c.dst_memory_type,
            c.dst_array,
            &mut c.dst_device,
            &mut c.dst_pitch,
            &mut c.dst_height,
        )
    };
    if *ty == ARRAY {
        let (base, row, per_slice) = array_side(s, array, (at.x, at.y, at.z), size)?;
        (*ty, *device, *pitch, *rows) = (DEVICE, base, row, per_slice);
    }
    Ok(())
}

/// A 2D or 3D copy (a 2D one is one slice deep).
fn copy_3d(mut c: Memcpy3D, stream: Option<Handle>) -> CUresult {
    with_ctx_flushing(|s, _| {
        if stream.is_some_and(|h| !stream_ok(s, h)) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        if let Err(e) = array_as_device(s, &mut c, true).and(array_as_device(s, &mut c, false)) {
            return e;
        }
        let sides = c.sides(|p| s.mem.find(p, 1).is_some());
        copy_checked(s, sides, (c.width_in_bytes, c.height, c.depth))
    })
}

/// A 2D copy.
unsafe fn copy_2d(copy: *const Memcpy2D, stream: Option<Handle>) -> CUresult {
    if copy.is_null() {
        return with_ctx_flushing(|_, _| CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's description.
    copy_3d(Memcpy3D::from(&unsafe { copy.read_unaligned() }), stream)
}

/// A 3D copy.
unsafe fn copy_3d_at(copy: *const Memcpy3D, stream: Option<Handle>) -> CUresult {
    if copy.is_null() {
        return with_ctx_flushing(|_, _| CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's description.
    copy_3d(unsafe { copy.read_unaligned() }, stream)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy3D_v2(copy: *const Memcpy3D) -> CUresult {
    // SAFETY: the caller's promise.
    unsafe { copy_3d_at(copy, None) }
}

/// Work runs when it is enqueued here, so an asynchronous copy is done on return.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy3DAsync_v2(copy: *const Memcpy3D, stream: Handle) -> CUresult {
    if !copy.is_null() {
        // SAFETY: the caller's description, as the API requires.
        let c = unsafe { copy.read_unaligned() };
        if let Some(st) = hira_apis_cuda_private::graph::capture(stream, || {
            hira_apis_cuda_private::graph::copy_op(c)
        }) {
            return st;
        }
    }
    // SAFETY: the caller's promise.
    unsafe { copy_3d_at(copy, Some(stream)) }
}

/// The copies of bytes in a row with an array side, made as the 3D copy they are.
mod linear {
    use hira_apis_cuda_private::copy2d::{Linear, Memcpy3D};

    use super::{CUdeviceptr, CUresult, Handle, copy_3d};
    use std::ffi::c_void;

    #[unsafe(no_mangle)]
    pub extern "C" fn cuMemcpyHtoA_v2(
        dst: Handle,
        at: usize,
        src: *const c_void,
        n: usize,
    ) -> CUresult {
        copy_3d(
            Memcpy3D::linear(Linear::Array(dst, at), Linear::Host(src.cast_mut()), n),
            None,
        )
    }

    #[unsafe(no_mangle)]
    pub extern "C" fn cuMemcpyAtoH_v2(
        dst: *mut c_void,
        src: Handle,
        at: usize,
        n: usize,
    ) -> CUresult {
        copy_3d(
            Memcpy3D::linear(Linear::Host(dst), Linear::Array(src, at), n),
            None,
        )
    }

    #[unsafe(no_mangle)]
    pub extern "C" fn cuMemcpyDtoA_v2(
        dst: Handle,
        at: usize,
        src: CUdeviceptr,
        n: usize,
    ) -> CUresult {
        copy_3d(
            Memcpy3D::linear(Linear::Array(dst, at), Linear::Device(src), n),
            None,
        )
    }

    #[unsafe(no_mangle)]
    pub extern "C" fn cuMemcpyAtoD_v2(
        dst: CUdeviceptr,
        src: Handle,
        at: usize,
        n: usize,
    ) -> CUresult {
        copy_3d(
            Memcpy3D::linear(Linear::Device(dst), Linear::Array(src, at), n),
            None,
        )
    }

    #[unsafe(no_mangle)]
    pub extern "C" fn cuMemcpyAtoA_v2(
        dst: Handle,
        dst_at: usize,
        src: Handle,
        src_at: usize,
        n: usize,
    ) -> CUresult {
        copy_3d(
            Memcpy3D::linear(Linear::Array(dst, dst_at), Linear::Array(src, src_at), n),
            None,
        )
    }

    /// Work runs when it is enqueued here, so an asynchronous copy is done on return.
    #[unsafe(no_mangle)]
    pub extern "C" fn cuMemcpyHtoAAsync_v2(
        dst: Handle,
        at: usize,
        src: *const c_void,
        n: usize,
        stream: Handle,
    ) -> CUresult {
        let c = Memcpy3D::linear(Linear::Array(dst, at), Linear::Host(src.cast_mut()), n);
        let op = || hira_apis_cuda_private::graph::copy_op(c);
        if let Some(st) = hira_apis_cuda_private::graph::capture(stream, op) {
            return st;
        }
        copy_3d(c, Some(stream))
    }

    #[unsafe(no_mangle)]
    pub extern "C" fn cuMemcpyAtoHAsync_v2(
        dst: *mut c_void,
        src: Handle,
        at: usize,
        n: usize,
        stream: Handle,
    ) -> CUresult {
        let c = Memcpy3D::linear(Linear::Host(dst), Linear::Array(src, at), n);
        let op = || hira_apis_cuda_private::graph::copy_op(c);
        if let Some(st) = hira_apis_cuda_private::graph::capture(stream, op) {
            return st;
        }
        copy_3d(c, Some(stream))
    }
}
pub use linear::*;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy2D_v2(copy: *const Memcpy2D) -> CUresult {
    // SAFETY: the caller's promise.
    unsafe { copy_2d(copy, None) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy2DUnaligned_v2(copy: *const Memcpy2D) -> CUresult {
    // SAFETY: the caller's promise.
    unsafe { copy_2d(copy, None) }
}

/// Work runs when it is enqueued here, so an asynchronous copy is done on return.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy2DAsync_v2(copy: *const Memcpy2D, stream: Handle) -> CUresult {
    if !copy.is_null() {
        // SAFETY: the caller's description, as the API requires.
        let c2 = unsafe { copy.read_unaligned() };
        let c = Memcpy3D::from(&c2);
        if let Some(st) = hira_apis_cuda_private::graph::capture(stream, || {
            hira_apis_cuda_private::graph::copy_op(c)
        }) {
            return st;
        }
    }
    // SAFETY: the caller's promise.
    unsafe { copy_2d(copy, Some(stream)) }
}

/// A 2D memset of `width` elements (`pattern`) in each of `height` rows.
fn memset_2d(
    dst: CUdeviceptr,
    pitch: usize,
    pattern: &[u8],
    width: usize,
    height: usize,
) -> CUresult {
    with_ctx(|s, _| {
        if width == 0 || height == 0 {
            return CUDA_SUCCESS;
        }
        let Some(bytes) = width.checked_mul(pattern.len()) else {
            return CUDA_ERROR_INVALID_VALUE;
        };
        let span = (height - 1)
            .checked_mul(pitch)
            .and_then(|n| n.checked_add(bytes));
        let fits = span.is_some_and(|n| s.mem.find(dst, n).is_some());
        if !fits || (height > 1 && pitch < bytes) || !dst.is_multiple_of(pattern.len() as u64) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let data: Vec<u8> = pattern.iter().copied().cycle().take(bytes).collect();
        for r in 0..height {
            if !super::ptx::DeviceMemory::write(&mut s.mem, dst + (r * pitch) as u64, &data) {
                return CUDA_ERROR_INVALID_VALUE;
            }
        }
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD2D8_v2(
    dst: CUdeviceptr,
    pitch: usize,
    v: u8,
    w: usize,
    h: usize,
) -> CUresult {
    memset_2d(dst, pitch, &[v], w, h)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD2D16_v2(
    dst: CUdeviceptr,
    pitch: usize,
    v: u16,
    w: usize,
    h: usize,
) -> CUresult {
    memset_2d(dst, pitch, &v.to_le_bytes(), w, h)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD2D32_v2(
    dst: CUdeviceptr,
    pitch: usize,
    v: c_uint,
    w: usize,
    h: usize,
) -> CUresult {
    memset_2d(dst, pitch, &v.to_le_bytes(), w, h)
}

/// Work runs when it is enqueued here, so an asynchronous memset is done on return.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD2D8Async(
    dst: CUdeviceptr,
    pitch: usize,
    v: u8,
    w: usize,
    h: usize,
    stream: Handle,
) -> CUresult {
    let op = || hira_apis_cuda_private::graph::memset_op(dst, pitch, v.into(), 1, w, h);
    if let Some(st) = hira_apis_cuda_private::graph::capture(stream, op) {
        return st;
    }
    memset_2d(dst, pitch, &[v], w, h)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD2D16Async(
    dst: CUdeviceptr,
    pitch: usize,
    v: u16,
    w: usize,
    h: usize,
    stream: Handle,
) -> CUresult {
    let op = || hira_apis_cuda_private::graph::memset_op(dst, pitch, v.into(), 2, w, h);
    if let Some(st) = hira_apis_cuda_private::graph::capture(stream, op) {
        return st;
    }
    memset_2d(dst, pitch, &v.to_le_bytes(), w, h)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD2D32Async(
    dst: CUdeviceptr,
    pitch: usize,
    v: c_uint,
    w: usize,
    h: usize,
    stream: Handle,
) -> CUresult {
    let op = || hira_apis_cuda_private::graph::memset_op(dst, pitch, v, 4, w, h);
    if let Some(st) = hira_apis_cuda_private::graph::capture(stream, op) {
        return st;
    }
    memset_2d(dst, pitch, &v.to_le_bytes(), w, h)
}
