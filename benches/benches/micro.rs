//! Micro-benchmarks, native and through Hira side by side in one process (the ICD
//! loader sees both the host's vendor and Hira; platforms are picked by name):
//! synchronous call round trip, asynchronously forwarded call, kernel launch, and
//! buffer write/read bandwidth from 4 KiB to 256 MiB. The process re-runs itself once
//! per transfer mode: `inline` (all data in frames) and `window` (the shared window).

use std::ffi::c_void;
use std::hint::black_box;
use std::process::Command;

use cl3::OpenCl;
use criterion::{BenchmarkId, Criterion, Throughput};
use hira_benches::env::{BenchEnv, build_components};
use opencl_sys_types::*;

/// The few OpenCL types and constants used here.
mod opencl_sys_types {
    pub type Handle = *mut std::ffi::c_void;
    pub const CL_DEVICE_TYPE_ALL: u64 = 0xFFFF_FFFF;
    pub const CL_MEM_READ_WRITE: u64 = 1;
    pub const CL_QUEUE_REFERENCE_COUNT: u32 = 0x1092;
    pub const CL_PLATFORM_ICD_SUFFIX_KHR: u32 = 0x0920;
}

const MODE_VAR: &str = "HIRA_MICRO_MODE";
const SIZES: &[usize] = &[4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20];

/// One OpenCL stack (native or Hira): a context, a queue, an empty kernel.
struct Stack {
    rt: &'static OpenCl,
    ctx: Handle,
    queue: Handle,
    kernel: Handle,
}

fn check(what: &str, status: Option<i32>) {
    assert_eq!(status, Some(0), "{what} failed");
}

impl Stack {
    fn open(rt: &'static OpenCl, platform: Handle) -> Stack {
        let mut device: Handle = std::ptr::null_mut();
        check(
            "clGetDeviceIDs",
            rt.clGetDeviceIDs(
                platform.cast(),
                CL_DEVICE_TYPE_ALL,
                1,
                (&mut device as *mut Handle).cast(),
                std::ptr::null_mut(),
            ),
        );
        let mut err = 0;
        let dev = device.cast();
        let ctx = rt
            .clCreateContext(
                std::ptr::null(),
                1,
                &dev,
                None,
                std::ptr::null_mut(),
                &mut err,
            )
            .expect("clCreateContext");
        check("clCreateContext", Some(err));
        let queue = rt
            .clCreateCommandQueue(ctx, dev, 0, &mut err)
            .expect("clCreateCommandQueue");
        check("clCreateCommandQueue", Some(err));
        let src = c"__kernel void empty(int x) { }".as_ptr();
        let program = rt
            .clCreateProgramWithSource(ctx, 1, &src, std::ptr::null(), &mut err)
            .expect("program");
        check("clCreateProgramWithSource", Some(err));
        check(
            "clBuildProgram",
            rt.clBuildProgram(
                program,
                1,
                &dev,
                std::ptr::null(),
                None,
                std::ptr::null_mut(),
            ),
        );
        let kernel = rt
            .clCreateKernel(program, c"empty".as_ptr(), &mut err)
            .expect("kernel");
        check("clCreateKernel", Some(err));
        Stack {
            rt,
            ctx: ctx.cast(),
            queue: queue.cast(),
            kernel: kernel.cast(),
        }
    }

    fn buffer(&self, size: usize) -> Handle {
        let mut err = 0;
        let m = self
            .rt
            .clCreateBuffer(
                self.ctx.cast(),
                CL_MEM_READ_WRITE,
                size,
                std::ptr::null_mut(),
                &mut err,
            )
            .expect("buffer");
        check("clCreateBuffer", Some(err));
        m.cast()
    }
}

/// The host's platform and Hira's, told apart by their ICD suffix (Hira's is `HIRA`;
/// its name is the host's, as applications see it).
fn platforms(rt: &'static OpenCl) -> (Handle, Handle) {
    let mut ids = [std::ptr::null_mut(); 8];
    let mut n = 0u32;
    check(
        "clGetPlatformIDs",
        rt.clGetPlatformIDs(8, ids.as_mut_ptr(), &mut n),
    );
    let name = |p: Handle| {
        let mut buf = [0u8; 256];
        rt.clGetPlatformInfo(
            p.cast(),
            CL_PLATFORM_ICD_SUFFIX_KHR,
            buf.len(),
            buf.as_mut_ptr().cast(),
            std::ptr::null_mut(),
        );
        String::from_utf8_lossy(&buf)
            .trim_end_matches('\0')
            .to_string()
    };
    let found: Vec<(Handle, String)> = ids[..n as usize]
        .iter()
        .map(|&p| (p.cast(), name(p.cast())))
        .collect();
    let hira = found
        .iter()
        .find(|(_, n)| n == "HIRA")
        .expect("Hira's platform is visible")
        .0;
    let native = found
        .iter()
        .find(|(_, n)| n != "HIRA")
        .expect("a native platform is visible")
        .0;
    (native, hira)
}

