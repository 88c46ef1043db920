//! A PTX interpreter: parses the PTX that NVRTC emits for Hira's test kernels and
//! runs a grid on the CPU, block by block, each thread until a barrier.
//!
//! It implements the instructions those kernels use (integer and floating-point
//! arithmetic, with the carry chains and directed roundings of libdevice, comparisons,
//! conversions, loads and stores in every state space, atomics, barriers, branches);
//! anything else is refused when the module loads, with the instruction named, so a
//! test fails with a reason instead of computing something else. Written for this
//! repository because the one PTX interpreter crate (`ptoxide` 0.1) does not parse
//! what NVRTC 12 emits (`shr`, `selp`, `atom`, module-scope variables with
//! initialisers) and has not been maintained since.
//! Warp-level instructions (`shfl`, `vote`) are not supported.
//!
//! A kernel may call the device functions its module defines (`.func` with a body,
//! before or after the kernel): libdevice's slow paths that nvcc does not inline
//! (`__internal_accurate_pow` of double `pow`, `__internal_trig_reduction_slowpathd`
//! of `sin` and `cos`) and `__noinline__` functions. Each call is replaced by the
//! function's body when the module loads ([`Inliner`]), so no call stack is needed;
//! recursion is refused. Otherwise the one function a kernel may call is `vprintf`,
//! the system call NVRTC makes of device-side `printf` (declared `.extern .func`,
//! called in a `{ ... }` block whose `.param` variables carry the format's and the
//! arguments' generic addresses): it formats with the C library's own `snprintf`, one
//! conversion at a time, into the context's [`PrintfFifo`], which the driver API
//! flushes ([`format_vprintf`]). A call of a function the module only declares, or
//! through a function pointer, is refused when the module loads, with the callee
//! named.
//!
//! Texture fetches (`tex.1d`, `.2d`, `.3d`) and surface loads and stores (`suld.b`,
//! `sust.b`) go to the objects the driver API made, through
//! [`DeviceMemory::texture`] and [`DeviceMemory::surface`] ([`tex`]).

pub mod tex;

use std::collections::{HashMap, HashSet};
use std::ffi::{CString, c_char, c_int, c_long, c_void};

/// Where a PTX operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtxError(pub String);

impl std::fmt::Display for PtxError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn err<T>(m: impl Into<String>) -> Result<T, PtxError> {
    Err(PtxError(m.into()))
}

/// A scalar type of an instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    U(u8),
    S(u8),
    B(u8),
    F32,
    F64,
    /// `.f16`: IEEE half precision, in the low 16 bits.
    F16,
    /// `.f16x2`: two halves in 32 bits (the low one first); only the arithmetic
    /// that `cuda_fp16.h` emits takes it.
    F16x2,
    Pred,
}

impl Ty {
    fn parse(s: &str) -> Option<Ty> {
        Some(match s {
            "u8" => Ty::U(8),
            "u16" => Ty::U(16),
            "u32" => Ty::U(32),
            "u64" => Ty::U(64),
            "s8" => Ty::S(8),
            "s16" => Ty::S(16),
            "s32" => Ty::S(32),
            "s64" => Ty::S(64),
            "b8" => Ty::B(8),
            "b16" => Ty::B(16),
            "b32" => Ty::B(32),
            "b64" => Ty::B(64),
            "f32" => Ty::F32,
            "f64" => Ty::F64,
            "f16" => Ty::F16,
            "f16x2" => Ty::F16x2,
            "pred" => Ty::Pred,
            _ => return None,
        })
    }

    /// Size in bytes.
    pub fn size(self) -> usize {
        match self {
            Ty::U(b) | Ty::S(b) | Ty::B(b) => usize::from(b / 8),
            Ty::F32 | Ty::F16x2 => 4,
            Ty::F64 => 8,
            Ty::F16 => 2,
            Ty::Pred => 1,
        }
    }

    fn bits(self) -> u32 {
        (self.size() * 8) as u32
    }

    fn signed(self) -> bool {
        matches!(self, Ty::S(_))
    }

    fn float(self) -> bool {
        matches!(self, Ty::F32 | Ty::F64 | Ty::F16)
    }
}

/// A state space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Space {
    Generic,
    Global,
    Shared,
    Local,
    Param,
    Const,
}

impl Space {
    fn parse(s: &str) -> Option<Space> {
        Some(match s {
            "global" => Space::Global,
            "shared" => Space::Shared,
            "local" => Space::Local,
            "param" => Space::Param,
            "const" => Space::Const,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Special {
    Tid(usize),
    Ntid(usize),
    Ctaid(usize),
    Nctaid(usize),
    LaneId,
    WarpSize,
    /// `%lanemask_eq`, `_le`, `_lt`, `_ge`, `_gt`: lanes relative to this one.
    LaneMask(std::cmp::Ordering, bool),
    /// `%clock` and `%clock64`: a counter that only goes up (nanoseconds here).
    Clock,
    /// `%globaltimer`: nanoseconds since the Unix epoch (`_lo`, `_hi`: its halves).
    GlobalTimer(Option<bool>),
}

#[derive(Clone, Debug, PartialEq)]
enum Operand {
    Reg(usize),
    Imm(u64),
    Special(Special),
    /// The address of a symbol (a parameter, a shared, local or module variable),
    /// plus an offset.
    Sym(usize, i64),
    /// `[reg + offset]`.
    RegAddr(usize, i64),
    /// `[%r+off]` with a register of 32 bits: the sum wraps at 2^32.
    RegAddr32(usize, i64),
    /// `[constant address]`.
    AbsAddr(u64),
    Vec(Vec<Operand>),
    Label(usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    /// Unordered variants (float): true if either is NaN.
    Equ,
    Neu,
    Ltu,
    Leu,
    Gtu,
    Geu,
    Num,
    Nan,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Mov,
    Ld(Space),
    St(Space),
    Cvta {
        to: bool,
        space: Space,
    },
    Cvt {
        dst: Ty,
        round_int: Option<Round>,
    },
    Add,
    Sub,
    MulLo,
    MulHi,
    MulWide,
    MadLo,
    MadHi,
    MadWide,
    Fma,
    Div,
    Rem,
    Min,
    Max,
    Neg,
    Abs,
    And,
    Or,
    Xor,
    Not,
    Shl,
    Shr,
    Setp(Cmp, Option<BoolOp>),
    Selp,
    Bra,
    Ret,
    Bar,
    Sqrt,
    Rsqrt,
    Rcp,
    Ex2,
    Lg2,
    Sin,
    Cos,
    AtomAdd(Space, bool),
    AtomExch(Space),
    AtomMin(Space),
    AtomMax(Space),
    AtomCas(Space),
    /// `atom`/`red` `.and`, `.or`, `.xor` (a `BoolOp`), fetching or not.
    AtomBits(Space, BoolOp, bool),
    /// `atom`/`red` `.inc` (true) or `.dec` (false), fetching or not.
    AtomWrap(Space, bool, bool),
    Popc,
    Clz,
    /// `add.cc`, `addc` (`cin`: adds the carry flag; `cout`: sets it).
    AddC {
        cin: bool,
        cout: bool,
    },
    /// `sub.cc`, `subc`: the carry flag is the borrow.
    SubC {
        cin: bool,
        cout: bool,
    },
    /// `mad.lo.cc`, `madc.hi`, ...: the low or high half of the product, plus the
    /// addend and the carry flag.
    MadC {
        hi: bool,
        cin: bool,
        cout: bool,
    },
    /// `copysign d, a, b`: `b` with the sign of `a`.
    CopySign,
    /// `brev`: the bits in reverse order.
    Brev,
    /// `bfind`: the position of the most significant non-sign bit (`true`: as a
    /// left shift amount, `.shiftamt`), or all ones.
    Bfind(bool),
    /// `bfe d, a, pos, len`: a bit field extracted (sign-extended for `.s`).
    Bfe,
    /// `bfi d, a, b, pos, len`: `a`'s low bits inserted into `b`.
    Bfi,
    /// `bmsk d, a, b`: `b` ones from bit `a` (`true`: `.clamp`, else `.wrap`).
    Bmsk(bool),
    /// What orders memory or waits (`membar`, `fence`, `nanosleep`): one thread runs
    /// at a time here, so every access is already ordered and seen.
    Nop,
    /// `trap`: the launch fails.
    Trap,
    /// An instruction of the warp's lanes together; see [`Collective`].
    Warp(Collective),
    /// `bar.red.OP d, barrier, {!}c`: a barrier that also reduces each thread's
    /// predicate over the block (`__syncthreads_and`, `_or`, `_count`).
    BarRed(BarRed),
    // `call vprintf`: operands are the format's and the arguments' call parameters,
    // then the return value's if the call has one (`true`).
    Call(bool),
    /// `tex.GEOM.v4.DTYPE.CTYPE d, [t, c]` of `dims` dimensions (`ints`: integer
    /// coordinates; `layered`: `c` starts with the layer); operands `[d, t, c]`.
    Tex {
        dims: usize,
        ints: bool,
        layered: bool,
    },
    /// `suld.b.GEOM.VEC.BTYPE.CLAMP d, [s, c]`; operands `[d, s, c]`.
    Suld {
        dims: usize,
        clamp: tex::Clamp,
    },
    /// `sust.b.GEOM.VEC.BTYPE.CLAMP [s, c], a`; operands `[a, s, c]`.
    Sust {
        dims: usize,
        clamp: tex::Clamp,
    },
}

/// The warp-wide instructions. A lane that reaches one waits until every lane it
/// names (its member mask, less the lanes that exited) has reached one too; then
/// each gets its result (see `resolve_warps`). The operands are laid out as
/// `[d, a, ..., membermask]` (see `parse_inst`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Collective {
    /// `shfl.sync.MODE.b32 d|p, a, b, c, membermask`.
    Shfl(ShflMode),
    /// `vote.sync.MODE d, {!}a, membermask` (`true`: the predicate is negated).
    Vote(VoteMode, bool),
    /// `match.any.sync.bN d, a, membermask`.
    MatchAny,
    /// `match.all.sync.bN d|p, a, membermask`.
    MatchAll,
    /// `activemask.b32 d`: the lanes that reached this instruction together.
    ActiveMask,
    /// `bar.warp.sync membermask` (`__syncwarp`).
    Sync,
    /// `redux.sync.OP d, a, membermask`: `a` reduced over the lanes.
    Redux(ReduxOp),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReduxOp {
    Add,
    Min,
    Max,
    And,
    Or,
    Xor,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BarRed {
    /// `.and.pred`; `true`: the predicate is negated.
    And(bool),
    Or(bool),
    /// `.popc.u32`.
    Popc(bool),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ShflMode {
    Up,
    Down,
    Bfly,
    Idx,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum VoteMode {
    All,
    Any,
    Uni,
    Ballot,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Round {
    Nearest,
    Zero,
    Down,
    Up,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BoolOp {
    And,
    Or,
    Xor,
}

#[derive(Clone, Debug)]
struct Inst {
    guard: Option<(usize, bool)>,
    op: Op,
    ty: Ty,
    /// Second type (`cvt` source, `cvta` pointer size ignored).
    ty2: Ty,
    vec: usize,
    /// `.sat`: the result clamped (floats to [0, 1], integers to their range).
    sat: bool,
    /// The rounding of a floating-point result (`.rn`, `.rz`, `.rm`, `.rp`).
    round: Round,
    ops: Vec<Operand>,
    text: String,
}

/// A symbol of a function or module: where its address comes from.
#[derive(Clone, Debug)]
enum Symbol {
    /// Offset in the kernel's parameter buffer.
    Param(usize),
    /// Offset in the block's shared memory.
    Shared(usize),
    /// Offset in the thread's local memory.
    Local(usize),
    /// A module variable: index into `Module::globals`.
    Global(usize),
    /// Offset in the thread's call parameters (the `.param` variables of a call
    /// sequence), addressed in the parameter space from [`CALL_PARAM_BASE`].
    CallParam(usize),
}

/// A parameter of an entry point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Param {
    pub offset: usize,
    pub size: usize,
}

/// An entry point.
#[derive(Debug)]
pub struct Kernel {
    pub name: String,
    pub params: Vec<Param>,
    regs: usize,
    shared_size: usize,
    local_size: usize,
    /// Bytes of call parameters per thread.
    call_size: usize,
    symbols: Vec<Symbol>,
    code: Vec<Inst>,
}

impl Kernel {
    /// Bytes of parameters.
    pub fn param_bytes(&self) -> usize {
        self.params.last().map_or(0, |p| p.offset + p.size)
    }

    /// Bytes of static shared memory per block.
    pub fn shared_size(&self) -> usize {
        self.shared_size
    }

    /// Registers per thread.
    pub fn registers(&self) -> usize {
        self.regs
    }

    /// Whether the kernel calls `vprintf` (device-side `printf`).
    pub fn uses_printf(&self) -> bool {
        self.code.iter().any(|i| matches!(i.op, Op::Call(_)))
    }
}

/// A module-scope variable (`.global` or `.const`), with its initial bytes.
#[derive(Debug, Clone)]
pub struct GlobalVar {
    pub name: String,
    pub size: usize,
    pub init: Vec<u8>,
}

/// A loaded module.
#[derive(Debug)]
pub struct Module {
    pub kernels: Vec<Kernel>,
    pub globals: Vec<GlobalVar>,
}

/// The memory a kernel reads and writes in the global and constant spaces.
pub trait DeviceMemory {
    /// Reads `out.len()` bytes at `addr`; `false` if they are not all allocated.
    fn read(&self, addr: u64, out: &mut [u8]) -> bool;
    /// Writes `data` at `addr`; `false` if the bytes are not all allocated.
    fn write(&mut self, addr: u64, data: &[u8]) -> bool;
    /// The texture object `handle` names, if it is one.
    fn texture(&self, _handle: u64) -> Option<tex::Texture> {
        None
    }
    /// The surface object `handle` names, if it is one.
    fn surface(&self, _handle: u64) -> Option<tex::Surface> {
        None
    }
}

/// Generic addresses of the shared and local windows (global addresses are below).
const SHARED_BASE: u64 = 0xFE00_0000_0000_0000;
const LOCAL_BASE: u64 = 0xFF00_0000_0000_0000;
const WINDOW: u64 = 1 << 40;
/// Where a thread's call parameters start in the parameter space, above any kernel's
/// parameters (at most 32 KiB).
const CALL_PARAM_BASE: u64 = 1 << 32;
/// The one function kernels may call that their module does not define.
const VPRINTF: &str = "vprintf";

// ---------------------------------------------------------------------------------
// Parsing

/// Removes comments.
fn strip_comments(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let b = src.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && i + 1 < b.len() && b[i + 1] == b'/' {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && i + 1 < b.len() && b[i + 1] == b'*' {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                i += 1;
            }
            i += 2;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// Splits at `sep` outside brackets and braces.
fn split_top(s: &str, sep: char) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '[' | '{' | '(' => depth += 1,
            ']' | '}' | ')' => depth -= 1,
            _ => {}
        }
        if c == sep && depth == 0 {
            out.push(cur.trim().to_string());
            cur.clear();
        } else {
            cur.push(c);
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

fn parse_int(s: &str) -> Option<i128> {
    let s = s.trim();
    let (neg, s) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s),
    };
    let s = s.trim_end_matches('U');
    let v = if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        i128::from_str_radix(h, 16).ok()?
    } else if s.len() > 1 && s.starts_with('0') && s.bytes().all(|c| c.is_ascii_digit()) {
        i128::from_str_radix(&s[1..], 8).ok()?
    } else {
        s.parse::<i128>().ok()?
    };
    Some(if neg { -v } else { v })
}

/// An immediate: integer, `0fXXXXXXXX` (f32 bits), `0dXXXXXXXXXXXXXXXX` (f64 bits)
/// or a decimal float, as the bits an operand of type `ty` holds.
fn parse_imm(s: &str, ty: Ty) -> Option<u64> {
    let t = s.trim();
    if let Some(h) = t.strip_prefix("0f").or_else(|| t.strip_prefix("0F")) {
        let bits = u32::from_str_radix(h, 16).ok()?;
        return Some(match ty {
            Ty::F64 => f64::from(f32::from_bits(bits)).to_bits(),
            _ => u64::from(bits),
        });
    }
    if let Some(h) = t.strip_prefix("0d").or_else(|| t.strip_prefix("0D")) {
        let bits = u64::from_str_radix(h, 16).ok()?;
        return Some(match ty {
            Ty::F32 => u64::from((f64::from_bits(bits) as f32).to_bits()),
            _ => bits,
        });
    }
    if let Some(v) = parse_int(t) {
        return Some(match ty {
            Ty::F32 => u64::from((v as f32).to_bits()),
            Ty::F64 => (v as f64).to_bits(),
            Ty::F16 => fput(v as f64, ty),
            _ => v as u64,
        });
    }
    if t.contains('.') || t.contains('e') {
        let f: f64 = t.parse().ok()?;
        return Some(match ty {
            Ty::F32 => u64::from((f as f32).to_bits()),
            Ty::F16 => fput(f, ty),
            _ => f.to_bits(),
        });
    }
    None
}

/// A module-scope shared variable: every kernel of the module gets its own copy
/// after its own shared memory; `extern` ones (`dynamic`) start the dynamic area.
struct SharedDecl {
    name: String,
    align: usize,
    size: usize,
    dynamic: bool,
}

struct FuncBuilder<'m> {
    regs: HashMap<String, usize>,
    nregs: usize,
    /// Registers of 32 bits or fewer: an address in one wraps at 2^32, as on a GPU.
    narrow: HashSet<usize>,
    syms: HashMap<String, usize>,
    symbols: Vec<Symbol>,
    labels: HashMap<String, usize>,
    shared: usize,
    local: usize,
    /// Bytes of call parameters so far.
    call: usize,
    /// Call parameters by name: offset and size. The call sequences of a function
    /// declare the same names (`param0`, `retval0`) in scopes of their own; each
    /// sequence stores, calls and loads in turn, so they share one area per name.
    /// Those of an inlined function have names of their own ([`Inliner`]): its body
    /// may load its parameters, which are its caller's, after calls of its own.
    call_params: HashMap<String, (usize, usize)>,
    /// The functions the module declares or defines before this one.
    funcs: &'m HashSet<String>,
}

impl FuncBuilder<'_> {
    fn reg(&self, name: &str) -> Result<usize, PtxError> {
        self.regs
            .get(name)
            .copied()
            .ok_or_else(|| PtxError(format!("undeclared register {name}")))
    }

    fn declare_regs(&mut self, ty: &str, spec: &str) -> Result<(), PtxError> {
        let first = self.nregs;
        // `%r<6>` declares %r0..%r5; `%f1, %f2` declares each.
        for name in spec.split(',').map(str::trim) {
            if let Some((base, n)) = name.split_once('<') {
                let n: usize = n
                    .trim_end_matches('>')
                    .parse()
                    .map_err(|_| PtxError(format!("bad register range {name}")))?;
                for i in 0..n {
                    self.regs.insert(format!("{base}{i}"), self.nregs);
                    self.nregs += 1;
                }
            } else if !name.is_empty() {
                self.regs.insert(name.to_string(), self.nregs);
                self.nregs += 1;
            }
        }
        if !ty.ends_with("64") {
            self.narrow.extend(first..self.nregs);
        }
        Ok(())
    }

    fn symbol(&mut self, name: &str, s: Symbol) {
        self.syms.insert(name.to_string(), self.symbols.len());
        self.symbols.push(s);
    }

    /// A `.param` variable of a call sequence (`.param .b64 param0`). A name declared
    /// again keeps its area if that is large enough, else gets a larger one.
    fn declare_call_param(&mut self, decl: &str) -> Result<(), PtxError> {
        let (align, size, name, init) = parse_var(decl)?;
        if init.is_some() {
            return err("call parameters cannot be initialised");
        }
        if self
            .call_params
            .get(&name)
            .is_some_and(|&(_, had)| had >= size)
        {
            return Ok(());
        }
        self.call = align_up(self.call, align);
        self.call_params.insert(name.clone(), (self.call, size));
        self.symbol(&name, Symbol::CallParam(self.call));
        self.call += size;
        Ok(())
    }

    /// The size of call parameter `name`, if it is one.
    fn call_param_size(&self, name: &str) -> Option<usize> {
        self.call_params.get(name).map(|&(_, size)| size)
    }
}

/// The name a `.func` declaration or definition gives its function: `.extern .func
/// (.param .b32 func_retval0) vprintf (...)` names `vprintf`.
fn func_name(head: &str) -> Option<String> {
    let mut rest = head.split(".func").nth(1)?.trim_start();
    if rest.starts_with('(') {
        let close = rest.find(')')?;
        rest = rest[close + 1..].trim_start();
    }
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$' || c == '.'))
        .unwrap_or(rest.len());
    (end > 0).then(|| rest[..end].to_string())
}

fn align_up(v: usize, a: usize) -> usize {
    v.div_ceil(a.max(1)) * a.max(1)
}

/// `.align 4 .b8 name[1024]` or `.f32 name` or `.u32 name[4] = {..}`: alignment, size,
/// name, initialiser text.
fn parse_var(words: &str) -> Result<(usize, usize, String, Option<String>), PtxError> {
    let (decl, init) = match words.split_once('=') {
        Some((d, i)) => (d.trim(), Some(i.trim().to_string())),
        None => (words.trim(), None),
    };
    let mut align = 0;
    let mut ty = None;
    let mut name = None;
    let mut toks = decl.split_whitespace();
    while let Some(t) = toks.next() {
        if t == ".align" {
            align = toks
                .next()
                .and_then(|a| a.parse().ok())
                .ok_or_else(|| PtxError(format!("bad alignment in {words}")))?;
        } else if let Some(tt) = t.strip_prefix('.') {
            if let Some(parsed) = Ty::parse(tt) {
                ty = Some(parsed);
            }
        } else {
            name = Some(t.to_string());
        }
    }
    let ty = ty.ok_or_else(|| PtxError(format!("no type in {words}")))?;
    let name = name.ok_or_else(|| PtxError(format!("no name in {words}")))?;
    let (name, count) = match name.split_once('[') {
        Some((n, c)) => {
            let c = c.trim_end_matches(']');
            let count = if c.is_empty() {
                // Size from the initialiser.
                init.as_deref()
                    .map_or(0, |i| split_top(i.trim_matches(['{', '}']), ',').len())
            } else {
                c.parse::<usize>()
                    .map_err(|_| PtxError(format!("bad array size in {words}")))?
            };
            (n.to_string(), count)
        }
        None => (name, 1),
    };
    let align = if align == 0 { ty.size() } else { align };
    Ok((
        align,
        ty.size() * count,
        name,
        init.map(|i| format!("{}:{i}", ty_name(ty))),
    ))
}

fn ty_name(t: Ty) -> String {
    match t {
        Ty::U(b) => format!("u{b}"),
        Ty::S(b) => format!("s{b}"),
        Ty::B(b) => format!("b{b}"),
        Ty::F32 => "f32".into(),
        Ty::F64 => "f64".into(),
        Ty::F16 => "f16".into(),
        Ty::F16x2 => "f16x2".into(),
        Ty::Pred => "pred".into(),
    }
}

/// The bytes of an initialiser `TYPE:{v, v, ...}` or `TYPE:v`.
fn init_bytes(init: &str, size: usize) -> Result<Vec<u8>, PtxError> {
    let (ty, vals) = init.split_once(':').unwrap_or(("b8", init));
    let ty = Ty::parse(ty).unwrap_or(Ty::B(8));
    let mut out = Vec::with_capacity(size);
    for v in split_top(
        vals.trim().trim_start_matches('{').trim_end_matches('}'),
        ',',
    ) {
        let bits = parse_imm(&v, ty)
            .ok_or_else(|| PtxError(format!("initialiser value {v:?} is not supported")))?;
        out.extend_from_slice(&bits.to_le_bytes()[..ty.size()]);
    }
    out.resize(size, 0);
    Ok(out)
}

/// A top-level item of a module.
enum Item<'t> {
    /// A function (`.entry`, `.func`) or a `.section`, with its body.
    Block { head: String, body: &'t str },
    /// A statement without its ';': a variable (with its initialiser) or a directive.
    Stmt(String),
}

/// Splits a module's text, comments removed, into its top-level items.
fn top_level(text: &str) -> Result<Vec<Item<'_>>, PtxError> {
    let mut items = Vec::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            return Ok(items);
        }
        // These directives end with their line, not with a ';'.
        if [".version", ".target", ".address_size", ".file"]
            .iter()
            .any(|d| rest.starts_with(d))
        {
            rest = rest.split_once('\n').map_or("", |(_, r)| r);
            continue;
        }
        // Top-level statements end with ';' or are function definitions with a body.
        let semi = rest.find(';');
        let brace = rest.find('{');
        let is_func = match (semi, brace) {
            (Some(s), Some(b)) => {
                b < s
                    || rest[..s].contains(".entry")
                    || rest[..s].contains(".func") && rest[s..].trim_start().starts_with('{')
            }
            (None, Some(_)) => true,
            _ => false,
        };
        let head_end = if is_func {
            brace.unwrap()
        } else {
            semi.ok_or_else(|| PtxError("statement without ';'".into()))?
        };
        let head = rest[..head_end].trim().to_string();
        if !is_func {
            items.push(Item::Stmt(head));
            rest = &rest[head_end + 1..];
            continue;
        }
        // Find the matching closing brace.
        let bytes = rest.as_bytes();
        let mut depth = 0;
        let mut end = None;
        for (i, &c) in bytes.iter().enumerate().skip(head_end) {
            if c == b'{' {
                depth += 1;
            } else if c == b'}' {
                depth -= 1;
                if depth == 0 {
                    end = Some(i);
                    break;
                }
            }
        }
        let end = end.ok_or_else(|| PtxError("unbalanced braces".into()))?;
        // A `= { ... }` initialiser of a variable is not a function.
        if head.ends_with('=') {
            let stmt_end = rest[end..].find(';').map_or(end + 1, |i| end + i + 1);
            items.push(Item::Stmt(rest[..stmt_end - 1].to_string()));
            rest = &rest[stmt_end..];
            continue;
        }
        items.push(Item::Block {
            head,
            body: &rest[head_end + 1..end],
        });
        rest = &rest[end + 1..];
    }
}

impl Module {
    /// Parses PTX text.
    pub fn parse(src: &str) -> Result<Module, PtxError> {
        let text = strip_comments(src);
        let items = top_level(&text)?;
        let mut module = Module {
            kernels: Vec::new(),
            globals: Vec::new(),
        };
        // The device functions the module defines, by name, for the kernels that call
        // them: a definition may come after its callers.
        let mut defs: HashMap<String, FuncDef<'_>> = HashMap::new();
        for item in &items {
            if let Item::Block { head, body } = item
                && head.contains(".func")
                && !head.contains(".entry")
                && let Some(name) = func_name(head)
            {
                defs.insert(name, FuncDef { head, body });
            }
        }
        let mut global_syms: HashMap<String, usize> = HashMap::new();
        let mut shared: Vec<SharedDecl> = Vec::new();
        let mut funcs: HashSet<String> = HashSet::new();
        for item in &items {
            match item {
                Item::Block { head, body } => {
                    if head.contains(".entry") {
                        let k = parse_kernel(head, body, &global_syms, &shared, &funcs, &defs)?;
                        module.kernels.push(k);
                    } else if head.contains(".func") {
                        // Device functions run where they are called: each call is
                        // replaced by the function's body when the kernel is parsed.
                        funcs.extend(func_name(head));
                    } else if head.trim_start().starts_with(".section") {
                        // Debug information (`nvcc -G`): nothing to run.
                    } else {
                        return err(format!("unexpected block after {head:?}"));
                    }
                }
                Item::Stmt(head) => {
                    let words: Vec<&str> = head.split_whitespace().collect();
                    match words.first().copied() {
                        Some(".version" | ".target" | ".address_size" | ".file" | ".pragma") => {}
                        // Before variables: a prototype's parameters may say `.global`.
                        Some(_) if head.contains(".func") || head.contains(".entry") => {
                            // A declaration (prototype) only: `.extern .func vprintf`, or
                            // a function defined further on.
                            funcs.extend(func_name(head));
                        }
                        Some(_)
                            if head.contains(".global")
                                || head.contains(".const")
                                || head.contains(".shared") =>
                        {
                            module.global_var(head, &mut global_syms, &mut shared)?;
                        }
                        _ => return err(format!("unsupported PTX directive: {head}")),
                    }
                }
            }
        }
        Ok(module)
    }

    fn global_var(
        &mut self,
        stmt: &str,
        syms: &mut HashMap<String, usize>,
        shared: &mut Vec<SharedDecl>,
    ) -> Result<(), PtxError> {
        if stmt.contains(".shared") {
            let dynamic = stmt.contains(".extern");
            let cleaned = stmt
                .replace(".visible", "")
                .replace(".extern", "")
                .replace(".weak", "")
                .replace(".shared", "");
            let (align, size, name, init) = parse_var(&cleaned)?;
            if init.is_some() {
                return err("shared variables cannot be initialised");
            }
            shared.push(SharedDecl {
                name,
                align,
                size,
                dynamic,
            });
            return Ok(());
        }
        let cleaned: String = stmt
            .replace(".visible", "")
            .replace(".extern", "")
            .replace(".weak", "")
            .replace(".global", "")
            .replace(".const", "");
        let (_, size, name, init) = parse_var(&cleaned)?;
        let init = match init {
            Some(i) => init_bytes(&i, size)?,
            None => vec![0; size],
        };
        syms.insert(name.clone(), self.globals.len());
        self.globals.push(GlobalVar { name, size, init });
        Ok(())
    }
}

/// A function body's statements without their ';', in order: labels (`name:`),
/// scope braces and the rest. A scope's `{` stands first on its line (no
/// instruction starts with one) and its `}` last, after a `;` or alone; other braces
/// are vector operands. Inline assembly opens and closes scopes within a line
/// (`{ .reg .b64 %tmp; cvt.u64.u32 %tmp, %r1; ... }`).
fn statements(body: &str) -> Vec<String> {
    let mut marked = String::with_capacity(body.len() + 64);
    for line in body.lines() {
        let mut rest = line.trim();
        while let Some(r) = rest.strip_prefix('{') {
            marked.push_str(";{;");
            rest = r.trim_start();
        }
        let mut closes = 0;
        while let Some(r) = rest.strip_suffix('}') {
            let r = r.trim_end();
            if !(r.is_empty() || r.ends_with(';') || r.ends_with('}')) {
                break;
            }
            closes += 1;
            rest = r;
        }
        marked.push_str(rest);
        for _ in 0..closes {
            marked.push_str(";};");
        }
        marked.push('\n');
    }
    let mut stmts = Vec::new();
    for piece in marked.split(';') {
        let mut s = piece.trim().to_string();
        // Labels `name:` may precede a statement.
        while let Some(colon) = s.find(':') {
            let label = s[..colon].trim();
            if label.is_empty()
                || label.contains(char::is_whitespace)
                || label.starts_with('@')
                || label.contains('[')
            {
                break;
            }
            stmts.push(format!("{label}:"));
            s = s[colon + 1..].trim().to_string();
        }
        if !s.is_empty() {
            stmts.push(s);
        }
    }
    stmts
}

/// Whether statement `s` is a declaration `directive` (`.reg`, `.local`, ...).
fn is_decl(s: &str, directive: &str) -> bool {
    s.split_whitespace().next() == Some(directive)
}

/// The registers a `.reg` statement declares: each name, with the count of a range
/// (`%r<6>` declares `%r0` to `%r5`).
fn reg_names(s: &str) -> Vec<(String, Option<usize>)> {
    let words: Vec<&str> = s.split_whitespace().collect();
    let first = words
        .iter()
        .rposition(|w| w.starts_with('.'))
        .map_or(words.len(), |i| i + 1);
    let spec = words[first..].join(" ");
    spec.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| match n.split_once('<') {
            Some((base, count)) => (base.to_string(), count.trim_end_matches('>').parse().ok()),
            None => (n.to_string(), None),
        })
        .collect()
}

/// `name` with `tag` in front: `%r5` becomes `%TAG~r5`, `param0` `TAG~param0`. The
/// names PTX writes have no `~`, so tagged names differ from all of them, and from
/// each other where the tags differ (a register range's names keep their numbers at
/// the end).
fn tagged(name: &str, tag: &str) -> String {
    match name.strip_prefix('%') {
        Some(r) => format!("%{tag}~{r}"),
        None => format!("{tag}~{name}"),
    }
}

/// New names for names a function or scope declares.
#[derive(Default)]
struct Names {
    exact: HashMap<String, String>,
    /// Register ranges: base, count, new base.
    ranges: HashMap<String, (usize, String)>,
}

impl Names {
    fn add(&mut self, name: &str, count: Option<usize>, new: String) {
        if let Some(n) = count {
            self.ranges.insert(name.to_string(), (n, new.clone()));
        }
        self.exact.insert(name.to_string(), new);
    }

    fn get(&self, tok: &str) -> Option<String> {
        if let Some(n) = self.exact.get(tok) {
            return Some(n.clone());
        }
        let base = tok.trim_end_matches(|c: char| c.is_ascii_digit());
        let digits = &tok[base.len()..];
        let (count, new) = self.ranges.get(base)?;
        let i: usize = digits.parse().ok()?;
        (i < *count).then(|| format!("{new}{digits}"))
    }
}

/// Rewrites the names in statement `s` that `f` maps (registers, labels, variables);
/// modifiers (`.f32`, the `x` of `%tid.x`), numbers and quoted text stay as they are.
fn map_tokens(s: &str, mut f: impl FnMut(&str) -> Option<String>) -> String {
    let ident = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'$' | b'%' | b'~');
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(s.len() + 32);
    let mut quoted = false;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'"' {
            quoted = !quoted;
        }
        if quoted || !ident(c) {
            out.push(c);
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && ident(b[i]) {
            i += 1;
        }
        let tok = &s[start..i];
        let modifier = start > 0 && b[start - 1] == b'.';
        match (!modifier && !c.is_ascii_digit()).then(|| f(tok)).flatten() {
            Some(n) => out.extend_from_slice(n.as_bytes()),
            None => out.extend_from_slice(tok.as_bytes()),
        }
    }
    String::from_utf8(out).expect("whole names replaced")
}

/// Gives each register a scope declares (`{ .reg .b32 %temp; ... }`) a name of its
/// own, so that it does not stand for the register of the same name outside: the
/// inline assembly of libdevice declares `%r0` to `%r3` in scopes of a function that
/// has `%r<38>` and uses them across those scopes. Scope braces are dropped. The
/// call parameters a scope declares keep their names (see [`FuncBuilder`]).
fn resolve_scopes(stmts: Vec<String>) -> Vec<String> {
    let mut scopes: Vec<Names> = Vec::new();
    let mut n = 0;
    let mut out = Vec::with_capacity(stmts.len());
    for s in stmts {
        match s.as_str() {
            "{" => {
                scopes.push(Names::default());
                continue;
            }
            "}" => {
                scopes.pop();
                continue;
            }
            _ => {}
        }
        if let Some(top) = scopes.last_mut()
            && is_decl(&s, ".reg")
        {
            n += 1;
            for (name, count) in reg_names(&s) {
                // Always a `%` name, which operands take for a register: inline
                // assembly names its scope's registers as it likes (`t`, `low`).
                let new = tagged(
                    &format!("%{}", name.trim_start_matches('%')),
                    &format!("~{n}"),
                );
                top.add(&name, count, new);
            }
        }
        if scopes.is_empty() {
            out.push(s);
        } else {
            out.push(map_tokens(&s, |t| {
                scopes.iter().rev().find_map(|scope| scope.get(t))
            }));
        }
    }
    out
}

/// The parts of a call's operands: return parameters (if any), callee, arguments (if
/// any), and what follows (an indirect call's prototype).
fn call_parts(operands: &str) -> (Vec<String>, String, Option<Vec<String>>, usize) {
    let list = |p: &str| -> Vec<String> {
        split_top(p.trim().trim_start_matches('(').trim_end_matches(')'), ',')
    };
    let parts = split_top(operands, ',');
    let (rets, rest) = match parts.split_first() {
        Some((r, rest)) if r.starts_with('(') => (list(r), rest),
        _ => (Vec::new(), &parts[..]),
    };
    let callee = rest.first().cloned().unwrap_or_default();
    let (args, more) = match rest.get(1) {
        Some(a) if a.starts_with('(') => (Some(list(a)), rest.len() - 2),
        _ => (None, rest.len().saturating_sub(1)),
    };
    (rets, callee, args, more)
}

/// A `.func` the module defines: its header and body.
struct FuncDef<'t> {
    head: &'t str,
    body: &'t str,
}

