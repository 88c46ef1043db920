//! The vhost-user virtio-vsock device: QEMU's `vhost-user-vsock-pci` talks to it over
//! a vhost-user socket, and guest memory is reached only through `vm-memory`.
//!
//! Queue 0 is RX (host to guest), 1 is TX (guest to host), 2 is the event queue. Every
//! TX chain is parsed by `virtio-vsock` (direction and length checks) and returned to
//! the guest whatever it held. Session output waits in `pending` until the guest posts
//! RX buffers; packets are split to fit each buffer.

use std::collections::{HashSet, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex, RwLock};

use log::warn;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::virtio_config::{VIRTIO_F_NOTIFY_ON_EMPTY, VIRTIO_F_VERSION_1};
use virtio_queue::QueueOwnedT;
use virtio_vsock::packet::VsockPacket;
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::event::{
    EventConsumer, EventFlag, EventNotifier, new_event_consumer_and_notifier,
};

use super::device::{Packet, VsockDevice};
use super::header::{HDR_LEN, Header, MAX_PAYLOAD};

const RX_QUEUE: u16 = 0;
const TX_QUEUE: u16 = 1;
const EVT_QUEUE: u16 = 2;
/// Device event for "some session has output": above the queue ids, as the
/// vhost-user-backend event loop requires.
pub const BACKEND_EVENT: u16 = 4;
const QUEUE_SIZE: usize = 256;

struct State {
    device: VsockDevice,
    pending: VecDeque<Packet>,
    watched: HashSet<RawFd>,
}

/// One VM's vhost-user vsock backend.
pub struct VsockBackend {
    cid: u64,
    state: Mutex<State>,
    mem: RwLock<Option<GuestMemoryAtomic<GuestMemoryMmap>>>,
    /// Session sockets, edge-triggered; itself watched by the vring worker.
    sessions: Epoll,
}

impl std::fmt::Debug for VsockBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VsockBackend")
            .field("cid", &self.cid)
            .finish_non_exhaustive()
    }
}

impl VsockBackend {
    pub fn new(cid: u64, device: VsockDevice) -> io::Result<Self> {
        Ok(VsockBackend {
            cid,
            state: Mutex::new(State {
                device,
                pending: VecDeque::new(),
                watched: HashSet::new(),
            }),
            mem: RwLock::new(None),
            sessions: Epoll::new()?,
        })
    }

    /// The descriptor the vring worker watches for [`BACKEND_EVENT`].
    pub fn event_fd(&self) -> RawFd {
        self.sessions.as_raw_fd()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Watches every current session socket (new ones appear as guests connect): for
    /// output to move to the guest, and for room to move guest input that the socket
    /// could not take yet. Without the second, input left over when the socket was
    /// full would wait for an event that never comes (the guest, out of credit,
    /// sends nothing more), stalling the session.
    fn watch_sessions(&self, st: &mut State) {
        let now: HashSet<RawFd> = st.device.streams().map(AsRawFd::as_raw_fd).collect();
        for &fd in now.difference(&st.watched) {
            if let Err(e) = watch(&self.sessions, fd) {
                warn!("cannot watch a session socket: {e}");
            }
        }
        st.watched = now;
    }

    fn drain_session_events(&self) {
        let mut events = [EpollEvent::default(); 32];
        while matches!(self.sessions.wait(0, &mut events), Ok(n) if n > 0) {}
    }

    fn memory(&self) -> io::Result<GuestMemoryAtomic<GuestMemoryMmap>> {
        self.mem
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| io::Error::other("no guest memory yet"))
    }

