//! A PTX interpreter: parses the PTX that NVRTC emits for Hira's test kernels and
//! runs a grid on the CPU, block by block, each thread until a barrier.
//!
//! It implements the instructions those kernels use (integer and floating-point
//! arithmetic, comparisons, conversions, loads and stores in every state space,
//! atomic adds, barriers, branches); anything else is refused when the module loads,
//! with the instruction named, so a test fails with a reason instead of computing
//! something else. Written for this repository because the one PTX interpreter crate
//! (`ptoxide` 0.1) does not parse what NVRTC 12 emits (`shr`, `selp`, `atom`,
//! module-scope variables with initialisers) and has not been maintained since.
//! Warp-level instructions (`shfl`, `vote`) and calls are not supported.

use std::collections::HashMap;

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
            "pred" => Ty::Pred,
            _ => return None,
        })
    }

    /// Size in bytes.
    pub fn size(self) -> usize {
        match self {
            Ty::U(b) | Ty::S(b) | Ty::B(b) => usize::from(b / 8),
            Ty::F32 => 4,
            Ty::F64 => 8,
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
        matches!(self, Ty::F32 | Ty::F64)
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
    Cvta { to: bool, space: Space },
    Cvt { dst: Ty, round_int: Option<Round> },
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
    Popc,
    Clz,
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
}

/// Generic addresses of the shared and local windows (global addresses are below).
const SHARED_BASE: u64 = 0xFE00_0000_0000_0000;
const LOCAL_BASE: u64 = 0xFF00_0000_0000_0000;
const WINDOW: u64 = 1 << 40;

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
            _ => v as u64,
        });
    }
    if t.contains('.') || t.contains('e') {
        let f: f64 = t.parse().ok()?;
        return Some(match ty {
            Ty::F32 => u64::from((f as f32).to_bits()),
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

struct FuncBuilder {
    regs: HashMap<String, usize>,
    nregs: usize,
    syms: HashMap<String, usize>,
    symbols: Vec<Symbol>,
    labels: HashMap<String, usize>,
    shared: usize,
    local: usize,
}

impl FuncBuilder {
    fn reg(&self, name: &str) -> Result<usize, PtxError> {
        self.regs
            .get(name)
            .copied()
            .ok_or_else(|| PtxError(format!("undeclared register {name}")))
    }

    fn declare_regs(&mut self, spec: &str) -> Result<(), PtxError> {
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
        Ok(())
    }

    fn symbol(&mut self, name: &str, s: Symbol) {
        self.syms.insert(name.to_string(), self.symbols.len());
        self.symbols.push(s);
    }
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

impl Module {
    /// Parses PTX text.
    pub fn parse(src: &str) -> Result<Module, PtxError> {
        let text = strip_comments(src);
        let mut module = Module {
            kernels: Vec::new(),
            globals: Vec::new(),
        };
        let mut global_syms: HashMap<String, usize> = HashMap::new();
        let mut shared: Vec<SharedDecl> = Vec::new();
        let mut rest = text.as_str();
        loop {
            rest = rest.trim_start();
            if rest.is_empty() {
                break;
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
            if is_func {
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
                let body = &rest[head_end + 1..end];
                // A `= { ... }` initialiser of a variable is not a function.
                if head.ends_with('=') {
                    let stmt_end = rest[end..].find(';').map_or(end + 1, |i| end + i + 1);
                    let stmt = rest[..stmt_end - 1].to_string();
                    module.global_var(&stmt, &mut global_syms, &mut shared)?;
                    rest = &rest[stmt_end..];
                    continue;
                }
                if head.contains(".entry") {
                    let k = parse_kernel(&head, body, &global_syms, &shared)?;
                    module.kernels.push(k);
                } else if head.contains(".func") {
                    // Device functions are kept out: calls are not supported, and an
                    // unused one (NVRTC leaves none at -O3 unless asked) is harmless.
                } else {
                    return err(format!("unexpected block after {head:?}"));
                }
                rest = &rest[end + 1..];
            } else {
                let words: Vec<&str> = head.split_whitespace().collect();
                match words.first().copied() {
                    Some(".version" | ".target" | ".address_size" | ".file" | ".pragma") => {}
                    Some(_)
                        if head.contains(".global")
                            || head.contains(".const")
                            || head.contains(".shared") =>
                    {
                        module.global_var(&head, &mut global_syms, &mut shared)?;
                    }
                    Some(_) if head.contains(".func") || head.contains(".entry") => {
                        // A declaration (prototype) only.
                    }
                    _ => return err(format!("unsupported PTX directive: {head}")),
                }
                rest = &rest[head_end + 1..];
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

fn parse_kernel(
    head: &str,
    body: &str,
    globals: &HashMap<String, usize>,
    module_shared: &[SharedDecl],
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
        syms: HashMap::new(),
        symbols: Vec::new(),
        labels: HashMap::new(),
        shared: 0,
        local: 0,
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
    // Statements: split at ';' and labels.
    let mut stmts: Vec<String> = Vec::new();
    // Scope braces stand on lines of their own; braces inside a line are vector
    // operands. Declarations in a scope are kept for the whole function.
    let body: String = body
        .lines()
        .filter(|l| !matches!(l.trim(), "{" | "}"))
        .collect::<Vec<_>>()
        .join("\n");
    for piece in body.split(';') {
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
                let spec = s.split_whitespace().skip(2).collect::<Vec<_>>().join(" ");
                f.declare_regs(&spec)?;
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
            ".loc" | ".pragma" | ".maxntid" | ".reqntid" | ".minnctapersm" | ".maxnreg" => {}
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
        symbols: f.symbols,
        code,
    })
}

fn parse_operand(f: &FuncBuilder, s: &str, ty: Ty) -> Result<Operand, PtxError> {
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
            return Ok(Operand::RegAddr(f.reg(base)?, off));
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

fn parse_inst(f: &FuncBuilder, s: &str) -> Result<Inst, PtxError> {
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
        "bar" | "barrier" if has("sync") || mods.is_empty() => Op::Bar,
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
    let mut ops = Vec::new();
    for o in split_top(operands, ',') {
        // `setp` writes `p|q`: only `p` is kept (q is the complement, rarely used).
        let o = o.split('|').next().unwrap_or("").to_string();
        let oty = match op {
            Op::Cvt { .. } if !ops.is_empty() => ty2,
            _ => ty,
        };
        ops.push(parse_operand(f, &o, oty)?);
    }
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
        ops,
        text: s.to_string(),
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
    tid: [u32; 3],
    state: ThreadState,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum ThreadState {
    Running,
    Barrier,
    Done,
}

struct Ctx<'a> {
    kernel: &'a Kernel,
    params: &'a [u8],
    globals: &'a [u64],
    shared: Vec<u8>,
    mem: &'a mut dyn DeviceMemory,
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
/// the bytes of dynamic shared memory.
pub fn launch(
    kernel: &Kernel,
    dims: Dims,
    dynamic: usize,
    params: &[u8],
    globals: &[u64],
    mem: &mut dyn DeviceMemory,
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
        // Every thread still running has reached the barrier: release them.
        for t in threads.iter_mut() {
            if t.state == ThreadState::Barrier {
                t.state = ThreadState::Running;
            }
        }
    }
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
        u64::from(match s {
            Special::Tid(i) => t.tid[i],
            Special::Ntid(i) => self.dims.block[i],
            Special::Ctaid(i) => self.ctaid[i],
            Special::Nctaid(i) => self.dims.grid[i],
            Special::LaneId => {
                let b = self.dims.block;
                (t.tid[0] + b[0] * (t.tid[1] + b[1] * t.tid[2])) % 32
            }
            Special::WarpSize => 32,
        })
    }

    /// The address a symbol stands for, in its own space.
    fn sym_addr(&self, i: usize) -> u64 {
        match self.kernel.symbols[i] {
            Symbol::Param(o) | Symbol::Shared(o) | Symbol::Local(o) => o as u64,
            Symbol::Global(g) => self.globals[g],
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
        let mut slice = |buf: &[u8], what: &str| -> Result<(), PtxError> {
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
            Space::Shared => slice(&self.shared, "shared"),
            Space::Local => slice(&t.local, "local"),
            Space::Param => slice(self.params, "parameter"),
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
        let put = |buf: &mut [u8], what: &str| -> Result<(), PtxError> {
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
            Space::Shared => put(&mut self.shared, "shared"),
            Space::Local => put(&mut t.local, "local"),
            Space::Param => err("stores to the parameter space are not supported"),
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
        _ => f64::from_bits(v),
    }
}

fn fput(f: f64, ty: Ty) -> u64 {
    match ty {
        Ty::F32 => f32b(f as f32),
        _ => f.to_bits(),
    }
}

/// A binary float operation done in the operand's own precision.
fn fbin(a: u64, b: u64, ty: Ty, f32op: fn(f32, f32) -> f32, f64op: fn(f64, f64) -> f64) -> u64 {
    match ty {
        Ty::F32 => f32b(f32op(f32v(a), f32v(b))),
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
        Op::AtomAdd(_, false) => (None, &inst.ops[0], &inst.ops[1..]),
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
            set(t, &o[0], convert(x, inst.ty2, dst, round_int))?;
        }
        Op::Add | Op::Sub | Op::MulLo | Op::Div | Op::Rem | Op::Min | Op::Max if ty.float() => {
            let (a, b) = (v(ctx, t, 1)?, v(ctx, t, 2)?);
            let r = match inst.op {
                Op::Add => fbin(a, b, ty, |x, y| x + y, |x, y| x + y),
                Op::Sub => fbin(a, b, ty, |x, y| x - y, |x, y| x - y),
                Op::MulLo => fbin(a, b, ty, |x, y| x * y, |x, y| x * y),
                Op::Div => fbin(a, b, ty, |x, y| x / y, |x, y| x / y),
                Op::Min => fbin(a, b, ty, f32::min, f64::min),
                Op::Max => fbin(a, b, ty, f32::max, f64::max),
                _ => return err("remainder of floats"),
            };
            set(t, &o[0], r)?;
        }
        Op::Add | Op::Sub | Op::MulLo | Op::MulHi | Op::Div | Op::Rem | Op::Min | Op::Max => {
            let (a, b) = (v(ctx, t, 1)?, v(ctx, t, 2)?);
            let s = ty.signed();
            let (sa, sb) = (sext(a, bits), sext(b, bits));
            let (ua, ub) = (mask(a, bits), mask(b, bits));
            let r = match inst.op {
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
                match ty {
                    Ty::F32 => f32b(f32v(a).mul_add(f32v(b), f32v(c))),
                    _ => f64::from_bits(a)
                        .mul_add(f64::from_bits(b), f64::from_bits(c))
                        .to_bits(),
                }
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
        Op::Bar => t.state = ThreadState::Barrier,
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
        Op::Popc => {
            let a = mask(v(ctx, t, 1)?, bits);
            set(t, &o[0], u64::from(a.count_ones()))?;
        }
        Op::Clz => {
            let a = mask(v(ctx, t, 1)?, bits);
            set(t, &o[0], u64::from(a.leading_zeros() - (64 - bits)))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Flat(Vec<u8>);

    impl DeviceMemory for Flat {
        fn read(&self, addr: u64, out: &mut [u8]) -> bool {
            let a = addr as usize;
            match self.0.get(a..a + out.len()) {
                Some(s) => {
                    out.copy_from_slice(s);
                    true
                }
                None => false,
            }
        }
        fn write(&mut self, addr: u64, data: &[u8]) -> bool {
            let a = addr as usize;
            match self.0.get_mut(a..a + data.len()) {
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
        launch(k, dims, 0, &params, &[], &mut mem).unwrap();
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
        let e = launch(&m.kernels[0], dims, 0, &params, &[], &mut mem).unwrap_err();
        assert!(e.0.contains("illegal address"), "{e}");
    }

    #[test]
    fn an_instruction_it_lacks_is_named_at_load() {
        let src = SAXPY.replace(
            "fma.rn.f32 \t%f3, %f2, %f1, 0f3F800000;",
            "shfl.sync.bfly.b32 %f3, %f2, 1, 31, -1;",
        );
        let e = Module::parse(&src).unwrap_err();
        assert!(e.0.contains("shfl.sync.bfly.b32"), "{e}");
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
}
