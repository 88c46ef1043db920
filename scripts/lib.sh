# Shared by the scripts in this directory.

# Installs the Debian packages Hira's build, tests and demo need, if missing.
ensure_packages() {
    local missing=()
    local pkg
    for pkg in gcc pocl-opencl-icd ocl-icd-libopencl1 ocl-icd-opencl-dev opencl-headers clinfo; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        local sudo=""
        [ "$(id -u)" -ne 0 ] && sudo=sudo
        echo "installing: ${missing[*]}"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}
