//! Stream-ordered allocation and memory pools (`cuMemAllocAsync`, `cuMemFreeAsync`,
//! `cuMemPool*`), kept where the program runs: an allocation is made at once with
//! the library's own `cuMemAlloc` (it is there before the stream reaches it, which
//! the API allows), and a free waits for the stream's earlier work, then frees.
//! Pools are the library's records of what was allocated from them, with the
//! attributes a program sets and reads; the default pool of each device is made on
//! first use. Shared by Hira's guest `libcuda.so.1` (so pool memory is ordinary
//! device memory to the host: counted against the VM's quota, placed where a moved
//! session finds it again) and the CPU test executor, each through a [`Memory`] of
//! its own.
//!
//! Not built (`CUDA_ERROR_NOT_SUPPORTED`, as a driver without them answers): pools
//! whose memory can be exported (`handleTypes` other than none), pools on host
//! memory, importing and exporting pools and pointers, and allocation from a given
//! pool while a stream captures (from the current pool, it makes an allocation
//! node: `graph::memory`). A pool keeps
//! nothing cached: what is freed goes back at once, so its reserved memory is its
//! used memory.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;

use crate::graph;

type CUresult = c_int;
/// An opaque handle of the API (`CUmemoryPool`, `CUstream`).
pub type Raw = *mut c_void;

const SUCCESS: CUresult = 0;
const INVALID_VALUE: CUresult = 1;
const INVALID_DEVICE: CUresult = 101;
const INVALID_HANDLE: CUresult = 400;
const NOT_SUPPORTED: CUresult = 801;

/// `CU_MEM_ALLOCATION_TYPE_PINNED`, `CU_MEM_LOCATION_TYPE_DEVICE`,
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
const PINNED: c_int = 1;
const LOCATION_DEVICE: c_int = 1;
const READWRITE: c_int = 3;

/// `CUmemPool_attribute`.
const ATTR_REUSE_FIRST: c_int = 1;
const ATTR_REUSE_LAST: c_int = 3;
const ATTR_RELEASE_THRESHOLD: c_int = 4;
const ATTR_RESERVED_CURRENT: c_int = 5;
const ATTR_RESERVED_HIGH: c_int = 6;
const ATTR_USED_CURRENT: c_int = 7;
const ATTR_USED_HIGH: c_int = 8;

/// What the library serving the pools allocates and synchronises with: its own
/// entry points.
pub trait Memory: Sync {
    /// `cuMemAlloc` in the current context.
    fn alloc(&self, size: usize) -> Result<u64, CUresult>;
    /// `cuMemFree`.
    fn free(&self, ptr: u64) -> CUresult;
    /// `cuStreamSynchronize`.
    fn sync(&self, stream: Raw) -> CUresult;
    /// Whether `stream` is one the program may use (special handles included).
    fn stream_ok(&self, stream: Raw) -> bool;
    /// `cuCtxGetDevice`.
    fn current_device(&self) -> Result<c_int, CUresult>;
    /// `cuDeviceGetCount`.
    fn device_count(&self) -> c_int;
}

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Location {
    pub kind: c_int,
    pub id: c_int,
}

/// The start of `CUmemPoolProps`: what a pool is made with.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PoolProps {
    pub alloc_type: c_int,
    pub handle_types: c_int,
    pub location: Location,
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AccessDesc {
    pub location: Location,
    pub flags: c_int,
}

struct Pool {
    device: c_int,
    default: bool,
    threshold: u64,
    reuse: [c_int; 3],
    used: u64,
    high: u64,
}

#[derive(Default)]
struct Registry {
    pools: HashMap<u64, Pool>,
    defaults: HashMap<c_int, u64>,
    current: HashMap<c_int, u64>,
    /// Each live allocation made from a pool: its pool and size.
    allocs: HashMap<u64, (u64, u64)>,
    next: u64,
}

impl Registry {
    fn handle(&mut self) -> u64 {
        self.next += 1;
        (1 << 61) | self.next
    }

    fn default_of(&mut self, device: c_int) -> u64 {
        if let Some(&p) = self.defaults.get(&device) {
            return p;
        }
        let p = self.handle();
        self.pools.insert(
            p,
            Pool {
                device,
                default: true,
                threshold: 0,
                // As the driver sets them: reuse across event dependencies, and
                // opportunistically, and within the stream.
                reuse: [1, 1, 1],
                used: 0,
                high: 0,
            },
        );
        self.defaults.insert(device, p);
        p
    }

