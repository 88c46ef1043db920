//! One guest connection to the Hira port, host side.
//!
//! Credit-based flow control (virtio spec, "Device Operation: Flow Control"): each side
//! advertises `buf_alloc`, the bytes of receive buffer it has for the connection, and
//! `fwd_cnt`, the bytes it has consumed from it so far. A side may have at most
//! `peer buf_alloc - (bytes sent - peer fwd_cnt)` bytes in flight. Counters wrap.

use super::header::{Header, MAX_PAYLOAD, Op, SHUTDOWN_RCV, SHUTDOWN_SEND};

/// Receive buffer the host offers each connection.
pub const BUF_ALLOC: u32 = 256 * 1024;

/// What the guest did wrong; the connection must be reset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    #[error("guest sent {sent} bytes with only {credit} bytes of credit")]
    CreditExceeded { sent: u32, credit: u32 },
    #[error("guest sent data after shutting down its send side")]
    DataAfterShutdown,
    #[error("guest sent {0:?} on an established connection")]
    UnexpectedOp(Op),
}

/// What the host must do after a packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Send this header (no payload) to the guest.
    Reply(Header),
    /// The packet's payload bytes go to the session.
    Deliver(u32),
    /// The guest will send nothing more: end the session's input.
    PeerDoneSending,
    /// The connection is over (reset by the guest, or fully shut down).
    Closed,
}

/// The host end of one connection.
#[derive(Debug, Clone)]
pub struct Conn {
    pub guest_cid: u64,
    pub guest_port: u32,
    pub host_port: u32,
    /// Bytes received and not yet consumed by the session.
    rx_pending: u32,
    /// Bytes consumed by the session, as advertised to the guest.
    fwd_cnt: u32,
    /// `fwd_cnt` when the guest last heard it.
    fwd_cnt_told: u32,
    /// Bytes sent to the guest.
    tx_cnt: u32,
    peer_buf_alloc: u32,
    peer_fwd_cnt: u32,
    peer_send_done: bool,
    peer_recv_done: bool,
}

impl Conn {
    /// Accepts a connection request; returns the connection and the response.
    pub fn accept(req: &Header) -> (Conn, Header) {
        let mut c = Conn {
            guest_cid: req.src_cid,
            guest_port: req.src_port,
            host_port: req.dst_port,
            rx_pending: 0,
            fwd_cnt: 0,
            fwd_cnt_told: 0,
            tx_cnt: 0,
            peer_buf_alloc: req.buf_alloc,
            peer_fwd_cnt: req.fwd_cnt,
            peer_send_done: false,
            peer_recv_done: false,
        };
        let resp = c.header(Op::Response, 0, 0);
        (c, resp)
    }

    /// A header from the host to the guest on this connection, carrying our credit.
    pub fn header(&mut self, op: Op, len: u32, flags: u32) -> Header {
        self.fwd_cnt_told = self.fwd_cnt;
        Header {
            src_cid: super::HOST_CID,
            dst_cid: self.guest_cid,
            src_port: self.host_port,
            dst_port: self.guest_port,
            len,
            op,
            flags,
            buf_alloc: BUF_ALLOC,
            fwd_cnt: self.fwd_cnt,
        }
    }

    /// Handles a packet from the guest for this connection.
    pub fn on_packet(&mut self, h: &Header) -> Result<Vec<Event>, Violation> {
        // Every packet carries the guest's current credit.
        self.peer_buf_alloc = h.buf_alloc;
        self.peer_fwd_cnt = h.fwd_cnt;
        match h.op {
            Op::Rw => {
                if self.peer_send_done {
                    return Err(Violation::DataAfterShutdown);
                }
                let credit = BUF_ALLOC - self.rx_pending;
                if h.len > credit {
                    return Err(Violation::CreditExceeded {
                        sent: h.len,
                        credit,
                    });
                }
                self.rx_pending += h.len;
                Ok(if h.len > 0 {
                    vec![Event::Deliver(h.len)]
                } else {
                    vec![]
                })
            }
            Op::CreditUpdate => Ok(vec![]),
            Op::CreditRequest => Ok(vec![Event::Reply(self.header(Op::CreditUpdate, 0, 0))]),
            Op::Shutdown => {
                let mut ev = Vec::new();
                if h.flags & SHUTDOWN_SEND != 0 && !self.peer_send_done {
                    self.peer_send_done = true;
                    ev.push(Event::PeerDoneSending);
                }
                self.peer_recv_done |= h.flags & SHUTDOWN_RCV != 0;
                if self.peer_send_done && self.peer_recv_done {
                    ev.push(Event::Reply(self.header(Op::Rst, 0, 0)));
                    ev.push(Event::Closed);
                }
                Ok(ev)
            }
            Op::Rst => Ok(vec![Event::Closed]),
            Op::Request | Op::Response => Err(Violation::UnexpectedOp(h.op)),
        }
    }

    /// The session consumed `n` received bytes. Returns a credit update when the
    /// guest's view of our buffer has fallen far enough behind.
    pub fn consumed(&mut self, n: u32) -> Option<Header> {
        let n = n.min(self.rx_pending);
        self.rx_pending -= n;
        self.fwd_cnt = self.fwd_cnt.wrapping_add(n);
        (self.fwd_cnt.wrapping_sub(self.fwd_cnt_told) >= BUF_ALLOC / 2)
            .then(|| self.header(Op::CreditUpdate, 0, 0))
    }

