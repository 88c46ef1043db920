//! CUDA arrays, texture objects and surface objects (`cuArrayCreate`,
//! `cuArray3DCreate`, `cuTexObjectCreate`, `cuSurfObjectCreate`), as the driver API
//! documents them. An array is device memory here, its texels row after row and
//! slice after slice; copies to and from it are 2D and 3D copies of that memory
//! (`pitched.rs`), and kernels reach it through the objects ([`crate::ptx::tex`]).
//! A layered array's layers are its slices. Cube-map and mipmapped arrays are not in
//! this executor (`CUDA_ERROR_NOT_SUPPORTED`).

use std::ffi::c_void;

use hira_apis_cuda_private::texture::{
    ARRAY3D_LAYERED, ARRAY3D_SURFACE_LDST, Array3dDescriptor, ArrayDescriptor, FILTER_LINEAR,
    Resource, ResourceDesc, TRSF_NORMALIZED_COORDINATES, TRSF_READ_AS_INTEGER, TextureDesc,
    texel_bytes,
};

use super::ptx::tex::{Surface, Texels, Texture};
use super::{
    CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED,
    CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CUresult, Handle, State, put, with, with_ctx,
};

/// An array: its description and where its texels are.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Array {
    pub desc: Array3dDescriptor,
    pub base: u64,
}

impl Array {
    pub fn texels(&self) -> Texels {
        let d = &self.desc;
        let row = self.row_bytes();
        Texels {
            base: self.base,
            width: d.width,
            height: d.height,
            depth: d.depth,
            pitch: row,
            slice: row * d.height.max(1),
            format: d.format,
            channels: d.channels,
        }
    }

    pub fn row_bytes(&self) -> usize {
        self.desc.width * texel_bytes(self.desc.format, self.desc.channels).unwrap_or(0)
    }

    /// Rows per slice, and slices.
    pub fn rows(&self) -> (usize, usize) {
        (self.desc.height.max(1), self.desc.depth.max(1))
    }
}

/// The texture and surface objects the executor made: what kernels fetch through,
/// and the descriptions they were made from.
#[derive(Default)]
pub(crate) struct Objects {
    pub textures: std::collections::HashMap<u64, (Texture, ResourceDesc, TextureDesc)>,
    pub surfaces: std::collections::HashMap<u64, (Surface, ResourceDesc)>,
    next: u64,
}

impl Objects {
    fn next(&mut self) -> u64 {
        self.next += 1;
        self.next
    }
}

