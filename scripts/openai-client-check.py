#!/usr/bin/env python3
"""The official `openai` Python client against `linnet serve` on loopback:
completions and chat, each whole and streamed, and stop strings. Exits 1
on the first answer that is not what the client should get.

    python3 -m venv /tmp/openai && /tmp/openai/bin/pip install openai
    cargo build --release
    /tmp/openai/bin/python scripts/openai-client-check.py
"""

import os
import re
import subprocess
import sys
import threading

import openai

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORACLE = os.path.join(ROOT, "tests/fixtures/oracle/tiny-qwen3.5-moe")


def start():
    command = [
        os.path.join(ROOT, "target/release/linnet"), "serve", os.path.join(ROOT, "models/qwen3.6-35b-a3b"),
        "--nest", os.path.join(ORACLE, "package/nest-f32.toml"), "--weights", os.path.join(ORACLE, "weights-f32"), "--port", "0",
    ]
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    for line in server.stderr:
        found = re.search(r"http://[^\s:]+:(\d+)", line)
        if found:
            threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
            return server, int(found.group(1))
    sys.exit("the server stopped before listening")


def check(what, condition, shown):
    print(f"{'ok ' if condition else 'FAILED'} {what}: {shown!r}")
    if not condition:
        sys.exit(1)


def main():
    server, port = start()
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        model = client.models.list().data[0].id
        whole = client.completions.create(model=model, prompt="t5 t17 t42", max_tokens=6, temperature=0)
        text = whole.choices[0].text
        check("completion", whole.choices[0].finish_reason == "length" and len(text.split()) == 6, text)
        streamed = "".join(chunk.choices[0].text for chunk in client.completions.create(model=model, prompt="t5 t17 t42", max_tokens=6, temperature=0, stream=True))
        check("streamed completion equals the whole one", streamed == text, streamed)
        stop = text.split()[3]
        stopped = client.completions.create(model=model, prompt="t5 t17 t42", max_tokens=6, temperature=0, stop=[stop])
        check("stop string", stopped.choices[0].finish_reason == "stop" and stopped.choices[0].text == text[: text.find(stop)], stopped.choices[0].text)
        messages = [{"role": "user", "content": "t1 t2 t3"}]
        chat = client.chat.completions.create(model=model, messages=messages, max_tokens=5, temperature=0)
        answer = chat.choices[0].message.content
        check("chat", chat.choices[0].message.role == "assistant" and len(answer.split()) == 5, answer)
        pieces = client.chat.completions.create(model=model, messages=messages, max_tokens=5, temperature=0, stream=True)
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in pieces)
        check("streamed chat equals the whole one", streamed == answer, streamed)
        try:
            client.completions.create(model=model, prompt="t1", n=2)
            check("n=2 refused", False, "accepted")
        except openai.BadRequestError as error:
            check("n=2 refused with 400", "`n`" in str(error), str(error)[:80])
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
