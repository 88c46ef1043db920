//! Sessions placed on another host (`hira-bench remote`): the workload suite and the
//! synchronous call's round trip, natively, through Hira on this host, and through
//! Hira with the sessions on a GPU host across a network at 0, 50 and 500 µs of added
//! one-way delay (and, if asked, some packet loss), all in one run.
//!
//! The hosts are network namespaces joined by a bridge (`hosts`); the delay comes
//! from a relaying thread in the VM host's namespace (`delay`, test infrastructure);
//! the loss from `iptables`' random drop on the GPU host. Each workload also reports
//! the calls it made and how many of them waited for the host (round trips), from
//! the shim's statistics: at a remote host's distance, those are what cost.

use std::path::Path;
use std::time::Duration;

use anyhow::{Result, ensure};

use crate::env::{BenchEnv, build_components, compile, start_daemon_in, workspace};
use crate::hosts::{GPU_ADDR, Net, Pki};
use crate::measure::{Measurement, measure};
use crate::median;
use crate::overhead::field;

/// Where one column's sessions run.
#[derive(Debug, Clone)]
pub struct Placement {
    pub label: String,
    /// Added one-way delay in µs (`None`: on this host).
    pub delay_us: Option<u64>,
}

/// The figures of one run.
#[derive(Debug)]
pub struct Results {
    pub placements: Vec<Placement>,
    /// Per workload, one measurement per placement.
    pub workloads: Vec<(String, Vec<Measurement>)>,
    /// Calls and bulk transfers natively, then per placement.
    pub calls_native: Calls,
    pub calls: Vec<Calls>,
    /// The link's own figures per placement (`None`: on this host).
    pub link: Vec<Option<crate::link::Figures>>,
    /// The packet loss applied to the placements across the network.
    pub loss: f64,
    /// The bulk transfers' size, MiB.
    pub bulk_mib: u64,
}

/// A VM host whose sessions run on a GPU host across the network, for other
/// benchmarks' runs through Hira (`hira-bench rodinia --placed`): the hosts, their
/// daemons and the VM host's environment, which its `env` runs programs in. Fields
/// drop in order: the daemons before the hosts.
pub struct Placed {
    pub env: BenchEnv,
    _gpu: BenchEnv,
    _pki: Pki,
    _net: Net,
}

impl std::fmt::Debug for Placed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Placed")
            .field("env", &self.env)
            .finish_non_exhaustive()
    }
}

impl Placed {
    /// Hosts as namespaces (root), a GPU host, and a VM host reaching it `delay_us`
    /// late each way (0: directly).
    pub fn new(bin: &Path, delay_us: u64) -> Result<Placed> {
        ensure!(
            crate::hosts::can_make_hosts(),
            "runs placed on a GPU host make network namespaces: run as root"
        );
        let net = Net::new()?;
        let pki = Pki::new("placed")?;
        let gpu = gpu_host(bin, &net, &pki)?;
        let address = reach(&net, gpu_addr(), delay_us)?;
        let env = vm_host(bin, &net, &pki, &address)?;
        Ok(Placed {
            env,
            _gpu: gpu,
            _pki: pki,
            _net: net,
        })
    }
}

/// The GPU host's address.
fn gpu_addr() -> std::net::SocketAddr {
    GPU_ADDR.parse().expect("a socket address")
}

/// How the VM host reaches `to`: directly, or through a relay that delays each byte
/// `delay_us` each way.
fn reach(net: &Net, to: std::net::SocketAddr, delay_us: u64) -> Result<String> {
    if delay_us == 0 {
        return Ok(to.to_string());
    }
    Ok(net.relay_to(to, Duration::from_micros(delay_us))?.0)
}

/// A VM host in `net.a` whose VM `bench` runs its sessions on GPU host `gpu-b`,
/// reached at `address`.
fn vm_host(bin: &Path, net: &Net, pki: &Pki, address: &str) -> Result<BenchEnv> {
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("bench.sock");
    let config = dir.path().join("hira.toml");
    std::fs::write(
        &config,
        format!(
            "[[local]]\nvm = \"bench\"\npath = \"{}\"\ngpu_host = \"gpu-b\"\n\n{}\n\
             [[gpu_host]]\nname = \"gpu-b\"\naddress = \"{address}\"\n",
            socket.display(),
            pki.tls_section("host-a", None)?
        ),
    )?;
    let daemon = start_daemon_in(
        Some(&net.a),
        bin,
        dir.path(),
        ["--config".to_string(), config.display().to_string()],
    )?;
    BenchEnv::with_daemon(bin, daemon, dir, socket, None)
}

/// The GPU host in `net.b`, serving peer `host-a`.
fn gpu_host(bin: &Path, net: &Net, pki: &Pki) -> Result<BenchEnv> {
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("gpu-local.sock");
    let config = dir.path().join("hira.toml");
    std::fs::write(
        &config,
        format!(
            "[[local]]\nvm = \"gpu-local\"\npath = \"{}\"\n\n{}\n[[peer]]\nname = \"host-a\"\n",
            socket.display(),
            pki.tls_section("gpu-b", Some(GPU_ADDR))?
        ),
    )?;
    let daemon = start_daemon_in(
        Some(&net.b),
        bin,
        dir.path(),
        ["--config".to_string(), config.display().to_string()],
    )?;
    BenchEnv::with_daemon(bin, daemon, dir, socket, None)
}

