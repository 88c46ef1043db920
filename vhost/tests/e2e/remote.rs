//! Sessions placed on another host: two daemons in two network namespaces joined by a
//! veth pair, one a VM host and one a GPU host, over mutual TLS on real TCP. Programs
//! run on the VM host's socket and must print what they print natively; hosts that
//! cannot prove their names, and peers that send what is not Hira's, are refused while
//! the GPU host goes on serving.
//!
//! Needs root (namespaces, veth); without it each test says so and skips.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use hira_benches::hosts::{GPU_ADDR, GPU_C_ADDR, Net, Pki};

use hira_protocol::handshake::Hello;
use hira_protocol::{FrameHeader, FrameKind};

use crate::support::*;

fn ip(args: &[&str]) {
    hira_benches::hosts::ip(args).unwrap();
}

/// The hosts of a test: a VM host and one GPU host (two with `second_gpu_host`), and
/// their CA; `None`, with the reason said, where this process cannot make them.
fn hosts_here(second_gpu_host: bool) -> Option<(Net, Pki)> {
    if !hira_benches::hosts::can_make_hosts() {
        eprintln!("skipped: network namespaces need root");
        return None;
    }
    let net = if second_gpu_host {
        Net::with_second_gpu_host()
    } else {
        Net::new()
    };
    Some((net.unwrap(), Pki::new("one").unwrap()))
}

/// `[tls]` for `name` with certificates from `pki`.
fn tls_section(pki: &Pki, name: &str, listen: Option<&str>) -> String {
    pki.tls_section(name, listen).unwrap()
}

/// A daemon in network namespace `ns` with config file text `config`.
fn daemon_in(ns: &str, config: &str, env: &[(&str, &str)]) -> Daemon {
    ensure_built();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hira.toml");
    std::fs::write(
        &file,
        config.replace("@DIR@", &dir.path().display().to_string()),
    )
    .unwrap();
    let log = dir.path().join("daemon.log");
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns])
        .arg(env!("CARGO_BIN_EXE_hira-vhost"))
        .arg("--api-server-cache-dir")
        .arg(api_server_cache())
        .arg("--config")
        .arg(&file)
        .arg("--control-socket")
        .arg(dir.path().join("control.sock"))
        .env("RUST_LOG", "info")
        .env_remove("OCL_ICD_VENDORS")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let ready = Readiness::new(dir.path());
    ready.apply(&mut cmd);
    let mut d = Daemon::adopt(cmd.spawn().expect("ip netns exec hira-vhost"), dir, log);
    ready.wait(&mut d);
    d
}

/// A GPU host named `name` in namespace `ns` listening on `addr`, serving peer
/// `host-a` (share 3); its `[tls]` ends with `tls_extra`, and `more` follows it.
fn gpu_daemon(ns: &str, pki: &Pki, name: &str, addr: &str, tls_extra: &str, more: &str) -> Daemon {
    let driver = crate::cuda::kit()
        .driver_dir()
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    daemon_in(
        ns,
        &format!(
            "[[local]]\nvm = \"{name}-local\"\npath = \"@DIR@/local.sock\"\n\n{}{tls_extra}\n\
             [[peer]]\nname = \"host-a\"\nshare = 3\n\n{more}",
            tls_section(pki, name, Some(addr))
        ),
        &[("LD_LIBRARY_PATH", &driver)],
    )
}

/// GPU host `gpu-b` (in `net.b`), its `[tls]` ending with `tls_extra`.
fn gpu_host(net: &Net, pki: &Pki, tls_extra: &str) -> Daemon {
    gpu_daemon(&net.b, pki, "gpu-b", GPU_ADDR, tls_extra, "")
}

/// A GPU host (in `net.b`) serving peer `host-a`, and a VM host (in `net.a`) whose VM
/// `vm1` is placed on it, and whose VM `vm2` is placed on "gpu-c", which is B's address
/// under a name B's certificate does not hold.
fn hosts(net: &Net, pki: &Pki) -> (Daemon, Daemon) {
    hosts_with(net, pki, "")
}

