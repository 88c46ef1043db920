//! The VMs the daemon serves: those of its configuration, from its start to its stop,
//! and those added and removed while it runs (`hira-ctl vm add|remove`, the control
//! socket's `vm_add` and `vm_remove`), as a libvirt hook does when a domain starts
//! and is released.
//!
//! A VM added at run time is validated as `--vm` is, and against the VMs served
//! already (names, CIDs, sockets and window files are each one VM's); everything it
//! needs (its socket, its window file, its settings, its cgroup) is made before it
//! is served, and undone if any of it fails, so a refused `vm_add` leaves nothing
//! behind. With a state directory, its spec is kept there (`NAME.vm`) and it is served
//! again from the next start. Removing it refuses its new guests, ends its sessions
//! (their API servers reaped, their memory back), stops what served it and removes
//! its files. VMs from the configuration change only with the configuration.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hira_control::VmEntry;
use log::{error, info, warn};

use crate::config::{Config, ConfigError, LocalListener, VmSpec, VmTransport};
use crate::lifecycle::Lifecycle;
use crate::vms::Vms;

/// Why a VM cannot be added or removed; nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error(transparent)]
    Spec(#[from] ConfigError),
    #[error("VM {0:?} is served already")]
    Exists(String),
    #[error("CID {cid} is VM {vm:?}'s")]
    CidTaken { cid: u32, vm: String },
    #[error("{} is VM {vm:?}'s", path.display())]
    PathTaken { path: PathBuf, vm: String },
    #[error("no VM {0:?} is served")]
    Unknown(String),
    #[error("VM {0:?} comes from the daemon's configuration; change it there")]
    Configured(String),
    #[error("host-mem caps need --cgroup DIR (a cgroup directory delegated to the daemon)")]
    HostMemNeedsCgroup,
    #[error("the daemon is stopping")]
    Stopping,
    #[error(transparent)]
    Sandbox(#[from] crate::spawn::SandboxError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Listen(#[from] crate::listener::ListenError),
    #[error("cannot listen for the VMM on {}: {source}", path.display())]
    VhostUser {
        path: PathBuf,
        #[source]
        source: vhost::vhost_user::Error,
    },
    #[error("{ended} of VM {vm:?}'s sessions ended, {left} did not within {timeout:?}")]
    Sessions {
        vm: String,
        ended: usize,
        left: usize,
        timeout: Duration,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> VmError {
    let what = what.into();
    move |source| VmError::Io { what, source }
}

/// What serves one VM.
#[derive(Debug)]
struct Entry {
    info: VmEntry,
    /// A duplicate of its listening socket's descriptor: shut down, it wakes the
    /// thread that accepts on it.
    wake: Option<OwnedFd>,
    /// Files made for it (sockets, window), removed when it goes.
    files: Vec<PathBuf>,
}

/// The VMs served, and what serves each.
#[derive(Debug)]
pub struct Served {
    config: Arc<Config>,
    vms: Arc<Vms>,
    life: Arc<Lifecycle>,
    cgroups: Option<crate::cgroup::Cgroups>,
    entries: Mutex<BTreeMap<String, Entry>>,
}

impl Served {
    pub fn new(
        config: Arc<Config>,
        vms: Arc<Vms>,
        life: Arc<Lifecycle>,
        cgroups: Option<crate::cgroup::Cgroups>,
    ) -> Served {
        Served {
            config,
            vms,
            life,
            cgroups,
            entries: Mutex::new(BTreeMap::new()),
        }
    }

    fn entries(&self) -> MutexGuard<'_, BTreeMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The daemon's configuration.
    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    /// The VMs' cgroups, when the daemon has a cgroup directory.
    pub fn cgroups(&self) -> Option<&crate::cgroup::Cgroups> {
        self.cgroups.as_ref()
    }

    /// Serves host-local or hybrid-vsock listener `l` of the configuration (bound
    /// already as `listener`); a VM may have several.
    pub fn serve_listener(&self, l: &LocalListener, listener: std::os::unix::net::UnixListener) {
        let entry = self.accept_on(l, listener);
        match self.entries().entry(l.vm.clone()) {
            std::collections::btree_map::Entry::Occupied(mut o) => {
                o.get_mut().files.extend(entry.files)
            }
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(entry);
            }
        }
    }

    /// Accepts `l`'s guests on `listener` until the VM is removed.
    fn accept_on(&self, l: &LocalListener, listener: std::os::unix::net::UnixListener) -> Entry {
        let wake = listener.try_clone().ok().map(OwnedFd::from);
        let (config, vms, life, vm) = (
            self.config.clone(),
            self.vms.clone(),
            self.life.clone(),
            l.vm.clone(),
        );
        std::thread::spawn(move || crate::listener::accept_loop(listener, vm, config, vms, life));
        Entry {
            info: VmEntry {
                name: l.vm.clone(),
                transport: if l.hybrid_cid.is_some() {
                    "hybrid"
                } else {
                    "local"
                }
                .into(),
                socket: l.path.display().to_string(),
                cid: l.hybrid_cid,
                ..VmEntry::default()
            },
            wake,
            files: vec![l.path.clone()],
        }
    }

    /// Serves vhost-user VM `vm` on `socket`, with its window, until it is removed.
    fn serve_vhost_user(&self, vm: &VmSpec, socket: &Path) -> Result<Entry, VmError> {
        crate::listener::claim(socket)?;
        let l = vhost::vhost_user::Listener::new(socket, false).map_err(|source| {
            VmError::VhostUser {
                path: socket.to_path_buf(),
                source,
            }
        })?;
        let mut files = vec![socket.to_path_buf()];
        let undo = |files: &[PathBuf]| {
            for f in files {
                let _ = std::fs::remove_file(f);
            }
        };
        if let Err(e) = crate::listener::apply_access(socket, &self.config.access) {
            undo(&files);
            return Err(e.into());
        }
        let queue = self.vms.vm(&vm.name);
        if let Some((path, size)) = &vm.window {
            let made = crate::window::VmWindow::create(path, *size, vm.window_slots).map_err(io(
                format!("cannot make the data window {}", path.display()),
            ));
            let w = match made {
                Ok(w) => w,
                Err(e) => {
                    undo(&files);
                    return Err(e);
                }
            };
            files.push(path.clone());
            if let Err(e) = crate::listener::apply_access(path, &self.config.access) {
                undo(&files);
                return Err(e.into());
            }
            info!(
                "VM {:?}: data window {} ({} MiB, {} slots)",
                vm.name,
                path.display(),
                size >> 20,
                vm.window_slots
            );
            let _ = queue.window.set(w);
        }
        info!(
            "VM {:?} (CID {}): vhost-user vsock device on {}",
            vm.name,
            vm.cid,
            socket.display()
        );
        let wake = dup(l.as_raw_fd());
        let (config, life, spec) = (self.config.clone(), self.life.clone(), vm.clone());
        std::thread::spawn(move || {
            let make = || {
                crate::vsock::device::VsockDevice::new(
                    spec.cid.into(),
                    &spec.name,
                    config.clone(),
                    queue.clone(),
                    life.clone(),
                )
            };
            let removed = || queue.removed();
            if let Err(e) = crate::vsock::backend::serve(l, spec.cid.into(), make, removed) {
                error!("VM {:?}: vsock device failed: {e}", spec.name);
            }
        });
        Ok(Entry {
            info: VmEntry {
                name: vm.name.clone(),
                transport: "vhost-user".into(),
                socket: socket.display().to_string(),
                cid: Some(vm.cid),
                window: vm.window.as_ref().map(|(p, _)| p.display().to_string()),
                ..VmEntry::default()
            },
            wake,
            files,
        })
    }

    /// Serves configured vhost-user VM `vm` (its settings applied by the caller).
    pub fn serve_configured(&self, vm: &VmSpec) -> Result<(), VmError> {
        let VmTransport::VhostUser(socket) = &vm.transport else {
            return Ok(());
        };
        let entry = self.serve_vhost_user(vm, socket)?;
        self.entries().insert(vm.name.clone(), entry);
        Ok(())
    }

    /// Adds VM `spec` (the `--vm` syntax); returns how it is served.
    pub fn add(&self, spec: &str) -> Result<VmEntry, VmError> {
        let vm: VmSpec = spec.parse()?;
        // What the VM's API servers will see, checked again now: the host may have
        // changed since the daemon started (a driver installed, ICD files moved).
        crate::spawn::prepare_sandbox(&self.config)?;
        self.add_spec(&vm, spec, true)
    }

    fn add_spec(&self, vm: &VmSpec, text: &str, keep: bool) -> Result<VmEntry, VmError> {
        if self.life.stopping() {
            return Err(VmError::Stopping);
        }
        // One VM added at a time: the checks below hold until it is in.
        let mut entries = self.entries();
        self.check_free(&entries, vm)?;
        if vm.settings.host_mem.is_some() && self.cgroups.is_none() {
            return Err(VmError::HostMemNeedsCgroup);
        }
        if let Some(gpu) = &vm.gpu_host {
            if self.config.tls.is_none() {
                return Err(ConfigError::Remote(
                    "gpu-host needs [tls] in the daemon's configuration".into(),
                )
                .into());
            }
            self.config.remote.check_placement(gpu)?;
        }
        let mut entry = match &vm.transport {
            VmTransport::VhostUser(socket) => self.serve_vhost_user(vm, socket),
            VmTransport::Hybrid(_) => {
                let l = vm.listener().expect("a hybrid VM has a listener");
                let listener = crate::listener::bind(&l.path, &self.config.access)?;
                Ok(self.accept_on(&l, listener))
            }
        }?;
        entry.info.added = true;
        let applied =
            self.apply_settings(vm)
                .and_then(|()| match (keep, self.spec_file(&vm.name)) {
                    (true, Some(path)) => write_atomically(&path, text).map(|()| true),
                    (false, Some(_)) => Ok(true),
                    (_, None) => Ok(false),
                });
        match applied {
            Ok(persistent) => entry.info.persistent = persistent,
            Err(e) => {
                self.stop(&vm.name, entry);
                return Err(e);
            }
        }
        info!("VM {:?} added ({})", vm.name, entry.info.transport);
        let info = entry.info.clone();
        entries.insert(vm.name.clone(), entry);
        Ok(info)
    }

    /// Refuses a VM whose name, CID, socket or window another VM has.
    fn check_free(&self, entries: &BTreeMap<String, Entry>, vm: &VmSpec) -> Result<(), VmError> {
        if entries.contains_key(&vm.name) || self.vms.get(&vm.name).is_some() {
            return Err(VmError::Exists(vm.name.clone()));
        }
        let (socket, window) = match &vm.transport {
            VmTransport::VhostUser(s) => (s.clone(), vm.window.as_ref().map(|w| w.0.clone())),
            VmTransport::Hybrid(_) => (vm.listener().map(|l| l.path).unwrap_or_default(), None),
        };
        for (name, e) in entries {
            if e.info.cid == Some(vm.cid) {
                return Err(VmError::CidTaken {
                    cid: vm.cid,
                    vm: name.clone(),
                });
            }
            for path in std::iter::once(&socket).chain(window.as_ref()) {
                if e.files.contains(path) {
                    return Err(VmError::PathTaken {
                        path: path.clone(),
                        vm: name.clone(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Applies an added VM's quota, share, caps and cgroup.
    fn apply_settings(&self, vm: &VmSpec) -> Result<(), VmError> {
        let queue = self.vms.vm(&vm.name);
        let s = &vm.settings;
        if let Some(c) = &self.cgroups {
            let cg = c
                .vm(&vm.name)
                .map_err(io(format!("cannot make VM {:?}'s cgroup", vm.name)))?;
            let _ = queue.cgroup.set(cg);
        }
        queue
            .apply(s)
            .map_err(io(format!("cannot make VM {:?}'s page", vm.name)))?;
        if let Some(cap) = s.host_mem {
            queue
                .set_host_mem(Some(cap))
                .map_err(io(format!("cannot cap VM {:?}'s host memory", vm.name)))?;
        }
        if let Some(gpu) = &vm.gpu_host {
            queue.place(gpu);
        }
        Ok(())
    }

    /// Stops serving VM `name`: refuses its new guests, wakes what accepts for it and
    /// removes its files and state.
    fn stop(&self, name: &str, entry: Entry) {
        if let Some(q) = self.vms.get(name) {
            q.remove();
        }
        if let Some(fd) = &entry.wake {
            // SAFETY: `fd` is a socket descriptor this entry owns; shutting a listening
            // socket down makes its `accept` fail, which is all this does.
            unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR) };
        }
        for f in &entry.files {
            let _ = std::fs::remove_file(f);
        }
        if let Some(q) = self.vms.get(name)
            && let Some(c) = q.cgroup.get()
        {
            c.remove();
        }
        self.vms.forget(name);
    }

    /// Removes VM `name`, added at run time: its sessions end within `timeout`.
    /// Returns how many were live.
    pub fn remove(&self, name: &str, timeout: Duration) -> Result<usize, VmError> {
        let entry = {
            let mut entries = self.entries();
            match entries.get(name) {
                None => return Err(VmError::Unknown(name.to_string())),
                Some(e) if !e.info.added => return Err(VmError::Configured(name.to_string())),
                Some(_) => {}
            }
            entries.remove(name).expect("found above")
        };
        if let Some(q) = self.vms.get(name) {
            q.remove();
        }
        if let Some(path) = self.spec_file(name) {
            let _ = std::fs::remove_file(path);
        }
        let (ended, left) = self.life.end_vm(name, timeout);
        self.stop(name, entry);
        info!("VM {name:?} removed ({ended} sessions ended)");
        if left > 0 {
            return Err(VmError::Sessions {
                vm: name.to_string(),
                ended,
                left,
                timeout,
            });
        }
        Ok(ended)
    }

    /// Every VM served, by name.
    pub fn list(&self) -> Vec<VmEntry> {
        self.entries()
            .values()
            .map(|e| {
                let mut i = e.info.clone();
                if let Some(q) = self.vms.get(&i.name) {
                    i.sessions = q.sessions();
                    i.gpu_host = q.gpu_host().map(str::to_string);
                }
                i
            })
            .collect()
    }

    /// VM `vm`'s guest socket on this host (its local or hybrid listener), where a
    /// restored session's guest connects again.
    pub fn endpoint(&self, vm: &str) -> Option<PathBuf> {
        self.entries()
            .get(vm)
            .filter(|e| e.info.transport != "vhost-user")
            .map(|e| PathBuf::from(&e.info.socket))
    }

    /// The files of every VM served, removed when the daemon stops.
    pub fn files(&self) -> Vec<PathBuf> {
        self.entries()
            .values()
            .flat_map(|e| e.files.iter().cloned())
            .collect()
    }

    /// Where an added VM's spec is kept, with a state directory.
    fn spec_file(&self, name: &str) -> Option<PathBuf> {
        let dir = self.config.state_dir.as_ref()?;
        Some(dir.join(format!("{name}.vm")))
    }

    /// Serves again the VMs added at run time before the last stop; returns how many.
    pub fn add_kept(&self) -> usize {
        let Some(dir) = &self.config.state_dir else {
            return 0;
        };
        let Ok(read) = std::fs::read_dir(dir) else {
            return 0;
        };
        let mut paths: Vec<PathBuf> = read
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "vm"))
            .collect();
        paths.sort();
        let mut n = 0;
        for p in paths {
            let added = std::fs::read_to_string(&p)
                .map_err(io(p.display().to_string()))
                .and_then(|text| {
                    let text = text.trim().to_string();
                    let vm: VmSpec = text.parse()?;
                    if p.file_stem() != Some(std::ffi::OsStr::new(&vm.name)) {
                        return Err(VmError::Io {
                            what: p.display().to_string(),
                            source: std::io::Error::other("the file does not name this VM"),
                        });
                    }
                    self.add_spec(&vm, &text, false)
                });
            match added {
                Ok(_) => n += 1,
                Err(e) => warn!("{}: VM not served again: {e}", p.display()),
            }
        }
        n
    }
}

/// Writes `text` to `path` through a file renamed into place, so a crash leaves the
/// old file or the new one.
fn write_atomically(path: &Path, text: &str) -> Result<(), VmError> {
    let mut part = path.as_os_str().to_owned();
    part.push(".part");
    let part = PathBuf::from(part);
    let written = std::fs::File::create(&part).and_then(|mut f| {
        f.write_all(text.as_bytes())?;
        f.write_all(b"\n")?;
        f.sync_all()
    });
    written
        .and_then(|()| std::fs::rename(&part, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&part);
            VmError::Io {
                what: format!("cannot keep the VM's spec in {}", path.display()),
                source: e,
            }
        })
}

/// A duplicate of descriptor `fd`, which the caller holds open.
fn dup(fd: std::os::fd::RawFd) -> Option<OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: `dup` of a descriptor the caller holds open; the new one is ours alone.
    let new = unsafe { libc::dup(fd) };
    // SAFETY: a fresh descriptor nothing else owns.
    (new >= 0).then(|| unsafe { OwnedFd::from_raw_fd(new) })
}
