#!/usr/bin/env bash
# Lists every function of the CUDA driver API that a libcuda.so.1 exports, from
# cuda.h: the names programs built with the header link against (after its
# versioning macros) and the older unversioned names binaries built before link
# against. Writes driver-api.txt; cuda's build exports a function for
# each (CUDA_ERROR_NOT_SUPPORTED where Hira does not remote it).
# Several headers give the union: a library serves programs built with any of them.
#   tools/driver-api.sh [path/to/cuda.h ...]   (default: target/cuda-sdk's 12.9 and
#   target/nvcc13's 13.0, from scripts/test)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -eq 0 ]; then
    set -- ../target/cuda-sdk/nvidia/cuda_runtime/include/cuda.h ../target/nvcc13/root/nvidia/cu13/include/cuda.h
fi
versions=$(for h in "$@"; do sed -n 's/^#define CUDA_VERSION \([0-9]*\).*/\1/p' "$h"; done | paste -sd, -)
{
    echo "# CUDA driver API entry points of cuda.h (CUDA_VERSION $versions), by tools/driver-api.sh."
    for h in "$@"; do
        gcc -E -P -x c "$h" | tr '\n' ' ' | grep -oE "CUresult +[a-zA-Z0-9_]+ *\(" | sed -E 's/CUresult +//; s/ *\(//'
        grep -oE "^CUresult CUDAAPI [a-zA-Z0-9_]+" "$h" | awk '{print $3}'
    done | sort -u
} > driver-api.txt
