//! Per-VM host-memory caps through the kernel's memory cgroup controller.
//!
//! With `--cgroup DIR` (a cgroup directory the operator delegates to the daemon) the
//! daemon makes one cgroup per VM, `DIR/vm-NAME`, and starts each of that VM's API
//! servers in it (the child joins between fork and exec, before it can allocate), so
//! the kernel counts and caps the host memory all of a VM's API servers use together:
//! a VM over its `host-mem` cap has its largest API server killed by the kernel's
//! OOM killer, which ends that one guest session with an error, as any API-server
//! crash does, and nothing else. Both the unified hierarchy (cgroup v2: `memory.max`,
//! `memory.current`, `memory.events`) and the v1 memory controller
//! (`memory.limit_in_bytes`, `memory.usage_in_bytes`, `memory.oom_control`) are
//! handled; the cap is on memory, swap follows the host's settings.
//!
//! Plain file access is all this needs (cgroupfs is a file system); no crate wraps
//! it more simply than `std::fs` does.

use std::fs::{self, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

/// Which cgroup hierarchy a directory is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

impl Version {
    fn limit_file(self) -> &'static str {
        match self {
            Version::V1 => "memory.limit_in_bytes",
            Version::V2 => "memory.max",
        }
    }

    fn usage_file(self) -> &'static str {
        match self {
            Version::V1 => "memory.usage_in_bytes",
            Version::V2 => "memory.current",
        }
    }
}

/// The directory under which the daemon makes its VMs' cgroups.
#[derive(Debug)]
pub struct Cgroups {
    root: PathBuf,
    version: Version,
}

fn context(path: &Path, what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

impl Cgroups {
    /// Opens (making it if needed) the delegated directory `root` and checks that it
    /// has the memory controller; on cgroup v2 enables the controller for the VMs'
    /// cgroups below it (so `root` itself must hold no processes).
    pub fn open(root: &Path) -> io::Result<Cgroups> {
        match fs::create_dir(root) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(context(root, "cannot make the cgroup", e)),
        }
        let version = if root.join("cgroup.controllers").exists() {
            Version::V2
        } else if root.join("memory.limit_in_bytes").exists() {
            Version::V1
        } else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is not a cgroup directory with the memory controller",
                    root.display()
                ),
            ));
        };
        if version == Version::V2 {
            let available = fs::read_to_string(root.join("cgroup.controllers"))
                .map_err(|e| context(root, "cannot read the controllers of", e))?;
            if !available.split_whitespace().any(|c| c == "memory") {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "the memory controller is not enabled for {} (enable it in its parent's cgroup.subtree_control)",
                        root.display()
                    ),
                ));
            }
            fs::write(root.join("cgroup.subtree_control"), "+memory").map_err(|e| {
                context(
                    root,
                    "cannot enable the memory controller below (the directory must hold no processes)",
                    e,
                )
            })?;
        }
        Ok(Cgroups {
            root: root.to_path_buf(),
            version,
        })
    }

    /// Which hierarchy the directory is on.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The cgroup of VM `name` (made if needed).
    pub fn vm(&self, name: &str) -> io::Result<VmCgroup> {
        let dir = self.root.join(format!("vm-{name}"));
        match fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(context(&dir, "cannot make the cgroup", e)),
        }
        let procs = OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.procs"))
            .map_err(|e| context(&dir, "cannot open cgroup.procs of", e))?;
        Ok(VmCgroup {
            dir,
            version: self.version,
            procs: OwnedFd::from(procs),
        })
    }
}

/// One VM's cgroup. Removed when this drops, if no process is left in it.
#[derive(Debug)]
pub struct VmCgroup {
    dir: PathBuf,
    version: Version,
    /// `cgroup.procs`, open for writing, so that a child joins with one write(2)
    /// between fork and exec.
    procs: OwnedFd,
}

impl VmCgroup {
    /// The descriptor a new process writes `0` to, to join.
    pub fn procs_fd(&self) -> RawFd {
        self.procs.as_raw_fd()
    }

    /// Sets the cap (`None`: none). The kernel refuses (v1) or reclaims and then kills
    /// (v2) when the VM already uses more than a lowered cap.
    pub fn set_limit(&self, bytes: Option<u64>) -> io::Result<()> {
        let text = match (bytes, self.version) {
            (Some(b), _) => b.to_string(),
            (None, Version::V1) => "-1".into(),
            (None, Version::V2) => "max".into(),
        };
        let file = self.dir.join(self.version.limit_file());
        fs::write(&file, text).map_err(|e| context(&file, "cannot write", e))
    }

