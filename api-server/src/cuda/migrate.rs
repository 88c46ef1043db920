//! Migration of CUDA sessions: the calls that made the session's live objects (kept
//! as they succeed), and the capture of a quiesced session into a snapshot and its
//! restore into a fresh API server.
//!
//! Device addresses are raw numbers in kernels' arguments and in device data, so a
//! moved session must find every allocation where it was: the guest's memory is
//! placed at addresses Hira reserved (`placement`), which the restore reserves
//! again, and the contents are copied back. Contexts, modules, libraries, functions,
//! streams and events are made again by replaying the calls that made them, with the
//! guest's ids; the modules' variables must land where they were (the driver places
//! them; a restore where they land elsewhere fails, and the session stays) and get
//! their contents back. Primary contexts are retained as often as the guest retained
//! them, with their flags. Events recorded before the move are recorded again (they
//! read as complete; times measured across a move are not kept). Arrays are made
//! again by their calls and get their contents back; texture and surface objects
//! (whose values kernels take as arguments) are made again in the order they were
//! made, after the memory and arrays they read, and each must come out with the
//! value the guest holds (a restore where one does not fails, and the session stays).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{c_int, c_uint, c_void};

use hira_apis_cuda::{HOST_ID_BIT, Kind, op, op_info};
use hira_migration::log::Entry;
use hira_migration::{Snapshot, StandIn};
use hira_protocol::api::tag;
use hira_protocol::{Reader, Writer};

use super::Session;
use super::placement::{Allocation, ChunkInfo};
use crate::backend::{FrameData, MigrationError};

/// Stand-in kinds of a CUDA snapshot.
const PRIMARY: u8 = 1;
const CHUNK: u8 = 2;
const ALLOCATION: u8 = 3;
const VARIABLE: u8 = 4;
const RECORDED: u8 = 5;
/// A context whose `printf` FIFO size can no longer be set.
const FIFO_FIXED: u8 = 6;
/// An array's contents (`id`: its guest id, `owner`: its context).
const ARRAY: u8 = 7;
/// A texture object (`id`: its value, `owner`: its context; in the order made).
const TEXTURE: u8 = 8;
/// A surface object, as [`TEXTURE`].
const SURFACE: u8 = 9;
/// How many objects a restore makes and sets aside to reach the value an object had
/// (drivers hand out values in order; a value freed before the move leaves a gap).
const OBJECT_GAP_MAX: usize = 4096;
/// `CU_LIMIT_PRINTF_FIFO_SIZE`.
const LIMIT_PRINTF_FIFO_SIZE: c_int = 1;

/// Keys of settings that have no number of their own.
const CACHE_CONFIG: u64 = 1 << 40;

/// The calls that made the session's live objects and their settings, in order.
#[derive(Default)]
pub(crate) struct CudaLog {
    entries: BTreeMap<u64, Entry>,
    next_seq: u64,
    /// The entry that made each object.
    made_by: HashMap<u64, u64>,
    /// What each object belongs to (a module's context, a function's module), whose
    /// end is its end.
    owner: HashMap<u64, u64>,
    /// The entry holding each setting of an object.
    settings: HashMap<(u64, u64), u64>,
    /// Events recorded at least once, with the order of their latest record (a
    /// restore records them again in that order, so that elapsed times between them
    /// keep their sign).
    recorded: HashMap<u64, u64>,
    records: u64,
}

impl CudaLog {
    fn push(&mut self, opcode: u16, request: Vec<u8>) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.entries.insert(
            seq,
            Entry {
                seq,
                opcode,
                request,
                creates: Vec::new(),
                subject: None,
                key: None,
                uses: Vec::new(),
            },
        );
        seq
    }

    fn created(&mut self, opcode: u16, request: Vec<u8>, id: u64, owner: Option<u64>) {
        let seq = self.push(opcode, request);
        let e = self.entries.get_mut(&seq).expect("just pushed");
        e.creates.push(id);
        e.uses.extend(owner);
        self.made_by.insert(id, seq);
        if let Some(o) = owner {
            self.owner.insert(id, o);
        }
    }

    fn configured(&mut self, opcode: u16, request: Vec<u8>, subject: u64, key: u64) {
        let seq = self.push(opcode, request);
        let e = self.entries.get_mut(&seq).expect("just pushed");
        e.subject = Some(subject);
        e.key = Some(key);
        if let Some(old) = self.settings.insert((subject, key), seq) {
            self.entries.remove(&old);
        }
    }

    /// Object `id` is gone, with everything that belongs to it.
    pub(crate) fn released(&mut self, id: u64) {
        let mut gone = vec![id];
        while let Some(id) = gone.pop() {
            if let Some(seq) = self.made_by.remove(&id) {
                self.entries.remove(&seq);
            }
            self.owner.remove(&id);
            self.recorded.remove(&id);
            let entries = &mut self.entries;
            self.settings.retain(|&(subject, _), seq| {
                let keep = subject != id;
                if !keep {
                    entries.remove(seq);
                }
                keep
            });
            gone.extend(
                self.owner
                    .iter()
                    .filter(|&(_, &o)| o == id)
                    .map(|(&child, _)| child),
            );
        }
    }

    /// A context was destroyed (a primary one reset or released for the last time):
    /// what was made in it is gone.
    pub(crate) fn context_ended(&mut self, ctx: u64) {
        self.released(ctx);
    }

    /// The calls to replay, in order.
    pub(crate) fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }

    fn owner_of(&self, id: u64) -> Option<u64> {
        self.owner.get(&id).copied()
    }
}

