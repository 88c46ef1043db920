//! CUDA graphs and stream capture, kept where the program runs: a graph is the
//! stream work it records, and launching an instantiated graph issues that work, in
//! an order its edges allow, on the stream it is launched on. Shared by Hira's guest
//! `libcuda.so.1` (so a graph lives in the guest, moves with its session and is
//! seen by the host as the launches, copies and memsets it holds) and the CPU test
//! executor (which stands in for NVIDIA's driver), each issuing the work through an
//! [`Issue`] of its own.
//!
//! What is built: graphs made node by node (kernel, memcpy, memset, host, empty,
//! child-graph, event record and event wait nodes, edges added and queried), graphs
//! cloned, instantiated, updated (`cuGraphExecUpdate`: same topology and node kinds),
//! their kernel, memcpy, memset and host nodes' parameters changed in the graph and
//! in an instantiation, and launched; stream capture in the three modes, across
//! streams joined by events recorded while capturing, with the driver's errors for a
//! capture that a synchronisation invalidated, that was ended on another stream, or
//! whose forked streams were not joined; memory-allocation and memory-free nodes
//! ([`memory`]). Not built (answered `CUDA_ERROR_NOT_SUPPORTED` as a driver without
//! them would): conditional, batch memory-operation and external-semaphore nodes,
//! device-launched graphs.
//!
//! Handles (`CUgraph`, `CUgraphNode`, `CUgraphExec`) are numbers this module hands
//! out and checks; a forged or stale one gets `CUDA_ERROR_INVALID_VALUE`, never a
//! dereference. No lock is held while work is issued, so host nodes may call the
//! API.

use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::copy2d::{self, Memcpy3D};
use crate::launch;

pub mod memory;
pub use memory::{capture_alloc, capture_free, free_block};

type CUresult = c_int;
/// An opaque handle of the API (`CUgraph`, `CUstream`, `CUfunction`, ...).
pub type Raw = *mut c_void;
/// `CUhostFn`.
pub type HostFn = unsafe extern "C" fn(*mut c_void);

pub const SUCCESS: CUresult = 0;
pub const INVALID_VALUE: CUresult = 1;
pub const ILLEGAL_STATE: CUresult = 401;
pub const NOT_SUPPORTED: CUresult = 801;
pub const CAPTURE_UNSUPPORTED: CUresult = 900;
pub const CAPTURE_INVALIDATED: CUresult = 901;
pub const CAPTURE_UNMATCHED: CUresult = 903;
pub const CAPTURE_UNJOINED: CUresult = 904;
pub const CAPTURE_ISOLATION: CUresult = 905;
pub const CAPTURE_WRONG_THREAD: CUresult = 908;
pub const EXEC_UPDATE_FAILURE: CUresult = 910;

/// `CU_STREAM_CAPTURE_STATUS_*`.
pub const STATUS_NONE: c_int = 0;
pub const STATUS_ACTIVE: c_int = 1;
pub const STATUS_INVALIDATED: c_int = 2;
/// `CU_STREAM_CAPTURE_MODE_GLOBAL`, `_THREAD_LOCAL`, `_RELAXED`.
const MODE_GLOBAL: c_int = 0;
const MODE_THREAD_LOCAL: c_int = 1;
const MODE_RELAXED: c_int = 2;
/// `CU_EVENT_RECORD_EXTERNAL`, `CU_EVENT_WAIT_EXTERNAL`.
pub const EVENT_EXTERNAL: c_uint = 1;

/// `CU_GRAPH_NODE_TYPE_*` of the nodes built here.
pub const TYPE_KERNEL: c_int = 0;
pub const TYPE_MEMCPY: c_int = 1;
pub const TYPE_MEMSET: c_int = 2;
pub const TYPE_HOST: c_int = 3;
pub const TYPE_GRAPH: c_int = 4;
pub const TYPE_EMPTY: c_int = 5;
pub const TYPE_WAIT_EVENT: c_int = 6;
pub const TYPE_EVENT_RECORD: c_int = 7;
pub const TYPE_MEM_ALLOC: c_int = 10;
pub const TYPE_MEM_FREE: c_int = 11;

/// `CU_GRAPH_EXEC_UPDATE_*`.
const UPDATE_SUCCESS: c_int = 0;
const UPDATE_TOPOLOGY_CHANGED: c_int = 2;
const UPDATE_NODE_TYPE_CHANGED: c_int = 3;
const UPDATE_PARAMETERS_CHANGED: c_int = 5;

/// `CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH`: graphs launched from the device.
const INSTANTIATE_DEVICE_LAUNCH: u64 = 4;
/// `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`: a launch frees what the
/// instantiation's earlier launch allocated and nobody freed.
const INSTANTIATE_AUTO_FREE: u64 = 1;
/// The other instantiation flags (free on launch, upload, node priority): the work
/// is the same.
const INSTANTIATE_KNOWN: u64 = 1 | 2 | 4 | 8;

/// What the library serving the graphs issues their work with: its own entry
/// points, which check the work as they check the program's.
pub trait Issue: Sync {
    /// `cuLaunchKernel` without `extra`.
    fn launch_kernel(
        &self,
        f: Raw,
        grid: [c_uint; 3],
        block: [c_uint; 3],
        shared: c_uint,
        stream: Raw,
        params: *mut *mut c_void,
    ) -> CUresult;
    /// `cuLaunchKernelEx` without `extra`.
    fn launch_ex(&self, config: &launch::Config, f: Raw, params: *mut *mut c_void) -> CUresult;
    /// `cuMemcpy3DAsync`.
    fn copy(&self, p: &Memcpy3D, stream: Raw) -> CUresult;
    /// `cuMemsetD2D{8,16,32}Async`.
    fn memset(&self, m: &Memset, stream: Raw) -> CUresult;
    /// `cuLaunchHostFunc`.
    fn host(&self, f: HostFn, data: Raw, stream: Raw) -> CUresult;
    /// `cuEventRecord`.
    fn record(&self, event: Raw, stream: Raw) -> CUresult;
    /// `cuStreamWaitEvent`.
    fn wait(&self, stream: Raw, event: Raw) -> CUresult;
    /// The sizes of `f`'s parameters, in order; `None` if `f` is not a function.
    fn param_sizes(&self, f: Raw) -> Option<Vec<usize>>;
    /// The function of kernel `kern` in the current context.
    fn kernel_function(&self, kern: Raw) -> Option<Raw>;
    /// Whether `stream` is a stream the program may use (special handles included).
    fn stream_ok(&self, stream: Raw) -> bool;
    /// What allocation nodes allocate and free with: the library's `cuMemAlloc`
    /// and `cuMemFree`.
    fn memory(&self) -> &'static dyn crate::pool::Memory;
}

/// A kernel node: the function, its launch shape and the values of its
/// parameters, copied when the node was made as the driver copies them.
#[derive(Debug)]
pub struct Kernel {
    pub func: Raw,
    /// The function, library kernel and context the node was described with: what
    /// a query of the node gives back (the runtime knows its kernels by them).
    given: [Raw; 3],
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared: c_uint,
    values: Vec<Box<[u8]>>,
    /// Pointers to `values`, as `kernelParams` gives them back.
    ptrs: Vec<*mut c_void>,
    pub attrs: Vec<launch::Attribute>,
}

impl Kernel {
    /// The node of a launch of `func` with the program's `params` (one pointer per
    /// parameter). `extra` is not taken: it is `CUDA_ERROR_NOT_SUPPORTED` here.
    ///
    /// # Safety
    /// `params` holds one valid pointer per parameter of `func`, as the API requires.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn new(
        issue: &dyn Issue,
        func: Raw,
        grid: [c_uint; 3],
        block: [c_uint; 3],
        shared: c_uint,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
        attrs: Vec<launch::Attribute>,
    ) -> Result<Kernel, CUresult> {
        if func.is_null() {
            return Err(INVALID_VALUE);
        }
        if !extra.is_null() {
            return Err(NOT_SUPPORTED);
        }
        let sizes = issue.param_sizes(func).ok_or(INVALID_VALUE)?;
        if !sizes.is_empty() && params.is_null() {
            return Err(INVALID_VALUE);
        }
        let mut values = Vec::with_capacity(sizes.len());
        for (i, &n) in sizes.iter().enumerate() {
            // SAFETY: one pointer per parameter, each valid for its size.
            let p = unsafe { *params.add(i) };
            if p.is_null() {
                return Err(INVALID_VALUE);
            }
            // SAFETY: as above.
            values.push(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) }.into());
        }
        let mut k = Kernel {
            func,
            given: [func, std::ptr::null_mut(), std::ptr::null_mut()],
            grid,
            block,
            shared,
            values,
            ptrs: Vec::new(),
            attrs,
        };
        k.point();
        Ok(k)
    }

    /// Points `ptrs` at this node's own values.
    fn point(&mut self) {
        self.ptrs = self
            .values
            .iter_mut()
            .map(|v| v.as_mut_ptr().cast())
            .collect();
    }

    /// Launches the node on `stream`: with its attributes through `cuLaunchKernelEx`,
    /// else through `cuLaunchKernel`. The driver only reads `kernelParams`, so the
    /// node's own values go, with nothing copied per launch.
    pub fn launch(&self, issue: &dyn Issue, stream: Raw) -> CUresult {
        let params = if self.ptrs.is_empty() {
            std::ptr::null_mut()
        } else {
            self.ptrs.as_ptr().cast_mut()
        };
        if self.attrs.is_empty() {
            return issue.launch_kernel(
                self.func,
                self.grid,
                self.block,
                self.shared,
                stream,
                params,
            );
        }
        let config = launch::Config {
            grid: self.grid,
            block: self.block,
            shared_mem_bytes: self.shared,
            stream,
            attrs: self.attrs.as_ptr(),
            num_attrs: self.attrs.len() as c_uint,
        };
        issue.launch_ex(&config, self.func, params)
    }
}

impl Clone for Kernel {
    /// A copy with values of its own (a clone's node, an instantiation's step).
    fn clone(&self) -> Kernel {
        let mut k = Kernel {
            func: self.func,
            given: self.given,
            grid: self.grid,
            block: self.block,
            shared: self.shared,
            values: self.values.clone(),
            ptrs: Vec::new(),
            attrs: self.attrs.clone(),
        };
        k.point();
        k
    }
}

// SAFETY: the raw pointers are handles and the node's own copies of values; the
// registry's lock orders every access.
unsafe impl Send for Kernel {}

/// `CUDA_MEMSET_NODE_PARAMS`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Memset {
    pub dst: u64,
    pub pitch: usize,
    pub value: c_uint,
    pub element_size: c_uint,
    pub width: usize,
    pub height: usize,
}

/// `CUDA_HOST_NODE_PARAMS`.
#[repr(C)]
#[derive(Clone, Copy)]
struct HostParams {
    func: Option<HostFn>,
    data: Raw,
}

/// `CUDA_KERNEL_NODE_PARAMS_v2` (`_v1` is its first 56 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelParams {
    pub func: Raw,
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared: c_uint,
    pub params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
    pub kern: Raw,
    pub ctx: Raw,
}

/// A node's work, made for [`capture`] by [`kernel_op`], [`copy_op`] and the like.
pub struct Work(Op);

#[derive(Clone)]
enum Op {
    Kernel(Kernel),
    Memcpy(Memcpy3D),
    Memset(Memset),
    Host(HostFn, usize),
    Empty,
    Child(Box<Graph>),
    Record(usize),
    Wait(usize),
    /// Memory nodes, by the address of their block (`memory`); an allocation with
    /// the size it asked for (its block may be larger).
    Alloc(u64, u64),
    Free(u64),
}

// SAFETY: as for `Kernel`: handles and copies, ordered by the registry's lock.
unsafe impl Send for Op {}

// SAFETY: an instantiation's steps are shared only to be read (launches); a change
// copies them first (`Arc::make_mut`).
unsafe impl Sync for Op {}

impl Op {
    /// A memory node's address (0 for other nodes).
    fn addr(&self) -> u64 {
        match self {
            Op::Alloc(a, _) | Op::Free(a) => *a,
            _ => 0,
        }
    }