    fn current_of(&mut self, device: c_int) -> u64 {
        match self.current.get(&device) {
            Some(&p) => p,
            None => self.default_of(device),
        }
    }
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

fn with<T>(f: impl FnOnce(&mut Registry) -> T) -> T {
    let mut g = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(Registry::default))
}

fn device_ok(m: &dyn Memory, dev: c_int) -> bool {
    (0..m.device_count()).contains(&dev)
}

/// Writes `v` through `p`.
///
/// # Safety
/// `p` is null or valid for a write.
unsafe fn put<T>(p: *mut T, v: T) -> CUresult {
    if p.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: checked not null; the caller's promise.
    unsafe { p.write_unaligned(v) };
    SUCCESS
}

/// `cuMemAllocAsync` (`pool` null: the current device's current pool) and
/// `cuMemAllocFromPoolAsync`.
///
/// # Safety
/// `dptr` is null or valid for a write.
pub unsafe fn alloc_async(
    m: &'static dyn Memory,
    dptr: *mut u64,
    size: usize,
    pool: Raw,
    stream: Raw,
) -> CUresult {
    if dptr.is_null() {
        return INVALID_VALUE;
    }
    if !m.stream_ok(stream) {
        return INVALID_HANDLE;
    }
    // While the stream captures: an allocation node, from the device's graph
    // memory (a given pool is not taken there; the capture is invalidated).
    if !pool.is_null()
        && let Some(st) = graph::capture(stream, || Err(NOT_SUPPORTED))
    {
        return st;
    }
    // SAFETY: checked not null.
    if let Some(st) = unsafe { graph::capture_alloc(m, stream, dptr, size) } {
        return st;
    }
    let pool = if pool.is_null() {
        let dev = match m.current_device() {
            Ok(d) => d,
            Err(e) => return e,
        };
        with(|r| r.current_of(dev))
    } else if with(|r| r.pools.contains_key(&(pool as u64))) {
        pool as u64
    } else {
        return INVALID_VALUE;
    };
    if size == 0 {
        // SAFETY: checked not null.
        return unsafe { put(dptr, 0) };
    }
    let ptr = match m.alloc(size) {
        Ok(p) => p,
        Err(e) => return e,
    };
    with(|r| {
        r.allocs.insert(ptr, (pool, size as u64));
        if let Some(p) = r.pools.get_mut(&pool) {
            p.used += size as u64;
            p.high = p.high.max(p.used);
        }
    });
    // SAFETY: checked not null.
    unsafe { put(dptr, ptr) }
}

/// `cuMemFreeAsync`: after the stream's earlier work.
pub fn free_async(m: &dyn Memory, ptr: u64, stream: Raw) -> CUresult {
    if !m.stream_ok(stream) {
        return INVALID_HANDLE;
    }
    if let Some(st) = graph::capture_free(stream, ptr) {
        return st;
    }
    if ptr == 0 {
        return SUCCESS;
    }
    let st = m.sync(stream);
    if st != SUCCESS {
        return st;
    }
    let st = m.free(ptr);
    if st == SUCCESS {
        with(|r| {
            if let Some((pool, size)) = r.allocs.remove(&ptr)
                && let Some(p) = r.pools.get_mut(&pool)
            {
                p.used -= size;
            }
        });
    }
    st
}

/// `cuDeviceGetDefaultMemPool` (`current`: `cuDeviceGetMemPool`).
///
/// # Safety
/// `out` is null or valid for a write.
pub unsafe fn device_pool(m: &dyn Memory, out: *mut Raw, dev: c_int, current: bool) -> CUresult {
    if out.is_null() {
        return INVALID_VALUE;
    }
    if !device_ok(m, dev) {
        return INVALID_DEVICE;
    }
    let p = with(|r| {
        if current {
            r.current_of(dev)
        } else {
            r.default_of(dev)
        }
    });
    // SAFETY: checked not null.
    unsafe { put(out, p as Raw) }
}

/// `cuDeviceSetMemPool`: a pool of that device.
pub fn set_device_pool(m: &dyn Memory, dev: c_int, pool: Raw) -> CUresult {
    if !device_ok(m, dev) {
        return INVALID_DEVICE;
    }
    with(|r| match r.pools.get(&(pool as u64)) {
        Some(p) if p.device == dev => {
            r.current.insert(dev, pool as u64);
            SUCCESS
        }
        _ => INVALID_VALUE,
    })
}

