//! Decoded CUDA calls against the CUDA backend, as an API server runs them: any
//! opcode, any payload, after a fixed prelude that makes objects for the calls to
//! name (context 1 current, module 2 from PTX, function 3, a 4 KiB allocation whose
//! address the inputs must guess or learn). Nothing a guest sends may crash the
//! server or make the driver touch memory the guest did not name. The driver is
//! whatever `libcuda.so.1` the library path holds; without a GPU, the CPU test
//! executor (test infrastructure):
//! `LD_LIBRARY_PATH=<dir with target/debug/libcuda.so as libcuda.so.1> cargo fuzz run cuda_calls`.
#![no_main]

use std::sync::{Arc, OnceLock};

use hira_apis_cuda::op;
use hira_api_server::backend::{Backend, FrameData};
use hira_api_server::cuda::CudaBackend;
use hira_protocol::Writer;
use hira_protocol::api::tag;
use libfuzzer_sys::fuzz_target;

/// Calls whose cost a guest sets without bound (a launch's grid, a synchronisation
/// behind it) or that end the fixture's objects; the end-to-end tests cover them.
const SKIPPED: &[u16] = &[
    op::cuLaunchKernel,
    op::cuCtxDestroy_v2,
    op::cuModuleUnload,
    op::cuDevicePrimaryCtxReset_v2,
    op::cuLibraryUnload,
];

const PTX: &str = "
.version 7.0
.target sm_52
.address_size 64
.visible .entry k(.param .u64 p, .param .u32 v)
{
  .reg .b64 %rd<2>;
  .reg .b32 %r<2>;
  ld.param.u64 %rd1, [p];
  ld.param.u32 %r1, [v];
  st.global.u32 [%rd1], %r1;
  ret;
}
";

fn call(b: &CudaBackend, opcode: u16, payload: &[u8]) -> i32 {
    let data = FrameData {
        spans: &[],
        window: None,
        no_reply: false,
    };
    let mut w = Writer::new();
    match b.execute(opcode, payload, &data, &mut w) {
        Ok(()) => w
            .as_slice()
            .get(..4)
            .map_or(0, |s| i32::from_le_bytes(s.try_into().unwrap())),
        Err(_) => -1000,
    }
}

fn fixture() -> &'static CudaBackend {
    static F: OnceLock<CudaBackend> = OnceLock::new();
    F.get_or_init(|| {
        let (vm, _) = hira_protocol::usage::VmPage::create().unwrap();
        vm.set_quota(Some(1 << 30));
        let quota = Arc::new(hira_api_server::account::Account::new(Some(vm), None));
        let b = CudaBackend::new(quota).expect("a libcuda.so.1 on the library path");
        let mut w = Writer::new();
        w.u32(0);
        assert_eq!(call(&b, op::cuInit, w.as_slice()), 0);
        let mut w = Writer::new();
        w.u8(1).u64(1).u32(0).i32(0);
        assert_eq!(call(&b, op::cuCtxCreate_v2, w.as_slice()), 0);
        let mut w = Writer::new();
        w.u64(1).u8(1).u64(2).u8(tag::INLINE).bytes(PTX.as_bytes());
        assert_eq!(call(&b, op::cuModuleLoadData, w.as_slice()), 0);
        let mut w = Writer::new();
        w.u64(1).u8(1).u64(3).u64(2).u8(tag::INLINE).bytes(b"k");
        assert_eq!(call(&b, op::cuModuleGetFunction, w.as_slice()), 0);
        // A library of the same code, and its kernel.
        let mut w = Writer::new();
        w.u8(1).u64(5).u8(tag::INLINE).bytes(PTX.as_bytes());
        assert_eq!(call(&b, op::hiraLibraryLoad, w.as_slice()), 0);
        let mut w = Writer::new();
        w.u64(1).u8(1).u64(6).u64(5).u8(tag::INLINE).bytes(b"k");
        assert_eq!(call(&b, op::cuLibraryGetKernel, w.as_slice()), 0);
        let mut w = Writer::new();
        w.u64(1).u8(1).u64(4096);
        assert_eq!(call(&b, op::cuMemAlloc_v2, w.as_slice()), 0);
        b
    })
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let opcode = u16::from_le_bytes([data[0], data[1]]);
    if SKIPPED.contains(&opcode) {
        return;
    }
    // cuLaunchKernelEx with a grid and block of at most 4096 threads in all: its
    // attributes are what is fuzzed (context, function, then seven dimensions).
    if opcode == op::hiraLaunchKernelEx {
        let dims = data.get(2 + 16..2 + 16 + 24).map(|d| {
            d.chunks_exact(4)
                .map(|c| u64::from(u32::from_le_bytes(c.try_into().unwrap())))
                .product::<u64>()
        });
        if dims.is_none_or(|n| n > 4096) {
            return;
        }
    }
    call(fixture(), opcode, &data[2..]);
});
