//! `cuGetExportTable`: the driver's private tables of functions, keyed by 16-byte
//! ids, that NVIDIA's runtime requires before it runs anything.
//!
//! Which tables and slots the CUDA 13.0 runtime calls, and what each must do, was
//! established three ways (docs/cuda.md, "NVIDIA's runtime"): a trace of the real
//! driver under the runtime and PyTorch (`tools/cuda-trace`), the runtime's own code,
//! and the reverse-engineering of ZLUDA, LUPINE (SCUDA) and Wine's nvcuda. Slots
//! marked "must work" below are called by the runtime; the others answer as a
//! driver that lacks the feature, and each is logged the first time it is called.
//!
//! The integrity check (table `d408…`, slot 1) is HMAC-MD2 over values only the
//! calling process knows (its pid and thread, the tables' addresses, the devices'
//! UUIDs and PCI ids), so it is computed where the program runs: in the guest. The
//! runtime computes the same hash itself and, on a mismatch, fails every call with
//! `cudaErrorSoftwareValidityNotEstablished` (103). The tables must therefore stay
//! at the same addresses for the life of the process, which statics give.
//!
//! The library serving the tables (Hira's guest `libcuda.so.1`, the CPU test
//! executor) installs a [`Driver`] for what only it can answer.

use rustc_hash::FxHashMap;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::{Mutex, OnceLock};

use hmac::{Mac, SimpleHmac};

type CUresult = c_int;
type Ctx = *mut c_void;

const SUCCESS: CUresult = 0;
const INVALID_VALUE: CUresult = 1;
const NOT_INITIALIZED: CUresult = 3;
const INVALID_HANDLE: CUresult = 400;
const NOT_SUPPORTED: CUresult = 801;

/// What the library serving the tables answers itself.
pub trait Driver: Sync {
    /// `cuDriverGetVersion`.
    fn driver_version(&self) -> c_int;
    /// The primary context of `dev`, as `cuDevicePrimaryCtxRetain` would return it
    /// (NVIDIA's driver does not retain it here).
    fn primary_context(&self, dev: c_int) -> Result<Ctx, CUresult>;
    /// The calling thread's current context, or null.
    fn current_context(&self) -> Ctx;
    /// Each device, as `cuDeviceGetUuid` and `cuDeviceGetAttribute` give it.
    fn devices(&self) -> Result<Vec<Device>, CUresult>;
    /// `cuModuleLoadData` of a fatbin wrapper (slots older runtimes load with).
    fn load_module(&self, module: *mut Ctx, image: *const c_void) -> CUresult;
}

static DRIVER: OnceLock<&'static dyn Driver> = OnceLock::new();

/// Installs the library's answers; the first installation holds.
pub fn install(driver: &'static dyn Driver) {
    let _ = DRIVER.set(driver);
}

fn driver() -> Option<&'static dyn Driver> {
    DRIVER.get().copied()
}

/// A table of words: a size in bytes or a function, as the driver lays them out.
#[repr(transparent)]
pub struct Table<const N: usize>([*const c_void; N]);

// SAFETY: the words are constants (function addresses and sizes), never written.
unsafe impl<const N: usize> Sync for Table<N> {}

impl<const N: usize> Table<N> {
    fn addr(&'static self) -> *const c_void {
        self.0.as_ptr().cast()
    }
}

macro_rules! f {
    ($f:expr) => {
        $f as *const c_void
    };
}

/// A size word.
const fn size(n: usize) -> *const c_void {
    n as *const c_void
}

/// Slots the CUDA 13.0 runtime never calls: each answers `CUDA_ERROR_NOT_SUPPORTED`,
/// as a driver without the feature, and is logged the first time.
macro_rules! stubs {
    ($($name:ident: $what:literal),* $(,)?) => {
        $(
            extern "C" fn $name() -> CUresult {
                log_once($what);
                NOT_SUPPORTED
            }
        )*
    };
}

fn log_once(what: &'static str) {
    static SEEN: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if !seen.contains(&what) {
        seen.push(what);
        log::warn!(
            "the driver's private interface {what} is not implemented: CUDA_ERROR_NOT_SUPPORTED"
        );
    }
}

stubs! {
    log_2: "f8cff951 slot 2",
    cudart_4: "6bd5fb6c slot 4",
    cudart_5: "6bd5fb6c slot 5",
    cudart_9: "6bd5fb6c slot 9",
    cudart_11: "6bd5fb6c slot 11",
    checks_1: "263e8860 slot 1",
    checks_4: "263e8860 slots 4 to 14",
}