fn create(s: &mut State, d: Array3dDescriptor) -> Result<Handle, CUresult> {
    let Some(texel) = texel_bytes(d.format, d.channels) else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let layered = d.flags & ARRAY3D_LAYERED != 0;
    // A 1D layered array has no height, its layers are its depth.
    if d.width == 0 || (d.height == 0 && d.depth != 0 && !layered) || (layered && d.depth == 0) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if d.flags & !(ARRAY3D_SURFACE_LDST | ARRAY3D_LAYERED) != 0 {
        // Cube-map and gather arrays.
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    let bytes = d
        .width
        .checked_mul(texel)
        .and_then(|n| n.checked_mul(d.height.max(1)))
        .and_then(|n| n.checked_mul(d.depth.max(1)))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let base = s.mem.alloc(bytes).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    let h = s.handle();
    s.arrays.insert(h, Array { desc: d, base });
    Ok(h as Handle)
}

/// The array `h` names.
pub(crate) fn array(s: &State, h: *mut c_void) -> Option<Array> {
    s.arrays.get(&(h as usize)).copied()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(p: *mut Handle, d: *const ArrayDescriptor) -> CUresult {
    with_ctx(|s, _| {
        if p.is_null() || d.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: the caller's description.
        let d = unsafe { d.read_unaligned() };
        match create(s, d.into()) {
            // SAFETY: checked not null.
            Ok(h) => unsafe { put(p, h) },
            Err(e) => e,
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    p: *mut Handle,
    d: *const Array3dDescriptor,
) -> CUresult {
    with_ctx(|s, _| {
        if p.is_null() || d.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: the caller's description.
        match create(s, unsafe { d.read_unaligned() }) {
            // SAFETY: checked not null.
            Ok(h) => unsafe { put(p, h) },
            Err(e) => e,
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuArrayDestroy(h: Handle) -> CUresult {
    with(|s| match s.arrays.remove(&(h as usize)) {
        Some(a) => {
            s.mem.free(a.base);
            CUDA_SUCCESS
        }
        None => CUDA_ERROR_INVALID_HANDLE,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayGetDescriptor_v2(out: *mut ArrayDescriptor, h: Handle) -> CUresult {
    with(|s| match array(s, h) {
        // SAFETY: the caller's pointer, checked by `put`.
        Some(a) if a.desc.depth == 0 => unsafe {
            put(
                out,
                ArrayDescriptor {
                    width: a.desc.width,
                    height: a.desc.height,
                    format: a.desc.format,
                    channels: a.desc.channels,
                },
            )
        },
        Some(_) => CUDA_ERROR_INVALID_VALUE,
        None => CUDA_ERROR_INVALID_HANDLE,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DGetDescriptor_v2(
    out: *mut Array3dDescriptor,
    h: Handle,
) -> CUresult {
    with(|s| match array(s, h) {
        // SAFETY: the caller's pointer, checked by `put`.
        Some(a) => unsafe { put(out, a.desc) },
        None => CUDA_ERROR_INVALID_HANDLE,
    })
}

/// The texels a resource description names, checked against what exists.
fn texels(s: &State, r: &ResourceDesc) -> Result<(Texels, bool, Option<Array>), CUresult> {
    match r.resource() {
        Resource::Array(h) => {
            let a = array(s, h).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            Ok((a.texels(), false, Some(a)))
        }
        Resource::Linear {
            device,
            format,
            channels,
            bytes,
        } => {
            let texel = texel_bytes(format, channels).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            if bytes == 0 || s.mem.find(device, bytes).is_none() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            Ok((
                Texels {
                    base: device,
                    width: bytes / texel,
                    height: 0,
                    depth: 0,
                    pitch: bytes,
                    slice: bytes,
                    format,
                    channels,
                },
                true,
                None,
            ))
        }
        Resource::Pitch2d {
            device,
            format,
            channels,
            width,
            height,
            pitch,
        } => {
            let texel = texel_bytes(format, channels).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let span = width
                .checked_mul(texel)
                .filter(|&row| row <= pitch && width > 0 && height > 0)
                .and_then(|row| (height - 1).checked_mul(pitch)?.checked_add(row));
            if span.is_none_or(|n| s.mem.find(device, n).is_none()) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            Ok((
                Texels {
                    base: device,
                    width,
                    height,
                    depth: 0,
                    pitch,
                    slice: pitch * height,
                    format,
                    channels,
                },
                false,
                None,
            ))
        }
        Resource::Other(_) => Err(CUDA_ERROR_NOT_SUPPORTED),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexObjectCreate(
    p: *mut u64,
    res: *const ResourceDesc,
    tex: *const TextureDesc,
    view: *const c_void,
) -> CUresult {
    with_ctx(|s, _| {
        if p.is_null() || res.is_null() || tex.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        if !view.is_null() {
            // Resource views (a format or a range other than the array's).
            return CUDA_ERROR_NOT_SUPPORTED;
        }
        // SAFETY: the caller's descriptions.
        let (r, t) = unsafe { (res.read_unaligned(), tex.read_unaligned()) };
        let (texels, linear, _) = match texels(s, &r) {
            Ok(x) => x,
            Err(e) => return e,
        };
        if t.address_mode.iter().any(|&m| m > 3) || t.filter_mode > 1 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let object = Texture {
            texels,
            linear,
            address: t.address_mode,
            filter_linear: t.filter_mode == FILTER_LINEAR,
            read_as_integer: t.flags & TRSF_READ_AS_INTEGER != 0,
            normalized: t.flags & TRSF_NORMALIZED_COORDINATES != 0,
            border: t.border_color,
        };
        let h = s.mem.objects.next();
        s.mem.objects.textures.insert(h, (object, r, t));
        // SAFETY: checked not null.
        unsafe { put(p, h) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuTexObjectDestroy(h: u64) -> CUresult {
    with(|s| match s.mem.objects.textures.remove(&h) {
        Some(_) => CUDA_SUCCESS,
        None => CUDA_ERROR_INVALID_VALUE,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexObjectGetResourceDesc(out: *mut ResourceDesc, h: u64) -> CUresult {
    with(|s| match s.mem.objects.textures.get(&h) {
        // SAFETY: the caller's pointer, checked by `put`.
        Some((_, r, _)) => unsafe { put(out, *r) },
        None => CUDA_ERROR_INVALID_VALUE,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexObjectGetTextureDesc(out: *mut TextureDesc, h: u64) -> CUresult {
    with(|s| match s.mem.objects.textures.get(&h) {
        // SAFETY: the caller's pointer, checked by `put`.
        Some((_, _, t)) => unsafe { put(out, *t) },
        None => CUDA_ERROR_INVALID_VALUE,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuSurfObjectCreate(p: *mut u64, res: *const ResourceDesc) -> CUresult {
    with_ctx(|s, _| {
        if p.is_null() || res.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: the caller's description.
        let r = unsafe { res.read_unaligned() };
        // Surfaces are arrays made for loads and stores.
        let array = match texels(s, &r) {
            Ok((_, _, Some(a))) if a.desc.flags & ARRAY3D_SURFACE_LDST != 0 => a,
            Ok(_) => return CUDA_ERROR_INVALID_VALUE,
            Err(e) => return e,
        };
        let h = s.mem.objects.next();
        s.mem.objects.surfaces.insert(
            h,
            (
                Surface {
                    texels: array.texels(),
                },
                r,
            ),
        );
        // SAFETY: checked not null.
        unsafe { put(p, h) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuSurfObjectDestroy(h: u64) -> CUresult {
    with(|s| match s.mem.objects.surfaces.remove(&h) {
        Some(_) => CUDA_SUCCESS,
        None => CUDA_ERROR_INVALID_VALUE,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuSurfObjectGetResourceDesc(out: *mut ResourceDesc, h: u64) -> CUresult {
    with(|s| match s.mem.objects.surfaces.get(&h) {
        // SAFETY: the caller's pointer, checked by `put`.
        Some((_, r)) => unsafe { put(out, *r) },
        None => CUDA_ERROR_INVALID_VALUE,
    })
}