    fn kind(&self) -> c_int {
        match self {
            Op::Kernel(_) => TYPE_KERNEL,
            Op::Memcpy(_) => TYPE_MEMCPY,
            Op::Memset(_) => TYPE_MEMSET,
            Op::Host(..) => TYPE_HOST,
            Op::Empty => TYPE_EMPTY,
            Op::Child(_) => TYPE_GRAPH,
            Op::Record(_) => TYPE_EVENT_RECORD,
            Op::Wait(_) => TYPE_WAIT_EVENT,
            Op::Alloc(..) => TYPE_MEM_ALLOC,
            Op::Free(_) => TYPE_MEM_FREE,
        }
    }
}

#[derive(Clone)]
struct Node {
    op: Op,
    deps: Vec<u64>,
}

/// A graph: its nodes in the order they were made.
#[derive(Clone, Default)]
struct Graph {
    order: Vec<u64>,
    nodes: HashMap<u64, Node>,
    /// For a clone: each original node's copy.
    cloned: HashMap<u64, u64>,
}

impl Graph {
    /// The nodes in an order their edges allow (creation order among the ready), or
    /// `None` for a cycle.
    fn topological(&self) -> Option<Vec<u64>> {
        let mut done: HashSet<u64> = HashSet::new();
        let mut out = Vec::with_capacity(self.order.len());
        while out.len() < self.order.len() {
            let before = out.len();
            for &n in &self.order {
                if !done.contains(&n) && self.nodes[&n].deps.iter().all(|d| done.contains(d)) {
                    done.insert(n);
                    out.push(n);
                }
            }
            if out.len() == before {
                return None;
            }
        }
        Some(out)
    }

    /// Each node's kind and dependencies as positions: what an update must keep.
    fn shape(&self) -> Vec<(c_int, Vec<usize>)> {
        let at: HashMap<u64, usize> = self
            .order
            .iter()
            .enumerate()
            .map(|(i, &n)| (n, i))
            .collect();
        self.order
            .iter()
            .map(|n| {
                let node = &self.nodes[n];
                let mut deps: Vec<usize> = node.deps.iter().map(|d| at[d]).collect();
                deps.sort_unstable();
                (node.op.kind(), deps)
            })
            .collect()
    }

    /// The work of the graph, children flattened, in an order its edges allow.
    fn flatten(&self, out: &mut Vec<(u64, Op)>) -> Result<(), CUresult> {
        for n in self.topological().ok_or(INVALID_VALUE)? {
            match &self.nodes[&n].op {
                Op::Child(g) => g.flatten(out)?,
                op => out.push((n, op.clone())),
            }
        }
        Ok(())
    }
}

/// An instantiated graph: its work in order, each step with the node it came from.
struct Exec {
    /// Shared with the launches under way, which take it without copying.
    steps: std::sync::Arc<Vec<(u64, Op)>>,
    /// Node ids of the graph it was made from, in creation order, and the shape
    /// an update must match.
    order: Vec<u64>,
    shape: Vec<(c_int, Vec<usize>)>,
    /// The graph it was made from, and whether a launch frees what the last one
    /// left allocated (`CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`).
    graph: u64,
    auto_free: bool,
    /// Whether it has memory nodes (an update cannot add or remove them).
    memory: bool,
}

/// A capture sequence.
struct Capture {
    graph: u64,
    origin: usize,
    mode: c_int,
    thread: std::thread::ThreadId,
    invalid: bool,
    /// Each stream taking part, with the nodes its next work depends on.
    tails: HashMap<usize, Vec<u64>>,
}

#[derive(Default)]
struct Registry {
    graphs: HashMap<u64, Graph>,
    /// Each node's graph.
    owner: HashMap<u64, u64>,
    execs: HashMap<u64, Exec>,
    captures: HashMap<u64, Capture>,
    /// Each capturing stream's capture.
    streams: HashMap<usize, u64>,
    /// Events recorded while capturing: their capture and the nodes they stand for.
    events: HashMap<usize, (u64, Vec<u64>)>,
    /// Allocation nodes' memory, by address, and each device's high mark of it.
    blocks: HashMap<u64, memory::Block>,
    graph_mem_high: HashMap<c_int, u64>,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);
/// Captures under way in the process: 0 lets every stream call go on at once.
static CAPTURES: AtomicUsize = AtomicUsize::new(0);
/// Handles: never 0, never a valid address (bit 62 set).
static NEXT: AtomicU64 = AtomicU64::new(1);

fn handle() -> u64 {
    (1 << 62) | NEXT.fetch_add(1, Ordering::Relaxed)
}

fn registry() -> RegistryGuard {
    let mut g = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    if g.is_none() {
        *g = Some(Registry::default());
    }
    RegistryGuard(g)
}

struct RegistryGuard(MutexGuard<'static, Option<Registry>>);

impl std::ops::Deref for RegistryGuard {
    type Target = Registry;
    fn deref(&self) -> &Registry {
        self.0.as_ref().expect("made on lock")
    }
}

impl std::ops::DerefMut for RegistryGuard {
    fn deref_mut(&mut self) -> &mut Registry {
        self.0.as_mut().expect("made on lock")
    }
}

thread_local! {
    /// This thread's capture mode (global until a program sets another).
    static MODE: std::cell::Cell<c_int> = const { std::cell::Cell::new(MODE_GLOBAL) };
    /// What `cuStreamGetCaptureInfo` last handed out: valid until the next call.
    static DEPS: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Writes `v` through `p`, if `p` is not null.
///
/// # Safety
/// `p` is null or valid for a write.
unsafe fn put<T>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: the caller's promise.
        unsafe { p.write(v) };
    }
}

/// The dependencies a node is added with, checked to be nodes of `graph` once
/// each.
///
/// # Safety
/// `deps` is valid for `n` handles, as the API requires.
unsafe fn deps_of(
    r: &Registry,
    graph: u64,
    deps: *const Raw,
    n: usize,
) -> Result<Vec<u64>, CUresult> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if deps.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: the caller's promise.
    let ds = unsafe { std::slice::from_raw_parts(deps, n) };
    let mut out = Vec::with_capacity(n);
    for &d in ds {
        let d = d as u64;
        if r.owner.get(&d) != Some(&graph) || out.contains(&d) {
            return Err(INVALID_VALUE);
        }
        out.push(d);
    }
    Ok(out)
}

/// Adds a node made by `op` to `graph` after `deps`, writing its handle.
///
/// # Safety
/// `out` is valid for a write and `deps` for `n` handles, as the API requires.
unsafe fn add(
    out: *mut Raw,
    graph: Raw,
    deps: *const Raw,
    n: usize,
    op: impl FnOnce(&mut Registry) -> Result<Op, CUresult>,
) -> CUresult {
    if out.is_null() {
        return INVALID_VALUE;
    }
    let mut r = registry();
    let g = graph as u64;
    if !r.graphs.contains_key(&g) {
        return INVALID_VALUE;
    }
    // SAFETY: the caller's promise.
    let deps = match unsafe { deps_of(&r, g, deps, n) } {
        Ok(d) => d,
        Err(e) => return e,
    };
    let op = match op(&mut r) {
        Ok(op) => op,
        Err(e) => return e,
    };
    let id = r.insert_node(g, op, deps);
    // SAFETY: checked not null; the caller's promise.
    unsafe { out.write(id as Raw) };
    SUCCESS
}

impl Registry {
    /// Adds a node of `op` after `deps` to graph `g` (which exists), and gives its
    /// handle.
    fn insert_node(&mut self, g: u64, op: Op, deps: Vec<u64>) -> u64 {
        let id = handle();
        let graph = self.graphs.get_mut(&g).expect("a graph of the registry");
        graph.order.push(id);
        graph.nodes.insert(id, Node { op, deps });
        self.owner.insert(id, g);
        id
    }
}

/// A kernel node's launch from the program's description of it.
///
/// # Safety
/// `p` is null or a valid description whose parameters are valid, as the API
/// requires; `v2` says whether it has the `kern` and `ctx` fields.
unsafe fn kernel_of(
    issue: &dyn Issue,
    p: *const KernelParams,
    v2: bool,
) -> Result<Kernel, CUresult> {
    if p.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: a `_v1` description is read only as far as it goes.
    let d = unsafe {
        if v2 {
            p.read_unaligned()
        } else {
            let mut d: KernelParams = std::mem::zeroed();
            std::ptr::copy_nonoverlapping(p.cast::<u8>(), (&raw mut d).cast::<u8>(), 56);
            d
        }
    };
    let func = if d.func.is_null() && !d.kern.is_null() {
        issue.kernel_function(d.kern).ok_or(INVALID_VALUE)?
    } else {
        d.func
    };
    // SAFETY: the program's parameters, as the API requires.
    let mut k = unsafe {
        Kernel::new(
            issue,
            func,
            d.grid,
            d.block,
            d.shared,
            d.params,
            d.extra,
            Vec::new(),
        )
    }?;
    k.given = [d.func, d.kern, d.ctx];
    Ok(k)
}

/// # Safety
/// `p` is null or valid for a read.
unsafe fn memset_of(p: *const Memset) -> Result<Memset, CUresult> {
    if p.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: the caller's promise.
    let m = unsafe { p.read_unaligned() };
    if ![1, 2, 4].contains(&m.element_size)
        || (m.height > 1 && m.pitch < m.width.saturating_mul(m.element_size as usize))
    {
        return Err(INVALID_VALUE);
    }
    Ok(m)
}

/// # Safety
/// `p` is null or valid for a read.
unsafe fn memcpy_of(p: *const c_void) -> Result<Memcpy3D, CUresult> {
    if p.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: the caller's promise.
    Ok(unsafe { p.cast::<Memcpy3D>().read_unaligned() })
}

/// # Safety
/// `p` is null or valid for a read.
unsafe fn host_of(p: *const c_void) -> Result<Op, CUresult> {
    if p.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: the caller's promise.
    let h = unsafe { p.cast::<HostParams>().read_unaligned() };
    let f = h.func.ok_or(INVALID_VALUE)?;
    Ok(Op::Host(f, h.data as usize))
}

/// The entry points, each the driver function of the same name.
pub mod entry {
    use super::*;

    /// `cuGraphCreate`.
    ///
    /// # Safety
    /// `out` is null or valid for a write.
    pub unsafe fn create(out: *mut Raw, flags: c_uint) -> CUresult {
        if out.is_null() || flags != 0 {
            return INVALID_VALUE;
        }
        let id = handle();
        registry().graphs.insert(id, Graph::default());
        // SAFETY: checked not null.
        unsafe { out.write(id as Raw) };
        SUCCESS
    }

    /// `cuGraphDestroy`.
    pub fn destroy(graph: Raw) -> CUresult {
        let gone = {
            let mut r = registry();
            let Some(g) = r.graphs.remove(&(graph as u64)) else {
                return INVALID_VALUE;
            };
            for n in g.order {
                r.owner.remove(&n);
            }
            memory::unheld(&mut r)
        };
        memory::free_all(gone);
        SUCCESS
    }

    /// `cuGraphAddKernelNode` (`v2`: `_v2`).
    ///
    /// # Safety
    /// The API's pointers, as it requires.
    pub unsafe fn add_kernel(
        issue: &dyn Issue,
        out: *mut Raw,
        graph: Raw,
        deps: *const Raw,
        n: usize,
        p: *const KernelParams,
        v2: bool,
    ) -> CUresult {
        // Made before the registry is locked: the function's parameters may need
        // the library.
        // SAFETY: the caller's promise.
        let k = unsafe { kernel_of(issue, p, v2) };
        // SAFETY: the caller's promise.
        unsafe { add(out, graph, deps, n, |_| k.map(Op::Kernel)) }
    }

    /// `cuGraphAddMemcpyNode` (the context is the current one's here).
    ///
    /// # Safety
    /// The API's pointers, as it requires.
    pub unsafe fn add_memcpy(
        out: *mut Raw,
        graph: Raw,
        deps: *const Raw,
        n: usize,
        p: *const c_void,
    ) -> CUresult {
        // SAFETY: the caller's promise.
        unsafe { add(out, graph, deps, n, |_| memcpy_of(p).map(Op::Memcpy)) }
    }

    /// `cuGraphAddMemsetNode`.
    ///
    /// # Safety
    /// The API's pointers, as it requires.
    pub unsafe fn add_memset(
        out: *mut Raw,
        graph: Raw,
        deps: *const Raw,
        n: usize,
        p: *const Memset,
    ) -> CUresult {
        // SAFETY: the caller's promise.
        unsafe { add(out, graph, deps, n, |_| memset_of(p).map(Op::Memset)) }
    }