/// A formal parameter of a function: name, alignment, size.
struct Formal {
    name: String,
    align: usize,
    size: usize,
}

impl FuncDef<'_> {
    /// Return and other parameters: `.func (.param .b64 func_retval0) f(.param .b64
    /// f_param_0, ...)`.
    fn formals(&self, name: &str) -> Result<(Vec<Formal>, Vec<Formal>), PtxError> {
        let mut rest = self.head.split(".func").nth(1).unwrap_or("").trim_start();
        let mut lists = Vec::new();
        for part in 0..2 {
            if part == 1 {
                // The name, between the two lists.
                rest = rest.trim_start();
                rest = &rest[rest.find(name).map_or(0, |i| i + name.len())..];
                rest = rest.trim_start();
            }
            if !rest.starts_with('(') {
                lists.push(Vec::new());
                continue;
            }
            let close = rest
                .find(')')
                .ok_or_else(|| PtxError(format!("unbalanced parameter list of `{name}`")))?;
            let mut formals = Vec::new();
            for p in split_top(&rest[1..close], ',') {
                if !p.starts_with(".param") {
                    return err(format!(
                        "`{name}` takes parameters other than `.param` ({p}), which the \
                         CPU test executor does not support"
                    ));
                }
                let (align, size, name, _) = parse_var(&p.replacen(".param", "", 1))?;
                formals.push(Formal { name, align, size });
            }
            lists.push(formals);
            rest = &rest[close + 1..];
        }
        let params = lists.pop().unwrap_or_default();
        let rets = lists.pop().unwrap_or_default();
        Ok((rets, params))
    }
}

/// How deep calls may nest.
const CALL_DEPTH: usize = 32;

/// Replaces each call of a function the module defines by the function's body, so a
/// kernel runs without a call stack. In each copy, the body's formal parameters
/// become the call's parameters (which the caller's call sequence declares, stores
/// and loads), `ret` a branch to the copy's end, and its labels names of the copy's
/// own. Its registers, local memory and call parameters get names of the function's
/// own (`%F~r1`), shared by all its copies: without recursion, which is refused, no
/// two copies of a function run at once.
struct Inliner<'d, 't> {
    defs: &'d HashMap<String, FuncDef<'t>>,
    /// Copies so far.
    copies: usize,
    /// The functions whose declarations the kernel has already.
    declared: HashSet<String>,
}

impl Inliner<'_, '_> {
    /// `stmts` into `out`, each call of a module function replaced by its body;
    /// `stack` holds the functions being inlined, callers first.
    fn expand(
        &mut self,
        stmts: Vec<String>,
        stack: &mut Vec<String>,
        out: &mut Vec<String>,
    ) -> Result<(), PtxError> {
        for s in stmts {
            let one_line = s.split_whitespace().collect::<Vec<_>>().join(" ");
            let (guard, inst) = match one_line.strip_prefix('@') {
                Some(r) => match r.split_once(' ') {
                    Some((g, i)) => (Some(g.to_string()), i),
                    None => (None, one_line.as_str()),
                },
                None => (None, one_line.as_str()),
            };
            let (opcode, operands) = inst.split_once(' ').unwrap_or((inst, ""));
            if opcode == "call" || opcode.starts_with("call.") {
                let (rets, callee, args, more) = call_parts(operands);
                if more == 0 && self.defs.contains_key(&callee) {
                    let args = args.unwrap_or_default();
                    self.inline(&callee, guard.as_deref(), &rets, &args, stack, out)
                        .map_err(|e| PtxError(format!("{one_line}: {}", e.0)))?;
                    continue;
                }
            }
            out.push(s);
        }
        Ok(())
    }

    fn inline(
        &mut self,
        name: &str,
        guard: Option<&str>,
        rets: &[String],
        args: &[String],
        stack: &mut Vec<String>,
        out: &mut Vec<String>,
    ) -> Result<(), PtxError> {
        if stack.iter().any(|f| f == name) {
            return err(format!(
                "recursion is not supported: `{name}` calls itself ({} -> {name})",
                stack.join(" -> ")
            ));
        }
        if stack.len() >= CALL_DEPTH {
            return err(format!(
                "calls nest deeper than {CALL_DEPTH} functions (`{}`)",
                stack.join(" -> ")
            ));
        }
        let def = &self.defs[name];
        let (ret_formals, formals) = def.formals(name)?;
        if formals.len() != args.len() || rets.len() > ret_formals.len() {
            return err(format!(
                "`{name}` takes {} parameters and returns {} values; the call passes {} \
                 and takes {}",
                formals.len(),
                ret_formals.len(),
                args.len(),
                rets.len()
            ));
        }
        let body = resolve_scopes(statements(def.body));
        let copy = format!("{name}~{}", self.copies);
        self.copies += 1;
        let end = format!("{copy}~~end");
        let mut names = Names::default();
        for s in &body {
            if is_decl(s, ".reg") {
                for (reg, count) in reg_names(s) {
                    names.add(&reg, count, tagged(&reg, name));
                }
            } else if [".local", ".shared", ".param"]
                .iter()
                .any(|d| is_decl(s, d))
            {
                let decl = s.split_once(char::is_whitespace).map_or("", |(_, r)| r);
                let (_, _, var, _) = parse_var(decl)?;
                names.add(&var, None, tagged(&var, name));
            } else if let Some(label) = s.strip_suffix(':') {
                names.add(label, None, tagged(label, &copy));
            }
        }
        let mut copied = Vec::with_capacity(body.len() + 4);
        if let Some(g) = guard {
            let skip = match g.strip_prefix('!') {
                Some(p) => format!("@{p}"),
                None => format!("@!{g}"),
            };
            copied.push(format!("{skip} bra.uni {end}"));
        }
        for (formal, arg) in formals.iter().zip(args) {
            names.add(&formal.name, None, arg.clone());
        }
        // A return value the call does not take goes to a parameter of its own.
        for (i, formal) in ret_formals.iter().enumerate() {
            let to = match rets.get(i) {
                Some(r) => r.clone(),
                None => {
                    let t = tagged(&formal.name, name);
                    copied.push(format!(
                        ".param .align {} .b8 {t}[{}]",
                        formal.align, formal.size
                    ));
                    t
                }
            };
            names.add(&formal.name, None, to);
        }
        let first = self.declared.insert(name.to_string());
        for s in &body {
            if !first && [".reg", ".local", ".shared"].iter().any(|d| is_decl(s, d)) {
                continue;
            }
            let s = map_tokens(s, |t| names.get(t));
            copied.push(ret_to_branch(&s, &end).unwrap_or(s));
        }
        copied.push(format!("{end}:"));
        stack.push(name.to_string());
        let done = self.expand(copied, stack, out);
        stack.pop();
        done
    }
}

/// `ret` (`ret.uni`, guarded or not) as a branch to `end`.
fn ret_to_branch(s: &str, end: &str) -> Option<String> {
    let (guard, inst) = match s.strip_prefix('@') {
        Some(r) => {
            let (g, i) = r.split_once(char::is_whitespace)?;
            (format!("@{g} "), i.trim())
        }
        None => (String::new(), s),
    };
    let opcode = inst.split_whitespace().next()?;
    (opcode == "ret" || opcode.starts_with("ret.")).then(|| format!("{guard}bra.uni {end}"))
}

fn parse_kernel(
    head: &str,
    body: &str,
    globals: &HashMap<String, usize>,
    module_shared: &[SharedDecl],
    funcs: &HashSet<String>,
    defs: &HashMap<String, FuncDef<'_>>,
) -> Result<Kernel, PtxError> {
    let after = head
        .split(".entry")
        .nth(1)
        .ok_or_else(|| PtxError("no .entry".into()))?
        .trim();
    let (name, params_text) = match after.find('(') {
        Some(i) => {
            let close = after.rfind(')').unwrap_or(after.len());
            (after[..i].trim().to_string(), &after[i + 1..close])
        }
        None => (
            after.split_whitespace().next().unwrap_or("").to_string(),
            "",
        ),
    };
    let mut f = FuncBuilder {
        regs: HashMap::new(),
        nregs: 0,
        narrow: HashSet::new(),
        syms: HashMap::new(),
        symbols: Vec::new(),
        labels: HashMap::new(),
        shared: 0,
        local: 0,
        call: 0,
        call_params: HashMap::new(),
        funcs,
    };
    for (g, &i) in globals {
        f.symbol(g, Symbol::Global(i));
    }
    let mut params = Vec::new();
    let mut offset = 0;
    for p in split_top(params_text, ',') {
        let p = p
            .replace(".param", "")
            .replace(".ptr", "")
            .replace(".global", "");
        let (align, size, pname, _) = parse_var(&p)?;
        offset = align_up(offset, align);
        f.symbol(&pname, Symbol::Param(offset));
        params.push(Param { offset, size });
        offset += size;
    }
    // Statements, each call of one of the module's functions replaced by its body.
    let mut stmts = Vec::new();
    let mut inliner = Inliner {
        defs,
        copies: 0,
        declared: HashSet::new(),
    };
    inliner.expand(
        resolve_scopes(statements(body)),
        &mut Vec::new(),
        &mut stmts,
    )?;
    // Declarations first, then labels, then instructions.
    let mut insts_text = Vec::new();
    for s in stmts {
        if let Some(l) = s.strip_suffix(':') {
            f.labels.insert(l.to_string(), insts_text.len());
            continue;
        }
        let first = s.split_whitespace().next().unwrap_or("");
        match first {
            ".reg" => {
                let ty = s.split_whitespace().nth(1).unwrap_or("");
                let spec = s.split_whitespace().skip(2).collect::<Vec<_>>().join(" ");
                f.declare_regs(ty, &spec)?;
            }
            ".shared" => {
                let (align, size, name, init) = parse_var(&s.replacen(".shared", "", 1))?;
                if init.is_some() {
                    return err("shared variables cannot be initialised");
                }
                f.shared = align_up(f.shared, align);
                f.symbol(&name, Symbol::Shared(f.shared));
                f.shared += size;
            }
            ".local" => {
                let (align, size, name, _) = parse_var(&s.replacen(".local", "", 1))?;
                f.local = align_up(f.local, align);
                f.symbol(&name, Symbol::Local(f.local));
                f.local += size;
            }
            // Only a call sequence declares parameters inside a function's body.
            ".param" => f.declare_call_param(&s.replacen(".param", "", 1))?,
            ".loc" | ".pragma" | ".maxntid" | ".reqntid" | ".minnctapersm" | ".maxnreg" => {}
            // A call spreads over several lines: one line, for the errors that name it.
            _ if s.contains('\n') => {
                insts_text.push(s.split_whitespace().collect::<Vec<_>>().join(" "))
            }
            _ => insts_text.push(s),
        }
    }
    for d in module_shared.iter().filter(|d| !d.dynamic) {
        f.shared = align_up(f.shared, d.align);
        f.symbol(&d.name, Symbol::Shared(f.shared));
        f.shared += d.size;
    }
    // The dynamic area (`extern __shared__`) starts after the static variables; its
    // size comes with each launch.
    f.shared = align_up(f.shared, 16);
    for d in module_shared.iter().filter(|d| d.dynamic) {
        f.symbol(&d.name, Symbol::Shared(f.shared));
    }
    let mut code = Vec::with_capacity(insts_text.len());
    for s in &insts_text {
        code.push(parse_inst(&f, s).map_err(|e| PtxError(format!("{name}: {s}: {}", e.0)))?);
    }
    Ok(Kernel {
        name,
        params,
        regs: f.nregs,
        shared_size: f.shared,
        local_size: f.local,
        call_size: f.call,
        symbols: f.symbols,
        code,
    })
}