/// `cuMemPoolCreate`: pinned device memory, not exportable.
///
/// # Safety
/// `out` and `props` are null or valid, as the API requires.
pub unsafe fn create(m: &dyn Memory, out: *mut Raw, props: *const PoolProps) -> CUresult {
    if out.is_null() || props.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: checked not null; the caller's promise.
    let p = unsafe { props.read_unaligned() };
    if p.alloc_type != PINNED {
        return INVALID_VALUE;
    }
    if p.handle_types != 0 || p.location.kind != LOCATION_DEVICE {
        return NOT_SUPPORTED;
    }
    if !device_ok(m, p.location.id) {
        return INVALID_DEVICE;
    }
    let h = with(|r| {
        let h = r.handle();
        r.pools.insert(
            h,
            Pool {
                device: p.location.id,
                default: false,
                threshold: 0,
                reuse: [1, 1, 1],
                used: 0,
                high: 0,
            },
        );
        h
    });
    // SAFETY: checked not null.
    unsafe { put(out, h as Raw) }
}

/// `cuMemPoolDestroy`: not a default pool; a device whose current pool it was goes
/// back to its default one.
pub fn destroy(pool: Raw) -> CUresult {
    with(|r| {
        let h = pool as u64;
        match r.pools.get(&h) {
            Some(p) if !p.default => {
                r.pools.remove(&h);
                r.current.retain(|_, v| *v != h);
                SUCCESS
            }
            _ => INVALID_VALUE,
        }
    })
}

/// `cuMemPoolTrimTo`: nothing is cached, so nothing to trim.
pub fn trim(pool: Raw) -> CUresult {
    with(|r| {
        if r.pools.contains_key(&(pool as u64)) {
            SUCCESS
        } else {
            INVALID_VALUE
        }
    })
}

/// `cuMemPoolSetAttribute`.
///
/// # Safety
/// `value` is null or valid for a read of the attribute's type.
pub unsafe fn set_attribute(pool: Raw, attr: c_int, value: *const c_void) -> CUresult {
    if value.is_null() {
        return INVALID_VALUE;
    }
    with(|r| {
        let Some(p) = r.pools.get_mut(&(pool as u64)) else {
            return INVALID_VALUE;
        };
        // SAFETY: the caller's promise, for the attribute's type.
        unsafe {
            match attr {
                ATTR_REUSE_FIRST..=ATTR_REUSE_LAST => {
                    p.reuse[(attr - ATTR_REUSE_FIRST) as usize] =
                        value.cast::<c_int>().read_unaligned();
                }
                ATTR_RELEASE_THRESHOLD => p.threshold = value.cast::<u64>().read_unaligned(),
                // The high-water marks may only be reset.
                ATTR_RESERVED_HIGH | ATTR_USED_HIGH => {
                    if value.cast::<u64>().read_unaligned() != 0 {
                        return INVALID_VALUE;
                    }
                    p.high = p.used;
                }
                _ => return INVALID_VALUE,
            }
        }
        SUCCESS
    })
}

/// `cuMemPoolGetAttribute`.
///
/// # Safety
/// `value` is null or valid for a write of the attribute's type.
pub unsafe fn get_attribute(pool: Raw, attr: c_int, value: *mut c_void) -> CUresult {
    if value.is_null() {
        return INVALID_VALUE;
    }
    with(|r| {
        let Some(p) = r.pools.get(&(pool as u64)) else {
            return INVALID_VALUE;
        };
        // SAFETY: the caller's promise, for the attribute's type.
        unsafe {
            match attr {
                ATTR_REUSE_FIRST..=ATTR_REUSE_LAST => put(
                    value.cast::<c_int>(),
                    p.reuse[(attr - ATTR_REUSE_FIRST) as usize],
                ),
                ATTR_RELEASE_THRESHOLD => put(value.cast::<u64>(), p.threshold),
                ATTR_RESERVED_CURRENT | ATTR_USED_CURRENT => put(value.cast::<u64>(), p.used),
                ATTR_RESERVED_HIGH | ATTR_USED_HIGH => put(value.cast::<u64>(), p.high),
                _ => INVALID_VALUE,
            }
        }
    })
}

