//! Parser for the API description format (see `protocol/api/opencl.api`).

use std::fmt;

/// A description that does not parse, with the line it starts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for ParseError {}

/// How one argument crosses the wire. See `docs/apigen.md`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Val,
    MemFlags,
    Blocking,
    Handle {
        kind: String,
        nullable: bool,
    },
    Retain(String),
    Release(String),
    Handles {
        kind: String,
        count: String,
    },
    WaitList(String),
    NewHandle(String),
    OutHandles {
        kind: String,
        count: String,
        owned: bool,
    },
    Err,
    In(String),
    /// Bytes of a transfer that the host copies without interpreting them.
    Data(String),
    HostPtr {
        flags: String,
        size: String,
        /// The object is a buffer of `size` bytes (the guest remembers its size).
        buffer: bool,
    },
    Out(String),
    OutVal,
    Str,
    Strs(String),
    Sources {
        count: String,
        lengths: String,
    },
    Binaries {
        count: String,
        lengths: String,
    },
    Lens,
    Arr(String),
    ZList,
    CtxProps,
    PartProps,
    /// An out-pointer the application must pass as null (an extension's feature
    /// Hira does not forward): anything else is `CL_INVALID_VALUE`.
    Null,
    Callback {
        kind: String,
        data: String,
    },
    CbData,
    /// A kernel argument value: the kernel, the argument index and the size argument.
    KernelArg {
        kernel: String,
        index: String,
        size: String,
    },
    ImageDesc,
    RectIn {
        origin: String,
        region: String,
        row_pitch: String,
        slice_pitch: String,
    },
    RectOut {
        origin: String,
        region: String,
        row_pitch: String,
        slice_pitch: String,
    },
    ImageIn {
        image: String,
        region: String,
        row_pitch: String,
        slice_pitch: String,
    },
    ImageOut {
        image: String,
        region: String,
        row_pitch: String,
        slice_pitch: String,
    },
    InfoSize,
    InfoVal,
    InfoRet,
    /// A CUDA stream: 0 and the two special handles pass as they are, others name a
    /// live stream.
    Stream,
    /// A module image (PTX text, cubin or fatbin) whose length the guest finds from
    /// its contents.
    ModuleImage,
    /// `kernelParams` of a launch of this function: one pointer per parameter, each
    /// to a value of the size the function's parameter layout gives.
    KernelParams(String),
    /// `extra` of a launch of this function: a parameter buffer and its size.
    KernelExtra(String),
    /// An out-pointer to a function the call looks up: the guest assigns its id and
    /// learns its parameter layout.
    NewFunction,
    /// An out-pointer to an object the host owns and may return again (a primary
    /// context): the host gives it a stable id.
    FoundHandle(String),
    /// An argument of a function the guest implements itself (`local`).
    Local,
    /// A device address the call reads or writes this many bytes at: the API server
    /// checks they lie in one of the context's allocations before the host call.
    DevicePtr(String),
}

/// One argument of a described function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arg {
    pub name: String,
    pub ctype: String,
    pub kind: Kind,
}

/// One described function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Func {
    pub opcode: u16,
    pub name: String,
    pub args: Vec<Arg>,
    pub ret: String,
    /// The object kind of a returned handle.
    pub rets: Option<String>,
    pub is_async: bool,
    pub cache: bool,
    pub custom: bool,
    pub local: bool,
    /// The guest checks the arguments first (`opencl/src/checks.rs`): it returns
    /// the native error code without a round trip, or asks for a synchronous call.
    pub check: bool,
    /// The call reports the failure of an earlier call forwarded without a reply
    /// (`clFinish`, `clWaitForEvents`).
    pub reports: bool,
    /// A large transfer may be streamed through the data window in chunks
    /// (`opencl/src/stream.rs`, one function named after the call).
    pub streams: bool,
    /// The guest may answer from what earlier replies told it (`opencl/src/known.rs`,
    /// one function named after the call).
    pub known: bool,
    /// A call of Hira's own, made by the guest shim and not an OpenCL entry point.
    pub internal: bool,
    /// CUDA: stream work that a capturing stream records into its graph instead
    /// (`cuda/src/graphs.rs`, one function named after the call).
    pub captured: bool,
    /// The call may wait for the device without a blocking-flag argument saying so.
    pub waits: bool,
    /// The command uses the device: the API server measures its device time and
    /// applies the VM's scheduling decision before it reaches the device. Needs
    /// `command_queue`, `num_events_in_wait_list`, `event_wait_list` and `event`.
    pub device: bool,
    /// The call changes the state of an existing object (its first handle argument)
    /// in a way a migrated session must have again: kernel arguments, program builds,
    /// user-event status, callbacks.
    pub configures: bool,
    /// The call runs in the calling thread's current context (CUDA): the guest sends
    /// its id first and the API server makes it current before the host call.
    pub current: bool,
    /// After a success the guest notes what the call made or ended
    /// (`cuda/src/notes.rs`, `opencl/src/notes.rs`: one function named after the call;
    /// for an OpenCL call that makes an object, the object comes first).
    pub noted: bool,
    /// On a failure the call's out-values are set to zero (a null handle), as the
    /// vendor's driver does; otherwise a failure leaves them as they were.
    pub clears: bool,
    /// An extension's entry point: applications get it from
    /// `clGetExtensionFunctionAddressForPlatform`, not the ICD dispatch table.
    pub ext: bool,
}