fn parse_operand(f: &FuncBuilder<'_>, s: &str, ty: Ty) -> Result<Operand, PtxError> {
    let s = s.trim();
    if let Some(inner) = s.strip_prefix('{') {
        let inner = inner.trim_end_matches('}');
        return Ok(Operand::Vec(
            split_top(inner, ',')
                .iter()
                .map(|e| parse_operand(f, e, ty))
                .collect::<Result<_, _>>()?,
        ));
    }
    if let Some(inner) = s.strip_prefix('[') {
        let inner = inner.trim_end_matches(']').replace(' ', "");
        let (base, off) = match inner.find(['+', '-']).filter(|&i| i > 0) {
            Some(i) => {
                let off = parse_int(&inner[i..].replace('+', ""))
                    .ok_or_else(|| PtxError(format!("bad offset in {s}")))?;
                (&inner[..i], off as i64)
            }
            None => (inner.as_str(), 0),
        };
        if base.starts_with('%') {
            let r = f.reg(base)?;
            if f.narrow.contains(&r) {
                return Ok(Operand::RegAddr32(r, off));
            }
            return Ok(Operand::RegAddr(r, off));
        }
        if let Some(&i) = f.syms.get(base) {
            return Ok(Operand::Sym(i, off));
        }
        if let Some(v) = parse_int(base) {
            return Ok(Operand::AbsAddr((v + i128::from(off)) as u64));
        }
        return err(format!("unknown address {s}"));
    }
    if s.starts_with('%') {
        let special = match s {
            "%tid.x" => Some(Special::Tid(0)),
            "%tid.y" => Some(Special::Tid(1)),
            "%tid.z" => Some(Special::Tid(2)),
            "%ntid.x" => Some(Special::Ntid(0)),
            "%ntid.y" => Some(Special::Ntid(1)),
            "%ntid.z" => Some(Special::Ntid(2)),
            "%ctaid.x" => Some(Special::Ctaid(0)),
            "%ctaid.y" => Some(Special::Ctaid(1)),
            "%ctaid.z" => Some(Special::Ctaid(2)),
            "%nctaid.x" => Some(Special::Nctaid(0)),
            "%nctaid.y" => Some(Special::Nctaid(1)),
            "%nctaid.z" => Some(Special::Nctaid(2)),
            "%laneid" => Some(Special::LaneId),
            "WARP_SZ" => Some(Special::WarpSize),
            "%lanemask_eq" => Some(Special::LaneMask(std::cmp::Ordering::Equal, true)),
            "%lanemask_le" => Some(Special::LaneMask(std::cmp::Ordering::Less, true)),
            "%lanemask_lt" => Some(Special::LaneMask(std::cmp::Ordering::Less, false)),
            "%lanemask_ge" => Some(Special::LaneMask(std::cmp::Ordering::Greater, true)),
            "%lanemask_gt" => Some(Special::LaneMask(std::cmp::Ordering::Greater, false)),
            "%clock" | "%clock64" => Some(Special::Clock),
            "%globaltimer" => Some(Special::GlobalTimer(None)),
            "%globaltimer_lo" => Some(Special::GlobalTimer(Some(false))),
            "%globaltimer_hi" => Some(Special::GlobalTimer(Some(true))),
            _ => None,
        };
        if let Some(sp) = special {
            return Ok(Operand::Special(sp));
        }
        return Ok(Operand::Reg(f.reg(s)?));
    }
    if s == "_" {
        return Ok(Operand::Imm(0));
    }
    if s == "WARP_SZ" {
        return Ok(Operand::Special(Special::WarpSize));
    }
    if let Some(&l) = f.labels.get(s) {
        return Ok(Operand::Label(l));
    }
    if let Some(&i) = f.syms.get(s) {
        return Ok(Operand::Sym(i, 0));
    }
    // `sym+4` as an immediate address.
    if let Some((base, off)) = s.split_once('+')
        && let (Some(&i), Some(o)) = (f.syms.get(base.trim()), parse_int(off))
    {
        return Ok(Operand::Sym(i, o as i64));
    }
    parse_imm(s, ty)
        .map(Operand::Imm)
        .ok_or_else(|| PtxError(format!("unknown operand {s:?}")))
}

fn parse_cmp(s: &str) -> Option<Cmp> {
    Some(match s {
        "eq" => Cmp::Eq,
        "ne" => Cmp::Ne,
        "lt" | "lo" => Cmp::Lt,
        "le" | "ls" => Cmp::Le,
        "gt" | "hi" => Cmp::Gt,
        "ge" | "hs" => Cmp::Ge,
        "equ" => Cmp::Equ,
        "neu" => Cmp::Neu,
        "ltu" => Cmp::Ltu,
        "leu" => Cmp::Leu,
        "gtu" => Cmp::Gtu,
        "geu" => Cmp::Geu,
        "num" => Cmp::Num,
        "nan" => Cmp::Nan,
        _ => return None,
    })
}

/// A `bar.red` reduction, given whether its predicate is negated.
type BarRedOf = fn(bool) -> BarRed;

/// The first of `choices` whose modifier an instruction has.
fn first_of<T: Copy>(has: &impl Fn(&str) -> bool, choices: &[(&str, T)]) -> Option<T> {
    choices.iter().find(|(m, _)| has(m)).map(|&(_, t)| t)
}

fn parse_inst(f: &FuncBuilder<'_>, s: &str) -> Result<Inst, PtxError> {
    let mut s = s.trim();
    let mut guard = None;
    if let Some(rest) = s.strip_prefix('@') {
        let (g, r) = rest
            .split_once(char::is_whitespace)
            .ok_or_else(|| PtxError("guard without instruction".into()))?;
        let (neg, g) = match g.strip_prefix('!') {
            Some(g) => (true, g),
            None => (false, g),
        };
        guard = Some((f.reg(g)?, !neg));
        s = r.trim();
    }
    let (opcode, operands) = match s.split_once(char::is_whitespace) {
        Some((o, r)) => (o, r.trim()),
        None => (s, ""),
    };
    let parts: Vec<&str> = opcode.split('.').collect();
    let base = parts[0];
    let mods = &parts[1..];
    let types: Vec<Ty> = mods.iter().filter_map(|m| Ty::parse(m)).collect();
    let space = mods.iter().find_map(|m| Space::parse(m));
    let vec = mods
        .iter()
        .find_map(|m| match *m {
            "v2" => Some(2),
            "v4" => Some(4),
            _ => None,
        })
        .unwrap_or(1);
    if base == "call" {
        return parse_call(f, guard, operands, s);
    }
    if matches!(base, "tex" | "suld" | "sust") {
        return parse_texture_op(f, guard, opcode, operands, s);
    }
    let has = |m: &str| mods.contains(&m);
    let ty = types.first().copied().unwrap_or(Ty::B(64));
    let mut ty2 = types.get(1).copied().unwrap_or(ty);
    let unsupported = || {
        PtxError(format!(
            "the CPU test executor does not implement `{opcode}`"
        ))
    };
    let op = match base {
        "mov" => Op::Mov,
        "ld" | "ldu" => Op::Ld(space.unwrap_or(Space::Generic)),
        "st" => Op::St(space.unwrap_or(Space::Generic)),
        "cvta" => Op::Cvta {
            to: has("to"),
            space: space.ok_or_else(unsupported)?,
        },
        "cvt" => {
            let round_int = if has("rni") {
                Some(Round::Nearest)
            } else if has("rzi") {
                Some(Round::Zero)
            } else if has("rmi") {
                Some(Round::Down)
            } else if has("rpi") {
                Some(Round::Up)
            } else {
                None
            };
            let dst = ty;
            ty2 = types.get(1).copied().ok_or_else(unsupported)?;
            Op::Cvt { dst, round_int }
        }
        "add" if has("cc") => Op::AddC {
            cin: false,
            cout: true,
        },
        "addc" => Op::AddC {
            cin: true,
            cout: has("cc"),
        },
        "sub" if has("cc") => Op::SubC {
            cin: false,
            cout: true,
        },
        "subc" => Op::SubC {
            cin: true,
            cout: has("cc"),
        },
        "mad" if has("cc") => Op::MadC {
            hi: has("hi"),
            cin: false,
            cout: true,
        },
        "madc" => Op::MadC {
            hi: has("hi"),
            cin: true,
            cout: has("cc"),
        },
        "copysign" => Op::CopySign,
        "add" => Op::Add,
        "sub" => Op::Sub,
        "mul" if has("hi") => Op::MulHi,
        "mul" if has("wide") => Op::MulWide,
        "mul" => Op::MulLo,
        "mad" if has("hi") => Op::MadHi,
        "mad" if has("wide") => Op::MadWide,
        "mad" => Op::MadLo,
        "fma" => Op::Fma,
        "div" => Op::Div,
        "rem" => Op::Rem,
        "min" => Op::Min,
        "max" => Op::Max,
        "neg" => Op::Neg,
        "abs" => Op::Abs,
        "and" => Op::And,
        "or" => Op::Or,
        "xor" => Op::Xor,
        "not" => Op::Not,
        "shl" => Op::Shl,
        "shr" => Op::Shr,
        "setp" => {
            let cmp = mods
                .iter()
                .find_map(|m| parse_cmp(m))
                .ok_or_else(unsupported)?;
            let bool_op = if mods.len() > 2 {
                match mods[1] {
                    "and" => Some(BoolOp::And),
                    "or" => Some(BoolOp::Or),
                    "xor" => Some(BoolOp::Xor),
                    _ => None,
                }
            } else {
                None
            };
            Op::Setp(cmp, bool_op)
        }
        "selp" => Op::Selp,
        "bra" => Op::Bra,
        "ret" | "exit" => Op::Ret,
        "bar" if has("warp") && has("sync") => Op::Warp(Collective::Sync),
        "bar" | "barrier" if has("red") => {
            let negated = split_top(operands, ',')
                .last()
                .is_some_and(|c| c.trim().starts_with('!'));
            let kinds: [(&str, BarRedOf); 3] = [
                ("and", BarRed::And),
                ("or", BarRed::Or),
                ("popc", BarRed::Popc),
            ];
            let reduce = first_of(&has, &kinds).ok_or_else(unsupported)?;
            Op::BarRed(reduce(negated))
        }
        "bar" | "barrier" if has("sync") || mods.is_empty() => Op::Bar,
        "shfl" if has("sync") => Op::Warp(Collective::Shfl(
            first_of(
                &has,
                &[
                    ("up", ShflMode::Up),
                    ("down", ShflMode::Down),
                    ("bfly", ShflMode::Bfly),
                    ("idx", ShflMode::Idx),
                ],
            )
            .ok_or_else(unsupported)?,
        )),
        "vote" if has("sync") => {
            let mode = first_of(
                &has,
                &[
                    ("all", VoteMode::All),
                    ("any", VoteMode::Any),
                    ("uni", VoteMode::Uni),
                    ("ballot", VoteMode::Ballot),
                ],
            )
            .ok_or_else(unsupported)?;
            let negated = split_top(operands, ',')
                .get(1)
                .is_some_and(|a| a.trim().starts_with('!'));
            Op::Warp(Collective::Vote(mode, negated))
        }
        "match" if has("sync") && has("any") => Op::Warp(Collective::MatchAny),
        "match" if has("sync") && has("all") => Op::Warp(Collective::MatchAll),
        "activemask" => Op::Warp(Collective::ActiveMask),
        "redux" if has("sync") => Op::Warp(Collective::Redux(
            first_of(
                &has,
                &[
                    ("add", ReduxOp::Add),
                    ("min", ReduxOp::Min),
                    ("max", ReduxOp::Max),
                    ("and", ReduxOp::And),
                    ("or", ReduxOp::Or),
                    ("xor", ReduxOp::Xor),
                ],
            )
            .ok_or_else(unsupported)?,
        )),
        // `griddepcontrol` (programmatic dependent launch): each launch here ends
        // before the next begins, which is what waiting for it would give.
        "membar" | "fence" | "nanosleep" | "griddepcontrol" => Op::Nop,
        "trap" => Op::Trap,
        "brev" => Op::Brev,
        "bfind" => Op::Bfind(has("shiftamt")),
        "bfe" => Op::Bfe,
        "bfi" => Op::Bfi,
        "bmsk" => Op::Bmsk(has("clamp")),
        "sqrt" => Op::Sqrt,
        "rsqrt" => Op::Rsqrt,
        "rcp" => Op::Rcp,
        "ex2" => Op::Ex2,
        "lg2" => Op::Lg2,
        "sin" => Op::Sin,
        "cos" => Op::Cos,
        "atom" | "red" => {
            let sp = space.unwrap_or(Space::Generic);
            if has("add") {
                Op::AtomAdd(sp, base == "atom")
            } else if has("exch") && base == "atom" {
                Op::AtomExch(sp)
            } else if has("min") {
                Op::AtomMin(sp)
            } else if has("max") {
                Op::AtomMax(sp)
            } else if has("cas") && base == "atom" {
                Op::AtomCas(sp)
            } else if has("and") {
                Op::AtomBits(sp, BoolOp::And, base == "atom")
            } else if has("or") {
                Op::AtomBits(sp, BoolOp::Or, base == "atom")
            } else if has("xor") {
                Op::AtomBits(sp, BoolOp::Xor, base == "atom")
            } else if has("inc") {
                Op::AtomWrap(sp, true, base == "atom")
            } else if has("dec") {
                Op::AtomWrap(sp, false, base == "atom")
            } else {
                return Err(unsupported());
            }
        }
        "popc" => Op::Popc,
        "clz" => Op::Clz,
        _ => return Err(unsupported()),
    };
    let ty = match op {
        Op::Cvt { .. } => ty,
        Op::Setp(..) | Op::Selp => *types.last().unwrap_or(&ty),
        _ => ty,
    };
    let sat = has("sat");
    let sat_ok = match op {
        Op::Cvt { .. } => true,
        Op::Add | Op::Sub | Op::MulLo | Op::MadLo | Op::Fma => {
            ty.float() || ty == Ty::F16x2 || (ty == Ty::S(32) && matches!(op, Op::Add | Op::Sub))
        }
        _ => false,
    };
    if types.contains(&Ty::F16x2) && !HALF2_OPS.contains(&op) {
        return Err(unsupported());
    }
    if sat && !sat_ok {
        return Err(unsupported());
    }
    let round = if has("rz") {
        Round::Zero
    } else if has("rm") {
        Round::Down
    } else if has("rp") {
        Round::Up
    } else {
        Round::Nearest
    };
    let mut ops = Vec::new();
    // The predicate a `shfl` or `match.all` also writes (`d|p`).
    let mut second = None;
    if matches!(op, Op::Nop) {
        // `nanosleep`'s duration and `fence`'s proxy operands have no effect here.
        return Ok(Inst {
            guard,
            op,
            ty,
            ty2,
            vec,
            sat: false,
            round: Round::Nearest,
            ops,
            text: s.to_string(),
        });
    }
    for o in split_top(operands, ',') {
        // `setp` writes `p|q`: only `p` is kept (q is the complement, rarely used).
        let mut parts = o.split('|');
        let o = parts.next().unwrap_or("").trim().to_string();
        if ops.is_empty()
            && let Some(p) = parts.next()
            && matches!(op, Op::Warp(Collective::Shfl(_) | Collective::MatchAll))
        {
            second = Some(parse_operand(f, p, Ty::Pred)?);
        }
        let o = match op {
            Op::Warp(Collective::Vote(..)) | Op::BarRed(_) => o.trim_start_matches('!').to_string(),
            _ => o,
        };
        let oty = match op {
            Op::Cvt { .. } if !ops.is_empty() => ty2,
            _ => ty,
        };
        ops.push(parse_operand(f, &o, oty)?);
    }
    let arity = match op {
        Op::Warp(Collective::Shfl(_)) => Some(5),
        Op::Warp(
            Collective::Vote(..)
            | Collective::MatchAny
            | Collective::MatchAll
            | Collective::Redux(_),
        ) => Some(3),
        Op::Warp(Collective::ActiveMask) => Some(1),
        Op::Warp(Collective::Sync) => Some(1),
        Op::Bfi => Some(5),
        // A thread count between the barrier and the predicate is not supported.
        Op::BarRed(_) => Some(3),
        Op::Bfe => Some(4),
        Op::Bmsk(_) => Some(3),
        Op::Brev | Op::Bfind(_) => Some(2),
        _ => None,
    };
    if arity.is_some_and(|n| n != ops.len()) {
        return err(format!("`{opcode}` takes {} operands", arity.unwrap_or(0)));
    }
    ops.extend(second);
    if let Op::Setp(_, Some(_)) = op
        && ops.len() != 4
    {
        return Err(unsupported());
    }
    Ok(Inst {
        guard,
        op,
        ty,
        ty2,
        vec,
        sat,
        round,
        ops,
        text: s.to_string(),
    })
}

/// `tex`, `suld.b` and `sust.b` on an object in a 64-bit register: the vector of
/// results or values, and `[object, {coordinates}]`.
fn parse_texture_op(
    f: &FuncBuilder<'_>,
    guard: Option<(usize, bool)>,
    opcode: &str,
    operands: &str,
    text: &str,
) -> Result<Inst, PtxError> {
    let unsupported = || {
        PtxError(format!(
            "the CPU test executor does not implement `{opcode}`"
        ))
    };
    let parts: Vec<&str> = opcode.split('.').collect();
    let (base, mods) = (parts[0], &parts[1..]);
    let has = |m: &str| mods.contains(&m);
    // `a1d`, `a2d`: a layer of a layered array, named by the first coordinate.
    let (dims, layered) = if has("a1d") {
        (1, true)
    } else if has("a2d") {
        (2, true)
    } else if has("1d") {
        (1, false)
    } else if has("2d") {
        (2, false)
    } else if has("3d") {
        (3, false)
    } else {
        return Err(unsupported());
    };
    if layered && base != "tex" {
        return Err(unsupported());
    }
    let types: Vec<Ty> = mods.iter().filter_map(|m| Ty::parse(m)).collect();
    let vec = if has("v4") {
        4
    } else if has("v2") {
        2
    } else {
        1
    };
    let clamp = if has("clamp") {
        tex::Clamp::Clamp
    } else if has("zero") {
        tex::Clamp::Zero
    } else {
        tex::Clamp::Trap
    };
    let (op, ty, cty) = match base {
        "tex" if vec == 4 && types.len() == 2 && !has("level") && !has("grad") => {
            let (d, c) = (types[0], types[1]);
            if !matches!(d, Ty::F32 | Ty::S(32) | Ty::U(32)) || !matches!(c, Ty::F32 | Ty::S(32)) {
                return Err(unsupported());
            }
            let ints = c == Ty::S(32);
            (
                Op::Tex {
                    dims,
                    ints,
                    layered,
                },
                d,
                c,
            )
        }
        "suld" | "sust" if has("b") && types.len() == 1 && matches!(types[0], Ty::B(_)) => {
            let op = if base == "suld" {
                Op::Suld { dims, clamp }
            } else {
                Op::Sust { dims, clamp }
            };
            (op, types[0], Ty::S(32))
        }
        _ => return Err(unsupported()),
    };
    let top = split_top(operands, ',');
    let (value, place) = match top.as_slice() {
        [place, value] if base == "sust" => (value.as_str(), place.as_str()),
        [value, place] => (value.as_str(), place.as_str()),
        _ => return err(format!("`{opcode}` takes two operands")),
    };
    let inner = place
        .trim()
        .strip_prefix('[')
        .and_then(|p| p.strip_suffix(']'))
        .ok_or_else(|| PtxError(format!("`{opcode}`: no [object, coordinates] in {place}")))?;
    let inside = split_top(inner, ',');
    let [object, coords] = inside.as_slice() else {
        return err(format!(
            "`{opcode}`: [object, coordinates] expected, found {place}"
        ));
    };
    let object = parse_operand(f, object, Ty::B(64))?;
    if !matches!(object, Operand::Reg(_)) {
        // Texture references (`.texref` names) went with CUDA 12.
        return Err(unsupported());
    }
    let coords = parse_operand(f, coords, cty)?;
    let value = parse_operand(f, value, ty)?;
    Ok(Inst {
        guard,
        op,
        ty,
        ty2: cty,
        vec,
        sat: false,
        round: Round::Nearest,
        ops: vec![value, object, coords],
        text: text.to_string(),
    })
}

