//! Texture fetches and surface loads and stores (`tex`, `suld.b`, `sust.b`) on the
//! texture and surface objects the driver made (`cuTexObjectCreate`,
//! `cuSurfObjectCreate`), as the CUDA programming guide's "Texture Fetching"
//! appendix describes them: coordinates unnormalised, the address mode applied per
//! dimension, nearest-point or linear filtering with weights of 8 fractional bits (as
//! the hardware keeps them), integers read as they are or as normalised floats.

use super::DeviceMemory;

use hira_apis_cuda_private::texture::{
    ADDRESS_BORDER, ADDRESS_CLAMP, ADDRESS_MIRROR, ADDRESS_WRAP, FORMATS,
};

/// The bytes of one channel of `format`, if the executor knows it.
pub fn channel_bytes(format: u32) -> Option<usize> {
    FORMATS.iter().find(|(f, _)| *f == format).map(|(_, n)| *n)
}

/// Texels in device memory: `depth` slices of `height` rows of `width` texels, each
/// of `channels` channels of `format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Texels {
    pub base: u64,
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    /// Bytes from one row to the next, and from one slice to the next.
    pub pitch: usize,
    pub slice: usize,
    pub format: u32,
    pub channels: u32,
}

impl Texels {
    pub fn texel_bytes(&self) -> usize {
        channel_bytes(self.format).unwrap_or(0) * self.channels as usize
    }

    fn at(&self, x: usize, y: usize, z: usize) -> u64 {
        self.base + (z * self.slice + y * self.pitch + x * self.texel_bytes()) as u64
    }
}

/// A texture object.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Texture {
    pub texels: Texels,
    /// Linear memory (`CU_RESOURCE_TYPE_LINEAR`): fetched by integer index only.
    pub linear: bool,
    pub address: [u32; 3],
    pub filter_linear: bool,
    /// `CU_TRSF_READ_AS_INTEGER`: integers as they are, not as normalised floats.
    pub read_as_integer: bool,
    /// `CU_TRSF_NORMALIZED_COORDINATES`.
    pub normalized: bool,
    pub border: [f32; 4],
}

/// A surface object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Surface {
    pub texels: Texels,
}

/// What an out-of-range surface access does (`suld`/`sust` `.trap`, `.clamp`, `.zero`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clamp {
    Trap,
    Clamp,
    Zero,
}

/// One channel of a texel: an integer (its bits, sign-extended) or a float.
#[derive(Clone, Copy, Debug)]
enum Channel {
    Int(i64),
    Float(f32),
}

fn read_channel(mem: &dyn DeviceMemory, addr: u64, format: u32) -> Option<Channel> {
    let n = channel_bytes(format)?;
    let mut b = [0u8; 8];
    if !mem.read(addr, &mut b[..n]) {
        return None;
    }
    let raw = u64::from_le_bytes(b);
    Some(match format {
        0x01..=0x03 => Channel::Int(raw as i64),
        0x08 => Channel::Int(i64::from(raw as u8 as i8)),
        0x09 => Channel::Int(i64::from(raw as u16 as i16)),
        0x0a => Channel::Int(i64::from(raw as u32 as i32)),
        0x10 => Channel::Float(half::f16::from_bits(raw as u16).to_f32()),
        _ => Channel::Float(f32::from_bits(raw as u32)),
    })
}

/// A channel as a float the fetch returns: integers of 8 and 16 bits normalised
/// unless read as integers.
fn as_float(c: Channel, format: u32) -> f32 {
    match c {
        Channel::Float(f) => f,
        Channel::Int(v) => match format {
            0x01 => v as f32 / 255.0,
            0x02 => v as f32 / 65535.0,
            0x08 => (v as f32 / 127.0).max(-1.0),
            0x09 => (v as f32 / 32767.0).max(-1.0),
            _ => v as f32,
        },
    }
}