extern "C" fn ret0() -> CUresult {
    SUCCESS
}

extern "C" fn noop() {}

// f8cff951…: the runtime's error log. Slot 1 takes (component, level, format,
// va_list); messages go nowhere, as with the driver's error log off.
extern "C" fn log_message(_c: *const c_char, _l: c_int, _f: *const c_char, _a: *mut c_void) {}

/// The runtime's error log (f8cff951…).
pub static LOG: Table<3> = Table([size(0x18), f!(log_message), f!(log_2)]);

// 6bd5fb6c…: CUDART_INTERFACE. Slot 2 must work; the module slots serve older
// runtimes; slot 3 sets up GL or VDPAU interop, which Hira has no graphics for.
extern "C" fn cudart_module(module: *mut Ctx, wrapper: *const c_void) -> CUresult {
    match driver() {
        Some(d) => d.load_module(module, wrapper),
        None => NOT_INITIALIZED,
    }
}

extern "C" fn cudart_primary_context(pctx: *mut Ctx, dev: c_int) -> CUresult {
    if pctx.is_null() {
        return INVALID_VALUE;
    }
    match driver().map(|d| d.primary_context(dev)) {
        Some(Ok(c)) => {
            // SAFETY: checked not null; the runtime's out-pointer.
            unsafe { pctx.write(c) };
            SUCCESS
        }
        Some(Err(e)) => e,
        None => NOT_INITIALIZED,
    }
}

extern "C" fn cudart_interop(_dev: c_int, _what: *const c_void) -> CUresult {
    NOT_SUPPORTED
}

extern "C" fn cudart_module_ext1(
    module: *mut Ctx,
    wrapper: *const c_void,
    a: *const c_void,
    b: *const c_void,
    c: c_uint,
) -> CUresult {
    if !a.is_null() || !b.is_null() || c != 0 {
        return NOT_SUPPORTED;
    }
    cudart_module(module, wrapper)
}

extern "C" fn cudart_module_ext2(
    fatbin: *const c_void,
    module: *mut Ctx,
    a: *const c_void,
    b: *const c_void,
    c: c_uint,
) -> CUresult {
    cudart_module_ext1(module, fatbin, a, b, c)
}

/// CUDART_INTERFACE (6bd5fb6c…).
pub static CUDART: Table<13> = Table([
    size(0x68),
    f!(cudart_module),
    f!(cudart_primary_context),
    f!(cudart_interop),
    f!(cudart_4),
    f!(cudart_5),
    f!(cudart_module_ext1),
    f!(noop),
    f!(cudart_module_ext2),
    f!(cudart_9),
    std::ptr::null(),
    f!(cudart_11),
    f!(ret0),
]);

// a094798c…: the tools' callback hooks. Slots 2 and 6 give the flags of which
// runtime calls and resources a tool follows: none here (zeroed u32 arrays of the
// driver's lengths, which the runtime checks). The hooks are callable no-ops.
static API_FLAGS: [u32; 1024] = [0; 1024];
static RESOURCE_FLAGS: [u32; 14] = [0; 14];

extern "C" fn hooks_api_flags(table: *mut *const u32, count: *mut usize) {
    // SAFETY: the runtime's out-pointers, checked not null.
    unsafe {
        if !table.is_null() {
            table.write(API_FLAGS.as_ptr());
        }
        if !count.is_null() {
            count.write(API_FLAGS.len());
        }
    }
}

extern "C" fn hooks_resource_flags(table: *mut *const u32, count: *mut usize) {
    // SAFETY: the runtime's out-pointers, checked not null.
    unsafe {
        if !table.is_null() {
            table.write(RESOURCE_FLAGS.as_ptr());
        }
        if !count.is_null() {
            count.write(RESOURCE_FLAGS.len());
        }
    }
}

/// TOOLS_RUNTIME_CALLBACK_HOOKS (a094798c…).
pub static HOOKS: Table<7> = Table([
    size(0x38),
    f!(noop),
    f!(hooks_api_flags),
    f!(noop),
    f!(noop),
    f!(noop),
    f!(hooks_resource_flags),
]);

// 42d85a81…: the tools' thread-local state. Slot 2 gives the current context.
extern "C" fn tls_current_context(out: *mut Ctx) -> CUresult {
    if out.is_null() {
        return INVALID_VALUE;
    }
    let c = driver().map_or(std::ptr::null_mut(), |d| d.current_context());
    // SAFETY: checked not null.
    unsafe { out.write(c) };
    SUCCESS
}