    /// `cuGraphAddHostNode`.
    ///
    /// # Safety
    /// The API's pointers, as it requires.
    pub unsafe fn add_host(
        out: *mut Raw,
        graph: Raw,
        deps: *const Raw,
        n: usize,
        p: *const c_void,
    ) -> CUresult {
        // SAFETY: the caller's promise.
        unsafe { add(out, graph, deps, n, |_| host_of(p)) }
    }

    /// `cuGraphAddEmptyNode`.
    ///
    /// # Safety
    /// The API's pointers, as it requires.
    pub unsafe fn add_empty(out: *mut Raw, graph: Raw, deps: *const Raw, n: usize) -> CUresult {
        // SAFETY: the caller's promise.
        unsafe { add(out, graph, deps, n, |_| Ok(Op::Empty)) }
    }

    /// `cuGraphAddChildGraphNode`: a copy of `child` as it is now.
    ///
    /// # Safety
    /// The API's pointers, as it requires.
    pub unsafe fn add_child(
        out: *mut Raw,
        graph: Raw,
        deps: *const Raw,
        n: usize,
        child: Raw,
    ) -> CUresult {
        if child == graph {
            return INVALID_VALUE;
        }
        // SAFETY: the caller's promise.
        unsafe {
            add(out, graph, deps, n, |r| {
                // A graph with memory nodes is a child only if it is moved into
                // the parent (`cuGraphAddNode`), which is not built.
                r.graphs
                    .get(&(child as u64))
                    .filter(|g| !memory::has_memory(g))
                    .map(|g| Op::Child(Box::new(g.clone())))
                    .ok_or(INVALID_VALUE)
            })
        }
    }

    /// `cuGraphAddEventRecordNode` (`wait`: `cuGraphAddEventWaitNode`).
    ///
    /// # Safety
    /// The API's pointers, as it requires.
    pub unsafe fn add_event(
        out: *mut Raw,
        graph: Raw,
        deps: *const Raw,
        n: usize,
        event: Raw,
        wait: bool,
    ) -> CUresult {
        if event.is_null() {
            return INVALID_VALUE;
        }
        let e = event as usize;
        // SAFETY: the caller's promise.
        unsafe {
            add(out, graph, deps, n, |_| {
                Ok(if wait { Op::Wait(e) } else { Op::Record(e) })
            })
        }
    }

    /// `cuGraphAddDependencies` (`_v2`: edge data, ordinary edges only).
    ///
    /// # Safety
    /// `from`, `to` (and `edges`, if not null) are valid for `n` items.
    pub unsafe fn add_dependencies(
        graph: Raw,
        from: *const Raw,
        to: *const Raw,
        edges: *const [u8; 8],
        n: usize,
    ) -> CUresult {
        edit_edges(graph, from, to, edges, n, true)
    }

    /// `cuGraphRemoveDependencies` (`_v2`).
    ///
    /// # Safety
    /// As for [`add_dependencies`].
    pub unsafe fn remove_dependencies(
        graph: Raw,
        from: *const Raw,
        to: *const Raw,
        edges: *const [u8; 8],
        n: usize,
    ) -> CUresult {
        edit_edges(graph, from, to, edges, n, false)
    }

    fn edit_edges(
        graph: Raw,
        from: *const Raw,
        to: *const Raw,
        edges: *const [u8; 8],
        n: usize,
        adding: bool,
    ) -> CUresult {
        if n == 0 {
            return SUCCESS;
        }
        if from.is_null() || to.is_null() {
            return INVALID_VALUE;
        }
        // SAFETY: the caller's promise (`edit_edges` is private to the two above).
        let (from, to) = unsafe {
            (
                std::slice::from_raw_parts(from, n),
                std::slice::from_raw_parts(to, n),
            )
        };
        if !edges.is_null() {
            // SAFETY: as above.
            let e = unsafe { std::slice::from_raw_parts(edges, n) };
            if e.iter().any(|d| *d != [0; 8]) {
                return NOT_SUPPORTED;
            }
        }
        let mut r = registry();
        let g = graph as u64;
        let ok = |n: &Raw| r.owner.get(&(*n as u64)) == Some(&g);
        if !r.graphs.contains_key(&g) || !from.iter().all(ok) || !to.iter().all(ok) {
            return INVALID_VALUE;
        }
        if !adding && memory::has_memory(&r.graphs[&g]) {
            return NOT_SUPPORTED;
        }
        let mut copy = r.graphs[&g].clone();
        for (&f, &t) in from.iter().zip(to) {
            let (f, t) = (f as u64, t as u64);
            let deps = &mut copy.nodes.get_mut(&t).expect("checked").deps;
            match (adding, deps.iter().position(|&d| d == f)) {
                (true, None) if f != t => deps.push(f),
                (false, Some(i)) => {
                    deps.remove(i);
                }
                _ => return INVALID_VALUE,
            }
        }
        if adding && copy.topological().is_none() {
            return INVALID_VALUE;
        }
        r.graphs.insert(g, copy);
        SUCCESS
    }

    /// `cuGraphDestroyNode`: the node and its edges.
    pub fn destroy_node(node: Raw) -> CUresult {
        let mut r = registry();
        let n = node as u64;
        let Some(&g) = r.owner.get(&n) else {
            return INVALID_VALUE;
        };
        if memory::has_memory(&r.graphs[&g]) {
            return NOT_SUPPORTED;
        }
        r.owner.remove(&n);
        let graph = r.graphs.get_mut(&g).expect("a node's graph");
        graph.order.retain(|&m| m != n);
        graph.nodes.remove(&n);
        for other in graph.nodes.values_mut() {
            other.deps.retain(|&d| d != n);
        }
        SUCCESS
    }

    /// `cuGraphClone`.
    ///
    /// # Safety
    /// `out` is null or valid for a write.
    pub unsafe fn clone(out: *mut Raw, graph: Raw) -> CUresult {
        if out.is_null() {
            return INVALID_VALUE;
        }
        let mut r = registry();
        let Some(g) = r.graphs.get(&(graph as u64)) else {
            return INVALID_VALUE;
        };
        if memory::has_memory(g) {
            return NOT_SUPPORTED;
        }
        let map: HashMap<u64, u64> = g.order.iter().map(|&n| (n, handle())).collect();
        let copy = Graph {
            order: g.order.iter().map(|n| map[n]).collect(),
            nodes: g
                .nodes
                .iter()
                .map(|(n, node)| {
                    let deps = node.deps.iter().map(|d| map[d]).collect();
                    (
                        map[n],
                        Node {
                            op: node.op.clone(),
                            deps,
                        },
                    )
                })
                .collect(),
            cloned: map.clone(),
        };
        let id = handle();
        for &n in map.values() {
            r.owner.insert(n, id);
        }
        r.graphs.insert(id, copy);
        // SAFETY: checked not null.
        unsafe { out.write(id as Raw) };
        SUCCESS
    }

    /// `cuGraphNodeFindInClone`.
    ///
    /// # Safety
    /// `out` is null or valid for a write.
    pub unsafe fn find_in_clone(out: *mut Raw, original: Raw, clone: Raw) -> CUresult {
        let r = registry();
        let found = r
            .graphs
            .get(&(clone as u64))
            .and_then(|g| g.cloned.get(&(original as u64)));
        match (out.is_null(), found) {
            (false, Some(&n)) => {
                // SAFETY: checked not null.
                unsafe { out.write(n as Raw) };
                SUCCESS
            }
            _ => INVALID_VALUE,
        }
    }

    /// Writes `all` as the API's (array, count) pair does: the count alone when the
    /// array is null, else at most `*count` items and then the number written.
    ///
    /// # Safety
    /// `count` is null or valid; `out` is null or valid for `*count` handles.
    unsafe fn list(all: &[u64], out: *mut Raw, count: *mut usize) -> CUresult {
        if count.is_null() {
            return INVALID_VALUE;
        }
        // SAFETY: the caller's promise.
        unsafe {
            if out.is_null() {
                count.write(all.len());
            } else {
                let n = count.read().min(all.len());
                for (i, &h) in all.iter().take(n).enumerate() {
                    out.add(i).write(h as Raw);
                }
                for i in n..count.read() {
                    out.add(i).write(std::ptr::null_mut());
                }
                count.write(n);
            }
        }
        SUCCESS
    }

    /// `cuGraphGetNodes` (`roots`: `cuGraphGetRootNodes`).
    ///
    /// # Safety
    /// As the API requires of `out` and `count`.
    pub unsafe fn nodes(graph: Raw, out: *mut Raw, count: *mut usize, roots: bool) -> CUresult {
        let r = registry();
        let Some(g) = r.graphs.get(&(graph as u64)) else {
            return INVALID_VALUE;
        };
        let all: Vec<u64> = g
            .order
            .iter()
            .copied()
            .filter(|n| !roots || g.nodes[n].deps.is_empty())
            .collect();
        // SAFETY: the caller's promise.
        unsafe { list(&all, out, count) }
    }

    /// `cuGraphGetEdges` (`_v2`: edge data, all ordinary here).
    ///
    /// # Safety
    /// As the API requires of its arrays and `count`.
    pub unsafe fn edges(
        graph: Raw,
        from: *mut Raw,
        to: *mut Raw,
        data: *mut [u8; 8],
        count: *mut usize,
    ) -> CUresult {
        let r = registry();
        let Some(g) = r.graphs.get(&(graph as u64)) else {
            return INVALID_VALUE;
        };
        let all: Vec<(u64, u64)> = g
            .order
            .iter()
            .flat_map(|t| g.nodes[t].deps.iter().map(move |&f| (f, *t)))
            .collect();
        if count.is_null() || (from.is_null() != to.is_null()) {
            return INVALID_VALUE;
        }
        // SAFETY: the caller's promise.
        unsafe {
            let f: Vec<u64> = all.iter().map(|e| e.0).collect();
            let t: Vec<u64> = all.iter().map(|e| e.1).collect();
            let want = count.read();
            let st = list(&f, from, count);
            if st == SUCCESS && !to.is_null() {
                let mut c = want;
                list(&t, to, &mut c);
                if !data.is_null() {
                    for i in 0..want {
                        data.add(i).write([0; 8]);
                    }
                }
            }
            st
        }
    }

    /// `cuGraphNodeGetDependencies` (`dependents`: `cuGraphNodeGetDependentNodes`).
    ///
    /// # Safety
    /// As the API requires of `out` and `count`.
    pub unsafe fn node_edges(
        node: Raw,
        out: *mut Raw,
        data: *mut [u8; 8],
        count: *mut usize,
        dependents: bool,
    ) -> CUresult {
        let r = registry();
        let n = node as u64;
        let Some(g) = r.owner.get(&n).and_then(|g| r.graphs.get(g)) else {
            return INVALID_VALUE;
        };
        let all: Vec<u64> = if dependents {
            g.order
                .iter()
                .copied()
                .filter(|m| g.nodes[m].deps.contains(&n))
                .collect()
        } else {
            g.nodes[&n].deps.clone()
        };
        // SAFETY: the caller's promise.
        unsafe {
            if !data.is_null() && !out.is_null() && !count.is_null() {
                for i in 0..count.read() {
                    data.add(i).write([0; 8]);
                }
            }
            list(&all, out, count)
        }
    }

    /// `cuGraphNodeGetType`.
    ///
    /// # Safety
    /// `out` is null or valid for a write.
    pub unsafe fn node_type(node: Raw, out: *mut c_int) -> CUresult {
        match (out.is_null(), with_node(node, |op| op.kind())) {
            (false, Some(k)) => {
                // SAFETY: checked not null.
                unsafe { out.write(k) };
                SUCCESS
            }
            _ => INVALID_VALUE,
        }
    }

    fn with_node<T>(node: Raw, f: impl FnOnce(&mut Op) -> T) -> Option<T> {
        let mut r = registry();
        let n = node as u64;
        let g = *r.owner.get(&n)?;
        let op = &mut r.graphs.get_mut(&g)?.nodes.get_mut(&n)?.op;
        Some(f(op))
    }

