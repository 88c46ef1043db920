//! The vsock device of one VM, between its virtqueues and Hira sessions.
//!
//! The vhost-user backend hands every packet the guest puts on the TX queue to
//! [`VsockDevice::from_guest`] and puts what it returns, and what
//! [`VsockDevice::poll_sessions`] returns, on the RX queue. Each accepted connection
//! gets a socket pair whose other end runs through the same session code as a
//! host-local guest (vms, per-VM queue, API server, teardown), so the VM transport
//! adds no process hop.

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use log::warn;

use super::header::{Header, MAX_PAYLOAD, Op, SHUTDOWN_RCV, SHUTDOWN_SEND};
use super::mux::{Action, Mux};
use crate::config::Config;
use crate::lifecycle::Lifecycle;
use crate::listener::{ConnectionSlot, start_session};
use crate::vms::Vm;

/// A packet for the guest's RX queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    pub header: Header,
    pub payload: Vec<u8>,
}

impl Packet {
    fn bare(header: Header) -> Packet {
        Packet {
            header,
            payload: Vec::new(),
        }
    }
}

/// Our end of one connection's session.
#[derive(Debug)]
struct Link {
    stream: UnixStream,
    /// Guest bytes the session has not taken yet.
    pending: VecDeque<u8>,
    /// The guest shut down its send side; close ours once `pending` drains.
    input_done: bool,
}

/// One VM's vsock device.
#[derive(Debug)]
pub struct VsockDevice {
    mux: Mux,
    vm: String,
    config: Arc<Config>,
    queue: Arc<Vm>,
    life: Arc<Lifecycle>,
    links: HashMap<u32, Link>,
}

impl VsockDevice {
    pub fn new(
        guest_cid: u64,
        vm: &str,
        config: Arc<Config>,
        queue: Arc<Vm>,
        life: Arc<Lifecycle>,
    ) -> Self {
        VsockDevice {
            // The VM's device is its listener: the same cap on open connections.
            mux: Mux::new(guest_cid, config.limits.max_connections_per_listener),
            vm: vm.to_string(),
            config,
            queue,
            life,
            links: HashMap::new(),
        }
    }

    /// Handles one packet from the guest; returns packets for the guest.
    pub fn from_guest(&mut self, header: &Header, payload: &[u8]) -> Vec<Packet> {
        let mut out = Vec::new();
        for action in self.mux.on_packet(header) {
            match action {
                Action::Reply(h) => out.push(Packet::bare(h)),
                Action::Open(port) => match UnixStream::pair() {
                    Ok((ours, theirs)) if ours.set_nonblocking(true).is_ok() => {
                        start_session(
                            theirs,
                            ConnectionSlot::uncounted(),
                            &self.vm,
                            &self.config,
                            &self.queue,
                            &self.life,
                        );
                        self.links.insert(
                            port,
                            Link {
                                stream: ours,
                                pending: VecDeque::new(),
                                input_done: false,
                            },
                        );
                    }
                    _ => {
                        warn!("VM {:?}: cannot start a session for port {port}", self.vm);
                        out.extend(self.close(port));
                    }
                },
                Action::Deliver(port, n) => {
                    let data = &payload[..(n as usize).min(payload.len())];
                    if let Some(link) = self.links.get_mut(&port) {
                        link.pending.extend(data);
                    }
                    out.extend(self.flush_input(port));
                }
                Action::EndInput(port) => {
                    if let Some(link) = self.links.get_mut(&port) {
                        link.input_done = true;
                    }
                    out.extend(self.flush_input(port));
                }
                Action::Close(port) => {
                    self.links.remove(&port);
                }
                Action::Drop => {}
            }
        }
        out
    }

    /// Writes what the session will take of the guest's bytes; returns a credit update
    /// for the guest when its view of our buffer has fallen behind.
    fn flush_input(&mut self, port: u32) -> Vec<Packet> {
        let Some(link) = self.links.get_mut(&port) else {
            return vec![];
        };
        let mut written = 0usize;
        while !link.pending.is_empty() {
            let (front, _) = link.pending.as_slices();
            match link.stream.write(front) {
                Ok(0) => break,
                Ok(n) => {
                    link.pending.drain(..n);
                    written += n;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(_) => return self.close(port),
            }
        }
        if link.pending.is_empty() && link.input_done {
            let _ = link.stream.shutdown(std::net::Shutdown::Write);
        }
        let update = self.mux.conn(port).and_then(|c| c.consumed(written as u32));
        update.map(Packet::bare).into_iter().collect()
    }

    /// Ends a connection from the host side.
    fn close(&mut self, port: u32) -> Vec<Packet> {
        self.links.remove(&port);
        let rst = self.mux.conn(port).map(|c| c.reset());
        self.mux.reset_one(port);
        rst.map(Packet::bare).into_iter().collect()
    }

    /// Moves session output to the guest as far as its credit allows, retries guest
    /// input the sessions could not take yet, and ends connections whose session ended.
    pub fn poll_sessions(&mut self) -> Vec<Packet> {
        let mut out = Vec::new();
        let ports: Vec<u32> = self.links.keys().copied().collect();
        for port in ports {
            out.extend(self.flush_input(port));
            let mut buf = [0u8; MAX_PAYLOAD as usize];
            while let Some(conn) = self.mux.conn(port) {
                let room = conn.peer_credit().min(MAX_PAYLOAD) as usize;
                if room == 0 {
                    out.push(Packet::bare(conn.credit_request()));
                    break;
                }
                let Some(link) = self.links.get_mut(&port) else {
                    break;
                };
                match link.stream.read(&mut buf[..room]) {
                    Ok(0) => {
                        // The session is over: tell the guest we are done both ways.
                        let h = self
                            .mux
                            .conn(port)
                            .map(|c| c.header(Op::Shutdown, 0, SHUTDOWN_RCV | SHUTDOWN_SEND));
                        out.extend(h.map(Packet::bare));
                        self.links.remove(&port);
                        break;
                    }
                    Ok(n) => {
                        let Some(h) = self.mux.conn(port).and_then(|c| c.send(n as u32)) else {
                            break;
                        };
                        out.push(Packet {
                            header: h,
                            payload: buf[..n].to_vec(),
                        });
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(_) => {
                        out.extend(self.close(port));
                        break;
                    }
                }
            }
        }
        out
    }

    /// Device reset: every connection of the VM is cut. Sessions on rings in the VM's
    /// window wait a while for their guests to connect again; the others end.
    pub fn reset(&mut self) {
        if !self.links.is_empty() {
            self.queue.device_reset();
        }
        self.links.clear();
        self.mux.reset();
    }

    /// Open connections.
    pub fn connections(&self) -> usize {
        self.links.len()
    }

    /// Our ends of the sessions, for the backend's event loop to watch.
    pub fn streams(&self) -> impl Iterator<Item = &UnixStream> {
        self.links.values().map(|l| &l.stream)
    }
}