/// A request's byte argument at `at`, inline: a window span's bytes are copied into
/// the request (the window is not part of the snapshot).
fn inline_bytes(payload: &[u8], at: usize, frame: &FrameData<'_>) -> Option<Vec<u8>> {
    let mut r = Reader::new(payload.get(at..)?);
    let t = r.u8().ok()?;
    if t != tag::WINDOW {
        return Some(payload.to_vec());
    }
    let span = frame.spans.get(usize::from(r.u16().ok()?))?;
    let p = frame.window?.at(span.offset, span.len)?;
    let mut out = payload[..at].to_vec();
    out.push(tag::INLINE);
    let mut w = Writer::new();
    // SAFETY: a span the window holds (checked by `at`); copied once, now.
    let bytes = unsafe { std::slice::from_raw_parts(p, span.len as usize) };
    w.bytes(bytes);
    out.extend_from_slice(w.as_slice());
    out.extend_from_slice(payload.get(at + 3..)?);
    Some(out)
}

/// The id a `newh` argument at `at` names (`None`: the guest passed NULL), and
/// where the request goes on.
fn new_id(payload: &[u8], at: usize) -> Option<(Option<u64>, usize)> {
    let mut r = Reader::new(payload.get(at..)?);
    if r.u8().ok()? == 0 {
        return Some((None, at + 1));
    }
    Some((Some(r.u64().ok()?), at + 9))
}

fn u64_at(payload: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        payload.get(at..at + 8)?.try_into().ok()?,
    ))
}

fn i32_at(payload: &[u8], at: usize) -> Option<i32> {
    Some(i32::from_le_bytes(
        payload.get(at..at + 4)?.try_into().ok()?,
    ))
}

impl Session {
    /// Whether `opcode` sets the `printf` FIFO size of a context where it was fixed
    /// before the session moved here (the driver here would allow it; the guest's
    /// program saw it refused, and sees that still).
    pub(crate) fn fifo_still_fixed(&self, opcode: u16, payload: &[u8]) -> bool {
        opcode == op::cuCtxSetLimit
            && i32_at(payload, 8) == Some(LIMIT_PRINTF_FIFO_SIZE)
            && u64_at(payload, 0).is_some_and(|ctx| {
                self.fifo_fixed
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .contains(&ctx)
            })
    }

