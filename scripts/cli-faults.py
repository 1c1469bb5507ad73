#!/usr/bin/env python3
"""Broken input through the command line, as users meet it: mutated copies
of the seed package through `linnetc check` (and `linnetc build` when they
check clean), and corrupted copies of the f32 oracle checkpoint through
`linnet run`. Every run must end with a diagnostic or an error (exit 1 or
2): never a panic (101), a signal, or a timeout. Prints the tally and each
bad case, whose input is kept under --out.

    cargo build --release
    scripts/cli-faults.py --packages 300 --checkpoints 100
"""

import argparse
import os
import random
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = os.path.join(ROOT, "models/qwen3.6-35b-a3b")
ORACLE = os.path.join(ROOT, "tests/fixtures/oracle/tiny-qwen3.5-moe")
FRAGMENTS = ["(", ")", "[", "]", "{", "}", "<", ">", "-", "*", "let ", "sum[i] ", ",", ":", "=", "99999999999", "0", "\n", "\"", "#", "where ", "static for "]


def mutate(text, rng):
    data = bytearray(text)
    for _ in range(rng.randint(1, 6)):
        at = rng.randrange(len(data) + 1)
        kind = rng.randrange(5)
        if kind == 0 and data:
            data[min(at, len(data) - 1)] ^= 1 << rng.randrange(8)
        elif kind == 1:
            del data[at:at + rng.randint(1, 40)]
        elif kind == 2:
            data[at:at] = FRAGMENTS[rng.randrange(len(FRAGMENTS))].encode() * (1 << rng.randrange(12))
        elif kind == 3:
            start = rng.randrange(len(data) + 1)
            data[at:at] = data[start:start + rng.randint(1, 80)]
        else:
            data[at:at] = FRAGMENTS[rng.randrange(len(FRAGMENTS))].encode()
    return bytes(data)


def run(command, timeout):
    try:
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return "timeout", ""
    if done.returncode < 0:
        return f"signal {-done.returncode}", done.stderr.decode(errors="replace")[-300:]
    if done.returncode not in (0, 1, 2):
        return f"exit {done.returncode}", done.stderr.decode(errors="replace")[-300:]
    return f"exit {done.returncode}", None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--packages", type=int, default=300)
    parser.add_argument("--checkpoints", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=30)
    parser.add_argument("--out", default="/tmp/linnet-cli-faults")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    linnetc = os.path.join(ROOT, "target/release/linnetc")
    linnet = os.path.join(ROOT, "target/release/linnet")
    shutil.rmtree(args.out, ignore_errors=True)
    tally, bad = {}, []

    files = [os.path.join(SEED, "src", name) for name in sorted(os.listdir(os.path.join(SEED, "src")))]
    files += [os.path.join(SEED, name) for name in ("nest.toml", "bindings.json", "linnet.toml")]
    for case in range(args.packages):
        target = os.path.join(args.out, f"package-{case}")
        shutil.copytree(SEED, target)
        victim = rng.choice(files)
        relative = os.path.relpath(victim, SEED)
        with open(victim, "rb") as source:
            mutated = mutate(source.read(), rng)
        with open(os.path.join(target, relative), "wb") as out:
            out.write(mutated)
        outcome, problem = run([linnetc, "check", target], args.timeout)
        if outcome == "exit 0":
            outcome, problem = run([linnetc, "build", target, "-o", os.path.join(target, "built")], args.timeout * 4)
        tally[outcome] = tally.get(outcome, 0) + 1
        if problem is not None:
            bad.append((target, relative, outcome, problem))
        else:
            shutil.rmtree(target)

    shards = sorted(name for name in os.listdir(os.path.join(ORACLE, "weights-f32")) if name.endswith(".safetensors"))
    tokens = os.path.join(args.out, "tokens.npy")
    subprocess.run([sys.executable, "-c", f"""
import struct
header = "{{'descr': '<i4', 'fortran_order': False, 'shape': (1, 3), }}"
header += " " * (63 - len(header)) + "\\n"
open({tokens!r}, "wb").write(b"\\x93NUMPY\\x01\\x00" + struct.pack("<H", len(header)) + header.encode() + struct.pack("<3i", 5, 17, 42))
"""], check=True)
    for case in range(args.checkpoints):
        target = os.path.join(args.out, f"checkpoint-{case}")
        shutil.copytree(os.path.join(ORACLE, "weights-f32"), target)
        shard = os.path.join(target, rng.choice(shards))
        with open(shard, "rb") as source:
            data = bytearray(source.read())
        kind = rng.randrange(4)
        if kind == 0:
            data = data[: rng.randrange(len(data))]
        elif kind == 1:
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(min(len(data), 4096))] = rng.randrange(256)
        elif kind == 2:
            data[:8] = rng.randrange(1 << 64).to_bytes(8, "little")
        else:
            for _ in range(rng.randint(1, 64)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        with open(shard, "wb") as out:
            out.write(data)
        command = [linnet, "run", SEED, "--nest", os.path.join(ORACLE, "package/nest-f32.toml"), "--weights", target,
                   "--entry", "forward", "--input", f"tokens={tokens}"]
        outcome, problem = run(command, args.timeout * 4)
        tally[outcome] = tally.get(outcome, 0) + 1
        if problem is not None:
            bad.append((target, os.path.basename(shard), outcome, problem))
        else:
            shutil.rmtree(target)

    print(f"{args.packages} mutated packages, {args.checkpoints} corrupted checkpoints: " + ", ".join(f"{k}: {v}" for k, v in sorted(tally.items())))
    for target, what, outcome, problem in bad:
        print(f"  {outcome}: {target} ({what})\n    {problem}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
