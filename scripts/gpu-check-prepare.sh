#!/usr/bin/env bash
# Prepares the GPU device check (scripts/gpu-check.sh) on a machine with
# MLIR (scripts/install-gpu-tools.sh); no GPU needed. Into .gpu-check/
# (ignored by git; carried to the GPU machine, which has neither Rust nor
# MLIR):
#   linnet      built with the cuda backend alone, stripped;
#   artifacts/  the seed at the two oracle cards (f32, bf16-calm) and at
#               full size (batch 1 and 8), each with its PTX for sm_90
#               (their CPU code stays here: it is not run there), and
#               what the PTX build said (ptx.txt: its launches per call);
# all gzipped, to fit what travels (64 MiB with the working tree).
# Then, where a device is lent: bash scripts/gpu-check.sh, carrying .gpu-check.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu-check
rm -rf "$out"
mkdir -p "$out/artifacts"
grep -qx '/.gpu-check/' .git/info/exclude 2>/dev/null || echo '/.gpu-check/' >> .git/info/exclude

cargo build --release --locked -p linnetc --features nvptx --bin linnetc
CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols \
    cargo build --release --locked -p linnet --features cuda --bin linnet --target-dir target/gpu-check
gzip -9 -c target/gpu-check/release/linnet > "$out/linnet.gz"

# NAME, then linnetc's options: the artifact with its PTX section (its CPU
# section's object file is left here: the device runs only the PTX, and the
# manifest checks a section's file only when that section is loaded).
artifact() {
    local name=$1
    shift
    target/release/linnetc build models/qwen3.6-35b-a3b "$@" --target nvptx --gpu-arch sm_90 -o "$out/artifacts/$name" 2>&1 | tee "$out/ptx-$name.txt"
    mv "$out/ptx-$name.txt" "$out/artifacts/$name/ptx.txt"
    rm -f "$out/artifacts/$name/kernels.o"
    gzip -9 -r "$out/artifacts/$name"
}
artifact tiny-qwen3.5-moe-f32 --nest tests/fixtures/oracle/tiny-qwen3.5-moe/package/nest-f32.toml
artifact tiny-qwen3.5-moe-calm-bf16 --nest tests/fixtures/oracle/tiny-qwen3.5-moe-calm/package/nest-bf16.toml
# Full width and depth; caches for 4608 positions (prefill 4000 and more).
artifact seed-b1 --set MaxSeq=4608
artifact seed-b8 --set MaxSeq=4608 --set Batch=8
du -sh "$out"
git ls-files -z | xargs -0 du -cb | tail -1 | awk '{printf "the working tree: %.1f MB\n", $1 / 1e6}'
