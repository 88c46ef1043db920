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
    /// Median synchronous round trip, native then per placement (µs).
    pub rtt_native_us: f64,
    pub rtt_us: Vec<f64>,
    /// The packet loss applied to the placements across the network.
    pub loss: f64,
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

/// The median synchronous round trip of `rtt` run through `env` (or natively), µs.
fn rtt_us(env: &BenchEnv, remote: bool, exe: &Path, repeats: usize) -> Result<f64> {
    let mut v = Vec::new();
    for _ in 0..repeats {
        let out = env
            .command(remote, exe, &["2000".into(), "sync".into()])
            .output()?;
        ensure!(out.status.success(), "rtt failed");
        v.push(field(&String::from_utf8_lossy(&out.stdout), "sync_median_ns")? / 1e3);
    }
    Ok(median(&mut v))
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
    let rtt = cdir.path().join("rtt");
    compile(&workspace().join("tests/c/rtt.c"), &rtt)?;
    let net = Net::new()?;
    if loss > 0.0 {
        net.lose(loss)?;
    }
    let pki = Pki::new("bench")?;
    let _gpu = gpu_host(&bin, &net, &pki)?;
    let mut placements = vec![Placement {
        label: "this host".into(),
        delay_us: None,
    }];
    let mut envs = vec![BenchEnv::start(&bin)?];
    for &d in delays {
        let address = if d == 0 {
            GPU_ADDR.to_string()
        } else {
            net.delayed(Duration::from_micros(d))?
        };
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
    eprint!("\r\x1b[2K");
    let rtt_native_us = rtt_us(&envs[0], false, &rtt, repeats)?;
    let rtt_us = envs
        .iter()
        .map(|e| rtt_us(e, true, &rtt, repeats))
        .collect::<Result<Vec<_>>>()?;
    Ok(Results {
        placements,
        workloads,
        rtt_native_us,
        rtt_us,
        loss,
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
    md += "| workload | native s |";
    for p in &r.placements {
        md += &format!(" {} |", p.label);
    }
    md += " calls | round trips | outputs |\n|---|---:|";
    for _ in &r.placements {
        md += "---:|";
    }
    md += "---:|---:|---|\n";
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
        "\nSynchronous call round trip (`rtt`, median µs): native {:.2}",
        r.rtt_native_us
    );
    for (p, us) in r.placements.iter().zip(&r.rtt_us) {
        md += &format!("; {} {us:.2}", p.label);
    }
    md += ".\n";
    md
}