/// Whether a fetch of `tex` returns floats (and may filter): float formats, and
/// integers read as normalised floats.
pub fn returns_float(tex: &Texture) -> bool {
    matches!(tex.texels.format, 0x10 | 0x20) || !tex.read_as_integer
}

/// A texel index after the address mode: `None` for a border texel.
fn address(i: i64, size: usize, mode: u32, normalized: bool) -> Option<usize> {
    let n = size.max(1) as i64;
    // Wrap and mirror need normalised coordinates; otherwise the hardware clamps.
    let mode = match mode {
        ADDRESS_WRAP | ADDRESS_MIRROR if !normalized => ADDRESS_CLAMP,
        m => m,
    };
    let j = match mode {
        ADDRESS_WRAP => i.rem_euclid(n),
        ADDRESS_MIRROR => {
            let m = i.rem_euclid(2 * n);
            if m >= n { 2 * n - 1 - m } else { m }
        }
        ADDRESS_BORDER => {
            if !(0..n).contains(&i) {
                return None;
            }
            i
        }
        _ => i.clamp(0, n - 1),
    };
    Some(j as usize)
}

/// The channels of the texel at `idx` (`None`: the border), as the fetch returns
/// them: floats' bits or integers.
fn texel(
    mem: &dyn DeviceMemory,
    tex: &Texture,
    idx: Option<[usize; 3]>,
) -> Result<[Channel; 4], String> {
    let float = returns_float(tex);
    let Some([x, y, z]) = idx else {
        return Ok(tex.border.map(Channel::Float));
    };
    let t = &tex.texels;
    let n = channel_bytes(t.format).ok_or("unknown texel format")?;
    let mut out = [if float {
        Channel::Float(0.0)
    } else {
        Channel::Int(0)
    }; 4];
    for (c, slot) in out.iter_mut().enumerate().take(t.channels as usize) {
        let addr = t.at(x, y, z) + (c * n) as u64;
        let ch = read_channel(mem, addr, t.format)
            .ok_or_else(|| format!("illegal address {addr:#x} in a texture"))?;
        *slot = if float {
            Channel::Float(as_float(ch, t.format))
        } else {
            ch
        };
    }
    Ok(out)
}