/// As [`hosts`], both `[tls]` sections ending with `tls_extra`.
fn hosts_with(net: &Net, pki: &Pki, tls_extra: &str) -> (Daemon, Daemon) {
    let b = gpu_host(net, pki, tls_extra);
    let a = daemon_in(
        &net.a,
        &format!(
            "[[local]]\nvm = \"vm1\"\npath = \"@DIR@/vm1.sock\"\ngpu_host = \"gpu-b\"\n\n\
             [[local]]\nvm = \"vm2\"\npath = \"@DIR@/vm2.sock\"\ngpu_host = \"gpu-c\"\n\n{}{tls_extra}\n\
             [[gpu_host]]\nname = \"gpu-b\"\naddress = \"{GPU_ADDR}\"\n\n\
             [[gpu_host]]\nname = \"gpu-c\"\naddress = \"{GPU_ADDR}\"\n",
            tls_section(pki, "host-a", None)
        ),
        &[],
    );
    (a, b)
}

fn same_as_native(a: &Daemon, b: &Daemon, program: &str, args: &[&str]) {
    same_as_native_with(a, b, program, args, &[]);
}

/// As [`same_as_native`], the guest's environment extended by `env`.
fn same_as_native_with(a: &Daemon, b: &Daemon, program: &str, args: &[&str], env: &[(&str, &str)]) {
    let exe = c_program(program);
    let native = run_native(&exe, args);
    assert!(native.status.success(), "{program} fails natively");
    let vendors = Vendors::hira();
    let placed = run_with_timeout(
        a.guest(&vendors, "vm1", &exe)
            .args(args)
            .envs(env.iter().copied()),
        Duration::from_secs(300),
    );
    assert!(
        placed.status.success(),
        "{program} fails placed on the GPU host: {}\nVM host:\n{}\nGPU host:\n{}",
        String::from_utf8_lossy(&placed.stderr),
        a.log_text(),
        b.log_text()
    );
    assert!(!native.stdout.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&placed.stdout),
        String::from_utf8_lossy(&native.stdout),
        "{program}: placed on the GPU host, the output differs from the native run"
    );
}