    /// `cuGraphKernelNodeGetParams` (`_v2`): the node's own copies of the values.
    ///
    /// # Safety
    /// `p` is null or valid for a write of the version's size.
    pub unsafe fn kernel_get(node: Raw, p: *mut KernelParams, v2: bool) -> CUresult {
        if p.is_null() {
            return INVALID_VALUE;
        }
        let got = with_node(node, |op| match op {
            Op::Kernel(k) => Some(KernelParams {
                func: k.given[0],
                grid: k.grid,
                block: k.block,
                shared: k.shared,
                params: if k.ptrs.is_empty() {
                    std::ptr::null_mut()
                } else {
                    k.ptrs.as_mut_ptr()
                },
                extra: std::ptr::null_mut(),
                kern: k.given[1],
                ctx: k.given[2],
            }),
            _ => None,
        });
        let Some(Some(d)) = got else {
            return INVALID_VALUE;
        };
        // SAFETY: the caller's promise; `_v1` is written only as far as it goes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&raw const d).cast::<u8>(),
                p.cast::<u8>(),
                if v2 { 72 } else { 56 },
            )
        };
        SUCCESS
    }

    /// `cuGraphKernelNodeSetParams` (`_v2`).
    ///
    /// # Safety
    /// As [`add_kernel`]'s description.
    pub unsafe fn kernel_set(
        issue: &dyn Issue,
        node: Raw,
        p: *const KernelParams,
        v2: bool,
    ) -> CUresult {
        // SAFETY: the caller's promise.
        let k = match unsafe { kernel_of(issue, p, v2) } {
            Ok(k) => k,
            Err(e) => return e,
        };
        set(node, TYPE_KERNEL, Op::Kernel(k))
    }

    fn set(node: Raw, kind: c_int, new: Op) -> CUresult {
        with_node(node, |op| {
            if op.kind() != kind {
                return INVALID_VALUE;
            }
            *op = new;
            SUCCESS
        })
        .unwrap_or(INVALID_VALUE)
    }

    /// Writes what `pick` takes from `node`'s work (`None`: a node of another kind)
    /// through `p`.
    ///
    /// # Safety
    /// `p` is null or valid for a write of a `T`.
    unsafe fn get<T>(node: Raw, p: *mut T, pick: impl FnOnce(&Op) -> Option<T>) -> CUresult {
        match (p.is_null(), with_node(node, |op| pick(op))) {
            (false, Some(Some(v))) => {
                // SAFETY: checked not null; the caller's promise.
                unsafe { p.write_unaligned(v) };
                SUCCESS
            }
            _ => INVALID_VALUE,
        }
    }

    /// `cuGraphMemcpyNodeGetParams`.
    ///
    /// # Safety
    /// `p` is null or valid for a write of a `CUDA_MEMCPY3D`.
    pub unsafe fn memcpy_get(node: Raw, p: *mut c_void) -> CUresult {
        // SAFETY: the caller's promise.
        unsafe {
            get(node, p.cast::<Memcpy3D>(), |op| match op {
                Op::Memcpy(c) => Some(*c),
                _ => None,
            })
        }
    }

    /// `cuGraphMemcpyNodeSetParams`.
    ///
    /// # Safety
    /// `p` is null or valid for a read of a `CUDA_MEMCPY3D`.
    pub unsafe fn memcpy_set(node: Raw, p: *const c_void) -> CUresult {
        // SAFETY: the caller's promise.
        match unsafe { memcpy_of(p) } {
            Ok(c) => set(node, TYPE_MEMCPY, Op::Memcpy(c)),
            Err(e) => e,
        }
    }

    /// `cuGraphMemsetNodeGetParams`.
    ///
    /// # Safety
    /// `p` is null or valid for a write.
    pub unsafe fn memset_get(node: Raw, p: *mut Memset) -> CUresult {
        // SAFETY: the caller's promise.
        unsafe {
            get(node, p, |op| match op {
                Op::Memset(m) => Some(*m),
                _ => None,
            })
        }
    }

    /// `cuGraphMemsetNodeSetParams`.
    ///
    /// # Safety
    /// `p` is null or valid for a read.
    pub unsafe fn memset_set(node: Raw, p: *const Memset) -> CUresult {
        // SAFETY: the caller's promise.
        match unsafe { memset_of(p) } {
            Ok(m) => set(node, TYPE_MEMSET, Op::Memset(m)),
            Err(e) => e,
        }
    }

    /// `cuGraphHostNodeGetParams`.
    ///
    /// # Safety
    /// `p` is null or valid for a write of a `CUDA_HOST_NODE_PARAMS`.
    pub unsafe fn host_get(node: Raw, p: *mut c_void) -> CUresult {
        // SAFETY: the caller's promise.
        unsafe {
            get(node, p.cast::<HostParams>(), |op| match op {
                Op::Host(f, d) => Some(HostParams {
                    func: Some(*f),
                    data: *d as Raw,
                }),
                _ => None,
            })
        }
    }

    /// `cuGraphHostNodeSetParams`.
    ///
    /// # Safety
    /// `p` is null or valid for a read.
    pub unsafe fn host_set(node: Raw, p: *const c_void) -> CUresult {
        // SAFETY: the caller's promise.
        match unsafe { host_of(p) } {
            Ok(op) => set(node, TYPE_HOST, op),
            Err(e) => e,
        }
    }

    /// `cuGraphChildGraphNodeGetGraph`: the node's graph, which it owns.
    ///
    /// # Safety
    /// `out` is null or valid for a write.
    pub unsafe fn child_graph(node: Raw, out: *mut Raw) -> CUresult {
        if out.is_null() {
            return INVALID_VALUE;
        }
        let mut r = registry();
        let n = node as u64;
        let Some(child) =
            r.owner
                .get(&n)
                .and_then(|g| r.graphs.get(g))
                .and_then(|g| match &g.nodes[&n].op {
                    Op::Child(c) => Some((**c).clone()),
                    _ => None,
                })
        else {
            return INVALID_VALUE;
        };
        // A view of the child as a graph of its own: the driver hands out the
        // embedded graph, which the program must not destroy; here it is a copy
        // the program may read.
        let id = handle();
        for &m in &child.order {
            r.owner.insert(m, id);
        }
        r.graphs.insert(id, child);
        // SAFETY: checked not null.
        unsafe { out.write(id as Raw) };
        SUCCESS
    }

    /// `cuGraphInstantiateWithFlags` and the other instantiations.
    ///
    /// # Safety
    /// `out` is null or valid for a write.
    pub unsafe fn instantiate(out: *mut Raw, graph: Raw, flags: u64) -> CUresult {
        if out.is_null() || flags & !INSTANTIATE_KNOWN != 0 {
            return INVALID_VALUE;
        }
        if flags & INSTANTIATE_DEVICE_LAUNCH != 0 {
            return NOT_SUPPORTED;
        }
        let mut r = registry();
        let gid = graph as u64;
        let Some(g) = r.graphs.get(&gid) else {
            return INVALID_VALUE;
        };
        // A graph with memory nodes has one instantiation at a time.
        let holds = memory::has_memory(g);
        if holds && r.execs.values().any(|e| e.graph == gid) {
            return INVALID_VALUE;
        }
        let mut steps = Vec::new();
        if let Err(e) = g.flatten(&mut steps) {
            return e;
        }
        let exec = Exec {
            steps: std::sync::Arc::new(steps),
            order: g.order.clone(),
            shape: g.shape(),
            graph: gid,
            auto_free: flags & INSTANTIATE_AUTO_FREE != 0,
            memory: holds,
        };
        let id = handle();
        r.execs.insert(id, exec);
        // SAFETY: checked not null.
        unsafe { out.write(id as Raw) };
        SUCCESS
    }

    /// `cuGraphExecDestroy`.
    pub fn exec_destroy(exec: Raw) -> CUresult {
        let gone = {
            let mut r = registry();
            if r.execs.remove(&(exec as u64)).is_none() {
                return INVALID_VALUE;
            }
            memory::unheld(&mut r)
        };
        memory::free_all(gone);
        SUCCESS
    }

    /// `cuGraphUpload`: nothing to do before a launch here.
    pub fn upload(issue: &dyn Issue, exec: Raw, stream: Raw) -> CUresult {
        if !registry().execs.contains_key(&(exec as u64)) {
            return INVALID_VALUE;
        }
        if !issue.stream_ok(stream) {
            return super::INVALID_HANDLE;
        }
        SUCCESS
    }

    /// `cuGraphExecUpdate` (`_v2`): the graph's parameters into the instantiation,
    /// where the nodes are of the same kinds with the same edges.
    ///
    /// # Safety
    /// `info` is null or valid for a write of a `CUgraphExecUpdateResultInfo`.
    pub unsafe fn exec_update(exec: Raw, graph: Raw, info: *mut c_void) -> CUresult {
        let mut r = registry();
        let Some(g) = r.graphs.get(&(graph as u64)) else {
            return INVALID_VALUE;
        };
        let Some(e) = r.execs.get(&(exec as u64)) else {
            return INVALID_VALUE;
        };
        let shape = g.shape();
        let result = if shape.len() != e.shape.len() {
            UPDATE_TOPOLOGY_CHANGED
        } else if shape.iter().zip(&e.shape).any(|(a, b)| a.0 != b.0) {
            UPDATE_NODE_TYPE_CHANGED
        } else if shape != e.shape {
            UPDATE_TOPOLOGY_CHANGED
        } else if mem_changed(g, e) {
            UPDATE_PARAMETERS_CHANGED
        } else {
            UPDATE_SUCCESS
        };
        // SAFETY: the caller's promise: result, then two handles (no node named).
        unsafe {
            if !info.is_null() {
                let p = info.cast::<u8>();
                p.cast::<c_int>().write_unaligned(result);
                p.add(8).cast::<u64>().write_unaligned(0);
                p.add(16).cast::<u64>().write_unaligned(0);
            }
        }
        if result != UPDATE_SUCCESS {
            return EXEC_UPDATE_FAILURE;
        }
        // The new graph's nodes stand, position for position, for the nodes the
        // instantiation was made from.
        let rename: HashMap<u64, u64> = g
            .order
            .iter()
            .copied()
            .zip(e.order.iter().copied())
            .collect();
        let mut steps = Vec::new();
        if let Err(e) = g.flatten(&mut steps) {
            return e;
        }
        for s in &mut steps {
            s.0 = rename.get(&s.0).copied().unwrap_or(s.0);
        }
        r.execs.get_mut(&(exec as u64)).expect("checked").steps = std::sync::Arc::new(steps);
        SUCCESS
    }

    /// Whether `g`'s memory nodes differ from the instantiation's, position for
    /// position: they cannot change.
    fn mem_changed(g: &Graph, e: &Exec) -> bool {
        let mem = |op: &Op| matches!(op, Op::Alloc(..) | Op::Free(_)).then(|| op.addr());
        let new: Vec<_> = g.order.iter().map(|n| mem(&g.nodes[n].op)).collect();
        let old: HashMap<u64, Option<u64>> = e.steps.iter().map(|(n, op)| (*n, mem(op))).collect();
        e.order
            .iter()
            .zip(&new)
            .any(|(n, a)| old.get(n).copied().flatten() != *a)
    }

    /// `cuGraphExec{Kernel,Memcpy,Memset,Host}NodeSetParams`: the steps made from
    /// `node` take the new parameters.
    fn exec_set(exec: Raw, node: Raw, kind: c_int, new: Result<Op, CUresult>) -> CUresult {
        let new = match new {
            Ok(op) => op,
            Err(e) => return e,
        };
        let mut r = registry();
        let Some(e) = r.execs.get_mut(&(exec as u64)) else {
            return INVALID_VALUE;
        };
        let mut found = false;
        for (n, op) in std::sync::Arc::make_mut(&mut e.steps).iter_mut() {
            if *n == node as u64 {
                if op.kind() != kind {
                    return INVALID_VALUE;
                }
                *op = new.clone();
                found = true;
            }
        }
        if found { SUCCESS } else { INVALID_VALUE }
    }

    /// `cuGraphExecKernelNodeSetParams` (`_v2`).
    ///
    /// # Safety
    /// As [`add_kernel`]'s description.
    pub unsafe fn exec_kernel_set(
        issue: &dyn Issue,
        exec: Raw,
        node: Raw,
        p: *const KernelParams,
        v2: bool,
    ) -> CUresult {
        // SAFETY: the caller's promise.
        let k = unsafe { kernel_of(issue, p, v2) };
        exec_set(exec, node, TYPE_KERNEL, k.map(Op::Kernel))
    }

    /// `cuGraphExecMemcpyNodeSetParams`.
    ///
    /// # Safety
    /// `p` is null or valid for a read.
    pub unsafe fn exec_memcpy_set(exec: Raw, node: Raw, p: *const c_void) -> CUresult {
        // SAFETY: the caller's promise.
        exec_set(
            exec,
            node,
            TYPE_MEMCPY,
            unsafe { memcpy_of(p) }.map(Op::Memcpy),
        )
    }

    /// `cuGraphExecMemsetNodeSetParams`.
    ///
    /// # Safety
    /// `p` is null or valid for a read.
    pub unsafe fn exec_memset_set(exec: Raw, node: Raw, p: *const Memset) -> CUresult {
        // SAFETY: the caller's promise.
        exec_set(
            exec,
            node,
            TYPE_MEMSET,
            unsafe { memset_of(p) }.map(Op::Memset),
        )
    }

    /// `cuGraphExecHostNodeSetParams`.
    ///
    /// # Safety
    /// `p` is null or valid for a read.
    pub unsafe fn exec_host_set(exec: Raw, node: Raw, p: *const c_void) -> CUresult {
        // SAFETY: the caller's promise.
        exec_set(exec, node, TYPE_HOST, unsafe { host_of(p) })
    }

    /// `cuGraphLaunch`: the instantiation's work, in order, on `stream`; into a
    /// capture, as a child graph of that work.
    pub fn launch(issue: &dyn Issue, exec: Raw, stream: Raw) -> CUresult {
        let (steps, auto_free, holds_memory) = {
            let r = registry();
            let Some(e) = r.execs.get(&(exec as u64)) else {
                return INVALID_VALUE;
            };
            (std::sync::Arc::clone(&e.steps), e.auto_free, e.memory)
        };
        if !issue.stream_ok(stream) {
            return super::INVALID_HANDLE;
        }
        let child = || {
            let mut g = Graph::default();
            let mut last: Option<u64> = None;
            for (_, op) in steps.iter() {
                let id = handle();
                g.order.push(id);
                g.nodes.insert(
                    id,
                    Node {
                        op: op.clone(),
                        deps: last.into_iter().collect(),
                    },
                );
                last = Some(id);
            }
            Ok(Work(Op::Child(Box::new(g))))
        };
        if let Some(st) = capture(stream, || {
            // Memory nodes go into a child graph only by a move, not built.
            if holds_memory {
                Err(NOT_SUPPORTED)
            } else {
                child()
            }
        }) {
            return st;
        }
        if holds_memory && let Err(e) = memory::launch(&mut registry(), &steps, auto_free) {
            return e;
        }
        for (_, op) in steps.iter() {
            let st = match op {
                Op::Kernel(k) => k.launch(issue, stream),
                Op::Memcpy(c) => issue.copy(c, stream),
                Op::Memset(m) => issue.memset(m, stream),
                Op::Host(f, d) => issue.host(*f, *d as Raw, stream),
                Op::Record(e) => issue.record(*e as Raw, stream),
                Op::Wait(e) => issue.wait(stream, *e as Raw),
                Op::Empty | Op::Child(_) | Op::Alloc(..) | Op::Free(_) => SUCCESS,
            };
            if st != SUCCESS {
                return st;
            }
        }
        SUCCESS
    }

    /// `cuStreamBeginCapture` (`_v2`).
    pub fn begin_capture(issue: &dyn Issue, stream: Raw, mode: c_int) -> CUresult {
        if ![MODE_GLOBAL, MODE_THREAD_LOCAL, MODE_RELAXED].contains(&mode) {
            return INVALID_VALUE;
        }
        if !issue.stream_ok(stream) {
            return super::INVALID_HANDLE;
        }
        // The legacy and per-thread default streams (and NULL) cannot capture: the
        // per-thread one is served as the legacy one here.
        if (stream as usize) <= 2 {
            return CAPTURE_UNSUPPORTED;
        }
        let mut r = registry();
        if r.streams.contains_key(&(stream as usize)) {
            return ILLEGAL_STATE;
        }
        let graph = handle();
        r.graphs.insert(graph, Graph::default());
        let id = handle();
        r.captures.insert(
            id,
            Capture {
                graph,
                origin: stream as usize,
                mode,
                thread: std::thread::current().id(),
                invalid: false,
                tails: HashMap::from([(stream as usize, Vec::new())]),
            },
        );
        r.streams.insert(stream as usize, id);
        CAPTURES.fetch_add(1, Ordering::SeqCst);
        SUCCESS
    }

    /// `cuStreamEndCapture`.
    ///
    /// # Safety
    /// `out` is null or valid for a write.
    pub unsafe fn end_capture(stream: Raw, out: *mut Raw) -> CUresult {
        if out.is_null() {
            return INVALID_VALUE;
        }
        let mut r = registry();
        let Some(&id) = r.streams.get(&(stream as usize)) else {
            return ILLEGAL_STATE;
        };
        let c = &r.captures[&id];
        if c.origin != stream as usize {
            return CAPTURE_UNMATCHED;
        }
        if c.mode == MODE_THREAD_LOCAL && c.thread != std::thread::current().id() {
            return CAPTURE_WRONG_THREAD;
        }
        let c = r.captures.remove(&id).expect("checked");
        CAPTURES.fetch_sub(1, Ordering::SeqCst);
        r.streams.retain(|_, v| *v != id);
        r.events.retain(|_, v| v.0 != id);
        let graph = r.graphs.get(&c.graph).expect("a capture's graph");
        // Every stream that joined must have been joined back into the origin.
        let joined = {
            let mut seen: HashSet<u64> = HashSet::new();
            let mut todo: Vec<u64> = c.tails[&c.origin].clone();
            while let Some(n) = todo.pop() {
                if seen.insert(n) {
                    todo.extend(graph.nodes[&n].deps.iter().copied());
                }
            }
            c.tails
                .iter()
                .all(|(s, tails)| *s == c.origin || tails.iter().all(|t| seen.contains(t)))
        };
        let st = if c.invalid {
            CAPTURE_INVALIDATED
        } else if !joined {
            CAPTURE_UNJOINED
        } else {
            SUCCESS
        };
        let mut gone = Vec::new();
        if st != SUCCESS {
            let g = r.graphs.remove(&c.graph).expect("a capture's graph");
            for n in g.order {
                r.owner.remove(&n);
            }
            gone = memory::unheld(&mut r);
        }
        drop(r);
        memory::free_all(gone);
        // SAFETY: checked not null.
        unsafe {
            out.write(if st == SUCCESS {
                c.graph as Raw
            } else {
                std::ptr::null_mut()
            })
        };
        st
    }

    /// `cuStreamGetCaptureInfo` (any version) and `cuStreamIsCapturing`: what the
    /// stream is doing and, where asked, its capture's id and graph and the nodes
    /// its next work will depend on (valid until this thread's next such call).
    ///
    /// # Safety
    /// Each pointer is null or valid for a write of its type.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn capture_info(
        issue: &dyn Issue,
        stream: Raw,
        status: *mut c_int,
        id: *mut u64,
        graph: *mut Raw,
        deps: *mut *const Raw,
        edges: *mut *const [u8; 8],
        count: *mut usize,
    ) -> CUresult {
        if status.is_null() {
            return INVALID_VALUE;
        }
        if !issue.stream_ok(stream) {
            return super::INVALID_HANDLE;
        }
        let r = registry();
        let (st, cid, g, tails) = match r.streams.get(&(stream as usize)) {
            Some(&cid) => {
                let c = &r.captures[&cid];
                let st = if c.invalid {
                    STATUS_INVALIDATED
                } else {
                    STATUS_ACTIVE
                };
                (st, cid, c.graph, c.tails[&(stream as usize)].clone())
            }
            None => (STATUS_NONE, 0, 0, Vec::new()),
        };
        drop(r);
        let n = tails.len();
        let p = DEPS.with(|d| {
            *d.borrow_mut() = tails;
            d.borrow().as_ptr()
        });
        // SAFETY: the caller's pointers, each written only if not null.
        unsafe {
            status.write(st);
            put(id, cid);
            put(graph, g as Raw);
            put(
                deps,
                if n == 0 {
                    std::ptr::null()
                } else {
                    p.cast::<Raw>()
                },
            );
            put(edges, std::ptr::null());
            put(count, n);
        }
        SUCCESS
    }

    /// `cuThreadExchangeStreamCaptureMode`.
    ///
    /// # Safety
    /// `mode` is null or valid for a read and a write.
    pub unsafe fn exchange_mode(mode: *mut c_int) -> CUresult {
        if mode.is_null() {
            return INVALID_VALUE;
        }
        // SAFETY: checked not null; the caller's pointer.
        let new = unsafe { mode.read() };
        if ![MODE_GLOBAL, MODE_THREAD_LOCAL, MODE_RELAXED].contains(&new) {
            return INVALID_VALUE;
        }
        let old = MODE.with(|m| m.replace(new));
        // SAFETY: as above.
        unsafe { mode.write(old) };
        SUCCESS
    }
}