/// The four results of a `tex` fetch at `coords` (floats, or integers when `ints`)
/// of `dims` dimensions, in `layer` of a layered array (clamped to its layers), as
/// register values: floats' bits for `float_out`, else integers.
pub fn fetch(
    mem: &dyn DeviceMemory,
    tex: &Texture,
    dims: usize,
    coords: [u64; 3],
    ints: bool,
    float_out: bool,
    layer: Option<i64>,
) -> Result<[u64; 4], String> {
    let t = &tex.texels;
    let sizes = [t.width, t.height.max(1), t.depth.max(1)];
    // A layer is the slice every texel of the fetch comes from; filtering stays in it.
    let layer = layer.map(|l| l.clamp(0, sizes[2] as i64 - 1) as usize);
    let texel = |idx: Option<[usize; 3]>| {
        let idx = idx.map(|mut i| {
            if let Some(l) = layer {
                i[2] = l;
            }
            i
        });
        texel(mem, tex, idx)
    };
    let result: [Channel; 4] = if tex.linear || ints {
        // Integer coordinates: that texel, no filtering; out of range is zero for
        // linear memory, the address mode otherwise.
        let mut idx = [0usize; 3];
        let mut inside = true;
        for d in 0..dims {
            let i = coords[d] as u32 as i32 as i64;
            if tex.linear {
                inside &= (0..sizes[d] as i64).contains(&i);
                idx[d] = i.max(0) as usize;
            } else {
                match address(i, sizes[d], tex.address[d], false) {
                    Some(j) => idx[d] = j,
                    None => inside = false,
                }
            }
        }
        if tex.linear && !inside {
            [Channel::Int(0); 4]
        } else {
            texel(inside.then_some(idx))?
        }
    } else {
        let mut x = [0f32; 3];
        for d in 0..dims {
            let c = f32::from_bits(coords[d] as u32);
            x[d] = if tex.normalized {
                c * sizes[d] as f32
            } else {
                c
            };
        }
        if tex.filter_linear && returns_float(tex) {
            // Between the texels around x - 0.5, weighted by its fraction in 1/256ths.
            let mut lo = [0i64; 3];
            let mut w = [0f32; 3];
            for d in 0..dims {
                let xb = x[d] - 0.5;
                let f = xb.floor();
                lo[d] = f as i64;
                w[d] = ((xb - f) * 256.0).round() / 256.0;
            }
            let mut acc = [0f32; 4];
            for corner in 0..(1usize << dims) {
                let mut weight = 1f32;
                let mut idx = Some([0usize; 3]);
                for d in 0..dims {
                    let up = (corner >> d) & 1 == 1;
                    weight *= if up { w[d] } else { 1.0 - w[d] };
                    let i = lo[d] + i64::from(up);
                    match (
                        address(i, sizes[d], tex.address[d], tex.normalized),
                        idx.as_mut(),
                    ) {
                        (Some(j), Some(ix)) => ix[d] = j,
                        _ => idx = None,
                    }
                }
                let v = texel(idx)?;
                for (a, c) in acc.iter_mut().zip(v) {
                    if let Channel::Float(f) = c {
                        *a += weight * f;
                    }
                }
            }
            acc.map(Channel::Float)
        } else {
            let mut idx = Some([0usize; 3]);
            for d in 0..dims {
                let i = x[d].floor() as i64;
                match (
                    address(i, sizes[d], tex.address[d], tex.normalized),
                    idx.as_mut(),
                ) {
                    (Some(j), Some(ix)) => ix[d] = j,
                    _ => idx = None,
                }
            }
            texel(idx)?
        }
    };
    Ok(result.map(|c| match (c, float_out) {
        (Channel::Float(f), true) => u64::from(f.to_bits()),
        (Channel::Float(f), false) => f as i64 as u64,
        (Channel::Int(v), true) => u64::from((v as f32).to_bits()),
        (Channel::Int(v), false) => v as u64,
    }))
}

