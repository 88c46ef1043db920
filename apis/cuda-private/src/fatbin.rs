//! Fatbins: the containers nvcc puts a program's device code in, and the wrapper
//! through which NVIDIA's runtime hands one to the driver (`cuLibraryLoadData`,
//! `cuModuleLoadFatBinary`, the export tables).
//!
//! Layouts as nvcc 12 and 13 write them (read off `.nv_fatbin` sections and
//! documented by reverse-engineering projects such as ZLUDA):
//!
//! - wrapper, 24 bytes: `u32 magic` (0x466243b1), `u32 version`, `*const fatbin`,
//!   `*const` file name or prelinked fatbins (unused here);
//! - fatbin header, 16 bytes: `u32 magic` (0xBA55ED50), `u16 version`,
//!   `u16 header_size`, `u64 entries_size`: the entries follow the header;
//! - entry header (`header_size` bytes, 64 or more): `u16 kind` (1 PTX, 2 ELF),
//!   `u16 version`, `u32 header_size`, `u32 padded_size` (what follows the header),
//!   `u32` -, `u32 payload_size` (0: the padded size), `u32` -, `u32` -, `u32 sm`
//!   (e.g. 75), `u32` -, `u32` -, `u64 flags` (0x2000: LZ4, 0x8000: Zstandard),
//!   `u64` -, `u64 uncompressed_size`.

use std::fmt;

/// Magic of the wrapper the runtime registers (`__fatBinC_Wrapper_t`).
pub const WRAPPER_MAGIC: u32 = 0x4662_43b1;
/// Magic of a fatbin's header.
pub const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// Magic of an ELF (cubin) image.
pub const ELF_MAGIC: [u8; 4] = *b"\x7fELF";
/// The largest fatbin accepted (the libraries' fatbins stay far below).
pub const MAX_FATBIN: usize = 1 << 30;
/// The largest payload decompressed.
pub const MAX_PAYLOAD: usize = 256 << 20;

const FLAG_LZ4: u64 = 0x2000;
const FLAG_ZSTD: u64 = 0x8000;
const HEADER: usize = 16;
const ENTRY_HEADER: usize = 64;

/// What is wrong with an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// Not a fatbin (the magic differs) or a header that does not fit.
    NotFatbin,
    /// An entry that runs past the fatbin's end or is otherwise malformed.
    BadEntry(usize),
    /// A compressed payload that does not decompress to its stated size.
    BadPayload(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotFatbin => write!(f, "not a fatbin"),
            Error::BadEntry(at) => write!(f, "malformed fatbin entry at byte {at}"),
            Error::BadPayload(e) => write!(f, "a fatbin entry does not decompress: {e}"),
        }
    }
}

impl std::error::Error for Error {}

/// What an entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Ptx,
    Elf,
    Other(u16),
}

/// One image of a fatbin.
#[derive(Debug, Clone)]
pub struct Entry<'a> {
    pub kind: Kind,
    /// The architecture it is for: 75 for `sm_75`/`compute_75`.
    pub sm: u32,
    pub flags: u64,
    /// The bytes as stored (compressed if `flags` says so).
    pub stored: &'a [u8],
    pub uncompressed_size: u64,
}

impl Entry<'_> {
    /// The image, decompressed where it was compressed; PTX without its trailing NULs.
    pub fn contents(&self) -> Result<Vec<u8>, Error> {
        let want = usize::try_from(self.uncompressed_size).unwrap_or(usize::MAX);
        let mut out = if self.flags & FLAG_ZSTD != 0 {
            if want > MAX_PAYLOAD {
                return Err(Error::BadPayload(format!("{want} bytes is too large")));
            }
            let mut out = Vec::with_capacity(want);
            let mut d = ruzstd::decoding::StreamingDecoder::new(self.stored)
                .map_err(|e| Error::BadPayload(e.to_string()))?;
            std::io::Read::read_to_end(
                &mut std::io::Read::take(&mut d, MAX_PAYLOAD as u64 + 1),
                &mut out,
            )
            .map_err(|e| Error::BadPayload(e.to_string()))?;
            out
        } else if self.flags & FLAG_LZ4 != 0 {
            if want > MAX_PAYLOAD {
                return Err(Error::BadPayload(format!("{want} bytes is too large")));
            }
            lz4_flex::block::decompress(self.stored, want)
                .map_err(|e| Error::BadPayload(e.to_string()))?
        } else {
            self.stored.to_vec()
        };
        if self.flags & (FLAG_ZSTD | FLAG_LZ4) != 0 && out.len() < want.min(MAX_PAYLOAD) {
            return Err(Error::BadPayload(format!(
                "{} bytes where the entry says {want}",
                out.len()
            )));
        }
        if self.kind == Kind::Ptx {
            while out.last() == Some(&0) {
                out.pop();
            }
        }
        Ok(out)
    }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The length of the fatbin whose first 16 bytes are `header`: its header and