/// `CUDA_ERROR_INVALID_HANDLE`.
const INVALID_HANDLE: CUresult = 400;

/// Work for `stream`: if the stream is capturing, the node `op` makes is added to
/// its capture after what the stream's next work depends on, and the answer is
/// `Some` (the node added, or the error that invalidated the capture); `None` when
/// it is not capturing, and the work goes on as usual. One atomic load when
/// nothing in the process captures.
pub fn capture(stream: Raw, op: impl FnOnce() -> Result<Work, CUresult>) -> Option<CUresult> {
    if CAPTURES.load(Ordering::SeqCst) == 0 {
        return None;
    }
    let s = stream as usize;
    let cid = *registry().streams.get(&s)?;
    // Made without the lock: a kernel's parameters may need the library.
    let op = op();
    let mut r = registry();
    let r = &mut *r;
    let c = r.captures.get_mut(&cid)?;
    if c.invalid {
        return Some(CAPTURE_INVALIDATED);
    }
    let op = match op {
        Ok(Work(op)) => op,
        Err(e) => {
            c.invalid = true;
            return Some(e);
        }
    };
    let deps = std::mem::take(c.tails.get_mut(&s).expect("a capturing stream"));
    let g = c.graph;
    let id = r.insert_node(g, op, deps);
    r.captures
        .get_mut(&cid)
        .expect("checked")
        .tails
        .insert(s, vec![id]);
    Some(SUCCESS)
}

/// A kernel launch's node, for [`capture`].
///
/// # Safety
/// As for [`Kernel::new`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn kernel_op(
    issue: &dyn Issue,
    func: Raw,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared: c_uint,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    attrs: Vec<launch::Attribute>,
) -> Result<Work, CUresult> {
    // SAFETY: the caller's promise.
    unsafe { Kernel::new(issue, func, grid, block, shared, params, extra, attrs) }
        .map(|k| Work(Op::Kernel(k)))
}

/// A copy's node, for [`capture`].
pub fn copy_op(c: Memcpy3D) -> Result<Work, CUresult> {
    Ok(Work(Op::Memcpy(c)))
}

/// A one-dimensional copy's node between addresses of the given memory types
/// (`copy2d::HOST`, `DEVICE` or `UNIFIED`).
pub fn linear_copy_op(
    dst: u64,
    dst_type: u32,
    src: u64,
    src_type: u32,
    bytes: usize,
) -> Result<Work, CUresult> {
    use copy2d::Linear;
    let side = |p: u64, t: u32| {
        if t == copy2d::HOST {
            Linear::Host(p as Raw)
        } else {
            Linear::Device(p)
        }
    };
    let mut c = Memcpy3D::linear(side(dst, dst_type), side(src, src_type), bytes);
    if dst_type == copy2d::UNIFIED {
        c.dst_memory_type = copy2d::UNIFIED;
    }
    if src_type == copy2d::UNIFIED {
        c.src_memory_type = copy2d::UNIFIED;
    }
    Ok(Work(Op::Memcpy(c)))
}