    /// The cap, if there is one.
    pub fn limit(&self) -> Option<u64> {
        let text = fs::read_to_string(self.dir.join(self.version.limit_file())).ok()?;
        // v1 reports "no limit" as a huge page-aligned number.
        text.trim().parse().ok().filter(|&b: &u64| b < 1 << 62)
    }

    /// Host memory the VM's API servers use now, in bytes.
    pub fn usage(&self) -> Option<u64> {
        fs::read_to_string(self.dir.join(self.version.usage_file()))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// How many of the VM's processes the kernel has killed for the cap.
    pub fn oom_kills(&self) -> Option<u64> {
        let file = match self.version {
            Version::V1 => "memory.oom_control",
            Version::V2 => "memory.events",
        };
        let text = fs::read_to_string(self.dir.join(file)).ok()?;
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == "oom_kill").then(|| v.trim().parse().ok()).flatten()
        })
    }

    /// The cgroup's directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl VmCgroup {
    /// Removes the cgroup (at shutdown, once the VM's API servers are reaped); fails
    /// harmlessly while a process is still in it.
    pub fn remove(&self) {
        let _ = fs::remove_dir(&self.dir);
    }
}

impl Drop for VmCgroup {
    fn drop(&mut self) {
        self.remove();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory laid out as the kernel lays out a cgroup of `version` (the files
    /// are plain files here, so what the daemon writes can be read back).
    fn fake(version: Version) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        match version {
            Version::V2 => {
                fs::write(d.path().join("cgroup.controllers"), "cpu io memory pids\n").unwrap();
                fs::write(d.path().join("cgroup.subtree_control"), "").unwrap();
            }
            Version::V1 => fs::write(d.path().join("memory.limit_in_bytes"), "").unwrap(),
        }
        d
    }

    /// What the kernel puts in a new VM cgroup.
    fn populate(dir: &Path, version: Version) {
        let files: &[(&str, &str)] = match version {
            Version::V2 => &[
                ("memory.max", "max\n"),
                ("memory.current", "4096\n"),
                (
                    "memory.events",
                    "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n",
                ),
            ],
            Version::V1 => &[
                ("memory.limit_in_bytes", "9223372036854771712\n"),
                ("memory.usage_in_bytes", "8192\n"),
                (
                    "memory.oom_control",
                    "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
                ),
            ],
        };
        for (f, text) in files {
            fs::write(dir.join(f), text).unwrap();
        }
    }

    #[test]
    fn both_hierarchies_are_recognised_read_and_capped() {
        for (version, usage, kills, none) in
            [(Version::V2, 4096, 1, "max"), (Version::V1, 8192, 2, "-1")]
        {
            let root = fake(version);
            let c = Cgroups::open(root.path()).unwrap();
            assert_eq!(c.version(), version);
            if version == Version::V2 {
                let enabled =
                    fs::read_to_string(root.path().join("cgroup.subtree_control")).unwrap();
                assert_eq!(enabled, "+memory", "the controller is enabled for the VMs");
            }
            let dir = root.path().join("vm-a");
            fs::create_dir(&dir).unwrap();
            fs::write(dir.join("cgroup.procs"), "").unwrap();
            populate(&dir, version);
            let vm = c.vm("a").unwrap();
            assert_eq!(vm.path(), dir);
            assert_eq!(vm.limit(), None, "{version:?}: no cap reads as none");
            assert_eq!(vm.usage(), Some(usage));
            assert_eq!(vm.oom_kills(), Some(kills));
            vm.set_limit(Some(64 << 20)).unwrap();
            assert_eq!(vm.limit(), Some(64 << 20));
            vm.set_limit(None).unwrap();
            let file = dir.join(version.limit_file());
            assert_eq!(fs::read_to_string(file).unwrap(), none);
        }
    }

    #[test]
    fn a_directory_without_the_memory_controller_is_refused() {
        let plain = tempfile::tempdir().unwrap();
        let e = Cgroups::open(plain.path()).unwrap_err();
        assert!(e.to_string().contains("memory controller"), "{e}");
        let v2 = tempfile::tempdir().unwrap();
        fs::write(v2.path().join("cgroup.controllers"), "cpu pids\n").unwrap();
        let e = Cgroups::open(v2.path()).unwrap_err();
        assert!(e.to_string().contains("not enabled"), "{e}");
    }
}
