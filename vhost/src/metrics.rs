//! The opt-in Prometheus endpoint (`--metrics-address ADDR`): the same per-VM and
//! per-session figures as the control socket, in the OpenMetrics text format, encoded
//! with `prometheus-client`.
//!
//! Each scrape reads the daemon's state fresh (usage pages, VM pages), so the figures
//! are as current as the control socket's. The HTTP side is a few lines on a
//! `TcpListener` rather than a web framework: the endpoint answers one fixed `GET
//! /metrics` with a bounded request and a read timeout, which is all a scraper needs
//! and far less code exposed on a port.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use log::{debug, warn};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::control;
use crate::lifecycle::Lifecycle;
use crate::vms::Vms;

/// Where the endpoint listens, once bound (the control socket reports it).
pub static ADDRESS: OnceLock<SocketAddr> = OnceLock::new();

/// Longest request accepted.
const MAX_REQUEST: usize = 8192;

type Labels = Vec<(String, String)>;

fn counter(r: &mut Registry, name: &str, help: &str) -> Family<Labels, Counter> {
    let f = Family::<Labels, Counter>::default();
    r.register(name, help, f.clone());
    f
}

fn seconds(r: &mut Registry, name: &str, help: &str) -> Family<Labels, Counter<f64, AtomicU64>> {
    let f = Family::<Labels, Counter<f64, AtomicU64>>::default();
    r.register(name, help, f.clone());
    f
}

fn gauge(r: &mut Registry, name: &str, help: &str) -> Family<Labels, Gauge> {
    let f = Family::<Labels, Gauge>::default();
    r.register(name, help, f.clone());
    f
}

fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The daemon's figures in the OpenMetrics text format.
pub fn render(life: &Lifecycle, vms: &Vms) -> String {
    let status = control::status(life, vms);
    let mut r = Registry::with_prefix("hira");
    let sessions = gauge(
        &mut r,
        "vm_sessions",
        "Live sessions (API servers) of the VM",
    );
    let commands = counter(&mut r, "vm_commands", "Commands the VM's sessions sent");
    let bytes = counter(&mut r, "vm_bytes", "Request bytes the VM's sessions sent");
    let device = seconds(
        &mut r,
        "vm_device_seconds",
        "Device time of the VM's kernels",
    );
    let held_s = seconds(
        &mut r,
        "vm_held_seconds",
        "Time the VM's kernels were held by the scheduler (queue delay)",
    );
    let in_flight = gauge(
        &mut r,
        "vm_in_flight",
        "The VM's kernels enqueued and not finished",
    );
    let held = gauge(
        &mut r,
        "vm_held",
        "The VM's kernels held by the scheduler now",
    );
    let memory = gauge(&mut r, "vm_memory_bytes", "Device memory the VM holds");
    let quota = gauge(
        &mut r,
        "vm_memory_quota_bytes",
        "The VM's device-memory quota (absent: none)",
    );
    let share = gauge(&mut r, "vm_share", "The VM's share of device time");
    let host_mem = gauge(
        &mut r,
        "vm_host_memory_bytes",
        "Host memory the VM's API servers use together (with --cgroup)",
    );
    let host_cap = gauge(
        &mut r,
        "vm_host_memory_cap_bytes",
        "The cap on the VM's API servers' host memory (absent: none)",
    );
    let host_kills = counter(
        &mut r,
        "vm_host_memory_kills",
        "The VM's API servers the kernel killed for its host-memory cap",
    );
    let s_device = seconds(
        &mut r,
        "session_device_seconds",
        "Device time of a live session",
    );
    let s_memory = gauge(
        &mut r,
        "session_memory_bytes",
        "Device memory a live session holds",
    );
    let s_commands = counter(&mut r, "session_commands", "Commands a live session sent");
    let output = counter(
        &mut r,
        "vm_output_bytes",
        "The host library's output (kernel printf, diagnostics) sent to the VM's guests",
    );
    let dropped = counter(
        &mut r,
        "vm_output_dropped_bytes",
        "The host library's output dropped over the VM's sessions' bound",
    );
    let s_output = counter(
        &mut r,
        "session_output_bytes",
        "The host library's output sent to a live session's guest",
    );
    let s_dropped = counter(
        &mut r,
        "session_output_dropped_bytes",
        "The host library's output dropped over a live session's bound",
    );
    let crashes = counter(&mut r, "api_server_crashes", "API servers that crashed");
    let s_moves = gauge(
        &mut r,
        "session_migrations",
        "Times a live session moved to a new API server",
    );
    let moves = counter(&mut r, "migrations", "Sessions moved to a new API server");
    let suspensions = counter(
        &mut r,
        "suspensions",
        "Sessions suspended to leave this daemon (checkpoint, migrate --to)",
    );
    let resumptions = counter(&mut r, "resumptions", "Suspended sessions resumed here");
    let parked = gauge(
        &mut r,
        "parked_sessions",
        "Suspended sessions waiting here for their guests",
    );
    let detached = gauge(
        &mut r,
        "detached_sessions",
        "Live sessions whose connection a device reset cut, waiting for their guests",
    );
    let reconnections = counter(
        &mut r,
        "reconnections",
        "Guests that connected again to their live session after a device reset",
    );
    for vm in &status.vms {
        let l = vec![("vm".to_string(), vm.name.clone())];
        sessions.get_or_create(&l).set(vm.sessions as i64);
        commands.get_or_create(&l).inc_by(vm.commands);
        bytes.get_or_create(&l).inc_by(vm.bytes);
        device.get_or_create(&l).inc_by(vm.device_ns as f64 / 1e9);
        held_s.get_or_create(&l).inc_by(vm.held_ns as f64 / 1e9);
        in_flight.get_or_create(&l).set(i(vm.in_flight));
        held.get_or_create(&l).set(i(vm.held));
        output.get_or_create(&l).inc_by(vm.output_bytes);
        dropped.get_or_create(&l).inc_by(vm.output_dropped);
        memory.get_or_create(&l).set(i(vm.mem_used));
        if let Some(q) = vm.mem_quota {
            quota.get_or_create(&l).set(i(q));
        }
        share.get_or_create(&l).set(i64::from(vm.share));
        if let Some(b) = vm.host_mem_used {
            host_mem.get_or_create(&l).set(i(b));
        }
        if let Some(b) = vm.host_mem {
            host_cap.get_or_create(&l).set(i(b));
        }
        if let Some(n) = vm.host_mem_kills {
            host_kills.get_or_create(&l).inc_by(n);
        }
    }
    for s in &status.sessions {
        let l = vec![
            ("vm".to_string(), s.session.vm.clone()),
            ("session".to_string(), s.session.id.to_string()),
            ("process".to_string(), s.session.process.clone()),
        ];
        s_device.get_or_create(&l).inc_by(s.device_ns as f64 / 1e9);
        s_memory.get_or_create(&l).set(i(s.memory));
        s_commands.get_or_create(&l).inc_by(s.commands);
        s_output.get_or_create(&l).inc_by(s.output_bytes);
        s_dropped.get_or_create(&l).inc_by(s.output_dropped);
        s_moves
            .get_or_create(&l)
            .set(i64::from(s.session.migrations));
    }
    let none = Vec::new();
    moves.get_or_create(&none).inc_by(status.migrations);
    suspensions.get_or_create(&none).inc_by(status.suspensions);
    resumptions.get_or_create(&none).inc_by(status.resumptions);
    parked.get_or_create(&none).set(status.parked.len() as i64);
    detached.get_or_create(&none).set(status.detached as i64);
    reconnections
        .get_or_create(&none)
        .inc_by(status.reconnections);
    crashes
        .get_or_create(&Vec::new())
        .inc_by(status.api_server_crashes);
    let mut out = String::new();
    if encode(&mut out, &r).is_err() {
        warn!("metrics: encoding failed");
    }
    out
}

fn answer(mut stream: TcpStream, life: &Lifecycle, vms: &Vms) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut req = Vec::with_capacity(512);
    let mut buf = [0u8; 512];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf)?;
        if n == 0 || req.len() + n > MAX_REQUEST {
            return Ok(());
        }
        req.extend_from_slice(&buf[..n]);
    }
    let line = req.split(|&b| b == b'\r').next().unwrap_or_default();
    let (status, kind, body) = if line.starts_with(b"GET /metrics ") {
        (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            render(life, vms),
        )
    } else {
        ("404 Not Found", "text/plain", "only GET /metrics\n".into())
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Serves the endpoint until the daemon exits, one scrape at a time.
pub fn serve(listener: TcpListener, life: Arc<Lifecycle>, vms: Arc<Vms>) {
    for conn in listener.incoming() {
        match conn {
            Ok(s) => {
                if let Err(e) = answer(s, &life, &vms) {
                    debug!("metrics client: {e}");
                }
            }
            Err(e) => warn!("metrics accept failed: {e}"),
        }
    }
}