/// `call.uni (retval0), vprintf, (param0, param1)`, the call NVRTC makes of
/// `printf`: the callee must be `vprintf`, declared by the module, with two 64-bit
/// call parameters and at most one 32-bit return value. The module's own functions
/// are inlined before ([`Inliner`]); any other call (a function the module only
/// declares, an indirect call through a register) is refused, the callee named.
fn parse_call(
    f: &FuncBuilder<'_>,
    guard: Option<(usize, bool)>,
    operands: &str,
    text: &str,
) -> Result<Inst, PtxError> {
    let (rets, callee, args, more) = call_parts(operands);
    if callee.starts_with('%') || more > 0 {
        return err(format!(
            "calls are not supported through a function pointer: this calls `{callee}` \
             (the CPU test executor runs `{VPRINTF}` and the module's own functions)"
        ));
    }
    if callee != VPRINTF {
        return err(format!(
            "calls are not supported of functions the module does not define: this calls \
             `{callee}` (the CPU test executor runs `{VPRINTF}` and the module's own \
             functions)"
        ));
    }
    if !f.funcs.contains(VPRINTF) {
        return err(format!(
            "`{VPRINTF}` is called but the module does not declare it"
        ));
    }
    let Some(args) = args else {
        return err(format!("`{VPRINTF}` takes a list of two parameters"));
    };
    if args.len() != 2 || rets.len() > 1 {
        return err(format!(
            "`{VPRINTF}` takes two parameters and returns one value"
        ));
    }
    let mut ops = Vec::with_capacity(3);
    for (name, size) in args
        .iter()
        .map(|a| (a, 8))
        .chain(rets.iter().map(|r| (r, 4)))
    {
        match (f.call_param_size(name), f.syms.get(name.as_str())) {
            (Some(had), Some(&i)) if had >= size => ops.push(Operand::Sym(i, 0)),
            _ => {
                return err(format!("`{name}` is not a call parameter of {size} bytes"));
            }
        }
    }
    Ok(Inst {
        guard,
        op: Op::Call(!rets.is_empty()),
        ty: Ty::B(64),
        ty2: Ty::B(64),
        vec: 1,
        sat: false,
        round: Round::Nearest,
        ops,
        text: text.to_string(),
    })
}

// ---------------------------------------------------------------------------------
// Execution

/// Grid and block dimensions of a launch.
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub grid: [u32; 3],
    pub block: [u32; 3],
}

struct Thread {
    pc: usize,
    regs: Vec<u64>,
    local: Vec<u8>,
    /// The `.param` variables of call sequences.
    call: Vec<u8>,
    /// The carry flag of `add.cc` and the like.
    carry: bool,
    tid: [u32; 3],
    state: ThreadState,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum ThreadState {
    Running,
    Barrier,
    /// At a warp-wide instruction (the one before `pc`), waiting for the lanes it
    /// names.
    Warp,
    Done,
}

struct Ctx<'a> {
    kernel: &'a Kernel,
    params: &'a [u8],
    globals: &'a [u64],
    shared: Vec<u8>,
    mem: &'a mut dyn DeviceMemory,
    printf: &'a mut PrintfFifo,
    ctaid: [u32; 3],
    dims: Dims,
}

fn sext(v: u64, bits: u32) -> i64 {
    if bits >= 64 {
        v as i64
    } else {
        ((v << (64 - bits)) as i64) >> (64 - bits)
    }
}

fn mask(v: u64, bits: u32) -> u64 {
    if bits >= 64 {
        v
    } else {
        v & ((1u64 << bits) - 1)
    }
}

fn f32v(v: u64) -> f32 {
    f32::from_bits(v as u32)
}

fn f32b(f: f32) -> u64 {
    u64::from(f.to_bits())
}

/// Runs a kernel over the whole grid. `params` holds its parameters as laid out by
/// `Kernel::params`; `globals` the addresses of the module's variables; `dynamic`
/// the bytes of dynamic shared memory; `printf` receives what its `printf` calls
/// print.
pub fn launch(
    kernel: &Kernel,
    dims: Dims,
    dynamic: usize,
    params: &[u8],
    globals: &[u64],
    mem: &mut dyn DeviceMemory,
    printf: &mut PrintfFifo,
) -> Result<(), PtxError> {
    if params.len() < kernel.param_bytes() {
        return err("too few parameter bytes for the kernel");
    }
    let threads = dims.block.iter().map(|&d| d as usize).product::<usize>();
    if threads == 0 || dims.grid.contains(&0) {
        return err("empty grid or block");
    }
    let mut ctx = Ctx {
        kernel,
        params,
        globals,
        shared: vec![0; kernel.shared_size + dynamic],
        mem,
        printf,
        ctaid: [0; 3],
        dims,
    };
    for bz in 0..dims.grid[2] {
        for by in 0..dims.grid[1] {
            for bx in 0..dims.grid[0] {
                ctx.ctaid = [bx, by, bz];
                ctx.shared.iter_mut().for_each(|b| *b = 0);
                run_block(&mut ctx)?;
            }
        }
    }
    Ok(())
}

fn run_block(ctx: &mut Ctx<'_>) -> Result<(), PtxError> {
    let b = ctx.dims.block;
    let mut threads = Vec::with_capacity((b[0] * b[1] * b[2]) as usize);
    for z in 0..b[2] {
        for y in 0..b[1] {
            for x in 0..b[0] {
                threads.push(Thread {
                    pc: 0,
                    regs: vec![0; ctx.kernel.regs],
                    local: vec![0; ctx.kernel.local_size],
                    call: vec![0; ctx.kernel.call_size],
                    carry: false,
                    tid: [x, y, z],
                    state: ThreadState::Running,
                });
            }
        }
    }
    loop {
        let mut any = false;
        for t in threads.iter_mut() {
            if t.state == ThreadState::Running {
                any = true;
                run_thread(ctx, t)?;
            }
        }
        if resolve_warps(ctx, &mut threads)? {
            continue;
        }
        if threads.iter().any(|t| t.state == ThreadState::Warp) {
            return err(
                "a warp-wide instruction (shfl, vote, match, bar.warp.sync) never completed: \
                 lanes of its member mask exited or wait at a barrier",
            );
        }
        let waiting = threads
            .iter()
            .filter(|t| t.state == ThreadState::Barrier)
            .count();
        if waiting == 0 {
            if !any || threads.iter().all(|t| t.state == ThreadState::Done) {
                return Ok(());
            }
            continue;
        }
        // Every thread still running has reached the barrier: release them, with
        // what a `bar.red` reduces over them.
        let code = &ctx.kernel.code;
        let (mut all, mut any, mut count) = (true, false, 0u64);
        for t in threads.iter().filter(|t| t.state == ThreadState::Barrier) {
            let i = &code[t.pc - 1];
            if let Op::BarRed(BarRed::And(neg) | BarRed::Or(neg) | BarRed::Popc(neg)) = i.op {
                let p = (ctx.value(t, &i.ops[2])? != 0) != neg;
                all &= p;
                any |= p;
                count += u64::from(p);
            }
        }
        for t in threads.iter_mut() {
            if t.state != ThreadState::Barrier {
                continue;
            }
            let i = &code[t.pc - 1];
            let r = match i.op {
                Op::BarRed(BarRed::And(_)) => u64::from(all),
                Op::BarRed(BarRed::Or(_)) => u64::from(any),
                Op::BarRed(BarRed::Popc(_)) => count,
                _ => continue,
            };
            set(t, &i.ops[0], r)?;
        }
        for t in threads.iter_mut() {
            if t.state == ThreadState::Barrier {
                t.state = ThreadState::Running;
            }
        }
    }
}

/// Completes the warp-wide instructions whose lanes have all arrived: for each lane
/// waiting at one, the lanes its member mask names (less those that exited or do
/// not exist) must all be waiting at one too; `activemask` takes the lanes waiting
/// at the same instruction. Each lane's result comes from its own instruction, with
/// the other participants' operands. Returns whether any lane goes on.
fn resolve_warps(ctx: &Ctx<'_>, threads: &mut [Thread]) -> Result<bool, PtxError> {
    let code = &ctx.kernel.code;
    let mut progressed = false;
    let n = threads.len();
    for base in (0..n).step_by(32) {
        let warp = &mut threads[base..(base + 32).min(n)];
        let state = |w: &[Thread], l: usize| w.get(l).map(|t| t.state);
        let waiting: u32 = (0..warp.len())
            .filter(|&l| state(warp, l) == Some(ThreadState::Warp))
            .fold(0, |m, l| m | 1 << l);
        if waiting == 0 {
            continue;
        }
        let live: u32 = (0..warp.len())
            .filter(|&l| state(warp, l) != Some(ThreadState::Done))
            .fold(0, |m, l| m | 1 << l);
        let inst = |w: &[Thread], l: usize| &code[w[l].pc - 1];
        let mut results: Vec<(usize, Vec<(usize, u64)>)> = Vec::new();
        // `activemask` first: the lanes at one are not waiting for the others, which
        // go on only once those have (the lanes a member mask names must all wait at
        // a collective that takes one).
        let masked: u32 = (0..warp.len())
            .filter(|&l| {
                waiting & (1 << l) != 0
                    && !matches!(inst(warp, l).op, Op::Warp(Collective::ActiveMask))
            })
            .fold(0, |m, l| m | 1 << l);
        let mut done = 0u32;
        let order = (0..warp.len())
            .filter(|&l| masked & (1 << l) == 0)
            .chain((0..warp.len()).filter(|&l| masked & (1 << l) != 0));
        for l in order {
            if waiting & (1 << l) == 0 || done & (1 << l) != 0 {
                continue;
            }
            let i = inst(warp, l);
            let Op::Warp(kind) = i.op else {
                return err("a lane waits at an instruction that is not warp-wide");
            };
            if kind != Collective::ActiveMask && done != 0 {
                // Lanes left `activemask`: let them run first.
                break;
            }
            let group = if kind == Collective::ActiveMask {
                (0..warp.len())
                    .filter(|&m| waiting & (1 << m) != 0 && warp[m].pc == warp[l].pc)
                    .fold(0, |g, m| g | 1 << m)
            } else {
                let at = match kind {
                    Collective::Shfl(_) => 4,
                    Collective::Sync => 0,
                    _ => 2,
                };
                let member = ctx.value(&warp[l], &i.ops[at])? as u32;
                let need = (member & live) | (1 << l);
                if need & !masked != 0 {
                    continue;
                }
                need
            };
            done |= group;
            let lanes: Vec<usize> = (0..warp.len()).filter(|&m| group & (1 << m) != 0).collect();
            // Each lane's `a` operand (its value or predicate).
            let mut a = [0u64; 32];
            for &m in &lanes {
                let im = inst(warp, m);
                if let Some(op) = im.ops.get(1).filter(|_| im.ops.len() > 1) {
                    let x = ctx.value(&warp[m], op)?;
                    a[m] = match im.op {
                        Op::Warp(Collective::Vote(_, neg)) => u64::from((x != 0) != neg),
                        _ => mask(x, im.ty.bits()),
                    };
                }
            }
            for &m in &lanes {
                let im = inst(warp, m);
                let Op::Warp(kind) = im.op else {
                    return err("a lane waits at an instruction that is not warp-wide");
                };
                let mut out = Vec::new();
                let dst = |k: usize| match im.ops.get(k) {
                    Some(Operand::Reg(r)) => Ok(*r),
                    _ => err("the destination is not a register"),
                };
                match kind {
                    Collective::Shfl(mode) => {
                        let (b, c) = (
                            ctx.value(&warp[m], &im.ops[2])?,
                            ctx.value(&warp[m], &im.ops[3])?,
                        );
                        let lane = m as i64;
                        let bval = (b & 0x1f) as i64;
                        let seg = ((c >> 8) & 0x1f) as i64;
                        let max = (lane & seg) | ((c & 0x1f) as i64 & !seg);
                        let min = lane & seg;
                        let (j, ok) = match mode {
                            ShflMode::Up => (lane - bval, lane - bval >= max),
                            ShflMode::Down => (lane + bval, lane + bval <= max),
                            ShflMode::Bfly => (lane ^ bval, (lane ^ bval) <= max),
                            ShflMode::Idx => (min | (bval & !seg), (min | (bval & !seg)) <= max),
                        };
                        // Out of range: the lane's own value. A source lane that
                        // takes no part gives 0: PTX leaves it undefined, and NVIDIA's
                        // reduction sample (reduce7, a final warp of fewer lanes than
                        // its shuffle offsets) is right on GPUs only with 0.
                        let j = if ok { j } else { lane };
                        let x = if (0..32).contains(&j) && group & (1 << j) != 0 {
                            a[j as usize]
                        } else {
                            0
                        };
                        out.push((dst(0)?, x));
                        if im.ops.len() > 5 {
                            out.push((dst(5)?, u64::from(ok)));
                        }
                    }
                    Collective::Vote(mode, _) => {
                        let ballot = lanes
                            .iter()
                            .filter(|&&x| a[x] != 0)
                            .fold(0u64, |g, &x| g | 1 << x);
                        let r = match mode {
                            VoteMode::All => u64::from(ballot == u64::from(group)),
                            VoteMode::Any => u64::from(ballot != 0),
                            VoteMode::Uni => u64::from(ballot == 0 || ballot == u64::from(group)),
                            VoteMode::Ballot => ballot,
                        };
                        out.push((dst(0)?, r));
                    }
                    Collective::MatchAny => {
                        let same = lanes
                            .iter()
                            .filter(|&&x| a[x] == a[m])
                            .fold(0u64, |g, &x| g | 1 << x);
                        out.push((dst(0)?, same));
                    }
                    Collective::MatchAll => {
                        let all = lanes.iter().all(|&x| a[x] == a[m]);
                        out.push((dst(0)?, if all { u64::from(group) } else { 0 }));
                        if im.ops.len() > 3 {
                            out.push((dst(3)?, u64::from(all)));
                        }
                    }
                    Collective::ActiveMask => out.push((dst(0)?, u64::from(group))),
                    Collective::Redux(op) => {
                        let signed = im.ty.signed();
                        let vals = lanes.iter().map(|&x| a[x] as u32);
                        let r = match op {
                            ReduxOp::Add => vals.fold(0u32, u32::wrapping_add),
                            ReduxOp::Min if signed => {
                                vals.map(|v| v as i32).min().unwrap_or(0) as u32
                            }
                            ReduxOp::Max if signed => {
                                vals.map(|v| v as i32).max().unwrap_or(0) as u32
                            }
                            ReduxOp::Min => vals.min().unwrap_or(0),
                            ReduxOp::Max => vals.max().unwrap_or(0),
                            ReduxOp::And => vals.fold(u32::MAX, |x, y| x & y),
                            ReduxOp::Or => vals.fold(0, |x, y| x | y),
                            ReduxOp::Xor => vals.fold(0, |x, y| x ^ y),
                        };
                        out.push((dst(0)?, u64::from(r)));
                    }
                    Collective::Sync => {}
                }
                results.push((m, out));
            }
        }
        for (m, out) in results {
            for (r, x) in out {
                warp[m].regs[r] = x;
            }
            warp[m].state = ThreadState::Running;
            progressed = true;
        }
    }
    Ok(progressed)
}

/// Instructions one thread may run between two barriers before the launch is taken
/// for a hang.
const STEP_LIMIT: u64 = 1 << 32;

fn run_thread(ctx: &mut Ctx<'_>, t: &mut Thread) -> Result<(), PtxError> {
    let code = &ctx.kernel.code;
    let mut steps = 0u64;
    while t.state == ThreadState::Running {
        let Some(inst) = code.get(t.pc) else {
            t.state = ThreadState::Done;
            return Ok(());
        };
        steps += 1;
        if steps > STEP_LIMIT {
            return err("a thread ran too long without reaching a barrier");
        }
        t.pc += 1;
        if let Some((p, want)) = inst.guard
            && (t.regs[p] != 0) != want
        {
            continue;
        }
        step(ctx, t, inst).map_err(|e| PtxError(format!("{}: {}", inst.text, e.0)))?;
    }
    Ok(())
}

impl Ctx<'_> {
    fn special(&self, t: &Thread, s: Special) -> u64 {
        let lane = || {
            let b = self.dims.block;
            (t.tid[0] + b[0] * (t.tid[1] + b[1] * t.tid[2])) % 32
        };
        u64::from(match s {
            Special::Tid(i) => t.tid[i],
            Special::Ntid(i) => self.dims.block[i],
            Special::Ctaid(i) => self.ctaid[i],
            Special::Nctaid(i) => self.dims.grid[i],
            Special::LaneId => lane(),
            Special::WarpSize => 32,
            Special::LaneMask(order, with_self) => {
                let me = 1u32 << lane();
                let below = me - 1;
                match (order, with_self) {
                    (std::cmp::Ordering::Equal, _) => me,
                    (std::cmp::Ordering::Less, false) => below,
                    (std::cmp::Ordering::Less, true) => below | me,
                    (std::cmp::Ordering::Greater, true) => !below,
                    (std::cmp::Ordering::Greater, false) => !(below | me),
                }
            }
            Special::Clock => {
                static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
                let ns = START
                    .get_or_init(std::time::Instant::now)
                    .elapsed()
                    .as_nanos();
                return u64::try_from(ns).unwrap_or(u64::MAX);
            }
            Special::GlobalTimer(half) => {
                let ns = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
                return match half {
                    None => ns,
                    Some(false) => ns & 0xffff_ffff,
                    Some(true) => ns >> 32,
                };
            }
        })
    }

    /// The address a symbol stands for, in its own space.
    fn sym_addr(&self, i: usize) -> u64 {
        match self.kernel.symbols[i] {
            Symbol::Param(o) | Symbol::Shared(o) | Symbol::Local(o) => o as u64,
            Symbol::Global(g) => self.globals[g],
            Symbol::CallParam(o) => CALL_PARAM_BASE + o as u64,
        }
    }

    fn value(&self, t: &Thread, o: &Operand) -> Result<u64, PtxError> {
        Ok(match o {
            Operand::Reg(r) => t.regs[*r],
            Operand::Imm(v) => *v,
            Operand::Special(s) => self.special(t, *s),
            Operand::Sym(i, off) => self.sym_addr(*i).wrapping_add(*off as u64),
            _ => return err("operand is not a value"),
        })
    }

    fn address(&self, t: &Thread, o: &Operand) -> Result<u64, PtxError> {
        Ok(match o {
            Operand::RegAddr(r, off) => t.regs[*r].wrapping_add(*off as u64),
            Operand::RegAddr32(r, off) => u64::from((t.regs[*r] as u32).wrapping_add(*off as u32)),
            Operand::Sym(i, off) => self.sym_addr(*i).wrapping_add(*off as u64),
            Operand::AbsAddr(a) => *a,
            Operand::Reg(r) => t.regs[*r],
            _ => return err("operand is not an address"),
        })
    }

    /// Resolves a generic address to its space.
    fn resolve(space: Space, addr: u64) -> (Space, u64) {
        if space != Space::Generic {
            return (space, addr);
        }
        if (SHARED_BASE..SHARED_BASE + WINDOW).contains(&addr) {
            (Space::Shared, addr - SHARED_BASE)
        } else if (LOCAL_BASE..LOCAL_BASE + WINDOW).contains(&addr) {
            (Space::Local, addr - LOCAL_BASE)
        } else {
            (Space::Global, addr)
        }
    }

    fn load(&self, t: &Thread, space: Space, addr: u64, out: &mut [u8]) -> Result<(), PtxError> {
        let (space, a) = Self::resolve(space, addr);
        let mut slice = |buf: &[u8], a: u64, what: &str| -> Result<(), PtxError> {
            let s = usize::try_from(a).ok();
            match s.and_then(|s| buf.get(s..s.checked_add(out.len())?)) {
                Some(b) => {
                    out.copy_from_slice(b);
                    Ok(())
                }
                None => err(format!("{what} address {a:#x} is out of bounds")),
            }
        };
        match space {
            Space::Shared => slice(&self.shared, a, "shared"),
            Space::Local => slice(&t.local, a, "local"),
            Space::Param if a >= CALL_PARAM_BASE => {
                slice(&t.call, a - CALL_PARAM_BASE, "call parameter")
            }
            Space::Param => slice(self.params, a, "parameter"),
            Space::Global | Space::Const | Space::Generic => {
                if self.mem.read(a, out) {
                    Ok(())
                } else {
                    err(format!("illegal address {a:#x}"))
                }
            }
        }
    }

    fn store(
        &mut self,
        t: &mut Thread,
        space: Space,
        addr: u64,
        data: &[u8],
    ) -> Result<(), PtxError> {
        let (space, a) = Self::resolve(space, addr);
        let put = |buf: &mut [u8], a: u64, what: &str| -> Result<(), PtxError> {
            let s = usize::try_from(a).ok();
            match s.and_then(|s| buf.get_mut(s..s.checked_add(data.len())?)) {
                Some(b) => {
                    b.copy_from_slice(data);
                    Ok(())
                }
                None => err(format!("{what} address {a:#x} is out of bounds")),
            }
        };
        match space {
            Space::Shared => put(&mut self.shared, a, "shared"),
            Space::Local => put(&mut t.local, a, "local"),
            Space::Param if a >= CALL_PARAM_BASE => {
                put(&mut t.call, a - CALL_PARAM_BASE, "call parameter")
            }
            Space::Param => err("stores to a kernel's parameters are not supported"),
            Space::Global | Space::Const | Space::Generic => {
                if self.mem.write(a, data) {
                    Ok(())
                } else {
                    err(format!("illegal address {a:#x}"))
                }
            }
        }
    }
}

/// The first `n` values of a vector operand (coordinates), the rest 0.
fn vector_values(ctx: &Ctx<'_>, t: &Thread, o: &Operand, n: usize) -> Result<[u64; 3], PtxError> {
    let Operand::Vec(items) = o else {
        return err("coordinates are not a vector");
    };
    if items.len() < n {
        return err("too few coordinates");
    }
    let mut out = [0u64; 3];
    for (slot, item) in out.iter_mut().zip(items).take(n) {
        *slot = ctx.value(t, item)?;
    }
    Ok(out)
}

fn set(t: &mut Thread, o: &Operand, v: u64) -> Result<(), PtxError> {
    match o {
        Operand::Reg(r) => {
            t.regs[*r] = v;
            Ok(())
        }
        _ => err("destination is not a register"),
    }
}

fn int_cmp(c: Cmp, a: u64, b: u64, ty: Ty) -> bool {
    let bits = ty.bits();
    let ord = if ty.signed() {
        sext(a, bits).cmp(&sext(b, bits))
    } else {
        mask(a, bits).cmp(&mask(b, bits))
    };
    use std::cmp::Ordering::*;
    match c {
        Cmp::Eq | Cmp::Equ => ord == Equal,
        Cmp::Ne | Cmp::Neu => ord != Equal,
        Cmp::Lt | Cmp::Ltu => ord == Less,
        Cmp::Le | Cmp::Leu => ord != Greater,
        Cmp::Gt | Cmp::Gtu => ord == Greater,
        Cmp::Ge | Cmp::Geu => ord != Less,
        Cmp::Num => true,
        Cmp::Nan => false,
    }
}

fn float_cmp(c: Cmp, a: f64, b: f64) -> bool {
    let nan = a.is_nan() || b.is_nan();
    match c {
        Cmp::Eq => a == b,
        Cmp::Ne => !nan && a != b,
        Cmp::Lt => a < b,
        Cmp::Le => a <= b,
        Cmp::Gt => a > b,
        Cmp::Ge => a >= b,
        Cmp::Equ => nan || a == b,
        Cmp::Neu => nan || a != b,
        Cmp::Ltu => nan || a < b,
        Cmp::Leu => nan || a <= b,
        Cmp::Gtu => nan || a > b,
        Cmp::Geu => nan || a >= b,
        Cmp::Num => !nan,
        Cmp::Nan => nan,
    }
}

/// Reads a float operand of type `ty` as f64.
fn fget(v: u64, ty: Ty) -> f64 {
    match ty {
        Ty::F32 => f64::from(f32v(v)),
        Ty::F16 => half::f16::from_bits(v as u16).to_f64(),
        _ => f64::from_bits(v),
    }
}