    /// Handles every packet the guest queued on TX.
    fn process_tx(&self, vring: &VringRwLock, st: &mut State) -> io::Result<()> {
        let atomic = self.memory()?;
        let mut used = false;
        loop {
            let next = vring
                .get_mut()
                .get_queue_mut()
                .iter(atomic.memory())
                .map_err(io::Error::other)?
                .next();
            let Some(mut chain) = next else { break };
            let head = chain.head_index();
            let mem = atomic.memory();
            match VsockPacket::from_tx_virtq_chain(&*mem, &mut chain, MAX_PAYLOAD) {
                Ok(pkt) => {
                    let mut hb = [0u8; HDR_LEN];
                    pkt.header_slice().copy_to(&mut hb[..]);
                    let payload = pkt.data_slice().map_or_else(Vec::new, |d| {
                        let mut v = vec![0u8; d.len()];
                        d.copy_to(&mut v[..]);
                        v
                    });
                    match Header::decode(&hb) {
                        Ok(h) if h.len as usize <= payload.len() => {
                            let out = st.device.from_guest(&h, &payload[..h.len as usize]);
                            st.pending.extend(out);
                        }
                        Ok(h) => warn!(
                            "VM CID {}: packet claims {} bytes, carries {}",
                            self.cid,
                            h.len,
                            payload.len()
                        ),
                        Err(e) => warn!("VM CID {}: bad vsock header: {e}", self.cid),
                    }
                }
                Err(e) => warn!("VM CID {}: bad TX descriptor chain: {e}", self.cid),
            }
            vring.add_used(head, 0).map_err(io::Error::other)?;
            used = true;
        }
        if used {
            vring.signal_used_queue()?;
        }
        Ok(())
    }

    /// Moves pending packets into the guest's RX buffers, splitting data to fit.
    fn process_rx(&self, vring: &VringRwLock, st: &mut State) -> io::Result<()> {
        let atomic = self.memory()?;
        let mut used = false;
        while !st.pending.is_empty() {
            let next = vring
                .get_mut()
                .get_queue_mut()
                .iter(atomic.memory())
                .map_err(io::Error::other)?
                .next();
            let Some(mut chain) = next else { break };
            let head = chain.head_index();
            let mem = atomic.memory();
            let mut used_len = 0u32;
            match VsockPacket::from_rx_virtq_chain(&*mem, &mut chain, MAX_PAYLOAD) {
                Ok(mut vp) => {
                    let pkt = st.pending.front_mut().expect("checked non-empty");
                    let room = vp.data_slice().map_or(0, |d| d.len());
                    let n = pkt.payload.len().min(room);
                    let mut h = pkt.header;
                    h.len = n as u32;
                    if vp.set_header_from_raw(&h.encode()).is_ok() {
                        if n > 0
                            && let Some(d) = vp.data_slice()
                        {
                            d.copy_from(&pkt.payload[..n]);
                        }
                        used_len = (HDR_LEN + n) as u32;
                        if n < pkt.payload.len() {
                            pkt.payload.drain(..n);
                            pkt.header.len = pkt.payload.len() as u32;
                        } else {
                            st.pending.pop_front();
                        }
                    }
                }
                Err(e) => warn!("VM CID {}: bad RX descriptor chain: {e}", self.cid),
            }
            vring.add_used(head, used_len).map_err(io::Error::other)?;
            used = true;
        }
        if used {
            vring.signal_used_queue()?;
        }
        Ok(())
    }
}

/// Adds a session socket to `epoll`, edge-triggered for input and for room.
fn watch(epoll: &Epoll, fd: RawFd) -> io::Result<()> {
    let ev = EpollEvent::new(
        EventSet::IN | EventSet::OUT | EventSet::EDGE_TRIGGERED,
        fd as u64,
    );
    epoll.ctl(ControlOperation::Add, fd, ev)
}

impl VhostUserBackend for VsockBackend {
    type Bitmap = ();
    type Vring = VringRwLock;

