//! This host as a client of other hosts: opening an authenticated connection to a
//! GPU host, asking what it can take, and handing it a suspended session.

use std::io::{BufRead, Read};
use std::net::{SocketAddr, TcpStream};

use super::pump::TlsLink;
use super::tls::server_name;
use super::{Capacity, PARK, PROTOCOL};
use crate::config::{Config, GpuHost};
use crate::migrate::{Captured, PlaceError};

/// Opens an authenticated connection to `gpu` within the handshake deadline: its
/// certificate must hold its configured name. Reads and writes then block without
/// a deadline (the silence bound ends a dead link).
pub fn connect(config: &Config, gpu: &GpuHost) -> std::io::Result<TlsLink> {
    let tls = config
        .tls
        .as_ref()
        .ok_or_else(|| std::io::Error::other("this host has no [tls] settings"))?;
    let addr: SocketAddr = gpu
        .address
        .parse()
        .map_err(|_| std::io::Error::other("its address is not IP:PORT"))?;
    let deadline = config.limits.handshake_timeout;
    let tcp = TcpStream::connect_timeout(&addr, deadline)?;
    tcp.set_nodelay(true)?;
    super::bound_silence(&tcp, config.remote.timeout)?;
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
    link.tcp.set_read_timeout(None)?;
    link.tcp.set_write_timeout(None)?;
    Ok(link)
}

/// What `gpu` can take now (within the handshake deadline).
pub fn capacity(config: &Config, gpu: &GpuHost) -> std::io::Result<Capacity> {
    let mut link = connect(config, gpu)?;
    link.tcp
        .set_read_timeout(Some(config.limits.handshake_timeout))?;
    let mut ask = super::CAPACITY.to_vec();
    ask.extend_from_slice(&PROTOCOL.to_le_bytes());
    link.write_all(&ask)?;
    let mut line = String::new();
    std::io::BufReader::new((&mut link).take(4096)).read_line(&mut line)?;
    serde_json::from_str(&line).map_err(std::io::Error::other)
}

/// The configuration's GPU hosts that take sessions now, those that can take the most
/// first (least shares busy, then least memory held); drained and unreachable ones
/// left out.
pub fn ranked(config: &Config) -> Vec<&GpuHost> {
    let mut scored: Vec<((u64, u64), &GpuHost)> = config
        .remote
        .gpu_hosts
        .iter()
        .filter_map(|g| match capacity(config, g) {
            Ok(c) if !c.draining => Some((c.key(), g)),
            Ok(_) => {
                log::info!("GPU host {:?} is being drained; not placing there", g.name);
                None
            }
            Err(e) => {
                log::warn!("GPU host {:?} did not say what it can take: {e}", g.name);
                None
            }
        })
        .collect();
    scored.sort_by_key(|(k, _)| *k);
    scored.into_iter().map(|(_, g)| g).collect()
}

/// Hands suspended session `c` (of tenant `c.vm`) to `gpu`, which keeps it for its
/// guest; returns what the guest's VM host is told (`MOVED_TO` and the GPU host).
pub fn park_at(config: &Config, gpu: &GpuHost, c: &Captured) -> Result<String, PlaceError> {
    use std::io::{Seek, SeekFrom};
    let failed = |e: std::io::Error| PlaceError::Remote {
        gpu: gpu.name.clone(),
        source: e,
    };
    let mut snapshot = c
        .snapshot
        .try_clone()
        .map(std::fs::File::from)
        .and_then(|mut f| f.seek(SeekFrom::Start(0)).map(|_| f))
        .map_err(PlaceError::Snapshot)?;
    let mut link = connect(config, gpu).map_err(failed)?;
    let mut head = PARK.to_vec();
    head.extend_from_slice(&PROTOCOL.to_le_bytes());
    head.push(u8::try_from(c.vm.len()).unwrap_or(u8::MAX));
    head.extend_from_slice(c.vm.as_bytes());
    head.extend_from_slice(&c.token);
    head.extend_from_slice(&c.bytes.to_le_bytes());
    link.write_all(&head).map_err(failed)?;
    let mut buf = vec![0u8; 256 * 1024];
    let mut left = c.bytes;
    while left > 0 {
        let n = usize::try_from(left.min(buf.len() as u64)).unwrap_or(buf.len());
        snapshot
            .read_exact(&mut buf[..n])
            .map_err(PlaceError::Snapshot)?;
        link.write_all(&buf[..n]).map_err(failed)?;
        left -= n as u64;
    }
    link.tcp
        .set_read_timeout(Some(config.limits.handshake_timeout))
        .map_err(failed)?;
    let mut line = String::new();
    std::io::BufReader::new((&mut link).take(4096))
        .read_line(&mut line)
        .map_err(failed)?;
    match line.trim_end().strip_prefix("parked") {
        Some("") => Ok(format!("{}{}", super::MOVED_TO, gpu.name)),
        _ => Err(failed(std::io::Error::other(format!(
            "it did not keep the session: {}",
            line.trim_end()
        )))),
    }
}
