//! A session's handshake: the guest's hello, a resuming guest's checks, its data
//! window and rings.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Mutex;

use hira_protocol::api::Description;
use hira_protocol::handshake::{ErrorPayload, Hello, Welcome, error_code, migrate};
use hira_protocol::resend;
use hira_protocol::{FrameHeader, FrameKind, unix};
use log::{debug, warn};

use super::{Context, GuestOut, SessionError, send_error};
use crate::lifecycle::Lifecycle;

/// Whether `fd` is a file of `len` bytes that can no longer shrink (so no mapping of
/// it faults): what a guest's window and a resumed ring region must be.
fn sealed_of_size(fd: &OwnedFd, len: u64) -> bool {
    hira_protocol::shm::inspect(fd).is_ok_and(|i| i.size == len && i.sealed_against_shrinking())
}

/// Checks a resuming guest's hello and descriptors (its ring region and eventfds,
/// which the API server will map and signal) and takes its parked session.
pub(crate) fn resumable(
    life: &Lifecycle,
    token: &hira_protocol::handshake::Token,
    vm: &str,
    hello: &Hello,
    rings: &[OwnedFd],
) -> Result<crate::migrate::Parked, ResumeRefused> {
    let none = || ResumeRefused::NoSession(vm.to_string());
    if hello.vm_window && hello.rings && rings.is_empty() {
        // A VM guest: its rings are in its slot of the VM's window.
        return life
            .unpark(token, vm)
            .filter(|p| p.slot.is_some())
            .ok_or_else(none);
    }
    if !hello.rings && rings.is_empty() {
        // A relayed session: its frames resume on the new connection (a VM's window
        // slot, if it had one, is checked when it is taken).
        return life.unpark(token, vm).ok_or_else(none);
    }
    if !hello.rings || rings.len() != 1 + hira_ring::EVENTFDS {
        return Err(ResumeRefused::Descriptors);
    }
    let region_ok = sealed_of_size(
        &rings[0],
        hira_ring::region_len(hira_ring::DEFAULT_CAPACITY) as u64,
    );
    if !region_ok {
        return Err(ResumeRefused::ForeignRegion);
    }
    for fd in &rings[1..] {
        if !crate::migrate::is_eventfd(fd) {
            return Err(ResumeRefused::NotEventfd);
        }
        // Signalling never blocks the API server, whatever the guest did to it.
        // SAFETY: sets a status flag on a descriptor this process holds.
        unsafe {
            let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
    }
    life.unpark(token, vm).ok_or_else(none)
}

/// Why a guest cannot resume a suspended session here.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ResumeRefused {
    #[error("no suspended session with this token for VM {0:?} here (yet)")]
    NoSession(String),
    #[error("a resuming guest passes its window, ring region and eventfds")]
    Descriptors,
    #[error("the ring region passed is not one an API server made")]
    ForeignRegion,
    #[error("a descriptor passed as an eventfd is not one")]
    NotEventfd,
}

/// The guest's first frame, its hello, with the API it asks for and the descriptors
/// it passed.
#[derive(Debug)]
pub(crate) struct Greeting {
    pub header: FrameHeader,
    pub hello: Hello,
    pub api: &'static Description,
    pub fds: Vec<OwnedFd>,
}

