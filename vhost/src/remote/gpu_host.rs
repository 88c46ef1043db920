//! A GPU host's side: VM hosts' sessions arrive over mutual TLS.
//!
//! Each connection carries one session. After the TLS handshake (TLS 1.3, a client
//! certificate the CA signed), the certificate must name one of the configured
//! `[[peer]]`s: that name, not anything the peer says, is its identity. The peer then
//! names its VM in a preamble, and the session's tenant here is `PEER:VM`, a VM of
//! this daemon with the peer's settings (share, quota, cap), accounted and scheduled
//! like any other. Two VM hosts therefore never reach each other's tenants.
//!
//! The session itself is the daemon's ordinary one: its guest end is one end of a
//! socket pair whose other end the pump joins to the TLS connection. So a remote
//! session gets everything a local relayed one gets: the handshake deadline, the
//! registry's checks of every frame, its own sandboxed API server, policy where
//! commands reach the device, and a clean end when either side goes.

use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use log::{info, warn};

use super::pump::{End, TlsLink, pump};
use super::tls::{Tls, peer_named};
use super::{PREAMBLE_MAGIC, PROTOCOL};
use crate::config::{Config, Remote};
use crate::lifecycle::Lifecycle;
use crate::listener::{ConnectionSlot, start_session};
use crate::vms::Vms;

/// Why a connection was refused.
#[derive(Debug, thiserror::Error)]
enum Refused {
    #[error("TLS handshake failed: {0}")]
    Handshake(#[source] std::io::Error),
    #[error("its certificate names no configured peer")]
    UnknownPeer,
    #[error("its preamble is not Hira's (or not this version's)")]
    Preamble,
    #[error("it named no valid VM ({0:?})")]
    VmName(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Accepts VM hosts' sessions on `listener` until the daemon stops.
pub fn serve(
    listener: TcpListener,
    tls: Arc<Tls>,
    config: Arc<Config>,
    vms: Arc<Vms>,
    life: Arc<Lifecycle>,
) {
    let open = Arc::new(AtomicUsize::new(0));
    // Connections not yet authenticated are bounded like a listener's.
    let max = config.limits.max_connections_per_listener;
    for accepted in listener.incoming() {
        let tcp = match accepted {
            Ok(s) => s,
            Err(e) => {
                warn!("remote sessions: accept failed: {e}");
                continue;
            }
        };
        if life.stopping() {
            continue;
        }
        let taken = open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok();
        let addr = tcp
            .peer_addr()
            .map_or_else(|_| "?".to_string(), |a| a.to_string());
        if !taken {
            warn!("remote connection from {addr} refused: {max} connections are open");
            continue;
        }
        let (tls, config, vms, life, open) = (
            tls.clone(),
            config.clone(),
            vms.clone(),
            life.clone(),
            open.clone(),
        );
        let spawned = std::thread::Builder::new()
            .name("remote".into())
            .spawn(move || {
                connection(tcp, &addr, &tls, &config, &vms, &life);
                open.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            warn!("remote sessions: no thread for a connection: {e}");
        }
    }
}

/// Authenticates one connection, admits its tenant and serves its session. A refusal
/// is logged before the connection closes.
fn connection(
    tcp: TcpStream,
    addr: &str,
    tls: &Tls,
    config: &Arc<Config>,
    vms: &Vms,
    life: &Arc<Lifecycle>,
) {
    let conn = match rustls::ServerConnection::new(tls.server.clone()) {
        Ok(c) => c,
        Err(e) => {
            life.remote_refused.fetch_add(1, Ordering::Relaxed);
            warn!("remote connection from {addr} refused: {e}");
            return;
        }
    };
    let mut link = TlsLink {
        conn: conn.into(),
        tcp,
    };
    let (peer, vm) = match authenticate(&mut link, config) {
        Ok(x) => x,
        Err(e) => {
            warn!("remote connection from {addr} refused: {e}");
            life.remote_refused.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    if let Err(e) = serve_tenant(link, addr, &peer, &vm, config, vms, life) {
        warn!("remote session from {addr} for VM {vm:?} of {peer:?} failed: {e}");
    }
}

/// The TLS handshake and the preamble, within the guests' handshake deadline: the
/// peer's configured name and its VM's.
fn authenticate(link: &mut TlsLink, config: &Config) -> Result<(String, String), Refused> {
    let deadline = Some(config.limits.handshake_timeout);
    link.tcp.set_read_timeout(deadline)?;
    link.tcp.set_write_timeout(deadline)?;
    link.tcp.set_nodelay(true)?;
    super::bound_silence(&link.tcp, config.remote.timeout)?;
    while link.conn.is_handshaking() {
        link.conn
            .complete_io(&mut link.tcp)
            .map_err(Refused::Handshake)?;
    }
    let peer = link
        .conn
        .peer_certificates()
        .and_then(|c| c.first())
        .and_then(|c| peer_named(c, config.remote.peers.iter().map(|p| p.name.as_str())))
        .ok_or(Refused::UnknownPeer)?
        .to_string();
    let vm = read_preamble(link)?;
    Ok((peer, vm))
}

/// Runs the session of `peer`'s VM `vm` as tenant `PEER:VM`.
fn serve_tenant(
    mut link: TlsLink,
    addr: &str,
    peer: &str,
    vm: &str,
    config: &Arc<Config>,
    vms: &Vms,
    life: &Arc<Lifecycle>,
) -> std::io::Result<()> {
    let tenant = Remote::tenant(peer, vm);
    let queue = match vms.get(&tenant) {
        Some(q) => q,
        None => {
            let q = vms.vm(&tenant);
            let settings = config
                .remote
                .peers
                .iter()
                .find(|p| p.name == peer)
                .map(|p| p.settings)
                .unwrap_or_default();
            if let Some(share) = settings.share {
                q.set_share(share);
            }
            if let Some(n) = settings.max_sessions {
                q.set_max_sessions(n);
            }
            if settings.mem_quota.is_some() {
                q.set_mem_quota(settings.mem_quota)?;
            }
            info!("remote tenant {tenant:?}: VM {vm:?} of peer {peer:?}");
            q
        }
    };
    link.tcp.set_read_timeout(None)?;
    link.tcp.set_write_timeout(None)?;
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    info!("remote session for {tenant:?} from {addr}");
    start_session(
        theirs,
        ConnectionSlot::uncounted(),
        &tenant,
        config,
        &queue,
        life,
    );
    match pump(&ours, &mut link) {
        End::Local | End::Peer { error: None, .. } => {}
        End::Peer { error: Some(e), .. } => return Err(e),
    }
    Ok(())
}

/// The peer's preamble: Hira's magic, the protocol's version and the VM's name.
fn read_preamble(link: &mut TlsLink) -> Result<String, Refused> {
    let s = link;
    let mut head = [0u8; 11];
    s.read_exact(&mut head)?;
    if head[..8] != PREAMBLE_MAGIC || u16::from_le_bytes([head[8], head[9]]) != PROTOCOL {
        return Err(Refused::Preamble);
    }
    let mut name = vec![0u8; usize::from(head[10])];
    s.read_exact(&mut name)?;
    let name = String::from_utf8(name)
        .map_err(|e| Refused::VmName(String::from_utf8_lossy(e.as_bytes()).into_owned()))?;
    if !crate::config::valid_vm_name(&name) {
        return Err(Refused::VmName(name));
    }
    Ok(name)
}
