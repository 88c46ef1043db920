//! Graph memory: allocation and free nodes (`cuGraphAddMemAllocNode`,
//! `cuGraphAddMemFreeNode`, and the nodes `cuMemAllocAsync` and `cuMemFreeAsync`
//! make while a stream captures), and a device's graph-memory footprint
//! (`cuDeviceGetGraphMemAttribute`, `cuDeviceSetGraphMemAttribute`,
//! `cuDeviceGraphMemTrim`).
//!
//! An allocation node's address is fixed when the node is made: the program writes
//! it into the nodes after it. With no reservation of addresses to map memory into
//! at launch, the memory is allocated then, with the library's own `cuMemAlloc`, and
//! held as long as a graph or an instantiation has a node of it, or an allocation a
//! launch made of it is not yet freed; then it goes back with `cuMemFree`. So the
//! footprint the attributes report is memory really held: from the node's creation
//! (NVIDIA's driver maps it at the first launch) and not shared between graphs whose
//! launches do not overlap. An allocation node ordered after the free of an earlier
//! allocation of its graph, of at least its size, takes that memory and address, as
//! the driver does.
//!
//! The driver's rules for graphs holding memory nodes are kept: no node or edge of
//! them is deleted, they are not cloned nor made child graphs, they have one
//! instantiation at a time; an allocation freed in its own graph is freed nowhere
//! else, and one freed in another graph gets no free node in its own. A launch that
//! would allocate what an earlier launch allocated and nobody freed, or free what is
//! not allocated, is refused before it issues anything (with
//! `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`, the earlier allocation is freed
//! first).

use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use super::{
    Graph, INVALID_VALUE, NOT_SUPPORTED, Op, Raw, Registry, SUCCESS, Work, capture, put, registry,
};
use crate::pool::{AccessDesc, Location, Memory};

type CUresult = c_int;