    /// Whether context `id` (current) can no longer have its `printf` FIFO size set:
    /// setting it to what it is fails once a kernel that prints has run.
    fn fifo_fixed_here(&self, id: u64) -> bool {
        let moved = self
            .fifo_fixed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&id);
        let (Some(get), Some(set)) = (self.driver.cuCtxGetLimit, self.driver.cuCtxSetLimit) else {
            return moved;
        };
        let mut size = 0usize;
        // SAFETY: an out-pointer and a limit; the context is current.
        if unsafe { get(&mut size, LIMIT_PRINTF_FIFO_SIZE) } != 0 {
            return moved;
        }
        // SAFETY: the same size again: nothing changes where it is allowed.
        moved || unsafe { set(LIMIT_PRINTF_FIFO_SIZE, size) } != 0
    }

    /// Keeps what migration needs of a call that succeeded: the calls that make
    /// objects and change their settings, the releases, the events recorded.
    pub(crate) fn record(&self, opcode: u16, payload: &[u8], frame: &FrameData<'_>) {
        // Requests of `current` calls start with the context's id.
        let ctx = u64_at(payload, 0);
        let mut log = self.log();
        let _ = (|| -> Option<()> {
            match opcode {
                op::cuCtxCreate_v2 => {
                    let (id, _) = new_id(payload, 0)?;
                    log.created(opcode, payload.to_vec(), id?, None);
                }
                op::cuModuleLoadData => {
                    let (id, at) = new_id(payload, 8)?;
                    let request = inline_bytes(payload, at, frame)?;
                    log.created(opcode, request, id?, ctx);
                }
                op::hiraLibraryLoad => {
                    let (id, at) = new_id(payload, 0)?;
                    let request = inline_bytes(payload, at, frame)?;
                    log.created(opcode, request, id?, None);
                }
                op::cuModuleGetFunction | op::cuLibraryGetKernel => {
                    let (id, at) = new_id(payload, 8)?;
                    let parent = u64_at(payload, at)?;
                    let request = inline_bytes(payload, at + 8, frame)?;
                    log.created(opcode, request, id?, Some(parent));
                }
                op::cuArrayCreate_v2 | op::cuArray3DCreate_v2 => {
                    let (id, at) = new_id(payload, 8)?;
                    let request = inline_bytes(payload, at, frame)?;
                    log.created(opcode, request, id?, ctx);
                }
                op::cuArrayDestroy => log.released(u64_at(payload, 0)?),
                op::cuStreamCreate | op::cuStreamCreateWithPriority | op::cuEventCreate => {
                    let (id, _) = new_id(payload, 8)?;
                    log.created(opcode, payload.to_vec(), id?, ctx);
                }
                op::cuCtxDestroy_v2 | op::cuLibraryUnload => log.released(ctx?),
                op::cuModuleUnload | op::cuStreamDestroy_v2 | op::cuEventDestroy_v2 => {
                    log.released(u64_at(payload, 8)?)
                }
                op::cuCtxSetLimit => {
                    let limit = i32_at(payload, 8)?;
                    log.configured(opcode, payload.to_vec(), ctx?, limit as u32 as u64);
                }
                op::cuCtxSetCacheConfig => {
                    log.configured(opcode, payload.to_vec(), ctx?, CACHE_CONFIG)
                }
                op::cuFuncSetAttribute => {
                    let (f, attr) = (u64_at(payload, 8)?, i32_at(payload, 16)?);
                    log.configured(opcode, payload.to_vec(), f, attr as u32 as u64);
                }
                op::cuFuncSetCacheConfig => {
                    log.configured(opcode, payload.to_vec(), u64_at(payload, 8)?, CACHE_CONFIG)
                }
                op::cuKernelSetAttribute => {
                    let (attr, k) = (i32_at(payload, 8)?, u64_at(payload, 16)?);
                    let dev = i32_at(payload, 24)?;
                    let key = (attr as u32 as u64) | ((dev as u32 as u64) << 32);
                    log.configured(opcode, payload.to_vec(), k, key);
                }
                op::cuKernelSetCacheConfig => {
                    let (k, dev) = (u64_at(payload, 8)?, i32_at(payload, 20)?);
                    let key = CACHE_CONFIG | (dev as u32 as u64);
                    log.configured(opcode, payload.to_vec(), k, key);
                }
                op::cuEventRecord => {
                    let ev = u64_at(payload, 8)?;
                    log.records += 1;
                    let n = log.records;
                    log.recorded.insert(ev, n);
                }
                _ => {}
            }
            Some(())
        })();
    }
}

fn host(what: &'static str, status: c_int) -> MigrationError {
    MigrationError::Host {
        what,
        status: Some(status),
    }
}

fn check(what: &'static str, status: c_int) -> Result<(), MigrationError> {
    if status == 0 {
        Ok(())
    } else {
        Err(host(what, status))
    }
}

fn missing(what: &'static str) -> MigrationError {
    MigrationError::Host { what, status: None }
}

/// A variable of a module or library, as the snapshot keeps it: which object, in
/// which context (a library's are per context), its name and size.
struct Variable {
    at: u64,
    owner: u64,
    ctx: u64,
    size: u64,
    name: String,
}

impl Variable {
    fn state(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u64(self.ctx).u64(self.size).bytes(self.name.as_bytes());
        w.into_vec()
    }

    fn read(si: &StandIn) -> Result<Variable, MigrationError> {
        let mut r = Reader::new(&si.state);
        let bad = |_| MigrationError::Inconsistent("a module variable's record");
        let ctx = r.u64().map_err(bad)?;
        let size = r.u64().map_err(bad)?;
        let name = r.bytes(4096).map_err(bad)?;
        let name = String::from_utf8(name.to_vec())
            .map_err(|_| MigrationError::Inconsistent("a module variable's name"))?;
        Ok(Variable {
            at: si.id,
            owner: si.owner,
            ctx,
            size,
            name,
        })
    }
}

impl Session {
    /// Makes context `h` current for a capture's or restore's own calls.
    fn enter(&self, h: *mut c_void) -> Result<(), MigrationError> {
        self.make_current(h)
            .map_err(|_| missing("making a context current"))
    }