/// entries.
pub fn len(header: &[u8; HEADER]) -> Result<usize, Error> {
    if u32_at(header, 0) != Some(FATBIN_MAGIC) {
        return Err(Error::NotFatbin);
    }
    let hs = u64::from(u16_at(header, 6).ok_or(Error::NotFatbin)?);
    let n = u64_at(header, 8).ok_or(Error::NotFatbin)?;
    let total = hs.checked_add(n).ok_or(Error::NotFatbin)?;
    if (hs as usize) < HEADER || total > MAX_FATBIN as u64 {
        return Err(Error::NotFatbin);
    }
    Ok(total as usize)
}

/// The entries of the fatbin `data` (its header first), in their order.
pub fn entries(data: &[u8]) -> Result<Vec<Entry<'_>>, Error> {
    let head: &[u8; HEADER] = data
        .get(..HEADER)
        .and_then(|h| h.try_into().ok())
        .ok_or(Error::NotFatbin)?;
    let total = len(head)?;
    let data = data.get(..total).ok_or(Error::NotFatbin)?;
    let mut at = usize::from(u16_at(data, 6).ok_or(Error::NotFatbin)?);
    let mut out = Vec::new();
    while at < total {
        let bad = Error::BadEntry(at);
        let hs = u32_at(data, at + 4).ok_or(bad.clone())? as usize;
        let padded = u32_at(data, at + 8).ok_or(bad.clone())? as usize;
        if hs < ENTRY_HEADER || at.checked_add(hs).is_none_or(|e| e > total) {
            return Err(bad);
        }
        let stored_len = match u32_at(data, at + 16).ok_or(bad.clone())? as usize {
            0 => padded,
            n => n.min(padded),
        };
        let start = at + hs;
        let end = start
            .checked_add(padded)
            .filter(|&e| e <= total)
            .ok_or(bad.clone())?;
        let stored = data.get(start..start + stored_len).ok_or(bad.clone())?;
        let kind = match u16_at(data, at).ok_or(bad.clone())? {
            1 => Kind::Ptx,
            2 => Kind::Elf,
            k => Kind::Other(k),
        };
        out.push(Entry {
            kind,
            sm: u32_at(data, at + 28).ok_or(bad.clone())?,
            flags: u64_at(data, at + 40).ok_or(bad.clone())?,
            stored,
            uncompressed_size: u64_at(data, at + 56).ok_or(bad.clone())?,
        });
        at = end;
    }
    Ok(out)
}

/// The PTX for the newest architecture not above `sm` (a device of compute
/// capability 7.5 is 75), as the driver picks what to compile when no cubin fits.
pub fn best_ptx<'a>(entries: &[Entry<'a>], sm: u32) -> Option<Entry<'a>> {
    entries
        .iter()
        .filter(|e| e.kind == Kind::Ptx && e.sm <= sm)
        .max_by_key(|e| e.sm)
        .cloned()
}

/// What a code pointer handed to the driver points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Image {
    /// A wrapper: the fatbin is at the address it holds.
    Wrapper,
    Fatbin,
    Elf,
    /// Anything else is taken for PTX text.
    Ptx,
}

/// Tells an image by its first 4 bytes.
pub fn classify(head: [u8; 4]) -> Image {
    match u32::from_le_bytes(head) {
        WRAPPER_MAGIC => Image::Wrapper,
        FATBIN_MAGIC => Image::Fatbin,
        _ if head == ELF_MAGIC => Image::Elf,
        _ => Image::Ptx,
    }
}

