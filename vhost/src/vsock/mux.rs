//! All vsock connections of one VM.

use std::collections::HashMap;

use log::warn;

use super::conn::{Conn, Event};
use super::header::{Header, Op};
use super::{HIRA_PORT, HOST_CID};

/// What the device must do after a guest packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send this header to the guest.
    Reply(Header),
    /// A new connection: start a Hira session for guest port `.0`.
    Open(u32),
    /// Deliver the packet's payload to the session of guest port `.0`.
    Deliver(u32, u32),
    /// The session of guest port `.0` gets no more input.
    EndInput(u32),
    /// Tear down the session of guest port `.0`.
    Close(u32),
    /// The packet was dropped (spoofed source); nothing is sent.
    Drop,
}

/// A VM's connections, keyed by guest port.
#[derive(Debug)]
pub struct Mux {
    guest_cid: u64,
    conns: HashMap<u32, Conn>,
    max_conns: usize,
}

impl Mux {
    pub fn new(guest_cid: u64, max_conns: usize) -> Self {
        Mux {
            guest_cid,
            conns: HashMap::new(),
            max_conns,
        }
    }

    /// A reset for a packet that belongs to no connection (or is refused).
    fn refuse(h: &Header) -> Header {
        Header {
            src_cid: h.dst_cid,
            dst_cid: h.src_cid,
            src_port: h.dst_port,
            dst_port: h.src_port,
            len: 0,
            op: Op::Rst,
            flags: 0,
            buf_alloc: 0,
            fwd_cnt: 0,
        }
    }

    /// Handles one packet from the guest.
    pub fn on_packet(&mut self, h: &Header) -> Vec<Action> {
        if h.src_cid != self.guest_cid {
            warn!(
                "VM with CID {} sent a packet from CID {}; dropped",
                self.guest_cid, h.src_cid
            );
            return vec![Action::Drop];
        }
        let port = h.src_port;
        if h.op == Op::Request {
            if h.dst_cid != HOST_CID
                || h.dst_port != HIRA_PORT
                || self.conns.contains_key(&port)
                || self.conns.len() >= self.max_conns
            {
                return vec![Action::Reply(Self::refuse(h))];
            }
            let (c, resp) = Conn::accept(h);
            self.conns.insert(port, c);
            return vec![Action::Reply(resp), Action::Open(port)];
        }
        let Some(conn) = self
            .conns
            .get_mut(&port)
            .filter(|c| c.host_port == h.dst_port && h.dst_cid == HOST_CID)
        else {
            // Never answer a reset with a reset.
            return if h.op == Op::Rst {
                vec![]
            } else {
                vec![Action::Reply(Self::refuse(h))]
            };
        };
        match conn.on_packet(h) {
            Ok(events) => {
                let mut out = Vec::new();
                for e in events {
                    match e {
                        Event::Reply(r) => out.push(Action::Reply(r)),
                        Event::Deliver(n) => out.push(Action::Deliver(port, n)),
                        Event::PeerDoneSending => out.push(Action::EndInput(port)),
                        Event::Closed => {
                            self.conns.remove(&port);
                            out.push(Action::Close(port));
                        }
                    }
                }
                out
            }
            Err(v) => {
                warn!(
                    "VM with CID {}, port {port}: {v}; resetting the connection",
                    self.guest_cid
                );
                let rst = conn.reset();
                self.conns.remove(&port);
                vec![Action::Reply(rst), Action::Close(port)]
            }
        }
    }

    /// The connection of guest port `port`.
    pub fn conn(&mut self, port: u32) -> Option<&mut Conn> {
        self.conns.get_mut(&port)
    }

    /// Forgets one connection (the host reset it).
    pub fn reset_one(&mut self, port: u32) {
        self.conns.remove(&port);
    }

    /// Device reset: every connection is gone; returns the ports whose sessions end.
    pub fn reset(&mut self) -> Vec<u32> {
        self.conns.drain().map(|(p, _)| p).collect()
    }

