//! A guest program written with `cudarc`'s safe API, as Rust users of CUDA write
//! them: it loads the driver dynamically (Hira's `libcuda.so.1` in a guest), runs
//! the test kernels and prints what it computed, for the tests to compare natively
//! and through Hira.
//!
//! `cudarc-guest KERNELS.ptx`

use std::sync::Arc;

use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: cudarc-guest KERNELS.ptx")?;
    let ctx: Arc<CudaContext> = CudaContext::new(0)?;
    println!("device: {} device(s)", CudaContext::device_count()?);
    let module = ctx.load_module(Ptx::from_src(std::fs::read_to_string(path)?))?;
    let stream = ctx.default_stream();

    // vector_add on the default stream.
    let n = 10_000usize;
    let a: Vec<f32> = (0..n).map(|i| (i % 100) as f32 * 0.5).collect();
    let b: Vec<f32> = (0..n).map(|i| (i % 7) as f32 - 3.0).collect();
    let da = stream.clone_htod(&a)?;
    let db = stream.clone_htod(&b)?;
    let mut dc = stream.alloc_zeros::<f32>(n)?;
    let add = module.load_function("vector_add")?;
    let n_i32 = n as i32;
    let mut launch = stream.launch_builder(&add);
    launch.arg(&da).arg(&db).arg(&mut dc).arg(&n_i32);
    // SAFETY: the kernel's parameters are (const float*, const float*, float*, int).
    unsafe { launch.launch(LaunchConfig::for_num_elems(n as u32)) }?;
    let c = stream.clone_dtoh(&dc)?;
    let wrong = (0..n).filter(|&i| c[i] != a[i] + b[i]).count();
    println!(
        "vector_add: n={n} wrong={wrong} sum={}",
        c.iter().sum::<f32>()
    );

    // reduce_sum on a second stream, with dynamic shared memory.
    let s2 = ctx.new_stream()?;
    let x: Vec<f32> = (0..50_000).map(|i| (i % 9) as f32).collect();
    let dx = s2.clone_htod(&x)?;
    let mut dsum = s2.alloc_zeros::<f32>(1)?;
    let reduce = module.load_function("reduce_sum")?;
    let m = x.len() as i32;
    let cfg = LaunchConfig {
        grid_dim: (8, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 128 * 4,
    };
    let mut launch = s2.launch_builder(&reduce);
    launch.arg(&dx).arg(&mut dsum).arg(&m);
    // SAFETY: the kernel's parameters are (const float*, float*, int).
    unsafe { launch.launch(cfg) }?;
    let sum = s2.clone_dtoh(&dsum)?;
    println!(
        "reduce_sum: {} (expected {})",
        sum[0],
        x.iter().sum::<f32>()
    );
    ctx.synchronize()?;
    Ok(())
}