/// `cuMemPoolSetAccess`: the pool's own device, read and write, is all there is.
///
/// # Safety
/// `map` is valid for `count` descriptions, as the API requires.
pub unsafe fn set_access(pool: Raw, map: *const AccessDesc, count: usize) -> CUresult {
    let Some(dev) = with(|r| r.pools.get(&(pool as u64)).map(|p| p.device)) else {
        return INVALID_VALUE;
    };
    if count > 0 && map.is_null() {
        return INVALID_VALUE;
    }
    for i in 0..count {
        // SAFETY: the caller's promise.
        let d = unsafe { map.add(i).read_unaligned() };
        if d.location.kind != LOCATION_DEVICE || d.location.id != dev {
            return INVALID_DEVICE;
        }
        if d.flags != READWRITE {
            return INVALID_VALUE;
        }
    }
    SUCCESS
}

/// `cuMemPoolGetAccess`.
///
/// # Safety
/// `flags` is null or valid for a write; `location` null or valid for a read.
pub unsafe fn get_access(flags: *mut c_int, pool: Raw, location: *const Location) -> CUresult {
    if location.is_null() {
        return INVALID_VALUE;
    }
    let Some(dev) = with(|r| r.pools.get(&(pool as u64)).map(|p| p.device)) else {
        return INVALID_VALUE;
    };
    // SAFETY: checked not null; the caller's promise.
    let l = unsafe { location.read_unaligned() };
    let v = if l.kind == LOCATION_DEVICE && l.id == dev {
        READWRITE
    } else {
        0
    };
    // SAFETY: the caller's promise.
    unsafe { put(flags, v) }
}

/// Defines the driver's stream-ordered allocation and memory-pool entry points
/// (each `#[unsafe(no_mangle)] extern "C"`, named as the driver names them) in the
/// calling module, through `$memory` (a `&'static dyn Memory`).
#[macro_export]
macro_rules! pool_entry_points {
    ($memory:expr) => {
        #[allow(non_snake_case, clippy::missing_safety_doc)]
        mod pool_entry_points {
            use std::ffi::{c_int, c_void};
            use $crate::pool::{self, AccessDesc, Location, PoolProps, Raw};

            type R = c_int;

            $crate::__pool_defs! {
                fn cuMemAllocAsync(dptr: *mut u64, size: usize, stream: Raw) {
                    unsafe { pool::alloc_async($memory, dptr, size, std::ptr::null_mut(), stream) }
                }
                fn cuMemAllocFromPoolAsync(dptr: *mut u64, size: usize, p: Raw, stream: Raw) {
                    if p.is_null() {
                        return 1;
                    }
                    unsafe { pool::alloc_async($memory, dptr, size, p, stream) }
                }
                fn cuMemFreeAsync(dptr: u64, stream: Raw) {
                    pool::free_async($memory, dptr, stream)
                }
                fn cuDeviceGetDefaultMemPool(out: *mut Raw, dev: c_int) {
                    unsafe { pool::device_pool($memory, out, dev, false) }
                }
                fn cuDeviceGetMemPool(out: *mut Raw, dev: c_int) {
                    unsafe { pool::device_pool($memory, out, dev, true) }
                }
                fn cuDeviceSetMemPool(dev: c_int, p: Raw) {
                    pool::set_device_pool($memory, dev, p)
                }
                fn cuMemPoolCreate(out: *mut Raw, props: *const PoolProps) {
                    unsafe { pool::create($memory, out, props) }
                }
                fn cuMemPoolDestroy(p: Raw) {
                    pool::destroy(p)
                }
                fn cuMemPoolTrimTo(p: Raw, _keep: usize) {
                    pool::trim(p)
                }
                fn cuMemPoolSetAttribute(p: Raw, attr: c_int, value: *const c_void) {
                    unsafe { pool::set_attribute(p, attr, value) }
                }
                fn cuMemPoolGetAttribute(p: Raw, attr: c_int, value: *mut c_void) {
                    unsafe { pool::get_attribute(p, attr, value) }
                }
                fn cuMemPoolSetAccess(p: Raw, map: *const AccessDesc, count: usize) {
                    unsafe { pool::set_access(p, map, count) }
                }
                fn cuMemPoolGetAccess(flags: *mut c_int, p: Raw, location: *const Location) {
                    unsafe { pool::get_access(flags, p, location) }
                }
            }
        }
        pub use pool_entry_points::*;
    };
}

