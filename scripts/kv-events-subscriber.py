#!/usr/bin/env python3
"""A prefix-aware router's view of `linnet serve --kv-events-config`: it
subscribes to the KV-cache events as vLLM's subscribers do (pyzmq, and
msgspec with vLLM's message schema, the classes below as vLLM's
`examples/online_serving/kv_events_subscriber.py` declares them), keeps
the set of blocks the replica holds, asks the replay socket for batches
it missed, and prints each batch.

    linnet serve MODEL --kv-events-config \\
        '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557",
          "replay_endpoint": "tcp://*:5558", "topic": "kv-events"}'
    scripts/kv-events-subscriber.py --events tcp://localhost:5557 --replay tcp://localhost:5558

With --requests N it sends N chat requests sharing a system prompt to
--server, then checks that the blocks held are those the replica's
stored events minus its removed ones, and stops. Needs pyzmq and msgspec.
"""

import argparse
import json
import sys
import threading
import time
import urllib.request

import msgspec
import zmq


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int | bytes]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


def chat(server: str, system: str, question: str) -> None:
    body = json.dumps({
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 4,
        "temperature": 0,
    }).encode()
    request = urllib.request.Request(f"{server}/v1/chat/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        response.read()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", default="tcp://localhost:5557")
    parser.add_argument("--replay", default="tcp://localhost:5558")
    parser.add_argument("--topic", default="kv-events")
    parser.add_argument("--server", default="http://127.0.0.1:8000")
    parser.add_argument("--requests", type=int, default=0)
    args = parser.parse_args()

    context = zmq.Context()
    subscriber = context.socket(zmq.SUB)
    subscriber.connect(args.events)
    subscriber.setsockopt_string(zmq.SUBSCRIBE, args.topic)
    replay = context.socket(zmq.DEALER)
    replay.connect(args.replay)
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    time.sleep(0.5)

    if args.requests:
        system = "You are a careful assistant. " * 40
        threading.Thread(
            target=lambda: [chat(args.server, system, f"Question {i}: what is {i} + {i}?") for i in range(args.requests)],
            daemon=True,
        ).start()

    held: dict = {}
    last = -1
    batches = 0
    while True:
        if not subscriber.poll(5000 if args.requests else None):
            break
        _, sequence, payload = subscriber.recv_multipart()
        sequence = int.from_bytes(sequence, "big", signed=True)
        pending = [(sequence, payload)]
        if last >= 0 and sequence > last + 1:
            replay.send_multipart([b"", (last + 1).to_bytes(8, "big")])
            pending = []
            while True:
                _, replayed, replayed_payload = replay.recv_multipart()
                replayed = int.from_bytes(replayed, "big", signed=True)
                if replayed == -1:
                    break
                if replayed > last:
                    pending.append((replayed, replayed_payload))
        for sequence, payload in pending:
            batch = decoder.decode(payload)
            batches += 1
            for event in batch.events:
                if isinstance(event, BlockStored):
                    assert event.parent_block_hash is None or event.parent_block_hash in held, "a parent never stored"
                    assert len(event.token_ids) == len(event.block_hashes) * event.block_size
                    for at, block in enumerate(event.block_hashes):
                        held[block] = event.token_ids[at * event.block_size:(at + 1) * event.block_size]
                    print(f"{sequence}: stored {len(event.block_hashes)} blocks under {event.parent_block_hash}")
                elif isinstance(event, BlockRemoved):
                    for block in event.block_hashes:
                        held.pop(block)
                    print(f"{sequence}: removed {len(event.block_hashes)} blocks")
                else:
                    held.clear()
                    print(f"{sequence}: all blocks cleared")
            last = sequence
    print(f"{batches} batches decoded; the replica holds {len(held)} blocks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