/// Reads the guest's hello within the handshake deadline. `None`: the guest closed
/// before sending one. A late, malformed or foreign hello is answered with an `Error`
/// frame and ends the session.
pub(crate) fn receive_hello(
    guest: &mut UnixStream,
    guest_w: &Mutex<GuestOut>,
    ctx: &Context<'_>,
) -> Result<Option<Greeting>, SessionError> {
    let (id, vm) = (ctx.id, ctx.vm);
    // A guest that connects and says nothing, or sends part of a hello, is cut off.
    let deadline = ctx.config.limits.handshake_timeout;
    guest.set_read_timeout(Some(deadline))?;
    let (header, payload, fds) = match unix::recv_frame_with_fds(guest) {
        Ok(x) => x,
        Err(unix::UnixFrameError::Closed) => {
            debug!("VM {vm:?} session {id}: closed before its hello");
            return Ok(None);
        }
        Err(unix::UnixFrameError::Io(e))
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            send_error(guest_w, None, error_code::HANDSHAKE, "no hello in time");
            return Err(SessionError::HandshakeTimeout(deadline));
        }
        Err(e) => {
            send_error(guest_w, None, error_code::HANDSHAKE, &e.to_string());
            return Err(SessionError::Handshake(e.to_string()));
        }
    };
    let refuse = |m: String| {
        send_error(guest_w, None, error_code::HANDSHAKE, &m);
        Err(SessionError::Handshake(m))
    };
    if header.kind != FrameKind::Hello {
        return refuse(format!("first frame must be Hello, got {:?}", header.kind));
    }
    let hello = match Hello::decode(&payload) {
        Ok(h) => h,
        Err(e) => return refuse(e.to_string()),
    };
    let Some(api) = hira_apis_registry::describe(hello.api) else {
        return refuse(format!("{} is not an API this daemon knows", hello.api));
    };
    Ok(Some(Greeting {
        header,
        hello,
        api,
        fds,
    }))
}

/// The suspended session a resuming guest comes back to (its token taken out of the
/// hello), or none for a new session. A resume that does not check out, and a new
/// session that passes more than its window, are refused.
pub(crate) fn take_parked(
    hello: &mut Hello,
    guest_rings: &[OwnedFd],
    guest_w: &Mutex<GuestOut>,
    ctx: &Context<'_>,
) -> Result<Option<crate::migrate::Parked>, SessionError> {
    match hello.resume.take() {
        Some(token) => match resumable(ctx.life, &token, ctx.vm, hello, guest_rings) {
            Ok(p) => Ok(Some(p)),
            Err(e) => {
                let m = e.to_string();
                send_error(guest_w, None, error_code::HANDSHAKE, &m);
                Err(SessionError::Refused(m))
            }
        },
        None if !guest_rings.is_empty() => {
            let m = "a new session passes at most its window";
            send_error(guest_w, None, error_code::HANDSHAKE, m);
            Err(SessionError::Handshake(m.into()))
        }
        None => Ok(None),
    }
}

/// Where a session's data goes: its data window (the guest's memfd, or a slot of the
/// VM's shared window) and whether it runs on rings.
#[derive(Debug)]
pub(crate) struct DataPlane<'q> {
    pub window: Option<OwnedFd>,
    /// The slot of the VM's window the session holds.
    pub lease: Option<crate::window::Lease<'q>>,
    /// Rings in a memfd of the API server's (a host-local guest that passed its window).
    pub local_rings: bool,
    /// Rings at the end of the session's slot of the VM's window.
    pub vm_rings: bool,
    /// The guest asked that both ends keep the relayed stream.
    pub asks_resend: bool,
}

