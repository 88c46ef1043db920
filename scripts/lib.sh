# Shared by the scripts in this directory.

# Installs the Debian packages Hira's build, tests and demo need, if missing (cmake:
# the metadata step of the PyOpenCL source distribution the tests unpack; iproute2
# and iptables: the hosts of the tests across a network, and their packet loss).
ensure_packages() {
    local missing=()
    local pkg
    for pkg in gcc cmake pocl-opencl-icd ocl-icd-libopencl1 ocl-icd-opencl-dev opencl-headers clinfo kmod iproute2 iptables; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep "install ok installed" >/dev/null || missing+=("$pkg")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        local sudo=""
        [ "$(id -u)" -ne 0 ] && sudo=sudo
        echo "installing: ${missing[*]}"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

# Installs piglit (the Mesa project's test suite; its OpenCL tests run natively and
# through Hira in the compatibility tests). Most of its 2 GB are OpenGL shader tests.
ensure_piglit() {
    if ! dpkg-query -W -f='${Status}' piglit 2>/dev/null | grep "install ok installed" >/dev/null; then
        local sudo=""
        [ "$(id -u)" -ne 0 ] && sudo=sudo
        echo "installing: piglit"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends piglit >/dev/null
    fi
}

# Installs PyOpenCL (a widely used Python binding, from PyPI) with what its tests need,
# and puts its own test suite, from its source distribution, under target/pyopencl.
# The compatibility tests run part of it natively and through Hira.
PYOPENCL_VERSION=2026.1.4
ensure_pyopencl() {
    local dir=target/pyopencl
    if ! python3 -c "import pyopencl, pytest, mako" 2>/dev/null; then
        echo "installing: pyopencl $PYOPENCL_VERSION, pytest, mako"
        python3 -m pip install -q "pyopencl==$PYOPENCL_VERSION" pytest mako
    fi
    if [ ! -f "$dir/test/test_wrapper.py" ]; then
        # The source distribution's metadata step needs these two to be importable.
        python3 -m pip install -q scikit-build-core nanobind
        rm -rf "$dir" && mkdir -p "$dir/dl"
        python3 -m pip download -q --no-binary :all: --no-deps --no-build-isolation \
            -d "$dir/dl" "pyopencl==$PYOPENCL_VERSION"
        tar -xzf "$dir"/dl/pyopencl-*.tar.gz -C "$dir/dl"
        mv "$dir"/dl/pyopencl-*/test "$dir/test"
        rm -rf "$dir/dl"
    fi
}

# Installs QEMU for the VM tests. bookworm's own qemu-system-x86 would replace the
# machine's qemu-utils from bookworm-backports, so QEMU comes from backports too.
ensure_qemu() {
    command -v qemu-system-x86_64 >/dev/null 2>&1 && return 0
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo=sudo
    if . /etc/os-release && [ "${VERSION_CODENAME:-}" = bookworm ]; then
        echo "deb http://deb.debian.org/debian bookworm-backports main" | $sudo tee /etc/apt/sources.list.d/hira-backports.list >/dev/null
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq -t bookworm-backports qemu-system-x86 >/dev/null
    else
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq qemu-system-x86 >/dev/null
    fi
}

# Installs libvirt for the libvirt test (vhost/tests/e2e/libvirt.rs): Debian's
# libvirtd with its QEMU driver, which drives the QEMU ensure_qemu installs. The test
# starts libvirtd and virtlogd itself (no systemd here), with Hira's hook installed.
ensure_libvirt() {
    command -v virsh >/dev/null 2>&1 && [ -x /usr/sbin/libvirtd ] && return 0
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo=sudo
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
        libvirt-daemon-system libvirt-daemon-driver-qemu libvirt-clients >/dev/null
}

# Installs what the CUDA tests build with, from PyPI, under target/cuda-sdk: cuda.h
# (nvidia-cuda-runtime-cu12) and NVRTC (nvidia-cuda-nvrtc-cu12), which compiles the
# test kernels to PTX without a GPU. No driver comes with them: without a GPU the
# tests run on the CPU test executor (tests/cuda-cpu).
CUDA_SDK_VERSION=12.9
ensure_cuda_sdk() {
    local dir=target/cuda-sdk
    [ -f "$dir/nvidia/cuda_runtime/include/cuda.h" ] && [ -f "$dir/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" ] && return 0
    echo "installing: CUDA $CUDA_SDK_VERSION headers and NVRTC (PyPI) under $dir"
    python3 -m pip install -q --no-deps --target "$dir" \
        "nvidia-cuda-runtime-cu12==$CUDA_SDK_VERSION.*" "nvidia-cuda-nvrtc-cu12==$CUDA_SDK_VERSION.*"
}

# Installs nvcc 13.0 from PyPI under target/nvcc13 (nvcc, its NVVM and crt headers,
# the CUDA 13.0 runtime, static and shared): the runtime-API test programs
# (tests/cudart) are built with it as users build theirs. It needs no GPU. The
# wheels lay the toolkit out as nvcc.profile does not expect: libraries in lib, not
# lib64, and the shared runtime without its development link.
NVCC_VERSION=13.0
ensure_nvcc() {
    local dir=target/nvcc13/root
    local top=$dir/nvidia/cu13
    [ -x "$top/bin/nvcc" ] && [ -e "$top/lib64" ] && [ -e "$top/lib/libcudart.so" ] &&
        [ -d "$top/include/cccl/cub" ] && [ -e "$top/include/cuda_profiler_api.h" ] && return 0
    echo "installing: nvcc $NVCC_VERSION (PyPI) under $dir"
    # CCCL (thrust, CUB, libcu++; cooperative_groups needs its nv/target) and the
    # profiler API header come with a toolkit and are separate wheels on PyPI.
    python3 -m pip install -q --no-deps --upgrade --target "$dir" \
        "nvidia-cuda-nvcc==$NVCC_VERSION.*" "nvidia-nvvm==$NVCC_VERSION.*" \
        "nvidia-cuda-runtime==$NVCC_VERSION.*" "nvidia-cuda-crt==$NVCC_VERSION.*" \
        "nvidia-cuda-cccl==$NVCC_VERSION.*" "nvidia-cuda-profiler-api==$NVCC_VERSION.*"
    ln -sfn lib "$top/lib64"
    ln -sfn libcudart.so.13 "$top/lib/libcudart.so"
}

# Installs CuPy (its CUDA 13 wheel, with the CUDA 13.0 runtime, NVRTC and cuRAND
# wheels it loads) and pytest into a virtual environment under target/cupy, and
# CuPy's own test suite from its source distribution (the wheel has none): the
# end-to-end test runs part of it natively and through Hira (vhost/tests/e2e/cupy.rs).
CUPY_VERSION=14.2.0
ensure_cupy() {
    local dir=target/cupy
    [ -x "$dir/venv/bin/python" ] && [ -e "$dir/cupy-$CUPY_VERSION/pyproject.toml" ] && return 0
    echo "installing: CuPy $CUPY_VERSION and its tests (PyPI) under $dir"
    rm -rf "$dir"
    python3 -m venv "$dir/venv"
    "$dir/venv/bin/pip" install -q "cupy-cuda13x==$CUPY_VERSION" \
        "cuda-toolkit[cudart,nvrtc,curand]==13.0.*" "numpy==2.4.*" \
        "pytest==9.*" "pytest-timeout==2.*" "hypothesis>=6.37.2,<6.55.0" mpmath packaging
    # The source distribution, found through PyPI's simple index (its JSON form) and
    # checked against the hash the index gives; tests/ and pyproject.toml (pytest's
    # settings) are kept.
    "$dir/venv/bin/python" - "$dir" "$CUPY_VERSION" <<'PY'
import hashlib, io, json, sys, tarfile, urllib.request
dest, version = sys.argv[1], sys.argv[2]
req = urllib.request.Request(
    "https://pypi.org/simple/cupy/",
    headers={"Accept": "application/vnd.pypi.simple.v1+json"},
)
files = json.load(urllib.request.urlopen(req))["files"]
f = next(f for f in files if f["filename"] == f"cupy-{version}.tar.gz")
data = urllib.request.urlopen(f["url"]).read()
if hashlib.sha256(data).hexdigest() != f["hashes"]["sha256"]:
    sys.exit(f"cupy-{version}.tar.gz: hash mismatch")
with tarfile.open(fileobj=io.BytesIO(data)) as t:
    top = f"cupy-{version}/"
    keep = [
        m
        for m in t.getmembers()
        if m.name.startswith(top + "tests/") or m.name == top + "pyproject.toml"
    ]
    t.extractall(dest, members=keep, filter="data")
PY
}
