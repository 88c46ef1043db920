//! Hira's CUDA test programs (`tests/cuda/*.c`, written against `cuda.h`) on the CPU
//! test executor, loaded as `libcuda.so.1` like the real driver: the executor must
//! compute what each program checks against its own CPU reference, and give the
//! errors the driver API defines. These are tests of test infrastructure; the same
//! programs run through Hira in the end-to-end tests.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use cuda::nvrtc;

/// The built programs, the PTX of the kernels and a directory holding the executor
/// as `libcuda.so.1`, made once for all tests.
struct Built {
    dir: PathBuf,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn built() -> &'static Built {
    static B: OnceLock<Built> = OnceLock::new();
    B.get_or_init(|| {
        let sdk = nvrtc::sdk().unwrap_or_else(|e| panic!("{e}"));
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cuda-cpu-programs");
        std::fs::create_dir_all(&dir).unwrap();
        // The executor, under the names the linker and the loader look for.
        let lib = std::env::current_exe()
            .unwrap()
            .parent()
            .unwrap()
            .parent()
            .unwrap()
            .join("libcuda.so");
        assert!(lib.is_file(), "{} is built with the tests", lib.display());
        for name in ["libcuda.so", "libcuda.so.1"] {
            let _ = std::fs::remove_file(dir.join(name));
            std::os::unix::fs::symlink(&lib, dir.join(name)).unwrap();
        }
        let src = std::fs::read_to_string(repo().join("tests/cuda/kernels.cu")).unwrap();
        let ptx = nvrtc::compile(&sdk, &src, &sdk.arch).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.join("kernels.ptx"), ptx).unwrap();
        for prog in [
            "vector_add",
            "matmul",
            "streams",
            "contexts",
            "fault",
            "printf",
        ] {
            let out = Command::new("gcc")
                .args(["-O2", "-Wall", "-Werror", "-o"])
                .arg(dir.join(prog))
                .arg(repo().join(format!("tests/cuda/{prog}.c")))
                .arg("-I")
                .arg(&sdk.include)
                .arg("-L")
                .arg(&dir)
                .args(["-lcuda", "-lm"])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{prog}.c: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Built { dir }
    })
}

/// Runs a program on the executor; returns its standard output, after checking it
/// exited with `code`.
fn run(prog: &str, code: i32) -> String {
    let b = built();
    let out = Command::new(b.dir.join(prog))
        .arg(b.dir.join("kernels.ptx"))
        .env("LD_LIBRARY_PATH", &b.dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(code),
        "{prog}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn vector_add_computes_every_element() {
    let out = run("vector_add", 0);
    assert!(
        out.contains("devices 1, warp 32, memory reported consistently: yes"),
        "{out}"
    );
    assert!(out.contains("vector_add n=100003 mismatches=0"), "{out}");
}

#[test]
fn tiled_matmul_with_shared_memory_and_barriers_is_exact() {
    let out = run("matmul", 0);
    assert!(out.contains("matmul n=70 mismatches=0"), "{out}");
}

#[test]
fn streams_events_atomics_and_dynamic_shared_memory_work() {
    let out = run("streams", 0);
    assert!(
        out.contains("histogram n=50000 bins_wrong=0 counted=50000"),
        "{out}"
    );
    assert!(
        out.contains("reduce m=40000 sum=180000.0 expected=180000.0"),
        "{out}"
    );
    assert!(out.contains("elapsed time measured: yes"), "{out}");
}

#[test]
fn contexts_modules_globals_and_driver_errors_behave_as_documented() {
    let out = run("contexts", 0);
    for want in [
        "new context is current: yes",
        "scale_table 16 bytes: 0.5 1.0 2.0 4.0",
        "scale in context b: mismatches=0",
        "popped b, a is current: yes",
        "context a's table unchanged: yes",
        "error names: CUDA_ERROR_INVALID_VALUE / out of memory",
        "contexts done",
    ] {
        assert!(out.contains(want), "{want:?} in {out}");
    }
}

#[test]
fn a_kernel_fault_is_reported_by_the_next_synchronisation_and_sticks() {
    let out = run("fault", 0);
    assert!(
        out.contains("launch 0, synchronize CUDA_ERROR_ILLEGAL_ADDRESS, later calls fail too: yes"),
        "{out}"
    );
}

#[test]
fn a_kernels_printf_lines_reach_stdout_when_the_context_is_synchronised() {
    let out = run("printf", 0);
    assert_eq!(
        out,
        "before\n\
         thread 0: d=0 u=4000000000 x=beef f=0.000000 s=lit c=A ld=-10000000000 w=[ 3.14]\n\
         thread 1: d=-7 u=3999999999 x=bef0 f=0.500000 s=lit c=B ld=-20000000000 w=[ 6.28]\n\
         thread 2: d=-14 u=3999999998 x=bef1 f=1.000000 s=lit c=C ld=-30000000000 w=[ 9.42]\n\
         after\n\
         printf returned 9 9 9\n\
         setting the printf FIFO size after such a launch: CUDA_ERROR_INVALID_VALUE\n"
    );
}