const INVALID_DEVICE: CUresult = 101;
/// `CU_MEM_ALLOCATION_TYPE_PINNED`, `CU_MEM_LOCATION_TYPE_DEVICE`.
const PINNED: c_int = 1;
const LOCATION_DEVICE: c_int = 1;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`: the most an access descriptor asks.
const ACCESS_MAX: c_int = 3;

/// `CUgraphMem_attribute`.
const ATTR_USED_CURRENT: c_int = 0;
const ATTR_USED_HIGH: c_int = 1;
const ATTR_RESERVED_CURRENT: c_int = 2;
const ATTR_RESERVED_HIGH: c_int = 3;

/// `CUmemPoolProps` (88 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PoolProps {
    pub alloc_type: c_int,
    pub handle_types: c_int,
    pub location: Location,
    pub win32: *mut c_void,
    pub max_size: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}

impl PoolProps {
    /// Pinned memory of device `id`, what a stream-ordered allocation is.
    fn on_device(id: c_int) -> PoolProps {
        PoolProps {
            alloc_type: PINNED,
            handle_types: 0,
            location: Location {
                kind: LOCATION_DEVICE,
                id,
            },
            win32: std::ptr::null_mut(),
            max_size: 0,
            usage: 0,
            reserved: [0; 54],
        }
    }
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (120 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AllocParams {
    pub props: PoolProps,
    pub access: *const AccessDesc,
    pub access_count: usize,
    pub bytesize: usize,
    pub dptr: u64,
}

/// The graph of a block made for a capture before its node is in the graph.
const PENDING: u64 = 0;

/// Memory of allocation nodes.
pub(super) struct Block {
    bytes: u64,
    device: c_int,
    /// The graph whose allocation nodes use it.
    graph: u64,
    /// The graph with a free node of it, if any.
    freed_in: Option<u64>,
    /// A launch allocated it and nothing freed it since.
    live: bool,
    /// What its first node was made with: what a query of its nodes gives back
    /// (the access descriptors are the block's own copies).
    props: PoolProps,
    access: Vec<AccessDesc>,
}

// SAFETY: `props` carries the program's `win32SecurityAttributes` pointer only to
// give it back; it is never dereferenced.
unsafe impl Send for Block {}

/// The library whose `cuMemAlloc` made the blocks, which frees them.
static MEMORY: OnceLock<&'static dyn Memory> = OnceLock::new();

/// Whether `g` has memory nodes.
pub(super) fn has_memory(g: &Graph) -> bool {
    g.nodes
        .values()
        .any(|n| matches!(n.op, Op::Alloc(..) | Op::Free(_)))
}

/// The nodes `deps` depend on, themselves included.
fn ancestors(g: &Graph, deps: &[u64]) -> HashSet<u64> {
    let mut seen: HashSet<u64> = HashSet::new();
    let mut todo: Vec<u64> = deps.to_vec();
    while let Some(n) = todo.pop() {
        if seen.insert(n)
            && let Some(node) = g.nodes.get(&n)
        {
            todo.extend(&node.deps);
        }
    }
    seen
}

/// A block of `g` of at least `bytes` on `device` whose every allocation in `g` is
/// freed in `g` before a node after `deps` runs.
fn reusable(r: &Registry, g: u64, deps: &[u64], bytes: u64, device: c_int) -> Option<u64> {
    let graph = r.graphs.get(&g)?;
    let before = ancestors(graph, deps);
    let mut candidates: Vec<(u64, u64)> = r
        .blocks
        .iter()
        .filter(|(_, b)| b.graph == g && b.bytes >= bytes && b.device == device)
        .map(|(&a, b)| (a, b.bytes))
        .collect();
    candidates.sort_unstable_by_key(|&(a, bytes)| (bytes, a));
    candidates.into_iter().map(|(a, _)| a).find(|&a| {
        graph.nodes.iter().all(|(id, node)| match node.op {
            Op::Alloc(x, _) if x == a => {
                before.contains(id)
                    && graph.nodes.iter().any(|(f, fnode)| {
                        matches!(fnode.op, Op::Free(y) if y == a)
                            && before.contains(f)
                            && ancestors(graph, &fnode.deps).contains(id)
                    })
            }
            _ => true,
        })
    })
}

/// The memory blocks held per device.
fn held(r: &Registry, device: c_int) -> u64 {
    r.blocks
        .values()
        .filter(|b| b.device == device)
        .map(|b| b.bytes)
        .sum()
}

/// Takes the blocks no graph, instantiation or unfreed allocation holds out of the
/// registry; the caller frees them once the lock is let go ([`free_all`]).
pub(super) fn unheld(r: &mut Registry) -> Vec<u64> {
    if r.blocks.is_empty() {
        return Vec::new();
    }
    let mut used: HashSet<u64> = HashSet::new();
    let mut mark = |op: &Op| {
        if let Op::Alloc(a, _) | Op::Free(a) = op {
            used.insert(*a);
        }
    };
    for g in r.graphs.values() {
        g.nodes.values().for_each(|n| mark(&n.op));
    }
    for e in r.execs.values() {
        e.steps.iter().for_each(|(_, op)| mark(op));
    }
    let gone: Vec<u64> = r
        .blocks
        .iter()
        .filter(|(a, b)| !b.live && b.graph != PENDING && !used.contains(a))
        .map(|(&a, _)| a)
        .collect();
    for a in &gone {
        r.blocks.remove(a);
    }
    gone
}

/// Frees blocks taken out of the registry, with the lock let go (the library's
/// `cuMemFree` asks this module first whether a pointer is a block).
pub(super) fn free_all(gone: Vec<u64>) {
    if let Some(m) = MEMORY.get() {
        for a in gone {
            m.free(a);
        }
    }
}

/// The program's parameters of an allocation node, checked as the driver checks
/// them: pinned memory on the current device, not exportable, access asked for
/// that device only.
///
/// # Safety
/// `p` is null or valid for a read, its `accessDescs` for `accessDescCount` items.
unsafe fn checked(
    m: &dyn Memory,
    p: *const AllocParams,
) -> Result<(AllocParams, Vec<AccessDesc>), CUresult> {
    if p.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: the caller's promise.
    let a = unsafe { p.read_unaligned() };
    if a.bytesize == 0 || a.props.alloc_type != PINNED || a.props.location.kind != LOCATION_DEVICE {
        return Err(INVALID_VALUE);
    }
    let device = a.props.location.id;
    if device < 0 || device >= m.device_count() {
        return Err(INVALID_DEVICE);
    }
    if a.props.handle_types != 0 || m.current_device()? != device {
        return Err(NOT_SUPPORTED);
    }
    if a.access_count > m.device_count() as usize || (a.access_count > 0 && a.access.is_null()) {
        return Err(INVALID_VALUE);
    }
    let access = if a.access_count == 0 {
        Vec::new()
    } else {
        // SAFETY: the caller's promise.
        unsafe { std::slice::from_raw_parts(a.access, a.access_count) }.to_vec()
    };
    for d in &access {
        if d.location.kind != LOCATION_DEVICE
            || d.location.id != device
            || !(0..=ACCESS_MAX).contains(&d.flags)
        {
            return Err(INVALID_VALUE);
        }
    }
    Ok((a, access))
}

/// A new block of `bytes` for graph `graph`, allocated now.
fn new_block(
    m: &'static dyn Memory,
    graph: u64,
    bytes: usize,
    props: PoolProps,
    access: Vec<AccessDesc>,
) -> Result<(u64, Block), CUresult> {
    let _ = MEMORY.set(m);
    let addr = m.alloc(bytes)?;
    Ok((
        addr,
        Block {
            bytes: bytes as u64,
            device: props.location.id,
            graph,
            freed_in: None,
            live: false,
            props,
            access,
        },
    ))
}

/// Records `b` at `addr`, raising the device's high marks.
fn insert(r: &mut Registry, addr: u64, b: Block) {
    let device = b.device;
    r.blocks.insert(addr, b);
    let now = held(r, device);
    let high = r.graph_mem_high.entry(device).or_insert(0);
    *high = (*high).max(now);
}

/// Whether a free node for `addr` may go into graph `g`, and if so notes it there:
/// in its own graph, once per allocation node of it; in one other graph, if its own
/// frees it nowhere.
fn note_free(r: &mut Registry, g: u64, addr: u64) -> Result<(), CUresult> {
    let b = r.blocks.get(&addr).ok_or(INVALID_VALUE)?;
    let own = b.graph;
    match b.freed_in {
        Some(other) if other != g => return Err(INVALID_VALUE),
        _ if g == own => {
            let graph = r.graphs.get(&g).ok_or(INVALID_VALUE)?;
            let count = |free: bool| {
                graph
                    .nodes
                    .values()
                    .filter(|n| match n.op {
                        Op::Alloc(a, _) => !free && a == addr,
                        Op::Free(a) => free && a == addr,
                        _ => false,
                    })
                    .count()
            };
            if count(true) >= count(false) {
                return Err(INVALID_VALUE);
            }
        }
        _ => {}
    }
    r.blocks.get_mut(&addr).expect("checked").freed_in = Some(g);
    Ok(())
}

/// `cuGraphAddMemAllocNode`: writes the allocation's address into `p`.
///
/// # Safety
/// The API's pointers, as it requires.
pub unsafe fn add_alloc(
    m: &'static dyn Memory,
    out: *mut Raw,
    graph: Raw,
    deps: *const Raw,
    n: usize,
    p: *mut AllocParams,
) -> CUresult {
    if out.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: the caller's promise.
    let (a, access) = match unsafe { checked(m, p) } {
        Ok(x) => x,
        Err(e) => return e,
    };
    let g = graph as u64;
    let (deps, reuse) = {
        let r = registry();
        if !r.graphs.contains_key(&g) {
            return INVALID_VALUE;
        }
        // SAFETY: the caller's promise.
        let deps = match unsafe { super::deps_of(&r, g, deps, n) } {
            Ok(d) => d,
            Err(e) => return e,
        };
        let reuse = reusable(&r, g, &deps, a.bytesize as u64, a.props.location.id);
        (deps, reuse)
    };
    // Allocated with the lock let go: `cuMemAlloc` may ask the host.
    let (addr, block) = match reuse {
        Some(addr) => (addr, None),
        None => match new_block(m, g, a.bytesize, a.props, access) {
            Ok((addr, b)) => (addr, Some(b)),
            Err(e) => return e,
        },
    };
    let mut r = registry();
    if !r.graphs.contains_key(&g) {
        drop(r);
        if block.is_some() {
            free_all(vec![addr]);
        }
        return INVALID_VALUE;
    }
    if let Some(b) = block {
        insert(&mut r, addr, b);
    }
    let id = r.insert_node(g, Op::Alloc(addr, a.bytesize as u64), deps);
    // SAFETY: checked not null; the caller's promise for `p`.
    unsafe {
        out.write(id as Raw);
        (&raw mut (*p).dptr).write_unaligned(addr);
    }
    SUCCESS
}

/// `cuGraphAddMemFreeNode`: `dptr` must be an allocation node's.
///
/// # Safety
/// The API's pointers, as it requires.
pub unsafe fn add_free(
    out: *mut Raw,
    graph: Raw,
    deps: *const Raw,
    n: usize,
    dptr: u64,
) -> CUresult {
    // SAFETY: the caller's promise.
    unsafe {
        super::add(out, graph, deps, n, |r| {
            note_free(r, graph as u64, dptr)?;
            Ok(Op::Free(dptr))
        })
    }
}

/// The address an allocation or free node names, and for an allocation the size it
/// asked for.
fn node_addr(node: Raw, alloc: bool) -> Option<(u64, u64)> {
    let r = registry();
    let n = node as u64;
    let g = r.owner.get(&n)?;
    match (alloc, &r.graphs.get(g)?.nodes.get(&n)?.op) {
        (true, Op::Alloc(a, bytes)) => Some((*a, *bytes)),
        (false, Op::Free(a)) => Some((*a, 0)),
        _ => None,
    }
}

/// `cuGraphMemAllocNodeGetParams`: the pool properties and access descriptors
/// point into the block's own copies (of the node that made it), the size is the
/// node's own.
///
/// # Safety
/// `p` is null or valid for a write.
pub unsafe fn alloc_get(node: Raw, p: *mut AllocParams) -> CUresult {
    if p.is_null() {
        return INVALID_VALUE;
    }
    let Some((addr, bytes)) = node_addr(node, true) else {
        return INVALID_VALUE;
    };
    let r = registry();
    let Some(b) = r.blocks.get(&addr) else {
        return INVALID_VALUE;
    };
    let a = AllocParams {
        props: b.props,
        access: if b.access.is_empty() {
            std::ptr::null()
        } else {
            b.access.as_ptr()
        },
        access_count: b.access.len(),
        bytesize: bytes as usize,
        dptr: addr,
    };
    // SAFETY: checked not null; the caller's promise.
    unsafe { p.write_unaligned(a) };
    SUCCESS
}

/// `cuGraphMemFreeNodeGetParams`.
///
/// # Safety
/// `out` is null or valid for a write.
pub unsafe fn free_get(node: Raw, out: *mut u64) -> CUresult {
    match (out.is_null(), node_addr(node, false)) {
        (false, Some((a, _))) => {
            // SAFETY: checked not null.
            unsafe { put(out, a) };
            SUCCESS
        }
        _ => INVALID_VALUE,
    }
}

/// Applies the allocations and frees of a launch of `steps`, or refuses the launch
/// with nothing changed.
pub(super) fn launch(
    r: &mut Registry,
    steps: &[(u64, Op)],
    auto_free: bool,
) -> Result<(), CUresult> {
    let mut live: HashMap<u64, bool> = HashMap::new();
    for (_, op) in steps {
        match op {
            Op::Alloc(a, _) => {
                let now = live
                    .get(a)
                    .copied()
                    .or_else(|| r.blocks.get(a).map(|b| b.live));
                match now {
                    Some(false) => {}
                    Some(true) if auto_free => {}
                    _ => return Err(INVALID_VALUE),
                }
                live.insert(*a, true);
            }
            Op::Free(a) => {
                let now = live
                    .get(a)
                    .copied()
                    .or_else(|| r.blocks.get(a).map(|b| b.live));
                if now != Some(true) {
                    return Err(INVALID_VALUE);
                }
                live.insert(*a, false);
            }
            _ => {}
        }
    }
    for (a, l) in live {
        if let Some(b) = r.blocks.get_mut(&a) {
            b.live = l;
        }
    }
    Ok(())
}

/// `cuMemFree` and `cuMemFreeAsync` of an allocation a graph made: `Some` with the
/// answer where `ptr` is one (it is no longer allocated, and its memory goes back
/// once nothing holds it), `None` for other memory.
pub fn free_block(ptr: u64) -> Option<CUresult> {
    let gone = {
        let mut r = registry();
        let b = r.blocks.get_mut(&ptr)?;
        if !b.live {
            return Some(INVALID_VALUE);
        }
        b.live = false;
        unheld(&mut r)
    };
    free_all(gone);
    Some(SUCCESS)
}

/// `cuMemAllocAsync` while `stream` captures: an allocation node in the capture,
/// whose address goes to `dptr`. `None` when the stream does not capture.
///
/// # Safety
/// `dptr` is valid for a write.
pub unsafe fn capture_alloc(
    m: &'static dyn Memory,
    stream: Raw,
    dptr: *mut u64,
    size: usize,
) -> Option<CUresult> {
    let mut made: Option<(u64, u64)> = None;
    let st = capture(stream, || {
        if size == 0 {
            return Err(INVALID_VALUE);
        }
        let g = capture_graph(&registry(), stream).ok_or(INVALID_VALUE)?;
        let props = PoolProps::on_device(m.current_device()?);
        // Pending (held, though no node names it yet) until its node is in `g`.
        let (addr, b) = new_block(m, PENDING, size, props, Vec::new())?;
        insert(&mut registry(), addr, b);
        made = Some((addr, g));
        Ok(Work(Op::Alloc(addr, size as u64)))
    })?;
    if let Some((a, g)) = made {
        let mut r = registry();
        if st == SUCCESS {
            if let Some(b) = r.blocks.get_mut(&a) {
                b.graph = g;
            }
        } else {
            r.blocks.remove(&a);
            drop(r);
            free_all(vec![a]);
        }
    }
    if st == SUCCESS {
        // SAFETY: the caller's promise.
        unsafe { dptr.write(made.map_or(0, |(a, _)| a)) };
    }
    Some(st)
}

/// The graph of the capture `stream` takes part in.
fn capture_graph(r: &Registry, stream: Raw) -> Option<u64> {
    let c = r.streams.get(&(stream as usize))?;
    r.captures.get(c).map(|c| c.graph)
}

/// `cuMemFreeAsync` while `stream` captures: a free node in the capture, for an
/// allocation a graph made. `None` when the stream does not capture.
pub fn capture_free(stream: Raw, ptr: u64) -> Option<CUresult> {
    capture(stream, || {
        let mut r = registry();
        if !r.blocks.contains_key(&ptr) {
            // Memory of no allocation node: the driver's graphs free only theirs.
            return Err(NOT_SUPPORTED);
        }
        let g = capture_graph(&r, stream).ok_or(INVALID_VALUE)?;
        note_free(&mut r, g, ptr)?;
        Ok(Work(Op::Free(ptr)))
    })
}

/// Whether `dev` is a device.
fn device_ok(m: &dyn Memory, dev: c_int) -> bool {
    dev >= 0 && dev < m.device_count()
}

/// `cuDeviceGetGraphMemAttribute`: the memory held for graphs (used and reserved
/// are the same here: nothing is kept beyond what the graphs hold), and its high
/// mark.
///
/// # Safety
/// `value` is null or valid for a write of a `cuuint64_t`.
pub unsafe fn attribute(m: &dyn Memory, dev: c_int, attr: c_int, value: *mut c_void) -> CUresult {
    if !device_ok(m, dev) {
        return INVALID_DEVICE;
    }
    if value.is_null() {
        return INVALID_VALUE;
    }
    let r = registry();
    let v = match attr {
        ATTR_USED_CURRENT | ATTR_RESERVED_CURRENT => held(&r, dev),
        ATTR_USED_HIGH | ATTR_RESERVED_HIGH => r.graph_mem_high.get(&dev).copied().unwrap_or(0),
        _ => return INVALID_VALUE,
    };
    // SAFETY: checked not null; the caller's promise.
    unsafe { put(value.cast::<u64>(), v) };
    SUCCESS
}

/// `cuDeviceSetGraphMemAttribute`: a high mark reset (to what is held now) by
/// setting it to 0.
///
/// # Safety
/// `value` is null or valid for a read of a `cuuint64_t`.
pub unsafe fn set_attribute(
    m: &dyn Memory,
    dev: c_int,
    attr: c_int,
    value: *const c_void,
) -> CUresult {
    if !device_ok(m, dev) {
        return INVALID_DEVICE;
    }
    if value.is_null() || ![ATTR_USED_HIGH, ATTR_RESERVED_HIGH].contains(&attr) {
        return INVALID_VALUE;
    }
    // SAFETY: checked not null; the caller's promise.
    if unsafe { value.cast::<u64>().read_unaligned() } != 0 {
        return INVALID_VALUE;
    }
    let mut r = registry();
    let now = held(&r, dev);
    r.graph_mem_high.insert(dev, now);
    SUCCESS
}

/// `cuDeviceGraphMemTrim`: nothing is cached beyond what graphs hold, so nothing
/// goes back.
pub fn trim(m: &dyn Memory, dev: c_int) -> CUresult {
    if !device_ok(m, dev) {
        return INVALID_DEVICE;
    }
    SUCCESS
}
