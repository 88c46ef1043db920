//! The virtio-vsock packet header (`struct virtio_vsock_hdr`, 44 bytes, little-endian).

use thiserror::Error;

/// Size of an encoded header.
pub const HDR_LEN: usize = 44;
/// Largest payload one packet may carry (the Linux driver's receive buffers).
pub const MAX_PAYLOAD: u32 = 64 * 1024;
/// `VIRTIO_VSOCK_TYPE_STREAM`, the only socket type Hira serves.
pub const TYPE_STREAM: u16 = 1;
/// Shutdown flags.
pub const SHUTDOWN_RCV: u32 = 1;
pub const SHUTDOWN_SEND: u32 = 2;

/// Packet operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum Op {
    Request = 1,
    Response = 2,
    Rst = 3,
    Shutdown = 4,
    Rw = 5,
    CreditUpdate = 6,
    CreditRequest = 7,
}

/// A header that may not be acted on.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum HeaderError {
    #[error("packet of {0} bytes is shorter than a header")]
    Short(usize),
    #[error("operation {0} is not defined")]
    UnknownOp(u16),
    #[error("socket type {0} is not supported")]
    UnsupportedType(u16),
    #[error("payload length {0} exceeds {MAX_PAYLOAD}")]
    PayloadTooLong(u32),
    #[error("{0:?} packets carry no payload, this one claims {1} bytes")]
    UnexpectedPayload(Op, u32),
    #[error("flags {1:#x} are not valid for {0:?}")]
    BadFlags(Op, u32),
}

/// A decoded header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub src_cid: u64,
    pub dst_cid: u64,
    pub src_port: u32,
    pub dst_port: u32,
    pub len: u32,
    pub op: Op,
    pub flags: u32,
    pub buf_alloc: u32,
    pub fwd_cnt: u32,
}

impl Header {
    /// Decodes and checks a header: known operation, stream type, payload only on
    /// `Rw` and within [`MAX_PAYLOAD`], flags only on `Shutdown` and only defined bits.
    pub fn decode(b: &[u8]) -> Result<Header, HeaderError> {
        if b.len() < HDR_LEN {
            return Err(HeaderError::Short(b.len()));
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u16_at = |i: usize| u16::from_le_bytes(b[i..i + 2].try_into().expect("2 bytes"));
        let ty = u16_at(28);
        let op = match u16_at(30) {
            1 => Op::Request,
            2 => Op::Response,
            3 => Op::Rst,
            4 => Op::Shutdown,
            5 => Op::Rw,
            6 => Op::CreditUpdate,
            7 => Op::CreditRequest,
            other => return Err(HeaderError::UnknownOp(other)),
        };
        if ty != TYPE_STREAM {
            return Err(HeaderError::UnsupportedType(ty));
        }
        let h = Header {
            src_cid: u64_at(0),
            dst_cid: u64_at(8),
            src_port: u32_at(16),
            dst_port: u32_at(20),
            len: u32_at(24),
            op,
            flags: u32_at(32),
            buf_alloc: u32_at(36),
            fwd_cnt: u32_at(40),
        };
        if h.len > MAX_PAYLOAD {
            return Err(HeaderError::PayloadTooLong(h.len));
        }
        if op != Op::Rw && h.len != 0 {
            return Err(HeaderError::UnexpectedPayload(op, h.len));
        }
        let allowed = if op == Op::Shutdown {
            SHUTDOWN_RCV | SHUTDOWN_SEND
        } else {
            0
        };
        if h.flags & !allowed != 0 {
            return Err(HeaderError::BadFlags(op, h.flags));
        }
        Ok(h)
    }

    pub fn encode(&self) -> [u8; HDR_LEN] {
        let mut b = [0u8; HDR_LEN];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&TYPE_STREAM.to_le_bytes());
        b[30..32].copy_from_slice(&(self.op as u16).to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rw(len: u32) -> Header {
        Header {
            src_cid: 3,
            dst_cid: 2,
            src_port: 1024,
            dst_port: 5571,
            len,
            op: Op::Rw,
            flags: 0,
            buf_alloc: 65536,
            fwd_cnt: 7,
        }
    }

    #[test]
    fn header_round_trips() {
        let h = rw(100);
        assert_eq!(Header::decode(&h.encode()), Ok(h));
    }

    #[test]
    fn short_packet_is_rejected() {
        assert_eq!(Header::decode(&[0; 43]), Err(HeaderError::Short(43)));
    }

    #[test]
    fn unknown_operation_is_rejected() {
        let mut b = rw(0).encode();
        b[30] = 9;
        assert_eq!(Header::decode(&b), Err(HeaderError::UnknownOp(9)));
    }

    #[test]
    fn seqpacket_is_not_served() {
        let mut b = rw(0).encode();
        b[28] = 2;
        assert_eq!(Header::decode(&b), Err(HeaderError::UnsupportedType(2)));
    }

    #[test]
    fn oversized_payload_is_rejected() {
        assert_eq!(
            Header::decode(&rw(MAX_PAYLOAD + 1).encode()),
            Err(HeaderError::PayloadTooLong(MAX_PAYLOAD + 1))
        );
    }

    #[test]
    fn payload_on_a_request_is_rejected() {
        let mut h = rw(4);
        h.op = Op::Request;
        assert_eq!(
            Header::decode(&h.encode()),
            Err(HeaderError::UnexpectedPayload(Op::Request, 4))
        );
    }

    #[test]
    fn undefined_shutdown_flag_is_rejected() {
        let mut h = rw(0);
        h.op = Op::Shutdown;
        h.flags = 4;
        assert_eq!(
            Header::decode(&h.encode()),
            Err(HeaderError::BadFlags(Op::Shutdown, 4))
        );
    }
}