#[test]
fn programs_placed_on_a_gpu_host_over_mutual_tls_print_what_they_print_natively() {
    let Some((net, pki)) = hosts_here(false) else {
        return;
    };
    let (a, b) = hosts(&net, &pki);
    // OpenCL: bulk data both ways (larger than any window), maps, events, threads.
    for (p, args) in [
        ("vecadd", &[][..]),
        ("matmul", &[]),
        ("events", &[]),
        ("mapping", &[]),
        ("threads", &[]),
        ("large", &[]),
    ] {
        same_as_native(&a, &b, p, args);
    }
    // A guest without rings sends its frames on its socket, bulk data inline.
    for p in ["large", "events"] {
        same_as_native_with(&a, &b, p, &[], &[("HIRA_RINGS", "0")]);
    }
    // A VM added at run time, as libvirt's hook adds one, is placed as its spec says.
    let vsock = a.dir.path().join("vm3.vsock");
    a.ctl_ok(&[
        "vm",
        "add",
        "vm3",
        &format!("hybrid={},cid=7,gpu-host=gpu-b", vsock.display()),
    ]);
    let listed = a.ctl_ok(&["vm", "list"]);
    assert!(
        listed.contains("sessions run on GPU host gpu-b"),
        "{listed}"
    );
    let unknown = a.ctl(&[
        "vm",
        "add",
        "vm4",
        "hybrid=/nonexistent/x,cid=8,gpu-host=gpu-z",
    ]);
    assert!(
        !unknown.status.success()
            && String::from_utf8_lossy(&unknown.stderr).contains("\"gpu-z\" is not one of"),
        "{unknown:?}"
    );
    let exe = c_program("vecadd");
    let vendors = Vendors::hira();
    let added = run_with_timeout(
        Command::new(&exe)
            .env("OCL_ICD_VENDORS", vendors.dir.path())
            .env("HIRA_SOCKET", format!("{}_5571", vsock.display())),
        Duration::from_secs(120),
    );
    assert_eq!(
        String::from_utf8_lossy(&added.stdout),
        String::from_utf8_lossy(&run_native(&exe, &[]).stdout),
        "vecadd on the added VM: {}",
        String::from_utf8_lossy(&added.stderr)
    );
    // CUDA on the GPU host's driver (the CPU test executor here).
    let k = crate::cuda::kit();
    for p in crate::cuda::PROGRAMS {
        let n = crate::cuda::native(p);
        assert!(n.status.success(), "{p} natively");
        let h = run_with_timeout(
            Command::new(k.exe(p))
                .arg(&k.ptx)
                .env("LD_LIBRARY_PATH", k.shim_dir())
                .env("HIRA_SOCKET", a.socket("vm1")),
            Duration::from_secs(120),
        );
        assert!(
            h.status.success(),
            "{p} placed on the GPU host: {}\n{}",
            String::from_utf8_lossy(&h.stderr),
            b.log_text()
        );
        assert_eq!(
            String::from_utf8_lossy(&h.stdout),
            String::from_utf8_lossy(&n.stdout),
            "{p}: placed on the GPU host, the output differs from the native run"
        );
    }
    // The VM host's records: every session ran on gpu-b; none had an API server here.
    // A host-local guest's rings ended in the VM host's pump; the two without rings
    // sent on their sockets.
    let ended_a = a.wait_idle(Duration::from_secs(30));
    assert!(!ended_a.is_empty());
    let mut on_socket = 0;
    for e in &ended_a {
        match e["data_plane"].as_str() {
            Some("remote gpu-b on rings") => {}
            Some("remote gpu-b") => on_socket += 1,
            _ => panic!("{e}"),
        }
        assert!(e["vm"] == "vm1" || e["vm"] == "vm3", "{e}");
        assert!(e["api_server_pid"].is_null(), "{e}");
    }
    assert_eq!(on_socket, 2, "{ended_a:?}");
    // The GPU host's: the same sessions, as tenant host-a:vm1, each with its own API
    // server, relayed, at the peer's share.
    let ended_b = b.wait_idle(Duration::from_secs(30));
    assert_eq!(ended_b.len(), ended_a.len(), "{ended_b:?}");
    for e in &ended_b {
        assert!(e["vm"] == "host-a:vm1" || e["vm"] == "host-a:vm3", "{e}");
        assert_eq!(e["data_plane"], "relayed", "{e}");
        assert!(e["api_server_pid"].as_u64().is_some_and(|p| p > 0), "{e}");
        assert!(e["commands"].as_u64().unwrap() > 0, "{e}");
    }
    let status = b.status();
    let tenant = status["vms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "host-a:vm1")
        .expect("the tenant is one of the GPU host's VMs");
    assert_eq!(tenant["share"], 3, "{tenant}");
    assert!(tenant["commands"].as_u64().unwrap() > 0, "{tenant}");
}

/// A TLS client in the VM host's namespace, as a VM host (or an impostor) would be.
fn client(roots: &Path, cert: &(PathBuf, PathBuf)) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut store = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(roots).unwrap() {
        store.add(c.unwrap()).unwrap();
    }
    let chain: Vec<_> = CertificateDer::pem_file_iter(&cert.0)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(&cert.1).unwrap();
    Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(store)
        .with_client_auth_cert(chain, key)
        .unwrap(),
    )
}

/// Connects to the GPU host with `config`, sends `then` after the handshake and
/// returns what the GPU host sent back until it closed (an error if the TLS
/// connection failed).
fn exchange(config: Arc<rustls::ClientConfig>, then: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut tcp = TcpStream::connect(GPU_ADDR)?;
    tcp.set_read_timeout(Some(Duration::from_secs(60)))?;
    let name = rustls::pki_types::ServerName::try_from("gpu-b").unwrap();
    let mut conn = rustls::ClientConnection::new(config, name).unwrap();
    let mut s = rustls::Stream::new(&mut conn, &mut tcp);
    s.write_all(then)?;
    let mut got = Vec::new();
    match s.read_to_end(&mut got) {
        Ok(_) => Ok(got),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(got),
        Err(e) => Err(e),
    }
}