/// Splits at commas outside brackets.
fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    let mut prev = ' ';
    for ch in s.chars() {
        match ch {
            '(' | '[' => depth += 1,
            '<' => depth += 1,
            ')' | ']' => depth -= 1,
            '>' if prev != '-' => depth -= 1,
            _ => {}
        }
        if ch == ',' && depth == 0 {
            out.push(cur.trim().to_string());
            cur.clear();
        } else {
            cur.push(ch);
        }
        prev = ch;
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// Index of the `)` matching the `(` at `open`.
fn matching_paren(s: &str, open: usize) -> Option<usize> {
    let mut depth = 0;
    for (i, ch) in s.char_indices().skip_while(|(i, _)| *i < open) {
        match ch {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

fn parse_kind(text: &str) -> Result<Kind, String> {
    let text = text.trim();
    let (head, params) = match text.find('(') {
        Some(i) => {
            let close = matching_paren(text, i).ok_or("unbalanced parentheses in kind")?;
            (&text[..i], split_top(&text[i + 1..close]))
        }
        None => (text, Vec::new()),
    };
    let p = |i: usize| -> Result<String, String> {
        params
            .get(i)
            .cloned()
            .ok_or_else(|| format!("kind `{head}` needs parameter {}", i + 1))
    };
    let want = |n: usize| -> Result<(), String> {
        if params.len() == n {
            Ok(())
        } else {
            Err(format!(
                "kind `{head}` takes {n} parameters, got {}",
                params.len()
            ))
        }
    };
    let kind = match head {
        "val" => Kind::Val,
        "memflags" => Kind::MemFlags,
        "blocking" => Kind::Blocking,
        "h" | "h?" => {
            want(1)?;
            Kind::Handle {
                kind: p(0)?,
                nullable: head == "h?",
            }
        }
        "hret" => Kind::Retain(p(0)?),
        "hrel" => Kind::Release(p(0)?),
        "hs" => {
            want(2)?;
            Kind::Handles {
                kind: p(0)?,
                count: p(1)?,
            }
        }
        "wait" => Kind::WaitList(p(0)?),
        "newh" => Kind::NewHandle(p(0)?),
        "ouths" => {
            want(3)?;
            let owned = match p(2)?.as_str() {
                "owned" => true,
                "found" => false,
                other => {
                    return Err(format!(
                        "ouths ownership must be `owned` or `found`, not `{other}`"
                    ));
                }
            };
            Kind::OutHandles {
                kind: p(0)?,
                count: p(1)?,
                owned,
            }
        }
        "err" => Kind::Err,
        "in" => Kind::In(p(0)?),
        "data" => Kind::Data(p(0)?),
        "hostptr" | "bufhostptr" => {
            want(2)?;
            Kind::HostPtr {
                flags: p(0)?,
                size: p(1)?,
                buffer: head == "bufhostptr",
            }
        }
        "out" => Kind::Out(p(0)?),
        "outv" => Kind::OutVal,
        "str" => Kind::Str,
        "strs" => Kind::Strs(p(0)?),
        "srcs" => Kind::Sources {
            count: p(0)?,
            lengths: p(1)?,
        },
        "bins" => Kind::Binaries {
            count: p(0)?,
            lengths: p(1)?,
        },
        "lens" => Kind::Lens,
        "arr" => Kind::Arr(p(0)?),
        "zlist" => Kind::ZList,
        "ctxprops" => Kind::CtxProps,
        "partprops" => Kind::PartProps,
        "null" => Kind::Null,
        "cb" => Kind::Callback {
            kind: p(0)?,
            data: p(1)?,
        },
        "cbdata" => Kind::CbData,
        "kargs" => {
            want(3)?;
            Kind::KernelArg {
                kernel: p(0)?,
                index: p(1)?,
                size: p(2)?,
            }
        }
        "imgdesc" => Kind::ImageDesc,
        "rectin" | "rectout" | "imgin" | "imgout" => {
            want(4)?;
            let (a, region, row_pitch, slice_pitch) = (p(0)?, p(1)?, p(2)?, p(3)?);
            match head {
                "rectin" => Kind::RectIn {
                    origin: a,
                    region,
                    row_pitch,
                    slice_pitch,
                },
                "rectout" => Kind::RectOut {
                    origin: a,
                    region,
                    row_pitch,
                    slice_pitch,
                },
                "imgin" => Kind::ImageIn {
                    image: a,
                    region,
                    row_pitch,
                    slice_pitch,
                },
                _ => Kind::ImageOut {
                    image: a,
                    region,
                    row_pitch,
                    slice_pitch,
                },
            }
        }
        "info_size" => Kind::InfoSize,
        "info_val" => Kind::InfoVal,
        "info_ret" => Kind::InfoRet,
        "stream" => Kind::Stream,
        "image" => Kind::ModuleImage,
        "kparams" => Kind::KernelParams(p(0)?),
        "kextra" => Kind::KernelExtra(p(0)?),
        "newfunc" => Kind::NewFunction,
        "outh" => Kind::FoundHandle(p(0)?),
        "local" => Kind::Local,
        "dptr" => Kind::DevicePtr(p(0)?),
        other => return Err(format!("unknown argument kind `{other}`")),
    };
    Ok(kind)
}

fn parse_entry(text: &str) -> Result<Func, String> {
    let (opcode, rest) = text.split_once(' ').ok_or("missing opcode")?;
    let opcode: u16 = opcode
        .parse()
        .map_err(|_| format!("bad opcode `{opcode}`"))?;
    let open = rest.find('(').ok_or("missing argument list")?;
    let name = rest[..open].trim().to_string();
    let close = matching_paren(rest, open).ok_or("unbalanced argument list")?;
    let mut args = Vec::new();
    for a in split_top(&rest[open + 1..close]) {
        let (name_type, kind) = a
            .rsplit_once(" = ")
            .ok_or_else(|| format!("argument `{a}` has no `= kind`"))?;
        let (aname, ctype) = name_type
            .split_once(':')
            .ok_or_else(|| format!("argument `{a}` has no type"))?;
        args.push(Arg {
            name: aname.trim().to_string(),
            ctype: ctype.trim().to_string(),
            kind: parse_kind(kind)?,
        });
    }
    let tail = rest[close + 1..].trim();
    let (sig, flags) = match tail.split_once(';') {
        Some((s, f)) => (s.trim(), f.trim()),
        None => (tail, ""),
    };
    let sig = sig
        .strip_prefix("->")
        .ok_or("missing `-> return type`")?
        .trim();
    let (ret, rets) = match sig.split_once('=') {
        Some((r, k)) => {
            let k = k.trim();
            let inner = k
                .strip_prefix("rets(")
                .and_then(|k| k.strip_suffix(')'))
                .ok_or_else(|| format!("return kind `{k}` must be rets(Kind)"))?;
            (r.trim().to_string(), Some(inner.trim().to_string()))
        }
        None => (sig.to_string(), None),
    };
    let mut f = Func {
        opcode,
        name,
        args,
        ret,
        rets,
        is_async: false,
        cache: false,
        custom: false,
        local: false,
        check: false,
        reports: false,
        streams: false,
        known: false,
        internal: false,
        captured: false,
        waits: false,
        device: false,
        configures: false,
        current: false,
        noted: false,
        clears: false,
        ext: false,
    };
    for flag in flags.split_whitespace() {
        match flag {
            "async" => f.is_async = true,
            "cache" => f.cache = true,
            "custom" => f.custom = true,
            "local" => f.local = true,
            "check" => f.check = true,
            "reports" => f.reports = true,
            "streams" => f.streams = true,
            "known" => f.known = true,
            "internal" => f.internal = true,
            "captured" => f.captured = true,
            "waits" => f.waits = true,
            "device" => f.device = true,
            "configures" => f.configures = true,
            "current" => f.current = true,
            "noted" => f.noted = true,
            "clears" => f.clears = true,
            "ext" => f.ext = true,
            other => return Err(format!("unknown flag `{other}`")),
        }
    }
    if f.device {
        for needed in [
            "command_queue",
            "num_events_in_wait_list",
            "event_wait_list",
            "event",
        ] {
            if !f.args.iter().any(|a| a.name == needed) {
                return Err(format!("a `device` command needs an argument `{needed}`"));
            }
        }
    }
    if f.local != (f.opcode == 0) {
        return Err("local functions, and only they, have opcode 0".into());
    }
    Ok(f)
}

/// What a description's first line says of its API: `api NAME NUMBER`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The API's name (`OpenCL`).
    pub name: String,
    /// Its number in the `Hello` (`hira_protocol::handshake::ApiId`), never 0.
    pub id: u8,
}

fn parse_header(line: usize, text: &str) -> Result<Header, ParseError> {
    let err = |message: String| ParseError { line, message };
    let words: Vec<&str> = text.split_whitespace().collect();
    match words.as_slice() {
        ["api", name, id] => {
            let id: u8 = id
                .parse()
                .map_err(|_| err(format!("API number {id:?} is not a number from 1 to 255")))?;
            if id == 0 {
                return Err(err("API number 0 names no API".into()));
            }
            Ok(Header {
                name: (*name).to_string(),
                id,
            })
        }
        _ => Err(err(format!(
            "a description starts with `api NAME NUMBER`, not {text:?}"
        ))),
    }
}

/// Parses a whole description: its header, then its functions.
pub fn parse(text: &str) -> Result<(Header, Vec<Func>), ParseError> {
    let mut entries: Vec<(usize, String)> = Vec::new();
    let mut header = None;
    for (i, line) in text.lines().enumerate() {
        let stripped = line.trim();
        if stripped.is_empty() || stripped.starts_with('#') {
            continue;
        }
        if header.is_none() {
            header = Some(parse_header(i + 1, stripped)?);
            continue;
        }
        if line.starts_with(char::is_whitespace) {
            let last = entries.last_mut().ok_or(ParseError {
                line: i + 1,
                message: "continuation line before any entry".into(),
            })?;
            last.1.push(' ');
            last.1.push_str(stripped);
        } else {
            entries.push((i + 1, stripped.to_string()));
        }
    }
    let mut funcs: Vec<Func> = Vec::new();
    for (line, text) in entries {
        let f = parse_entry(&text).map_err(|message| ParseError { line, message })?;
        if f.opcode != 0 && funcs.iter().any(|g| g.opcode == f.opcode) {
            return Err(ParseError {
                line,
                message: format!("opcode {} used twice", f.opcode),
            });
        }
        if funcs.iter().any(|g| g.name == f.name) {
            return Err(ParseError {
                line,
                message: format!("{} described twice", f.name),
            });
        }
        funcs.push(f);
    }
    let header = header.ok_or(ParseError {
        line: 0,
        message: "empty description: no `api NAME NUMBER` line".into(),
    })?;
    Ok((header, funcs))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `body` under a header, returning its functions.
    fn funcs(body: &str) -> Result<Vec<Func>, ParseError> {
        parse(&format!("api Test 9\n{body}")).map(|(_, f)| f)
    }

    #[test]
    fn continuation_lines_join_the_entry() {
        let f =
            funcs("3 clX(a: cl_uint = val,\n    b: cl_mem = h?(Mem)) -> cl_int ; async cache\n")
                .unwrap();
        assert_eq!(f.len(), 1);
        assert_eq!(
            f[0].args[1].kind,
            Kind::Handle {
                kind: "Mem".into(),
                nullable: true
            }
        );
        assert!(f[0].is_async && f[0].cache);
    }

    #[test]
    fn callback_types_with_nested_parentheses_parse() {
        let f = funcs("4 clY(p: Option<unsafe extern \"C\" fn(a: cl_int, b: *mut c_void)> = cb(Event, d), d: *mut c_void = cbdata) -> cl_int\n").unwrap();
        assert_eq!(f[0].args.len(), 2);
        assert_eq!(
            f[0].args[0].kind,
            Kind::Callback {
                kind: "Event".into(),
                data: "d".into()
            }
        );
    }

    #[test]
    fn duplicate_opcode_is_rejected() {
        let e = funcs("1 a() -> cl_int\n1 b() -> cl_int\n").unwrap_err();
        assert_eq!(e.line, 3);
    }

    #[test]
    fn unknown_kind_names_itself() {
        let e = funcs("1 a(x: cl_uint = bogus) -> cl_int\n").unwrap_err();
        assert!(e.message.contains("bogus"));
    }

    #[test]
    fn returned_handle_kind_is_recorded() {
        let f = funcs("2 clCreateUserEvent(context: cl_context = h(Context), errcode_ret: *mut cl_int = err) -> cl_event = rets(Event)\n").unwrap();
        assert_eq!(f[0].rets.as_deref(), Some("Event"));
    }

    #[test]
    fn the_header_names_the_api_and_its_number() {
        let (h, f) = parse("# comment\napi OpenCL 1\n1 a() -> cl_int\n").unwrap();
        assert_eq!((h.name.as_str(), h.id, f.len()), ("OpenCL", 1, 1));
        assert!(
            parse("1 a() -> cl_int\n")
                .unwrap_err()
                .message
                .contains("api NAME NUMBER")
        );
        assert!(parse("api X 0\n").unwrap_err().message.contains("0"));
        assert!(parse("api X 256\n").is_err());
        assert!(parse("").is_err());
    }
}
