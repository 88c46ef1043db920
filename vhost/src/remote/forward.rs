//! A VM host's end of a session placed on a GPU host.
//!
//! The daemon takes the guest's `Hello` as for any session and admits it under the
//! VM's cap here. It then picks the GPU host: the VM's own, or with `auto` each GPU
//! host of the configuration in the order of what they can take (those being drained
//! left out), this host last. It opens a TLS connection to it (whose certificate must
//! hold that host's configured name), names the VM, and passes the `Hello` on with no
//! window and no rings asked for: the session is relayed end to end. The GPU host's
//! `Welcome` reaches the guest with this daemon's session number and VM name. From
//! then on the pump carries the bytes both ways until either end goes; a GPU host that
//! goes leaves the guest an error frame rather than a hang.
//!
//! A GPU host that hands the session to another (`hira-ctl migrate --to GPU-HOST`,
//! `hira-ctl drain`) tells the guest `MOVED` naming the new one; this daemon keeps
//! that name under the session's token and tells the guest to reconnect where it did.
//! The guest's resuming `Hello` then goes to the new GPU host, which resumes it.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Mutex;

use hira_protocol::frame::HEADER_LEN;
use hira_protocol::handshake::{ErrorPayload, Hello, Token, Welcome, error_code};
use hira_protocol::{FrameHeader, FrameKind};
use log::{info, warn};

use super::pump::{End, Local, Pump, TlsLink, unchanged};
use super::{AUTO, MOVED_TO};
use crate::config::GpuHost;
use crate::lifecycle::{EndedSession, Registration};
use crate::session::handshake::{Greeting, admit};
use crate::session::{Context, GuestOut, SessionError, send_error};

/// The most a GPU host's first frame (its `Welcome` or an `Error`) may hold.
const FIRST_FRAME_MAX: usize = 64 * 1024;

/// The GPU hosts to try for this session, in order, and whether this host serves it
/// when none takes it.
fn candidates<'a>(
    placement: &str,
    resume: Option<&Token>,
    ctx: &Context<'a>,
) -> (Vec<&'a GpuHost>, bool) {
    let remote = &ctx.config.remote;
    if let Some(gpu) = resume
        .and_then(|t| ctx.life.moved_to(t))
        .and_then(|g| remote.known(&g).ok())
    {
        return (vec![gpu], false);
    }
    if placement != AUTO {
        return (remote.known(placement).into_iter().collect(), false);
    }
    (super::client::ranked(ctx.config), true)
}