/// A place's call costs and bulk throughput (medians).
#[derive(Debug, Clone, Copy, Default)]
pub struct Calls {
    /// A synchronous call's round trip and an asynchronous call's cost, µs.
    pub sync_us: f64,
    pub async_us: f64,
    /// Blocking writes to a buffer and reads from it, MiB/s.
    pub write_mibs: f64,
    pub read_mibs: f64,
}

/// The bulk transfer's size, MiB.
fn bulk_mib(short: bool) -> u64 {
    if short { 32 } else { 128 }
}

/// `rtt` and `bandwidth` run through `env` (or natively), `repeats` times each.
fn calls(
    env: &BenchEnv,
    remote: bool,
    exes: &[std::path::PathBuf; 2],
    short: bool,
    repeats: usize,
) -> Result<Calls> {
    let (mut sync, mut asyn, mut write, mut read) = (vec![], vec![], vec![], vec![]);
    for _ in 0..repeats {
        let out = env.command(remote, &exes[0], &["2000".into()]).output()?;
        ensure!(out.status.success(), "rtt failed");
        let text = String::from_utf8_lossy(&out.stdout);
        sync.push(field(&text, "sync_median_ns")? / 1e3);
        asyn.push(field(&text, "async_mean_ns")? / 1e3);
        let args = [bulk_mib(short).to_string(), "3".into()];
        let out = env.command(remote, &exes[1], &args).output()?;
        ensure!(out.status.success(), "bandwidth failed");
        let text = String::from_utf8_lossy(&out.stdout);
        ensure!(
            field(&text, "ok")? == 1.0,
            "bandwidth read back other bytes"
        );
        write.push(field(&text, "write_mibs")?);
        read.push(field(&text, "read_mibs")?);
    }
    Ok(Calls {
        sync_us: median(&mut sync),
        async_us: median(&mut asyn),
        write_mibs: median(&mut write),
        read_mibs: median(&mut read),
    })
}

/// Runs the whole comparison.
pub fn run(short: bool, repeats: usize, delays: &[u64], loss: f64) -> Result<Results> {
    ensure!(
        crate::hosts::can_make_hosts(),
        "hira-bench remote makes network namespaces: run it as root"
    );
    let bin = build_components()?;
    let cdir = tempfile::tempdir()?;
    let exes = crate::suite::compile_all(cdir.path())?;
    let probes = [cdir.path().join("rtt"), cdir.path().join("bandwidth")];
    compile(&workspace().join("tests/c/rtt.c"), &probes[0])?;
    compile(&workspace().join("tests/c/bandwidth.c"), &probes[1])?;
    let net = Net::new()?;
    if loss > 0.0 {
        net.lose(loss)?;
    }
    let pki = Pki::new("bench")?;
    let _gpu = gpu_host(&bin, &net, &pki)?;
    let probe = crate::link::serve_in(Some(&net.b), &gpu_addr().ip().to_string())?;
    let mut link = vec![None];
    let mut placements = vec![Placement {
        label: "this host".into(),
        delay_us: None,
    }];
    let mut envs = vec![BenchEnv::start(&bin)?];
    for &d in delays {
        let (address, probe_address) = (reach(&net, gpu_addr(), d)?, reach(&net, probe, d)?);
        eprint!("\r\x1b[2Klink: +{d} µs");
        link.push(Some(crate::link::measure_from(
            Some(&net.a),
            &probe_address,
            2000,
            4 * bulk_mib(short),
            repeats,
        )?));
        envs.push(vm_host(&bin, &net, &pki, &address)?);
        placements.push(Placement {
            label: format!("GPU host, +{d} µs"),
            delay_us: Some(d),
        });
    }
    let args: Vec<String> = if short {
        vec!["--short".into()]
    } else {
        vec![]
    };
    let mut workloads = Vec::new();
    for ((name, _), exe) in crate::suite::WORKLOADS.iter().zip(&exes) {
        let mut row = Vec::new();
        for (p, env) in placements.iter().zip(&envs) {
            eprint!("\r\x1b[2K{name}: {}", p.label);
            row.push(measure(env, name, exe, &args, 1, repeats, &mut |_| {})?);
        }
        workloads.push((name.to_string(), row));
    }
    eprint!("\r\x1b[2Kcalls: native");
    let calls_native = calls(&envs[0], false, &probes, short, repeats)?;
    let mut through = Vec::new();
    for (p, env) in placements.iter().zip(&envs) {
        eprint!("\r\x1b[2Kcalls: {}", p.label);
        through.push(calls(env, true, &probes, short, repeats)?);
    }
    eprint!("\r\x1b[2K");
    Ok(Results {
        placements,
        workloads,
        calls_native,
        calls: through,
        link,
        loss,
        bulk_mib: bulk_mib(short),
    })
}

