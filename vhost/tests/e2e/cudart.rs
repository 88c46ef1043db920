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
    ("graphs", &[]),
    ("graph_launches", &["2000"]),
    ("pools", &[]),
    ("graph_memory", &[]),
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
            compile(&nvcc, p, &dir, &[]);
            compile(&nvcc, p, &dir, &["-cudart", "shared"]);
        }
        dir
    })
}

/// Builds `tests/cudart/NAME.cu` into `dir` with nvcc 13 (`extra` given as
/// `-cudart shared` names it `NAME-shared`).
fn compile(nvcc: &Path, name: &str, dir: &Path, extra: &[&str]) -> PathBuf {
    let src = workspace().join(format!("tests/cudart/{name}.cu"));
    let suffix = if extra.is_empty() { "" } else { "-shared" };
    let exe = dir.join(format!("{name}{suffix}"));
    let o = Command::new(nvcc)
        .args(extra)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("nvcc runs");
    assert!(
        o.status.success(),
        "nvcc {name}.cu {extra:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    exe
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
    let o = String::from_utf8_lossy(&native("pools", &[]).stdout).into_owned();
    assert!(
        o.contains("memory pools supported: 1\n")
            && o.contains("three rounds: total 62619648 (expect 62619648)\n")
            && o.contains("new pool in use: 16000 bytes\n")
            && o.ends_with("done\n"),
        "{o}"
    );
    // Graph memory: addresses fixed when the nodes are made, reused after a free in
    // the same graph, live across launches until freed, and the driver's refusals.
    let o = String::from_utf8_lossy(&native("graph_memory", &[]).stdout).into_owned();
    assert!(
        o.contains("an allocation after the free of a larger one takes its address: yes\n")
            && o.contains("the node at a's address: 2048 bytes\n")
            && o.contains("three launches: b sums to 2078720 (expect 2078720)\n")
            && o.contains("the allocation sums to 526848 (expect 526848)\n")
            && o.contains("relaunch with the allocation live: cudaErrorInvalidValue\n")
            && o.contains("launched twice: sum 528896 (expect 528896)\n")
            && o.contains("trimmed: used 0, reserved 0, high 0\n")
            && o.ends_with("done\n"),
        "{o}"
    );
    // Graphs run their work after its dependencies, with the values their nodes
    // were given, and capture holds what the streams did.
    let o = String::from_utf8_lossy(&native("graphs", &[]).stdout).into_owned();
    assert!(
        o.contains("after 3 launches: sum 5994.0 (expect 5994.0), host node ran 3 times\n")
            && o.contains("with a = 3 in the instantiation: sum 8991.0\n")
            && o.contains("clone's kernel node: a = 2.0, grid 8, block 128\n")
            && o.contains(
                "after 4 launches: v sums to 2000, w to 1000, host function ran 4 times\n"
            )
            && o.contains("after the update: v sums to 1000\n")
            && o.contains("end with the fork not joined: cudaErrorStreamCaptureUnjoined\n")
            && o.ends_with("done\n"),
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

/// A runtime program's session moves to a new API server after every command while
/// it holds CUDA arrays (2D, layered, and one for surfaces), texture objects over
/// arrays and pitched memory (a first one destroyed before, so that the values held
/// have a gap before them) and a surface object, while kernels write and read them
/// and one texture and its array are dropped: each answer is the native one.
#[test]
fn a_runtime_session_moves_with_its_arrays_and_texture_and_surface_objects() {
    let k = kit();
    // Built on its own: it reads commands from its input, unlike PROGRAMS.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cudart-e2e-moves");
    std::fs::create_dir_all(&dir).unwrap();
    let exe = compile(&nvcc(), "texture_moves", &dir, &[]);
    let script = [
        "arrays", "textures", "write 3", "sample", "surf", "scale 2", "surf", "sample", "drop",
        "sample", "write -1", "surf", "end",
    ];
    let mut c = Command::new(&exe);
    c.env("LD_LIBRARY_PATH", lib_path(k.driver_dir()));
    let mut native = LineProgram::start(c);
    let expected: Vec<String> = script.iter().map(|c| native.ask(c)).collect();
    assert_eq!(
        expected.last().map(String::as_str),
        Some("bye"),
        "{expected:?}"
    );
    let d = crate::cuda::daemon_for_tests(&[]);
    let mut c = Command::new(&exe);
    c.env("LD_LIBRARY_PATH", lib_path(Some(k.shim_dir())))
        .env("HIRA_SOCKET", d.socket("vm1"));
    let mut p = LineProgram::start(c);
    let got: Vec<String> = script
        .iter()
        .map(|cmd| {
            let answer = p.ask(cmd);
            if *cmd != "end" {
                let (id, _) = crate::cuda::the_cuda_session(&d);
                let a = d.control(serde_json::json!({"cmd": "migrate", "session": id}));
                assert!(a["moved"].is_object(), "after {cmd}: {a}\n{}", d.log_text());
            }
            answer
        })
        .collect();
    assert_eq!(got, expected);
}
