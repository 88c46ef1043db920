//! Hira's host daemon.
//!
//! - [`config`]: the validated daemon configuration and listener specs.
//! - [`listener`]: accepts guest connections; the listener a connection arrives on
//!   decides its VM, never anything the guest says.
//! - [`session`]: one guest application's session: the handshake, its API-server
//!   process, and the relay that sees every command in both directions.
//! - [`router`]: the per-VM dispatch queues every command passes through (first in,
//!   first out for now) and per-VM counters.
//! - [`spawn`]: starting and reaping API-server processes.
//! - [`window`]: per-VM shared data windows (ivshmem) and their per-session slots.
//! - [`vsock`]: the virtio-vsock protocol (packet header, connection state machine,
//!   credit-based flow control, per-VM multiplexing) for the VM transport.

pub mod config;
pub mod listener;
pub mod router;
pub mod session;
pub mod spawn;
pub mod vsock;
pub mod window;

use std::sync::Arc;

pub use config::Config;

/// Runs the daemon until every listener fails.
pub fn run(config: Config) -> Result<(), listener::ListenError> {
    let config = Arc::new(config);
    let router = Arc::new(router::Router::default());
    let mut threads = Vec::new();
    for l in &config.listeners {
        let listener = listener::bind(&l.path)?;
        log::info!("VM {:?}: listening on {}", l.vm, l.path.display());
        let (config, router, vm) = (config.clone(), router.clone(), l.vm.clone());
        threads.push(std::thread::spawn(move || {
            listener::accept_loop(listener, vm, config, router)
        }));
    }
    for vm in &config.vhost_user_vms {
        let crate::config::VmTransport::VhostUser(socket) = vm.transport.clone() else {
            continue;
        };
        let (config, queue, vm) = (config.clone(), router.vm(&vm.name), vm.clone());
        if let Some((path, size)) = &vm.window {
            let w = window::VmWindow::create(path, *size)
                .map_err(|e| listener::ListenError::Bind(path.display().to_string(), e))?;
            log::info!(
                "VM {:?}: data window {} ({} MiB)",
                vm.name,
                path.display(),
                size >> 20
            );
            let _ = queue.window.set(w);
        }
        log::info!(
            "VM {:?} (CID {}): vhost-user vsock device on {}",
            vm.name,
            vm.cid,
            socket.display()
        );
        threads.push(std::thread::spawn(move || {
            let make = || {
                vsock::device::VsockDevice::new(
                    vm.cid.into(),
                    &vm.name,
                    config.clone(),
                    queue.clone(),
                )
            };
            if let Err(e) = vsock::backend::serve(&socket, vm.cid.into(), make) {
                log::error!("VM {:?}: vsock device failed: {e}", vm.name);
            }
        }));
    }
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}