#[test]
fn hosts_that_cannot_prove_their_names_and_peers_that_are_not_hira_are_refused() {
    let Some((net, pki)) = hosts_here(false) else {
        return;
    };
    let (a, b) = hosts(&net, &pki);
    let vendors = Vendors::hira();
    let vecadd = c_program("vecadd");
    // A VM placed on a GPU host whose certificate does not hold the name configured
    // for it: the VM host refuses to talk to it, and the guest is told.
    let wrong = run_with_timeout(
        &mut a.guest(&vendors, "vm2", &vecadd),
        Duration::from_secs(120),
    );
    assert!(
        !wrong.status.success(),
        "a GPU host that is not gpu-c served vm2"
    );
    let ended = a.wait_idle(Duration::from_secs(30));
    assert!(
        a.log_text().contains("GPU host \"gpu-c\"") && ended.iter().all(|e| e["vm"] == "vm2"),
        "{}",
        a.log_text()
    );
    let good = pki.issue("host-a", false).unwrap();
    let preamble = |vm: &str| {
        let mut p = b"HIRA-VMH".to_vec();
        p.extend_from_slice(&1u16.to_le_bytes());
        p.push(vm.len() as u8);
        p.extend_from_slice(vm.as_bytes());
        p
    };
    let refusals = |b: &Daemon| b.status()["remote_refused"].as_u64().unwrap();
    // Refusals are counted as the GPU host decides them, which a client that got an
    // alert may see first.
    let refused = |b: &Daemon, n: u64, what: &str| {
        let start = std::time::Instant::now();
        while refusals(b) < n {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{what}: not refused\n{}",
                b.log_text()
            );
            std::thread::yield_now();
        }
        assert_eq!(refusals(b), n, "{what}: refused once\n{}", b.log_text());
    };
    // The VM host's alert (the GPU host's certificate is not gpu-c's) ended that
    // connection on the GPU host too.
    refused(&b, 1, "a VM host that found the wrong name");
    let other_ca = Pki::new("two").unwrap();
    let cases: Vec<(&str, Arc<rustls::ClientConfig>)> = vec![
        (
            "a certificate from another CA",
            client(&pki.ca(), &other_ca.issue("host-a", false).unwrap()),
        ),
        (
            "a certificate that names no peer",
            client(&pki.ca(), &pki.issue("host-x", false).unwrap()),
        ),
        (
            "an expired certificate",
            client(&pki.ca(), &pki.issue("host-a", true).unwrap()),
        ),
    ];
    for (what, config) in cases {
        let before = refusals(&b);
        let got = Net::within(&net.a, || exchange(config, &preamble("vm1")));
        assert!(
            got.as_ref().is_err() || got.as_ref().is_ok_and(Vec::is_empty),
            "{what}: the GPU host answered {got:?}"
        );
        refused(&b, before + 1, what);
    }
    // Plaintext: a Hello with no TLS gets no Hira frame back.
    let before = refusals(&b);
    let plain = Net::within(&net.a, || {
        let mut tcp = TcpStream::connect(GPU_ADDR).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let hello = Hello::new(hira_apis_opencl::API, 1, "plain", 0).encode();
        let mut f = FrameHeader::new(FrameKind::Hello, 0, 0, 0, hello.len())
            .encode()
            .to_vec();
        f.extend_from_slice(&hello);
        let _ = tcp.write_all(&f);
        let mut got = Vec::new();
        let _ = tcp.read_to_end(&mut got);
        got
    });
    assert!(
        plain.first().is_none_or(|&b| b == 0x15),
        "plaintext got something other than a TLS alert: {plain:?}"
    );
    refused(&b, before + 1, "plaintext");
    // An authenticated peer that names a bad VM, or sends what is not a frame, is
    // refused or answered with an error; the GPU host goes on serving.
    let before = refusals(&b);
    let bad_name = Net::within(&net.a, || {
        exchange(client(&pki.ca(), &good), &preamble("../x"))
    });
    assert!(bad_name.is_ok_and(|g| g.is_empty()));
    refused(&b, before + 1, "a VM name that is not one");
    let mut junk = preamble("vm1");
    junk.extend_from_slice(&[0xab; 64]);
    let answer = Net::within(&net.a, || exchange(client(&pki.ca(), &good), &junk)).unwrap();
    let h = FrameHeader::decode(
        answer[..hira_protocol::frame::HEADER_LEN]
            .try_into()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        h.kind,
        FrameKind::Error,
        "junk is answered with an error frame"
    );
    // A resumption with a token no session here was given: refused, as a local one.
    let mut replay = preamble("vm1");
    let mut hello = Hello::new(hira_apis_opencl::API, 1, "replayer", 0);
    hello.resume = Some([0x5a; 16]);
    let body = hello.encode();
    replay.extend_from_slice(&FrameHeader::new(FrameKind::Hello, 0, 0, 0, body.len()).encode());
    replay.extend_from_slice(&body);
    let answer = Net::within(&net.a, || exchange(client(&pki.ca(), &good), &replay)).unwrap();
    let h = FrameHeader::decode(
        answer[..hira_protocol::frame::HEADER_LEN]
            .try_into()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(h.kind, FrameKind::Error, "a replayed token is refused");
    same_as_native(&a, &b, "vecadd", &[]);
}

