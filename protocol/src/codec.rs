//! Little-endian payload encoding with a bounds-checked reader.
//!
//! Every variable-length item carries a `u32` length that the reader caps before it
//! allocates or slices anything; a payload with bytes left over after the last field is
//! rejected by [`Reader::finish`].

use thiserror::Error;

/// Largest string (source text, build options, kernel names) a payload may carry.
pub const MAX_STRING: usize = 64 * 1024 * 1024;
/// Largest element count of an array argument (handles, strings, properties).
pub const MAX_ARRAY: usize = 65536;

/// Errors found while decoding a payload.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("payload ends {needed} bytes early while reading {what}")]
    Truncated { what: &'static str, needed: usize },
    #[error("{what} of {len} exceeds the limit of {max}")]
    TooLong {
        what: &'static str,
        len: usize,
        max: usize,
    },
    #[error("{0} bytes left over after the last field")]
    TrailingBytes(usize),
    #[error("invalid value {value} for {what}")]
    BadValue { what: &'static str, value: u64 },
    #[error("string contains an interior NUL byte")]
    InteriorNul,
}

/// Builds a payload.
#[derive(Debug, Default, Clone)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    pub fn new() -> Self {
        Writer { buf: Vec::new() }
    }

    pub fn with_capacity(n: usize) -> Self {
        Writer {
            buf: Vec::with_capacity(n),
        }
    }

    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }

    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Overwrites the `u32` written at byte `at` (a field decided after later ones).
    pub fn patch_u32(&mut self, at: usize, v: u32) {
        self.buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }

    /// Overwrites the `u64` written at byte `at`.
    pub fn patch_u64(&mut self, at: usize, v: u64) {
        self.buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }

    /// A length-prefixed byte string.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u32(u32::try_from(v.len()).expect("payload items are capped below 4 GiB"));
        self.buf.extend_from_slice(v);
        self
    }

    /// Raw bytes with no length prefix.
    pub fn raw(&mut self, v: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(v);
        self
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.buf
    }

    pub fn into_vec(self) -> Vec<u8> {
        self.buf
    }

    /// Reserves `n` zeroed bytes at the end and returns them for filling in place.
    pub fn reserve_tail(&mut self, n: usize) -> &mut [u8] {
        let start = self.buf.len();
        self.buf.resize(start + n, 0);
        &mut self.buf[start..]
    }

    pub fn clear(&mut self) {
        self.buf.clear();
    }
}

/// Reads a payload; every read is bounds-checked.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let left = self.buf.len() - self.pos;
        if n > left {
            return Err(DecodeError::Truncated {
                what,
                needed: n - left,
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }

    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1, "u8")?[0])
    }

    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array("u16")?))
    }

    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array("u32")?))
    }

    pub fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(i32::from_le_bytes(self.array("i32")?))
    }

    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array("u64")?))
    }

    pub fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_le_bytes(self.array("i64")?))
    }

    /// A `u64` that must fit the host's `usize`.
    pub fn usize(&mut self) -> Result<usize, DecodeError> {
        let v = self.u64()?;
        usize::try_from(v).map_err(|_| DecodeError::BadValue {
            what: "size",
            value: v,
        })
    }

    /// A boolean encoded as one byte, 0 or 1.
    pub fn flag(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(DecodeError::BadValue {
                what: "flag",
                value: v.into(),
            }),
        }
    }

    /// A length-prefixed byte string of at most `max` bytes.
    pub fn bytes(&mut self, max: usize) -> Result<&'a [u8], DecodeError> {
        let len = self.u32()? as usize;
        if len > max {
            return Err(DecodeError::TooLong {
                what: "byte string",
                len,
                max,
            });
        }
        self.take(len, "byte string")
    }

    /// A count prefix for an array, capped at `max`.
    pub fn count(&mut self, max: usize) -> Result<usize, DecodeError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(DecodeError::TooLong {
                what: "array",
                len: n,
                max,
            });
        }
        Ok(n)
    }

    /// A length-prefixed string with no interior NUL.
    pub fn string(&mut self) -> Result<&'a [u8], DecodeError> {
        let s = self.bytes(MAX_STRING)?;
        if s.contains(&0) {
            return Err(DecodeError::InteriorNul);
        }
        Ok(s)
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Bytes consumed so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// The next byte, without consuming it.
    pub fn peek(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }

    /// Succeeds only if every byte was consumed.
    pub fn finish(&self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(DecodeError::TrailingBytes(n)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_round_trip() {
        let mut w = Writer::new();
        w.u8(1).u16(2).u32(3).i32(-4).u64(5).i64(-6);
        let mut r = Reader::new(w.as_slice());
        assert_eq!(r.u8().unwrap(), 1);
        assert_eq!(r.u16().unwrap(), 2);
        assert_eq!(r.u32().unwrap(), 3);
        assert_eq!(r.i32().unwrap(), -4);
        assert_eq!(r.u64().unwrap(), 5);
        assert_eq!(r.i64().unwrap(), -6);
        assert!(r.finish().is_ok());
    }

    #[test]
    fn truncated_scalar_is_an_error() {
        let mut r = Reader::new(&[1, 2, 3]);
        assert_eq!(
            r.u32(),
            Err(DecodeError::Truncated {
                what: "u32",
                needed: 1
            })
        );
    }

    #[test]
    fn byte_string_over_cap_is_rejected_before_reading() {
        let mut w = Writer::new();
        w.u32(1000);
        let mut r = Reader::new(w.as_slice());
        assert!(matches!(r.bytes(10), Err(DecodeError::TooLong { .. })));
    }

    #[test]
    fn byte_string_longer_than_payload_is_truncated() {
        let mut w = Writer::new();
        w.u32(10).raw(&[1, 2]);
        let mut r = Reader::new(w.as_slice());
        assert!(matches!(r.bytes(100), Err(DecodeError::Truncated { .. })));
    }

    #[test]
    fn trailing_bytes_are_rejected() {
        let r = Reader::new(&[0]);
        assert_eq!(r.finish(), Err(DecodeError::TrailingBytes(1)));
    }

    #[test]
    fn flag_other_than_zero_or_one_is_rejected() {
        let mut r = Reader::new(&[2]);
        assert!(matches!(r.flag(), Err(DecodeError::BadValue { .. })));
    }

    #[test]
    fn string_with_interior_nul_is_rejected() {
        let mut w = Writer::new();
        w.bytes(b"ab\0c");
        assert_eq!(
            Reader::new(w.as_slice()).string(),
            Err(DecodeError::InteriorNul)
        );
    }
}
