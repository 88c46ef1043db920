//! A file of a suspended session, as `hira-ctl checkpoint` writes it and `hira-ctl
//! restore` reads it:
//!
//! ```text
//! magic "HIRASESS" (8), version u16 (1), token (16), VM name (u16 length, bytes),
//! VM slot (u8 0, or 1 and four u64: offset, length, window length, ring offset),
//! then the snapshot (the API server's format; see the migration crate)
//! ```

use std::io::{Read, Write};

use hira_protocol::handshake::Token;

use crate::VmSlot;

const MAGIC: &[u8; 8] = b"HIRASESS";
const VERSION: u16 = 1;

/// Writes the header; the snapshot follows.
pub fn write_header(
    w: &mut impl Write,
    token: &Token,
    vm: &str,
    slot: Option<VmSlot>,
) -> std::io::Result<()> {
    w.write_all(MAGIC)?;
    w.write_all(&VERSION.to_le_bytes())?;
    w.write_all(token)?;
    let name = vm.as_bytes();
    let len = u16::try_from(name.len()).map_err(|_| std::io::Error::other("VM name too long"))?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(name)?;
    match slot {
        None => w.write_all(&[0]),
        Some(s) => {
            w.write_all(&[1])?;
            for v in [s.offset, s.len, s.window_len, s.ring_offset] {
                w.write_all(&v.to_le_bytes())?;
            }
            Ok(())
        }
    }
}

/// Reads the header; the reader is left at the snapshot.
pub fn read_header(r: &mut impl Read) -> std::io::Result<(Token, String, Option<VmSlot>)> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Err(bad("not a Hira session file"));
    }
    let mut v = [0u8; 2];
    r.read_exact(&mut v)?;
    if u16::from_le_bytes(v) != VERSION {
        return Err(bad("a session file of another version"));
    }
    let mut token = [0u8; 16];
    r.read_exact(&mut token)?;
    let mut len = [0u8; 2];
    r.read_exact(&mut len)?;
    let mut name = vec![0u8; u16::from_le_bytes(len) as usize];
    r.read_exact(&mut name)?;
    let vm = String::from_utf8(name).map_err(|_| bad("the VM name is not UTF-8"))?;
    let mut flag = [0u8; 1];
    r.read_exact(&mut flag)?;
    let slot = match flag[0] {
        0 => None,
        1 => {
            let mut v = [0u64; 4];
            for x in &mut v {
                let mut b = [0u8; 8];
                r.read_exact(&mut b)?;
                *x = u64::from_le_bytes(b);
            }
            Some(VmSlot {
                offset: v[0],
                len: v[1],
                window_len: v[2],
                ring_offset: v[3],
            })
        }
        _ => return Err(bad("a malformed VM slot")),
    };
    Ok((token, vm, slot))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_reads_back_and_others_are_refused() {
        let slot = super::VmSlot {
            offset: 4096,
            len: 8192,
            window_len: 4096,
            ring_offset: 8192,
        };
        for slot in [None, Some(slot)] {
            let mut b = Vec::new();
            write_header(&mut b, &[3; 16], "vm-a", slot).unwrap();
            b.extend_from_slice(b"snapshot");
            let mut r = &b[..];
            assert_eq!(
                read_header(&mut r).unwrap(),
                ([3; 16], "vm-a".to_string(), slot)
            );
            assert_eq!(r, b"snapshot");
        }
        assert!(read_header(&mut &b"HIRASNAP........"[..]).is_err());
    }
}