/// Serves one session of a VM placed as `placement` (a GPU host's name or `auto`) to
/// its end. `Ok(Some(greeting))`: no GPU host took it and it is this host's to serve.
pub(crate) fn run(
    guest: &UnixStream,
    guest_w: &Mutex<GuestOut>,
    greeting: Greeting,
    placement: &str,
    ctx: &Context<'_>,
    registration: &mut Registration,
) -> Result<Option<Greeting>, SessionError> {
    let (id, vm) = (ctx.id, ctx.vm);
    let header = greeting.header;
    let mut hello = greeting.hello.clone();
    relayed(&mut hello);
    let (gpus, local_fallback) = candidates(placement, hello.resume.as_ref(), ctx);
    let refuse = |why: String| {
        send_error(guest_w, Some(&header), error_code::SERVER_GONE, &why);
        SessionError::Refused(why)
    };
    let payload = hello.encode();
    let h = FrameHeader::new(FrameKind::Hello, 0, 0, header.call_id, payload.len());
    let mut last_refusal: Option<Vec<u8>> = None;
    let mut placed = None;
    for gpu in &gpus {
        let mut link = match super::client::connect(ctx.config, gpu) {
            Ok(l) => l,
            Err(e) => {
                let why = format!(
                    "GPU host {:?} ({}) cannot be reached: {e}",
                    gpu.name, gpu.address
                );
                warn!("VM {vm:?} session {id}: {why}");
                last_refusal = Some(crate::session::error_frame(
                    Some(&header),
                    error_code::SERVER_GONE,
                    &why,
                ));
                continue;
            }
        };
        let mut first = super::preamble(vm);
        first.extend_from_slice(&h.encode());
        first.extend_from_slice(&payload);
        match link.write_all(&first).and_then(|()| read_frame(&mut link)) {
            Ok((wh, body)) if wh.kind == FrameKind::Welcome => {
                placed = Some((*gpu, link, wh, body));
                break;
            }
            Ok((eh, body)) => {
                // Refused there (its cap, its policy, a drain, no device): the next
                // one is asked, or the guest gets this answer as it came.
                let why = ErrorPayload::decode(&body).map_or_else(|_| "?".into(), |e| e.message);
                info!(
                    "VM {vm:?} session {id}: GPU host {:?} refused: {why}",
                    gpu.name
                );
                let mut frame = eh.encode().to_vec();
                frame.extend_from_slice(&body);
                last_refusal = Some(frame);
            }
            Err(e) => {
                let why = format!("GPU host {:?} did not answer: {e}", gpu.name);
                warn!("VM {vm:?} session {id}: {why}");
                last_refusal = Some(crate::session::error_frame(
                    Some(&header),
                    error_code::SERVER_GONE,
                    &why,
                ));
            }
        }
    }
    let Some((gpu, mut link, wh, body)) = placed else {
        if local_fallback {
            info!("VM {vm:?} session {id}: no GPU host took it; served on this host");
            return Ok(Some(greeting));
        }
        let frame = last_refusal.unwrap_or_else(|| {
            crate::session::error_frame(
                Some(&header),
                error_code::SERVER_GONE,
                &format!("no GPU host {placement:?} is configured"),
            )
        });
        let _ = crate::session::relay::guest_lock(guest_w).write_all(&frame);
        return Err(SessionError::Refused(format!(
            "no GPU host took the session ({placement})"
        )));
    };
    let Greeting {
        hello: guest_hello,
        api,
        fds,
        ..
    } = greeting;
    // A host-local guest's rings end here, in the pump, as a local session's end in
    // its API server; its window does not cross hosts (it sends its data inline on
    // the rings). A VM's rings lie in its window's slot: it sends on its socket.
    let mut rings = guest_rings(&guest_hello, fds, guest)
        .inspect_err(|e| warn!("VM {vm:?} session {id}: no rings, frames go on the socket: {e}"))
        .ok()
        .flatten();
    let _slot = admit(guest_w, ctx)?;
    let mut welcome = Welcome::decode(&body).map_err(|e| {
        refuse(format!(
            "GPU host {:?} sent a malformed welcome: {e}",
            gpu.name
        ))
    })?;
    let remote_session = welcome.session;
    let token = welcome.token;
    let welcome_resend = welcome.resend;
    welcome.session = id;
    welcome.vm_name = vm.to_string();
    welcome.window_len = 0;
    welcome.ring_capacity = if rings.is_some() {
        hira_ring::DEFAULT_CAPACITY as u64
    } else {
        0
    };
    welcome.ring_offset = 0;
    welcome.resend = false;
    let payload = welcome.encode();
    let welcome_header = FrameHeader::new(FrameKind::Welcome, 0, 0, wh.call_id, payload.len());
    {
        let mut g = crate::session::relay::guest_lock(guest_w);
        let give: Vec<&OwnedFd> = rings.iter().flat_map(|(_, give)| give.iter()).collect();
        hira_protocol::unix::send_frame_with_fds(g.get_mut(), &welcome_header, &payload, &give)?;
    }
    registration.describe(api.name, &guest_hello.process_name, guest_hello.pid, 0);
    registration.placed(&gpu.name);
    registration.serving();
    info!(
        "VM {vm:?} session {id}: {} (guest pid {}) -> GPU host {:?} session {remote_session}{}",
        guest_hello.process_name,
        guest_hello.pid,
        gpu.name,
        if hello.resume.is_some() {
            ", resuming"
        } else {
            ""
        }
    );
    let moved_to: std::cell::RefCell<Option<String>> = std::cell::RefCell::new(None);
    let mut on_error = |eh: FrameHeader, p: Vec<u8>| {
        // A move to another GPU host: kept under the token, and the guest reconnects
        // here.
        match ErrorPayload::decode(&p) {
            Ok(e) if e.code == error_code::MOVED => match e.message.strip_prefix(MOVED_TO) {
                Some(next) => {
                    ctx.life.remember_move(token, next);
                    *moved_to.borrow_mut() = Some(next.to_string());
                    let here = ErrorPayload {
                        code: error_code::MOVED,
                        message: String::new(),
                    }
                    .encode();
                    unchanged(
                        FrameHeader::new(FrameKind::Error, eh.opcode, eh.channel, 0, here.len()),
                        here,
                    )
                }
                None => unchanged(eh, p),
            },
            _ => unchanged(eh, p),
        }
    };
    let mut pump = if welcome_resend {
        Pump::kept()
    } else {
        Pump::plain()
    };
    super::widen(guest);
    let on_rings = if rings.is_some() { " on rings" } else { "" };
    let mut local = match &mut rings {
        Some((ends, _)) => Local::Rings { ends, guest },
        None => Local::Socket(guest),
    };
    let mut reconnections = 0u32;
    let how = loop {
        let end = pump.run(&mut local, &mut link, &mut on_error);
        if let Some(next) = moved_to.borrow().as_ref() {
            break format!("moved to GPU host {next:?}");
        }
        match end {
            End::Local => break "the guest closed".to_string(),
            End::Peer { error: None, .. } => {
                // The GPU host ended the session (its API server went, say) and said
                // so to the guest itself.
                break format!("GPU host {:?} closed the session", gpu.name);
            }
            End::Peer { error: Some(e), .. } => {
                warn!(
                    "VM {vm:?} session {id}: the connection to GPU host {:?} failed: {e}",
                    gpu.name
                );
                let resumed = pump
                    .kept_stream()
                    .ok_or_else(|| "its stream was not kept".to_string())
                    .and_then(|k| reconnect(ctx, gpu, &hello, token, k));
                match resumed {
                    Ok(l) => {
                        link = l;
                        reconnections += 1;
                        ctx.life
                            .reconnections
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        info!(
                            "VM {vm:?} session {id}: connected to GPU host {:?} again; the stream goes on",
                            gpu.name
                        );
                    }
                    Err(why) => {
                        let why = format!(
                            "the connection to GPU host {:?} failed: {e} (not resumed: {why})",
                            gpu.name
                        );
                        let _ = pump.flush(&mut local);
                        if pump.at_frame() {
                            send_error(guest_w, None, error_code::SERVER_GONE, &why);
                        }
                        break why;
                    }
                }
            }
        }
    };
    let how = if reconnections > 0 {
        format!("{how}, after {reconnections} reconnection(s)")
    } else {
        how
    };
    let _ = guest.set_nonblocking(false);
    let _ = guest.shutdown(std::net::Shutdown::Both);
    info!(
        "VM {vm:?} session {id}: ended on GPU host {:?} ({how})",
        gpu.name
    );
    registration.ended(EndedSession {
        api: api.name.to_string(),
        process: guest_hello.process_name.clone(),
        api_server_end: how,
        data_plane: format!("remote {}{on_rings}", gpu.name),
        ..EndedSession::default()
    });
    Ok(None)
}

