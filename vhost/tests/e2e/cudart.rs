//! Programs written against NVIDIA's CUDA runtime (`tests/cudart/*.cu`), built by
//! nvcc 13 the default way (the runtime linked statically, PTX for `compute_75` beside
//! the cubin) and with the shared runtime, run natively and through Hira's
//! `libcuda.so.1` on the same driver, and must print the same.
//!
//! Without a GPU the driver is the CPU test executor, which serves what NVIDIA's
//! runtime asks of a driver (its private tables, libraries from fatbins) and runs the
//! fatbins' PTX. nvcc comes from PyPI (`scripts/test` installs it under
//! `target/nvcc13`; `HIRA_NVCC` names another).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use crate::cuda::kit;
use crate::support::*;

/// The programs, each built twice: `NAME` (static runtime) and `NAME-shared`, and
/// their arguments.
const PROGRAMS: &[(&str, &[&str])] = &[
    ("vector_add", &[]),
    ("features", &[]),
    ("launches", &["2000"]),
    ("warps", &[]),
    ("thrust", &[]),
    ("half", &[]),
    ("textures", &[]),
];

fn nvcc() -> PathBuf {
    std::env::var_os("HIRA_NVCC").map_or_else(
        || workspace().join("target/nvcc13/root/nvidia/cu13/bin/nvcc"),
        PathBuf::from,
    )
}

/// Where the shared runtime (`libcudart.so.13`) is: beside nvcc's `bin`, in `lib`
/// (PyPI's layout) or `lib64` (a CUDA toolkit's).
fn runtime_dir() -> PathBuf {
    let top = nvcc().parent().unwrap().parent().unwrap().to_path_buf();
    ["lib", "lib64"]
        .iter()
        .map(|d| top.join(d))
        .find(|d| d.join("libcudart.so.13").exists())
        .unwrap_or_else(|| top.join("lib"))
}

fn built() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let nvcc = nvcc();
        assert!(
            nvcc.is_file(),
            "{} is missing (scripts/test installs nvcc 13 from PyPI)",
            nvcc.display()
        );
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cudart-e2e");
        std::fs::create_dir_all(&dir).unwrap();
        for (p, _) in PROGRAMS {
            let src = workspace().join(format!("tests/cudart/{p}.cu"));
            for (suffix, extra) in [("", &[][..]), ("-shared", &["-cudart", "shared"][..])] {
                let o = Command::new(&nvcc)
                    .args(extra)
                    .arg("-o")
                    .arg(dir.join(format!("{p}{suffix}")))
                    .arg(&src)
                    .output()
                    .expect("nvcc runs");
                assert!(
                    o.status.success(),
                    "nvcc {p}.cu {extra:?}: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
            }
        }
        dir
    })
}

fn lib_path(first: Option<PathBuf>) -> String {
    let mut dirs: Vec<PathBuf> = first.into_iter().collect();
    dirs.push(runtime_dir());
    std::env::join_paths(dirs)
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

fn run(program: &str, args: &[&str], lib_path: &str, env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(built().join(program));
    c.args(args).env("LD_LIBRARY_PATH", lib_path);
    for (k, v) in env {
        c.env(k, v);
    }
    run_with_timeout(&mut c, Duration::from_secs(120))
}

fn native(program: &str, args: &[&str]) -> Output {
    run(program, args, &lib_path(kit().driver_dir()), &[])
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn nvcc_built_runtime_programs_print_through_hira_what_they_print_natively() {
    let k = kit();
    let d = crate::cuda::daemon_for_tests(&[]);
    let shim = lib_path(Some(k.shim_dir()));
    let socket = d.socket("vm1");
    let socket = socket.to_string_lossy();
    for (p, args) in PROGRAMS {
        for program in [p.to_string(), format!("{p}-shared")] {
            let n = native(&program, args);
            assert!(n.status.success(), "{program} natively: {}", text(&n));
            let h = run(&program, args, &shim, &[("HIRA_SOCKET", &socket)]);
            assert_eq!(text(&h), text(&n), "{program}: through Hira as natively");
        }
    }
    // The kernels' printf lines keep their place among the program's own, as
    // NVIDIA's driver prints them into the C library's stdout.
    let o = String::from_utf8_lossy(&native("features", &[]).stdout).into_owned();
    assert!(
        o.contains("clock64 advances: yes\nblock 0 thread 0 says 7\n")
            && o.contains("cudaErrorMemoryAllocation\nblock 0 thread 0 says 8\ndone\n"),
        "{o}"
    );
    // The warp program checks every result against the CUDA definitions itself.
    let o = String::from_utf8_lossy(&native("warps", &[]).stdout).into_owned();
    assert!(o.ends_with("all warp checks passed\n"), "{o}");
    let o = String::from_utf8_lossy(&native("half", &[]).stdout).into_owned();
    assert_eq!(o, "half results: ok\nhalf2 dot product: ok\n");
    let o = String::from_utf8_lossy(&native("thrust", &[]).stdout).into_owned();
    assert_eq!(o.matches(": ok\n").count(), 4, "{o}");
    let o = String::from_utf8_lossy(&native("features", &[]).stdout).into_owned();
    assert!(
        o.contains("cudaLaunchKernelEx with attributes: 0 mismatches\n"),
        "{o}"
    );
    assert!(
        o.contains("device pointer: type device, device 0, same address yes\n")
            && o.contains("capturing: no, capture mode was 0 then 2\n")
            && o.contains("host work on the stream: 11\n")
            && o.contains("pitched 2D copies: pitch 512, 128 of 128 values back\n")
            && o.contains("3D copies: 192 of 192 values back\n"),
        "{o}"
    );
    let ended = d.wait_idle(Duration::from_secs(30));
    assert!(
        ended.len() >= 2 * PROGRAMS.len() && ended.iter().all(|e| e["api"] == "CUDA"),
        "{ended:?}"
    );
}

/// nvcc-built programs (NVIDIA's runtime, static and shared: its primary context,
/// its libraries and their variables, its private tables) print what they print
/// natively while their sessions move between API servers wherever the moves land.
#[test]
fn nvcc_built_programs_print_what_they_print_natively_while_they_move() {
    let k = kit();
    let d = crate::cuda::daemon_for_tests(&[]);
    let shim = lib_path(Some(k.shim_dir()));
    let mut total = 0;
    for (p, args) in PROGRAMS {
        for program in [p.to_string(), format!("{p}-shared")] {
            let n = native(&program, args);
            let mut c = Command::new(built().join(&program));
            c.args(*args)
                .env("LD_LIBRARY_PATH", &shim)
                .env("HIRA_SOCKET", d.socket("vm1"));
            let moves = crate::cuda::moves_while_running(&d, c, &n);
            eprintln!("{program}: moved {moves} times");
            total += moves;
        }
    }
    assert!(total > 0, "no program moved");
}
