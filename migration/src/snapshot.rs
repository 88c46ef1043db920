//! The snapshot format: a session's log, its objects' reference counts and the
//! contents of its memory objects, in one checksummed, versioned byte string.
//!
//! ```text
//! header (28 bytes, little-endian):
//!   magic     8  "HIRASNAP"
//!   version   2  FORMAT_VERSION (a reader refuses any other)
//!   api       2  the session's API (`hira_protocol::handshake::ApiId`, from its description)
//!   reserved  4  zero
//!   body_len  8  bytes of body that follow
//!   crc32     4  CRC-32 (IEEE) of the header's version..body_len bytes and the body
//! body:
//!   entries   u32 count, each:
//!     seq u64, opcode u16, creates (u32 count, u64 each), subject u64 (0: none),
//!     key (u8 0 | 1 then u64), uses (u32 count, u64 each), request (u32 length, bytes)
//!   refs      u32 count, each: object u64, the application's references u32
//!   contents  u32 count, each: object u64, total u64, then the bytes in pieces of at
//!             most 1 GiB (u32 length, bytes) until `total` is reached
//!   stand-ins u32 count, each: object u64, kind u8, owner u64, references u32,
//!             state (u32 length, bytes: what the API's backend keeps about it)
//!   pending   u32 length, bytes: the session's input read and not yet executed
//! ```
//!
//! Everything a snapshot holds may come from elsewhere (a file, another host):
//! decoding checks every length against what is left and every count against a
//! limit before allocating, and a damaged or foreign snapshot is an error, never a
//! panic.

use hira_protocol::codec::{DecodeError, Reader, Writer};

use crate::log::{Entry, Log, ObjectId};

/// The format this build writes and reads.
pub const FORMAT_VERSION: u16 = 1;
const MAGIC: &[u8; 8] = b"HIRASNAP";
const HEADER: usize = 28;
/// Largest piece of contents.
const PIECE: usize = 1 << 30;
/// Most entries, objects, ids per entry and bytes per request a snapshot may hold.
const MAX_ITEMS: usize = 1 << 24;
pub const MAX_REQUEST: usize = 64 << 20;
/// Most bytes of pending input: a whole frame and its header.
const MAX_PENDING: usize = 257 << 20;

/// A session's state as migration moves it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The session's API (`ApiId` as a number).
    pub api: u16,
    /// The log's entries, in replay order.
    pub entries: Vec<Entry>,
    /// The application's reference count of each object it holds.
    pub refs: Vec<(ObjectId, u32)>,
    /// Contents of memory objects, read at a quiesced point.
    pub contents: Vec<(ObjectId, Vec<u8>)>,
    /// Objects no logged call made, recreated as stand-ins (an event of a finished
    /// command becomes a completed event of the same context).
    pub standins: Vec<StandIn>,
    /// The guest's input the source had read and not yet executed, to execute first.
    pub pending: Vec<u8>,
}

/// An object the log cannot recreate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StandIn {
    pub id: ObjectId,
    /// The object's kind, as the API's handle kinds number them.
    pub kind: u8,
    /// The object it belongs to (an event's context).
    pub owner: ObjectId,
    /// The application's references.
    pub refs: u32,
    /// What the API's backend keeps about it (an event's command type, queue and
    /// timestamps), in the backend's own encoding.
    pub state: Vec<u8>,
}