/// TOOLS_TLS (42d85a81…).
pub static TOOLS_TLS: Table<3> = Table([size(0x18), f!(ret0), f!(tls_current_context)]);

// c693336e…: context-local storage (no size word): values by (context, key), with
// a destructor called when the context ends. The runtime keeps its per-context
// state here.
type Destructor = Option<extern "C" fn(Ctx, *mut c_void, *mut c_void)>;

struct Stored {
    value: usize,
    dtor: Destructor,
}

fn storage() -> &'static Mutex<FxHashMap<(usize, usize), Stored>> {
    static S: OnceLock<Mutex<FxHashMap<(usize, usize), Stored>>> = OnceLock::new();
    S.get_or_init(Default::default)
}

fn context_or_current(ctx: Ctx) -> Option<usize> {
    let c = if ctx.is_null() {
        driver()?.current_context()
    } else {
        ctx
    };
    (!c.is_null()).then_some(c as usize)
}

extern "C" fn storage_put(
    ctx: Ctx,
    key: *mut c_void,
    value: *mut c_void,
    dtor: Destructor,
) -> CUresult {
    let Some(c) = context_or_current(ctx) else {
        return INVALID_HANDLE;
    };
    let mut s = storage().lock().unwrap_or_else(|e| e.into_inner());
    s.insert(
        (c, key as usize),
        Stored {
            value: value as usize,
            dtor,
        },
    );
    SUCCESS
}

extern "C" fn storage_del(ctx: Ctx, key: *mut c_void) -> CUresult {
    let Some(c) = context_or_current(ctx) else {
        return INVALID_HANDLE;
    };
    let mut s = storage().lock().unwrap_or_else(|e| e.into_inner());
    match s.remove(&(c, key as usize)) {
        Some(_) => SUCCESS,
        None => INVALID_HANDLE,
    }
}

extern "C" fn storage_get(value: *mut *mut c_void, ctx: Ctx, key: *mut c_void) -> CUresult {
    if value.is_null() {
        return INVALID_VALUE;
    }
    let Some(c) = context_or_current(ctx) else {
        return INVALID_HANDLE;
    };
    let s = storage().lock().unwrap_or_else(|e| e.into_inner());
    match s.get(&(c, key as usize)) {
        Some(v) => {
            // SAFETY: checked not null.
            unsafe { value.write(v.value as *mut c_void) };
            SUCCESS
        }
        None => INVALID_HANDLE,
    }
}

/// Context-local storage (c693336e…): put, delete, get, then a null word.
pub static CONTEXT_STORAGE: Table<4> = Table([
    f!(storage_put),
    f!(storage_del),
    f!(storage_get),
    std::ptr::null(),
]);

/// Ends what context `ctx` stored: each value's destructor runs, as the driver runs
/// them when a context is destroyed or the primary context reset.
pub fn context_ended(ctx: *mut c_void) {
    let ended: Vec<((usize, usize), Stored)> = {
        let mut s = storage().lock().unwrap_or_else(|e| e.into_inner());
        let keys: Vec<(usize, usize)> = s.keys().filter(|k| k.0 == ctx as usize).copied().collect();
        keys.into_iter()
            .filter_map(|k| s.remove(&k).map(|v| (k, v)))
            .collect()
    };
    // Outside the lock: a destructor may call the storage again.
    for ((c, key), v) in ended {
        if let Some(d) = v.dtor {
            d(c as Ctx, key as *mut c_void, v.value as *mut c_void);
        }
    }
}

// 263e8860…: context checks. Slot 2 tells whether a context wraps another (never
// here); slot 3 whether the runtime should keep contexts of its own (no).
extern "C" fn checks_unwrap(_ctx: Ctx, is_wrapped: *mut u32, _inner: *mut Ctx) -> CUresult {
    if !is_wrapped.is_null() {
        // SAFETY: checked not null; the runtime's out-pointer.
        unsafe { is_wrapped.write(0) };
    }
    SUCCESS
}

extern "C" fn checks_own_contexts() -> u32 {
    0
}

/// CONTEXT_CHECKS (263e8860…).
pub static CONTEXT_CHECKS: Table<15> = Table([
    size(0x78),
    f!(checks_1),
    f!(checks_unwrap),
    f!(checks_own_contexts),
    f!(checks_4),
    f!(checks_4),
    f!(checks_4),
    f!(checks_4),
    f!(checks_4),
    f!(checks_4),
    f!(checks_4),
    f!(checks_4),
    f!(checks_4),
    f!(checks_4),
    f!(checks_4),
]);