/// `f` in type `ty`, rounded to nearest (for a half, from the double: one rounding,
/// as the double holds every sum and product of two halves exactly).
fn fput(f: f64, ty: Ty) -> u64 {
    match ty {
        Ty::F32 => f32b(f as f32),
        Ty::F16 => u64::from(half::f16::from_f64(f).to_bits()),
        _ => f.to_bits(),
    }
}

/// A binary float operation done in the operand's own precision.
fn fbin(a: u64, b: u64, ty: Ty, f32op: fn(f32, f32) -> f32, f64op: fn(f64, f64) -> f64) -> u64 {
    match ty {
        Ty::F32 => f32b(f32op(f32v(a), f32v(b))),
        Ty::F16 => fput(f64op(fget(a, ty), fget(b, ty)), ty),
        _ => f64op(f64::from_bits(a), f64::from_bits(b)).to_bits(),
    }
}

fn round_f(f: f64, r: Round) -> f64 {
    match r {
        Round::Nearest => f.round_ties_even(),
        Round::Zero => f.trunc(),
        Round::Down => f.floor(),
        Round::Up => f.ceil(),
    }
}

fn convert(v: u64, from: Ty, to: Ty, round_int: Option<Round>) -> u64 {
    let fb = from.bits();
    let tb = to.bits();
    match (from.float(), to.float()) {
        (false, false) => {
            let x = if from.signed() {
                sext(v, fb) as u64
            } else {
                mask(v, fb)
            };
            if to.signed() {
                sext(x, tb) as u64
            } else {
                mask(x, tb)
            }
        }
        (false, true) => {
            let f = if from.signed() {
                sext(v, fb) as f64
            } else {
                mask(v, fb) as f64
            };
            let f = match (from, to) {
                // Through f32 directly keeps round-to-nearest from the integer.
                (_, Ty::F32) if from.signed() => return f32b(sext(v, fb) as f32),
                (_, Ty::F32) => return f32b(mask(v, fb) as f32),
                _ => f,
            };
            fput(f, to)
        }
        (true, false) => {
            let f = fget(v, from);
            let f = round_f(f, round_int.unwrap_or(Round::Zero));
            // Saturating, NaN to 0, as PTX specifies.
            let x = if to.signed() {
                let lo = -(2f64.powi(tb as i32 - 1));
                let hi = 2f64.powi(tb as i32 - 1) - 1.0;
                if f.is_nan() {
                    0
                } else {
                    f.clamp(lo, hi) as i64 as u64
                }
            } else {
                let hi = 2f64.powi(tb as i32) - 1.0;
                if f.is_nan() {
                    0
                } else {
                    f.clamp(0.0, hi) as u64
                }
            };
            mask(x, tb)
        }
        (true, true) => {
            let f = fget(v, from);
            let f = match round_int {
                Some(r) => round_f(f, r),
                None => f,
            };
            fput(f, to)
        }
    }
}

/// A float result clamped to [0, 1], NaN to 0 (`.sat`).
fn saturate_f(r: u64, ty: Ty) -> u64 {
    let f = fget(r, ty);
    fput(
        if f > 1.0 {
            1.0
        } else if f > 0.0 {
            f
        } else {
            0.0
        },
        ty,
    )
}

/// `cvt.sat` of an integer to a narrower one: clamped to its range. (From a float,
/// `convert` saturates always.)
fn saturate_int(v: u64, from: Ty, to: Ty) -> u64 {
    if from.float() {
        return convert(v, from, to, None);
    }
    let x = if from.signed() {
        i128::from(sext(v, from.bits()))
    } else {
        i128::from(mask(v, from.bits()))
    };
    let tb = to.bits();
    let (lo, hi) = if to.signed() {
        (-(1i128 << (tb - 1)), (1i128 << (tb - 1)) - 1)
    } else {
        (0, (1i128 << tb) - 1)
    };
    mask(x.clamp(lo, hi) as u64, tb)
}

/// `a + b` exactly, as the rounded sum and its error.
fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bb = s - a;
    (s, (a - (s - bb)) + (b - bb))
}

/// The exact value `hi + lo` (`hi` rounded to the nearest f64, `lo` the error)
/// rounded to `ty` in direction `r`.
fn round_to(hi: f64, lo: f64, ty: Ty, r: Round) -> u64 {
    // The nearest value, then one step if it lies on the wrong side.
    macro_rules! step {
        ($c:expr, $wide:expr) => {{
            let c = $c;
            // The sign of c - (hi + lo).
            let d = ($wide(c) - hi) - lo;
            match r {
                Round::Down if d > 0.0 => c.next_down(),
                Round::Up if d < 0.0 => c.next_up(),
                Round::Zero if hi > 0.0 && d > 0.0 => c.next_down(),
                Round::Zero if hi < 0.0 && d < 0.0 => c.next_up(),
                _ => c,
            }
        }};
    }
    match ty {
        Ty::F32 => f32b(step!(hi as f32, f64::from)),
        _ => step!(hi, |x: f64| x).to_bits(),
    }
}

/// `a + b`, `a - b`, `a * b` or `a * b + c` of floats of type `ty`, rounded in
/// direction `r` (`.rz`, `.rm`, `.rp`). Exact for f32, whose products and sums f64
/// holds with their errors; for an f64 `fma` the error is estimated, which can
/// miss where the sum cancels.
fn directed(op: Op, a: u64, b: u64, c: u64, ty: Ty, r: Round) -> u64 {
    let (a, b, c) = (fget(a, ty), fget(b, ty), fget(c, ty));
    let (hi, lo) = match op {
        Op::Add => two_sum(a, b),
        Op::Sub => two_sum(a, -b),
        Op::MulLo => {
            let p = a * b;
            (p, a.mul_add(b, -p))
        }
        _ => {
            let p = a * b;
            let (s, es) = two_sum(p, c);
            if ty == Ty::F32 {
                // The product of two f32 is exact in f64.
                (s, es)
            } else {
                let hi = a.mul_add(b, c);
                (hi, ((s - hi) + es) + a.mul_add(b, -p))
            }
        }
    };
    round_to(hi, lo, ty, r)
}

fn atomic(
    ctx: &mut Ctx<'_>,
    t: &mut Thread,
    inst: &Inst,
    space: Space,
    f: impl Fn(u64, u64, u64) -> u64,
) -> Result<(), PtxError> {
    let ty = inst.ty;
    let n = ty.size();
    let (dst, addr_op, rest) = match inst.op {
        Op::AtomAdd(_, false) | Op::AtomBits(_, _, false) | Op::AtomWrap(_, _, false) => {
            (None, &inst.ops[0], &inst.ops[1..])
        }
        _ => (Some(&inst.ops[0]), &inst.ops[1], &inst.ops[2..]),
    };
    let addr = ctx.address(t, addr_op)?;
    let mut buf = [0u8; 8];
    ctx.load(t, space, addr, &mut buf[..n])?;
    let old = u64::from_le_bytes(buf);
    let b = ctx.value(t, &rest[0])?;
    let c = match rest.get(1) {
        Some(o) => ctx.value(t, o)?,
        None => 0,
    };
    let new = f(old, b, c);
    ctx.store(t, space, addr, &new.to_le_bytes()[..n])?;
    if let Some(d) = dst {
        set(t, d, old)?;
    }
    Ok(())
}

/// What takes `.f16x2` operands: each half computed as `.f16`.
const HALF2_OPS: &[Op] = &[
    Op::Add,
    Op::Sub,
    Op::MulLo,
    Op::Fma,
    Op::Neg,
    Op::Abs,
    Op::Min,
    Op::Max,
];

fn step(ctx: &mut Ctx<'_>, t: &mut Thread, inst: &Inst) -> Result<(), PtxError> {
    let ty = inst.ty;
    let bits = ty.bits();
    let o = &inst.ops;
    let v = |ctx: &Ctx<'_>, t: &Thread, i: usize| -> Result<u64, PtxError> {
        ctx.value(
            t,
            o.get(i).ok_or_else(|| PtxError("missing operand".into()))?,
        )
    };
    if ty == Ty::F16x2 && HALF2_OPS.contains(&inst.op) {
        let n = match inst.op {
            Op::Fma => 3,
            Op::Neg | Op::Abs => 1,
            _ => 2,
        };
        let srcs = (1..=n)
            .map(|i| v(ctx, t, i))
            .collect::<Result<Vec<_>, _>>()?;
        let mut r = 0u64;
        for lane in 0..2 {
            let x: Vec<f64> = srcs
                .iter()
                .map(|s| fget((s >> (16 * lane)) & 0xffff, Ty::F16))
                .collect();
            let y = match inst.op {
                Op::Add => x[0] + x[1],
                Op::Sub => x[0] - x[1],
                Op::MulLo => x[0] * x[1],
                Op::Fma => x[0].mul_add(x[1], x[2]),
                Op::Neg => -x[0],
                Op::Abs => x[0].abs(),
                Op::Min => x[0].min(x[1]),
                _ => x[0].max(x[1]),
            };
            let mut h = fput(y, Ty::F16);
            if inst.sat {
                h = saturate_f(h, Ty::F16);
            }
            r |= h << (16 * lane);
        }
        return set(t, &o[0], r);
    }
    match inst.op {
        Op::Mov => match (&o[0], &o[1]) {
            // Packs parts into a wider register, low part first.
            (d, Operand::Vec(parts)) => {
                let w = bits / parts.len() as u32;
                let mut x = 0u64;
                for (i, p) in parts.iter().enumerate() {
                    x |= mask(ctx.value(t, p)?, w) << (w * i as u32);
                }
                set(t, d, x)?;
            }
            // Splits a register into parts (`_` drops one).
            (Operand::Vec(parts), src) => {
                let w = bits / parts.len() as u32;
                let x = ctx.value(t, src)?;
                for (i, p) in parts.iter().enumerate() {
                    if !matches!(p, Operand::Imm(_)) {
                        set(t, p, mask(x >> (w * i as u32), w))?;
                    }
                }
            }
            (d, _) => {
                let x = v(ctx, t, 1)?;
                set(t, d, x)?;
            }
        },
        Op::Tex {
            dims,
            ints,
            layered,
        } => {
            let h = v(ctx, t, 1)?;
            let tex = ctx
                .mem
                .texture(h)
                .ok_or_else(|| PtxError(format!("illegal address: no texture object {h:#x}")))?;
            let all = vector_values(ctx, t, &o[2], dims + usize::from(layered))?;
            let (layer, coords) = if layered {
                (Some(i64::from(all[0] as u32 as i32)), [all[1], all[2], 0])
            } else {
                (None, all)
            };
            let r = tex::fetch(&*ctx.mem, &tex, dims, coords, ints, ty.float(), layer)
                .map_err(PtxError)?;
            if let Operand::Vec(dsts) = &o[0] {
                for (d, x) in dsts.iter().zip(r) {
                    if matches!(d, Operand::Reg(_)) {
                        set(t, d, x)?;
                    }
                }
            }
        }
        Op::Suld { dims, clamp } | Op::Sust { dims, clamp } => {
            let h = v(ctx, t, 1)?;
            let surf = ctx
                .mem
                .surface(h)
                .ok_or_else(|| PtxError(format!("illegal address: no surface object {h:#x}")))?;
            let coords = vector_values(ctx, t, &o[2], dims)?;
            let n = ty.size();
            let values: Vec<Operand> = match &o[0] {
                Operand::Vec(v) => v.clone(),
                other => vec![other.clone()],
            };
            if values.len() != inst.vec {
                return err("vector width and operands disagree");
            }
            let at = tex::surface_at(&surf, dims, coords, n * inst.vec, clamp).map_err(PtxError)?;
            for (i, d) in values.iter().enumerate() {
                let addr = at.map(|a| a + (i * n) as u64);
                if let Op::Suld { .. } = inst.op {
                    let mut buf = [0u8; 8];
                    if let Some(a) = addr
                        && !ctx.mem.read(a, &mut buf[..n])
                    {
                        return err(format!("illegal address {a:#x} in a surface"));
                    }
                    set(t, d, u64::from_le_bytes(buf))?;
                } else if let Some(a) = addr {
                    let x = ctx.value(t, d)?;
                    if !ctx.mem.write(a, &x.to_le_bytes()[..n]) {
                        return err(format!("illegal address {a:#x} in a surface"));
                    }
                }
            }
        }
        Op::Ld(space) => {
            let addr = ctx.address(t, &o[1])?;
            let n = ty.size();
            let dsts: Vec<Operand> = match &o[0] {
                Operand::Vec(v) => v.clone(),
                other => vec![other.clone()],
            };
            if dsts.len() != inst.vec {
                return err("vector width and operands disagree");
            }
            for (i, d) in dsts.iter().enumerate() {
                let mut buf = [0u8; 8];
                ctx.load(t, space, addr + (i * n) as u64, &mut buf[..n])?;
                let raw = u64::from_le_bytes(buf);
                let x = if ty.signed() {
                    sext(raw, bits) as u64
                } else {
                    raw
                };
                set(t, d, x)?;
            }
        }
        Op::St(space) => {
            let addr = ctx.address(t, &o[0])?;
            let n = ty.size();
            let srcs: Vec<Operand> = match &o[1] {
                Operand::Vec(v) => v.clone(),
                other => vec![other.clone()],
            };
            for (i, s) in srcs.iter().enumerate() {
                let x = ctx.value(t, s)?;
                ctx.store(t, space, addr + (i * n) as u64, &x.to_le_bytes()[..n])?;
            }
        }
        Op::Cvta { to, space } => {
            let x = v(ctx, t, 1)?;
            let base = match space {
                Space::Shared => SHARED_BASE,
                Space::Local => LOCAL_BASE,
                _ => 0,
            };
            set(
                t,
                &o[0],
                if to {
                    x.wrapping_sub(base)
                } else {
                    x.wrapping_add(base)
                },
            )?;
        }
        Op::Cvt { dst, round_int } => {
            let x = v(ctx, t, 1)?;
            let from = inst.ty2;
            let mut r = convert(x, from, dst, round_int);
            if from == Ty::F64 && dst == Ty::F32 && inst.round != Round::Nearest {
                r = round_to(f64::from_bits(x), 0.0, Ty::F32, inst.round);
            }
            if inst.sat {
                r = if dst.float() {
                    saturate_f(r, dst)
                } else {
                    saturate_int(x, from, dst)
                };
            }
            set(t, &o[0], r)?;
        }
        Op::Add | Op::Sub | Op::MulLo | Op::Div | Op::Rem | Op::Min | Op::Max if ty.float() => {
            let (a, b) = (v(ctx, t, 1)?, v(ctx, t, 2)?);
            let r = match inst.op {
                Op::Add | Op::Sub | Op::MulLo if inst.round != Round::Nearest => {
                    directed(inst.op, a, b, 0, ty, inst.round)
                }
                Op::Add => fbin(a, b, ty, |x, y| x + y, |x, y| x + y),
                Op::Sub => fbin(a, b, ty, |x, y| x - y, |x, y| x - y),
                Op::MulLo => fbin(a, b, ty, |x, y| x * y, |x, y| x * y),
                Op::Div => fbin(a, b, ty, |x, y| x / y, |x, y| x / y),
                Op::Min => fbin(a, b, ty, f32::min, f64::min),
                Op::Max => fbin(a, b, ty, f32::max, f64::max),
                _ => return err("remainder of floats"),
            };
            set(t, &o[0], if inst.sat { saturate_f(r, ty) } else { r })?;
        }
        Op::Add | Op::Sub | Op::MulLo | Op::MulHi | Op::Div | Op::Rem | Op::Min | Op::Max => {
            let (a, b) = (v(ctx, t, 1)?, v(ctx, t, 2)?);
            let s = ty.signed();
            let (sa, sb) = (sext(a, bits), sext(b, bits));
            let (ua, ub) = (mask(a, bits), mask(b, bits));
            let r = match inst.op {
                // `.sat` (s32 only): clamped to the range.
                Op::Add | Op::Sub if inst.sat => {
                    let r = if inst.op == Op::Add { sa + sb } else { sa - sb };
                    r.clamp(i32::MIN.into(), i32::MAX.into()) as u64
                }
                Op::Add => a.wrapping_add(b),
                Op::Sub => a.wrapping_sub(b),
                Op::MulLo => a.wrapping_mul(b),
                Op::MulHi if s => ((i128::from(sa) * i128::from(sb)) >> bits) as u64,
                Op::MulHi => ((u128::from(ua) * u128::from(ub)) >> bits) as u64,
                // Division by zero gives all ones (unsigned) as on the device; no trap.
                Op::Div if ub == 0 => u64::MAX,
                Op::Div if s => sa.wrapping_div(sb) as u64,
                Op::Div => ua / ub,
                Op::Rem if ub == 0 => ua,
                Op::Rem if s => sa.wrapping_rem(sb) as u64,
                Op::Rem => ua % ub,
                Op::Min if s => sa.min(sb) as u64,
                Op::Min => ua.min(ub),
                Op::Max if s => sa.max(sb) as u64,
                _ => ua.max(ub),
            };
            set(t, &o[0], mask(r, bits))?;
        }
        Op::MulWide | Op::MadWide => {
            let (a, b) = (v(ctx, t, 1)?, v(ctx, t, 2)?);
            let p = if ty.signed() {
                (sext(a, bits).wrapping_mul(sext(b, bits))) as u64
            } else {
                mask(a, bits).wrapping_mul(mask(b, bits))
            };
            let r = if inst.op == Op::MadWide {
                p.wrapping_add(v(ctx, t, 3)?)
            } else {
                p
            };
            set(t, &o[0], r)?;
        }
        Op::MadLo | Op::MadHi | Op::Fma => {
            let (a, b, c) = (v(ctx, t, 1)?, v(ctx, t, 2)?, v(ctx, t, 3)?);
            let r = if ty.float() {
                let r = match ty {
                    _ if inst.round != Round::Nearest => directed(Op::Fma, a, b, c, ty, inst.round),
                    Ty::F32 => f32b(f32v(a).mul_add(f32v(b), f32v(c))),
                    Ty::F16 => fput(fget(a, ty).mul_add(fget(b, ty), fget(c, ty)), ty),
                    _ => f64::from_bits(a)
                        .mul_add(f64::from_bits(b), f64::from_bits(c))
                        .to_bits(),
                };
                if inst.sat { saturate_f(r, ty) } else { r }
            } else if inst.op == Op::MadHi {
                let hi = if ty.signed() {
                    ((i128::from(sext(a, bits)) * i128::from(sext(b, bits))) >> bits) as u64
                } else {
                    ((u128::from(mask(a, bits)) * u128::from(mask(b, bits))) >> bits) as u64
                };
                mask(hi.wrapping_add(c), bits)
            } else {
                mask(a.wrapping_mul(b).wrapping_add(c), bits)
            };
            set(t, &o[0], r)?;
        }
        Op::Neg | Op::Abs => {
            let a = v(ctx, t, 1)?;
            let r = match (inst.op, ty.float()) {
                (Op::Neg, true) => fput(-fget(a, ty), ty),
                (Op::Abs, true) => fput(fget(a, ty).abs(), ty),
                (Op::Neg, false) => mask((sext(a, bits)).wrapping_neg() as u64, bits),
                _ => mask(sext(a, bits).wrapping_abs() as u64, bits),
            };
            set(t, &o[0], r)?;
        }
        Op::And | Op::Or | Op::Xor => {
            let (a, b) = (v(ctx, t, 1)?, v(ctx, t, 2)?);
            let r = match inst.op {
                Op::And => a & b,
                Op::Or => a | b,
                _ => a ^ b,
            };
            set(t, &o[0], if ty == Ty::Pred { r & 1 } else { mask(r, bits) })?;
        }
        Op::Not => {
            let a = v(ctx, t, 1)?;
            set(
                t,
                &o[0],
                if ty == Ty::Pred {
                    (!a) & 1
                } else {
                    mask(!a, bits)
                },
            )?;
        }
        Op::Shl | Op::Shr => {
            let (a, b) = (v(ctx, t, 1)?, mask(v(ctx, t, 2)?, 32));
            let r = if inst.op == Op::Shl {
                if b >= u64::from(bits) { 0 } else { a << b }
            } else if ty.signed() {
                (sext(a, bits) >> b.min(63)) as u64
            } else if b >= u64::from(bits) {
                0
            } else {
                mask(a, bits) >> b
            };
            set(t, &o[0], mask(r, bits))?;
        }
        Op::Setp(cmp, bool_op) => {
            let (a, b) = (v(ctx, t, 1)?, v(ctx, t, 2)?);
            let mut r = if ty.float() {
                float_cmp(cmp, fget(a, ty), fget(b, ty))
            } else {
                int_cmp(cmp, a, b, ty)
            };
            if let Some(bo) = bool_op {
                let c = v(ctx, t, 3)? != 0;
                r = match bo {
                    BoolOp::And => r && c,
                    BoolOp::Or => r || c,
                    BoolOp::Xor => r ^ c,
                };
            }
            set(t, &o[0], u64::from(r))?;
        }
        Op::Selp => {
            let (a, b, c) = (v(ctx, t, 1)?, v(ctx, t, 2)?, v(ctx, t, 3)?);
            set(t, &o[0], if c != 0 { a } else { b })?;
        }
        Op::Bra => match o.first() {
            Some(Operand::Label(l)) => t.pc = *l,
            _ => return err("branch without a label"),
        },
        Op::Ret => t.state = ThreadState::Done,
        Op::Bar | Op::BarRed(_) => t.state = ThreadState::Barrier,
        Op::Sqrt | Op::Rsqrt | Op::Rcp | Op::Ex2 | Op::Lg2 | Op::Sin | Op::Cos => {
            let a = fget(v(ctx, t, 1)?, ty);
            let r = match inst.op {
                Op::Sqrt => a.sqrt(),
                Op::Rsqrt => 1.0 / a.sqrt(),
                Op::Rcp => 1.0 / a,
                Op::Ex2 => a.exp2(),
                Op::Lg2 => a.log2(),
                Op::Sin => a.sin(),
                _ => a.cos(),
            };
            let r = match (inst.op, ty) {
                // Correctly rounded in f32 where PTX asks for it.
                (Op::Sqrt, Ty::F32) => f32b(f32v(v(ctx, t, 1)?).sqrt()),
                (Op::Rcp, Ty::F32) => f32b(1.0 / f32v(v(ctx, t, 1)?)),
                _ => fput(r, ty),
            };
            set(t, &o[0], r)?;
        }
        Op::AtomAdd(space, _) => {
            let fl = ty;
            atomic(ctx, t, inst, space, move |old, b, _| match fl {
                Ty::F32 => f32b(f32v(old) + f32v(b)),
                Ty::F64 => (f64::from_bits(old) + f64::from_bits(b)).to_bits(),
                _ => old.wrapping_add(b),
            })?;
        }
        Op::AtomExch(space) => atomic(ctx, t, inst, space, |_, b, _| b)?,
        // `inc`: 0 once the old value reaches the operand; `dec`: the operand once
        // it is 0 or above it (PTX ISA, `atom`).
        Op::AtomWrap(space, up, _) => atomic(ctx, t, inst, space, move |old, b, _| {
            let (old, b) = (mask(old, bits), mask(b, bits));
            if up {
                if old >= b { 0 } else { old + 1 }
            } else if old == 0 || old > b {
                b
            } else {
                old - 1
            }
        })?,
        Op::AtomBits(space, how, _) => atomic(ctx, t, inst, space, move |old, b, _| match how {
            BoolOp::And => old & b,
            BoolOp::Or => old | b,
            BoolOp::Xor => old ^ b,
        })?,
        Op::AtomMin(space) | Op::AtomMax(space) => {
            let is_min = matches!(inst.op, Op::AtomMin(_));
            atomic(ctx, t, inst, space, move |old, b, _| {
                let less = if ty.signed() {
                    sext(b, bits) < sext(old, bits)
                } else {
                    mask(b, bits) < mask(old, bits)
                };
                if less == is_min { b } else { old }
            })?;
        }
        Op::AtomCas(space) => {
            atomic(ctx, t, inst, space, move |old, cmp, new| {
                if mask(old, bits) == mask(cmp, bits) {
                    new
                } else {
                    old
                }
            })?;
        }
        Op::AddC { cin, cout } | Op::SubC { cin, cout } => {
            let (a, b) = (
                u128::from(mask(v(ctx, t, 1)?, bits)),
                u128::from(mask(v(ctx, t, 2)?, bits)),
            );
            let c = u128::from(cin && t.carry);
            let (r, carry) = if matches!(inst.op, Op::AddC { .. }) {
                let sum = a + b + c;
                (sum, sum >> bits != 0)
            } else {
                (a.wrapping_sub(b + c), a < b + c)
            };
            if cout {
                t.carry = carry;
            }
            set(t, &o[0], mask(r as u64, bits))?;
        }
        Op::MadC { hi, cin, cout } => {
            let (a, b, c) = (v(ctx, t, 1)?, v(ctx, t, 2)?, v(ctx, t, 3)?);
            let part = match (hi, ty.signed()) {
                (true, true) => {
                    ((i128::from(sext(a, bits)) * i128::from(sext(b, bits))) >> bits) as u64
                }
                (true, false) => {
                    ((u128::from(mask(a, bits)) * u128::from(mask(b, bits))) >> bits) as u64
                }
                (false, _) => a.wrapping_mul(b),
            };
            let sum = u128::from(mask(part, bits))
                + u128::from(mask(c, bits))
                + u128::from(cin && t.carry);
            if cout {
                t.carry = sum >> bits != 0;
            }
            set(t, &o[0], mask(sum as u64, bits))?;
        }
        Op::CopySign => {
            let (a, b) = (v(ctx, t, 1)?, v(ctx, t, 2)?);
            let sign = 1u64 << (bits - 1);
            set(t, &o[0], mask((b & !sign) | (a & sign), bits))?;
        }
        Op::Brev => {
            let a = mask(v(ctx, t, 1)?, bits);
            set(t, &o[0], a.reverse_bits() >> (64 - bits))?;
        }
        Op::Bfind(shiftamt) => {
            let a = mask(v(ctx, t, 1)?, bits);
            // For a negative signed value the most significant 0 is sought.
            let a = if ty.signed() && a >> (bits - 1) != 0 {
                mask(!a, bits)
            } else {
                a
            };
            let r = if a == 0 {
                0xffff_ffff
            } else {
                let msb = u64::from(63 - a.leading_zeros());
                if shiftamt {
                    u64::from(bits - 1) - msb
                } else {
                    msb
                }
            };
            set(t, &o[0], r)?;
        }
        Op::Bfe => {
            let a = mask(v(ctx, t, 1)?, bits);
            let pos = v(ctx, t, 2)? & 0xff;
            let len = v(ctx, t, 3)? & 0xff;
            let msb = u64::from(bits - 1);
            let sign = ty.signed() && len != 0 && (a >> (pos + len - 1).min(msb)) & 1 != 0;
            let mut r = 0u64;
            for i in 0..=msb {
                let bit = if i < len && pos + i <= msb {
                    (a >> (pos + i)) & 1 != 0
                } else {
                    sign
                };
                r |= u64::from(bit) << i;
            }
            set(t, &o[0], r)?;
        }
        Op::Bfi => {
            let (a, b) = (v(ctx, t, 1)?, mask(v(ctx, t, 2)?, bits));
            let pos = v(ctx, t, 3)? & 0xff;
            let len = v(ctx, t, 4)? & 0xff;
            let mut r = b;
            for i in 0..len {
                if pos + i >= u64::from(bits) {
                    break;
                }
                let bit = (a >> i) & 1;
                r = (r & !(1 << (pos + i))) | (bit << (pos + i));
            }
            set(t, &o[0], r)?;
        }
        Op::Bmsk(clamp) => {
            let (a, b) = (v(ctx, t, 1)? as u32, v(ctx, t, 2)? as u32);
            let (a, b) = if clamp {
                (a.min(32), b.min(32))
            } else {
                (a & 31, b & 31)
            };
            let ones = if b >= 32 { u32::MAX } else { (1u32 << b) - 1 };
            let r = if a >= 32 { 0 } else { ones << a };
            set(t, &o[0], u64::from(r))?;
        }
        Op::Nop => {}
        Op::Trap => return err("the kernel executed `trap`"),
        // Resolved with the warp's other lanes (`resolve_warps`); the thread goes on
        // from the next instruction.
        Op::Warp(_) => t.state = ThreadState::Warp,
        Op::Popc => {
            let a = mask(v(ctx, t, 1)?, bits);
            set(t, &o[0], u64::from(a.count_ones()))?;
        }
        Op::Clz => {
            let a = mask(v(ctx, t, 1)?, bits);
            set(t, &o[0], u64::from(a.leading_zeros() - (64 - bits)))?;
        }
        Op::Call(ret) => {
            let param = |i: usize| -> Result<u64, PtxError> {
                let mut b = [0u8; 8];
                ctx.load(t, Space::Param, ctx.address(t, &o[i])?, &mut b)?;
                Ok(u64::from_le_bytes(b))
            };
            let (fmt, args) = (param(0)?, param(1)?);
            let status = ctx.vprintf(t, fmt, args)?;
            if ret {
                let at = ctx.address(t, &o[2])?;
                ctx.store(t, Space::Param, at, &status.to_le_bytes())?;
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// Device-side printf

/// The most arguments one `printf` prints; the conversions after them are printed as
/// written (CUDA Programming Guide, "Formatted Output": 32 beside the format).
const PRINTF_MAX_ARGS: i32 = 32;
/// The longest format `vprintf` reads.
const PRINTF_MAX_FORMAT: usize = 64 * 1024;

/// A context's `printf` FIFO: what its kernels printed, kept until the driver API
/// flushes it ([`PrintfFifo::take`]). Bounded like the driver's
/// (`CU_LIMIT_PRINTF_FIFO_SIZE`, 1 MiB unless set): the output of a `printf` that
/// does not fit in what is left is dropped whole, and counted; what came first is
/// kept. The driver's FIFO holds each call's format and arguments, unformatted; this
/// one holds the text, so the bound counts the bytes printed, not the driver's
/// records.
#[derive(Debug)]
pub struct PrintfFifo {
    text: Vec<u8>,
    capacity: usize,
    dropped: u64,
}

impl PrintfFifo {
    /// An empty FIFO of `capacity` bytes.
    pub fn new(capacity: usize) -> PrintfFifo {
        PrintfFifo {
            text: Vec::new(),
            capacity,
            dropped: 0,
        }
    }

    /// Sets its size (`cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE)`).
    pub fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity;
    }

    /// Bytes one more `printf` may add.
    pub fn room(&self) -> usize {
        self.capacity.saturating_sub(self.text.len())
    }

    /// Adds one `printf`'s output, or drops it whole if it does not fit (`false`).
    pub fn push(&mut self, text: &[u8]) -> bool {
        if text.len() > self.room() {
            self.dropped += 1;
            return false;
        }
        self.text.extend_from_slice(text);
        true
    }

    /// Takes what it holds, leaving it empty: the flush.
    pub fn take(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.text)
    }

    /// How many `printf` outputs were dropped for want of room.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

/// What one `vprintf` call printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Printed {
    /// The formatted bytes; empty when `dropped`.
    pub text: Vec<u8>,
    /// The number of arguments parsed: what `printf` returns.
    pub args: i32,
    /// Whether the output is longer than the room it had, and so dropped whole.
    pub dropped: bool,
}

impl Printed {
    /// Appends `bytes` if they fit in `room`; else the output is dropped.
    fn put(&mut self, bytes: &[u8], room: usize) {
        if self.dropped {
            return;
        }
        if self.text.len().saturating_add(bytes.len()) > room {
            self.drop_all();
            return;
        }
        self.text.extend_from_slice(bytes);
    }

    /// Drops the whole output.
    fn drop_all(&mut self) {
        self.dropped = true;
        self.text = Vec::new();
    }
}

/// Why a `vprintf` call printed nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrintfError {
    /// The format is a null pointer: `printf` returns -1 (Programming Guide).
    NullFormat,
    /// The format asks for what this executor does not format (`*` widths and
    /// precisions, `%n`, wide characters, `long double`): `printf` returns -2, the
    /// Programming Guide's "internal error".
    Unsupported(String),
    /// The format, an argument or a string lies where the thread cannot read: the
    /// kernel faults, as its own load from there would.
    Fault(String),
}

