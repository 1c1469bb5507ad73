"""Writes what transformers makes of the trained text model (the fixture
`tests/fixtures/tiny-qwen3.5-moe-text`), for the text tests to hold Linnet
to: greedy continuations of prompts in each script, as token ids and as the
text `tokenizer.decode` gives for them, through the completion and the chat
route; and the perplexity of the held-out text computed as llama.cpp's
`llama-perplexity` computes it (chunks of `ctx` tokens, each scored on its
second half).

Usage (the venv of ../shared/bench/setup.sh):
  /tmp/linnet-bench/venv/bin/python scripts/text-golden.py [FIXTURE]
"""

import json
import math
import os
import sys

import torch
from transformers import AutoTokenizer, Qwen3_5MoeForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests/fixtures/tiny-qwen3.5-moe-text")
NEW_TOKENS = 24
PROMPTS = {
    "en": "The best way to",
    "de": "Der Mensch ist",
    "ru": "Жизнь — это",
    "zh": "床前明月光，",
    "emoji": "🍎 red apple\n",
    "code": "pub fn ",
}
QUESTIONS = {
    "en": "Tell me something.",
    "de": "Erzähl mir etwas.",
    "ru": "Расскажи что-нибудь.",
    "zh": "给我念一首诗。",
}


def load():
    weights = os.path.join(FIXTURE, "weights-f32")
    tokenizer = AutoTokenizer.from_pretrained(weights)
    model = Qwen3_5MoeForCausalLM.from_pretrained(weights, key_mapping={r"^model\.language_model\.": "model."},
                                                  dtype=torch.float32)
    model.eval()
    return tokenizer, model


def greedy(model, tokenizer, ids):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                             eos_token_id=model.generation_config.eos_token_id, pad_token_id=0)
    new = out[0, len(ids):].tolist()
    return {"prompt_ids": ids, "ids": new, "text": tokenizer.decode(new, skip_special_tokens=True)}


def perplexity(model, tokenizer, text, ctx):
    """llama-perplexity's computation, in transformers."""
    tokens = tokenizer(text).input_ids
    first = ctx // 2
    nll, count = 0.0, 0
    for start in range(0, len(tokens) // ctx * ctx, ctx):
        chunk = torch.tensor([tokens[start:start + ctx]])
        with torch.no_grad():
            logits = model(chunk).logits[0].double()
        log_probs = torch.log_softmax(logits, dim=-1)
        for at in range(first, ctx - 1):
            nll -= log_probs[at, tokens[start + at + 1]].item()
            count += 1
    return {"ctx": ctx, "tokens": len(tokens), "scored": count, "ppl": math.exp(nll / count)}


def main():
    tokenizer, model = load()
    completions = {}
    for script, prompt in PROMPTS.items():
        completions[script] = {"prompt": prompt, **greedy(model, tokenizer, tokenizer(prompt).input_ids)}
        print(script, repr(completions[script]["text"]))
    chats = {}
    for script, question in QUESTIONS.items():
        messages = [{"role": "user", "content": question}]
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                               enable_thinking=False)
        chats[script] = {"question": question, **greedy(model, tokenizer, tokenizer(prompt).input_ids)}
        print(script, repr(chats[script]["text"]))
    with open(os.path.join(FIXTURE, "held-out.txt")) as f:
        held_out = f.read()
    scores = [perplexity(model, tokenizer, held_out, ctx) for ctx in (64, 256)]
    for score in scores:
        print(f"perplexity at ctx {score['ctx']}: {score['ppl']:.4f} over {score['scored']} tokens")
    golden = {"transformers": __import__("transformers").__version__, "torch": torch.__version__,
              "completions": completions, "chats": chats, "perplexity": scores}
    with open(os.path.join(FIXTURE, "golden-text.json"), "w") as f:
        json.dump(golden, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