/// A memset's node, for [`capture`].
pub fn memset_op(
    dst: u64,
    pitch: usize,
    value: c_uint,
    element_size: c_uint,
    width: usize,
    height: usize,
) -> Result<Work, CUresult> {
    let m = Memset {
        dst,
        pitch: if height <= 1 {
            width * element_size as usize
        } else {
            pitch
        },
        value,
        element_size,
        width,
        height,
    };
    Ok(Work(Op::Memset(m)))
}

/// A host function's node, for [`capture`].
pub fn host_op(f: HostFn, data: Raw) -> Result<Work, CUresult> {
    Ok(Work(Op::Host(f, data as usize)))
}

/// `cuEventRecord` on `stream`: while it captures, the event stands for the
/// stream's position in its capture (`external`: an event-record node instead).
/// `None`: not capturing, and the event is recorded as usual.
pub fn capture_record(event: Raw, stream: Raw, external: bool) -> Option<CUresult> {
    if CAPTURES.load(Ordering::SeqCst) == 0 {
        return None;
    }
    let mut r = registry();
    let Some(&cid) = r.streams.get(&(stream as usize)) else {
        // Recorded outside a capture: no longer a capture's.
        r.events.remove(&(event as usize));
        return None;
    };
    drop(r);
    if external {
        return capture(stream, || Ok(Work(Op::Record(event as usize))));
    }
    let mut r = registry();
    let c = r.captures.get_mut(&cid)?;
    if c.invalid {
        return Some(CAPTURE_INVALIDATED);
    }
    let tails = c.tails[&(stream as usize)].clone();
    r.events.insert(event as usize, (cid, tails));
    Some(SUCCESS)
}

/// `cuStreamWaitEvent` of `stream` on `event`: an event recorded while capturing
/// makes the stream join its capture (or, in it, depend on the event's nodes too);
/// a capturing stream may wait only on its own capture's events, or on any with
/// `CU_EVENT_WAIT_EXTERNAL` (an event-wait node). `None`: the wait goes on as usual.
pub fn capture_wait(stream: Raw, event: Raw, flags: c_uint) -> Option<CUresult> {
    if CAPTURES.load(Ordering::SeqCst) == 0 {
        return None;
    }
    if flags & EVENT_EXTERNAL != 0 {
        return capture(stream, || Ok(Work(Op::Wait(event as usize))));
    }
    let s = stream as usize;
    let mut r = registry();
    let r = &mut *r;
    let mine = r.streams.get(&s).copied();
    let theirs = r.events.get(&(event as usize)).cloned();
    match (mine, theirs) {
        (None, None) => None,
        (None, Some((cid, tails))) => {
            let c = r.captures.get_mut(&cid)?;
            c.tails.insert(s, tails);
            r.streams.insert(s, cid);
            Some(SUCCESS)
        }
        (Some(cid), Some((ecid, tails))) if cid == ecid => {
            let mine = r.captures.get_mut(&cid)?.tails.get_mut(&s)?;
            for t in tails {
                if !mine.contains(&t) {
                    mine.push(t);
                }
            }
            Some(SUCCESS)
        }
        (Some(cid), _) => {
            if let Some(c) = r.captures.get_mut(&cid) {
                c.invalid = true;
            }
            Some(CAPTURE_ISOLATION)
        }
    }
}

/// A synchronisation or query of `stream` (`cuStreamSynchronize`, `cuStreamQuery`,
/// `cuStreamAddCallback`): not allowed while it captures, and it invalidates the
/// capture. `None`: not capturing.
pub fn capture_forbidden(stream: Raw) -> Option<CUresult> {
    if CAPTURES.load(Ordering::SeqCst) == 0 {
        return None;
    }
    let mut r = registry();
    let cid = *r.streams.get(&(stream as usize))?;
    r.captures.get_mut(&cid)?.invalid = true;
    Some(CAPTURE_UNSUPPORTED)
}

/// `CUDA_GRAPH_INSTANTIATE_PARAMS`.
#[repr(C)]
pub struct InstantiateParams {
    pub flags: u64,
    pub upload_stream: Raw,
    pub err_node: Raw,
    pub result: c_int,
}

/// Each function of [`graph_entry_points`] exported, and listed by `graph_entries`.
#[doc(hidden)]
#[macro_export]
macro_rules! __graph_defs {
    ($(fn $name:ident($($a:ident: $t:ty),* $(,)?) $body:block)*) => {
        $(
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name($($a: $t),*) -> R $body
        )*
        /// The entry points by their exported names.
        pub fn graph_entries() -> Vec<(&'static str, usize)> {
            vec![$((stringify!($name), $name as *const () as usize)),*]
        }
    };
}

/// Defines the driver's graph and stream-capture entry points (each
/// `#[unsafe(no_mangle)] extern "C"`, named as the driver names them) in the
/// calling module, issuing work through `$issue` (a `&'static dyn Issue`).
#[macro_export]
macro_rules! graph_entry_points {
    ($issue:expr) => {
        #[allow(non_snake_case, clippy::missing_safety_doc)]
        mod graph_entry_points {
            use std::ffi::{c_char, c_int, c_uint, c_void};
            use $crate::graph::memory::{self, AllocParams};
            use $crate::graph::{entry, InstantiateParams, Issue, KernelParams, Memset, Raw};

            type R = c_int;
            const NULL: *mut c_void = std::ptr::null_mut();

            $crate::__graph_defs! {
                fn cuGraphCreate(out: *mut Raw, flags: c_uint) {
                    unsafe { entry::create(out, flags) }
                }
                fn cuGraphDestroy(g: Raw) {
                    entry::destroy(g)
                }
                fn cuGraphAddKernelNode(out: *mut Raw, g: Raw, d: *const Raw, n: usize, p: *const KernelParams) {
                    unsafe { entry::add_kernel($issue, out, g, d, n, p, false) }
                }
                fn cuGraphAddKernelNode_v2(out: *mut Raw, g: Raw, d: *const Raw, n: usize, p: *const KernelParams) {
                    unsafe { entry::add_kernel($issue, out, g, d, n, p, true) }
                }
                fn cuGraphAddMemcpyNode(out: *mut Raw, g: Raw, d: *const Raw, n: usize, p: *const c_void, _ctx: Raw) {
                    unsafe { entry::add_memcpy(out, g, d, n, p) }
                }
                fn cuGraphAddMemsetNode(out: *mut Raw, g: Raw, d: *const Raw, n: usize, p: *const Memset, _ctx: Raw) {
                    unsafe { entry::add_memset(out, g, d, n, p) }
                }
                fn cuGraphAddHostNode(out: *mut Raw, g: Raw, d: *const Raw, n: usize, p: *const c_void) {
                    unsafe { entry::add_host(out, g, d, n, p) }
                }
                fn cuGraphAddEmptyNode(out: *mut Raw, g: Raw, d: *const Raw, n: usize) {
                    unsafe { entry::add_empty(out, g, d, n) }
                }
                fn cuGraphAddChildGraphNode(out: *mut Raw, g: Raw, d: *const Raw, n: usize, child: Raw) {
                    unsafe { entry::add_child(out, g, d, n, child) }
                }
                fn cuGraphAddEventRecordNode(out: *mut Raw, g: Raw, d: *const Raw, n: usize, ev: Raw) {
                    unsafe { entry::add_event(out, g, d, n, ev, false) }
                }
                fn cuGraphAddEventWaitNode(out: *mut Raw, g: Raw, d: *const Raw, n: usize, ev: Raw) {
                    unsafe { entry::add_event(out, g, d, n, ev, true) }
                }
                fn cuGraphAddMemAllocNode(out: *mut Raw, g: Raw, d: *const Raw, n: usize, p: *mut AllocParams) {
                    unsafe { memory::add_alloc(Issue::memory($issue), out, g, d, n, p) }
                }
                fn cuGraphAddMemFreeNode(out: *mut Raw, g: Raw, d: *const Raw, n: usize, dptr: u64) {
                    unsafe { memory::add_free(out, g, d, n, dptr) }
                }
                fn cuGraphMemAllocNodeGetParams(node: Raw, p: *mut AllocParams) {
                    unsafe { memory::alloc_get(node, p) }
                }
                fn cuGraphMemFreeNodeGetParams(node: Raw, out: *mut u64) {
                    unsafe { memory::free_get(node, out) }
                }
                fn cuDeviceGetGraphMemAttribute(dev: c_int, attr: c_int, value: *mut c_void) {
                    unsafe { memory::attribute(Issue::memory($issue), dev, attr, value) }
                }
                fn cuDeviceSetGraphMemAttribute(dev: c_int, attr: c_int, value: *mut c_void) {
                    unsafe { memory::set_attribute(Issue::memory($issue), dev, attr, value) }
                }
                fn cuDeviceGraphMemTrim(dev: c_int) {
                    memory::trim(Issue::memory($issue), dev)
                }
                fn cuGraphAddDependencies(g: Raw, from: *const Raw, to: *const Raw, n: usize) {
                    unsafe { entry::add_dependencies(g, from, to, std::ptr::null(), n) }
                }
                fn cuGraphAddDependencies_v2(g: Raw, from: *const Raw, to: *const Raw, e: *const [u8; 8], n: usize) {
                    unsafe { entry::add_dependencies(g, from, to, e, n) }
                }
                fn cuGraphRemoveDependencies(g: Raw, from: *const Raw, to: *const Raw, n: usize) {
                    unsafe { entry::remove_dependencies(g, from, to, std::ptr::null(), n) }
                }
                fn cuGraphRemoveDependencies_v2(g: Raw, from: *const Raw, to: *const Raw, e: *const [u8; 8], n: usize) {
                    unsafe { entry::remove_dependencies(g, from, to, e, n) }
                }
                fn cuGraphDestroyNode(node: Raw) {
                    entry::destroy_node(node)
                }
                fn cuGraphClone(out: *mut Raw, g: Raw) {
                    unsafe { entry::clone(out, g) }
                }
                fn cuGraphNodeFindInClone(out: *mut Raw, orig: Raw, clone: Raw) {
                    unsafe { entry::find_in_clone(out, orig, clone) }
                }
                fn cuGraphGetNodes(g: Raw, out: *mut Raw, count: *mut usize) {
                    unsafe { entry::nodes(g, out, count, false) }
                }
                fn cuGraphGetRootNodes(g: Raw, out: *mut Raw, count: *mut usize) {
                    unsafe { entry::nodes(g, out, count, true) }
                }
                fn cuGraphGetEdges(g: Raw, from: *mut Raw, to: *mut Raw, count: *mut usize) {
                    unsafe { entry::edges(g, from, to, std::ptr::null_mut(), count) }
                }
                fn cuGraphGetEdges_v2(g: Raw, from: *mut Raw, to: *mut Raw, e: *mut [u8; 8], count: *mut usize) {
                    unsafe { entry::edges(g, from, to, e, count) }
                }
                fn cuGraphNodeGetDependencies(node: Raw, out: *mut Raw, count: *mut usize) {
                    unsafe { entry::node_edges(node, out, std::ptr::null_mut(), count, false) }
                }
                fn cuGraphNodeGetDependencies_v2(node: Raw, out: *mut Raw, e: *mut [u8; 8], count: *mut usize) {
                    unsafe { entry::node_edges(node, out, e, count, false) }
                }
                fn cuGraphNodeGetDependentNodes(node: Raw, out: *mut Raw, count: *mut usize) {
                    unsafe { entry::node_edges(node, out, std::ptr::null_mut(), count, true) }
                }
                fn cuGraphNodeGetDependentNodes_v2(node: Raw, out: *mut Raw, e: *mut [u8; 8], count: *mut usize) {
                    unsafe { entry::node_edges(node, out, e, count, true) }
                }
                fn cuGraphNodeGetType(node: Raw, out: *mut c_int) {
                    unsafe { entry::node_type(node, out) }
                }
                fn cuGraphKernelNodeGetParams(node: Raw, p: *mut KernelParams) {
                    unsafe { entry::kernel_get(node, p, false) }
                }
                fn cuGraphKernelNodeGetParams_v2(node: Raw, p: *mut KernelParams) {
                    unsafe { entry::kernel_get(node, p, true) }
                }
                fn cuGraphKernelNodeSetParams(node: Raw, p: *const KernelParams) {
                    unsafe { entry::kernel_set($issue, node, p, false) }
                }
                fn cuGraphKernelNodeSetParams_v2(node: Raw, p: *const KernelParams) {
                    unsafe { entry::kernel_set($issue, node, p, true) }
                }
                fn cuGraphMemcpyNodeGetParams(node: Raw, p: *mut c_void) {
                    unsafe { entry::memcpy_get(node, p) }
                }
                fn cuGraphMemcpyNodeSetParams(node: Raw, p: *const c_void) {
                    unsafe { entry::memcpy_set(node, p) }
                }
                fn cuGraphMemsetNodeGetParams(node: Raw, p: *mut Memset) {
                    unsafe { entry::memset_get(node, p) }
                }
                fn cuGraphMemsetNodeSetParams(node: Raw, p: *const Memset) {
                    unsafe { entry::memset_set(node, p) }
                }
                fn cuGraphHostNodeGetParams(node: Raw, p: *mut c_void) {
                    unsafe { entry::host_get(node, p) }
                }
                fn cuGraphHostNodeSetParams(node: Raw, p: *const c_void) {
                    unsafe { entry::host_set(node, p) }
                }
                fn cuGraphChildGraphNodeGetGraph(node: Raw, out: *mut Raw) {
                    unsafe { entry::child_graph(node, out) }
                }
                fn cuGraphInstantiateWithFlags(out: *mut Raw, g: Raw, flags: u64) {
                    unsafe { entry::instantiate(out, g, flags) }
                }
                fn cuGraphInstantiate(out: *mut Raw, g: Raw, err: *mut Raw, log: *mut c_char, size: usize) {
                    unsafe {
                        if !err.is_null() {
                            err.write(NULL);
                        }
                        if !log.is_null() && size > 0 {
                            log.write(0);
                        }
                        entry::instantiate(out, g, 0)
                    }
                }
                fn cuGraphInstantiateWithParams(out: *mut Raw, g: Raw, p: *mut InstantiateParams) {
                    if p.is_null() {
                        return $crate::graph::INVALID_VALUE;
                    }
                    unsafe {
                        let st = entry::instantiate(out, g, (*p).flags);
                        (*p).err_node = NULL;
                        // CUDA_GRAPH_INSTANTIATE_SUCCESS, _ERROR, _INVALID_STRUCTURE.
                        (*p).result = match st {
                            0 => 0,
                            $crate::graph::INVALID_VALUE => 2,
                            _ => 1,
                        };
                        st
                    }
                }
                fn cuGraphExecDestroy(e: Raw) {
                    entry::exec_destroy(e)
                }
                fn cuGraphLaunch(e: Raw, stream: Raw) {
                    entry::launch($issue, e, stream)
                }
                fn cuGraphUpload(e: Raw, stream: Raw) {
                    entry::upload($issue, e, stream)
                }
                fn cuGraphExecUpdate(e: Raw, g: Raw, err: *mut Raw, result: *mut c_int) {
                    let mut info = [0u64; 3];
                    unsafe {
                        let st = entry::exec_update(e, g, info.as_mut_ptr().cast());
                        if !err.is_null() {
                            err.write(NULL);
                        }
                        if !result.is_null() {
                            result.write(info[0] as c_int);
                        }
                        st
                    }
                }
                fn cuGraphExecUpdate_v2(e: Raw, g: Raw, info: *mut c_void) {
                    unsafe { entry::exec_update(e, g, info) }
                }
                fn cuGraphExecKernelNodeSetParams(e: Raw, node: Raw, p: *const KernelParams) {
                    unsafe { entry::exec_kernel_set($issue, e, node, p, false) }
                }
                fn cuGraphExecKernelNodeSetParams_v2(e: Raw, node: Raw, p: *const KernelParams) {
                    unsafe { entry::exec_kernel_set($issue, e, node, p, true) }
                }
                fn cuGraphExecMemcpyNodeSetParams(e: Raw, node: Raw, p: *const c_void, _ctx: Raw) {
                    unsafe { entry::exec_memcpy_set(e, node, p) }
                }
                fn cuGraphExecMemsetNodeSetParams(e: Raw, node: Raw, p: *const Memset, _ctx: Raw) {
                    unsafe { entry::exec_memset_set(e, node, p) }
                }
                fn cuGraphExecHostNodeSetParams(e: Raw, node: Raw, p: *const c_void) {
                    unsafe { entry::exec_host_set(e, node, p) }
                }
                fn cuStreamBeginCapture(stream: Raw) {
                    entry::begin_capture($issue, stream, 0)
                }
                fn cuStreamBeginCapture_v2(stream: Raw, mode: c_int) {
                    entry::begin_capture($issue, stream, mode)
                }
                fn cuStreamEndCapture(stream: Raw, out: *mut Raw) {
                    unsafe { entry::end_capture(stream, out) }
                }
                fn cuStreamIsCapturing(stream: Raw, st: *mut c_int) {
                    let n = std::ptr::null_mut();
                    unsafe { entry::capture_info($issue, stream, st, n, n.cast(), n.cast(), n.cast(), n.cast()) }
                }
                fn cuStreamGetCaptureInfo(stream: Raw, st: *mut c_int, id: *mut u64) {
                    let n = std::ptr::null_mut::<c_void>();
                    unsafe { entry::capture_info($issue, stream, st, id, n.cast(), n.cast(), n.cast(), n.cast()) }
                }
                fn cuStreamGetCaptureInfo_v2(stream: Raw, st: *mut c_int, id: *mut u64, g: *mut Raw, d: *mut *const Raw, count: *mut usize) {
                    unsafe { entry::capture_info($issue, stream, st, id, g, d, std::ptr::null_mut(), count) }
                }
                fn cuStreamGetCaptureInfo_v3(stream: Raw, st: *mut c_int, id: *mut u64, g: *mut Raw, d: *mut *const Raw, e: *mut *const [u8; 8], count: *mut usize) {
                    unsafe { entry::capture_info($issue, stream, st, id, g, d, e, count) }
                }
                fn cuThreadExchangeStreamCaptureMode(mode: *mut c_int) {
                    unsafe { entry::exchange_mode(mode) }
                }
            }
        }
        pub use graph_entry_points::*;
    };
}