/// The host end of a host-local guest's rings, and the descriptors its `Welcome`
/// carries to the guest: a fresh region and eventfds, or none for a guest that
/// resumes with the rings it has (moved to another GPU host, it goes on with them).
/// `None`: the guest asked for none, or is in a VM.
fn guest_rings(
    hello: &Hello,
    fds: Vec<OwnedFd>,
    guest: &UnixStream,
) -> std::io::Result<Option<(hira_ring::Ends, Vec<OwnedFd>)>> {
    if !hello.rings || hello.vm_window {
        return Ok(None);
    }
    let mut fds = fds.into_iter();
    if hello.window_len > 0 {
        // Its window, of no use on another host.
        fds.next();
    }
    let adopted: Vec<OwnedFd> = fds.collect();
    if hello.resume.is_some() && !adopted.is_empty() {
        let bells = &adopted[1..];
        if bells.len() != hira_ring::EVENTFDS || !bells.iter().all(is_eventfd) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the guest's ring descriptors are not its region and eventfds",
            ));
        }
        for b in bells {
            // This side never blocks on them, whatever the guest set.
            nix::fcntl::fcntl(
                b,
                nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
            )?;
        }
        let ends = hira_ring::adopt_server_rings(adopted, guest.as_raw_fd())?;
        return Ok(Some((ends, Vec::new())));
    }
    let (ends, region_fd, bells) = hira_ring::new_server_rings(guest.as_raw_fd())?;
    let mut give = vec![region_fd];
    give.extend(bells);
    Ok(Some((ends, give)))
}

/// Whether `fd` is an eventfd (a guest's descriptor is checked before this daemon
/// reads from it or polls it: a pipe or a file would block or spin the pump).
fn is_eventfd(fd: &OwnedFd) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .is_ok_and(|l| l.as_os_str() == "anon_inode:[eventfd]")
}

/// Asks for what crosses hosts: no window, no rings, and a stream both ends keep
/// (`resend`), this daemon keeping the guest's end of it; a resumption, by its token,
/// goes along.
fn relayed(hello: &mut Hello) {
    hello.window_len = 0;
    hello.vm_window = false;
    hello.window_offset = 0;
    hello.rings = false;
    hello.ring_offset = 0;
    hello.resend = true;
    hello.taken = 0;
}