// d4082055…: the integrity check.
extern "C" fn integrity_check(version: u32, unix_seconds: u64, result: *mut [u64; 2]) -> CUresult {
    if result.is_null() {
        return INVALID_VALUE;
    }
    let Some(d) = driver() else {
        return NOT_INITIALIZED;
    };
    let r = match version % 10 {
        0 => [0x3341_181C_03CB_675C, 0x8ED3_83AA_1F4C_D1E8],
        1 => [0x1841_181C_03CB_675C, 0x8ED3_83AA_1F4C_D1E8],
        _ => {
            let devices = match d.devices() {
                Ok(v) => v,
                Err(e) => return e,
            };
            let inputs = Integrity {
                driver_version: d.driver_version() as u32,
                version,
                // SAFETY: plain queries of the calling process and thread.
                pid: unsafe { libc::getpid() } as u32,
                // SAFETY: as above.
                tid: unsafe { libc::pthread_self() } as u32,
                cudart_table: CUDART.addr() as u64,
                integrity_table: INTEGRITY.addr() as u64,
                function: INTEGRITY.0[1] as u64,
                unix_seconds,
                devices,
            };
            inputs.hash()
        }
    };
    // SAFETY: checked not null; the runtime's two words.
    unsafe { result.write(r) };
    SUCCESS
}

/// INTEGRITY_CHECK (d4082055…).
pub static INTEGRITY: Table<3> = Table([size(0x18), f!(integrity_check), f!(ret0)]);

/// What the integrity hash covers of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Device {
    pub uuid: [u8; 16],
    pub pci_domain: i32,
    pub pci_bus: i32,
    pub pci_device: i32,
}

/// What the integrity hash covers, in its order.
pub struct Integrity {
    pub driver_version: u32,
    pub version: u32,
    pub pid: u32,
    pub tid: u32,
    pub cudart_table: u64,
    pub integrity_table: u64,
    pub function: u64,
    pub unix_seconds: u64,
    pub devices: Vec<Device>,
}

/// The key of the HMAC, as the runtime holds it once decoded.
const KEY: [u8; 16] = [
    0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52, 0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f,
];

impl Integrity {
    /// HMAC-MD2 of the inputs, as two little-endian words.
    pub fn hash(&self) -> [u64; 2] {
        let mut m = <SimpleHmac<md2::Md2> as Mac>::new_from_slice(&KEY)
            .expect("HMAC takes a key of any length");
        m.update(&self.driver_version.to_le_bytes());
        m.update(&self.version.to_le_bytes());
        m.update(&self.pid.to_le_bytes());
        m.update(&self.tid.to_le_bytes());
        m.update(&self.cudart_table.to_le_bytes());
        m.update(&self.integrity_table.to_le_bytes());
        m.update(&self.function.to_le_bytes());
        m.update(&self.unix_seconds.to_le_bytes());
        for d in &self.devices {
            m.update(&d.uuid);
            m.update(&d.pci_domain.to_le_bytes());
            m.update(&d.pci_bus.to_le_bytes());
            m.update(&d.pci_device.to_le_bytes());
        }
        let out = m.finalize().into_bytes();
        let word = |at: usize| u64::from_le_bytes(out[at..at + 8].try_into().expect("16 bytes"));
        [word(0), word(8)]
    }
}

/// A table id as the driver's callers pass it: 16 bytes in memory order.
pub type Id = [u8; 16];

const fn id(hex: &str) -> Id {
    let b = hex.as_bytes();
    let mut out = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        out[i] = (nibble(b[2 * i]) << 4) | nibble(b[2 * i + 1]);
        i += 1;
    }
    out
}

const fn nibble(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        _ => panic!("not a hex digit"),
    }
}

/// The tables, by id.
pub fn table(want: &Id) -> Option<*const c_void> {
    type Address = fn() -> *const c_void;
    const TABLES: [(Id, Address); 7] = [
        (id("f8cff95121468b4eb9e2fb469e7c0dd9"), || LOG.addr()),
        (id("6bd5fb6c5bf4e74a8987d93912fd9df9"), || CUDART.addr()),
        (id("a094798c2e742e7493f20800200c0a66"), || HOOKS.addr()),
        (id("42d85a8123f6cb478298f6e78a3aecdc"), || TOOLS_TLS.addr()),
        (id("c693336e1121df11a8c368f355d89593"), || {
            CONTEXT_STORAGE.addr()
        }),
        (id("263e88607cd2614392f6bbd5006dfa7e"), || {
            CONTEXT_CHECKS.addr()
        }),
        (id("d4082055bde6704b8d34ba123c66e1f2"), || INTEGRITY.addr()),
    ];
    TABLES.iter().find(|(i, _)| i == want).map(|(_, t)| t())
}

