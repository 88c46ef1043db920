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

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use hira_protocol::handshake::error_code;
use log::{info, warn};

use super::pump::{End, TlsLink, pump};
use super::tls::{Tls, peer_named};
use super::{CAPACITY, Capacity, PARK, PREAMBLE_MAGIC, PROTOCOL};
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
    let (peer, ask) = match authenticate(&mut link, config) {
        Ok(x) => x,
        Err(e) => {
            warn!("remote connection from {addr} refused: {e}");
            life.remote_refused.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    match ask {
        Ask::Session(vm) => {
            if life.draining.load(Ordering::Acquire) {
                info!("remote session from {addr} for VM {vm:?} of {peer:?} refused: draining");
                let frame = crate::session::error_frame(
                    None,
                    error_code::SERVER_GONE,
                    &format!("GPU host {:?} is being drained", tls.name),
                );
                let _ = link.write_all(&frame);
                return;
            }
            if let Err(e) = serve_tenant(link, addr, &peer, &vm, config, vms, life) {
                warn!("remote session from {addr} for VM {vm:?} of {peer:?} failed: {e}");
            }
        }
        Ask::Capacity => {
            let line = serde_json::to_string(&capacity(vms, life)).unwrap_or_default();
            let _ = link.write_all(format!("{line}\n").as_bytes());
        }
        Ask::Park {
            tenant,
            token,
            bytes,
        } => {
            let answer = match park(&mut link, config, vms, life, &tenant, token, bytes) {
                Ok(()) => {
                    info!("a session of {tenant:?} handed over by {peer:?} waits for its guest");
                    "parked".to_string()
                }
                Err(e) => {
                    warn!("a session of {tenant:?} from {peer:?} was not kept: {e}");
                    format!("refused: {e}")
                }
            };
            let _ = link.write_all(format!("{answer}\n").as_bytes());
        }
    }
}

/// What an authenticated peer asks.
#[derive(Debug)]
enum Ask {
    /// To serve a session of its VM.
    Session(String),
    /// What this host can take.
    Capacity,
    /// To keep a suspended session of `tenant` for its guest.
    Park {
        tenant: String,
        token: hira_protocol::handshake::Token,
        bytes: u64,
    },
}

/// What this host can take now.
pub fn capacity(vms: &Vms, life: &Lifecycle) -> Capacity {
    let mut c = Capacity {
        draining: life.draining.load(Ordering::Acquire),
        ..Capacity::default()
    };
    for (_, q) in vms.snapshot() {
        let n = q.sessions();
        if n > 0 {
            c.sessions += n;
            c.busy_shares += u64::from(q.share().max(1));
        }
        c.mem_held += q.memory().1;
    }
    c
}

/// The TLS handshake and the preamble, within the guests' handshake deadline: the
/// peer's configured name and what it asks.
fn authenticate(link: &mut TlsLink, config: &Config) -> Result<(String, Ask), Refused> {
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
    let ask = read_preamble(link)?;
    Ok((peer, ask))
}

/// The tenant `PEER:VM` of `peer`'s VM `vm`, made with the peer's settings the first
/// time.
fn tenant_queue(
    config: &Config,
    vms: &Vms,
    peer: &str,
    vm: &str,
) -> std::io::Result<(String, Arc<crate::vms::Vm>)> {
    let tenant = Remote::tenant(peer, vm);
    if let Some(q) = vms.get(&tenant) {
        return Ok((tenant, q));
    }
    let q = vms.vm(&tenant);
    let settings = config
        .remote
        .peers
        .iter()
        .find(|p| p.name == peer)
        .map(|p| p.settings)
        .unwrap_or_default();
    q.apply(&settings)?;
    info!("remote tenant {tenant:?}: VM {vm:?} of peer {peer:?}");
    Ok((tenant, q))
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
    let (tenant, queue) = tenant_queue(config, vms, peer, vm)?;
    link.tcp.set_read_timeout(None)?;
    link.tcp.set_write_timeout(None)?;
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    super::widen(&ours);
    super::widen(&theirs);
    info!("remote session for {tenant:?} from {addr}");
    start_session(
        theirs,
        ConnectionSlot::uncounted(),
        &tenant,
        config,
        &queue,
        life,
    );
    match pump(&ours, &mut link, &mut super::pump::unchanged) {
        End::Local | End::Peer { error: None, .. } => Ok(()),
        End::Peer { error: Some(e), .. } => {
            // A cut, not an end: the session waits for its VM host to come back with
            // its token (a relayed stream both ends keep), as for a device reset.
            queue.device_reset();
            Err(e)
        }
    }
}

/// Keeps a session another host handed over. Its tenant must be one of a configured
/// peer's VMs: the session resumes only for that peer's connection for that VM,
/// with the token its guest holds.
fn park(
    link: &mut TlsLink,
    config: &Config,
    vms: &Vms,
    life: &Lifecycle,
    tenant: &str,
    token: hira_protocol::handshake::Token,
    bytes: u64,
) -> Result<(), String> {
    let (peer, vm) = tenant
        .split_once(':')
        .filter(|(p, v)| {
            config.remote.peers.iter().any(|q| q.name == *p) && crate::config::valid_vm_name(v)
        })
        .ok_or_else(|| format!("{tenant:?} is no VM of a peer of this host"))?;
    tenant_queue(config, vms, peer, vm).map_err(|e| e.to_string())?;
    // The snapshot comes within the silence bound, however long it is.
    link.tcp.set_read_timeout(None).map_err(|e| e.to_string())?;
    crate::migrate::park_from(
        life,
        tenant,
        token,
        crate::migrate::SlotGuard(None),
        bytes,
        link,
    )
    .map_err(|e| e.to_string())
}

/// The peer's preamble: Hira's magic for what it asks, the protocol's version, and
/// what the ask needs.
fn read_preamble(link: &mut TlsLink) -> Result<Ask, Refused> {
    let mut head = [0u8; 10];
    link.read_exact(&mut head)?;
    if u16::from_le_bytes([head[8], head[9]]) != PROTOCOL {
        return Err(Refused::Preamble);
    }
    let magic: [u8; 8] = head[..8].try_into().expect("eight bytes");
    let name = |link: &mut TlsLink| -> Result<String, Refused> {
        let mut len = [0u8; 1];
        link.read_exact(&mut len)?;
        let mut name = vec![0u8; usize::from(len[0])];
        link.read_exact(&mut name)?;
        String::from_utf8(name)
            .map_err(|e| Refused::VmName(String::from_utf8_lossy(e.as_bytes()).into_owned()))
    };
    match magic {
        PREAMBLE_MAGIC => {
            let vm = name(link)?;
            if !crate::config::valid_vm_name(&vm) {
                return Err(Refused::VmName(vm));
            }
            Ok(Ask::Session(vm))
        }
        CAPACITY => Ok(Ask::Capacity),
        PARK => {
            let tenant = name(link)?;
            let mut token = [0u8; 16];
            link.read_exact(&mut token)?;
            let mut len = [0u8; 8];
            link.read_exact(&mut len)?;
            let bytes = u64::from_le_bytes(len);
            Ok(Ask::Park {
                tenant,
                token,
                bytes,
            })
        }
        _ => Err(Refused::Preamble),
    }
}