    /// Without an exit event the library cannot stop a connection's vring workers, and
    /// joins them forever when the connection ends: the VMM could never connect again
    /// (a vsock device unplugged and plugged back, a VMM restarted).
    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC)
            .inspect_err(|e| warn!("no exit event for a vring worker: {e}"))
            .ok()
    }

    fn num_queues(&self) -> usize {
        3
    }

    fn max_queue_size(&self) -> usize {
        QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_F_NOTIFY_ON_EMPTY)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::CONFIG
    }

    fn set_event_idx(&self, _enabled: bool) {}

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let config = self.cid.to_le_bytes();
        let (start, end) = (offset as usize, offset as usize + size as usize);
        config
            .get(start..end)
            .map(<[u8]>::to_vec)
            .unwrap_or_default()
    }

    fn update_memory(&self, mem: GuestMemoryAtomic<GuestMemoryMmap>) -> io::Result<()> {
        *self.mem.write().unwrap_or_else(|e| e.into_inner()) = Some(mem);
        Ok(())
    }

    fn reset_device(&self) {
        let mut st = self.state();
        st.device.reset();
        st.pending.clear();
    }

    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[VringRwLock],
        _thread: usize,
    ) -> io::Result<()> {
        let [rx, tx, ..] = vrings else {
            return Err(io::Error::other("vsock device has three queues"));
        };
        let mut st = self.state();
        match device_event {
            TX_QUEUE => self.process_tx(tx, &mut st)?,
            RX_QUEUE | EVT_QUEUE => {}
            BACKEND_EVENT => self.drain_session_events(),
            other => return Err(io::Error::other(format!("unknown device event {other}"))),
        }
        // Any event may have freed credit or RX buffers: move session output now.
        let out = st.device.poll_sessions();
        st.pending.extend(out);
        self.watch_sessions(&mut st);
        self.process_rx(rx, &mut st)
    }
}

/// Why a VM's vsock device stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot make the vsock backend: {0}")]
    Backend(#[source] io::Error),
    #[error("cannot make the vhost-user daemon: {0}")]
    Daemon(vhost_user_backend::Error),
    #[error("cannot watch the backend's events: {0}")]
    Epoll(#[source] io::Error),
}

/// Serves VM `vm`'s vsock device on `listener` (bound by the daemon, so that its
/// socket exists with the configured access before the daemon reports readiness)
/// until the daemon exits; a VMM that disconnects may reconnect, getting a fresh
/// device.
pub fn serve(
    mut listener: vhost::vhost_user::Listener,
    cid: u64,
    make_device: impl Fn() -> VsockDevice,
    removed: impl Fn() -> bool,
) -> Result<(), ServeError> {
    loop {
        if removed() {
            return Ok(());
        }
        let backend = Arc::new(VsockBackend::new(cid, make_device()).map_err(ServeError::Backend)?);
        let mut daemon = vhost_user_backend::VhostUserDaemon::new(
            format!("hira-vsock-{cid}"),
            backend.clone(),
            GuestMemoryAtomic::new(GuestMemoryMmap::new()),
        )
        .map_err(ServeError::Daemon)?;
        let handlers = daemon.get_epoll_handlers();
        for h in &handlers {
            h.register_listener(backend.event_fd(), EventSet::IN, BACKEND_EVENT as u64)
                .map_err(ServeError::Epoll)?;
        }
        let result = daemon.start(&mut listener).and_then(|()| daemon.wait());
        // The worker threads of this connection end with it.
        for h in &handlers {
            h.send_exit_event();
        }
        if removed() {
            // Removed: its listener was shut down (or its VMM left after).
            backend.reset_device();
            return Ok(());
        }
        match result {
            Ok(())
            | Err(vhost_user_backend::Error::HandleRequest(
                vhost::vhost_user::Error::Disconnected | vhost::vhost_user::Error::PartialMessage,
            )) => {}
            Err(e) => warn!("vhost-user connection for CID {cid} ended: {e}"),
        }
        // The VMM is gone (or reset the device): every connection of this VM ends now,
        // so its sessions tear down, whoever still holds the backend.
        backend.reset_device();
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    use super::*;

    /// A session socket that was full (guest input left waiting) wakes the backend
    /// once the session reads from it, so the waiting input moves on.
    #[test]
    fn a_full_session_socket_that_drains_wakes_the_backend() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let mut writer = &ours;
        let chunk = [0u8; 4096];
        while writer.write(&chunk).is_ok() {}
        let epoll = Epoll::new().unwrap();
        watch(&epoll, ours.as_raw_fd()).unwrap();
        let mut events = [EpollEvent::default(); 4];
        while epoll.wait(0, &mut events).unwrap() > 0 {}
        assert_eq!(
            epoll.wait(0, &mut events).unwrap(),
            0,
            "nothing to do while full"
        );
        let mut buf = vec![0u8; 256 * 1024];
        let _ = theirs.read(&mut buf).unwrap();
        assert_eq!(
            epoll.wait(1000, &mut events).unwrap(),
            1,
            "room in the socket is an event"
        );
    }
}