    pub fn len(&self) -> usize {
        self.conns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkt(src_cid: u64, port: u32, dst_port: u32, op: Op, len: u32) -> Header {
        Header {
            src_cid,
            dst_cid: HOST_CID,
            src_port: port,
            dst_port,
            len,
            op,
            flags: 0,
            buf_alloc: 65536,
            fwd_cnt: 0,
        }
    }

    #[test]
    fn request_to_the_hira_port_opens_a_session() {
        let mut m = Mux::new(3, 8);
        let a = m.on_packet(&pkt(3, 1000, HIRA_PORT, Op::Request, 0));
        assert!(matches!(a[0], Action::Reply(h) if h.op == Op::Response));
        assert_eq!(a[1], Action::Open(1000));
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn request_to_another_port_is_reset() {
        let mut m = Mux::new(3, 8);
        let a = m.on_packet(&pkt(3, 1000, 22, Op::Request, 0));
        assert!(
            matches!(a.as_slice(), [Action::Reply(h)] if h.op == Op::Rst && h.dst_port == 1000 && h.src_port == 22)
        );
        assert!(m.is_empty());
    }

    #[test]
    fn spoofed_source_cid_is_dropped() {
        let mut m = Mux::new(3, 8);
        assert_eq!(
            m.on_packet(&pkt(4, 1000, HIRA_PORT, Op::Request, 0)),
            vec![Action::Drop]
        );
        assert!(m.is_empty());
    }

    #[test]
    fn data_for_an_unknown_connection_is_reset_but_a_reset_is_not() {
        let mut m = Mux::new(3, 8);
        assert!(
            matches!(m.on_packet(&pkt(3, 7, HIRA_PORT, Op::Rw, 5)).as_slice(), [Action::Reply(h)] if h.op == Op::Rst)
        );
        assert!(m.on_packet(&pkt(3, 7, HIRA_PORT, Op::Rst, 0)).is_empty());
    }

    #[test]
    fn duplicate_request_on_a_live_port_is_refused() {
        let mut m = Mux::new(3, 8);
        m.on_packet(&pkt(3, 1000, HIRA_PORT, Op::Request, 0));
        let a = m.on_packet(&pkt(3, 1000, HIRA_PORT, Op::Request, 0));
        assert!(matches!(a.as_slice(), [Action::Reply(h)] if h.op == Op::Rst));
        assert_eq!(m.len(), 1, "the live connection stays");
    }

    #[test]
    fn connection_limit_is_enforced() {
        let mut m = Mux::new(3, 1);
        m.on_packet(&pkt(3, 1, HIRA_PORT, Op::Request, 0));
        let a = m.on_packet(&pkt(3, 2, HIRA_PORT, Op::Request, 0));
        assert!(matches!(a.as_slice(), [Action::Reply(h)] if h.op == Op::Rst));
    }

    #[test]
    fn credit_violation_resets_and_closes() {
        let mut m = Mux::new(3, 8);
        m.on_packet(&pkt(3, 1000, HIRA_PORT, Op::Request, 0));
        for _ in 0..4 {
            m.on_packet(&pkt(3, 1000, HIRA_PORT, Op::Rw, 65536));
        }
        let a = m.on_packet(&pkt(3, 1000, HIRA_PORT, Op::Rw, 1));
        assert!(matches!(a[0], Action::Reply(h) if h.op == Op::Rst));
        assert_eq!(a[1], Action::Close(1000));
        assert!(m.is_empty());
    }

    #[test]
    fn guest_reset_closes_the_session() {
        let mut m = Mux::new(3, 8);
        m.on_packet(&pkt(3, 1000, HIRA_PORT, Op::Request, 0));
        assert_eq!(
            m.on_packet(&pkt(3, 1000, HIRA_PORT, Op::Rst, 0)),
            vec![Action::Close(1000)]
        );
    }

    #[test]
    fn device_reset_ends_every_session() {
        let mut m = Mux::new(3, 8);
        m.on_packet(&pkt(3, 1, HIRA_PORT, Op::Request, 0));
        m.on_packet(&pkt(3, 2, HIRA_PORT, Op::Request, 0));
        let mut ports = m.reset();
        ports.sort();
        assert_eq!(ports, vec![1, 2]);
        assert!(m.is_empty());
    }
}
