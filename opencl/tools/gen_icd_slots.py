#!/usr/bin/env python3
"""Regenerates opencl/src/icd_slots.rs from an opencl-sys source tree.

Usage: gen_icd_slots.py OPENCL_SYS_SRC_DIR > opencl/src/icd_slots.rs
"""
import glob
import re
import sys

src = sys.argv[1]
icd = open(f"{src}/cl_icd.rs").read()
body = icd[icd.index("pub struct _cl_icd_dispatch"):]
body = body[: body.index("\n}\n")]
lines = body.split("\n")
fields = []
i = 0
while i < len(lines):
    line = lines[i].strip()
    if line.startswith("#[cfg("):
        # Keep the variant used without CL_HAS_ANON_UNION / CL_VERSION_3_1.
        if "not(" in line:
            m = re.match(r"pub (\w+):\s*(\w+)", lines[i + 1].strip())
            fields.append((m.group(1), m.group(2)))
        i += 2
        continue
    m = re.match(r"pub (\w+):\s*(\w+)", line)
    if m:
        fields.append((m.group(1), m.group(2)))
    i += 1

types = "".join(open(f).read() for f in glob.glob(f"{src}/*.rs"))


def signature(t):
    pat = r"pub type " + re.escape(t) + r'\s*=\s*Option<\s*unsafe extern "C" fn\((.*?)\)\s*(->\s*([^,>]+(?:<[^>]*>)?))?\s*,?\s*>;'
    m = re.search(pat, types, re.S)
    if not m:
        return None
    depth, names, cur = 0, [], ""
    for ch in m.group(1):
        if ch in "(<":
            depth += 1
        if ch in ")>":
            depth -= 1
        if ch == "," and depth == 0:
            names.append(cur)
            cur = ""
        else:
            cur += ch
    names.append(cur)
    return [n.strip() for n in names if n.strip()], (m.group(3) or "").strip()


print("// Generated once from opencl-sys 0.6.5 `cl_icd.rs` and `cl_function_types.rs` by")
print("// `opencl/tools/gen_icd_slots.py`. Do not edit by hand.")
print("//")
print("// One row per slot of `_cl_icd_dispatch`, in order: the function's name, whether it")
print("// returns a pointer (and so must return NULL when unsupported), and the index of its")
print("// `errcode_ret` argument if it has one.")
print()
print("/// A slot of the ICD dispatch table.")
print("pub(crate) struct Slot {")
print("    pub name: &'static str,")
print("    pub returns_pointer: bool,")
print("    pub errcode_arg: Option<usize>,")
print("}")
print()
print(f"pub(crate) const SLOT_COUNT: usize = {len(fields)};")
print()
print("pub(crate) const SLOTS: [Slot; SLOT_COUNT] = [")
for name, t in fields:
    sig = signature(t)
    returns_pointer, errcode = False, None
    if sig is not None:
        args, ret = sig
        returns_pointer = ret not in ("", "cl_int")
        for k, a in enumerate(args):
            if a.startswith("errcode_ret"):
                errcode = k
    err = f"Some({errcode})" if errcode is not None else "None"
    print(f'    Slot {{ name: "{name}", returns_pointer: {str(returns_pointer).lower()}, errcode_arg: {err} }},')
print("];")