    /// The live contexts: (guest id, host handle).
    fn contexts(&self) -> Vec<(u64, *mut c_void)> {
        let hs = self.handles();
        let mut v: Vec<(u64, *mut c_void)> = hs
            .table
            .iter()
            .filter(|(_, e)| e.kind == Kind::Context)
            .map(|(id, e)| (id, e.host as *mut c_void))
            .collect();
        v.sort_unstable_by_key(|&(id, _)| id);
        v
    }

    /// Makes a live context of device `dev` current (copies of its memory need one).
    fn current_on(&self, dev: c_int) -> Result<(), MigrationError> {
        let get_dev = self
            .driver
            .cuCtxGetDevice
            .ok_or(missing("cuCtxGetDevice"))?;
        for (_, h) in self.contexts() {
            self.enter(h)?;
            let mut d: c_int = -1;
            // SAFETY: an out-pointer; the context is current.
            if unsafe { get_dev(&mut d) } == 0 && d == dev {
                return Ok(());
            }
        }
        Err(MigrationError::Inconsistent(
            "device memory on a device no context of the session uses",
        ))
    }

    /// The address and size of variable `name` of module or library `owner` in the
    /// current context.
    fn variable(&self, owner: u64, name: &str) -> Option<(u64, u64)> {
        let mut cname = name.as_bytes().to_vec();
        cname.push(0);
        let (mut at, mut size) = (0u64, 0usize);
        let st = if let Some(h) = self.handles().table.get(owner, Kind::Module) {
            let f = self.driver.cuModuleGetGlobal_v2?;
            // SAFETY: two out-pointers, a module of this session, a C string.
            unsafe { f(&mut at, &mut size, h as *mut c_void, cname.as_ptr().cast()) }
        } else {
            let h = self.handles().table.get(owner, Kind::Library)?;
            let f = self.driver.cuLibraryGetGlobal?;
            // SAFETY: two out-pointers, a library of this session, a C string.
            unsafe { f(&mut at, &mut size, h as *mut c_void, cname.as_ptr().cast()) }
        };
        (st == 0).then_some((at, size as u64))
    }

    fn read_device(&self, at: u64, n: u64) -> Result<Vec<u8>, MigrationError> {
        let f = self.driver.cuMemcpyDtoH_v2.ok_or(missing("cuMemcpyDtoH"))?;
        let mut v = vec![0u8; n as usize];
        // SAFETY: a buffer of `n` bytes; device memory of the current context.
        check("reading device memory", unsafe {
            f(v.as_mut_ptr().cast(), at, n as usize)
        })?;
        Ok(v)
    }

    fn write_device(&self, at: u64, data: &[u8]) -> Result<(), MigrationError> {
        let f = self.driver.cuMemcpyHtoD_v2.ok_or(missing("cuMemcpyHtoD"))?;
        // SAFETY: `data` holds the bytes; device memory of the current context.
        check("writing device memory", unsafe {
            f(at, data.as_ptr().cast(), data.len())
        })
    }

    /// The variables of every live module and library, where each is now.
    fn variables(&self) -> Result<Vec<Variable>, MigrationError> {
        let images: Vec<(u64, Option<u64>, Vec<u8>)> = {
            let log = self.log();
            log.entries()
                .filter(|e| e.opcode == op::cuModuleLoadData || e.opcode == op::hiraLibraryLoad)
                .map(|e| (e.creates[0], log.owner_of(e.creates[0]), e.request.clone()))
                .collect()
        };
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        for (owner, ctx, request) in images {
            // The image is the request's byte argument, after the ids.
            let at = if ctx.is_some() { 17 } else { 9 };
            let mut r = Reader::new(request.get(at..).unwrap_or_default());
            let image = match r.u8() {
                Ok(tag::INLINE) => r.bytes(usize::MAX).unwrap_or_default(),
                _ => &[],
            };
            let Some(names) = hira_apis_cuda_private::variables::of_image(image) else {
                return Err(MigrationError::Unmigratable(
                    "a module whose image (PTX or cubin) does not say its variables".into(),
                ));
            };
            // A module's variables are in its context; a library's in every context.
            let contexts: Vec<(u64, *mut c_void)> = match ctx {
                Some(c) => self
                    .contexts()
                    .into_iter()
                    .filter(|&(id, _)| id == c)
                    .collect(),
                None => self.contexts(),
            };
            for (cid, h) in contexts {
                self.enter(h)?;
                for name in &names {
                    if let Some((at, size)) = self.variable(owner, name)
                        && seen.insert(at)
                    {
                        out.push(Variable {
                            at,
                            owner,
                            ctx: cid,
                            size,
                            name: name.clone(),
                        });
                    }
                }
            }
        }
        Ok(out)
    }