impl std::fmt::Display for PrintfError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PrintfError::NullFormat => f.write_str("vprintf: the format is a null pointer"),
            PrintfError::Unsupported(m) | PrintfError::Fault(m) => f.write_str(m),
        }
    }
}

/// Formats `vprintf(fmt, args)`, the call NVRTC makes of device-side `printf`, as
/// NVIDIA's driver prints it.
///
/// `fmt` is the generic address of a NUL-terminated format; `args` that of the
/// arguments, packed in order, each at the next multiple of its own size: `int`,
/// `unsigned`, `char` and `short` take 4 bytes; `long`, `long long`, `size_t`,
/// pointers, `%s` strings (a generic address of a NUL-terminated string) and `double`
/// (to which `float` is promoted) take 8. `args` may be null when the format takes
/// none. Each conversion is formatted by the C library's own `snprintf` with its
/// flags, width, precision and length, so the text is byte for byte what the host's C
/// library prints. `read` reads the calling thread's memory at a generic address. No
/// more than `room` bytes are made: beyond, the output is [`Printed::dropped`] (its
/// arguments are still parsed).
///
/// `printf` returns the number of arguments parsed, as the CUDA Programming Guide
/// says; the errors say what it returns instead ([`PrintfError`]).
pub fn format_vprintf(
    read: &dyn Fn(u64, &mut [u8]) -> bool,
    fmt: u64,
    args: u64,
    room: usize,
) -> Result<Printed, PrintfError> {
    if fmt == 0 {
        return Err(PrintfError::NullFormat);
    }
    let format = match read_cstr(read, fmt, PRINTF_MAX_FORMAT) {
        Ok((f, true)) => f,
        Ok((_, false)) => {
            return Err(PrintfError::Unsupported(format!(
                "the format at {fmt:#x} is longer than {PRINTF_MAX_FORMAT} bytes"
            )));
        }
        Err(at) => {
            return Err(PrintfError::Fault(format!(
                "vprintf: the format at {fmt:#x} runs to address {at:#x}, which cannot be read"
            )));
        }
    };
    let mut p = Printed {
        text: Vec::new(),
        args: 0,
        dropped: false,
    };
    // Offset of the next argument.
    let mut next = 0u64;
    let mut i = 0;
    while i < format.len() {
        if format[i] != b'%' {
            let end = format[i..]
                .iter()
                .position(|&c| c == b'%')
                .map_or(format.len(), |n| i + n);
            p.put(&format[i..end], room);
            i = end;
            continue;
        }
        let spec = parse_spec(&format[i..])?;
        let text = &format[i..i + spec.len];
        i += spec.len;
        let arg = match spec.conv {
            Conv::Verbatim => {
                p.put(text, room);
                continue;
            }
            Conv::Percent => CArg::None,
            _ if p.args >= PRINTF_MAX_ARGS => {
                p.put(text, room);
                continue;
            }
            Conv::Int { long } => {
                p.args += 1;
                let v = take_arg(read, args, &mut next, if long { 8 } else { 4 }, p.args)?;
                if long {
                    CArg::Long(v as c_long)
                } else {
                    CArg::Int(v as u32 as c_int)
                }
            }
            Conv::Double => {
                p.args += 1;
                CArg::Double(f64::from_bits(take_arg(read, args, &mut next, 8, p.args)?))
            }
            Conv::Ptr => {
                p.args += 1;
                CArg::Ptr(take_arg(read, args, &mut next, 8, p.args)? as usize as *const c_void)
            }
            Conv::Str => {
                p.args += 1;
                let at = take_arg(read, args, &mut next, 8, p.args)?;
                if at == 0 {
                    // The C library prints "(null)".
                    CArg::Str(None)
                } else {
                    // Never more than the precision asks for, nor than fits.
                    let max = spec
                        .precision
                        .unwrap_or(usize::MAX)
                        .min(room.saturating_add(1));
                    let (bytes, ended) = read_cstr(read, at, max).map_err(|bad| {
                        PrintfError::Fault(format!(
                            "vprintf: the string of argument {} runs to address {bad:#x}, \
                             which cannot be read",
                            p.args
                        ))
                    })?;
                    if !ended && spec.precision != Some(bytes.len()) {
                        p.drop_all();
                    }
                    // No NUL inside: `read_cstr` stops at the first.
                    CArg::Str(CString::new(bytes).ok())
                }
            }
        };
        // A width or a number's precision beyond the room cannot fit: the C library
        // is not asked to make that many bytes.
        let numeric = !matches!(spec.conv, Conv::Str | Conv::Percent);
        if spec.width > room || (numeric && spec.precision.unwrap_or(0) > room) {
            p.drop_all();
        }
        if p.dropped {
            continue;
        }
        p.put(&c_format(text, &arg)?, room);
    }
    Ok(p)
}

/// The bytes of the NUL-terminated string at `addr`, at most `max` of them, and
/// whether its NUL came within them; `Err` with the first address that cannot be
/// read.
fn read_cstr(
    read: &dyn Fn(u64, &mut [u8]) -> bool,
    addr: u64,
    max: usize,
) -> Result<(Vec<u8>, bool), u64> {
    let mut out = Vec::new();
    while out.len() < max {
        let at = addr.checked_add(out.len() as u64).ok_or(u64::MAX)?;
        let mut b = [0u8];
        if !read(at, &mut b) {
            return Err(at);
        }
        if b[0] == 0 {
            return Ok((out, true));
        }
        out.push(b[0]);
    }
    Ok((out, false))
}

/// Argument `n` of `size` bytes, at the next multiple of its size from `*next` in
/// the arguments at `args`; moves `*next` past it.
fn take_arg(
    read: &dyn Fn(u64, &mut [u8]) -> bool,
    args: u64,
    next: &mut u64,
    size: u64,
    n: i32,
) -> Result<u64, PrintfError> {
    let at = next.next_multiple_of(size);
    let mut b = [0u8; 8];
    match args.checked_add(at) {
        Some(addr) if read(addr, &mut b[..size as usize]) => {
            *next = at + size;
            Ok(u64::from_le_bytes(b))
        }
        _ => Err(PrintfError::Fault(format!(
            "vprintf: argument {n} at address {:#x} cannot be read (the format takes more \
             arguments than were passed?)",
            args.wrapping_add(at)
        ))),
    }
}

/// One conversion specification, `%[flags][width][.precision][length]conversion`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Spec {
    /// Its bytes in the format, `%` included.
    len: usize,
    conv: Conv,
    width: usize,
    precision: Option<usize>,
}

/// What a conversion takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Conv {
    /// `%%`: prints `%`, takes nothing.
    Percent,
    /// `d i o u x X c`: an integer of 8 bytes if `long`, else 4.
    Int { long: bool },
    /// `e E f F g G a A`: a `double`.
    Double,
    /// `s`: the generic address of a string.
    Str,
    /// `p`: a pointer.
    Ptr,
    /// No conversion the C library has (or the format ends inside it): printed as
    /// written, taking nothing.
    Verbatim,
}

/// Parses the specification at the start of `f` (which starts with `%`).
fn parse_spec(f: &[u8]) -> Result<Spec, PrintfError> {
    let at = |j: usize| f.get(j).copied();
    let digits = |j: &mut usize| {
        let mut v = 0usize;
        while let Some(d @ b'0'..=b'9') = at(*j) {
            v = v.saturating_mul(10).saturating_add(usize::from(d - b'0'));
            *j += 1;
        }
        v
    };
    let unsupported = |what: &str| {
        Err(PrintfError::Unsupported(format!(
            "{what} in `{}` are not supported",
            String::from_utf8_lossy(f)
        )))
    };
    let mut j = 1;
    while matches!(at(j), Some(b'-' | b'+' | b' ' | b'#' | b'0' | b'\'')) {
        j += 1;
    }
    if at(j) == Some(b'*') {
        return unsupported("`*` widths");
    }
    let width = digits(&mut j);
    let mut precision = None;
    if at(j) == Some(b'.') {
        j += 1;
        if at(j) == Some(b'*') {
            return unsupported("`*` precisions");
        }
        precision = Some(digits(&mut j));
    }
    let length_at = j;
    while matches!(at(j), Some(b'h' | b'l' | b'q' | b'L' | b'j' | b'z' | b't')) {
        j += 1;
    }
    let length = &f[length_at..j];
    let spec = |len, conv| Spec {
        len,
        conv,
        width,
        precision,
    };
    let Some(c) = at(j) else {
        return Ok(spec(j, Conv::Verbatim));
    };
    let long = matches!(length, b"l" | b"ll" | b"q" | b"j" | b"z" | b"t");
    let conv = match (c, length) {
        (b'%', _) => Conv::Percent,
        (b'd' | b'i' | b'o' | b'u' | b'x' | b'X', b"" | b"h" | b"hh") => Conv::Int { long: false },
        (b'd' | b'i' | b'o' | b'u' | b'x' | b'X', _) if long => Conv::Int { long: true },
        (b'c', b"") => Conv::Int { long: false },
        (b'e' | b'E' | b'f' | b'F' | b'g' | b'G' | b'a' | b'A', b"" | b"l") => Conv::Double,
        (b's', b"") => Conv::Str,
        (b'p', b"") => Conv::Ptr,
        (b'n', _) => return unsupported("`%n` conversions"),
        (b'C' | b'S', _) => return unsupported("wide characters"),
        (b'd' | b'i' | b'o' | b'u' | b'x' | b'X' | b'c' | b's' | b'p', _)
        | (b'e' | b'E' | b'f' | b'F' | b'g' | b'G' | b'a' | b'A', _) => {
            return unsupported("these lengths");
        }
        _ => Conv::Verbatim,
    };
    Ok(spec(j + 1, conv))
}

/// An argument of one conversion, of the C type its specification takes.
enum CArg {
    None,
    Int(c_int),
    Long(c_long),
    Double(f64),
    Ptr(*const c_void),
    /// NUL-terminated; `None` is a null pointer.
    Str(Option<CString>),
}

/// Formats one conversion specification (`%5.2f`) of `arg` with the C library's
/// `snprintf`.
fn c_format(spec: &[u8], arg: &CArg) -> Result<Vec<u8>, PrintfError> {
    let cannot = || {
        PrintfError::Unsupported(format!(
            "the C library cannot format `{}`",
            String::from_utf8_lossy(spec)
        ))
    };
    let spec = CString::new(spec).map_err(|_| cannot())?;
    let run = |buf: *mut c_char, len: usize| -> c_int {
        let s = spec.as_ptr();
        // SAFETY: `s` is a NUL-terminated specification of one conversion that takes
        // exactly one argument of `arg`'s C type, or none for `CArg::None` (`%%`):
        // `parse_spec` refuses `*` and `%n`, and makes `Conv::Verbatim`, never
        // formatted, of anything else, so `snprintf` reads only the argument passed and
        // writes only to `buf`. `buf` is null with `len` 0, or valid for `len` bytes.
        // A string is NUL-terminated and outlives the call, or null (printed
        // "(null)").
        unsafe {
            match arg {
                CArg::None => libc::snprintf(buf, len, s),
                CArg::Int(v) => libc::snprintf(buf, len, s, *v),
                CArg::Long(v) => libc::snprintf(buf, len, s, *v),
                CArg::Double(v) => libc::snprintf(buf, len, s, *v),
                CArg::Ptr(v) => libc::snprintf(buf, len, s, *v),
                CArg::Str(v) => libc::snprintf(
                    buf,
                    len,
                    s,
                    v.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
                ),
            }
        }
    };
    let n = usize::try_from(run(std::ptr::null_mut(), 0)).map_err(|_| cannot())?;
    let mut out = vec![0u8; n + 1];
    if usize::try_from(run(out.as_mut_ptr().cast(), out.len())) != Ok(n) {
        return Err(cannot());
    }
    out.truncate(n);
    Ok(out)
}