/// Where a wrapper's fatbin is, from the wrapper's 24 bytes.
pub fn wrapped(wrapper: &[u8; 24]) -> Option<usize> {
    if u32_at(wrapper, 0) != Some(WRAPPER_MAGIC) {
        return None;
    }
    u64_at(wrapper, 8).map(|p| p as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(kind: u16, sm: u32, flags: u64, payload: &[u8], unc: u64) -> Vec<u8> {
        let padded = payload.len().div_ceil(8) * 8;
        let mut e = vec![0u8; ENTRY_HEADER];
        e[0..2].copy_from_slice(&kind.to_le_bytes());
        e[4..8].copy_from_slice(&(ENTRY_HEADER as u32).to_le_bytes());
        e[8..12].copy_from_slice(&(padded as u32).to_le_bytes());
        e[16..20].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        e[28..32].copy_from_slice(&sm.to_le_bytes());
        e[40..48].copy_from_slice(&flags.to_le_bytes());
        e[56..64].copy_from_slice(&unc.to_le_bytes());
        e.extend_from_slice(payload);
        e.resize(ENTRY_HEADER + padded, 0);
        e
    }

    fn fatbin(entries: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = entries.concat();
        let mut f = FATBIN_MAGIC.to_le_bytes().to_vec();
        f.extend_from_slice(&1u16.to_le_bytes());
        f.extend_from_slice(&(HEADER as u16).to_le_bytes());
        f.extend_from_slice(&(body.len() as u64).to_le_bytes());
        f.extend_from_slice(&body);
        f
    }

    #[test]
    fn the_newest_ptx_the_device_can_compile_is_picked_and_decompressed() {
        let ptx52 = b".version 8.0\n.target sm_52\n\0\0";
        let ptx75 = b".version 9.0\n.target sm_75\n";
        let lz = lz4_flex::block::compress(ptx75);
        let f = fatbin(&[
            entry(2, 75, 0x11, b"\x7fELFcubin", 0),
            entry(1, 52, 0x11, ptx52, 0),
            entry(1, 75, 0x11 | FLAG_LZ4, &lz, ptx75.len() as u64),
            entry(1, 90, 0x11, b".target sm_90\n", 0),
        ]);
        let head: [u8; 16] = f[..16].try_into().unwrap();
        assert_eq!(len(&head).unwrap(), f.len());
        let es = entries(&f).unwrap();
        assert_eq!(es.len(), 4);
        assert_eq!(es[0].kind, Kind::Elf);
        let best = best_ptx(&es, 75).unwrap();
        assert_eq!(best.sm, 75);
        assert_eq!(best.contents().unwrap(), ptx75);
        assert_eq!(best_ptx(&es, 60).unwrap().contents().unwrap(), &ptx52[..27]);
        assert!(best_ptx(&es, 50).is_none());
    }

    #[test]
    fn truncated_or_forged_fatbins_are_refused() {
        let f = fatbin(&[entry(1, 75, 0x11, b".target sm_75\n", 0)]);
        assert!(entries(&f[..f.len() - 1]).is_err());
        let mut forged = f.clone();
        forged[16 + 8..16 + 12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(entries(&forged), Err(Error::BadEntry(_))));
        let mut huge = f.clone();
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(entries(&huge).unwrap_err(), Error::NotFatbin);
        let mut lz = fatbin(&[entry(1, 75, FLAG_LZ4, b"\xff\xff\xff", 100)]);
        assert!(matches!(
            entries(&lz).unwrap()[0].contents(),
            Err(Error::BadPayload(_))
        ));
        lz[0] = 0;
        assert_eq!(entries(&lz).unwrap_err(), Error::NotFatbin);
    }

    #[test]
    fn images_are_told_by_their_magic() {
        assert_eq!(classify(WRAPPER_MAGIC.to_le_bytes()), Image::Wrapper);
        assert_eq!(classify(FATBIN_MAGIC.to_le_bytes()), Image::Fatbin);
        assert_eq!(classify(ELF_MAGIC), Image::Elf);
        assert_eq!(classify(*b".ver"), Image::Ptx);
        let mut w = [0u8; 24];
        w[..4].copy_from_slice(&WRAPPER_MAGIC.to_le_bytes());
        w[8..16].copy_from_slice(&0x1234u64.to_le_bytes());
        assert_eq!(wrapped(&w), Some(0x1234));
    }
}
