//! Reading a reply's payload in a guest library: every value through the protocol's
//! bounds-checked reader, and a reply that does not hold what the call returns is the
//! API's own error code, named by the library.

use hira_protocol::frame::MAX_FRAME_BODY;
use hira_protocol::{DecodeError, Reader};
use log::warn;

/// A reply's payload being read. A reply that ends early is the host's fault: the
/// read fails with `malformed` (the API's code for it) and a warning, and reads on.
#[derive(Debug)]
pub struct ReplyReader {
    buf: Vec<u8>,
    pos: usize,
    malformed: i32,
}

impl ReplyReader {
    /// A reader of `buf`; `malformed` is what a read past its end fails with.
    pub fn new(buf: Vec<u8>, malformed: i32) -> ReplyReader {
        ReplyReader {
            buf,
            pos: 0,
            malformed,
        }
    }

    fn with<T>(
        &mut self,
        f: impl FnOnce(&mut Reader<'_>) -> Result<T, DecodeError>,
    ) -> Result<T, i32> {
        let mut r = Reader::new(&self.buf[self.pos..]);
        let v = f(&mut r).map_err(|e| {
            warn!("malformed reply: {e}");
            self.malformed
        })?;
        self.pos = self.buf.len() - r.remaining();
        Ok(v)
    }

    pub fn u8(&mut self) -> Result<u8, i32> {
        self.with(|r| r.u8())
    }

    pub fn u16(&mut self) -> Result<u16, i32> {
        self.with(|r| r.u16())
    }

    pub fn u32(&mut self) -> Result<u32, i32> {
        self.with(|r| r.u32())
    }

    pub fn i32(&mut self) -> Result<i32, i32> {
        self.with(|r| r.i32())
    }

    pub fn u64(&mut self) -> Result<u64, i32> {
        self.with(|r| r.u64())
    }

    /// Bytes with their `u32` length before them (at most a frame's body).
    pub fn bytes(&mut self) -> Result<&[u8], i32> {
        let mut r = Reader::new(&self.buf[self.pos..]);
        match r.bytes(MAX_FRAME_BODY) {
            Ok(b) => {
                let (start, len) = (self.buf.len() - r.remaining() - b.len(), b.len());
                self.pos = start + len;
                Ok(&self.buf[start..start + len])
            }
            Err(e) => {
                warn!("malformed reply: {e}");
                Err(self.malformed)
            }
        }
    }

    /// Whether the whole reply was read.
    pub fn at_end(&self) -> bool {
        self.pos == self.buf.len()
    }

    /// The whole reply was read, or it held more than the call returns.
    pub fn finish(&self) -> Result<(), i32> {
        if self.at_end() {
            Ok(())
        } else {
            warn!(
                "malformed reply: {} bytes more than the call returns",
                self.buf.len() - self.pos
            );
            Err(self.malformed)
        }
    }
}

#[cfg(test)]
mod tests {
    use hira_protocol::Writer;

    use super::*;

    #[test]
    fn values_read_in_order_and_a_short_reply_is_the_apis_error() {
        let mut w = Writer::new();
        w.u8(1).u16(2).u32(3).i32(-4).u64(5).bytes(b"six");
        let mut r = ReplyReader::new(w.into_vec(), -30);
        assert_eq!(r.u8(), Ok(1));
        assert_eq!(r.u16(), Ok(2));
        assert_eq!(r.u32(), Ok(3));
        assert_eq!(r.i32(), Ok(-4));
        assert!(!r.at_end());
        assert_eq!(r.finish(), Err(-30));
        assert_eq!(r.u64(), Ok(5));
        assert_eq!(r.bytes(), Ok(&b"six"[..]));
        assert!(r.at_end());
        assert_eq!(r.finish(), Ok(()));
        assert_eq!(r.u8(), Err(-30));
        // A length that claims more than the reply holds, and a read that fails,
        // move nothing.
        let mut w = Writer::new();
        w.u32(100).u8(7);
        let mut r = ReplyReader::new(w.into_vec(), 999);
        assert_eq!(r.bytes(), Err(999));
        assert_eq!(r.u64(), Err(999));
        assert_eq!(r.u32(), Ok(100));
        assert_eq!(r.u8(), Ok(7));
    }
}