    /// Copies array `id` (the guest's; its context current) whole to or from `data`
    /// (`out`: from the array), its texels row after row.
    fn copy_array(&self, id: u64, data: &mut [u8], out: bool) -> Result<(), MigrationError> {
        use hira_apis_cuda_private::copy2d::{ARRAY, HOST, Memcpy3D};
        let d = self
            .textures()
            .arrays
            .get(&id)
            .map(|a| a.desc)
            .ok_or(MigrationError::Inconsistent("an array"))?;
        let row = hira_apis_cuda_private::texture::texel_bytes(d.format, d.channels)
            .ok_or(MigrationError::Inconsistent("an array's format"))?
            * d.width;
        let (h, depth) = (d.height.max(1), d.depth.max(1));
        if row * h * depth != data.len() {
            return Err(MigrationError::ContentsSize {
                got: data.len(),
                want: row * h * depth,
            });
        }
        let array = self
            .lookup(Kind::Array, id, false)
            .map_err(|_| MigrationError::Inconsistent("an array"))?;
        let f = self.extra.cuMemcpy3D_v2.ok_or(missing("cuMemcpy3D"))?;
        // SAFETY: all zeroes is a valid description (integers and null pointers).
        let mut c: Memcpy3D = unsafe { std::mem::zeroed() };
        (c.width_in_bytes, c.height, c.depth) = (row, h, depth);
        if out {
            (c.src_memory_type, c.src_array) = (ARRAY, array);
            (c.dst_memory_type, c.dst_host) = (HOST, data.as_mut_ptr().cast());
            (c.dst_pitch, c.dst_height) = (row, h);
        } else {
            (c.dst_memory_type, c.dst_array) = (ARRAY, array);
            (c.src_memory_type, c.src_host) = (HOST, data.as_ptr().cast());
            (c.src_pitch, c.src_height) = (row, h);
        }
        // SAFETY: the whole array and a host buffer of exactly its texels.
        check("copying an array", unsafe { f(&c) })
    }

    /// The context (the host's) of the session's context `id`, current.
    fn enter_id(&self, id: u64, what: &'static str) -> Result<(), MigrationError> {
        let (_, h) = self
            .contexts()
            .into_iter()
            .find(|&(c, _)| c == id)
            .ok_or(MigrationError::Inconsistent(what))?;
        self.enter(h)
    }

    /// Makes a texture or surface object again, with the value `want` it had:
    /// objects that come out with lower values are set aside until then and
    /// destroyed after.
    fn remake_object(
        &self,
        si: &StandIn,
        set_aside: &mut Vec<(bool, u64)>,
    ) -> Result<(), MigrationError> {
        let surface = si.kind == SURFACE;
        let (opcode, name) = if surface {
            (op::cuSurfObjectCreate, "cuSurfObjectCreate")
        } else {
            (op::cuTexObjectCreate, "cuTexObjectCreate")
        };
        let frame = FrameData {
            spans: &[],
            window: None,
            no_reply: false,
        };
        for _ in 0..=OBJECT_GAP_MAX {
            let mut w = Writer::new();
            super::generated::dispatch(self, opcode, &mut Reader::new(&si.state), &frame, &mut w)
                .map_err(|source| MigrationError::Replay { name, source })?;
            let reply = w.as_slice();
            let status = i32_at(reply, 0).unwrap_or(-1);
            if status != 0 {
                return Err(MigrationError::ReplayStatus { name, status });
            }
            let got = u64_at(reply, 4).ok_or(MigrationError::Inconsistent("an object's value"))?;
            if got == si.id {
                return Ok(());
            }
            set_aside.push((surface, got));
            if got > si.id {
                break;
            }
        }
        Err(MigrationError::ReplayDiffers(if surface {
            "a surface object's value"
        } else {
            "a texture object's value"
        }))
    }

    /// Destroys the objects a restore set aside.
    fn destroy_set_aside(&self, set_aside: Vec<(bool, u64)>) {
        for (surface, v) in set_aside {
            let destroy = if surface {
                self.driver.cuSurfObjectDestroy
            } else {
                self.driver.cuTexObjectDestroy
            };
            let Some(o) = self.textures().objects.remove(&(surface, v)) else {
                continue;
            };
            if let (Some(f), Ok(())) = (destroy, self.enter_id(o.ctx, "an object's context")) {
                // SAFETY: an object this restore made.
                unsafe { f(v) };
            }
        }
    }

