#!/bin/sh
# Builds the tracing libcuda.so.1 against the real driver $1 into directory $2.
set -e
real=$1 out=$2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
nm -D --defined-only "$real" | awk '$2 == "T" { print $3 }' | sed 's/@.*//' | sort -u > "$out/symbols"
(cd "$out" && python3 "$here/gen.py" symbols > stubs.S)
gcc -O1 -shared -fPIC -o "$out/libcuda.so.1" -I "$out" "$here/trace.c" "$out/stubs.S" -ldl -lpthread \
    -Wl,-soname,libcuda.so.1
ln -sf libcuda.so.1 "$out/libcuda.so"
