//! CUDA through Hira: C programs written against `cuda.h` (`tests/cuda/*.c`) run
//! natively on the host's driver and through Hira's `libcuda.so.1`, daemon and API
//! server on the same driver, and must print the same.
//!
//! Without a GPU (CI), "the host's driver" is the CPU test executor
//! (`tests/cuda-cpu`, test infrastructure that interprets PTX), which the unmodified
//! API server loads from its library path as it would load NVIDIA's. With
//! `HIRA_CUDA_E2E=1` the same tests use the machine's real driver and GPU.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use hira_protocol::handshake::{ErrorPayload, Hello};
use hira_protocol::{FrameHeader, FrameKind};

use crate::scheduling::wait_for;
use crate::support::*;

pub(crate) const PROGRAMS: &[&str] = &[
    "vector_add",
    "matmul",
    "streams",
    "contexts",
    "fault",
    "transfer",
    "launches",
    "misc",
    "printf",
    "pitch",
];
/// Programs that run through Hira only, or that other tests drive.
const HIRA_ONLY: &[&str] = &["entry_points", "busy", "launch_error", "migrate"];

/// Whether the tests use the machine's real CUDA driver.
pub(crate) fn real_gpu() -> bool {
    std::env::var_os("HIRA_CUDA_E2E").is_some_and(|v| v == "1")
}

pub(crate) struct Kit {
    dir: PathBuf,
    pub(crate) ptx: PathBuf,
}

impl Kit {
    /// Where the driver the programs and API servers load lives (`None`: the
    /// system's).
    pub(crate) fn driver_dir(&self) -> Option<PathBuf> {
        (!real_gpu()).then(|| self.dir.join("driver"))
    }

    pub(crate) fn shim_dir(&self) -> PathBuf {
        self.dir.join("shim")
    }

    pub(crate) fn exe(&self, name: &str) -> PathBuf {
        match name {
            // The Rust program, built by cargo (tests/cuda-rust).
            "cudarc-guest" => bin_dir().join(name),
            _ => self.dir.join(name),
        }
    }
}

/// Copies `lib` into `dir` under the names programs and cudarc load. Copies, not
/// links: the API server's sandbox lets it read its library path, not where a link
/// would lead.
fn install_as_libcuda(lib: &Path, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for name in ["libcuda.so.1", "libcuda.so"] {
        std::fs::copy(lib, dir.join(name)).unwrap();
    }
}

/// The programs, the kernels' PTX (compiled by NVRTC) and the two libcuda.so.1.
pub(crate) fn kit() -> &'static Kit {
    static KIT: OnceLock<Kit> = OnceLock::new();
    KIT.get_or_init(|| {
        ensure_built();
        let sdk = cuda::nvrtc::sdk().unwrap_or_else(|e| panic!("{e}"));
        // Under cargo's directory for test files, made afresh by each test run.
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cuda-e2e");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let kit = Kit {
            ptx: dir.join("kernels.ptx"),
            dir,
        };
        if let Some(d) = kit.driver_dir() {
            install_as_libcuda(&bin_dir().join("libcuda.so"), &d);
        }
        install_as_libcuda(&bin_dir().join("libhira_cuda.so"), &kit.shim_dir());
        let src = std::fs::read_to_string(workspace().join("tests/cuda/kernels.cu")).unwrap();
        let ptx = cuda::nvrtc::compile(&sdk, &src, &sdk.arch).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&kit.ptx, ptx).unwrap();
        for p in PROGRAMS.iter().chain(HIRA_ONLY) {
            // Linked against Hira's library; which one runs is the library path's
            // choice, as for any program linked with -lcuda.
            let out = Command::new("gcc")
                .args(["-O2", "-Wall", "-Werror", "-o"])
                .arg(kit.exe(p))
                .arg(workspace().join(format!("tests/cuda/{p}.c")))
                .arg("-I")
                .arg(&sdk.include)
                .arg("-L")
                .arg(kit.shim_dir())
                .args(["-lcuda", "-lm"])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{p}.c: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        kit
    })
}

/// A daemon whose API servers find the driver, for other modules' tests.
pub(crate) fn daemon_for_tests(env: &[(&str, &str)]) -> Daemon {
    daemon(env)
}

/// A daemon whose API servers find the driver.
fn daemon(env: &[(&str, &str)]) -> Daemon {
    daemon_with(&["vm1"], env)
}