    /// Captures the quiesced session.
    pub(crate) fn capture(&self, pending: Vec<u8>) -> Result<Vec<u8>, MigrationError> {
        if self.placement().driver_placed() {
            return Err(MigrationError::Unmigratable(
                "its device memory was placed by the driver (HIRA_CUDA_PLACEMENT=driver, or \
                 a driver without virtual memory management), so its addresses cannot be kept"
                    .into(),
            ));
        }
        // Everything enqueued finishes first; a context that failed cannot move.
        let sync = self
            .driver
            .cuCtxSynchronize
            .ok_or(missing("cuCtxSynchronize"))?;
        for (_, h) in self.contexts() {
            self.enter(h)?;
            // SAFETY: the context is current.
            check("synchronizing a context", unsafe { sync() })?;
        }
        self.device_time.sweep(&self.driver, false);
        let mut standins = Vec::new();
        let mut contents = Vec::new();
        let primaries: Vec<(c_int, u32, Option<u64>)> = {
            let hs = self.handles();
            hs.primary
                .iter()
                .filter(|&(_, &n)| n > 0)
                .map(|(&d, &n)| (d, n, hs.primary_ids.get(&d).copied()))
                .collect()
        };
        let state = self.driver.cuDevicePrimaryCtxGetState;
        for (dev, n, id) in primaries {
            let (mut flags, mut active): (c_uint, c_int) = (0, 0);
            let get = state.ok_or(missing("cuDevicePrimaryCtxGetState"))?;
            // SAFETY: two out-pointers and a device the session retained.
            check("reading a primary context's state", unsafe {
                get(dev, &mut flags, &mut active)
            })?;
            standins.push(StandIn {
                id: id.unwrap_or(0),
                kind: PRIMARY,
                owner: dev as u32 as u64,
                refs: n,
                state: flags.to_le_bytes().to_vec(),
            });
        }
        let chunks = self.placement().chunks();
        for c in &chunks {
            self.current_on(c.dev)?;
            contents.push((c.at, self.read_device(c.at, c.size)?));
            let mut w = Writer::new();
            w.u64(c.size).u8(u8::from(c.shared));
            standins.push(StandIn {
                id: c.at,
                kind: CHUNK,
                owner: c.dev as u32 as u64,
                refs: 0,
                state: w.into_vec(),
            });
        }
        for (at, a) in self.placement().allocations() {
            let mut w = Writer::new();
            w.u64(a.size)
                .u64(a.chunk.expect("placed by Hira (checked above)"))
                .u64(a.buffer_id);
            standins.push(StandIn {
                id: at,
                kind: ALLOCATION,
                owner: a.ctx,
                refs: 0,
                state: w.into_vec(),
            });
        }
        for v in self.variables()? {
            let (_, h) = self
                .contexts()
                .into_iter()
                .find(|&(id, _)| id == v.ctx)
                .ok_or(MigrationError::Inconsistent("a variable's context"))?;
            self.enter(h)?;
            contents.push((v.at, self.read_device(v.at, v.size)?));
            standins.push(StandIn {
                id: v.at,
                kind: VARIABLE,
                owner: v.owner,
                refs: 0,
                state: v.state(),
            });
        }
        for (id, h) in self.contexts() {
            self.enter(h)?;
            if self.fifo_fixed_here(id) {
                standins.push(StandIn {
                    id,
                    kind: FIFO_FIXED,
                    owner: id,
                    refs: 0,
                    state: Vec::new(),
                });
            }
        }
        let arrays: Vec<(u64, u64, usize)> = self
            .textures()
            .arrays
            .iter()
            .map(|(&id, a)| {
                let d = a.desc;
                let texel =
                    hira_apis_cuda_private::texture::texel_bytes(d.format, d.channels).unwrap_or(0);
                (
                    id,
                    a.ctx,
                    texel * d.width * d.height.max(1) * d.depth.max(1),
                )
            })
            .collect();
        for (id, ctx, n) in arrays {
            self.enter_id(ctx, "an array's context")?;
            let mut data = vec![0u8; n];
            self.copy_array(id, &mut data, true)?;
            standins.push(StandIn {
                id,
                kind: ARRAY,
                owner: ctx,
                refs: 0,
                state: data,
            });
        }
        {
            let t = self.textures();
            let mut objects: Vec<_> = t.objects.iter().collect();
            objects.sort_by_key(|(_, o)| o.seq);
            for (&(surface, v), o) in objects {
                standins.push(StandIn {
                    id: v,
                    kind: if surface { SURFACE } else { TEXTURE },
                    owner: o.ctx,
                    refs: 0,
                    state: o.request.clone(),
                });
            }
        }
        let log = self.log();
        let mut recorded: Vec<(u64, u64)> = log.recorded.iter().map(|(&e, &n)| (n, e)).collect();
        recorded.sort_unstable();
        for (n, ev) in recorded {
            standins.push(StandIn {
                id: ev,
                kind: RECORDED,
                owner: log.owner_of(ev).unwrap_or(0),
                refs: 0,
                state: n.to_le_bytes().to_vec(),
            });
        }
        let snap = Snapshot {
            api: u16::from(hira_apis_cuda::API.0),
            entries: log.entries().cloned().collect(),
            refs: Vec::new(),
            contents,
            standins,
            pending,
        };
        Ok(snap.encode())
    }