/// `device_loss` started on the VM host's `vm1`, past its first computation.
fn device_loss(
    a: &Daemon,
    vendors: &Vendors,
) -> (
    std::process::Child,
    std::io::BufReader<std::process::ChildStdout>,
) {
    use std::io::BufRead;
    let mut guest = a
        .guest(vendors, "vm1", &c_program("device_loss"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(guest.stdout.take().unwrap());
    let mut seen = String::new();
    while !seen.ends_with("ready\n") {
        if out.read_line(&mut seen).unwrap() == 0 {
            let mut err = String::new();
            let _ = guest.stderr.take().unwrap().read_to_string(&mut err);
            panic!(
                "guest ended ({:?}): {seen}\n{err}\n{}",
                guest.wait(),
                a.log_text()
            );
        }
    }
    assert_eq!(seen, "first context computes: mismatches=0\nready\n");
    (guest, out)
}

/// Lets `device_loss` go on after its device was lost; it must see the loss as the
/// API's error, find the device again and compute on it.
fn recovers(mut guest: std::process::Child, mut out: impl Read, logs: &str) {
    guest.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let status = guest.wait().unwrap();
    let mut err = String::new();
    guest
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let expected = "next call after the loss: -5\n\
                    old queue: -5\n\
                    devices found again: 0 (some)\n\
                    new context on the old device handle: 0\n\
                    new context computes: mismatches=0\n\
                    old queue after recovery: -5\n";
    assert_eq!(rest, expected, "stderr:\n{err}\n{logs}");
    assert!(status.success(), "{status:?}\n{err}");
}

#[test]
fn a_gpu_host_that_dies_or_drops_off_the_network_costs_its_guests_the_device_not_a_hang() {
    let Some((net, pki)) = hosts_here(false) else {
        return;
    };
    let (a, mut b) = hosts_with(&net, &pki, "timeout_ms = 2000\n");
    let vendors = Vendors::hira();
    // Killed: its sockets close with it, and the guest learns at its next call.
    let (guest, out) = device_loss(&a, &vendors);
    b.wait_api_servers(1, Duration::from_secs(30));
    let listed = a.ctl_ok(&["list"]);
    assert!(
        listed.contains("@gpu-b"),
        "its API server is gpu-b's: {listed}"
    );
    b.child.kill().unwrap();
    b.child.wait().unwrap();
    let ended = a.wait_idle(Duration::from_secs(60));
    assert!(
        ended[0]["api_server_end"]
            .as_str()
            .unwrap()
            .contains("GPU host \"gpu-b\""),
        "{ended:?}"
    );
    // A new GPU host at the same address serves the guest's recovery.
    let b = gpu_host(&net, &pki, "timeout_ms = 2000\n");
    recovers(guest, out, &a.log_text());
    // Cut off: nothing closes, and the connection's bound on silence ends the session
    // on both hosts.
    let (guest, out) = device_loss(&a, &vendors);
    b.wait_api_servers(1, Duration::from_secs(30));
    ip(&["-n", &net.b, "link", "set", &net.b_link, "down"]);
    let ended = a.wait_idle(Duration::from_secs(60));
    let last = ended.last().unwrap();
    assert!(
        last["api_server_end"]
            .as_str()
            .unwrap()
            .contains("the connection to GPU host \"gpu-b\" failed"),
        "{last}\n{}",
        a.log_text()
    );
    let ended_b = b.wait_idle(Duration::from_secs(60));
    assert_eq!(ended_b.len(), 2, "{ended_b:?}");
    ip(&["-n", &net.b, "link", "set", &net.b_link, "up"]);
    recovers(guest, out, &a.log_text());
}

#[test]
fn a_link_that_drops_for_less_than_the_timeout_costs_nothing() {
    let Some((net, pki)) = hosts_here(false) else {
        return;
    };
    let (a, b) = hosts_with(&net, &pki, "timeout_ms = 30000\n");
    let vendors = Vendors::hira();
    let (mut guest, mut out) = device_loss(&a, &vendors);
    b.wait_api_servers(1, Duration::from_secs(30));
    // The guest's next calls leave while the link is down: TCP carries them once it
    // is back, within the timeout, and nothing was lost.
    ip(&["-n", &net.b, "link", "set", &net.b_link, "down"]);
    guest.stdin.take().unwrap().write_all(b"go\n").unwrap();
    // How long the link stays down: the fault this test makes, not a wait for one.
    std::thread::sleep(Duration::from_secs(2));
    ip(&["-n", &net.b, "link", "set", &net.b_link, "up"]);
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let status = guest.wait().unwrap();
    assert!(status.success(), "{status:?}\n{}", a.log_text());
    // As natively: the device was never lost.
    assert_eq!(
        rest,
        "next call after the loss: 0\n\
         old queue: 0\n\
         devices found again: 0 (some)\n\
         new context on the old device handle: 0\n\
         new context computes: mismatches=0\n\
         old queue after recovery: 0\n",
        "{}",
        a.log_text()
    );
    let ended = a.wait_idle(Duration::from_secs(30));
    assert_eq!(ended.len(), 1, "one session throughout: {ended:?}");
    assert_eq!(ended[0]["api_server_end"], "the guest closed", "{ended:?}");
}

#[test]
fn a_qemu_guests_programs_placed_on_the_gpu_host_print_what_they_print_natively() {
    let Some((net, pki)) = hosts_here(false) else {
        return;
    };
    let b = gpu_host(&net, &pki, "");
    let shm = shm_dir();
    let window = shm
        .as_ref()
        .map_or_else(|| b.dir.path().to_path_buf(), |d| d.path().to_path_buf())
        .join("qvm.window");
    // The VM has its window and asks for rings, as any VM of this host would; placed
    // on the GPU host, its sessions are relayed instead, and its programs cannot tell.
    let a = daemon_in(
        &net.a,
        &format!(
            "[[vm]]\nname = \"qvm\"\nsocket = \"@DIR@/qvm.vhost\"\ncid = 3\nwindow = \"{}\"\n\
             gpu_host = \"gpu-b\"\n\n{}\n[[gpu_host]]\nname = \"gpu-b\"\naddress = \"{GPU_ADDR}\"\n",
            window.display(),
            tls_section(&pki, "host-a", None)
        ),
        &[],
    );
    let programs = ["vecadd", "matmul", "events", "mapping", "threads", "printf"];
    // And CUDA programs, on the GPU host's driver (the CPU test executor here).
    let cuda = ["vector_add", "matmul", "streams", "transfer"];
    let k = crate::cuda::kit();
    let mut script = crate::vm::marked_script(&programs);
    for p in cuda {
        // The OpenCL matmul is /hira/matmul: the CUDA one goes in as cuda-matmul.
        script += &format!(
            "echo '=== cuda {p}'\n/hira/cuda-{p} /hira/kernels.ptx 2>/dev/null\necho \"=== exit $?\"\n"
        );
    }
    let image = bin_dir().join("hira-vm-remote");
    let staging = image.join("cuda");
    std::fs::create_dir_all(&staging).unwrap();
    let run = image.join("run");
    std::fs::write(&run, format!("#!/bin/sh\n{script}")).unwrap();
    std::fs::set_permissions(&run, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut cmd = Command::new(workspace().join("scripts/vm-image"));
    cmd.arg(&image).arg(shim()).arg(&run).arg(&k.ptx);
    for p in programs {
        cmd.arg(c_program(p));
    }
    for p in cuda {
        let renamed = staging.join(format!("cuda-{p}"));
        std::fs::copy(k.exe(p), &renamed).unwrap();
        cmd.arg(renamed);
    }
    let built = cmd.output().unwrap();
    assert!(
        built.status.success(),
        "vm-image failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let mut q = crate::vm::qemu_with_window(&image, &a.dir.path().join("qvm.vhost"), &window);
    let out = run_with_timeout(&mut q, Duration::from_secs(600));
    let console = String::from_utf8_lossy(&out.stdout);
    let mut expected = crate::vm::marked_native(&programs);
    for p in cuda {
        let o = crate::cuda::native(p);
        expected += &format!(
            "=== cuda {p}\n{}=== exit {}\n",
            String::from_utf8_lossy(&o.stdout),
            o.status.code().unwrap_or(-1)
        );
    }
    assert_eq!(
        crate::vm::guest_output(&console),
        expected,
        "VM host:\n{}\nGPU host:\n{}",
        a.log_text(),
        b.log_text()
    );
    let ended_a = a.wait_idle(Duration::from_secs(30));
    assert_eq!(ended_a.len(), programs.len() + cuda.len(), "{ended_a:?}");
    assert!(
        ended_a.iter().all(|e| e["data_plane"] == "remote gpu-b"),
        "{ended_a:?}"
    );
    let ended_b = b.wait_idle(Duration::from_secs(30));
    assert_eq!(ended_b.len(), programs.len() + cuda.len(), "{ended_b:?}");
    assert!(
        ended_b.iter().all(|e| e["vm"] == "host-a:qvm"),
        "{ended_b:?}"
    );
}

#[test]
fn programs_placed_across_a_slow_lossy_network_print_what_they_print_natively() {
    let Some((net, pki)) = hosts_here(false) else {
        return;
    };
    // 500 µs each way, and one packet in a hundred lost on its way to the GPU host.
    net.lose(0.01).unwrap();
    let relay = net.delayed(Duration::from_micros(500)).unwrap();
    let b = gpu_host(&net, &pki, "");
    let a = daemon_in(
        &net.a,
        &format!(
            "[[local]]\nvm = \"vm1\"\npath = \"@DIR@/vm1.sock\"\ngpu_host = \"gpu-b\"\n\n{}\n\
             [[gpu_host]]\nname = \"gpu-b\"\naddress = \"{relay}\"\n",
            tls_section(&pki, "host-a", None)
        ),
        &[],
    );
    for (p, args) in [
        ("vecadd", &[][..]),
        ("events", &[]),
        ("mapping", &[]),
        ("large", &[]),
    ] {
        same_as_native(&a, &b, p, args);
    }
    let ended = b.wait_idle(Duration::from_secs(30));
    assert!(ended.iter().all(|e| e["vm"] == "host-a:vm1"), "{ended:?}");
}

/// A GPU host of a pool: it also takes sessions handed over by `other`, which it
/// knows at `other_addr`.
fn pool_member(
    ns: &str,
    pki: &Pki,
    name: &str,
    addr: &str,
    other: &str,
    other_addr: &str,
) -> Daemon {
    gpu_daemon(
        ns,
        pki,
        name,
        addr,
        "",
        &format!(
            "[[peer]]\nname = \"{other}\"\n\n[[gpu_host]]\nname = \"{other}\"\naddress = \"{other_addr}\"\n"
        ),
    )
}

#[test]
fn placed_sessions_move_between_gpu_hosts_and_a_drained_host_takes_no_new_ones() {
    let Some((net, pki)) = hosts_here(true) else {
        return;
    };
    let b = pool_member(&net.b, &pki, "gpu-b", GPU_ADDR, "gpu-c", GPU_C_ADDR);
    let c = pool_member(
        net.c.as_ref().unwrap(),
        &pki,
        "gpu-c",
        GPU_C_ADDR,
        "gpu-b",
        GPU_ADDR,
    );
    // The VM host places by what each GPU host can take: both idle, gpu-b first.
    let a = daemon_in(
        &net.a,
        &format!(
            "[[local]]\nvm = \"vm1\"\npath = \"@DIR@/vm1.sock\"\ngpu_host = \"auto\"\n\n{}\n\
             [[gpu_host]]\nname = \"gpu-b\"\naddress = \"{GPU_ADDR}\"\n\n\
             [[gpu_host]]\nname = \"gpu-c\"\naddress = \"{GPU_C_ADDR}\"\n",
            tls_section(&pki, "host-a", None)
        ),
        &[],
    );
    let script = ["step", "step", "loop 50", "check", "end"];
    let expected = crate::migration::native(&script);
    let vendors = Vendors::hira();
    let mut p = crate::support::LineProgram::start(a.guest(&vendors, "vm1", &c_program("migrate")));
    b.wait_api_servers(1, Duration::from_secs(30));
    let mut got = vec![p.ask(script[0])];
    // Handed from gpu-b to gpu-c while it runs: the guest and its VM host stay put.
    let out = b.ctl_ok(&["migrate", "host-a:vm1", "--to", "gpu-c"]);
    assert!(out.contains("waiting at gpu-c"), "{out}");
    got.push(p.ask(script[1]));
    c.wait_api_servers(1, Duration::from_secs(30));
    assert!(b.status()["sessions"].as_array().unwrap().is_empty());
    // gpu-c is drained for maintenance: its session goes back to gpu-b, with calls
    // in flight.
    p.send(script[2]);
    let drained = c.ctl_ok(&["drain"]);
    assert!(
        drained.contains("moved to GPU host gpu-b") && drained.contains("1 moved, 0 not"),
        "{drained}\n{}",
        c.log_text()
    );
    got.push(p.line());
    b.wait_api_servers(1, Duration::from_secs(30));
    got.push(p.ask(script[3]));
    // A new session goes elsewhere: gpu-c says it is drained.
    let vecadd = c_program("vecadd");
    let more = run_with_timeout(
        &mut a.guest(&vendors, "vm1", &vecadd),
        Duration::from_secs(120),
    );
    assert_eq!(
        String::from_utf8_lossy(&more.stdout),
        String::from_utf8_lossy(&run_native(&vecadd, &[]).stdout)
    );
    assert_eq!(
        c.status()["ended"].as_array().unwrap().len(),
        1,
        "gpu-c served only the moved session"
    );
    got.push(p.ask(script[4]));
    assert_eq!(got, expected, "VM host:\n{}", a.log_text());
    drop(p);
    // One session on the VM host throughout, and its moves on the GPU hosts.
    let ended = a.wait_idle(Duration::from_secs(30));
    let moves: Vec<&str> = ended
        .iter()
        .map(|e| e["api_server_end"].as_str().unwrap())
        .collect();
    assert!(
        moves.contains(&"moved to GPU host \"gpu-c\"")
            && moves.contains(&"moved to GPU host \"gpu-b\""),
        "{moves:?}"
    );
    let vecadd_run = ended
        .iter()
        .find(|e| e["process"] == "vecadd")
        .expect("vecadd's session");
    // Moved twice, it went on with the rings the VM host first gave it.
    assert_eq!(
        vecadd_run["data_plane"], "remote gpu-b on rings",
        "{vecadd_run}"
    );
    b.wait_idle(Duration::from_secs(30));
}

#[test]
fn a_connection_cut_under_calls_in_flight_is_resumed_and_every_call_runs_once() {
    let Some((net, pki)) = hosts_here(false) else {
        return;
    };
    // Through a relay (500 µs each way) whose connections the test cuts, as a
    // middlebox that drops its state would: both hosts see their socket close.
    let (relay, carried) = net.relay(Duration::from_micros(500)).unwrap();
    let b = gpu_host(&net, &pki, "timeout_ms = 10000\n");
    let a = daemon_in(
        &net.a,
        &format!(
            "[[local]]\nvm = \"vm1\"\npath = \"@DIR@/vm1.sock\"\ngpu_host = \"gpu-b\"\n\n{}\
             timeout_ms = 10000\n\n[[gpu_host]]\nname = \"gpu-b\"\naddress = \"{relay}\"\n",
            tls_section(&pki, "host-a", None)
        ),
        &[],
    );
    let script = ["step", "loop 300", "check", "loop 300", "end"];
    let expected = crate::migration::native(&script);
    let vendors = Vendors::hira();
    let mut p = crate::support::LineProgram::start(a.guest(&vendors, "vm1", &c_program("migrate")));
    let mut got = vec![p.ask(script[0])];
    // Cut while the 300 steps stream: what was in flight either way is sent again.
    p.send(script[1]);
    carried.cut();
    got.push(p.line());
    got.push(p.ask(script[2]));
    p.send(script[3]);
    carried.cut();
    got.push(p.line());
    got.push(p.ask(script[4]));
    assert_eq!(
        got,
        expected,
        "VM host:\n{}\nGPU host:\n{}",
        a.log_text(),
        b.log_text()
    );
    drop(p);
    let ended = a.wait_idle(Duration::from_secs(30));
    assert_eq!(ended.len(), 1, "{ended:?}");
    let how = ended[0]["api_server_end"].as_str().unwrap();
    assert!(how.contains("reconnection(s)"), "{how}");
    assert_eq!(ended[0]["data_plane"], "remote gpu-b on rings", "{ended:?}");
    // One session on the GPU host throughout, one API server (the connections that
    // came back joined it).
    let ended_b = b.wait_idle(Duration::from_secs(30));
    let served: Vec<_> = ended_b
        .iter()
        .filter(|e| !e["api_server_pid"].is_null())
        .collect();
    assert_eq!(served.len(), 1, "{ended_b:?}");
    assert_eq!(served[0]["process"], "migrate", "{ended_b:?}");
    assert!(b.status()["reconnections"].as_u64().unwrap() >= 1);
}