/// Each function of [`pool_entry_points`] exported, and listed by `pool_entries`.
#[doc(hidden)]
#[macro_export]
macro_rules! __pool_defs {
    ($(fn $name:ident($($a:ident: $t:ty),* $(,)?) $body:block)*) => {
        $(
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name($($a: $t),*) -> R $body
        )*
        /// The entry points by their exported names.
        pub fn pool_entries() -> Vec<(&'static str, usize)> {
            vec![$((stringify!($name), $name as *const () as usize)),*]
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex as StdMutex;

    #[derive(Default)]
    struct Fake(StdMutex<(u64, Vec<String>)>);

    impl Memory for Fake {
        fn alloc(&self, size: usize) -> Result<u64, CUresult> {
            let mut g = self.0.lock().unwrap();
            g.0 += 0x1000;
            let p = g.0;
            g.1.push(format!("alloc {size}"));
            Ok(p)
        }
        fn free(&self, ptr: u64) -> CUresult {
            self.0.lock().unwrap().1.push(format!("free {ptr:#x}"));
            SUCCESS
        }
        fn sync(&self, stream: Raw) -> CUresult {
            self.0
                .lock()
                .unwrap()
                .1
                .push(format!("sync {}", stream as usize));
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

    #[test]
    fn allocations_count_in_their_pool_and_a_free_waits_for_its_stream() {
        let m: &'static Fake = Box::leak(Box::default());
        let (mut def, mut cur, mut mine): (Raw, Raw, Raw) = Default::default();
        let mut p = 0u64;
        let mut v = 0u64;
        // SAFETY: valid pointers throughout.
        unsafe {
            assert_eq!(device_pool(m, &mut def, 0, false), SUCCESS);
            assert_eq!(device_pool(m, &mut cur, 0, true), SUCCESS);
            assert_eq!(def, cur, "the default pool is current at first");
            assert_eq!(device_pool(m, &mut cur, 1, true), INVALID_DEVICE);
            assert_eq!(
                alloc_async(m, &mut p, 100, std::ptr::null_mut(), 7 as Raw),
                SUCCESS
            );
            assert_eq!(
                get_attribute(def, ATTR_USED_CURRENT, (&raw mut v).cast()),
                SUCCESS
            );
            assert_eq!(v, 100);
            let props = PoolProps {
                alloc_type: PINNED,
                handle_types: 0,
                location: Location {
                    kind: LOCATION_DEVICE,
                    id: 0,
                },
            };
            assert_eq!(create(m, &mut mine, &props), SUCCESS);
            assert_eq!(set_device_pool(m, 0, mine), SUCCESS);
            let mut q = 0u64;
            assert_eq!(
                alloc_async(m, &mut q, 50, std::ptr::null_mut(), 7 as Raw),
                SUCCESS
            );
            get_attribute(mine, ATTR_USED_HIGH, (&raw mut v).cast());
            assert_eq!(v, 50, "from the pool made current");
            assert_eq!(free_async(m, q, 7 as Raw), SUCCESS);
            get_attribute(mine, ATTR_USED_CURRENT, (&raw mut v).cast());
            assert_eq!(v, 0);
            let t = 1u64 << 30;
            assert_eq!(
                set_attribute(mine, ATTR_RELEASE_THRESHOLD, (&raw const t).cast()),
                SUCCESS
            );
            get_attribute(mine, ATTR_RELEASE_THRESHOLD, (&raw mut v).cast());
            assert_eq!(v, t);
            let nonzero = 5u64;
            assert_eq!(
                set_attribute(mine, ATTR_USED_HIGH, (&raw const nonzero).cast()),
                INVALID_VALUE
            );
            assert_eq!(destroy(def), INVALID_VALUE, "the default pool stays");
            assert_eq!(destroy(mine), SUCCESS);
            assert_eq!(device_pool(m, &mut cur, 0, true), SUCCESS);
            assert_eq!(cur, def, "back to the default pool");
            let shareable = PoolProps {
                handle_types: 1,
                ..props
            };
            assert_eq!(create(m, &mut mine, &shareable), NOT_SUPPORTED);
            assert_eq!(free_async(m, p, 7 as Raw), SUCCESS);
        }
        let log = m.0.lock().unwrap().1.clone();
        assert_eq!(
            log,
            [
                "alloc 100",
                "alloc 50",
                "sync 7",
                "free 0x2000",
                "sync 7",
                "free 0x1000"
            ]
        );
    }
}