/// Why a snapshot cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SnapshotError {
    #[error("not a Hira snapshot")]
    BadMagic,
    #[error("snapshot format {0} is not supported (this build reads {FORMAT_VERSION})")]
    Version(u16),
    #[error("the snapshot is {have} bytes, its header says {want}")]
    Length { have: usize, want: usize },
    #[error("the snapshot is damaged (checksum mismatch)")]
    Checksum,
    #[error("the snapshot is malformed: {0}")]
    Malformed(#[from] DecodeError),
    #[error("the snapshot is malformed: {0}")]
    Invalid(&'static str),
}

impl Snapshot {
    /// The snapshot of `log` with `contents`.
    pub fn of(api: u16, log: &Log, contents: Vec<(ObjectId, Vec<u8>)>) -> Self {
        let mut refs: Vec<(ObjectId, u32)> = log.refs().collect();
        refs.sort_unstable();
        Snapshot {
            api,
            entries: log.entries().cloned().collect(),
            refs,
            contents,
            standins: Vec::new(),
            pending: Vec::new(),
        }
    }

    /// The log it holds.
    pub fn log(&self) -> Log {
        Log::from_parts(self.entries.clone(), self.refs.clone())
    }

    pub fn encode(&self) -> Vec<u8> {
        // One buffer: the header's place first, the body after it, so that large
        // contents are copied once.
        let contents: usize = self.contents.iter().map(|(_, b)| b.len() + 64).sum();
        let mut b = Writer::with_capacity(HEADER + contents + 4096);
        b.raw(&[0u8; HEADER]);
        b.u32(self.entries.len() as u32);
        for e in &self.entries {
            b.u64(e.seq).u16(e.opcode);
            ids(&mut b, &e.creates);
            b.u64(e.subject.unwrap_or(0));
            match e.key {
                Some(k) => b.u8(1).u64(k),
                None => b.u8(0),
            };
            ids(&mut b, &e.uses);
            b.bytes(&e.request);
        }
        b.u32(self.refs.len() as u32);
        for &(id, n) in &self.refs {
            b.u64(id).u32(n);
        }
        b.u32(self.contents.len() as u32);
        for (id, bytes) in &self.contents {
            b.u64(*id).u64(bytes.len() as u64);
            for piece in bytes.chunks(PIECE) {
                b.bytes(piece);
            }
        }
        b.u32(self.standins.len() as u32);
        for s in &self.standins {
            b.u64(s.id)
                .u8(s.kind)
                .u64(s.owner)
                .u32(s.refs)
                .bytes(&s.state);
        }
        b.bytes(&self.pending);
        let mut out = b.into_vec();
        let body_len = (out.len() - HEADER) as u64;
        out[..8].copy_from_slice(MAGIC);
        out[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        out[10..12].copy_from_slice(&self.api.to_le_bytes());
        out[12..16].copy_from_slice(&0u32.to_le_bytes());
        out[16..24].copy_from_slice(&body_len.to_le_bytes());
        let (head, body) = out.split_at(HEADER);
        let crc = checksum(&head[8..24], body);
        out[24..28].copy_from_slice(&crc.to_le_bytes());
        out
    }

    pub fn decode(buf: &[u8]) -> Result<Snapshot, SnapshotError> {
        if buf.len() < HEADER || &buf[..8] != MAGIC {
            return Err(SnapshotError::BadMagic);
        }
        let mut h = Reader::new(&buf[8..HEADER]);
        let version = h.u16()?;
        if version != FORMAT_VERSION {
            return Err(SnapshotError::Version(version));
        }
        let api = h.u16()?;
        if h.u32()? != 0 {
            return Err(SnapshotError::Invalid("reserved header bits set"));
        }
        let len = h.u64()?;
        let crc = h.u32()?;
        let body = &buf[HEADER..];
        if len != body.len() as u64 {
            return Err(SnapshotError::Length {
                have: buf.len(),
                want: usize::try_from(len)
                    .unwrap_or(usize::MAX)
                    .saturating_add(HEADER),
            });
        }
        if checksum(&buf[8..24], body) != crc {
            return Err(SnapshotError::Checksum);
        }
        let mut r = Reader::new(body);
        // Counts are bounded by what is left, so nothing allocates beyond the input.
        let count = |r: &mut Reader<'_>, each: usize| -> Result<usize, SnapshotError> {
            let n = r.count(MAX_ITEMS)?;
            if n.saturating_mul(each) > r.remaining() {
                return Err(SnapshotError::Invalid("a count exceeds the data"));
            }
            Ok(n)
        };
        let mut entries = Vec::with_capacity(count(&mut r, 23)?);
        let mut last_seq = None;
        for _ in 0..entries.capacity() {
            let seq = r.u64()?;
            if last_seq.is_some_and(|l| seq <= l) {
                return Err(SnapshotError::Invalid("entries out of order"));
            }
            last_seq = Some(seq);
            let opcode = r.u16()?;
            let creates = read_ids(&mut r)?;
            let subject = Some(r.u64()?).filter(|&s| s != 0);
            let key = match r.u8()? {
                0 => None,
                1 => Some(r.u64()?),
                _ => return Err(SnapshotError::Invalid("bad key tag")),
            };
            let uses = read_ids(&mut r)?;
            let request = r.bytes(MAX_REQUEST)?.to_vec();
            entries.push(Entry {
                seq,
                opcode,
                request,
                creates,
                subject,
                key,
                uses,
            });
        }
        let n = count(&mut r, 12)?;
        let mut refs = Vec::with_capacity(n);
        for _ in 0..n {
            refs.push((r.u64()?, r.u32()?));
        }
        let n = count(&mut r, 16)?;
        let mut contents = Vec::with_capacity(n);
        for _ in 0..n {
            let id = r.u64()?;
            let total = r.u64()?;
            if total > r.remaining() as u64 {
                return Err(SnapshotError::Invalid("contents longer than the data"));
            }
            let mut bytes = Vec::with_capacity(total as usize);
            while (bytes.len() as u64) < total {
                let piece = r.bytes(PIECE)?;
                if piece.is_empty() || bytes.len() as u64 + piece.len() as u64 > total {
                    return Err(SnapshotError::Invalid("contents pieces do not add up"));
                }
                bytes.extend_from_slice(piece);
            }
            contents.push((id, bytes));
        }
        let n = count(&mut r, 29)?;
        let mut standins = Vec::with_capacity(n);
        for _ in 0..n {
            standins.push(StandIn {
                id: r.u64()?,
                kind: r.u8()?,
                owner: r.u64()?,
                refs: r.u32()?,
                state: r.bytes(MAX_REQUEST)?.to_vec(),
            });
        }
        let pending = r.bytes(MAX_PENDING)?.to_vec();
        r.finish()?;
        Ok(Snapshot {
            api,
            entries,
            refs,
            contents,
            standins,
            pending,
        })
    }
}

/// The checksum covers the header's fields after the magic as well as the body.
fn checksum(header: &[u8], body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(header);
    h.update(body);
    h.finalize()
}

fn ids(b: &mut Writer, ids: &[ObjectId]) {
    b.u32(ids.len() as u32);
    for &id in ids {
        b.u64(id);
    }
}

fn read_ids(r: &mut Reader<'_>) -> Result<Vec<ObjectId>, SnapshotError> {
    let n = r.count(MAX_ITEMS)?;
    if n.saturating_mul(8) > r.remaining() {
        return Err(SnapshotError::Invalid("an id count exceeds the data"));
    }
    (0..n).map(|_| Ok(r.u64()?)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Snapshot {
        let mut log = Log::new();
        log.created(30, vec![1, 2, 3], vec![7], vec![]);
        log.created(55, b"kernel source".to_vec(), vec![8], vec![]);
        log.configured(60, vec![9; 40], 8, Some(0), vec![7]);
        log.configured(86, vec![], 8, None, vec![]);
        log.retained(7);
        let mut s = Snapshot::of(1, &log, vec![(7, (0..=255).collect()), (9, vec![])]);
        s.standins.push(StandIn {
            id: 11,
            kind: 7,
            owner: 1,
            refs: 2,
            state: vec![1, 2, 3],
        });
        s.pending = b"half a frame".to_vec();
        s
    }

    #[test]
    fn a_snapshot_reads_back_as_written_and_holds_the_log() {
        let s = sample();
        let bytes = s.encode();
        assert_eq!(&bytes[..8], b"HIRASNAP");
        let back = Snapshot::decode(&bytes).unwrap();
        assert_eq!(back, s);
        let log = back.log();
        assert_eq!(log.len(), 4);
        let mut refs: Vec<_> = log.refs().collect();
        refs.sort_unstable();
        assert_eq!(refs, [(7, 2), (8, 1)]);
    }

    #[test]
    fn foreign_old_and_truncated_snapshots_are_refused() {
        let bytes = sample().encode();
        assert_eq!(Snapshot::decode(b"nonsense"), Err(SnapshotError::BadMagic));
        let mut other = bytes.clone();
        other[8..10].copy_from_slice(&2u16.to_le_bytes());
        assert_eq!(Snapshot::decode(&other), Err(SnapshotError::Version(2)));
        assert!(matches!(
            Snapshot::decode(&bytes[..bytes.len() - 1]),
            Err(SnapshotError::Length { .. })
        ));
        assert_eq!(
            Snapshot::decode(&bytes[..HEADER - 1]),
            Err(SnapshotError::BadMagic)
        );
    }

    proptest! {
        // Any single damaged byte is caught, never read as a different state.
        #[test]
        fn any_damaged_byte_is_refused(pos in 0usize..10_000, flip in 1u8..=255) {
            let mut bytes = sample().encode();
            let pos = pos % bytes.len();
            bytes[pos] ^= flip;
            prop_assert!(Snapshot::decode(&bytes).is_err());
        }

        // Hostile input: arbitrary bytes after a valid header (with a matching
        // checksum) fail cleanly or decode; they never panic or over-allocate.
        #[test]
        fn arbitrary_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut bytes = Vec::new();
            bytes.extend_from_slice(MAGIC);
            bytes.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
            bytes.extend_from_slice(&1u16.to_le_bytes());
            bytes.extend_from_slice(&0u32.to_le_bytes());
            bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
            let crc = checksum(&bytes[8..24], &body);
            bytes.extend_from_slice(&crc.to_le_bytes());
            bytes.extend_from_slice(&body);
            let _ = Snapshot::decode(&bytes);
        }
    }
}
