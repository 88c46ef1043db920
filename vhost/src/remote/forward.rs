//! A VM host's end of a session placed on a GPU host.
//!
//! The daemon takes the guest's `Hello` as for any session and admits it under the
//! VM's cap here. It then opens a TLS connection to the VM's GPU host (whose
//! certificate must hold that host's configured name), names the VM, and passes the
//! `Hello` on with no window and no rings asked for: the session is relayed end to
//! end. The GPU host's `Welcome` reaches the guest with this daemon's session number
//! and VM name, and no resume token (a placed session is not suspended or moved
//! here). From then on the pump carries the bytes both ways until either end goes;
//! a GPU host that goes leaves the guest an error frame rather than a hang.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::Mutex;

use hira_protocol::frame::HEADER_LEN;
use hira_protocol::handshake::{Hello, Welcome, error_code};
use hira_protocol::{FrameHeader, FrameKind};
use log::{info, warn};

use super::pump::{End, TlsLink, pump};
use super::tls::server_name;
use crate::config::GpuHost;
use crate::lifecycle::{EndedSession, Registration};
use crate::session::handshake::{Greeting, admit};
use crate::session::{Context, GuestOut, SessionError, send_error};

/// The most a GPU host's first frame (its `Welcome` or an `Error`) may hold.
const FIRST_FRAME_MAX: usize = 64 * 1024;

/// Serves one session of a VM placed on `gpu`, to its end.
pub(crate) fn run(
    guest: UnixStream,
    guest_w: &Mutex<GuestOut>,
    greeting: Greeting,
    gpu: &GpuHost,
    ctx: &Context<'_>,
    registration: &mut Registration,
) -> Result<(), SessionError> {
    let Greeting {
        header,
        mut hello,
        api,
        fds,
    } = greeting;
    // A host-local guest's window descriptor is of no use on another host.
    drop(fds);
    let (id, vm) = (ctx.id, ctx.vm);
    let _slot = admit(guest_w, ctx)?;
    let refuse = |why: String| {
        send_error(guest_w, Some(&header), error_code::SERVER_GONE, &why);
        SessionError::Refused(why)
    };
    let mut link = connect(gpu, ctx).map_err(|e| {
        refuse(format!(
            "GPU host {:?} ({}) cannot be reached: {e}",
            gpu.name, gpu.address
        ))
    })?;
    relayed(&mut hello);
    let payload = hello.encode();
    let h = FrameHeader::new(FrameKind::Hello, 0, 0, header.call_id, payload.len());
    let mut first = super::preamble(vm);
    first.extend_from_slice(&h.encode());
    first.extend_from_slice(&payload);
    let answer = link
        .write_all(&first)
        .and_then(|()| read_frame(&mut link))
        .map_err(|e| refuse(format!("GPU host {:?} did not answer: {e}", gpu.name)))?;
    let (h, body) = answer;
    if h.kind != FrameKind::Welcome {
        // The GPU host refused (its cap, its policy, no device): the guest gets its
        // answer as it gave it.
        let mut frame = h.encode().to_vec();
        frame.extend_from_slice(&body);
        let _ = crate::session::relay::guest_lock(guest_w).write_all(&frame);
        return Err(SessionError::Refused(format!(
            "GPU host {:?} refused the session",
            gpu.name
        )));
    }
    let mut welcome = Welcome::decode(&body).map_err(|e| {
        refuse(format!(
            "GPU host {:?} sent a malformed welcome: {e}",
            gpu.name
        ))
    })?;
    let remote_session = welcome.session;
    welcome.session = id;
    welcome.vm_name = vm.to_string();
    welcome.token = [0; 16];
    welcome.window_len = 0;
    welcome.ring_capacity = 0;
    welcome.resend = false;
    let payload = welcome.encode();
    let mut frame = FrameHeader::new(FrameKind::Welcome, 0, 0, h.call_id, payload.len())
        .encode()
        .to_vec();
    frame.extend_from_slice(&payload);
    crate::session::relay::guest_lock(guest_w).write_all(&frame)?;
    registration.describe(api.name, &hello.process_name, hello.pid, 0);
    registration.placed(&gpu.name);
    registration.serving();
    info!(
        "VM {vm:?} session {id}: {} (guest pid {}) -> GPU host {:?} session {remote_session}",
        hello.process_name, hello.pid, gpu.name
    );
    let end = pump(&guest, &mut link);
    let _ = guest.set_nonblocking(false);
    let how = match end {
        End::Local => "the guest closed".to_string(),
        End::Peer { at_frame, error } => {
            let why = match &error {
                Some(e) => format!("the connection to GPU host {:?} failed: {e}", gpu.name),
                None => format!("GPU host {:?} closed the session", gpu.name),
            };
            if error.is_some() {
                warn!("VM {vm:?} session {id}: {why}");
            }
            if at_frame {
                send_error(guest_w, None, error_code::SERVER_GONE, &why);
            }
            why
        }
    };
    let _ = guest.shutdown(std::net::Shutdown::Both);
    info!(
        "VM {vm:?} session {id}: ended on GPU host {:?} ({how})",
        gpu.name
    );
    registration.ended(EndedSession {
        api: api.name.to_string(),
        process: hello.process_name.clone(),
        api_server_end: how,
        data_plane: format!("remote {}", gpu.name),
        ..EndedSession::default()
    });
    Ok(())
}

/// Asks for what crosses hosts: no window, no rings, no resumption.
fn relayed(hello: &mut Hello) {
    hello.window_len = 0;
    hello.vm_window = false;
    hello.window_offset = 0;
    hello.rings = false;
    hello.ring_offset = 0;
    hello.resume = None;
    hello.resend = false;
    hello.taken = 0;
}

/// Opens an authenticated connection to `gpu` within the handshake deadline.
fn connect(gpu: &GpuHost, ctx: &Context<'_>) -> std::io::Result<TlsLink> {
    let tls = ctx
        .config
        .tls
        .as_ref()
        .ok_or_else(|| std::io::Error::other("this host has no [tls] settings"))?;
    let addr: SocketAddr = gpu
        .address
        .parse()
        .map_err(|_| std::io::Error::other("its address is not IP:PORT"))?;
    let deadline = ctx.config.limits.handshake_timeout;
    let tcp = TcpStream::connect_timeout(&addr, deadline)?;
    tcp.set_nodelay(true)?;
    super::bound_silence(&tcp, ctx.config.remote.timeout)?;
    tcp.set_read_timeout(Some(deadline))?;
    tcp.set_write_timeout(Some(deadline))?;
    let name = server_name(&gpu.name).map_err(std::io::Error::other)?;
    let conn =
        rustls::ClientConnection::new(tls.client.clone(), name).map_err(std::io::Error::other)?;
    let mut link = TlsLink {
        conn: conn.into(),
        tcp,
    };
    while link.conn.is_handshaking() {
        link.conn.complete_io(&mut link.tcp)?;
    }
    // The GPU host answers once its API server is up, as a local daemon does: the
    // guest waits for that as long as it would here.
    link.tcp.set_read_timeout(None)?;
    link.tcp.set_write_timeout(None)?;
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