/// Places the session's data plane and sets the hello the API server gets to match.
/// A guest that passed a memfd gets it checked: exactly the announced size, within
/// the configured limit, sealed against shrinking (else the session runs without a
/// window). A guest of a VM with a shared window (ivshmem) may lease a slot of it
/// instead, whose last bytes hold its rings if there is room; a resuming one gets the
/// slot it had.
pub(crate) fn place_data_plane<'q>(
    hello: &mut Hello,
    fd: Option<OwnedFd>,
    parked: &mut Option<crate::migrate::Parked>,
    guest_w: &Mutex<GuestOut>,
    ctx: &Context<'q>,
) -> Result<DataPlane<'q>, SessionError> {
    let (id, vm, queue) = (ctx.id, ctx.vm, ctx.queue);
    // Rings: host-local, for a guest that can pass descriptors (it sent its window);
    // in a VM, at the end of the session's window slot (below).
    let local_rings = hello.rings && fd.is_some();
    hello.ring_offset = 0;
    let mut lease = None;
    hello.window_offset = 0;
    let window: Option<OwnedFd> = match fd {
        Some(fd) => {
            let ok = hello.window_len > 0
                && hello.window_len <= ctx.config.max_window
                && sealed_of_size(&fd, hello.window_len);
            if !ok {
                warn!(
                    "VM {vm:?} session {id}: data window refused (announced {} bytes)",
                    hello.window_len
                );
            }
            ok.then_some(fd)
        }
        None if hello.vm_window && parked.is_some() => {
            // A VM session resuming: in its slot, where its rings are.
            let reserved = parked.as_mut().and_then(crate::migrate::Parked::take_slot);
            let slot = reserved.and_then(|(s, _)| {
                let w = queue.window.get()?;
                Some((s, w.lease_reserved(s.offset, s.len)?, w.open().ok()?))
            });
            match slot {
                Some((s, l, fd)) => {
                    hello.window_len = s.window_len;
                    hello.window_offset = s.offset;
                    hello.ring_offset = s.ring_offset;
                    lease = Some(l);
                    Some(fd)
                }
                None => {
                    let m = "the suspended session's window slot is not kept here";
                    send_error(guest_w, None, error_code::HANDSHAKE, m);
                    return Err(SessionError::Refused(m.into()));
                }
            }
        }
        None if hello.vm_window => {
            let slot = queue.window.get().and_then(|w| {
                // A slot held by an ending session frees within the teardown
                // grace, after which its API server is killed.
                let wait = ctx.config.limits.teardown_grace + std::time::Duration::from_secs(1);
                w.lease_within(wait).zip(w.open().ok())
            });
            match slot {
                Some((l, fd)) => {
                    hello.window_len = l.len;
                    hello.window_offset = l.offset;
                    // The slot's last bytes hold the rings, if it has room for them
                    // beside a window of at least a mebibyte.
                    let rings_len = hira_ring::region_len(hira_ring::DEFAULT_CAPACITY) as u64;
                    if hello.rings && l.len >= rings_len + (1 << 20) {
                        hello.window_len = l.len - rings_len;
                        hello.ring_offset = l.offset + hello.window_len;
                    }
                    lease = Some(l);
                    Some(fd)
                }
                None => None,
            }
        }
        None => None,
    };
    hello.vm_window = false;
    if window.is_none() {
        hello.window_len = 0;
    }
    let vm_rings = hello.ring_offset > 0;
    hello.rings = local_rings || vm_rings;
    let asks_resend = std::mem::take(&mut hello.resend);
    Ok(DataPlane {
        window,
        lease,
        local_rings,
        vm_rings,
        asks_resend,
    })
}

/// Admits the session under its VM's cap on sessions (its own, else the daemon's):
/// the slot it holds until it ends.
pub(crate) fn admit(
    guest_w: &Mutex<GuestOut>,
    ctx: &Context<'_>,
) -> Result<crate::vms::SessionSlot, SessionError> {
    let max = ctx
        .queue
        .max_sessions()
        .unwrap_or(ctx.config.limits.max_sessions_per_vm);
    ctx.queue.open_session(max).ok_or_else(|| {
        let m = format!("VM {:?} has its maximum of {max} sessions", ctx.vm);
        send_error(guest_w, None, error_code::POLICY, &m);
        SessionError::Refused(m)
    })
}

/// What the API server's handshake settled.
pub(crate) struct Introduced {
    /// The hello the API server got, as it got it (a migration hands it to the next).
    pub hello: (FrameHeader, Vec<u8>),
    /// The data window, kept for the API server a migration starts.
    pub keep_window: Option<OwnedFd>,
    /// What the API server answered, and the ring descriptors it passed.
    pub server_welcome: Welcome,
    pub ring_fds: Vec<OwnedFd>,
    /// What the guest was sent.
    pub welcome: Welcome,
    /// Both ends keep the relayed stream.
    pub resend: bool,
}

