#!/usr/bin/env python3
"""Writes stubs.S: one exported entry point per function the real libcuda exports.

Each stub counts its calls and jumps to the real function with every register as
the caller left it, so the trace needs no signatures. The functions trace.c
defines itself (the entry-point and export-table lookups) are skipped here.

Usage: gen.py SYMBOLS_FILE > stubs.S   (SYMBOLS_FILE: one name per line)
"""
import sys

OWN = {"cuGetProcAddress", "cuGetProcAddress_v2", "cuGetExportTable"}
SLOTS = 1024  # trampolines for export-table slots, handed out by trace.c

names = [n.strip() for n in open(sys.argv[1]) if n.strip() and n.strip() not in OWN]
out = [".text"]
for i, n in enumerate(names):
    out += [
        f".globl {n}",
        f".type {n},@function",
        f"{n}:",
        f"  lock incq trace_fn_calls+{8 * i}(%rip)",
        f"  jmp *trace_fn_real+{8 * i}(%rip)",
    ]
for k in range(SLOTS):
    out += [
        f".globl trace_slot_stub{k}",
        f".hidden trace_slot_stub{k}",
        f"trace_slot_stub{k}:",
        f"  lock incq trace_slot_calls+{8 * k}(%rip)",
        f"  jmp *trace_slot_real+{8 * k}(%rip)",
    ]
HIDDEN = ["trace_fn_names", "trace_slot_stubs", "trace_fn_stubs", "trace_fn_calls",
          "trace_fn_real", "trace_slot_calls", "trace_slot_real"]
out += [f".hidden {h}" for h in HIDDEN]
out += [".data", ".globl trace_fn_names", ".align 8", "trace_fn_names:"]
out += [f"  .quad .Lname{i}" for i in range(len(names))]
out += ["  .quad 0", ".globl trace_slot_stubs", "trace_slot_stubs:"]
out += [f"  .quad trace_slot_stub{k}" for k in range(SLOTS)]
out += [".globl trace_fn_stubs", "trace_fn_stubs:"]
out += [f"  .quad {n}" for n in names]
out += [".section .rodata"]
out += [f'.Lname{i}: .asciz "{n}"' for i, n in enumerate(names)]
out += [".bss", ".align 8", ".globl trace_fn_calls", "trace_fn_calls:", f"  .zero {8 * max(1, len(names))}",
        ".globl trace_fn_real", "trace_fn_real:", f"  .zero {8 * max(1, len(names))}",
        ".globl trace_slot_calls", "trace_slot_calls:", f"  .zero {8 * SLOTS}",
        ".globl trace_slot_real", "trace_slot_real:", f"  .zero {8 * SLOTS}",
        '.section .note.GNU-stack,"",@progbits']
print("\n".join(out))
print(f"#define TRACE_SLOTS {SLOTS}", file=open("slots.h", "w"))
