#!/usr/bin/env bash
# Installs what the nvptx target (`--features nvptx`) needs, where missing:
# MLIR 22 from Debian's packages (melior builds against /usr/lib/llvm-22),
# and ptxas and libdevice from the PyPI wheel nvidia-cuda-nvcc-cu12,
# unpacked into $LINNET_CUDA_HOME (default /opt/linnet-cuda). Idempotent.
set -euo pipefail

packages="libmlir-22-dev mlir-22-tools llvm-22-dev libpolly-22-dev libzstd-dev libclang-22-dev"
missing=""
for package in $packages; do
    dpkg -s "$package" >/dev/null 2>&1 || missing="$missing $package"
done
if [ -n "$missing" ]; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    echo "installing$missing"
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q $missing
fi

home="${LINNET_CUDA_HOME:-/opt/linnet-cuda}"
ptxas="$home/nvidia/cuda_nvcc/bin/ptxas"
libdevice="$home/nvidia/cuda_nvcc/nvvm/libdevice/libdevice.10.bc"
if [ ! -x "$ptxas" ] || [ ! -f "$libdevice" ]; then
    wheel_dir="$(mktemp -d)"
    python3 -m pip download --quiet --no-deps --only-binary=:all: "nvidia-cuda-nvcc-cu12==12.9.86" -d "$wheel_dir"
    mkdir -p "$home"
    python3 - "$wheel_dir" "$home" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(wheel) as archive:
    for member in ("nvidia/cuda_nvcc/bin/ptxas", "nvidia/cuda_nvcc/nvvm/libdevice/libdevice.10.bc"):
        archive.extract(member, sys.argv[2])
PY
    chmod +x "$ptxas"
    rm -rf "$wheel_dir"
fi
echo "MLIR: /usr/lib/llvm-22; ptxas: $("$ptxas" --version | tail -1); libdevice: $libdevice"
