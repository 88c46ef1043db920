#!/usr/bin/env python3
"""Writes the table cuGetProcAddress answers from (apis/cuda-private/data/versions.txt).

Input: CUDA's cudaTypedefs.h, which declares one PFN_<name>_v<version>[_ptds|_ptsz]
typedef per variant of each driver entry point, <version> being the CUDA version
that introduced it. Output: one line per variant, `name version pt symbol`, where pt
is `-` or the per-thread-stream suffix and symbol is the exported function: the
first variant of a name is exported as the name itself, the k-th later one with
`_v<k+1>` (cuMemAlloc v2000 -> cuMemAlloc, v3020 -> cuMemAlloc_v2), and a
per-thread variant as the newest default-stream variant of its version with the
suffix (cuMemcpyHtoD v7000 _ptds -> cuMemcpyHtoD_v2_ptds).

Usage: versions.py cudaTypedefs.h [cudaGLTypedefs.h ...] > versions.txt
"""
import re
import sys
from collections import defaultdict

pat = re.compile(r"\*PFN_(cu\w+?)_v(\d+)(_ptds|_ptsz)?\)")
variants = defaultdict(set)
for line in (l for f in sys.argv[1:] for l in open(f)):
    m = pat.search(line)
    if m:
        variants[m.group(1)].add((int(m.group(2)), m.group(3) or "-"))

print("# name version per-thread symbol; from the CUDA 13.0 cuda*Typedefs.h by tools/cuda-trace/versions.py")
for name in sorted(variants):
    plain = sorted(v for v, pt in variants[name] if pt == "-")
    sym = {v: name if k == 0 else f"{name}_v{k + 1}" for k, v in enumerate(plain)}
    for v, pt in sorted(variants[name]):
        if pt == "-":
            print(name, v, pt, sym[v])
        else:
            base = max((p for p in plain if p <= v), default=None)
            print(name, v, pt, (sym[base] if base else name) + pt)