/// The Markdown report.
pub fn report(r: &Results, repeats: usize) -> String {
    let mut md = String::from("## Sessions on another host\n\n");
    md += &format!(
        "Each workload natively and through Hira, its sessions on this host or on a GPU \
         host across a network (network namespaces joined by a bridge, mutual \
         TLS) with the one-way delay added by a relay (test infrastructure){}. Median of \
         {repeats} runs each, as the ratio to the native run made beside it; calls (the \
         application's) and round trips (every call that waited for the host, the \
         shim's own included) from the shim's statistics.\n\n",
        if r.loss > 0.0 {
            format!(
                ", and {:.1}% of the GPU host's packets dropped",
                r.loss * 100.0
            )
        } else {
            String::new()
        }
    );
    md += &header(
        "| workload | native s |",
        &r.placements,
        " calls | round trips | outputs |",
        "---:|---:|---|",
    );
    for (name, row) in &r.workloads {
        md += &format!("| {name} | {:.3} |", row[0].median_native());
        for m in row {
            md += &format!(" {:.2} |", m.median_ratio());
        }
        let last = row.last().expect("a placement");
        let same = row.iter().all(Measurement::verified);
        md += &format!(
            " {} | {} | {} |\n",
            last.calls,
            last.round_trips,
            if same { "identical" } else { "DIFFER" }
        );
    }
    md += &format!(
        "\nGeometric mean of the ratios: {}.\n",
        r.placements
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let v: Vec<f64> = r
                    .workloads
                    .iter()
                    .map(|(_, row)| row[i].median_ratio())
                    .collect();
                format!("{} {:.2}", p.label, crate::geomean(&v))
            })
            .collect::<Vec<_>>()
            .join(", ")
    );
    md += &calls_report(r, repeats);
    md
}

/// A table's heading: `lead` (two columns), a column per placement, then `tail`,
/// aligned as `tail_align`.
fn header(lead: &str, placements: &[Placement], tail: &str, tail_align: &str) -> String {
    let mut md = lead.to_string();
    for p in placements {
        md += &format!(" {} |", p.label);
    }
    md += tail;
    md += "\n|---|---:|";
    md += &"---:|".repeat(placements.len());
    md += tail_align;
    md + "\n"
}

/// The calls and bulk transfers beside the link's own figures.
fn calls_report(r: &Results, repeats: usize) -> String {
    let mut md = format!(
        "\n### Calls and bulk transfers against the link\n\n\
         A synchronous call (`tests/c/rtt.c`: `clGetCommandQueueInfo`, which Hira never \
         answers from a cache) and an asynchronously forwarded one (`clSetKernelArg`), \
         and blocking writes and reads of one buffer (`tests/c/bandwidth.c`, a fresh \
         session each run: the {} MiB transfers go inline, as every placed session's \
         do). Beside them, the link's own figures from the VM host to the GPU host \
         through the same relay (`benches/src/link.rs`, iperf-style, test \
         infrastructure): a 64-byte TCP round trip and one TCP stream each way. \
         Medians of {repeats} runs.\n\n",
        r.bulk_mib
    );
    md += &header("| | native |", &r.placements, "", "");
    let row = |label: &str, native: String, each: &dyn Fn(usize) -> String| {
        let mut line = format!("| {label} | {native} |");
        for i in 0..r.placements.len() {
            line += &format!(" {} |", each(i));
        }
        line + "\n"
    };
    let link = |i: usize, f: &dyn Fn(&crate::link::Figures) -> String| {
        r.link[i].as_ref().map(f).unwrap_or_else(|| "-".into())
    };
    // A throughput and, across the network, its share of the link's.
    let share = |i: usize, mibs: f64, link_mibs: fn(&crate::link::Figures) -> f64| match &r.link[i]
    {
        Some(l) => format!("{mibs:.0} ({:.0}%)", 100.0 * mibs / link_mibs(l)),
        None => format!("{mibs:.0}"),
    };
    md += &row("TCP round trip, µs", "-".into(), &|i| {
        link(i, &|l| format!("{:.1}", l.rtt_us))
    });
    md += &row(
        "synchronous call, µs",
        format!("{:.2}", r.calls_native.sync_us),
        &|i| format!("{:.1}", r.calls[i].sync_us),
    );
    md += &row(
        "asynchronous call, µs",
        format!("{:.2}", r.calls_native.async_us),
        &|i| format!("{:.2}", r.calls[i].async_us),
    );
    md += &row("TCP to the GPU host, MiB/s", "-".into(), &|i| {
        link(i, &|l| format!("{:.0}", l.to_mibs))
    });
    md += &row(
        "bulk write, MiB/s (share of TCP)",
        format!("{:.0}", r.calls_native.write_mibs),
        &|i| share(i, r.calls[i].write_mibs, |l| l.to_mibs),
    );
    md += &row("TCP from the GPU host, MiB/s", "-".into(), &|i| {
        link(i, &|l| format!("{:.0}", l.from_mibs))
    });
    md += &row(
        "bulk read, MiB/s (share of TCP)",
        format!("{:.0}", r.calls_native.read_mibs),
        &|i| share(i, r.calls[i].read_mibs, |l| l.from_mibs),
    );
    md
}