fn benches(c: &mut Criterion, mode: &str, stacks: &[(&str, Stack)]) {
    let mut g = c.benchmark_group("call");
    for (who, s) in stacks {
        g.bench_function(BenchmarkId::new("sync_round_trip", who), |b| {
            let mut refs = 0u32;
            b.iter(|| {
                let st = s.rt.clGetCommandQueueInfo(
                    s.queue.cast(),
                    CL_QUEUE_REFERENCE_COUNT,
                    4,
                    (&mut refs as *mut u32).cast(),
                    std::ptr::null_mut(),
                );
                black_box(st)
            })
        });
        g.bench_function(BenchmarkId::new("async_set_kernel_arg", who), |b| {
            let v = 7i32;
            b.iter(|| {
                black_box(s.rt.clSetKernelArg(s.kernel.cast(), 0, 4, (&v as *const i32).cast()))
            });
            s.rt.clFinish(s.queue.cast());
        });
        g.bench_function(BenchmarkId::new("kernel_launch_and_finish", who), |b| {
            let global = 1usize;
            b.iter(|| {
                s.rt.clEnqueueNDRangeKernel(
                    s.queue.cast(),
                    s.kernel.cast(),
                    1,
                    std::ptr::null(),
                    &global,
                    std::ptr::null(),
                    0,
                    std::ptr::null(),
                    std::ptr::null_mut(),
                );
                black_box(s.rt.clFinish(s.queue.cast()))
            })
        });
    }
    g.finish();
    for dir in ["write", "read"] {
        let mut g = c.benchmark_group(format!("{dir}_{mode}"));
        g.sample_size(10)
            .measurement_time(std::time::Duration::from_secs(2));
        for &size in SIZES {
            g.throughput(Throughput::Bytes(size as u64));
            for (who, s) in stacks {
                let buf = s.buffer(size);
                let mut host = vec![1u8; size];
                g.bench_with_input(BenchmarkId::new(*who, size), &size, |b, &size| {
                    b.iter(|| {
                        let p = host.as_mut_ptr() as *mut c_void;
                        let st = if dir == "write" {
                            s.rt.clEnqueueWriteBuffer(
                                s.queue.cast(),
                                buf.cast(),
                                1,
                                0,
                                size,
                                p,
                                0,
                                std::ptr::null(),
                                std::ptr::null_mut(),
                            )
                        } else {
                            s.rt.clEnqueueReadBuffer(
                                s.queue.cast(),
                                buf.cast(),
                                1,
                                0,
                                size,
                                p,
                                0,
                                std::ptr::null(),
                                std::ptr::null_mut(),
                            )
                        };
                        black_box(st)
                    })
                });
                s.rt.clReleaseMemObject(buf.cast());
            }
        }
        g.finish();
    }
}

fn main() {
    if let Ok(mode) = std::env::var(MODE_VAR) {
        let rt = cl3::load_library().as_ref().expect("libOpenCL loads");
        let (native, hira) = platforms(rt);
        let stacks = [
            ("native", Stack::open(rt, native)),
            ("hira", Stack::open(rt, hira)),
        ];
        let mut c = Criterion::default().configure_from_args();
        benches(&mut c, &mode, &stacks);
        c.final_summary();
        return;
    }
    // Parent: start a daemon, then run this binary once per transfer mode with both
    // the host's vendors and Hira's ICD visible.
    let bin = build_components().expect("Hira builds");
    let env = BenchEnv::start(&bin).expect("hira-vhost starts");
    let both = tempfile::tempdir().expect("tempdir");
    for dir in [env.native.path(), env.hira.path()] {
        for e in std::fs::read_dir(dir).expect("vendor dir").flatten() {
            std::fs::copy(e.path(), both.path().join(e.file_name())).expect("copy icd");
        }
    }
    let exe = std::env::current_exe().expect("own path");
    for (mode, inline_max) in [("inline", usize::MAX), ("window", 0)] {
        let status = Command::new(&exe)
            .args(std::env::args().skip(1))
            .env(MODE_VAR, mode)
            .env("OCL_ICD_VENDORS", both.path())
            .env("HIRA_SOCKET", &env.socket)
            .env("HIRA_INLINE_MAX", inline_max.to_string())
            .env("HIRA_WINDOW_MB", "600")
            .status()
            .expect("bench child runs");
        assert!(status.success(), "{mode} benchmarks failed");
    }
}