/// Hands the API server the hello (after the snapshot, for a resumed session), takes
/// its welcome, checks the data plane it set up against the one placed, and welcomes
/// the guest with it. An API server that refuses has its reason passed to the guest;
/// a resumed session's snapshot then stays parked for the guest's next try.
#[allow(clippy::too_many_arguments)]
pub(crate) fn introduce(
    server: &mut UnixStream,
    guest_w: &Mutex<GuestOut>,
    (header, hello): (FrameHeader, &Hello),
    window: Option<OwnedFd>,
    (parked, guest_rings): (&mut Option<crate::migrate::Parked>, &[OwnedFd]),
    (local_rings, vm_rings, asks_resend): (bool, bool, bool),
    token: hira_protocol::handshake::Token,
    ctx: &Context<'_>,
) -> Result<Introduced, SessionError> {
    let hello_bytes = hello.encode();
    let h = FrameHeader {
        len: hello_bytes.len() as u32,
        ..header
    };
    if let Some(p) = &parked {
        // The API server restores the session before it answers.
        let mut fds = vec![&p.snapshot];
        fds.extend(guest_rings.iter());
        let ah = FrameHeader::new(FrameKind::Notify, migrate::ADOPT, 0, 0, 0);
        unix::send_frame_with_fds(server, &ah, &[], &fds)?;
    }
    unix::send_frame_with_fd(server, &h, &hello_bytes, window.as_ref())?;
    // A host-local session on rings can migrate: the next API server gets the
    // same window, hello and data plane.
    let keep_window = window.as_ref().map(OwnedFd::try_clone).transpose()?;
    drop(window);
    let (rh, rp, ring_fds) =
        unix::recv_frame_with_fds(server).map_err(|e| SessionError::Handshake(e.to_string()))?;
    if rh.kind != FrameKind::Welcome {
        let m = ErrorPayload::decode(&rp)
            .map(|e| e.message)
            .unwrap_or_default();
        send_error(guest_w, None, error_code::HANDSHAKE, &m);
        if let Some(p) = parked.take() {
            // The guest may try again; the snapshot stays parked.
            ctx.life.park(p);
        }
        return Err(SessionError::Handshake(format!("API server refused: {m}")));
    }
    let server_welcome =
        Welcome::decode(&rp).map_err(|e| SessionError::Handshake(e.to_string()))?;
    // The data plane: the API server's ring region and eventfds go to the guest
    // as they came; from then on the daemon carries no frame of this session.
    let rings = server_welcome.ring_capacity > 0;
    let fds_expected = if rings && local_rings && parked.is_none() {
        1 + hira_ring::EVENTFDS
    } else {
        0
    };
    if ring_fds.len() != fds_expected || (rings && !hello.rings) {
        let m = "the API server's data plane is inconsistent";
        send_error(guest_w, None, error_code::HANDSHAKE, m);
        return Err(SessionError::Handshake(m.into()));
    }
    // A relayed guest that keeps its stream gets it kept here too.
    let resend = asks_resend && !rings;
    let welcome = Welcome {
        version: hira_protocol::handshake::VERSION,
        session: ctx.id,
        vm_name: ctx.vm.to_string(),
        window_len: server_welcome.window_len,
        window_offset: if server_welcome.window_len > 0 {
            hello.window_offset
        } else {
            0
        },
        ring_capacity: server_welcome.ring_capacity,
        ring_offset: if rings && vm_rings {
            hello.ring_offset
        } else {
            0
        },
        token,
        resend,
        taken: 0,
    };
    let welcome_bytes = welcome.encode();
    let wh = FrameHeader::new(FrameKind::Welcome, 0, 0, 0, welcome_bytes.len());
    {
        let mut g = guest_w.lock().unwrap_or_else(|e| e.into_inner());
        let fds: Vec<&OwnedFd> = ring_fds.iter().collect();
        unix::send_frame_with_fds(g.get_mut(), &wh, &welcome_bytes, &fds)?;
        if resend {
            g.enable(resend::DAEMON_KEEPS);
        }
    }
    Ok(Introduced {
        hello: (h, hello_bytes),
        keep_window,
        server_welcome,
        ring_fds,
        welcome,
        resend,
    })
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::Arc;
    use std::time::Duration;

    use hira_protocol::resend::Resending;

    use super::*;
    use crate::config::Config;
    use crate::vms::{Vm, Vms};

    struct World {
        config: Config,
        queue: Arc<Vm>,
        life: Arc<Lifecycle>,
    }

    impl World {
        fn new() -> World {
            World {
                config: Config::default(),
                queue: Vms::default().vm("vm1"),
                life: Arc::new(Lifecycle::default()),
            }
        }

        fn ctx(&self) -> Context<'_> {
            Context {
                id: 1,
                vm: "vm1",
                config: &self.config,
                queue: &self.queue,
                life: &self.life,
            }
        }
    }

    /// The daemon's end of a guest connection, and the guest's.
    fn connection() -> (UnixStream, Mutex<GuestOut>, UnixStream) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let w = Mutex::new(Resending::plain(ours.try_clone().unwrap()));
        (ours, w, theirs)
    }

    fn send(to: &mut UnixStream, kind: FrameKind, payload: &[u8], fd: Option<&OwnedFd>) {
        let h = FrameHeader::new(kind, 0, 0, 0, payload.len());
        unix::send_frame_with_fd(to, &h, payload, fd).unwrap();
    }

    /// The `Error` frame the guest was sent: its code and message.
    fn refusal(guest: &mut UnixStream) -> (u32, String) {
        let (h, p, _) = unix::recv_frame_with_fds(guest).unwrap();
        assert_eq!(h.kind, FrameKind::Error);
        let e = hira_protocol::handshake::ErrorPayload::decode(&p).unwrap();
        (e.code, e.message)
    }

    fn memfd(len: u64, seal: bool) -> OwnedFd {
        let seals = if seal {
            hira_protocol::shm::NO_SHRINK
        } else {
            0
        };
        hira_protocol::shm::memfd(c"test", len, seals).unwrap()
    }

    #[test]
    fn a_hello_is_read_and_anything_else_is_refused_with_the_reason() {
        let w = World::new();
        let (mut ours, out, mut guest) = connection();
        let hello = Hello::new(hira_apis_opencl::API, 7, "app", 0);
        send(&mut guest, FrameKind::Hello, &hello.encode(), None);
        let g = receive_hello(&mut ours, &out, &w.ctx()).unwrap().unwrap();
        assert_eq!((g.api.name, g.hello.pid, g.fds.len()), ("OpenCL", 7, 0));

        let (mut ours, out, guest) = connection();
        drop(guest);
        assert!(receive_hello(&mut ours, &out, &w.ctx()).unwrap().is_none());

        let (mut ours, out, mut guest) = connection();
        send(&mut guest, FrameKind::Request, &[], None);
        let e = receive_hello(&mut ours, &out, &w.ctx()).unwrap_err();
        assert!(matches!(e, SessionError::Handshake(m) if m.contains("Hello")));
        assert_eq!(refusal(&mut guest).0, error_code::HANDSHAKE);

        let (mut ours, out, mut guest) = connection();
        let mut hello = Hello::new(hira_apis_opencl::API, 7, "app", 0).encode();
        hello[6] = 99; // the API's number
        send(&mut guest, FrameKind::Hello, &hello, None);
        let e = receive_hello(&mut ours, &out, &w.ctx()).unwrap_err();
        assert!(e.to_string().contains("not an API"), "{e}");

        let mut w = World::new();
        w.config.limits.handshake_timeout = Duration::from_millis(20);
        let (mut ours, out, mut guest) = connection();
        guest.write_all(b"HI").unwrap();
        let e = receive_hello(&mut ours, &out, &w.ctx()).unwrap_err();
        assert!(matches!(e, SessionError::HandshakeTimeout(_)), "{e}");
        assert_eq!(refusal(&mut guest).1, "no hello in time");
    }

    #[test]
    fn a_guests_window_is_taken_only_sealed_within_the_limit_and_of_its_announced_size() {
        let mut w = World::new();
        w.config.max_window = 4 << 20;
        let (_ours, out, _guest) = connection();
        let place = |len: u64, fd: OwnedFd| {
            let mut hello = Hello::new(hira_apis_opencl::API, 1, "app", len);
            hello.rings = true;
            let d = place_data_plane(&mut hello, Some(fd), &mut None, &out, &w.ctx()).unwrap();
            (d.window.is_some(), d.local_rings, hello.window_len)
        };
        assert_eq!(place(1 << 20, memfd(1 << 20, true)), (true, true, 1 << 20));
        assert_eq!(place(1 << 20, memfd(1 << 20, false)), (false, true, 0));
        assert_eq!(place(1 << 20, memfd(2 << 20, true)), (false, true, 0));
        let over = w.config.max_window + 4096;
        assert!(!place(over, memfd(over, true)).0);
    }

    #[test]
    fn a_vm_guest_leases_a_slot_with_its_rings_at_the_end_until_the_slots_run_out() {
        let w = World::new();
        let dir = tempfile::tempdir().unwrap();
        let window = crate::window::VmWindow::create(&dir.path().join("w"), 16 << 20, 2).unwrap();
        let _ = w.queue.window.set(window);
        let (_ours, out, _guest) = connection();
        let vm_hello = || {
            let mut h = Hello::new(hira_apis_opencl::API, 1, "app", 0);
            h.vm_window = true;
            h.rings = true;
            h
        };
        let rings_len = hira_ring::region_len(hira_ring::DEFAULT_CAPACITY) as u64;
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut h = vm_hello();
            let d = place_data_plane(&mut h, None, &mut None, &out, &w.ctx()).unwrap();
            let lease = d.lease.as_ref().unwrap();
            assert!(d.vm_rings && !d.local_rings && h.rings);
            assert_eq!(h.window_len, lease.len - rings_len);
            assert_eq!(h.ring_offset, lease.offset + h.window_len);
            assert!(!h.vm_window);
            held.push(d);
        }
        // No slot left: the session's frames are relayed, without a window.
        let mut h = vm_hello();
        let d = place_data_plane(&mut h, None, &mut None, &out, &w.ctx()).unwrap();
        assert!(d.window.is_none() && d.lease.is_none() && !d.vm_rings && !h.rings);
        assert_eq!(h.window_len, 0);
        drop(held);
        let d = place_data_plane(&mut vm_hello(), None, &mut None, &out, &w.ctx()).unwrap();
        assert!(d.lease.is_some());
    }

    #[test]
    fn resumes_without_a_parked_session_and_new_sessions_passing_rings_are_refused() {
        let w = World::new();
        let (_ours, out, mut guest) = connection();
        let mut hello = Hello::new(hira_apis_opencl::API, 1, "app", 0);
        hello.resume = Some([7; 16]);
        let e = take_parked(&mut hello, &[], &out, &w.ctx()).unwrap_err();
        assert!(e.to_string().contains("no suspended session"), "{e}");
        assert!(hello.resume.is_none());
        assert_eq!(refusal(&mut guest).0, error_code::HANDSHAKE);
        let e = take_parked(&mut hello, &[memfd(4096, true)], &out, &w.ctx()).unwrap_err();
        assert!(e.to_string().contains("at most its window"), "{e}");
        assert!(
            take_parked(&mut hello, &[], &out, &w.ctx())
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn sessions_are_admitted_up_to_the_vms_cap() {
        let w = World::new();
        w.queue.set_max_sessions(1);
        let (_ours, out, mut guest) = connection();
        let first = admit(&out, &w.ctx()).unwrap();
        let e = admit(&out, &w.ctx()).unwrap_err();
        assert!(e.to_string().contains("maximum of 1"), "{e}");
        assert_eq!(refusal(&mut guest).0, error_code::POLICY);
        drop(first);
        assert!(admit(&out, &w.ctx()).is_ok());
    }
}
