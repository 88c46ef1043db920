//! The virtio-vsock protocol as the host side of Hira's VM transport speaks it.
//!
//! This module is pure protocol logic, driven by the vhost-user device backend (which
//! moves packets between virtqueues and these types) and tested on its own:
//!
//! - [`backend`]: the vhost-user device QEMU connects to, moving packets between the
//!   virtqueues and the device.
//! - [`header`]: the 44-byte packet header, decoded strictly.
//! - [`conn`]: one guest connection to the Hira port: its state, credit-based flow
//!   control in both directions, and shutdown.
//! - [`device`]: one VM's device: packets in from the TX queue, packets out for the
//!   RX queue, each connection a Hira session.
//! - [`mux`]: all connections of one VM: accepts connections to the Hira port on the
//!   host CID, refuses every other port with a reset, drops packets whose source is
//!   not the VM's own CID, and drops everything on device reset.

pub mod backend;
pub mod conn;
pub mod device;
pub mod header;
pub mod mux;

/// The host's context id.
pub const HOST_CID: u64 = 2;
/// The port Hira listens on at the host CID.
pub const HIRA_PORT: u32 = 5571;