/// Connects to `gpu` again after the session's connection failed, within the
/// configured timeout, and goes on with its kept stream: the GPU host keeps the
/// session for its VM host's return, says what it took, and each end sends again
/// what the other did not take.
fn reconnect(
    ctx: &Context<'_>,
    gpu: &GpuHost,
    first_hello: &Hello,
    token: Token,
    kept: &super::pump::Kept,
) -> Result<TlsLink, String> {
    let deadline = std::time::Instant::now() + ctx.config.remote.timeout;
    let mut hello = first_hello.clone();
    hello.resume = Some(token);
    hello.resend = true;
    hello.taken = kept.taken;
    loop {
        let last = match resume_at(ctx, gpu, &hello, kept) {
            Ok(link) => return Ok(link),
            Err(e) => e,
        };
        if std::time::Instant::now() >= deadline {
            return Err(last);
        }
        // The GPU host may not have seen the cut yet: it keeps the session only once
        // it has.
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// One attempt of [`reconnect`].
fn resume_at(
    ctx: &Context<'_>,
    gpu: &GpuHost,
    hello: &Hello,
    kept: &super::pump::Kept,
) -> Result<TlsLink, String> {
    let mut link = super::client::connect(ctx.config, gpu).map_err(|e| e.to_string())?;
    let payload = hello.encode();
    let mut first = super::preamble(ctx.vm);
    first.extend_from_slice(&FrameHeader::new(FrameKind::Hello, 0, 0, 0, payload.len()).encode());
    first.extend_from_slice(&payload);
    link.write_all(&first).map_err(|e| e.to_string())?;
    let (h, body) = read_frame(&mut link).map_err(|e| e.to_string())?;
    if h.kind != FrameKind::Welcome {
        return Err(ErrorPayload::decode(&body).map_or_else(|_| "refused".into(), |e| e.message));
    }
    let w = Welcome::decode(&body).map_err(|e| e.to_string())?;
    let again = kept.since(w.taken).map_err(|e| e.to_string())?;
    link.write_all(&again).map_err(|e| e.to_string())?;
    Ok(link)
}

/// Reads one frame whole.
fn read_frame(link: &mut TlsLink) -> std::io::Result<(FrameHeader, Vec<u8>)> {
    let mut hb = [0u8; HEADER_LEN];
    link.read_exact(&mut hb)?;
    let h = FrameHeader::decode(&hb).map_err(std::io::Error::other)?;
    if h.len as usize > FIRST_FRAME_MAX {
        return Err(std::io::Error::other("its first frame is too large"));
    }
    let mut body = vec![0u8; h.len as usize];
    link.read_exact(&mut body)?;
    Ok((h, body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hira_protocol::handshake::{ApiId, Hello};

    fn resuming(window_len: u64) -> Hello {
        let mut h = Hello::new(ApiId(1), 1, "t", window_len);
        h.rings = true;
        h.resume = Some([7; 16]);
        h
    }

    fn dup(fds: &[OwnedFd]) -> Vec<OwnedFd> {
        fds.iter().map(|f| f.try_clone().unwrap()).collect()
    }

    #[test]
    fn a_guests_rings_are_made_here_or_taken_back_only_as_a_sealed_region_and_eventfds() {
        let (guest, _daemon) = UnixStream::pair().unwrap();
        // A fresh session: a new region and eventfds go to the guest.
        let mut fresh = Hello::new(ApiId(1), 1, "t", 0);
        fresh.rings = true;
        let (_, give) = guest_rings(&fresh, vec![], &guest).unwrap().unwrap();
        assert_eq!(give.len(), 1 + hira_ring::EVENTFDS);
        assert!(give[1..].iter().all(is_eventfd));
        // A VM's rings, or none asked for: none here.
        let mut vm = fresh.clone();
        vm.vm_window = true;
        assert!(guest_rings(&vm, vec![], &guest).unwrap().is_none());
        let mut none = fresh.clone();
        none.rings = false;
        assert!(guest_rings(&none, vec![], &guest).unwrap().is_none());
        // Resuming with the rings it was given: taken back, nothing to give.
        let (_, again) = guest_rings(&resuming(0), dup(&give), &guest)
            .unwrap()
            .unwrap();
        assert!(again.is_empty());
        // A pipe where an eventfd belongs (this side would block reading it): refused.
        let (r, _w) = nix::unistd::pipe().unwrap();
        let mut forged = dup(&give[..4]);
        forged.push(r);
        assert!(guest_rings(&resuming(0), forged, &guest).is_err());
        // Too few descriptors, or a region not sealed against shrinking: refused.
        assert!(guest_rings(&resuming(0), dup(&give[..3]), &guest).is_err());
        let unsealed = hira_protocol::shm::memfd(
            c"not-sealed",
            hira_ring::region_len(hira_ring::DEFAULT_CAPACITY) as u64,
            0,
        )
        .unwrap();
        let mut forged = vec![unsealed];
        forged.extend(dup(&give[1..]));
        assert!(guest_rings(&resuming(0), forged, &guest).is_err());
    }
}