/// Where a surface access of `bytes` at `coords` (x in bytes, then rows and slices)
/// falls, after the clamp mode: `Ok(None)` for `.zero` out of range.
pub fn surface_at(
    surf: &Surface,
    dims: usize,
    coords: [u64; 3],
    bytes: usize,
    clamp: Clamp,
) -> Result<Option<u64>, String> {
    let t = &surf.texels;
    let limits = [t.width * t.texel_bytes(), t.height.max(1), t.depth.max(1)];
    let mut at = [0usize; 3];
    for d in 0..dims {
        let c = coords[d] as u32 as i32 as i64;
        let last = if d == 0 {
            limits[0] as i64 - bytes as i64
        } else {
            limits[d] as i64 - 1
        };
        if (0..=last).contains(&c) {
            at[d] = c as usize;
            continue;
        }
        match clamp {
            Clamp::Trap => {
                return Err(format!(
                    "illegal address: surface coordinate {c} out of range"
                ));
            }
            Clamp::Zero => return Ok(None),
            Clamp::Clamp => at[d] = c.clamp(0, last.max(0)) as usize,
        }
    }
    Ok(Some(
        t.base + (at[2] * t.slice + at[1] * t.pitch + at[0]) as u64,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Mem(Vec<u8>);

    impl DeviceMemory for Mem {
        fn read(&self, addr: u64, out: &mut [u8]) -> bool {
            let a = addr as usize;
            match self.0.get(a..a + out.len()) {
                Some(b) => {
                    out.copy_from_slice(b);
                    true
                }
                None => false,
            }
        }
        fn write(&mut self, _: u64, _: &[u8]) -> bool {
            false
        }
    }

    fn floats(v: &[f32]) -> Mem {
        Mem(v.iter().flat_map(|f| f.to_le_bytes()).collect())
    }

    fn tex_2x2() -> Texture {
        Texture {
            texels: Texels {
                base: 0,
                width: 2,
                height: 2,
                depth: 1,
                pitch: 8,
                slice: 16,
                format: 0x20,
                channels: 1,
            },
            linear: false,
            address: [ADDRESS_CLAMP; 3],
            filter_linear: true,
            read_as_integer: false,
            normalized: false,
            border: [0.0; 4],
        }
    }

    fn f(v: f32) -> u64 {
        u64::from(v.to_bits())
    }

    #[test]
    fn linear_filtering_weighs_the_four_texels_around_the_point() {
        let m = floats(&[0.0, 1.0, 2.0, 3.0]);
        let t = tex_2x2();
        // The centre of the four texels: their mean.
        let r = fetch(&m, &t, 2, [f(1.0), f(1.0), 0], false, true, None).unwrap();
        assert_eq!(f32::from_bits(r[0] as u32), 1.5);
        // A texel's centre: that texel.
        let r = fetch(&m, &t, 2, [f(1.5), f(0.5), 0], false, true, None).unwrap();
        assert_eq!(f32::from_bits(r[0] as u32), 1.0);
        // A quarter of the way: weights in 1/256ths.
        let r = fetch(&m, &t, 2, [f(0.75), f(0.5), 0], false, true, None).unwrap();
        assert_eq!(f32::from_bits(r[0] as u32), 0.25);
    }

    #[test]
    fn address_modes_wrap_mirror_clamp_and_border() {
        assert_eq!(address(-1, 4, ADDRESS_WRAP, true), Some(3));
        assert_eq!(address(4, 4, ADDRESS_MIRROR, true), Some(3));
        assert_eq!(address(-1, 4, ADDRESS_MIRROR, true), Some(0));
        assert_eq!(address(9, 4, ADDRESS_CLAMP, true), Some(3));
        assert_eq!(address(4, 4, ADDRESS_BORDER, true), None);
        // Without normalised coordinates wrap clamps, as the hardware does.
        assert_eq!(address(-1, 4, ADDRESS_WRAP, false), Some(0));
        let m = floats(&[0.0, 1.0, 2.0, 3.0]);
        let mut t = tex_2x2();
        t.filter_linear = false;
        t.address = [ADDRESS_BORDER; 3];
        t.border = [7.0; 4];
        let r = fetch(&m, &t, 2, [f(5.0), f(0.0), 0], false, true, None).unwrap();
        assert_eq!(f32::from_bits(r[0] as u32), 7.0);
    }

    #[test]
    fn bytes_read_as_normalised_floats_or_as_integers() {
        let m = Mem(vec![255, 51, 0, 0]);
        let mut t = tex_2x2();
        t.texels.format = 0x01;
        t.texels.pitch = 2;
        t.filter_linear = false;
        let r = fetch(&m, &t, 2, [f(1.0), f(0.0), 0], false, true, None).unwrap();
        assert_eq!(f32::from_bits(r[0] as u32), 0.2);
        t.read_as_integer = true;
        let r = fetch(&m, &t, 2, [f(0.0), f(0.0), 0], false, false, None).unwrap();
        assert_eq!(r[0], 255);
    }

    #[test]
    fn surfaces_trap_clamp_or_zero_out_of_range() {
        let s = Surface {
            texels: tex_2x2().texels,
        };
        assert_eq!(surface_at(&s, 2, [4, 1, 0], 4, Clamp::Trap), Ok(Some(12)));
        assert!(surface_at(&s, 2, [8, 1, 0], 4, Clamp::Trap).is_err());
        assert_eq!(surface_at(&s, 2, [8, 1, 0], 4, Clamp::Clamp), Ok(Some(12)));
        assert_eq!(surface_at(&s, 2, [8, 1, 0], 4, Clamp::Zero), Ok(None));
    }
}