impl Ctx<'_> {
    /// Runs `vprintf(fmt, args)` for thread `t`: its output goes to the FIFO, or is
    /// dropped if the FIFO is full. Returns what `printf` returns: the number of
    /// arguments parsed (dropped or not), -1 for a null format, -2 for a format this
    /// executor does not format (which it names on its standard error). A format,
    /// argument or string it cannot read faults the kernel.
    fn vprintf(&mut self, t: &Thread, fmt: u64, args: u64) -> Result<i32, PtxError> {
        let room = self.printf.room();
        let read = |addr: u64, out: &mut [u8]| self.load(t, Space::Generic, addr, out).is_ok();
        match format_vprintf(&read, fmt, args, room) {
            Ok(p) => {
                if p.dropped {
                    self.printf.dropped += 1;
                } else {
                    self.printf.push(&p.text);
                }
                Ok(p.args)
            }
            Err(PrintfError::NullFormat) => Ok(-1),
            Err(PrintfError::Unsupported(why)) => {
                eprintln!(
                    "hira CPU test executor: kernel {}: printf: {why}",
                    self.kernel.name
                );
                Ok(-2)
            }
            Err(PrintfError::Fault(why)) => Err(PtxError(why)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Flat(Vec<u8>);

    impl DeviceMemory for Flat {
        fn read(&self, addr: u64, out: &mut [u8]) -> bool {
            let a = addr as usize;
            match a.checked_add(out.len()).and_then(|end| self.0.get(a..end)) {
                Some(s) => {
                    out.copy_from_slice(s);
                    true
                }
                None => false,
            }
        }
        fn write(&mut self, addr: u64, data: &[u8]) -> bool {
            let a = addr as usize;
            match a
                .checked_add(data.len())
                .and_then(|end| self.0.get_mut(a..end))
            {
                Some(s) => {
                    s.copy_from_slice(data);
                    true
                }
                None => false,
            }
        }
    }

    const SAXPY: &str = r#"
.version 8.8
.target sm_52
.address_size 64

.visible .entry saxpy(
	.param .u64 saxpy_param_0,
	.param .f32 saxpy_param_1,
	.param .u32 saxpy_param_2
)
{
	.reg .pred 	%p<2>;
	.reg .f32 	%f<4>;
	.reg .b32 	%r<6>;
	.reg .b64 	%rd<5>;

	ld.param.u64 	%rd1, [saxpy_param_0];
	ld.param.f32 	%f1, [saxpy_param_1];
	ld.param.u32 	%r2, [saxpy_param_2];
	mov.u32 	%r3, %ctaid.x;
	mov.u32 	%r4, %ntid.x;
	mov.u32 	%r5, %tid.x;
	mad.lo.s32 	%r1, %r3, %r4, %r5;
	setp.ge.s32 	%p1, %r1, %r2;
	@%p1 bra 	$L__BB0_2;

	cvta.to.global.u64 	%rd2, %rd1;
	mul.wide.s32 	%rd3, %r1, 4;
	add.s64 	%rd4, %rd2, %rd3;
	ld.global.f32 	%f2, [%rd4];
	fma.rn.f32 	%f3, %f2, %f1, 0f3F800000;
	st.global.f32 	[%rd4], %f3;

$L__BB0_2:
	ret;

}
"#;

    #[test]
    fn a_kernel_runs_over_its_grid_and_stops_at_the_bound() {
        let m = Module::parse(SAXPY).unwrap();
        let k = &m.kernels[0];
        assert_eq!(k.name, "saxpy");
        assert_eq!(
            k.params,
            vec![
                Param { offset: 0, size: 8 },
                Param { offset: 8, size: 4 },
                Param {
                    offset: 12,
                    size: 4
                }
            ]
        );
        let n = 37u32;
        let mut mem = Flat(vec![0; 4096]);
        for i in 0..64u32 {
            mem.0[256 + 4 * i as usize..][..4].copy_from_slice(&(i as f32).to_le_bytes());
        }
        let mut params = Vec::new();
        params.extend_from_slice(&256u64.to_le_bytes());
        params.extend_from_slice(&2.0f32.to_le_bytes());
        params.extend_from_slice(&n.to_le_bytes());
        let dims = Dims {
            grid: [3, 1, 1],
            block: [16, 1, 1],
        };
        launch(k, dims, 0, &params, &[], &mut mem, &mut PrintfFifo::new(0)).unwrap();
        for i in 0..64u32 {
            let got = f32::from_le_bytes(mem.0[256 + 4 * i as usize..][..4].try_into().unwrap());
            let want = if i < n {
                i as f32 * 2.0 + 1.0
            } else {
                i as f32
            };
            assert_eq!(got, want, "element {i}");
        }
    }

    /// nw's pattern: a 32-bit register holding a "negative" offset plus a positive
    /// displacement addresses shared memory modulo 2^32, as on a GPU; and atomic
    /// bit operations (huffman's).
    const WRAP_AND_OR: &str = r#"
.version 9.0
.target sm_75
.address_size 64
.visible .entry k(.param .u64 k_param_0)
{
	.reg .b32 	%r<6>;
	.reg .b64 	%rd<3>;
	.shared .align 4 .b8 buf[64];
	ld.param.u64 	%rd1, [k_param_0];
	cvta.to.global.u64 	%rd2, %rd1;
	mov.u32 	%r1, buf;
	mov.u32 	%r2, 77;
	st.shared.u32 	[%r1+8], %r2;
	add.s32 	%r3, %r1, -60;
	ld.shared.u32 	%r4, [%r3+68];
	st.global.u32 	[%rd2], %r4;
	mov.u32 	%r5, 6;
	red.global.or.b32 	[%rd2+4], %r5;
	atom.global.xor.b32 	%r5, [%rd2+4], 3;
	st.global.u32 	[%rd2+8], %r5;
	ret;
}
"#;

    #[test]
    fn a_32_bit_address_wraps_and_atomic_bit_operations_apply() {
        let m = Module::parse(WRAP_AND_OR).unwrap();
        let mut mem = Flat(vec![0; 64]);
        mem.0[4..8].copy_from_slice(&9u32.to_le_bytes());
        let dims = Dims {
            grid: [1, 1, 1],
            block: [1, 1, 1],
        };
        launch(
            &m.kernels[0],
            dims,
            0,
            &0u64.to_le_bytes(),
            &[],
            &mut mem,
            &mut PrintfFifo::new(0),
        )
        .unwrap();
        let word = |i: usize| u32::from_le_bytes(mem.0[4 * i..][..4].try_into().unwrap());
        assert_eq!(word(0), 77, "buf - 60 + 68 is buf + 8");
        assert_eq!(word(1), (9 | 6) ^ 3);
        assert_eq!(word(2), 9 | 6, "atom returns the old value");
    }

    /// `atom.inc` wraps at its operand; `%lanemask_lt` names the lanes below.
    const INC_AND_LANES: &str = r#"
.version 9.0
.target sm_75
.address_size 64
.visible .entry k(.param .u64 k_param_0)
{
	.reg .b32 	%r<4>;
	.reg .b64 	%rd<5>;
	ld.param.u64 	%rd1, [k_param_0];
	cvta.to.global.u64 	%rd2, %rd1;
	atom.global.inc.u32 	%r1, [%rd2], 2;
	mov.u32 	%r2, %tid.x;
	mov.u32 	%r3, %lanemask_lt;
	mul.wide.u32 	%rd3, %r2, 4;
	add.s64 	%rd4, %rd2, %rd3;
	st.global.u32 	[%rd4+4], %r3;
	ret;
}
"#;

    #[test]
    fn atomic_increments_wrap_and_lane_masks_name_the_lanes_below() {
        let m = Module::parse(INC_AND_LANES).unwrap();
        let mut mem = Flat(vec![0; 64]);
        let dims = Dims {
            grid: [1, 1, 1],
            block: [4, 1, 1],
        };
        launch(
            &m.kernels[0],
            dims,
            0,
            &0u64.to_le_bytes(),
            &[],
            &mut mem,
            &mut PrintfFifo::new(0),
        )
        .unwrap();
        let word = |i: usize| u32::from_le_bytes(mem.0[4 * i..][..4].try_into().unwrap());
        assert_eq!(word(0), 1, "0, 1, 2, wrapped to 0, then 1");
        assert_eq!([word(1), word(2), word(3), word(4)], [0, 0b1, 0b11, 0b111]);
    }

    #[test]
    fn an_access_outside_memory_is_an_illegal_address() {
        let m = Module::parse(SAXPY).unwrap();
        let mut mem = Flat(vec![0; 64]);
        let mut params = vec![0u8; 16];
        params[..8].copy_from_slice(&1_000_000u64.to_le_bytes());
        params[12..16].copy_from_slice(&4u32.to_le_bytes());
        let dims = Dims {
            grid: [1, 1, 1],
            block: [4, 1, 1],
        };
        let e = launch(
            &m.kernels[0],
            dims,
            0,
            &params,
            &[],
            &mut mem,
            &mut PrintfFifo::new(0),
        )
        .unwrap_err();
        assert!(e.0.contains("illegal address"), "{e}");
    }

    #[test]
    fn an_instruction_it_lacks_is_named_at_load() {
        let src = SAXPY.replace(
            "fma.rn.f32 \t%f3, %f2, %f1, 0f3F800000;",
            "vabsdiff4.u32.u32.u32.add %f3, %f2, %f1, %f1;",
        );
        let e = Module::parse(&src).unwrap_err();
        assert!(e.0.contains("vabsdiff4.u32.u32.u32.add"), "{e}");
    }

    /// Runs the first kernel of `m` in one block of `threads` threads, with
    /// parameters `out` (the address 256 of 4 KiB of memory) and `extra`; returns the
    /// memory.
    fn run_at_256(m: &Module, threads: u32, extra: &[u8], init: &[u8]) -> Vec<u8> {
        let mut mem = Flat(vec![0; 4096]);
        mem.0[256..256 + init.len()].copy_from_slice(init);
        let mut params = 256u64.to_le_bytes().to_vec();
        params.extend_from_slice(extra);
        let dims = Dims {
            grid: [1, 1, 1],
            block: [threads, 1, 1],
        };
        launch(
            &m.kernels[0],
            dims,
            0,
            &params,
            &[],
            &mut mem,
            &mut PrintfFifo::new(0),
        )
        .unwrap();
        mem.0
    }

    fn words(mem: &[u8], n: usize) -> Vec<i32> {
        (0..n)
            .map(|i| i32::from_le_bytes(mem[256 + 4 * i..][..4].try_into().unwrap()))
            .collect()
    }

    /// A kernel calls a function defined after it (declared before, as nvcc does),
    /// which returns early under a guard; a scope in the function declares a
    /// register of the name of one outside it, as libdevice's inline assembly does.
    const CALLS_LATER: &str = r#"
.version 9.0
.target sm_75
.address_size 64

.func  (.param .b32 func_retval0) addmul
(
	.param .b32 addmul_param_0,
	.param .b32 addmul_param_1
)
;

.visible .entry k(.param .u64 k_param_0)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<4>;
	.reg .b64 	%rd<5>;

	ld.param.u64 	%rd1, [k_param_0];
	cvta.to.global.u64 	%rd2, %rd1;
	mov.u32 	%r1, %tid.x;
	add.s32 	%r2, %r1, -2;
	{ // callseq 0, 0
	.reg .b32 temp_param_reg;
	.param .b32 param0;
	st.param.b32 	[param0+0], %r2;
	.param .b32 param1;
	st.param.b32 	[param1+0], 3;
	.param .b32 retval0;
	call.uni (retval0), 
	addmul, 
	(
	param0, 
	param1
	);
	ld.param.b32 	%r3, [retval0+0];
	} // callseq 0
	mul.wide.u32 	%rd3, %r1, 4;
	add.s64 	%rd4, %rd2, %rd3;
	st.global.u32 	[%rd4], %r3;
	ret;

}
.func  (.param .b32 func_retval0) addmul(
	.param .b32 addmul_param_0,
	.param .b32 addmul_param_1
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<5>;

	ld.param.u32 	%r1, [addmul_param_0];
	ld.param.u32 	%r2, [addmul_param_1];
	setp.lt.s32 	%p1, %r1, 0;
	mov.u32 	%r4, -1;
	st.param.b32 	[func_retval0+0], %r4;
	@%p1 ret;

	{
	.reg .b32 %r1;
	mul.lo.s32 	%r1, %r2, 100;
	mov.u32 	%r3, %r1;
	}
	mad.lo.s32 	%r4, %r1, %r2, %r3;
	st.param.b32 	[func_retval0+0], %r4;
	ret;

}
"#;

    #[test]
    fn a_call_of_a_function_defined_later_runs_its_body_and_returns_early_under_a_guard() {
        let m = Module::parse(CALLS_LATER).unwrap();
        let mem = run_at_256(&m, 8, &[], &[]);
        // a = tid - 2: -1 if a < 0, else a * 3 + 300 (the scope's %r1 is 300, the
        // function's %r1 still a, the kernel's %r1 still tid).
        let want: Vec<i32> = (0..8)
            .map(|t| if t < 2 { -1 } else { (t - 2) * 3 + 300 })
            .collect();
        assert_eq!(words(&mem, 8), want);
    }

    /// `outer` calls `inner` twice, through call parameters of the same names as the
    /// kernel's, and reads its own parameter again after; the kernel calls `inner`
    /// too, under a guard.
    const NESTED: &str = r#"
.version 9.0
.target sm_75
.address_size 64

.func  (.param .b32 func_retval0) inner(
	.param .b32 inner_param_0
)
{
	.reg .b32 	%r<3>;

	ld.param.u32 	%r1, [inner_param_0];
	mul.lo.s32 	%r2, %r1, %r1;
	st.param.b32 	[func_retval0+0], %r2;
	ret;

}
.func  (.param .b32 func_retval0) outer(
	.param .b32 outer_param_0
)
{
	.reg .b32 	%r<5>;

	ld.param.u32 	%r1, [outer_param_0];
	add.s32 	%r2, %r1, 1;
	{
	.param .b32 param0;
	st.param.b32 	[param0+0], %r2;
	.param .b32 retval0;
	call.uni (retval0), inner, (param0);
	ld.param.b32 	%r3, [retval0+0];
	}
	{
	.param .b32 param0;
	st.param.b32 	[param0+0], %r3;
	.param .b32 retval0;
	call.uni (retval0), inner, (param0);
	ld.param.b32 	%r4, [retval0+0];
	}
	ld.param.u32 	%r1, [outer_param_0];
	add.s32 	%r4, %r4, %r1;
	st.param.b32 	[func_retval0+0], %r4;
	ret.uni;

}
.visible .entry k(.param .u64 k_param_0)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<6>;
	.reg .b64 	%rd<5>;

	ld.param.u64 	%rd1, [k_param_0];
	cvta.to.global.u64 	%rd2, %rd1;
	mov.u32 	%r1, %tid.x;
	{
	.param .b32 param0;
	st.param.b32 	[param0+0], %r1;
	.param .b32 retval0;
	call.uni (retval0), outer, (param0);
	ld.param.b32 	%r2, [retval0+0];
	}
	setp.lt.u32 	%p1, %r1, 2;
	{
	.param .b32 param0;
	st.param.b32 	[param0+0], %r1;
	.param .b32 retval0;
	st.param.b32 	[retval0+0], 5;
	@%p1 call.uni (retval0), inner, (param0);
	ld.param.b32 	%r3, [retval0+0];
	}
	mad.lo.s32 	%r4, %r3, 1000, %r2;
	mul.wide.u32 	%rd3, %r1, 4;
	add.s64 	%rd4, %rd2, %rd3;
	st.global.u32 	[%rd4], %r4;
	ret;

}
"#;

    #[test]
    fn functions_that_call_functions_are_inlined_each_with_its_own_call_parameters() {
        let m = Module::parse(NESTED).unwrap();
        let mem = run_at_256(&m, 5, &[], &[]);
        let want: Vec<i32> = (0..5)
            .map(|t: i32| {
                let outer = (t + 1).pow(4) + t;
                let inner = if t < 2 { t * t } else { 5 };
                inner * 1000 + outer
            })
            .collect();
        assert_eq!(words(&mem, 5), want);
    }

    #[test]
    fn recursion_and_calls_through_pointers_are_refused_at_load_with_the_function_named() {
        // `inner` calls itself.
        let call_self = "mul.lo.s32 \t%r2, %r1, %r1;\n\t{\n\t.param .b32 param0;\n\t\
            st.param.b32 \t[param0+0], %r1;\n\t.param .b32 retval0;\n\t\
            call.uni (retval0), inner, (param0);\n\tld.param.b32 \t%r2, [retval0+0];\n\t}";
        let src = NESTED.replace("mul.lo.s32 \t%r2, %r1, %r1;", call_self);
        assert_ne!(src, NESTED);
        let e = Module::parse(&src).unwrap_err();
        assert!(e.0.contains("recursion is not supported"), "{e}");
        assert!(e.0.contains("`inner` calls itself"), "{e}");
        // `inner` calls `outer`, which calls `inner`.
        let src = NESTED.replace(
            "mul.lo.s32 \t%r2, %r1, %r1;",
            &call_self.replace("inner, (param0)", "outer, (param0)"),
        );
        let e = Module::parse(&src).unwrap_err();
        assert!(e.0.contains("`outer` calls itself"), "{e}");
        assert!(e.0.contains("(outer -> inner -> outer)"), "{e}");
        // A call through a register and a prototype.
        let src = NESTED.replace(
            "call.uni (retval0), outer, (param0);",
            "call.uni (retval0), %rd2, (param0), prototype_0;",
        );
        let e = Module::parse(&src).unwrap_err();
        assert!(e.0.contains("function pointer"), "{e}");
        assert!(e.0.contains("`%rd2`"), "{e}");
        // A function the module only declares.
        let src = format!(
            ".func (.param .b32 func_retval0) elsewhere(.param .b32 p);\n{}",
            NESTED.replace(
                "call.uni (retval0), outer,",
                "call.uni (retval0), elsewhere,"
            )
        );
        let e = Module::parse(&src).unwrap_err();
        assert!(e.0.contains("does not define"), "{e}");
        assert!(e.0.contains("`elsewhere`"), "{e}");
    }

    /// libdevice's multi-word arithmetic (carry chains, in scopes that declare
    /// registers of the kernel's names), `copysign`, `.sat` and directed rounding.
    const CARRY: &str = r#"
.version 9.0
.target sm_75
.address_size 64
.visible .entry k(.param .u64 k_param_0, .param .u64 k_param_1, .param .u64 k_param_2)
{
	.reg .b32 	%r<4>;
	.reg .f32 	%f<12>;
	.reg .b64 	%rd<12>;
	ld.param.u64 	%rd1, [k_param_0];
	ld.param.u64 	%rd2, [k_param_1];
	ld.param.u64 	%rd3, [k_param_2];
	mov.u32 	%r1, 7;
	{
	.reg .u32 %r0, %r1, %r2, %r3, %alo, %ahi, %blo, %bhi;
	mov.b64 	{%alo,%ahi}, %rd2;
	mov.b64 	{%blo,%bhi}, %rd3;
	mul.lo.u32 	%r0, %alo, %blo;
	mul.hi.u32 	%r1, %alo, %blo;
	mad.lo.cc.u32 	%r1, %alo, %bhi, %r1;
	madc.hi.u32 	%r2, %alo, %bhi, 0;
	mad.lo.cc.u32 	%r1, %ahi, %blo, %r1;
	madc.hi.cc.u32 	%r2, %ahi, %blo, %r2;
	madc.hi.u32 	%r3, %ahi, %bhi, 0;
	mad.lo.cc.u32 	%r2, %ahi, %bhi, %r2;
	addc.u32 	%r3, %r3, 0;
	mov.b64 	%rd4, {%r0,%r1};
	mov.b64 	%rd5, {%r2,%r3};
	}
	{
	.reg .u32 %r0, %r1, %r2, %r3, %a0, %a1, %a2, %a3, %b0, %b1, %b2, %b3;
	mov.b64 	{%a0,%a1}, %rd4;
	mov.b64 	{%a2,%a3}, %rd5;
	mov.b64 	{%b0,%b1}, %rd2;
	mov.b64 	{%b2,%b3}, %rd3;
	add.cc.u32 	%r0, %a0, %b0;
	addc.cc.u32 	%r1, %a1, %b1;
	addc.cc.u32 	%r2, %a2, %b2;
	addc.u32 	%r3, %a3, %b3;
	mov.b64 	%rd6, {%r0,%r1};
	mov.b64 	%rd7, {%r2,%r3};
	sub.cc.u32 	%r0, %a0, %b0;
	subc.cc.u32 	%r1, %a1, %b1;
	subc.cc.u32 	%r2, %a2, %b2;
	subc.u32 	%r3, %a3, %b3;
	mov.b64 	%rd8, {%r0,%r1};
	mov.b64 	%rd9, {%r2,%r3};
	}
	st.global.u64 	[%rd1], %rd4;
	st.global.u64 	[%rd1+8], %rd5;
	st.global.u64 	[%rd1+16], %rd6;
	st.global.u64 	[%rd1+24], %rd7;
	st.global.u64 	[%rd1+32], %rd8;
	st.global.u64 	[%rd1+40], %rd9;
	st.global.u32 	[%rd1+48], %r1;
	mov.f32 	%f1, 0fC0400000;
	mov.f32 	%f2, 0f3F800000;
	copysign.f32 	%f3, %f1, %f2;
	cvt.sat.f32.f32 	%f4, %f1;
	mov.f32 	%f5, 0f3FC00000;
	cvt.sat.f32.f32 	%f6, %f5;
	mov.f32 	%f7, 0f3EAAAAAB;
	fma.rz.f32 	%f8, %f7, 0f40400000, 0fC0000000;
	fma.rn.f32 	%f9, %f7, 0f40400000, 0fC0000000;
	add.rm.f32 	%f10, %f2, 0f33800000;
	add.rp.f32 	%f11, %f2, 0f33800000;
	st.global.v4.f32 	[%rd1+52], {%f3, %f4, %f6, %f8};
	st.global.v2.f32 	[%rd1+68], {%f9, %f10};
	st.global.f32 	[%rd1+76], %f11;
	add.sat.s32 	%r2, %r1, 2147483647;
	st.global.u32 	[%rd1+80], %r2;
	ret;
}
"#;

    #[test]
    fn carry_chains_copysign_saturation_and_directed_rounding_compute_as_ptx_says() {
        let m = Module::parse(CARRY).unwrap();
        let (a, b) = (0xFEDC_BA98_7654_3210u64, 0x8000_0001_FFFF_FFFFu64);
        let mut extra = a.to_le_bytes().to_vec();
        extra.extend_from_slice(&b.to_le_bytes());
        let mem = run_at_256(&m, 1, &extra, &[]);
        let u64_at = |o: usize| u64::from_le_bytes(mem[256 + o..][..8].try_into().unwrap());
        let f32_at = |o: usize| f32::from_le_bytes(mem[256 + o..][..4].try_into().unwrap());
        let p = u128::from(a) * u128::from(b);
        assert_eq!((u64_at(0), u64_at(8)), (p as u64, (p >> 64) as u64));
        let ab = (u128::from(b) << 64) | u128::from(a);
        let sum = p.wrapping_add(ab);
        assert_eq!((u64_at(16), u64_at(24)), (sum as u64, (sum >> 64) as u64));
        let diff = p.wrapping_sub(ab);
        assert_eq!((u64_at(32), u64_at(40)), (diff as u64, (diff >> 64) as u64));
        assert_eq!(u64_at(48) as u32, 7, "the scopes' %r1 is not the kernel's");
        assert_eq!(f32_at(52), -1.0, "copysign d, a, b: b with a's sign");
        assert_eq!(
            (f32_at(56), f32_at(60)),
            (0.0, 1.0),
            "cvt.sat clamps to [0, 1]"
        );
        // 3 * 0x3EAAAAAB - 2 is -1 + 2^-25, halfway between two floats: -1 to nearest
        // (even), -1 + 2^-24 toward zero.
        assert_eq!((f32_at(64), f32_at(68)), (-1.0f32.next_down(), -1.0));
        // 1 + 2^-24 is halfway: down to 1, up to 1 + 2^-23.
        assert_eq!((f32_at(72), f32_at(76)), (1.0, 1.0f32.next_up()));
        assert_eq!(u64_at(80) as u32 as i32, i32::MAX, "add.sat.s32 saturates");
    }

    /// Ulps between two doubles of the same sign.
    fn ulps(a: f64, b: f64) -> u64 {
        if a == b || (a.is_nan() && b.is_nan()) {
            return 0;
        }
        (a.to_bits() as i64).abs_diff(b.to_bits() as i64)
    }

    #[test]
    fn nvcc_double_pow_and_sin_run_through_libdevice_and_agree_with_the_c_library() {
        let m = Module::parse(include_str!("testdata/pow_sin.ptx")).unwrap();
        let k = &m.kernels[0];
        let mut xy: Vec<(f64, f64)> = vec![
            (2.0, 0.5),
            (0.0, 3.0),
            (-2.0, 3.0),
            (-8.0, 1.0 / 3.0),
            (1e-300, -2.0),
            (10.0, 308.0),
            (4.0, -1074.0 / 2.0),
            (1.0000001, 1e9),
            (1e10, 0.25),
            (1e22, 1.5),
            (-3e9, 2.0),
            (1e300, -1.0),
            (f64::INFINITY, 0.5),
            (f64::NAN, 0.0),
            (0.7, f64::NEG_INFINITY),
        ];
        // And values from a little generator: exponents of all sizes, arguments of
        // sin beyond 2^31, where libdevice takes its slow path.
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 11) as f64 / (1u64 << 53) as f64
        };
        for _ in 0..100 {
            let x = next() * 10f64.powf(next() * 40.0 - 10.0);
            let y = next() * 60.0 - 30.0;
            xy.push((x, y));
        }
        let n = xy.len();
        let (x0, y0, p0, s0) = (256, 256 + 8 * n, 256 + 16 * n, 256 + 24 * n);
        let mut mem = Flat(vec![0; s0 + 8 * n + 1024]);
        // The module's tables (of sin's coefficients, of 2/pi's bits) after the rest.
        let mut globals = Vec::new();
        let mut at = (s0 + 8 * n) as u64;
        for g in &m.globals {
            mem.write(at, &g.init);
            globals.push(at);
            at += g.size.next_multiple_of(16) as u64;
        }
        for (i, &(x, y)) in xy.iter().enumerate() {
            mem.0[x0 + 8 * i..][..8].copy_from_slice(&x.to_le_bytes());
            mem.0[y0 + 8 * i..][..8].copy_from_slice(&y.to_le_bytes());
        }
        let mut params = Vec::new();
        for a in [x0, y0, p0, s0] {
            params.extend_from_slice(&(a as u64).to_le_bytes());
        }
        params.extend_from_slice(&(n as u32).to_le_bytes());
        let dims = Dims {
            grid: [n.div_ceil(32) as u32, 1, 1],
            block: [32, 1, 1],
        };
        launch(
            k,
            dims,
            0,
            &params,
            &globals,
            &mut mem,
            &mut PrintfFifo::new(0),
        )
        .unwrap();
        let at = |o: usize| f64::from_le_bytes(mem.0[o..][..8].try_into().unwrap());
        for (i, &(x, y)) in xy.iter().enumerate() {
            let (p, s) = (at(p0 + 8 * i), at(s0 + 8 * i));
            // CUDA's pow and sin are within 2 ulps (Programming Guide, "Mathematical
            // Functions"); the C library's within 1.
            assert!(
                ulps(p, x.powf(y)) <= 2,
                "pow({x:e}, {y}) = {p:e}, not {:e}",
                x.powf(y)
            );
            assert!(
                ulps(s, x.sin()) <= 2,
                "sin({x:e}) = {s:e}, not {:e}",
                x.sin()
            );
        }
    }

    /// What NVRTC 12.9 emits for `tests/cuda/kernels.cu`'s `say` (`printf` with one
    /// conversion of each kind, its result stored), comments removed.
    const SAY: &str = "
