#!/usr/bin/env python3
"""The prefix cache as chat clients meet it: REQUESTS chat requests, one
after another, that share a long system prompt (about --system tokens)
and each ask their own question, streamed and greedy. Prints each
request's time to first token and the prompt tokens it found cached, then
the first request's time against the median of the rest; with --compare,
a second server without the cache answers the same requests and every
answer must equal it.

    cargo build --release
    scripts/prefix-cache.py PACKAGE --weights W --set MaxSeq=2304 \\
        --tokenizer tests/fixtures/llama-cpp/ggml-vocab-qwen35.gguf \\
        --chat-template tests/fixtures/chat-templates/qwen3.5.jinja --compare

Standard library only.
"""

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TOPICS = [
    "rivers", "lighthouses", "glaciers", "orchards", "bridges", "comets", "violins", "deserts",
    "harbors", "libraries", "volcanoes", "meadows", "railways", "observatories", "coral reefs",
    "windmills", "canyons", "archives", "monsoons", "printing presses",
]


def system_prompt(tokens):
    """About `tokens` tokens of varied plain text (some 20 a sentence)."""
    sentences = []
    for at in range(tokens // 20):
        topic = TOPICS[at % len(TOPICS)]
        sentences.append(f"Rule {at}: when the user asks about {topic}, answer briefly and cite item {at * 7 % 97}.")
    return " ".join(sentences)


def start(args, cache_mb):
    command = [args.linnet, "serve", args.package, "--port", "0", "--prefix-cache-mb", str(cache_mb)]
    command += ["--weights", args.weights, "--tokenizer", args.tokenizer, "--chat-template", args.chat_template]
    for setting in args.set:
        command += ["--set", setting]
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    for line in server.stderr:
        found = re.search(r"http://[^\s:]+:(\d+)", line)
        if found:
            return server, int(found.group(1))
    sys.exit("the server did not start")


def ask(port, system, question, max_tokens):
    """Streams one greedy chat request: (seconds to the first token, the
    answer's text, the cached prompt tokens, the prompt tokens)."""
    body = {
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": max_tokens, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
        "chat_template_kwargs": {"enable_thinking": False},
    }
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    started = time.monotonic()
    connection.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        sys.exit(f"HTTP {response.status}: {response.read().decode()}")
    first, text, usage = None, "", None
    for line in response:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[len("data: "):])
        if "error" in chunk:
            sys.exit(f"the stream failed: {chunk['error']}")
        for choice in chunk.get("choices", []):
            if first is None:
                first = time.monotonic() - started
            delta = choice.get("delta", {})
            text += (delta.get("content") or "") + (delta.get("reasoning_content") or "")
        if chunk.get("usage"):
            usage = chunk["usage"]
    connection.close()
    return first, text, usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"]


def run(args, cache_mb, system):
    server, port = start(args, cache_mb)
    try:
        # Questions that differ from their first word, as users' do.
        return [ask(port, system, f"{topic.capitalize()}: what should I know? Question {at}.", args.max_tokens)
                for at, topic in enumerate(TOPICS[: args.requests])]
    finally:
        server.kill()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("package")
    parser.add_argument("--weights", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--chat-template", required=True)
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--linnet", default=os.path.join(ROOT, "target/release/linnet"))
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--system", type=int, default=2000, help="tokens of system prompt, about")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--cache-mb", type=int, default=1024)
    parser.add_argument("--compare", action="store_true", help="also run without the cache; answers must equal")
    args = parser.parse_args()
    system = system_prompt(args.system)
    cached = run(args, args.cache_mb, system)
    for at, (first, _, found, prompt) in enumerate(cached):
        print(f"request {at + 1:2}: {prompt} prompt tokens, {found} cached, first token after {first:.2f} s")
    rest = [first for first, *_ in cached[1:]]
    if rest:
        median = statistics.median(rest)
        print(f"first {cached[0][0]:.2f} s, the rest's median {median:.2f} s: {cached[0][0] / median:.1f}x faster")
    if args.compare:
        plain = run(args, 0, system)
        same = sum(a[1] == b[1] for a, b in zip(cached, plain))
        print(f"without the cache: first token after {statistics.median(p[0] for p in plain):.2f} s (median); "
              f"{same} of {len(plain)} answers equal")
        if same != len(plain):
            sys.exit(1)


if __name__ == "__main__":
    main()
