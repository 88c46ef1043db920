//! **Test infrastructure**: hosts for tests and benchmarks of sessions across hosts,
//! made on this machine. Network namespaces joined by veth pairs stand in for the
//! hosts, and a throwaway CA signs their certificates. Traffic stays between the
//! namespaces made here.

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result, ensure};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// The GPU host's address in its namespace.
pub const GPU_ADDR: &str = "10.203.0.2:5580";

/// Runs `ip ARGS`.
pub fn ip(args: &[&str]) -> Result<()> {
    let o = Command::new("ip")
        .args(args)
        .output()
        .context("ip runs (install iproute2)")?;
    ensure!(
        o.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(())
}

/// The second GPU host's address in its namespace (with [`Net::with_second_gpu_host`]).
pub const GPU_C_ADDR: &str = "10.203.0.3:5580";

/// Hosts as network namespaces, each joined by a veth pair to a bridge in a hub
/// namespace of their own: `a` (a VM host, 10.203.0.1), `b` (a GPU host, 10.203.0.2)
/// and, if asked, `c` (another GPU host, 10.203.0.3). Removed on drop.
#[derive(Debug)]
pub struct Net {
    pub a: String,
    pub b: String,
    pub c: Option<String>,
    /// The GPU host's end of its veth pair (down: the host is cut off).
    pub b_link: String,
    hub: String,
}

impl Net {
    /// A VM host and a GPU host.
    pub fn new() -> Result<Net> {
        Self::make(false)
    }

    /// A VM host and two GPU hosts.
    pub fn with_second_gpu_host() -> Result<Net> {
        Self::make(true)
    }

    fn make(second_gpu: bool) -> Result<Net> {
        static N: AtomicU32 = AtomicU32::new(0);
        let tag = format!(
            "{}x{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let net = Net {
            a: format!("hira-a-{tag}"),
            b: format!("hira-b-{tag}"),
            c: second_gpu.then(|| format!("hira-c-{tag}")),
            // Interface names are at most 15 bytes.
            b_link: format!("hb{tag}"),
            hub: format!("hira-h-{tag}"),
        };
        ip(&["netns", "add", &net.hub])?;
        ip(&["-n", &net.hub, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &net.hub, "link", "set", "br0", "up"])?;
        let hosts = [Some((&net.a, "a", 1)), Some((&net.b, "b", 2))]
            .into_iter()
            .chain([net.c.as_ref().map(|c| (c, "c", 3))])
            .flatten();
        for (ns, letter, n) in hosts {
            let (inner, outer) = (format!("h{letter}{tag}"), format!("p{letter}{tag}"));
            ip(&["netns", "add", ns])?;
            ip(&[
                "link", "add", &inner, "type", "veth", "peer", "name", &outer,
            ])?;
            ip(&["link", "set", &inner, "netns", ns])?;
            ip(&["link", "set", &outer, "netns", &net.hub])?;
            ip(&["-n", &net.hub, "link", "set", &outer, "master", "br0"])?;
            ip(&["-n", &net.hub, "link", "set", &outer, "up"])?;
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("10.203.0.{n}/24"),
                "dev",
                &inner,
            ])?;
            ip(&["-n", ns, "link", "set", &inner, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    /// Runs `f` on a thread of its own whose network namespace is `ns`.
    pub fn within<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|s| {
            s.spawn(|| {
                enter(ns).expect("enters the namespace");
                f()
            })
            .join()
            .expect("the thread in the namespace finished")
        })
    }

    /// A relay in the VM host's namespace, on 127.0.0.1, that reaches the GPU host
    /// (`GPU_ADDR`) `one_way` late in each direction (`delay`); its address. It serves
    /// until the process ends.
    pub fn delayed(&self, one_way: std::time::Duration) -> Result<String> {
        Ok(self.relay(one_way)?.0)
    }

    /// As [`Net::delayed`], with the relay's connections, to cut them.
    pub fn relay(
        &self,
        one_way: std::time::Duration,
    ) -> Result<(String, crate::delay::Connections)> {
        self.relay_to(GPU_ADDR.parse().expect("a socket address"), one_way)
    }

    /// As [`Net::relay`], to `to` in any namespace the VM host reaches.
    pub fn relay_to(
        &self,
        to: std::net::SocketAddr,
        one_way: std::time::Duration,
    ) -> Result<(String, crate::delay::Connections)> {
        let ns = self.a.clone();
        let carried = crate::delay::Connections::default();
        let relayed = carried.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let bound = enter(&ns).and_then(|()| Ok(std::net::TcpListener::bind("127.0.0.1:0")?));
            match bound {
                Ok(l) => {
                    let _ = tx.send(l.local_addr().map_err(anyhow::Error::from));
                    crate::delay::serve_with(&l, to, one_way, &relayed);
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        });
        Ok((
            rx.recv().context("the relay started")??.to_string(),
            carried,
        ))
    }

    /// Drops a share `probability` (0 to 1) of the packets the GPU host receives.
    pub fn lose(&self, probability: f64) -> Result<()> {
        let o = Command::new("ip")
            .args(["netns", "exec", &self.b, "iptables", "-A", "INPUT", "-m"])
            .args(["statistic", "--mode", "random", "--probability"])
            .arg(probability.to_string())
            .args(["-j", "DROP"])
            .output()
            .context("iptables runs (install iptables)")?;
        ensure!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        Ok(())
    }
}

/// Moves the calling thread into network namespace `ns`.
pub fn enter(ns: &str) -> Result<()> {
    let fd = std::fs::File::open(format!("/var/run/netns/{ns}"))?;
    // SAFETY: setns on the calling thread only, with a namespace's descriptor.
    let r = unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) };
    ensure!(r == 0, "setns {ns}: {}", std::io::Error::last_os_error());
    Ok(())
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in [
            Some(&self.a),
            Some(&self.b),
            self.c.as_ref(),
            Some(&self.hub),
        ]
        .into_iter()
        .flatten()
        {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

/// A throwaway CA and the certificates it signs, as PEM files.
pub struct Pki {
    pub dir: tempfile::TempDir,
    ca: KeyPair,
    ca_params: CertificateParams,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Pki {
    pub fn new(label: &str) -> Result<Pki> {
        let dir = tempfile::tempdir()?;
        let ca = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, format!("Hira test CA {label}"));
        let cert = ca_params.self_signed(&ca)?;
        std::fs::write(dir.path().join("ca.crt"), cert.pem())?;
        Ok(Pki { dir, ca, ca_params })
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// A certificate for `name` and its key; `expired` makes one whose validity ended
    /// in 2021.
    pub fn issue(&self, name: &str, expired: bool) -> Result<(PathBuf, PathBuf)> {
        let key = KeyPair::generate()?;
        let mut p = CertificateParams::new(vec![name.to_string()])?;
        p.distinguished_name.push(DnType::CommonName, name);
        if expired {
            p.not_before = rcgen::date_time_ymd(2020, 1, 1);
            p.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let cert = p.signed_by(&key, &Issuer::from_params(&self.ca_params, &self.ca))?;
        let stem = format!("{name}{}", if expired { "-expired" } else { "" });
        let (c, k) = (
            self.dir.path().join(format!("{stem}.crt")),
            self.dir.path().join(format!("{stem}.key")),
        );
        std::fs::write(&c, cert.pem())?;
        std::fs::write(&k, key.serialize_pem())?;
        Ok((c, k))
    }

    /// A `[tls]` section for host `name`, listening on `listen` if given.
    pub fn tls_section(&self, name: &str, listen: Option<&str>) -> Result<String> {
        let (c, k) = self.issue(name, false)?;
        let mut s = format!(
            "[tls]\nname = \"{name}\"\ncert = \"{}\"\nkey = \"{}\"\nca = \"{}\"\n",
            c.display(),
            k.display(),
            self.ca().display()
        );
        if let Some(l) = listen {
            s += &format!("listen = \"{l}\"\n");
        }
        Ok(s)
    }
}

/// Whether this process may make namespaces (it runs as root).
pub fn can_make_hosts() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
