#!/usr/bin/env python3
"""Load test of `linnet serve` on loopback: N greedy requests at C
concurrent over distinct prompts of mixed lengths, each asking for a
mixed number of tokens (the same prompt and length must get the same
tokens, streamed or not), a share of them streamed (their time to the
first token measured), some streaming clients that vanish after the
first chunk (their rows must be freed), then figures: requests/s, p50/p99
latency and time to first token, lost requests, mismatched greedy
results, and the server's resident memory (now and peak) after every
1,000 requests.

    cargo build --release
    scripts/load-test.py --requests 5000 --concurrency 64

Bounded: it stops after --requests or --seconds, whichever comes first.
Standard library only; the server runs the f32 oracle model
(tests/fixtures/oracle) unless --package/--weights/--nest say otherwise.
"""

import argparse
import concurrent.futures
import http.client
import json
import os
import random
import re
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORACLE = os.path.join(ROOT, "tests/fixtures/oracle/tiny-qwen3.5-moe")


def start(args):
    command = [
        args.linnet, "serve", args.package, "--nest", args.nest, "--weights", args.weights,
        "--port", "0", "--queue", str(args.queue), "--prefix-block", str(args.prefix_block),
    ]
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    for line in server.stderr:
        found = re.search(r"http://[^\s:]+:(\d+)", line)
        if found:
            threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
            return server, int(found.group(1))
    sys.exit("the server stopped before listening: " + " ".join(command))


def memory(pid):
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields.get("VmRSS", "?"), fields.get("VmHWM", "?")


def complete(port, prompt, max_tokens):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    started = time.perf_counter()
    connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    payload = response.read()
    elapsed = time.perf_counter() - started
    connection.close()
    if response.status != 200:
        return None, elapsed, f"HTTP {response.status}: {payload[:200]!r}"
    return json.loads(payload)["choices"][0]["token_ids"], elapsed, None


def stream(port, prompt, max_tokens):
    """A streaming client that reads to `[DONE]`: its tokens, its time to
    the first token and in all, or the problem."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True})
    started = time.perf_counter()
    connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        return None, 0.0, 0.0, f"HTTP {response.status}: {response.read()[:200]!r}"
    tokens, first, finished, done = [], None, None, False
    for line in response:
        line = line.decode().strip()
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done = True
            break
        choice = json.loads(line[len("data: "):])["choices"][0]
        if choice.get("token_ids") and first is None:
            first = time.perf_counter() - started
        tokens += choice.get("token_ids") or []
        finished = choice.get("finish_reason") or finished
    elapsed = time.perf_counter() - started
    connection.close()
    if not done or finished is None:
        return None, 0.0, 0.0, f"a stream ended without {'[DONE]' if not done else 'a finish_reason'}"
    return tokens, first or elapsed, elapsed, None


def vanish(port, prompt):
    """A streaming client that reads the first chunk and goes away."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = json.dumps({"prompt": prompt, "max_tokens": 50, "stream": True})
    connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    response.read1(64) if hasattr(response, "read1") else response.read(64)
    connection.sock.close()
    connection.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=900)
    parser.add_argument("--max-tokens", type=int, default=16, help="the most tokens a request asks for (1 to this)")
    parser.add_argument("--streaming", type=float, default=0.3, help="share of clients that stream to the end")
    parser.add_argument("--vanishing", type=float, default=0.05, help="share of clients that disconnect mid-stream")
    parser.add_argument("--queue", type=int, default=256)
    parser.add_argument("--prefix-block", type=int, default=4,
                        help="the prefix cache's block: small, so that the short prompts here are cached")
    parser.add_argument("--linnet", default=os.path.join(ROOT, "target/release/linnet"))
    parser.add_argument("--package", default=os.path.join(ROOT, "models/qwen3.6-35b-a3b"))
    parser.add_argument("--nest", default=os.path.join(ORACLE, "package/nest-f32.toml"))
    parser.add_argument("--weights", default=os.path.join(ORACLE, "weights-f32"))
    args = parser.parse_args()

    server, port = start(args)
    rng = random.Random(7)
    prompts = [[rng.randrange(1, 500) for _ in range(rng.randrange(1, 40))] for _ in range(16)]
    lengths = sorted({1, 4, max(1, args.max_tokens // 2), args.max_tokens})
    expected = {}
    latencies, first_tokens, lost, mismatched, vanished, streamed = [], [], [], 0, 0, 0
    lock = threading.Lock()
    started = time.perf_counter()
    deadline = started + args.seconds

    def one(index):
        nonlocal mismatched, vanished, streamed
        prompt = prompts[index % len(prompts)]
        max_tokens = lengths[(index // len(prompts)) % len(lengths)]
        draw = rng.random()
        if draw < args.vanishing:
            try:
                vanish(port, prompt)
            except OSError as error:
                with lock:
                    lost.append(f"vanishing client: {error}")
            with lock:
                vanished += 1
            return
        first = None
        try:
            if draw < args.vanishing + args.streaming:
                tokens, first, elapsed, problem = stream(port, prompt, max_tokens)
            else:
                tokens, elapsed, problem = complete(port, prompt, max_tokens)
        except OSError as error:
            tokens, elapsed, problem = None, 0.0, str(error)
        with lock:
            if problem:
                lost.append(problem)
                return
            latencies.append(elapsed)
            if first is not None:
                streamed += 1
                first_tokens.append(first)
            key = (tuple(prompt), max_tokens)
            if expected.setdefault(key, tokens) != tokens:
                mismatched += 1

    done = 0
    with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
        while done < args.requests and time.perf_counter() < deadline:
            batch = min(1000 - done % 1000, args.requests - done)
            list(pool.map(one, range(done, done + batch)))
            done += batch
            rss, peak = memory(server.pid)
            print(f"after {done:>6} requests: server RSS {rss}, peak {peak}", flush=True)
    took = time.perf_counter() - started
    server.terminate()
    server.wait(timeout=30)

    def quantile(values, q):
        values = sorted(values)
        return values[min(len(values) - 1, int(q * len(values)))] * 1e3 if values else float("nan")

    print(f"requests: {done} in {took:.1f} s at {args.concurrency} concurrent ({done / took:.1f} req/s), "
          f"{streamed} streamed to the end, {vanished} vanished mid-stream")
    print(f"latency: p50 {quantile(latencies, 0.5):.1f} ms, p99 {quantile(latencies, 0.99):.1f} ms")
    print(f"time to first token (streams): p50 {quantile(first_tokens, 0.5):.1f} ms, p99 {quantile(first_tokens, 0.99):.1f} ms")
    print(f"lost: {len(lost)}, mismatched greedy results: {mismatched}")
    for problem in lost[:10]:
        print(f"  {problem}")
    sys.exit(1 if lost or mismatched else 0)


if __name__ == "__main__":
    main()
