"""The oracle on a GPU, for scripts/gpu-check.sh: each golden sequence of
the oracle fixtures (tests/fixtures/oracle: transformers' logits for
random-weight checkpoints) through the seed's `forward` and `prefill` on
the CUDA backend (`linnet run --backend cuda` on artifacts that
scripts/gpu-check-prepare.sh built with their PTX; `LINNET_BACKEND`
another), held to the contract:
f32 within 1e-4 of each row's largest logit and every argmax equal; bf16
(the calm checkpoint) within 1e-1. Usage: gpu_oracle.py LINNET ARTIFACTS.
Exits 1 on any mismatch."""

import os
import re
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file

# `mlir-host` runs the same kernels on the host (to try this script
# without a GPU); LINNET_ORACLE_SEQUENCES=N checks the first N sequences.
BACKEND = os.environ.get("LINNET_BACKEND", "cuda")
SEQUENCES = int(os.environ.get("LINNET_ORACLE_SEQUENCES", "1000000"))
CASES = [("tiny-qwen3.5-moe", "f32", 1e-4), ("tiny-qwen3.5-moe-calm", "bf16", 1e-1)]


def run(linnet, artifact, weights, entry, inputs, scratch):
    """One call of `entry` on the backend; its first output."""
    args = [linnet, "run", artifact, "--weights", weights, "--backend", BACKEND, "--entry", entry]
    for name, value in inputs.items():
        if isinstance(value, np.ndarray):
            path = os.path.join(scratch, f"{name}.npy")
            np.save(path, value)
            args += ["--input", f"{name}={path}"]
        else:
            args += ["--arg", f"{name}={value}"]
    out = os.path.join(scratch, "out.npy")
    subprocess.run(args + ["--output", out], check=True)
    return np.load(out).astype(np.float32)


def distance(ours, reference):
    """Each row's largest difference over its largest logit."""
    return np.abs(ours - reference).max(axis=-1) / np.abs(reference).max(axis=-1)


def main():
    linnet, artifacts = sys.argv[1], sys.argv[2]
    failed = False
    for config, dtype, tolerance in CASES:
        fixture = f"tests/fixtures/oracle/{config}"
        artifact = f"{artifacts}/{config}-{dtype}"
        weights = f"{fixture}/weights-{dtype}"
        golden = load_file(f"{fixture}/golden-{dtype}.safetensors")
        card = open(f"{fixture}/package/nest-{dtype}.toml").read()
        batch = int(re.search(r"^Batch\s*=\s*(\d+)", card, re.M).group(1))
        rows, worst, argmax_equal = 0, 0.0, 0
        with tempfile.TemporaryDirectory() as scratch:
            n = 0
            while f"seq{n}.logits" in golden and n < SEQUENCES:
                tokens = golden[f"seq{n}.tokens"].astype(np.int32).reshape(1, -1)
                reference = golden[f"seq{n}.logits"].reshape(tokens.shape[1], -1)
                forward = run(linnet, artifact, weights, "forward", {"tokens": tokens}, scratch).reshape(reference.shape)
                # prefill: the sequence in every batch row; its last logits.
                prompt = np.tile(tokens, (batch, 1))
                prefill = run(linnet, artifact, weights, "prefill", {"tokens": prompt, "pos": 0}, scratch)
                ours = np.concatenate([forward, prefill.reshape(batch, -1)])
                expected = np.concatenate([reference, np.tile(reference[-1:], (batch, 1))])
                d = distance(ours, expected)
                rows += len(d)
                worst = max(worst, float(d.max()))
                argmax_equal += int((ours.argmax(-1) == expected.argmax(-1)).sum())
                n += 1
        agreement = argmax_equal / max(rows, 1)
        ok = worst <= tolerance and (dtype != "f32" or agreement == 1.0)
        failed |= not ok
        print(f"{config} {dtype} {BACKEND} forward and prefill: worst row {worst:.2e} (tolerance {tolerance:.0e}) over {rows} rows, argmax agreement {agreement:.3f}: {'ok' if ok else 'FAILED'}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