    /// Restores a snapshot into this fresh session; returns the guest's input to
    /// execute first.
    pub(crate) fn restore(
        &self,
        bytes: &[u8],
        device: Option<u32>,
    ) -> Result<Vec<u8>, MigrationError> {
        let snap = Snapshot::decode(bytes)?;
        if snap.api != u16::from(hira_apis_cuda::API.0) {
            return Err(MigrationError::WrongApi);
        }
        if device.is_some() {
            return Err(MigrationError::DeviceSwap);
        }
        let init = self.driver.cuInit.ok_or(missing("cuInit"))?;
        // SAFETY: flags 0, as the API requires.
        check("initialising the driver", unsafe { init(0) })?;
        let contents: HashMap<u64, &Vec<u8>> =
            snap.contents.iter().map(|(id, b)| (*id, b)).collect();
        let by_kind = |k: u8| snap.standins.iter().filter(move |s| s.kind == k);
        // Primary contexts, with their flags, retained as often as the guest did.
        for si in by_kind(PRIMARY) {
            let dev = c_int::try_from(si.owner)
                .map_err(|_| MigrationError::Inconsistent("a primary context's device"))?;
            let flags = u32::from_le_bytes(
                si.state
                    .get(..4)
                    .and_then(|b| b.try_into().ok())
                    .ok_or(MigrationError::Inconsistent("a primary context's flags"))?,
            );
            if si.id != 0 && (si.id & HOST_ID_BIT == 0 || self.handles().table.contains(si.id)) {
                return Err(MigrationError::Inconsistent("a primary context's id"));
            }
            let set = self
                .driver
                .cuDevicePrimaryCtxSetFlags_v2
                .ok_or(missing("cuDevicePrimaryCtxSetFlags"))?;
            // SAFETY: a device ordinal and flags the driver checks.
            check("setting a primary context's flags", unsafe {
                set(dev, flags)
            })?;
            let retain = self
                .driver
                .cuDevicePrimaryCtxRetain
                .ok_or(missing("cuDevicePrimaryCtxRetain"))?;
            for _ in 0..si.refs.min(1 << 16) {
                let mut h: *mut c_void = std::ptr::null_mut();
                // SAFETY: an out-pointer and a device ordinal.
                check("retaining a primary context", unsafe {
                    retain((&mut h as *mut *mut c_void).cast(), dev)
                })?;
                if si.id != 0 {
                    self.handles()
                        .table
                        .insert(si.id, Kind::Context, h as usize, 0);
                }
                self.retained_primary(dev, 1, (si.id != 0).then_some(si.id));
            }
        }
        // Objects, in the order they were made.
        let live_contexts =
            |s: &Session| -> HashSet<u64> { s.contexts().into_iter().map(|(id, _)| id).collect() };
        for e in &snap.entries {
            let info = op_info(e.opcode).ok_or(MigrationError::Inconsistent("an unknown call"))?;
            let mut request = e.request.clone();
            // A kernel outlives the context it was looked up in.
            let kernel_call = [
                op::cuLibraryGetKernel,
                op::cuKernelSetAttribute,
                op::cuKernelSetCacheConfig,
            ]
            .contains(&e.opcode);
            if kernel_call
                && let Some(ctx) = u64_at(&request, 0)
                && !live_contexts(self).contains(&ctx)
            {
                request[..8].copy_from_slice(&0u64.to_le_bytes());
            }
            let frame = FrameData {
                spans: &[],
                window: None,
                no_reply: false,
            };
            let mut w = Writer::new();
            super::generated::dispatch(self, e.opcode, &mut Reader::new(&request), &frame, &mut w)
                .map_err(|source| MigrationError::Replay {
                    name: info.name,
                    source,
                })?;
            let status = i32_at(w.as_slice(), 0).unwrap_or(-1);
            if status != 0 {
                return Err(MigrationError::ReplayStatus {
                    name: info.name,
                    status,
                });
            }
            self.after_call(e.opcode, &request, &frame);
        }
        // Device memory at the same addresses, with its contents.
        let vmm = self.vmm;
        let mut charged = 0u64;
        for si in by_kind(CHUNK) {
            let v = vmm.as_ref().ok_or(MigrationError::Unmigratable(
                "this host's driver cannot place memory at chosen addresses".into(),
            ))?;
            let mut r = Reader::new(&si.state);
            let bad = |_| MigrationError::Inconsistent("a chunk's record");
            let size = r.u64().map_err(bad)?;
            let shared = r.u8().map_err(bad)? != 0;
            let dev = c_int::try_from(si.owner)
                .map_err(|_| MigrationError::Inconsistent("a chunk's device"))?;
            let c = ChunkInfo {
                at: si.id,
                size,
                dev,
                shared,
            };
            self.current_on(dev)?;
            self.placement()
                .restore_chunk(v, c)
                .map_err(MigrationError::Unmigratable)?;
            let data = contents
                .get(&c.at)
                .ok_or(MigrationError::Inconsistent("a chunk without contents"))?;
            if data.len() as u64 != size {
                return Err(MigrationError::ContentsSize {
                    got: data.len(),
                    want: size as usize,
                });
            }
            self.write_device(c.at, data)?;
        }
        for si in by_kind(ALLOCATION) {
            let mut r = Reader::new(&si.state);
            let bad = |_| MigrationError::Inconsistent("an allocation's record");
            let a = Allocation {
                size: r.u64().map_err(bad)?,
                ctx: si.owner,
                chunk: Some(r.u64().map_err(bad)?),
                buffer_id: r.u64().map_err(bad)?,
            };
            if !live_contexts(self).contains(&a.ctx) {
                return Err(MigrationError::Inconsistent("an allocation's context"));
            }
            self.placement()
                .restore_allocation(si.id, a)
                .map_err(MigrationError::Unmigratable)?;
            charged += a.size;
        }
        if self.quota.charge(charged).is_err() {
            return Err(MigrationError::Unmigratable(format!(
                "its {charged} bytes of device memory exceed the VM's quota here"
            )));
        }
        // Modules' variables where they were, with their contents.
        for si in by_kind(VARIABLE) {
            let v = Variable::read(si)?;
            let (_, h) = self
                .contexts()
                .into_iter()
                .find(|&(id, _)| id == v.ctx)
                .ok_or(MigrationError::Inconsistent("a variable's context"))?;
            self.enter(h)?;
            match self.variable(v.owner, &v.name) {
                Some((at, size)) if at == v.at && size == v.size => {}
                _ => return Err(MigrationError::ReplayDiffers("a module's variable")),
            }
            let data = contents
                .get(&v.at)
                .ok_or(MigrationError::Inconsistent("a variable without contents"))?;
            if data.len() as u64 != v.size {
                return Err(MigrationError::ContentsSize {
                    got: data.len(),
                    want: v.size as usize,
                });
            }
            self.write_device(v.at, data)?;
        }
        // Arrays' contents; then texture and surface objects, over the memory and
        // arrays they read, in the order they were made.
        for si in by_kind(ARRAY) {
            self.enter_id(si.owner, "an array's context")?;
            let mut data = si.state.clone();
            self.copy_array(si.id, &mut data, false)?;
        }
        let mut set_aside = Vec::new();
        let remade = snap
            .standins
            .iter()
            .filter(|si| si.kind == TEXTURE || si.kind == SURFACE)
            .try_for_each(|si| {
                self.enter_id(si.owner, "an object's context")?;
                self.remake_object(si, &mut set_aside)
            });
        self.destroy_set_aside(set_aside);
        remade?;
        // Events recorded before read as complete, recorded again in the order of
        // their latest records there.
        let record = self.driver.cuEventRecord.ok_or(missing("cuEventRecord"))?;
        let mut events: Vec<&StandIn> = by_kind(RECORDED).collect();
        events.sort_by_key(|si| u64_at(&si.state, 0).unwrap_or(0));
        for si in events {
            let (_, ctx) = self
                .contexts()
                .into_iter()
                .find(|&(id, _)| id == si.owner)
                .ok_or(MigrationError::Inconsistent("an event's context"))?;
            let ev = self
                .lookup(Kind::Event, si.id, false)
                .map_err(|_| MigrationError::Inconsistent("a recorded event"))?;
            self.enter(ctx)?;
            // SAFETY: an event of this session and the legacy stream.
            check("recording an event", unsafe {
                record(ev, std::ptr::null_mut())
            })?;
            let mut log = self.log();
            log.records += 1;
            let n = log.records;
            log.recorded.insert(si.id, n);
        }
        for si in by_kind(FIFO_FIXED) {
            self.fifo_fixed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(si.id);
        }
        Ok(snap.pending)
    }
}
