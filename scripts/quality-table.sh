#!/usr/bin/env bash
# The quality table: what each weight format costs the trained text model
# (tests/fixtures/tiny-qwen3.5-moe-text) on its held-out text. For every
# GGUF file, llama.cpp's (converter and llama-quantize) and Linnet's own
# (`linnet quantize`): the perplexity, and the KL divergence from the f32
# model's distributions (mean, 99th percentile) and how often both put the
# same token on top, by `linnet perplexity`; and, for llama.cpp's files,
# `llama-perplexity` on the same file against the same base (both tools
# read and write llama.cpp's base file format). Prints a Markdown table.
# Needs ../shared/bench/setup.sh's llama.cpp build and a release build of
# linnet (or $LINNET naming another). Usage: scripts/quality-table.sh [CTX]   (default 256)
set -euo pipefail
cd "$(dirname "$0")/.."
ctx=${1:-256}
B=${LINNET_BENCH_DIR:-/tmp/linnet-bench}
fixture=tests/fixtures/tiny-qwen3.5-moe-text
card=$fixture/package/nest.toml
text=$fixture/held-out.txt
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
llama=$B/llama.cpp/build-noamx/bin
[ -x "$llama/llama-perplexity" ] || llama=$B/llama.cpp/build/bin
linnet() { LINNET_STDLIB=stdlib "${LINNET:-target/release/linnet}" "$@"; }
model=(models/qwen3.6-35b-a3b --nest "$card")

linnet perplexity "${model[@]}" --weights "$fixture/weights-f32" -f "$text" -c "$ctx" \
    --kl-divergence-base "$work/base.bin" > "$work/f32.txt" 2>/dev/null
ours="q8_0 q6_k q5_k_m q4_k_m iq4_xs iq4_nl q5_1 q5_0 q4_1 q4_0 mxfp4_moe q3_k_m q2_k"
for format in $ours; do
    linnet quantize "${model[@]}" --weights "$fixture/weights-f32" --type "$format" -o "$work/linnet-$format.gguf" >/dev/null
done

field() { sed -n "s/^$2 *: *\([-0-9.]*\).*/\1/p" "$1" | head -1; }
kld() { sed -n "s/^$2 *KLD: *\([-0-9.]*\).*/\1/p" "$1" | head -1; }
top() { sed -n 's/^Same top p: *\([0-9.]*\).*/\1/p' "$1" | head -1; }

echo "| file | made by | PPL (Linnet) | mean KLD | 99% KLD | same top | PPL (llama.cpp) | mean KLD (llama.cpp) | same top (llama.cpp) |"
echo "|---|---|---|---|---|---|---|---|---|"
row() {
    local name=$1 maker=$2 file=$3
    linnet perplexity "${model[@]}" --weights "$file" --kl-divergence-base "$work/base.bin" --kl-divergence \
        > "$work/$name.txt" 2>/dev/null
    local ours="$(field "$work/$name.txt" 'Mean PPL(Q)') | $(kld "$work/$name.txt" 'Mean   ') | $(kld "$work/$name.txt" '99.0%  ') | $(top "$work/$name.txt")%"
    local theirs="– | – | –"
    if [ "$maker" = "llama.cpp" ]; then
        "$llama/llama-perplexity" -m "$file" --kl-divergence-base "$work/base.bin" --kl-divergence -c "$ctx" -t "$(nproc)" \
            > "$work/$name-llama.txt" 2>&1
        theirs="$(field "$work/$name-llama.txt" 'Mean PPL(Q)') | $(kld "$work/$name-llama.txt" 'Mean   ') | $(top "$work/$name-llama.txt")%"
    fi
    echo "| $name | $maker | $ours | $theirs |"
}
echo "| f32 safetensors | transformers | $(sed -n 's/^Final estimate: PPL = \([0-9.]*\).*/\1/p' "$work/f32.txt") | 0 | 0 | 100% | – | – | – |"
for format in f32 bf16 q8_0 q6_k q4_k_m q3_k_m mixed; do
    row "$format" llama.cpp "$fixture/gguf/tiny-text-$format.gguf"
done
for format in $ours; do
    row "linnet-$format" Linnet "$work/linnet-$format.gguf"
done
