#!/usr/bin/env bash
# Lists every function of the CUDA driver API that a libcuda.so.1 exports, from
# cuda.h: the names programs built with the header link against (after its
# versioning macros) and the older unversioned names binaries built before link
# against. Writes driver-api.txt; guest-shim-cuda's build exports a function for
# each (CUDA_ERROR_NOT_SUPPORTED where Hira does not remote it).
#   tools/driver-api.sh [path/to/cuda.h]   (default: target/cuda-sdk's, from scripts/test)
set -euo pipefail
cd "$(dirname "$0")/.."
h=${1:-../target/cuda-sdk/nvidia/cuda_runtime/include/cuda.h}
version=$(sed -n 's/^#define CUDA_VERSION \([0-9]*\).*/\1/p' "$h")
{
    echo "# CUDA driver API entry points of cuda.h (CUDA_VERSION $version), by tools/driver-api.sh."
    {
        gcc -E -P -x c "$h" | tr '\n' ' ' | grep -oE "CUresult +[a-zA-Z0-9_]+ *\(" | sed -E 's/CUresult +//; s/ *\(//'
        grep -oE "^CUresult CUDAAPI [a-zA-Z0-9_]+" "$h" | awk '{print $3}'
    } | sort -u
} > driver-api.txt