    /// Bytes the guest can take now.
    pub fn peer_credit(&self) -> u32 {
        let in_flight = self.tx_cnt.wrapping_sub(self.peer_fwd_cnt);
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    /// A data packet for up to `want` bytes of session output, or `None` when the guest
    /// has no room (the caller then sends [`Conn::credit_request`]) or stopped receiving.
    pub fn send(&mut self, want: u32) -> Option<Header> {
        if self.peer_recv_done {
            return None;
        }
        let n = want.min(self.peer_credit()).min(MAX_PAYLOAD);
        if n == 0 {
            return None;
        }
        self.tx_cnt = self.tx_cnt.wrapping_add(n);
        Some(self.header(Op::Rw, n, 0))
    }

    /// Asks the guest for a credit update.
    pub fn credit_request(&mut self) -> Header {
        self.header(Op::CreditRequest, 0, 0)
    }

    /// Resets the connection from the host side.
    pub fn reset(&mut self) -> Header {
        self.header(Op::Rst, 0, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_guest(op: Op, len: u32, flags: u32, buf_alloc: u32, fwd_cnt: u32) -> Header {
        Header {
            src_cid: 3,
            dst_cid: 2,
            src_port: 40000,
            dst_port: super::super::HIRA_PORT,
            len,
            op,
            flags,
            buf_alloc,
            fwd_cnt,
        }
    }

    fn established(guest_buf: u32) -> Conn {
        Conn::accept(&from_guest(Op::Request, 0, 0, guest_buf, 0)).0
    }

    #[test]
    fn response_mirrors_the_request_and_offers_credit() {
        let (_, r) = Conn::accept(&from_guest(Op::Request, 0, 0, 4096, 0));
        assert_eq!((r.op, r.src_cid, r.dst_cid), (Op::Response, 2, 3));
        assert_eq!(
            (r.src_port, r.dst_port, r.buf_alloc),
            (super::super::HIRA_PORT, 40000, BUF_ALLOC)
        );
    }

    #[test]
    fn data_within_credit_is_delivered() {
        let mut c = established(4096);
        assert_eq!(
            c.on_packet(&from_guest(Op::Rw, 1000, 0, 4096, 0)),
            Ok(vec![Event::Deliver(1000)])
        );
    }

    #[test]
    fn data_beyond_credit_is_a_violation() {
        let mut c = established(4096);
        c.on_packet(&from_guest(Op::Rw, BUF_ALLOC - 10, 0, 4096, 0))
            .unwrap();
        assert_eq!(
            c.on_packet(&from_guest(Op::Rw, 20, 0, 4096, 0)),
            Err(Violation::CreditExceeded {
                sent: 20,
                credit: 10
            })
        );
    }

    #[test]
    fn consuming_half_the_buffer_sends_a_credit_update() {
        let mut c = established(4096);
        for _ in 0..4 {
            c.on_packet(&from_guest(Op::Rw, 60000, 0, 4096, 0)).unwrap();
        }
        assert_eq!(c.consumed(100_000), None);
        let u = c
            .consumed(40_000)
            .expect("an update once half the buffer is consumed");
        assert_eq!((u.op, u.fwd_cnt), (Op::CreditUpdate, 140_000));
        assert_eq!(c.consumed(0), None, "nothing new to tell");
    }

    #[test]
    fn sending_stops_at_the_guests_credit() {
        let mut c = established(3000);
        assert_eq!(c.send(2000).unwrap().len, 2000);
        assert_eq!(c.send(2000).unwrap().len, 1000);
        assert_eq!(c.send(1), None, "no credit left");
        c.on_packet(&from_guest(Op::CreditUpdate, 0, 0, 3000, 2500))
            .unwrap();
        assert_eq!(c.peer_credit(), 2500);
    }

    #[test]
    fn credit_survives_counter_wraparound() {
        let mut c = established(1000);
        c.tx_cnt = u32::MAX - 99;
        c.peer_fwd_cnt = u32::MAX - 99;
        assert_eq!(c.send(600).unwrap().len, 600);
        assert_eq!(c.peer_credit(), 400);
    }

    #[test]
    fn credit_request_is_answered() {
        let mut c = established(1000);
        let ev = c
            .on_packet(&from_guest(Op::CreditRequest, 0, 0, 1000, 0))
            .unwrap();
        assert!(matches!(ev.as_slice(), [Event::Reply(h)] if h.op == Op::CreditUpdate));
    }

    #[test]
    fn send_shutdown_ends_input_and_later_data_is_a_violation() {
        let mut c = established(1000);
        assert_eq!(
            c.on_packet(&from_guest(Op::Shutdown, 0, SHUTDOWN_SEND, 1000, 0)),
            Ok(vec![Event::PeerDoneSending])
        );
        assert_eq!(
            c.on_packet(&from_guest(Op::Rw, 1, 0, 1000, 0)),
            Err(Violation::DataAfterShutdown)
        );
    }

    #[test]
    fn full_shutdown_is_answered_with_a_reset_and_closes() {
        let mut c = established(1000);
        let ev = c
            .on_packet(&from_guest(
                Op::Shutdown,
                0,
                SHUTDOWN_SEND | SHUTDOWN_RCV,
                1000,
                0,
            ))
            .unwrap();
        assert_eq!(ev.len(), 3);
        assert!(matches!(ev[1], Event::Reply(h) if h.op == Op::Rst));
        assert_eq!(ev[2], Event::Closed);
    }

    #[test]
    fn guest_that_stopped_receiving_gets_no_data() {
        let mut c = established(1000);
        c.on_packet(&from_guest(Op::Shutdown, 0, SHUTDOWN_RCV, 1000, 0))
            .unwrap();
        assert_eq!(c.send(10), None);
    }

    #[test]
    fn request_on_an_established_connection_is_a_violation() {
        let mut c = established(1000);
        assert_eq!(
            c.on_packet(&from_guest(Op::Request, 0, 0, 1000, 0)),
            Err(Violation::UnexpectedOp(Op::Request))
        );
    }
}