/// A daemon with VM `vm1` as `vm` says (`vm1,mem-quota=8M`).
fn daemon_with(vm: &[&str], env: &[(&str, &str)]) -> Daemon {
    let k = kit();
    let lib_path = k
        .driver_dir()
        .map(|d| d.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut all = vec![("LD_LIBRARY_PATH", lib_path.as_str())];
    all.extend_from_slice(env);
    Daemon::start_with_env(vm, &all)
}

pub(crate) fn native(program: &str) -> Output {
    let k = kit();
    let mut c = Command::new(k.exe(program));
    c.arg(&k.ptx);
    match k.driver_dir() {
        Some(d) => c.env("LD_LIBRARY_PATH", d),
        None => c.env_remove("LD_LIBRARY_PATH"),
    };
    run_with_timeout(&mut c, Duration::from_secs(120))
}

fn through_hira(d: &Daemon, program: &str, env: &[(&str, &str)]) -> Output {
    let k = kit();
    let mut c = Command::new(k.exe(program));
    c.arg(&k.ptx)
        .env("LD_LIBRARY_PATH", k.shim_dir())
        .env("HIRA_SOCKET", d.socket("vm1"));
    for (key, v) in env {
        c.env(key, v);
    }
    run_with_timeout(&mut c, Duration::from_secs(120))
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn same_as_native(d: &Daemon, env: &[(&str, &str)]) {
    for p in PROGRAMS {
        let n = native(p);
        assert!(n.status.success(), "{p} natively: {}", text(&n));
        let h = through_hira(d, p, env);
        assert!(h.status.success(), "{p} through Hira: {}", text(&h));
        assert_eq!(
            String::from_utf8_lossy(&h.stdout),
            String::from_utf8_lossy(&n.stdout),
            "{p}: the same output through Hira as natively"
        );
    }
}

#[test]
fn cuda_programs_print_through_hira_what_they_print_natively() {
    let d = daemon(&[]);
    same_as_native(&d, &[]);
    // What failed calls leave in their out-values is the guest library's doing
    // (the host sends nothing back on a failure): as NVIDIA's driver does.
    let o = through_hira(&d, "contexts", &[]);
    let o = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.contains("a failed lookup leaves a null handle: yes")
            && o.contains("failed allocations leave 0: yes")
            && o.contains("cuCtxCreate_v4: current yes, two contexts yes, then b again yes\n"),
        "{o}"
    );
    // A kernel's printf reaches the guest program's standard output, between what the
    // program printed before the launch and after the synchronisation.
    let o = through_hira(&d, "printf", &[]);
    let o = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.starts_with(
            "before\nthread 0: d=0 u=4000000000 x=beef f=0.000000 s=lit c=A ld=-10000000000 w=[ 3.14]\n"
        ) && o.contains("w=[ 9.42]\nafter\nprintf returned 9 9 9\n"),
        "{o}"
    );
    // Bytes to and from 1D arrays land where the offsets say (the executor agrees
    // with NVIDIA's driver on a copy past the array's end: CUDA_ERROR_INVALID_VALUE).
    let o = String::from_utf8_lossy(&native("pitch").stdout).into_owned();
    assert!(
        o.contains(", [20] -5.00, ") && o.contains("past the end 1\n"),
        "{o}"
    );
    let log = d.log_text();
    assert!(
        log.contains("vector_add") && log.contains("shared-memory rings"),
        "the sessions ran on rings: {log}"
    );
    // The daemon's records name the API each session spoke, from its description.
    let ended = d.wait_idle(Duration::from_secs(30));
    assert!(
        !ended.is_empty() && ended.iter().all(|e| e["api"] == "CUDA"),
        "{ended:?}"
    );
}

#[test]
fn cuda_programs_give_the_same_results_with_frames_relayed_by_the_daemon() {
    let d = daemon(&[]);
    same_as_native(&d, &[("HIRA_RINGS", "0")]);
}

#[test]
fn a_host_without_a_cuda_driver_refuses_cuda_sessions_with_the_reason() {
    if real_gpu() {
        eprintln!("skipped: HIRA_CUDA_E2E=1 means this host has a CUDA driver");
        return;
    }
    let _ = kit();
    // No driver on the API servers' library path (this machine has none of its own).
    let d = Daemon::start_with_env(&["vm1"], &[("LD_LIBRARY_PATH", "")]);
    let out = through_hira(&d, "matmul", &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("this host has no CUDA driver"), "{err}");
    assert!(
        err.contains("cuInit(0) failed: 100"),
        "cuInit says CUDA_ERROR_NO_DEVICE: {err}"
    );
    assert!(
        d.wait_api_servers(0, Duration::from_secs(10)).is_empty(),
        "the refused session's API server is gone"
    );
    // The daemon goes on serving: a CUDA hello on a raw connection is answered too.
    let mut g = RawGuest::connect(&d.socket("vm1"));
    let hello = Hello::new(hira_apis_cuda::API, 1, "raw-cuda", 0).encode();
    g.frame(FrameKind::Hello, 0, 0, 0, &[], &hello);
    let (h, p) = g.recv().expect("an answer");
    assert_eq!(h.kind, FrameKind::Error);
    assert!(
        ErrorPayload::decode(&p)
            .unwrap()
            .message
            .contains("no CUDA driver"),
        "the refusal names the reason"
    );
}

