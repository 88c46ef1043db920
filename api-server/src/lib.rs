//! Hira's API server: one process per guest application.
//!
//! - [`server`]: the session loop. It takes the guest's `Hello` (and data-window fd)
//!   from `hira-vhost`, then executes requests, inline while the guest uses one thread
//!   and on one worker per guest thread once it uses more, so a call blocked on the
//!   device never holds up another thread's calls.
//! - [`backend`]: the [`backend::Backend`] trait, one implementation per host API.
//! - [`handles`]: the handle table every backend keeps: guest ids to host objects.
//! - [`opencl`]: the OpenCL backend: the handle table, the generated dispatch, the
//!   few host calls that need hand-written code, and capture and restore for
//!   migration.
//! - [`cuda`]: the CUDA backend, on the driver API of the host's `libcuda.so.1`.
//! - [`account`]: what the session uses, charged to its VM: device memory against the VM's quota, device time, and the VM's scheduling decision.
//! - [`window`]: the guest's data window mapped into this process.
//! - [`output`]: what the host library prints (a kernel's `printf`), taken from the
//!   process's standard output and error to the guest's, within a bound.
//! - [`sandbox`]: namespaces, an unprivileged user, `no_new_privs`, Landlock and a
//!   seccomp allow-list, entered before the first byte from the guest is read.
//!
//! When the session ends, however it ends, every host object the guest still held is
//! released before the process exits.

pub mod account;
pub mod backend;
pub mod cuda;
pub mod handles;
#[cfg(test)]
mod null;
pub mod opencl;
pub mod output;
pub mod sandbox;
pub mod server;
pub mod window;

use std::os::fd::OwnedFd;

pub use backend::TeardownReport;
pub use server::{Outcome, ServerError, run};

/// Validated configuration of one API server.
#[derive(Debug)]
pub struct Config {
    /// The session socket to hira-vhost.
    pub socket: OwnedFd,
    /// Substring of the host platform name to use.
    pub platform: Option<String>,
    /// Session number, for logs.
    pub session: u64,
    /// The usage page hira-vhost reads this session's counters from.
    pub usage: Option<std::sync::Arc<hira_protocol::usage::UsagePage>>,
    /// The page of the session's VM: its device-memory quota and what its sessions
    /// hold together.
    pub vm_page: Option<hira_protocol::usage::VmPage>,
    /// When the process started, for the log of how long a restore took.
    pub started: std::time::Instant,
    /// What the host library prints, on its way to the guest (`None`: it stays on
    /// this process's standard output and error).
    pub output: Option<std::sync::Arc<output::HostOutput>>,
}