#[cfg(test)]
mod tests {
    use super::entry::*;
    use super::*;
    use std::sync::Mutex as StdMutex;

    /// What the issued work was, in order.
    #[derive(Default)]
    struct Log(StdMutex<Vec<String>>);

    impl Issue for Log {
        fn launch_kernel(
            &self,
            f: Raw,
            _: [c_uint; 3],
            _: [c_uint; 3],
            _: c_uint,
            _: Raw,
            params: *mut *mut c_void,
        ) -> CUresult {
            // SAFETY: the node's one parameter, a byte.
            let v = unsafe { *(*params).cast::<u8>() };
            self.0
                .lock()
                .unwrap()
                .push(format!("k{} {v:?}", f as usize));
            SUCCESS
        }
        fn launch_ex(&self, _: &launch::Config, _: Raw, _: *mut *mut c_void) -> CUresult {
            unreachable!("no node here has attributes")
        }
        fn copy(&self, p: &Memcpy3D, _: Raw) -> CUresult {
            self.0
                .lock()
                .unwrap()
                .push(format!("c{}", p.width_in_bytes));
            SUCCESS
        }
        fn memset(&self, m: &Memset, _: Raw) -> CUresult {
            self.0.lock().unwrap().push(format!("m{}", m.value));
            SUCCESS
        }
        fn host(&self, _: HostFn, d: Raw, _: Raw) -> CUresult {
            self.0.lock().unwrap().push(format!("h{}", d as usize));
            SUCCESS
        }
        fn record(&self, e: Raw, _: Raw) -> CUresult {
            self.0.lock().unwrap().push(format!("r{}", e as usize));
            SUCCESS
        }
        fn wait(&self, _: Raw, e: Raw) -> CUresult {
            self.0.lock().unwrap().push(format!("w{}", e as usize));
            SUCCESS
        }
        fn param_sizes(&self, f: Raw) -> Option<Vec<usize>> {
            (!f.is_null()).then(|| vec![1])
        }
        fn kernel_function(&self, kern: Raw) -> Option<Raw> {
            Some(kern)
        }
        fn stream_ok(&self, _: Raw) -> bool {
            true
        }
        fn memory(&self) -> &'static dyn crate::pool::Memory {
            &MEM
        }
    }

    /// Device memory for allocation nodes: addresses handed out in order, and what
    /// is held.
    struct Mem(StdMutex<(u64, Vec<u64>)>);

    static MEM: Mem = Mem(StdMutex::new((0x10_0000, Vec::new())));

    impl crate::pool::Memory for Mem {
        fn alloc(&self, size: usize) -> Result<u64, CUresult> {
            let mut m = self.0.lock().unwrap();
            let p = m.0;
            m.0 += size as u64;
            m.1.push(p);
            Ok(p)
        }
        fn free(&self, ptr: u64) -> CUresult {
            // The library's own free asks the graphs first, as both libraries' do.
            if let Some(st) = free_block(ptr) {
                return st;
            }
            let mut m = self.0.lock().unwrap();
            match m.1.iter().position(|&p| p == ptr) {
                Some(i) => {
                    m.1.remove(i);
                    SUCCESS
                }
                None => INVALID_VALUE,
            }
        }
        fn sync(&self, _: Raw) -> CUresult {
            SUCCESS
        }
        fn stream_ok(&self, _: Raw) -> bool {
            true
        }
        fn current_device(&self) -> Result<c_int, CUresult> {
            Ok(0)
        }
        fn device_count(&self) -> c_int {
            1
        }
    }

    impl Log {
        fn take(&self) -> Vec<String> {
            std::mem::take(&mut self.0.lock().unwrap())
        }
    }

    unsafe extern "C" fn nothing(_: *mut c_void) {}

    /// The tests share the process's registry: they run one at a time.
    static SERIAL: StdMutex<()> = StdMutex::new(());

    fn kernel(f: usize, value: &mut u8) -> KernelParams {
        let ptrs: &'static mut [*mut c_void; 1] = Box::leak(Box::new([(value as *mut u8).cast()]));
        KernelParams {
            func: f as Raw,
            grid: [1; 3],
            block: [1; 3],
            shared: 0,
            params: ptrs.as_mut_ptr(),
            extra: std::ptr::null_mut(),
            kern: std::ptr::null_mut(),
            ctx: std::ptr::null_mut(),
        }
    }

    #[test]
    fn a_graph_runs_its_nodes_after_their_dependencies_with_the_values_they_were_given() {
        let _s = SERIAL.lock().unwrap();
        let log = Log::default();
        let mut g: Raw = std::ptr::null_mut();
        let (mut a, mut b, mut h, mut exec): (Raw, Raw, Raw, Raw) = Default::default();
        let mut v = 7u8;
        // SAFETY: valid pointers throughout.
        unsafe {
            assert_eq!(create(&mut g, 0), SUCCESS);
            let m = Memset {
                dst: 0x1000,
                pitch: 0,
                value: 3,
                element_size: 4,
                width: 4,
                height: 1,
            };
            assert_eq!(add_memset(&mut a, g, std::ptr::null(), 0, &m), SUCCESS);
            let k = kernel(11, &mut v);
            assert_eq!(
                add_kernel(&log, &mut b, g, [a].as_ptr(), 1, &k, true),
                SUCCESS
            );
            v = 9; // the node kept 7
            let hp = HostParams {
                func: Some(nothing),
                data: 5 as Raw,
            };
            assert_eq!(
                add_host(&mut h, g, std::ptr::null(), 0, (&raw const hp).cast()),
                SUCCESS
            );
            // The host node runs before the memset once it is a dependency of it.
            assert_eq!(
                add_dependencies(g, [h].as_ptr(), [a].as_ptr(), std::ptr::null(), 1),
                SUCCESS
            );
            assert_eq!(
                add_dependencies(g, [b].as_ptr(), [h].as_ptr(), std::ptr::null(), 1),
                INVALID_VALUE,
                "a cycle"
            );
            let mut n = 0usize;
            assert_eq!(nodes(g, std::ptr::null_mut(), &mut n, false), SUCCESS);
            assert_eq!(n, 3);
            assert_eq!(nodes(g, std::ptr::null_mut(), &mut n, true), SUCCESS);
            assert_eq!(n, 1, "one root: the host node");
            assert_eq!(instantiate(&mut exec, g, 0), SUCCESS);
            assert_eq!(launch(&log, exec, 9 as Raw), SUCCESS);
            assert_eq!(log.take(), ["h5", "m3", "k11 7"]);
            let k = kernel(11, &mut v);
            assert_eq!(exec_kernel_set(&log, exec, b, &k, true), SUCCESS);
            assert_eq!(launch(&log, exec, 9 as Raw), SUCCESS);
            assert_eq!(log.take(), ["h5", "m3", "k11 9"]);
            assert_eq!(
                exec_kernel_set(&log, exec, a, &k, true),
                INVALID_VALUE,
                "a memset node"
            );
            let mut t = -1;
            assert_eq!(node_type(h, &mut t), SUCCESS);
            assert_eq!(t, TYPE_HOST);
            assert_eq!(exec_destroy(exec), SUCCESS);
            assert_eq!(launch(&log, exec, 9 as Raw), INVALID_VALUE, "destroyed");
            assert_eq!(destroy(g), SUCCESS);
            assert_eq!(node_type(h, &mut t), INVALID_VALUE, "gone with its graph");
        }
    }

    fn alloc_params(bytes: usize) -> memory::AllocParams {
        memory::AllocParams {
            props: memory::PoolProps {
                alloc_type: 1,
                handle_types: 0,
                location: crate::pool::Location { kind: 1, id: 0 },
                win32: std::ptr::null_mut(),
                max_size: 0,
                usage: 0,
                reserved: [0; 54],
            },
            access: std::ptr::null(),
            access_count: 0,
            bytesize: bytes,
            dptr: 0,
        }
    }

    fn held_now() -> u64 {
        let mut v = u64::MAX;
        // SAFETY: a valid out-pointer.
        let st = unsafe { memory::attribute(&MEM, 0, 0, (&raw mut v).cast()) };
        assert_eq!(st, SUCCESS);
        v
    }

    #[test]
    fn memory_nodes_hold_their_memory_while_a_graph_or_an_allocation_needs_it() {
        let _s = SERIAL.lock().unwrap();
        let log = Log::default();
        assert_eq!(std::mem::size_of::<memory::PoolProps>(), 88, "cuda.h's");
        assert_eq!(std::mem::size_of::<memory::AllocParams>(), 120, "cuda.h's");
        let before = MEM.0.lock().unwrap().1.len();
        let (mut g, mut a, mut f, mut c, mut f2, mut exec, mut other) = Default::default();
        let (mut pa, mut pc) = (alloc_params(256), alloc_params(128));
        // SAFETY: valid pointers throughout.
        unsafe {
            assert_eq!(create(&mut g, 0), SUCCESS);
            assert_eq!(
                memory::add_alloc(&MEM, &mut a, g, std::ptr::null(), 0, &mut pa),
                SUCCESS
            );
            assert_eq!(
                memory::add_free(&mut f, g, [a].as_ptr(), 1, pa.dptr),
                SUCCESS
            );
            assert_eq!(
                memory::add_alloc(&MEM, &mut c, g, [f].as_ptr(), 1, &mut pc),
                SUCCESS
            );
            assert_eq!(pc.dptr, pa.dptr, "after the free, its memory and address");
            let mut back = alloc_params(0);
            assert_eq!(memory::alloc_get(c, &mut back), SUCCESS);
            assert_eq!((back.bytesize, back.dptr), (128, pa.dptr), "its own size");
            assert_eq!(
                memory::add_free(&mut f2, g, [a].as_ptr(), 1, pa.dptr),
                SUCCESS,
                "one free per allocation node of it"
            );
            assert_eq!(
                memory::add_free(&mut f2, g, [c].as_ptr(), 1, pa.dptr),
                INVALID_VALUE,
                "a third free"
            );
            assert_eq!(held_now(), 256, "one block, held from the node's making");
            let mut bad = alloc_params(0);
            assert_eq!(
                memory::add_alloc(&MEM, &mut other, g, std::ptr::null(), 0, &mut bad),
                INVALID_VALUE
            );
            bad = alloc_params(8);
            bad.props.handle_types = 1;
            assert_eq!(
                memory::add_alloc(&MEM, &mut other, g, std::ptr::null(), 0, &mut bad),
                NOT_SUPPORTED,
                "exportable"
            );
            assert_eq!(clone(&mut other, g), NOT_SUPPORTED);
            assert_eq!(destroy_node(f), NOT_SUPPORTED);
            assert_eq!(instantiate(&mut exec, g, 0), SUCCESS);
            assert_eq!(
                instantiate(&mut other, g, 0),
                INVALID_VALUE,
                "one at a time"
            );
            assert_eq!(launch(&log, exec, 9 as Raw), SUCCESS);
            assert_eq!(launch(&log, exec, 9 as Raw), SUCCESS, "freed each time");
            assert_eq!(exec_destroy(exec), SUCCESS);
            assert_eq!(destroy(g), SUCCESS);
            assert_eq!(held_now(), 0);
            assert_eq!(
                MEM.0.lock().unwrap().1.len(),
                before,
                "freed with the lock let go"
            );

            // An allocation left live: a relaunch is refused until it is freed.
            assert_eq!(create(&mut g, 0), SUCCESS);
            assert_eq!(
                memory::add_alloc(&MEM, &mut a, g, std::ptr::null(), 0, &mut pa),
                SUCCESS
            );
            assert_eq!(instantiate(&mut exec, g, 0), SUCCESS);
            assert_eq!(destroy(g), SUCCESS);
            assert_eq!(held_now(), 256, "the instantiation holds it");
            assert_eq!(
                free_block(pa.dptr),
                Some(INVALID_VALUE),
                "not allocated yet"
            );
            assert_eq!(launch(&log, exec, 9 as Raw), SUCCESS);
            assert_eq!(
                launch(&log, exec, 9 as Raw),
                INVALID_VALUE,
                "still allocated"
            );
            assert_eq!(exec_destroy(exec), SUCCESS);
            assert_eq!(held_now(), 256, "the allocation is live");
            assert_eq!(free_block(pa.dptr), Some(SUCCESS));
            assert_eq!(held_now(), 0);
            assert_eq!(free_block(pa.dptr), None, "gone: not graph memory any more");
            assert_eq!(MEM.0.lock().unwrap().1.len(), before);
        }
        assert!(log.take().is_empty(), "memory nodes issue no work");
    }

    #[test]
    fn a_capture_records_work_across_joined_streams_and_refuses_what_it_cannot_hold() {
        let _s = SERIAL.lock().unwrap();
        let log = Log::default();
        let (s1, s2, ev) = (0x100 as Raw, 0x200 as Raw, 0x300 as Raw);
        let mut v = 1u8;
        // SAFETY: valid pointers throughout.
        unsafe {
            assert_eq!(
                begin_capture(&log, std::ptr::null_mut(), 0),
                CAPTURE_UNSUPPORTED
            );
            assert_eq!(begin_capture(&log, s1, 0), SUCCESS);
            assert_eq!(begin_capture(&log, s1, 0), ILLEGAL_STATE);
            assert_eq!(
                capture(s1, || memset_op(0x10, 0, 1, 1, 8, 1)),
                Some(SUCCESS)
            );
            // Fork: s2 joins through an event recorded in the capture.
            assert_eq!(capture_record(ev, s1, false), Some(SUCCESS));
            assert_eq!(capture_wait(s2, ev, 0), Some(SUCCESS));
            let k = kernel(4, &mut v);
            let op = || {
                kernel_op(
                    &log,
                    k.func,
                    k.grid,
                    k.block,
                    0,
                    k.params,
                    std::ptr::null_mut(),
                    Vec::new(),
                )
            };
            assert_eq!(capture(s2, op), Some(SUCCESS));
            assert_eq!(
                capture(s1, || linear_copy_op(
                    0x10,
                    copy2d::DEVICE,
                    0x20,
                    copy2d::DEVICE,
                    16
                )),
                Some(SUCCESS)
            );
            let mut g: Raw = std::ptr::null_mut();
            assert_eq!(end_capture(s2, &mut g), CAPTURE_UNMATCHED);
            // Not joined back: the capture fails.
            assert_eq!(end_capture(s1, &mut g), CAPTURE_UNJOINED);
            assert!(g.is_null());
            assert_eq!(
                capture(s2, || Ok(Work(Op::Empty))),
                None,
                "s2 left the capture too"
            );

            // Again, joined back this time.
            assert_eq!(begin_capture(&log, s1, 0), SUCCESS);
            assert_eq!(
                capture(s1, || memset_op(0x10, 0, 1, 1, 8, 1)),
                Some(SUCCESS)
            );
            capture_record(ev, s1, false);
            capture_wait(s2, ev, 0);
            assert_eq!(capture(s2, op), Some(SUCCESS));
            assert_eq!(
                capture(s1, || memset_op(0x10, 0, 2, 1, 8, 1)),
                Some(SUCCESS)
            );
            capture_record(ev, s2, false);
            assert_eq!(capture_wait(s1, ev, 0), Some(SUCCESS));
            assert_eq!(capture(s1, || host_op(nothing, 6 as Raw)), Some(SUCCESS));
            let mut st = -1;
            let mut n = 0usize;
            capture_info(
                &log,
                s1,
                &mut st,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut n,
            );
            assert_eq!((st, n), (STATUS_ACTIVE, 1));
            assert_eq!(end_capture(s1, &mut g), SUCCESS);
            capture_info(
                &log,
                s1,
                &mut st,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut n,
            );
            assert_eq!(st, STATUS_NONE);
            let mut count = 0usize;
            nodes(g, std::ptr::null_mut(), &mut count, false);
            assert_eq!(count, 4);
            let mut exec: Raw = std::ptr::null_mut();
            assert_eq!(instantiate(&mut exec, g, 0), SUCCESS);
            assert_eq!(launch(&log, exec, s1), SUCCESS);
            assert_eq!(log.take(), ["m1", "k4 1", "m2", "h6"]);

            // A synchronisation invalidates a capture; it ends with no graph.
            assert_eq!(begin_capture(&log, s1, 0), SUCCESS);
            assert_eq!(capture_forbidden(s1), Some(CAPTURE_UNSUPPORTED));
            assert_eq!(
                capture(s1, || Ok(Work(Op::Empty))),
                Some(CAPTURE_INVALIDATED)
            );
            assert_eq!(end_capture(s1, &mut g), CAPTURE_INVALIDATED);
            assert!(g.is_null());
            assert_eq!(end_capture(s1, &mut g), ILLEGAL_STATE);
        }
    }

    #[test]
    fn an_update_takes_a_graph_of_the_same_shape_and_refuses_another() {
        let _s = SERIAL.lock().unwrap();
        let log = Log::default();
        let mut v = 1u8;
        let make = |v: &mut u8, extra: bool| {
            let (mut g, mut a, mut b): (Raw, Raw, Raw) = Default::default();
            // SAFETY: valid pointers.
            unsafe {
                create(&mut g, 0);
                add_kernel(&log, &mut a, g, std::ptr::null(), 0, &kernel(2, v), true);
                if extra {
                    add_empty(&mut b, g, [a].as_ptr(), 1);
                }
            }
            g
        };
        let g1 = make(&mut v, false);
        let mut exec: Raw = std::ptr::null_mut();
        let mut w = 5u8;
        let g2 = make(&mut w, false);
        let g3 = make(&mut w, true);
        let mut info = [0u64; 3];
        // SAFETY: valid pointers.
        unsafe {
            instantiate(&mut exec, g1, 0);
            assert_eq!(exec_update(exec, g2, info.as_mut_ptr().cast()), SUCCESS);
            launch(&log, exec, 9 as Raw);
            assert_eq!(log.take(), ["k2 5"]);
            assert_eq!(
                exec_update(exec, g3, info.as_mut_ptr().cast()),
                EXEC_UPDATE_FAILURE
            );
            assert_eq!(info[0] as c_int, UPDATE_TOPOLOGY_CHANGED);
            let mut c: Raw = std::ptr::null_mut();
            assert_eq!(super::entry::clone(&mut c, g3), SUCCESS);
            let mut n = 0usize;
            nodes(c, std::ptr::null_mut(), &mut n, false);
            assert_eq!(n, 2);
            assert_eq!(
                exec_update(exec, 12345 as Raw, std::ptr::null_mut()),
                INVALID_VALUE,
                "a forged graph"
            );
        }
    }
}