/// `cuGetExportTable`: a table by id, or `CUDA_ERROR_INVALID_VALUE` for an id this
/// driver does not have (as NVIDIA's driver answers; logged once per id).
///
/// # Safety
/// `out` is null or valid for a write; `id` is null or points to 16 bytes.
pub unsafe fn get_export_table(out: *mut *const c_void, id: *const Id) -> CUresult {
    if out.is_null() || id.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: the caller's promise.
    let want = unsafe { id.read_unaligned() };
    match table(&want) {
        Some(t) => {
            // SAFETY: the caller's promise.
            unsafe { out.write(t) };
            SUCCESS
        }
        None => {
            static SEEN: Mutex<Vec<Id>> = Mutex::new(Vec::new());
            let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
            if !seen.contains(&want) {
                seen.push(want);
                let hex: String = want.iter().map(|b| format!("{b:02x}")).collect();
                log::warn!("cuGetExportTable({hex}): no such table here: CUDA_ERROR_INVALID_VALUE");
            }
            INVALID_VALUE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_integrity_hash_is_the_one_nvidias_driver_computed() {
        // Inputs and result read on an H200 with driver 580.159.04 (version 13002).
        let uuid = id("9da88ae471a26259e41834a404c33bb7");
        let i = Integrity {
            driver_version: 13000,
            version: 13002,
            pid: 478,
            tid: 3_458_209_600,
            cudart_table: 0x7f74_cdc4_c680,
            integrity_table: 0x7f74_cdc4_c660,
            function: 0x7f74_c85a_b350,
            unix_seconds: 1_795_789_854,
            devices: vec![Device {
                uuid,
                pci_domain: 0,
                pci_bus: 0,
                pci_device: 6,
            }],
        };
        assert_eq!(i.hash(), [0x60b5_aeb5_b085_804b, 0xb655_66fa_8026_0aae]);
    }

    #[test]
    fn tables_are_found_by_id_and_keep_their_address() {
        let mut t = std::ptr::null();
        let cudart = id("6bd5fb6c5bf4e74a8987d93912fd9df9");
        // SAFETY: valid pointers.
        assert_eq!(unsafe { get_export_table(&mut t, &cudart) }, SUCCESS);
        assert_eq!(t, CUDART.addr());
        // SAFETY: as above.
        assert_eq!(
            unsafe { get_export_table(&mut t, &[0u8; 16]) },
            INVALID_VALUE
        );
        // SAFETY: a table of 13 words.
        let words = unsafe { std::slice::from_raw_parts(CUDART.addr().cast::<usize>(), 13) };
        assert_eq!(words[0], 0x68);
        assert_eq!(words[10], 0);
        let mut n = 0usize;
        let mut flags: *const u32 = std::ptr::null();
        hooks_api_flags(&mut flags, &mut n);
        assert!(n > 0x20a && !flags.is_null());
    }

    extern "C" fn count_dtor(_c: Ctx, _k: *mut c_void, v: *mut c_void) {
        // SAFETY: the test's counter.
        unsafe { *(v.cast::<u32>()) += 1 };
    }

    #[test]
    fn context_storage_keeps_values_by_context_and_key_and_runs_destructors() {
        let ctx = 0x1234usize as Ctx;
        let key = 0x55usize as *mut c_void;
        let mut calls = 0u32;
        let v = (&mut calls as *mut u32).cast::<c_void>();
        let mut out = std::ptr::null_mut();
        assert_eq!(storage_get(&mut out, ctx, key), INVALID_HANDLE);
        assert_eq!(storage_put(ctx, key, v, Some(count_dtor)), SUCCESS);
        assert_eq!(storage_get(&mut out, ctx, key), SUCCESS);
        assert_eq!(out, v);
        assert_eq!(
            storage_get(&mut out, 0x999usize as Ctx, key),
            INVALID_HANDLE
        );
        context_ended(ctx);
        assert_eq!(calls, 1);
        assert_eq!(storage_get(&mut out, ctx, key), INVALID_HANDLE);
        assert_eq!(storage_put(ctx, key, v, None), SUCCESS);
        assert_eq!(storage_del(ctx, key), SUCCESS);
        assert_eq!(storage_del(ctx, key), INVALID_HANDLE);
    }
}
