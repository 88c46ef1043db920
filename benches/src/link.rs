//! **Test infrastructure, not part of Hira**: the link's own figures, iperf-style, for
//! `hira-bench remote` to set Hira's beside: a TCP round trip of a small message and
//! the throughput of one TCP stream each way, between the same two hosts (network
//! namespaces) and through the same delaying relay as Hira's sessions.
//!
//! A probe server runs in the GPU host's namespace. Each connection names what it
//! measures in its first byte: `p` echoes 64-byte messages; `w` takes the bytes the
//! client streams and answers one byte once it has them all; `r` streams them to the
//! client.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Instant;

use anyhow::{Context, Result, ensure};

use crate::hosts::enter;

/// The size of a ping.
const PING: usize = 64;
/// Bytes written or read at once.
const CHUNK: usize = 1 << 20;

/// Starts the probe server in namespace `ns` (`None`: this process's) on `ip`; its
/// address. It serves until the process ends.
pub fn serve_in(ns: Option<&str>, ip: &str) -> Result<SocketAddr> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (ns, ip) = (ns.map(str::to_string), ip.to_string());
    std::thread::spawn(move || {
        let entered = ns.as_deref().map_or(Ok(()), enter);
        let bound = entered.and_then(|()| Ok(TcpListener::bind((ip.as_str(), 0))?));
        let listener = match bound {
            Ok(l) => l,
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        };
        let _ = tx.send(listener.local_addr().map_err(anyhow::Error::from));
        for s in listener.incoming().flatten() {
            // Namespaces belong to threads: a connection's thread is already in the
            // GPU host's, and what it does needs no other.
            std::thread::spawn(move || {
                let _ = serve_one(s);
            });
        }
    });
    rx.recv().context("the probe server started")?
}

fn serve_one(mut s: TcpStream) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    let mut mode = [0u8; 1];
    s.read_exact(&mut mode)?;
    let mut buf = vec![0u8; CHUNK];
    match mode[0] {
        b'p' => loop {
            if s.read_exact(&mut buf[..PING]).is_err() {
                return Ok(());
            }
            s.write_all(&buf[..PING])?;
        },
        b'w' | b'r' => {
            let mut len = [0u8; 8];
            s.read_exact(&mut len)?;
            let mut left = u64::from_le_bytes(len);
            while left > 0 {
                let n = left.min(CHUNK as u64) as usize;
                if mode[0] == b'w' {
                    s.read_exact(&mut buf[..n])?;
                } else {
                    s.write_all(&buf[..n])?;
                }
                left -= n as u64;
            }
            if mode[0] == b'w' {
                s.write_all(&[1])?;
            } else {
                s.read_exact(&mut mode)?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// The link's figures from one place to the probe server.
#[derive(Debug, Clone, Copy, Default)]
pub struct Figures {
    /// Median round trip of a 64-byte message, µs.
    pub rtt_us: f64,
    /// One stream to the server and one from it, MiB/s (medians).
    pub to_mibs: f64,
    pub from_mibs: f64,
}

/// Measures the link from namespace `ns` (`None`: this process's) to `to`: `pings`
/// round trips and `repeats` streams of `mib` MiB each way.
pub fn measure_from(
    ns: Option<&str>,
    to: &str,
    pings: usize,
    mib: u64,
    repeats: usize,
) -> Result<Figures> {
    let to: SocketAddr = to.parse().context("a socket address")?;
    let run = || -> Result<Figures> {
        let mut s = TcpStream::connect(to)?;
        s.set_nodelay(true)?;
        s.write_all(b"p")?;
        let mut buf = vec![0u8; CHUNK];
        let mut rtts = Vec::with_capacity(pings);
        for _ in 0..pings {
            let t = Instant::now();
            s.write_all(&buf[..PING])?;
            s.read_exact(&mut buf[..PING])?;
            rtts.push(t.elapsed().as_secs_f64() * 1e6);
        }
        drop(s);
        let mut to_mibs = Vec::new();
        let mut from_mibs = Vec::new();
        for _ in 0..repeats {
            to_mibs.push(stream(to, b'w', mib, &mut buf)?);
            from_mibs.push(stream(to, b'r', mib, &mut buf)?);
        }
        Ok(Figures {
            rtt_us: crate::median(&mut rtts),
            to_mibs: crate::median(&mut to_mibs),
            from_mibs: crate::median(&mut from_mibs),
        })
    };
    match ns {
        Some(ns) => crate::hosts::Net::within(ns, run),
        None => run(),
    }
}

/// One stream of `mib` MiB (`w`: to the server; `r`: from it), MiB/s from the first
/// byte to the last one's arrival.
fn stream(to: SocketAddr, mode: u8, mib: u64, buf: &mut [u8]) -> Result<f64> {
    let mut s = TcpStream::connect(to)?;
    s.set_nodelay(true)?;
    let total = mib << 20;
    let t = Instant::now();
    s.write_all(&[mode])?;
    s.write_all(&total.to_le_bytes())?;
    let mut left = total;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        if mode == b'w' {
            s.write_all(&buf[..n])?;
        } else {
            s.read_exact(&mut buf[..n])?;
        }
        left -= n as u64;
    }
    let mut end = [0u8; 1];
    if mode == b'w' {
        s.read_exact(&mut end)?;
    } else {
        s.write_all(&end)?;
    }
    let secs = t.elapsed().as_secs_f64();
    ensure!(secs > 0.0, "a stream took no time");
    Ok(mib as f64 / secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_measures_a_loopback_link() {
        let server = serve_in(None, "127.0.0.1").unwrap();
        let f = measure_from(None, &server.to_string(), 50, 8, 2).unwrap();
        assert!(f.rtt_us > 0.0 && f.rtt_us.is_finite());
        assert!(f.to_mibs > 0.0 && f.from_mibs > 0.0);
        // A stream the server did not take whole would never be answered: each
        // measured one ended with the server's byte (or the client's, read back).
        assert!(f.to_mibs.is_finite() && f.from_mibs.is_finite());
    }
}