.version 8.8
.target sm_52
.address_size 64

.extern .func  (.param .b32 func_retval0) vprintf
(
	.param .b64 vprintf_param_0,
	.param .b64 vprintf_param_1
)
;
.global .align 1 .b8 $str[59] = {116, 104, 114, 101, 97, 100, 32, 37, 100, 58, 32, 100, 61, 37, 100, 32, 117, 61, 37, 117, 32, 120, 61, 37, 120, 32, 102, 61, 37, 102, 32, 115, 61, 37, 115, 32, 99, 61, 37, 99, 32, 108, 100, 61, 37, 108, 100, 32, 119, 61, 91, 37, 53, 46, 50, 102, 93, 10};
.global .align 1 .b8 $str$1[4] = {108, 105, 116};

.visible .entry say(
	.param .u32 say_param_0,
	.param .u64 say_param_1
)
{
	.local .align 8 .b8 	__local_depot0[56];
	.reg .b64 	%SP;
	.reg .b64 	%SPL;
	.reg .pred 	%p<2>;
	.reg .f32 	%f<3>;
	.reg .b32 	%r<10>;
	.reg .f64 	%fd<4>;
	.reg .b64 	%rd<13>;


	mov.u64 	%SPL, __local_depot0;
	cvta.local.u64 	%SP, %SPL;
	ld.param.u32 	%r2, [say_param_0];
	ld.param.u64 	%rd1, [say_param_1];
	mov.u32 	%r1, %tid.x;
	setp.ge.s32 	%p1, %r1, %r2;
	@%p1 bra 	$L__BB0_2;

	cvta.to.global.u64 	%rd2, %rd1;
	cvt.rn.f32.s32 	%f1, %r1;
	mul.f32 	%f2, %f1, 0f3F000000;
	cvt.f64.f32 	%fd1, %f2;
	add.s32 	%r3, %r1, 1;
	cvt.s64.s32 	%rd3, %r3;
	mul.lo.s64 	%rd4, %rd3, -10000000000;
	cvt.rn.f64.s32 	%fd2, %r3;
	mul.f64 	%fd3, %fd2, 0d400921F9F01B866E;
	mul.lo.s32 	%r4, %r1, -7;
	add.u64 	%rd5, %SP, 0;
	add.u64 	%rd6, %SPL, 0;
	st.local.v2.u32 	[%rd6], {%r1, %r4};
	mov.u32 	%r5, -294967296;
	sub.s32 	%r6, %r5, %r1;
	add.s32 	%r7, %r1, 48879;
	st.local.v2.u32 	[%rd6+8], {%r6, %r7};
	st.local.f64 	[%rd6+16], %fd1;
	mov.u64 	%rd7, $str$1;
	cvta.global.u64 	%rd8, %rd7;
	st.local.u64 	[%rd6+24], %rd8;
	add.s32 	%r8, %r1, 65;
	st.local.u32 	[%rd6+32], %r8;
	st.local.u64 	[%rd6+40], %rd4;
	st.local.f64 	[%rd6+48], %fd3;
	mov.u64 	%rd9, $str;
	cvta.global.u64 	%rd10, %rd9;
	{
	.reg .b32 temp_param_reg;
	.param .b64 param0;
	st.param.b64 	[param0+0], %rd10;
	.param .b64 param1;
	st.param.b64 	[param1+0], %rd5;
	.param .b32 retval0;
	call.uni (retval0), 
	vprintf, 
	(
	param0, 
	param1
	);
	ld.param.b32 	%r9, [retval0+0];
	}
	mul.wide.s32 	%rd11, %r1, 4;
	add.s64 	%rd12, %rd2, %rd11;
	st.global.u32 	[%rd12], %r9;

$L__BB0_2:
	ret;

}
";

    /// The lines `say` prints for threads 0, 1 and 2.
    const SAID: &str = "\
thread 0: d=0 u=4000000000 x=beef f=0.000000 s=lit c=A ld=-10000000000 w=[ 3.14]
thread 1: d=-7 u=3999999999 x=bef0 f=0.500000 s=lit c=B ld=-20000000000 w=[ 6.28]
thread 2: d=-14 u=3999999998 x=bef1 f=1.000000 s=lit c=C ld=-30000000000 w=[ 9.42]
";

    /// Runs `say` in one block of 4 threads, 3 of which print, in 4 KiB of memory whose
    /// first bytes hold the module's strings; returns the FIFO and what each printing
    /// thread's `printf` returned.
    fn run_say(src: &str, fifo_size: usize) -> Result<(PrintfFifo, Vec<i32>), PtxError> {
        let m = Module::parse(src)?;
        let mut mem = Flat(vec![0; 4096]);
        let mut globals = Vec::new();
        let mut at = 64u64;
        for g in &m.globals {
            mem.write(at, &g.init);
            globals.push(at);
            at += g.size as u64;
        }
        let out = 1024u64;
        let mut params = Vec::new();
        params.extend_from_slice(&3u32.to_le_bytes());
        params.extend_from_slice(&[0; 4]);
        params.extend_from_slice(&out.to_le_bytes());
        let dims = Dims {
            grid: [1, 1, 1],
            block: [4, 1, 1],
        };
        let mut fifo = PrintfFifo::new(fifo_size);
        launch(
            &m.kernels[0],
            dims,
            0,
            &params,
            &globals,
            &mut mem,
            &mut fifo,
        )?;
        let returned = (0..3)
            .map(|i| {
                let a = out as usize + 4 * i;
                i32::from_le_bytes(mem.0[a..a + 4].try_into().unwrap())
            })
            .collect();
        Ok((fifo, returned))
    }

    #[test]
    fn a_kernels_printf_lines_go_to_the_fifo_and_printf_returns_the_arguments_parsed() {
        let (mut fifo, returned) = run_say(SAY, 1 << 20).unwrap();
        assert_eq!(String::from_utf8(fifo.take()).unwrap(), SAID);
        assert_eq!(returned, vec![9, 9, 9]);
        assert!(fifo.take().is_empty(), "a flush empties the FIFO");
    }

    #[test]
    fn a_full_fifo_keeps_the_first_lines_and_drops_the_rest_whole() {
        let first = SAID.lines().next().unwrap().len() + 1;
        let (mut fifo, _) = run_say(SAY, first + 10).unwrap();
        assert_eq!(
            String::from_utf8(fifo.take()).unwrap(),
            SAID.lines().next().unwrap().to_string() + "\n"
        );
        assert_eq!(fifo.dropped(), 2);
    }

    #[test]
    fn a_printf_whose_arguments_cannot_be_read_faults_the_kernel() {
        // The arguments' address is one no memory holds.
        let src = SAY.replace("[param1+0], %rd5;", "[param1+0], 3735879680;");
        let e = run_say(&src, 1 << 20).unwrap_err();
        assert!(
            e.0.contains("argument 1 at address 0xdead0000 cannot be read"),
            "{e}"
        );
    }

    #[test]
    fn a_call_of_any_function_but_vprintf_is_refused_at_load_with_the_callee_named() {
        let src = SAY.replace("\tvprintf, \n", "\thelper, \n");
        assert_ne!(src, SAY);
        let e = Module::parse(&src).unwrap_err();
        assert!(e.0.contains("calls are not supported"), "{e}");
        assert!(e.0.contains("`helper`"), "{e}");
        // An indirect call names the register it calls through.
        let src = SAY.replace("\tvprintf, \n", "\t%rd9, \n");
        let e = Module::parse(&src).unwrap_err();
        assert!(e.0.contains("`%rd9`"), "{e}");
    }

    #[test]
    fn vprintf_must_be_declared_to_be_called() {
        let src = SAY.replace(
            ".extern .func  (.param .b32 func_retval0) vprintf",
            ".extern .func  (.param .b32 func_retval0) other",
        );
        let e = Module::parse(&src).unwrap_err();
        assert!(e.0.contains("does not declare it"), "{e}");
    }

    /// Memory holding a format at 0x100, strings at 0x200 and packed arguments at
    /// 0x300, for `format_vprintf`.
    struct Packed {
        mem: Flat,
        next: usize,
    }

    const FMT: u64 = 0x100;
    const STR: u64 = 0x200;
    const ARGS: u64 = 0x300;

    impl Packed {
        fn new(fmt: &str) -> Packed {
            let mut mem = Flat(vec![0; 0x400]);
            mem.write(FMT, fmt.as_bytes());
            Packed { mem, next: 0 }
        }

        /// Packs an argument at the next multiple of its size.
        fn arg(mut self, bytes: &[u8]) -> Packed {
            self.next = self.next.next_multiple_of(bytes.len());
            self.mem.write(ARGS + self.next as u64, bytes);
            self.next += bytes.len();
            self
        }

        fn format(&self, fmt: u64, args: u64, room: usize) -> Result<Printed, PrintfError> {
            let read = |a: u64, out: &mut [u8]| self.mem.read(a, out);
            format_vprintf(&read, fmt, args, room)
        }

        fn text(&self) -> (String, i32) {
            let p = self.format(FMT, ARGS, 1 << 20).unwrap();
            assert!(!p.dropped);
            (String::from_utf8(p.text).unwrap(), p.args)
        }
    }

    #[test]
    fn vprintf_formats_each_conversion_byte_for_byte_as_the_c_library_does() {
        let mut p =
            Packed::new("d=%d u=%u x=%#x f=%f s=%s c=%c ld=%ld w=[%5.2f] %% [%-4d] %e %hhd\n")
                .arg(&(-7i32).to_le_bytes())
                .arg(&4_000_000_000u32.to_le_bytes())
                .arg(&255u32.to_le_bytes())
                .arg(&0.5f64.to_le_bytes())
                .arg(&STR.to_le_bytes())
                .arg(&u32::from(b'A').to_le_bytes())
                .arg(&(-10_000_000_000i64).to_le_bytes())
                .arg(&std::f64::consts::PI.to_le_bytes())
                .arg(&42i32.to_le_bytes())
                .arg(&1e-300f64.to_le_bytes())
                .arg(&300i32.to_le_bytes());
        p.mem.write(STR, b"lit\0");
        assert_eq!(
            p.text(),
            (
                "d=-7 u=4000000000 x=0xff f=0.500000 s=lit c=A ld=-10000000000 w=[ 3.14] % \
                 [42  ] 1.000000e-300 44\n"
                    .to_string(),
                11
            )
        );
    }

    #[test]
    fn vprintf_without_arguments_takes_a_null_argument_pointer() {
        let p = Packed::new("no arguments, 100%%\n");
        let out = p.format(FMT, 0, 1 << 20).unwrap();
        assert_eq!(out.text, b"no arguments, 100%\n");
        assert_eq!(out.args, 0);
    }

    #[test]
    fn a_null_string_prints_as_the_c_library_prints_it() {
        let mut p = Packed::new("[%s] [%.3s] [%.2s]")
            .arg(&0u64.to_le_bytes())
            .arg(&0u64.to_le_bytes())
            .arg(&STR.to_le_bytes());
        p.mem.write(STR, b"abcdef\0");
        // glibc prints "(null)", or nothing where the precision cuts it.
        assert_eq!(p.text(), ("[(null)] [] [ab]".to_string(), 3));
    }

    #[test]
    fn a_null_format_is_refused_as_printf_refuses_it() {
        let p = Packed::new("");
        assert_eq!(p.format(0, ARGS, 1 << 20), Err(PrintfError::NullFormat));
    }

    #[test]
    fn a_format_outside_memory_is_an_error_not_a_crash() {
        let p = Packed::new("");
        for fmt in [0xdead_0000, 0x400, u64::MAX] {
            match p.format(fmt, ARGS, 1 << 20) {
                Err(PrintfError::Fault(m)) => assert!(m.contains("cannot be read"), "{m}"),
                other => panic!("{fmt:#x}: {other:?}"),
            }
        }
    }

    #[test]
    fn arguments_past_the_end_of_memory_are_an_error_not_a_crash() {
        // Two conversions, and memory ends 4 bytes after the arguments start.
        let p = Packed::new("%d %d");
        match p.format(FMT, 0x400 - 4, 1 << 20) {
            Err(PrintfError::Fault(m)) => assert!(m.contains("argument 2 at address 0x400"), "{m}"),
            other => panic!("{other:?}"),
        }
        // A string that runs off the end of memory without its NUL.
        let mut p = Packed::new("%s").arg(&(0x400u64 - 3).to_le_bytes());
        p.mem.write(0x400 - 3, b"abc");
        match p.format(FMT, ARGS, 1 << 20) {
            Err(PrintfError::Fault(m)) => assert!(m.contains("string of argument 1"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn star_widths_and_percent_n_are_refused_cleanly() {
        for fmt in ["%*d", "%.*f", "%n", "%Lf", "%lc"] {
            let p = Packed::new(fmt).arg(&[0; 8]).arg(&[0; 8]);
            assert!(
                matches!(
                    p.format(FMT, ARGS, 1 << 20),
                    Err(PrintfError::Unsupported(_))
                ),
                "{fmt}"
            );
        }
    }

    #[test]
    fn conversions_past_the_thirty_second_argument_are_printed_as_written() {
        let fmt = "%d".repeat(33);
        let mut p = Packed::new(&fmt);
        for _ in 0..33 {
            p = p.arg(&1i32.to_le_bytes());
        }
        assert_eq!(p.text(), ("1".repeat(32) + "%d", 32));
    }

    #[test]
    fn unknown_conversions_are_printed_as_written_and_take_nothing() {
        let p = Packed::new("%y %d %").arg(&5i32.to_le_bytes());
        assert_eq!(p.text(), ("%y 5 %".to_string(), 1));
    }

    #[test]
    fn output_longer_than_the_room_is_dropped_whole_and_its_arguments_still_parsed() {
        let mut p = Packed::new("%s and %d")
            .arg(&STR.to_le_bytes())
            .arg(&7i32.to_le_bytes());
        p.mem.write(STR, b"a long string\0");
        let fits = p.format(FMT, ARGS, 19).unwrap();
        assert_eq!(
            (fits.text.as_slice(), fits.dropped),
            (&b"a long string and 7"[..], false)
        );
        let dropped = p.format(FMT, ARGS, 18).unwrap();
        assert_eq!(
            (dropped.text.len(), dropped.args, dropped.dropped),
            (0, 2, true)
        );
        // A width larger than the room is not even formatted.
        let p = Packed::new("%2000000000d").arg(&1i32.to_le_bytes());
        assert!(p.format(FMT, ARGS, 1 << 20).unwrap().dropped);
    }

    #[test]
    fn conversions_saturate_and_round_as_ptx_says() {
        assert_eq!(
            convert(f32b(-3.7), Ty::F32, Ty::S(32), Some(Round::Zero)),
            mask(-3i64 as u64, 32)
        );
        assert_eq!(
            convert(f32b(-3.7), Ty::F32, Ty::U(32), Some(Round::Zero)),
            0
        );
        assert_eq!(
            convert(f32b(2.5), Ty::F32, Ty::S(32), Some(Round::Nearest)),
            2
        );
        assert_eq!(convert(f32b(1e20), Ty::F32, Ty::S(32), None), 0x7FFF_FFFF);
        assert_eq!(convert(0xFFFF_FFFF, Ty::S(32), Ty::S(64), None), u64::MAX);
        assert_eq!(
            convert(0xFFFF_FFFF, Ty::U(32), Ty::U(64), None),
            0xFFFF_FFFF
        );
        assert_eq!(f32v(convert(5, Ty::S(64), Ty::F32, None)), 5.0);
    }
    /// Lanes 0-3 of an 8-thread block: lane 0 exits early; the others shuffle with a
    /// full member mask (exited lanes do not count), and a ballot sees the lanes that
    /// took part. Then lanes below 2 wait at `bar.warp.sync` for lane 3, which waits
    /// at `bar.sync`: that never completes, and the launch says so.
    const WARP: &str = r#"
.version 9.0
.target sm_75
.address_size 64
.visible .entry k(.param .u64 k_param_0, .param .u32 k_param_1)
{
	.reg .pred 	%p<4>;
	.reg .b32 	%r<8>;
	.reg .b64 	%rd<4>;
	ld.param.u64 	%rd1, [k_param_0];
	ld.param.u32 	%r6, [k_param_1];
	cvta.to.global.u64 	%rd2, %rd1;
	mov.u32 	%r1, %tid.x;
	setp.eq.s32 	%p1, %r1, 0;
	@%p1 bra 	$L__END;
	mul.lo.s32 	%r2, %r1, 10;
	shfl.sync.down.b32 	%r3|%p2, %r2, 1, 31, -1;
	setp.lt.u32 	%p3, %r1, 5;
	vote.sync.ballot.b32 	%r4, !%p3, -1;
	mul.wide.u32 	%rd3, %r1, 8;
	add.s64 	%rd3, %rd2, %rd3;
	st.global.u32 	[%rd3], %r3;
	st.global.u32 	[%rd3+4], %r4;
	setp.eq.s32 	%p1, %r6, 0;
	@%p1 bra 	$L__END;
	setp.eq.s32 	%p1, %r1, 3;
	@%p1 bra 	$L__BAR;
	bar.warp.sync 	-1;
	bra.uni 	$L__END;
$L__BAR:
	bar.sync 	0;
$L__END:
	ret;
}
"#;

    #[test]
    fn warp_collectives_wait_for_the_lanes_they_name_and_a_wait_that_cannot_end_fails() {
        let m = Module::parse(WARP).unwrap();
        let k = &m.kernels[0];
        let dims = Dims {
            grid: [1, 1, 1],
            block: [8, 1, 1],
        };
        let run = |hang: u32| {
            let mut mem = Flat(vec![0; 64]);
            let mut params = 0u64.to_le_bytes().to_vec();
            params.extend_from_slice(&hang.to_le_bytes());
            let r = launch(k, dims, 0, &params, &[], &mut mem, &mut PrintfFifo::new(0));
            (r, mem)
        };
        let (r, mem) = run(0);
        r.unwrap();
        let word = |i: usize| u32::from_le_bytes(mem.0[4 * i..][..4].try_into().unwrap());
        for lane in 1..8 {
            // Down by one: the next lane's value; lane 8 does not exist (0).
            let want = if lane < 7 { (lane + 1) * 10 } else { 0 };
            assert_eq!(word(2 * lane as usize), want, "shfl of lane {lane}");
            // Lanes 5, 6, 7 are not below 5; lane 0 exited.
            assert_eq!(
                word(2 * lane as usize + 1),
                0b1110_0000,
                "ballot of lane {lane}"
            );
        }
        let (r, _) = run(1);
        let e = r.unwrap_err();
        assert!(e.0.contains("never completed"), "{e:?}");
    }
    /// `redux.sync` over six lanes (an sm_80 instruction CUB's newest PTX uses), and
    /// `griddepcontrol`, which has nothing to wait for here.
    const REDUX: &str = r#"
.version 9.0
.target sm_90
.address_size 64
.visible .entry k(.param .u64 k_param_0)
{
	.reg .b32 	%r<8>;
	.reg .b64 	%rd<4>;
	griddepcontrol.wait;
	ld.param.u64 	%rd1, [k_param_0];
	mov.u32 	%r1, %tid.x;
	sub.s32 	%r2, %r1, 4;
	shl.b32 	%r3, 1, %r1;
	redux.sync.add.u32 	%r4, %r1, -1;
	redux.sync.min.s32 	%r5, %r2, -1;
	redux.sync.or.b32 	%r6, %r3, 63;
	setp.ne.s32 	%p1, %r1, 0;
	@%p1 bra 	$L__END;
	st.global.u32 	[%rd1], %r4;
	st.global.u32 	[%rd1+4], %r5;
	st.global.u32 	[%rd1+8], %r6;
$L__END:
	griddepcontrol.launch_dependents;
	ret;
}
"#;

    #[test]
    fn redux_reduces_over_the_lanes() {
        let src = REDUX.replace(
            ".reg .b32 \t%r<8>;",
            ".reg .b32 \t%r<8>;\n\t.reg .pred \t%p<2>;",
        );
        let m = Module::parse(&src).unwrap();
        let mut mem = Flat(vec![0; 16]);
        let dims = Dims {
            grid: [1, 1, 1],
            block: [6, 1, 1],
        };
        let params = 0u64.to_le_bytes();
        launch(
            &m.kernels[0],
            dims,
            0,
            &params,
            &[],
            &mut mem,
            &mut PrintfFifo::new(0),
        )
        .unwrap();
        let word = |i: usize| u32::from_le_bytes(mem.0[4 * i..][..4].try_into().unwrap());
        assert_eq!(word(0), 15, "0 + 1 + ... + 5");
        assert_eq!(word(1) as i32, -4);
        assert_eq!(word(2), 0b11_1111);
    }
}