/// Ids and handles a guest forges get the driver's own error codes from the API
/// server, and the session goes on.
#[test]
fn forged_cuda_handles_get_the_drivers_errors_and_the_session_goes_on() {
    use hira_apis_cuda::op;
    use hira_protocol::Writer;
    use hira_protocol::api::tag;
    let d = daemon(&[]);
    let mut g = RawGuest::connect(&d.socket("vm1"));
    let hello = Hello::new(hira_apis_cuda::API, 1, "raw-cuda", 0).encode();
    g.frame(FrameKind::Hello, 0, 0, 0, &[], &hello);
    let (h, _) = g.recv().expect("welcome");
    assert_eq!(h.kind, FrameKind::Welcome);
    let call = |g: &mut RawGuest, opcode: u16, w: Writer| {
        let (h, p) = g.call(opcode, w.as_slice());
        assert_eq!(h.kind, FrameKind::Reply, "a reply to opcode {opcode}");
        status(&p)
    };
    let mut w = Writer::new();
    w.u32(0);
    assert_eq!(call(&mut g, op::cuInit, w), 0);
    // A module id that names nothing, in a context that names nothing.
    let mut w = Writer::new();
    w.u64(0x999)
        .u8(1)
        .u64(5)
        .u64(0xdead)
        .u8(tag::INLINE)
        .bytes(b"k");
    assert_eq!(
        call(&mut g, op::cuModuleGetFunction, w),
        201,
        "INVALID_CONTEXT"
    );
    // A context of this session, then a module id it never made.
    let mut w = Writer::new();
    w.u8(1).u64(7).u32(0).i32(0);
    assert_eq!(call(&mut g, op::cuCtxCreate_v2, w), 0);
    let mut w = Writer::new();
    w.u64(7)
        .u8(1)
        .u64(8)
        .u64(0xdead)
        .u8(tag::INLINE)
        .bytes(b"k");
    assert_eq!(
        call(&mut g, op::cuModuleGetFunction, w),
        400,
        "INVALID_HANDLE"
    );
    // Reusing the context's id for a new one breaks the protocol: an error frame.
    let mut w = Writer::new();
    w.u8(1).u64(7).u32(0).i32(0);
    let (h, _) = g.call(op::cuCtxCreate_v2, w.as_slice());
    assert_eq!(h.kind, FrameKind::Error);
    // A stream named by a special handle's number (1: CU_STREAM_LEGACY, 2:
    // CU_STREAM_PER_THREAD) would be taken for that stream: refused the same way.
    for special in [1u64, 2] {
        let mut w = Writer::new();
        w.u64(7).u8(1).u64(special).u32(0);
        let (h, _) = g.call(op::cuStreamCreate, w.as_slice());
        assert_eq!(h.kind, FrameKind::Error, "stream id {special}");
    }
    let mut w = Writer::new();
    w.u64(7).u8(1).u64(0x77).u32(0);
    let (h, p) = g.call(op::cuStreamCreate, w.as_slice());
    assert_eq!(h.kind, FrameKind::Reply, "{}", String::from_utf8_lossy(&p));
    assert_eq!(status(&p), 0, "an ordinary id");
    // A copy claiming more bytes than it carries.
    let mut w = Writer::new();
    w.u64(7)
        .u64(0x1000)
        .u8(tag::INLINE)
        .bytes(&[1, 2, 3])
        .u64(64);
    let (h, _) = g.call(op::cuMemcpyHtoD_v2, w.as_slice());
    assert_eq!(h.kind, FrameKind::Error);
    // A copy to an address no allocation of the context holds: refused before the
    // driver sees it, with the driver's code for a bad device pointer.
    let mut w = Writer::new();
    w.u64(7)
        .u64(0x1000)
        .u8(tag::INLINE)
        .bytes(&[1, 2, 3])
        .u64(3);
    assert_eq!(call(&mut g, op::cuMemcpyHtoD_v2, w), 1, "INVALID_VALUE");
    // A library id that names nothing.
    let mut w = Writer::new();
    w.u64(7)
        .u8(1)
        .u64(9)
        .u64(0xdead)
        .u8(tag::INLINE)
        .bytes(b"k");
    assert_eq!(
        call(&mut g, op::cuLibraryGetKernel, w),
        400,
        "INVALID_HANDLE"
    );
    // A fatbin whose entry claims more bytes than the fatbin holds.
    let mut fatbin = Vec::new();
    fatbin.extend_from_slice(&0xBA55_ED50u32.to_le_bytes());
    fatbin.extend_from_slice(&1u16.to_le_bytes());
    fatbin.extend_from_slice(&16u16.to_le_bytes());
    fatbin.extend_from_slice(&64u64.to_le_bytes());
    let mut entry = [0u8; 64];
    entry[0] = 1;
    entry[4] = 64;
    entry[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    fatbin.extend_from_slice(&entry);
    let mut w = Writer::new();
    w.u8(1).u64(10).u8(tag::INLINE).bytes(&fatbin);
    let st = call(&mut g, op::hiraLibraryLoad, w);
    // NVIDIA's driver 580 loads libraries lazily and answers this one with success
    // (seen on an H200); the executor checks the fatbin at once.
    if !real_gpu() {
        assert_eq!(st, 200, "INVALID_IMAGE");
    }
    // cuLaunchKernelEx's attributes, forged: a kernel of this session to launch.
    let ptx = ".version 7.0\n.target sm_52\n.address_size 64\n.visible .entry k()\n{\n  ret;\n}\n";
    let mut w = Writer::new();
    w.u64(7).u8(1).u64(11).u8(tag::INLINE).bytes(ptx.as_bytes());
    assert_eq!(call(&mut g, op::cuModuleLoadData, w), 0);
    let mut w = Writer::new();
    w.u64(7).u8(1).u64(12).u64(11).u8(tag::INLINE).bytes(b"k");
    assert_eq!(call(&mut g, op::cuModuleGetFunction, w), 0);
    let attr = |id: u32, value: u64| {
        let mut a = [0u8; 72];
        a[..4].copy_from_slice(&id.to_le_bytes());
        a[8..16].copy_from_slice(&value.to_le_bytes());
        a.to_vec()
    };
    let launch_ex = |g: &mut RawGuest, attrs: &[u8], announced: u64| {
        let mut w = Writer::new();
        w.u64(7).u64(12);
        for d in [1u32, 1, 1, 1, 1, 1, 0] {
            w.u32(d);
        }
        w.u64(0)
            .u8(tag::INLINE)
            .bytes(attrs)
            .u64(announced)
            .u8(tag::NULL)
            .u8(tag::NULL);
        g.call(op::hiraLaunchKernelEx, w.as_slice())
    };
    let status_of = |(h, p): (FrameHeader, Vec<u8>)| {
        assert_eq!(h.kind, FrameKind::Reply);
        status(&p)
    };
    // A priority (numbers only) is forwarded and the kernel runs.
    let a = attr(8, 0);
    assert_eq!(status_of(launch_ex(&mut g, &a, 72)), 0);
    // An id cuda.h does not define, one for graph nodes only, an event the session
    // never made, and more attributes than a launch takes.
    let a = attr(99, 0);
    assert_eq!(status_of(launch_ex(&mut g, &a, 72)), 1, "INVALID_VALUE");
    let a = attr(13, 0);
    assert_eq!(status_of(launch_ex(&mut g, &a, 72)), 801, "NOT_SUPPORTED");
    let a = attr(12, 0xbad);
    assert_eq!(status_of(launch_ex(&mut g, &a, 72)), 400, "INVALID_HANDLE");
    let many: Vec<u8> = (0..33).flat_map(|_| attr(8, 0)).collect();
    assert_eq!(
        status_of(launch_ex(&mut g, &many, 33 * 72)),
        1,
        "INVALID_VALUE"
    );
    // A length that is not what the call carries breaks the protocol.
    let a = attr(8, 0);
    let (h, _) = launch_ex(&mut g, &a, 144);
    assert_eq!(h.kind, FrameKind::Error);
    // Part of an attribute: refused as the driver refuses a malformed list.
    assert_eq!(
        status_of(launch_ex(&mut g, &a[..70], 70)),
        1,
        "INVALID_VALUE"
    );
    // Pointer attributes: an id cuda.h lacks, the P2P tokens (for kernel drivers),
    // and values that do not match the ids.
    let pointer_query = |g: &mut RawGuest, ids: &[i32], values: u64| {
        let bytes: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
        let mut w = Writer::new();
        w.u64(7)
            .u8(tag::INLINE)
            .bytes(&bytes)
            .u64(bytes.len() as u64);
        w.u8(tag::INLINE).u64(values).u64(0x1000).i32(0);
        g.call(op::hiraPointerGetAttributes, w.as_slice())
    };
    assert_eq!(
        status_of(pointer_query(&mut g, &[2, 99], 32)),
        1,
        "INVALID_VALUE"
    );
    assert_eq!(
        status_of(pointer_query(&mut g, &[5], 16)),
        801,
        "NOT_SUPPORTED"
    );
    assert_eq!(
        status_of(pointer_query(&mut g, &[2], 16)),
        0,
        "an unknown pointer: zeros"
    );
    let (h, _) = pointer_query(&mut g, &[2], 8);
    assert_eq!(h.kind, FrameKind::Error);
    forged_array_calls(&mut g, &status_of);
    // An opcode CUDA's description does not have.
    let (h, _) = g.call(999, &[]);
    assert_eq!(h.kind, FrameKind::Error);
    // The session still works.
    let mut w = Writer::new();
    w.u8(1);
    let (h, p) = g.call(op::cuDriverGetVersion, w.as_slice());
    assert_eq!(h.kind, FrameKind::Reply);
    assert_eq!(status(&p), 0);
}

/// Arrays, copies with an array side and texture objects, forged, in context 7 of
/// [`forged_cuda_handles_get_the_drivers_errors_and_the_session_goes_on`]'s session:
/// no description makes the host's driver touch the API server's own memory.
fn forged_array_calls(g: &mut RawGuest, status_of: &dyn Fn((FrameHeader, Vec<u8>)) -> i32) {
    use hira_apis_cuda::op;
    use hira_apis_cuda_private::copy2d::{ARRAY, HOST, Memcpy3D, UNIFIED};
    use hira_protocol::Writer;
    use hira_protocol::api::tag;
    // An 8 x 4 array of floats, id 20.
    let mut desc = Vec::new();
    for v in [8u64, 4, 0] {
        desc.extend_from_slice(&v.to_le_bytes());
    }
    for v in [0x20u32, 1, 0, 0] {
        desc.extend_from_slice(&v.to_le_bytes());
    }
    let mut w = Writer::new();
    w.u64(7).u8(1).u64(20).u8(tag::INLINE).bytes(&desc);
    assert_eq!(status_of(g.call(op::cuArray3DCreate_v2, w.as_slice())), 0);
    let copy = |c: &Memcpy3D| {
        // SAFETY: a plain C structure, read as its bytes.
        unsafe { std::slice::from_raw_parts((c as *const Memcpy3D).cast::<u8>(), 200).to_vec() }
    };
    let into_array = Memcpy3D {
        src_x_in_bytes: 0,
        src_y: 0,
        src_z: 0,
        src_lod: 0,
        src_memory_type: HOST,
        src_host: std::ptr::null(),
        src_device: 0,
        src_array: std::ptr::null_mut(),
        reserved0: std::ptr::null_mut(),
        src_pitch: 32,
        src_height: 4,
        dst_x_in_bytes: 0,
        dst_y: 0,
        dst_z: 0,
        dst_lod: 0,
        dst_memory_type: ARRAY,
        dst_host: std::ptr::null_mut(),
        dst_device: 0,
        dst_array: 20 as *mut std::ffi::c_void,
        reserved1: std::ptr::null_mut(),
        dst_pitch: 0,
        dst_height: 0,
        width_in_bytes: 32,
        height: 4,
        depth: 1,
    };
    let copy_in = |g: &mut RawGuest, c: &Memcpy3D, data: &[u8]| {
        let mut w = Writer::new();
        w.u64(7).u8(tag::INLINE).bytes(&copy(c));
        if data.is_empty() {
            w.u8(tag::NULL);
        } else {
            w.u8(tag::INLINE).bytes(data);
        }
        w.u64(data.len() as u64);
        g.call(op::hiraMemcpy3DIn, w.as_slice())
    };
    let texels: Vec<u8> = (0..128u8).collect();
    assert_eq!(status_of(copy_in(g, &into_array, &texels)), 0);
    // The rows come back as they went.
    let mut out_of = into_array;
    (out_of.src_memory_type, out_of.src_array) = (ARRAY, 20 as *mut std::ffi::c_void);
    (out_of.dst_memory_type, out_of.dst_array) = (HOST, std::ptr::null_mut());
    (out_of.dst_pitch, out_of.dst_height) = (32, 4);
    let mut w = Writer::new();
    w.u64(7)
        .u8(tag::INLINE)
        .bytes(&copy(&out_of))
        .u8(tag::INLINE)
        .u64(128);
    let (h, p) = g.call(op::hiraMemcpy3DOut, w.as_slice());
    assert_eq!(h.kind, FrameKind::Reply);
    assert_eq!(status(&p), 0);
    assert!(
        p.windows(128).any(|w| w == texels.as_slice()),
        "the texels back"
    );
    // A host address of the guest's own naming (here: one of the API server's
    // pages, were it taken as the host's) without the data: refused.
    let mut forged = into_array;
    forged.src_host = 0x1000 as *const std::ffi::c_void;
    assert_eq!(status_of(copy_in(g, &forged, &[])), 1, "INVALID_VALUE");
    // A unified address the guest left for the host to resolve: refused.
    let mut unified = into_array;
    (unified.src_memory_type, unified.src_device) = (UNIFIED, 0x1000);
    assert_eq!(status_of(copy_in(g, &unified, &[])), 1, "INVALID_VALUE");
    // An array id the session never made.
    let mut stranger = into_array;
    stranger.dst_array = 0xbad as *mut std::ffi::c_void;
    assert_eq!(
        status_of(copy_in(g, &stranger, &texels)),
        1,
        "INVALID_VALUE"
    );
    // Data that is not the copy's packed rows breaks the protocol.
    let (h, _) = copy_in(g, &into_array, &texels[..100]);
    assert_eq!(h.kind, FrameKind::Error);
    // A texture over an array the session never made, and the destruction of an
    // object it never made.
    // A texture over array `id` (the resource's first field after its type).
    let tex_create = |g: &mut RawGuest, id: u64| {
        let mut res = [0u8; 144];
        res[8..16].copy_from_slice(&id.to_le_bytes());
        let mut w = Writer::new();
        w.u64(7)
            .u8(1)
            .u8(tag::INLINE)
            .bytes(&res)
            .u8(tag::INLINE)
            .bytes(&[0u8; 104])
            .u8(tag::NULL);
        g.call(op::cuTexObjectCreate, w.as_slice())
    };
    assert_eq!(status_of(tex_create(g, 0xbad)), 400, "INVALID_HANDLE");
    let mut w = Writer::new();
    w.u64(7).u64(0x77);
    assert_eq!(
        status_of(g.call(op::cuTexObjectDestroy, w.as_slice())),
        1,
        "INVALID_VALUE"
    );
    // A texture over the array, then destroyed.
    let (h, p) = tex_create(g, 20);
    assert_eq!((h.kind, status(&p)), (FrameKind::Reply, 0));
    let value = u64::from_le_bytes(p[p.len() - 8..].try_into().unwrap());
    let mut w = Writer::new();
    w.u64(7).u64(value);
    assert_eq!(status_of(g.call(op::cuTexObjectDestroy, w.as_slice())), 0);
    let mut w = Writer::new();
    w.u64(20);
    assert_eq!(status_of(g.call(op::cuArrayDestroy, w.as_slice())), 0);
}

#[test]
fn entry_points_hira_does_not_remote_exist_and_say_not_supported() {
    let d = daemon(&[]);
    let out = through_hira(&d, "entry_points", &[]);
    assert!(out.status.success(), "{}", text(&out));
    let o = String::from_utf8_lossy(&out.stdout);
    assert!(
        o.contains("cuMemAlloc through cuGetProcAddress: yes"),
        "{o}"
    );
    assert!(
        o.contains("unknown symbol: 500, status 1"),
        "CUDA_ERROR_NOT_FOUND: {o}"
    );
    assert!(
        o.contains("cuMemAllocManaged: CUDA_ERROR_NOT_SUPPORTED"),
        "{o}"
    );
    // Device properties cannot change: asked 1000 times, they are asked of the host once.
    assert!(o.contains("warp size asked 1000 times: 32"), "{o}");
    // The host's device has memory pools (the CPU test executor says so, as GPUs
    // do), which the guest serves; it has managed memory too, which Hira does not
    // remote, so through Hira the device has none.
    assert!(o.contains("memory pools: 1, managed memory: 0"), "{o}");
    let ended = d.wait_idle(Duration::from_secs(30));
    let calls = ended[0]["commands"].as_u64().unwrap();
    assert!(calls < 100, "{calls} calls reached the host: {ended:?}");
}

#[test]
fn a_rust_program_using_cudarc_prints_through_hira_what_it_prints_natively() {
    let d = daemon(&[]);
    let n = native("cudarc-guest");
    assert!(n.status.success(), "natively: {}", text(&n));
    let h = through_hira(&d, "cudarc-guest", &[]);
    assert!(h.status.success(), "through Hira: {}", text(&h));
    let o = String::from_utf8_lossy(&h.stdout);
    assert!(o.contains("vector_add: n=10000 wrong=0"), "{o}");
    assert!(o.contains("reduce_sum: 199990 (expected 199990)"), "{o}");
    assert_eq!(o, String::from_utf8_lossy(&n.stdout));
    assert!(
        !String::from_utf8_lossy(&h.stderr).contains("not supported"),
        "cudarc needed nothing Hira lacks: {}",
        text(&h)
    );
}

#[test]
fn transfers_larger_than_a_call_go_in_pieces_with_the_same_result() {
    let d = daemon(&[]);
    let n = native("transfer");
    assert!(n.status.success(), "natively: {}", text(&n));
    // 1 MiB pieces: the 5 MiB + 123 bytes go as six calls each way.
    let h = through_hira(&d, "transfer", &[("HIRA_CUDA_CHUNK_KB", "1024")]);
    assert!(h.status.success(), "through Hira: {}", text(&h));
    let o = String::from_utf8_lossy(&h.stdout);
    assert!(
        o.contains("synchronous same, on a stream same, around it 5a 5a"),
        "{o}"
    );
    assert!(o.contains("unified copies same, host to host same"), "{o}");
    assert_eq!(o, String::from_utf8_lossy(&n.stdout));
}

#[test]
fn cuda_device_memory_counts_against_the_vms_quota() {
    let d = daemon_with(&["vm1,mem-quota=8M"], &[]);
    // Two allocations of 6 MiB + 64 bytes do not fit 8 MiB: the first does.
    let over = through_hira(&d, "transfer", &[]);
    assert_eq!(over.status.code(), Some(1), "{}", text(&over));
    let err = String::from_utf8_lossy(&over.stderr);
    assert!(
        err.contains("cuMemAlloc(&b, n + 64) failed: 2 CUDA_ERROR_OUT_OF_MEMORY"),
        "the second allocation is refused as a full device would refuse it: {err}"
    );
    // Within the quota, and again after the first program's memory came back. A
    // program's memory comes back once its API server has ended, after the program
    // itself (a real driver takes a while to tear a context down): wait for that.
    let n = (3usize << 20).to_string();
    let k = kit();
    for _ in 0..2 {
        d.wait_idle(Duration::from_secs(60));
        assert_eq!(vm_entry(&d.status(), "vm1")["mem_used"], 0);
        let mut c = Command::new(k.exe("transfer"));
        c.arg(&k.ptx)
            .arg(&n)
            .env("LD_LIBRARY_PATH", k.shim_dir())
            .env("HIRA_SOCKET", d.socket("vm1"));
        let ok = run_with_timeout(&mut c, Duration::from_secs(120));
        assert!(ok.status.success(), "{}", text(&ok));
    }
}

#[test]
fn kernel_parameter_layouts_come_from_the_ptx_where_the_driver_cannot_give_them() {
    // The executor plays a driver older than CUDA 12.4 (no cuFuncGetParamInfo).
    let d = daemon(&[("HIRA_CUDA_CPU_NO_PARAM_INFO", "1")]);
    same_as_native(&d, &[]);
}

/// `tests/cuda/busy.c` through Hira as a guest of VM `vm`, ready for commands.
fn busy_guest(d: &Daemon, vm: &str) -> LineProgram {
    let k = kit();
    let mut c = Command::new(k.exe("busy"));
    c.arg(&k.ptx)
        .env("LD_LIBRARY_PATH", k.shim_dir())
        .env("HIRA_SOCKET", d.socket(vm));
    LineProgram::start(c)
}

/// A CUDA guest's kernels are accounted as device time, and when its VM is ahead of
/// its share while another VM has work waiting, its next launch is held until that
/// work has run (as for OpenCL guests: scheduling.rs).
#[test]
fn cuda_kernels_are_accounted_and_held_while_their_vm_is_ahead_of_its_share() {
    let d = daemon_with(&["ahead", "behind"], &[]);
    let mut cuda = busy_guest(&d, "ahead");
    let vendors = Vendors::hira();
    let mut behind = LineProgram::start(d.guest(&vendors, "behind", &c_program("busy")));
    // Alone, "ahead" uses the device as it likes; its kernels' time is accounted.
    let ran = cuda.ask("run 80");
    let n: u64 = ran.split(' ').nth(1).unwrap().parse().unwrap();
    let ns: u64 = ran.split(' ').nth(2).unwrap().parse().unwrap();
    let v = wait_for(&d, "ahead", "the device time of its launches", |v| {
        v["device_ns"].as_u64().unwrap() >= ns && v["in_flight"] == 0
    });
    assert_eq!(v["held"], 0);
    // "behind" has a launch waiting; one more long launch puts "ahead" more than the
    // quantum ahead of it: held from its next launch on.
    assert_eq!(behind.ask("gate"), "ok");
    wait_for(&d, "behind", "a launch in flight", |v| v["in_flight"] == 1);
    assert_eq!(cuda.ask(&format!("once {n}")), "ok");
    wait_for(&d, "ahead", "the hold decision", |v| {
        v["decision"] == "hold"
    });
    cuda.send("once 1000");
    let v = wait_for(&d, "ahead", "a held launch", |v| v["held"] == 1);
    assert_eq!(v["decision"], "hold");
    // "behind" runs its launch; "ahead" goes on, with the right result.
    assert_eq!(behind.ask("open"), "ok");
    assert_eq!(cuda.line(), "ok", "the held launch ran");
    wait_for(&d, "ahead", "release", |v| {
        v["held"] == 0 && v["in_flight"] == 0
    });
}

/// Launches go without waiting for the host: a failure the guest could not foresee is
/// returned by the next synchronisation, as CUDA returns asynchronous errors; with
/// `HIRA_SYNC=1` by the launch itself, as natively. A launch the driver refuses at
/// once (a function whose module is gone) waits and is refused at once either way.
#[test]
fn launches_go_without_waiting_and_their_failures_come_back_at_the_next_synchronisation() {
    if real_gpu() {
        eprintln!("skipped: the refused launch is played by the CPU test executor");
        return;
    }
    let fail = [("HIRA_CUDA_CPU_FAIL_LAUNCH", "1")];
    let k = kit();
    let mut native = Command::new(k.exe("launch_error"));
    native.arg(&k.ptx).envs(fail);
    if let Some(d) = k.driver_dir() {
        native.env("LD_LIBRARY_PATH", d);
    }
    let n = run_with_timeout(&mut native, Duration::from_secs(120));
    let n = String::from_utf8_lossy(&n.stdout).into_owned();
    let d = daemon(&fail);
    let asynchronous = through_hira(&d, "launch_error", &[]);
    assert!(asynchronous.status.success(), "{}", text(&asynchronous));
    let a = String::from_utf8_lossy(&asynchronous.stdout);
    assert!(
        a.contains("launch CUDA_SUCCESS, then synchronize CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"),
        "{a}"
    );
    assert!(
        a.contains("unloaded module's function: CUDA_ERROR_INVALID_HANDLE"),
        "{a}"
    );
    assert!(
        a.contains("memset outside: CUDA_ERROR_INVALID_VALUE, inside: CUDA_SUCCESS, c[63] = 7"),
        "{a}"
    );
    let d = daemon(&fail);
    let synchronous = through_hira(&d, "launch_error", &[("HIRA_SYNC", "1")]);
    assert_eq!(
        String::from_utf8_lossy(&synchronous.stdout),
        n,
        "HIRA_SYNC=1: as natively"
    );
    assert!(
        n.contains("launch CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, then synchronize CUDA_SUCCESS"),
        "{n}"
    );
}

/// `tests/cuda/migrate.c`, natively (`d` None) or through Hira as a guest of `vm1`.
fn migrate_program(d: Option<&Daemon>) -> LineProgram {
    migrate_program_with(d, &[])
}

/// As [`migrate_program`], with `env` for the guest.
fn migrate_program_with(d: Option<&Daemon>, env: &[(&str, &str)]) -> LineProgram {
    let k = kit();
    let mut c = Command::new(k.exe("migrate"));
    c.arg(&k.ptx).envs(env.iter().copied());
    match (d, k.driver_dir()) {
        (Some(d), _) => c
            .env("LD_LIBRARY_PATH", k.shim_dir())
            .env("HIRA_SOCKET", d.socket("vm1")),
        (None, Some(dir)) => c.env("LD_LIBRARY_PATH", dir),
        (None, None) => c.env_remove("LD_LIBRARY_PATH"),
    };
    LineProgram::start(c)
}

/// Lists, frees, kernel-only and host-written variables, address ranges, and a
/// printf FIFO whose size a printing kernel fixed.
const MIGRATE_SCRIPT: &[&str] = &[
    "build 7", "fifo", "say", "fifo", "walk 3", "sum", "drop 2", "walk 5", "sum", "set 100",
    "walk 1", "sum", "range 5", "range 0", "build 4", "drop 0", "walk 2", "sum", "end",
];

/// The one live session's id and API-server pid.
pub(crate) fn the_cuda_session(d: &Daemon) -> (u64, u64) {
    let s = d.status();
    let x = &s["sessions"][0];
    assert_eq!(x["api"], "CUDA", "{s}");
    (
        x["id"].as_u64().unwrap(),
        x["api_server_pid"].as_u64().unwrap(),
    )
}

/// A CUDA session moves to a new API server after every command of a program
/// whose device data holds device addresses: every allocation is found where it
/// was, with its contents, and so are the module's variables (one written only by
/// kernels), the function, the stream and the event; each answer is the native one.
#[test]
fn a_cuda_session_moves_with_its_memory_at_the_same_addresses() {
    let mut native = migrate_program(None);
    let expected: Vec<String> = MIGRATE_SCRIPT.iter().map(|c| native.ask(c)).collect();
    assert_eq!(expected.last().map(String::as_str), Some("bye"));
    // On shared-memory rings, and relayed by the daemon (HIRA_RINGS=0).
    for env in [&[][..], &[("HIRA_RINGS", "0")]] {
        moves_after_every_command(&expected, env);
    }
}

fn moves_after_every_command(expected: &[String], env: &[(&str, &str)]) {
    let d = daemon(&[]);
    let mut p = migrate_program_with(Some(&d), env);
    let mut pids = Vec::new();
    let got: Vec<String> = MIGRATE_SCRIPT
        .iter()
        .map(|cmd| {
            let answer = p.ask(cmd);
            if *cmd != "end" {
                let (id, pid) = the_cuda_session(&d);
                pids.push(pid);
                let a = d.control(serde_json::json!({"cmd": "migrate", "session": id}));
                assert!(a["moved"].is_object(), "after {cmd}: {a}");
            }
            answer
        })
        .collect();
    assert_eq!(got, expected, "{env:?}");
    pids.dedup();
    assert_eq!(
        pids.len(),
        MIGRATE_SCRIPT.len() - 1,
        "a new API server each time"
    );
}

/// Runs `cmd` (a guest of `d`'s VM `vm1`) while its session is moved to a new API
/// server as often as it can be (each time it has made calls since the last move),
/// and checks that it prints what it printed natively (`expected`). Returns the
/// moves.
/// No move is refused because the session could not be carried (a refusal because
/// it was ending, say, is not that).
pub(crate) fn moves_while_running(d: &Daemon, mut cmd: Command, expected: &Output) -> usize {
    let (got, moves, refused) = run_moving_noting(d, &mut cmd);
    assert_eq!(text(&got), text(expected), "{cmd:?} moving as it ran");
    let unmovable: Vec<&String> = refused
        .iter()
        .filter(|r| r.contains("cannot migrate"))
        .collect();
    assert!(unmovable.is_empty(), "{cmd:?}: {unmovable:?}");
    moves
}

/// Each driver-API program prints what it prints natively while its session moves
/// between API servers wherever the moves land (usually several times per program).
#[test]
fn cuda_programs_print_what_they_print_natively_while_they_move_again_and_again() {
    let k = kit();
    let d = daemon(&[]);
    let mut total = 0;
    for p in PROGRAMS.iter().filter(|&&p| p != "fault") {
        let n = native(p);
        let mut c = Command::new(k.exe(p));
        c.arg(&k.ptx)
            .env("LD_LIBRARY_PATH", k.shim_dir())
            .env("HIRA_SOCKET", d.socket("vm1"));
        let moves = moves_while_running(&d, c, &n);
        eprintln!("{p}: moved {moves} times");
        total += moves;
    }
    assert!(total > 0, "no program moved");
}

/// A CUDA session moves to another daemon (its control socket reached through a
/// byte-only forwarder, as from another host) in the middle of the program, and then
/// again to a new API server there: every answer is the native one, and the first
/// daemon keeps nothing of it.
#[test]
fn a_cuda_session_moves_to_another_daemon_with_its_memory() {
    let mut native = migrate_program(None);
    let expected: Vec<String> = MIGRATE_SCRIPT.iter().map(|c| native.ask(c)).collect();
    let a = daemon(&[]);
    let b = daemon(&[]);
    let mut p = migrate_program(Some(&a));
    let mut got = Vec::new();
    let (first, rest) = MIGRATE_SCRIPT.split_at(5);
    got.extend(first.iter().map(|c| p.ask(c)));
    let (id, _) = the_cuda_session(&a);
    let to = a.dir.path().join("forwarded-b.sock");
    crate::migration::forward(&to, b.dir.path().join("control.sock"), 1);
    let out = a.ctl_ok(&["migrate", &id.to_string(), "--to", to.to_str().unwrap()]);
    assert!(out.contains("waiting at"), "{out}");
    let (then, last) = rest.split_at(4);
    got.extend(then.iter().map(|c| p.ask(c)));
    assert!(a.status()["sessions"].as_array().unwrap().is_empty());
    let (id, _) = the_cuda_session(&b);
    let moved = b.control(serde_json::json!({"cmd": "migrate", "session": id}));
    assert!(moved["moved"].is_object(), "{moved}");
    got.extend(last.iter().map(|c| p.ask(c)));
    assert_eq!(got, expected);
}

/// With the driver placing device memory (`HIRA_CUDA_PLACEMENT=driver`), a CUDA
/// session holding some cannot keep its addresses: `migrate` is refused with the
/// reason, and the session goes on where it was.
#[test]
fn a_cuda_session_whose_memory_the_driver_placed_is_not_moved_and_goes_on() {
    let d = daemon(&[("HIRA_CUDA_PLACEMENT", "driver")]);
    let mut p = migrate_program(Some(&d));
    assert_eq!(p.ask("build 3"), "ok 3");
    let (id, before) = the_cuda_session(&d);
    let answer = d.control(serde_json::json!({"cmd": "migrate", "session": id}));
    assert!(answer["moved"].is_null(), "{answer}");
    assert!(
        answer.to_string().contains("placed by the driver"),
        "the refusal gives the reason: {answer}"
    );
    assert_eq!(p.ask("walk 2"), "ok", "the program goes on");
    assert_eq!(the_cuda_session(&d).1, before);
}

/// A guest that goes away while its launch is held: the held launch is let through
/// and its API server ends on its own, not killed after the teardown grace.
#[test]
fn a_cuda_guest_that_goes_while_its_launch_is_held_ends_cleanly() {
    let d = daemon_with(&["ahead", "behind"], &[]);
    let mut cuda = busy_guest(&d, "ahead");
    let vendors = Vendors::hira();
    let mut behind = LineProgram::start(d.guest(&vendors, "behind", &c_program("busy")));
    let ran = cuda.ask("run 80");
    let n: u64 = ran.split(' ').nth(1).unwrap().parse().unwrap();
    let ns: u64 = ran.split(' ').nth(2).unwrap().parse().unwrap();
    wait_for(&d, "ahead", "the device time of its launches", |v| {
        v["device_ns"].as_u64().unwrap() >= ns && v["in_flight"] == 0
    });
    assert_eq!(behind.ask("gate"), "ok");
    wait_for(&d, "behind", "a launch in flight", |v| v["in_flight"] == 1);
    assert_eq!(cuda.ask(&format!("once {n}")), "ok");
    wait_for(&d, "ahead", "the hold decision", |v| {
        v["decision"] == "hold"
    });
    cuda.send("once 1000");
    wait_for(&d, "ahead", "a held launch", |v| v["held"] == 1);
    drop(cuda);
    let start = std::time::Instant::now();
    let ended = loop {
        let s = d.status();
        if let Some(e) = s["ended"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["vm"] == "ahead")
        {
            break e.clone();
        }
        assert!(start.elapsed() < Duration::from_secs(120), "{s}");
        std::thread::yield_now();
    };
    assert_eq!(ended["api_server_end"], "exit status 0", "{ended}");
    assert_eq!(behind.ask("open"), "ok");
}

/// The sandbox probe's report, as the daemon's status shows it.
fn sandbox_report(d: &Daemon) -> Vec<String> {
    d.status()["sandbox"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().to_string())
        .collect()
}

/// The start-up probe runs an API server in the real sandbox: the daemon's status
/// shows the CUDA driver and devices it sees from there, beside the OpenCL platforms
/// and devices, and `hira-ctl status` prints them.
#[test]
fn the_daemon_shows_what_its_sandboxed_api_servers_see_of_cuda() {
    let d = daemon(&[]);
    let report = sandbox_report(&d);
    for prefix in [
        "cuda driver: ",
        "cuda device: 0: ",
        "opencl platform: ",
        "opencl device: ",
    ] {
        assert!(
            report.iter().any(|l| l.starts_with(prefix)),
            "{prefix}: {report:?}"
        );
    }
    let out = d.ctl_ok(&["status"]);
    assert!(out.contains("  cuda device: 0: "), "{out}");
}

/// A CUDA driver the sandbox hides (found through a link leading out of the
/// directories API servers may read, which the daemon's own process follows) stops
/// the daemon at start, and refuses a `vm add` once the host changed so under a
/// running daemon; each time the error names what is hidden and the fix.
#[test]
fn a_cuda_driver_the_sandbox_hides_is_named_at_start_and_at_vm_add() {
    let Some(driver) = kit().driver_dir() else {
        eprintln!("skipped: with the system's driver there is no copy to hide");
        return;
    };
    // Directories API servers may not read (Landlock), where the machine applies it.
    let shown = tempfile::tempdir().unwrap();
    let hidden = tempfile::tempdir().unwrap();
    for name in ["libcuda.so.1", "libcuda.so"] {
        std::fs::copy(driver.join("libcuda.so.1"), shown.path().join(name)).unwrap();
    }
    std::fs::copy(
        driver.join("libcuda.so.1"),
        hidden.path().join("libcuda.so.1"),
    )
    .unwrap();
    let lib_path = shown.path().to_str().unwrap().to_string();
    let d = Daemon::start_with_env(&["vm1"], &[("LD_LIBRARY_PATH", &lib_path)]);
    let before = sandbox_report(&d);
    if !before.iter().any(|l| l.starts_with("landlock: applied")) {
        eprintln!("skipped: this machine does not apply Landlock: {before:?}");
        return;
    }
    assert!(
        before.iter().any(|l| l.starts_with("cuda device: 0: ")),
        "{before:?}"
    );
    // The driver becomes a link to the copy the sandbox hides.
    for name in ["libcuda.so.1", "libcuda.so"] {
        std::fs::remove_file(shown.path().join(name)).unwrap();
        std::os::unix::fs::symlink(hidden.path().join("libcuda.so.1"), shown.path().join(name))
            .unwrap();
    }
    let spec = format!("hybrid={},cid=9", d.dir.path().join("vm9.vsock").display());
    let out = d.ctl(&["vm", "add", "vm9", &spec]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "vm add refused");
    assert!(
        err.contains("\"cuda device: 0: "),
        "names the device: {err}"
    );
    assert!(err.contains("LD_LIBRARY_PATH"), "names the fix: {err}");
    assert!(
        d.ctl_ok(&["vm", "list"])
            .lines()
            .all(|l| !l.contains("vm9")),
        "nothing added"
    );
    // A daemon started so refuses to start, with the same cause.
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = crate::support::hira_vhost();
    cmd.arg("--local-socket")
        .arg(format!("vm1={}", dir.path().join("vm1.sock").display()))
        .arg("--control-socket")
        .arg(dir.path().join("control.sock"))
        .env("LD_LIBRARY_PATH", &lib_path);
    let out = run_with_timeout(&mut cmd, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("do not see \"cuda device: 0: "), "{err}");
}
