#!/usr/bin/env bash
# The GPU backend's device check (issue 12), on a machine with an NVIDIA
# GPU and neither Rust nor MLIR: from the repository root, with .gpu-check/
# made by scripts/gpu-check-prepare.sh on a machine with MLIR. Each stage
# has its own time limit, so a slow one leaves the others' results; all of
# it fits in 10 minutes.
#   1. the oracle on the GPU (scripts/gpu_oracle.py): forward and prefill
#      logits against transformers', within the contract;
#   2. the bytes a decode step of the full seed reads, counted by the CPU
#      backend on this machine's CPUs (the chosen experts, not all 256);
#   3. prefill 512 and decode 32 of the full seed with random bf16 weights
#      on the GPU at batch 1 and 8, and batch 1's decode as a fraction of
#      the HBM roofline (bytes a step reads × steps/s ÷ HBM_BYTES_PER_S,
#      default the H200's 4.8e12), with the kernels a decode step launches
#      and the time a step takes per launch (launch-bound or not).
set -uo pipefail
cd "$(dirname "$0")/.."
gpu=.gpu-check
linnet="$gpu/linnet"
export LINNET_CACHE_DIR=/tmp/linnet-cache RUST_LOG=info
hbm="${HBM_BYTES_PER_S:-4.8e12}"
find "$gpu" -name '*.gz' -exec gunzip -f {} +
chmod +x "$linnet"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "nvidia-smi: none"
status=0

echo "== 1. the oracle on the GPU"
timeout 150 python3 scripts/gpu_oracle.py "$linnet" "$gpu/artifacts" || status=1

echo "== 2. bytes a decode step reads (the CPU backend counts them)"
counted=$(timeout 200 "$linnet" bench models/qwen3.6-35b-a3b --set MaxSeq=4608 --random-weights 1 --backend cpu -p 8 -n 4 -r 1 2>&1 | tee /dev/stderr | sed -n 's/.*contractions read \([0-9.]*\) GB of weights.*/\1/p')
echo "a decode step reads ${counted:-?} GB"

echo "== 3. the full seed on the GPU"
for batch in b1 b8; do
    out=$(timeout 240 "$linnet" bench "$gpu/artifacts/seed-$batch" --random-weights 1 --backend cuda -p 512 -n 32 -r 1 2>&1) || status=1
    echo "$out"
    steps=$(echo "$out" | sed -n 's/.*; \([0-9.]*\) decode steps\/s.*/\1/p')
    # As linnetc counted them when it built the PTX.
    launches=$(sed -n 's/.*launches per call: .*decode \([0-9]*\).*/\1/p' "$gpu/artifacts/seed-$batch/ptx.txt" 2>/dev/null)
    if [ -n "$launches" ] && [ -n "$steps" ]; then
        python3 -c "n, s = $launches, $steps; print(f'seed-$batch decode: {n} launches a step, {1e6 / s / n:.2f} us a step per launch')"
    fi
    # The bytes were counted at batch 1 (more rows choose more experts).
    if [ "$batch" = b1 ] && [ -n "$counted" ] && [ -n "$steps" ]; then
        python3 -c "g, s, h = $counted, $steps, $hbm; print(f'seed-$batch decode: {s:.2f} steps/s x {g:.3f} GB = {g * s:.1f} GB/s, {g * 1e9 * s / h:.1%} of the HBM roofline ({h / 1e12:.1f} TB/s)')"
    fi
done
exit $status
