"""Trains the small text model the tests read text from: the seed's own
architecture (transformers' `Qwen3_5MoeForCausalLM`: Gated DeltaNet and gated
attention, routed and shared experts) at a tiny size, with a byte-level BPE
tokenizer trained the way Qwen's was (GPT-2's byte alphabet, the `qwen35`
pre-tokenizer pattern llama.cpp names, Qwen's special tokens) and Qwen3.5's
chat template.

The corpus is real text in several scripts, from Debian packages (installed
by this script when missing): fortune collections in English (fortunes-min,
BSD), German (fortunes-de, GPL-2+), Russian (fortunes-ru, GPL-2+) and Chinese
(fortunes-zh: Tang and Song poems, GPL-3+), Unicode CLDR's emoji annotations
in English, German, Russian and Chinese (unicode-cldr-core, Unicode-DFS-2016),
and code: this project's own Linnet and Rust sources at a fixed commit
(Apache-2.0). Every 20th entry of each source is held out, never trained on.
A third of the training documents are chat turns in the template's format.

Deterministic: the corpus is read in a fixed order, the tokenizer and the
model are trained from fixed seeds on one thread set. About 15 minutes on two
cores. Not run by CI: its outputs are the fixture
`tests/fixtures/tiny-qwen3.5-moe-text` (see its README).

Usage (the venv of ../shared/bench/setup.sh: torch, transformers, tokenizers):
  /tmp/linnet-bench/venv/bin/python scripts/train-text-model.py [--steps N] [--out DIR]
"""

import argparse
import glob
import hashlib
import json
import math
import os
import random
import re
import shutil
import subprocess
import time
import xml.etree.ElementTree as ElementTree

import torch
from safetensors.torch import save_file
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3_5MoeForCausalLM
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The sources trained on, as this commit holds them.
CODE_COMMIT = "08e9f60"
CODE_PATHS = ["stdlib", "models/qwen3.6-35b-a3b/src", "runtime/src/server", "runtime/src/sampling.rs"]
PACKAGES = ["fortunes-min", "fortunes-de", "fortunes-ru", "fortunes-zh", "unicode-cldr-core"]
FORTUNES = "/usr/share/games/fortunes"
CLDR = "/usr/share/unicode/cldr/common/annotations"
# Qwen3.5's pre-tokenizer pattern (llama.cpp's `qwen35`).
PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added as Qwen3's are: whole tokens, but text (not special).
TAGS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]
VOCAB = 2048
HELD_OUT_EVERY = 20
# A cap on each source's training text, so no language drowns the others.
CAP = 260_000
ASK = {
    "en": ["Tell me something.", "Say something wise.", "A fortune, please."],
    "de": ["Erzähl mir etwas.", "Sag etwas Kluges.", "Einen Spruch, bitte."],
    "ru": ["Расскажи что-нибудь.", "Скажи что-нибудь умное.", "Анекдот, пожалуйста."],
    "zh": ["给我念一首诗。", "说点什么吧。", "来一首唐诗。"],
    "emoji": ["Which emoji?", "Ein Emoji, bitte.", "Какой эмодзи?"],
    "code": ["Show me some code.", "Zeig mir Code.", "Покажи код."],
}


def install_packages():
    missing = [p for p in PACKAGES if subprocess.run(["dpkg", "-s", p], capture_output=True).returncode != 0]
    if missing:
        subprocess.run(["apt-get", "install", "-y", "-q"] + missing, check=True)


def fortunes(paths):
    entries = []
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        # Terminal escapes (some Chinese files colour their titles).
        text = re.sub(r"\x1b\[[0-9;]*m", "", text)
        entries += [e.strip("\n") for e in re.split(r"^%$", text, flags=re.M) if e.strip()]
    return entries


def fortune_files(folder, names=None):
    paths = sorted(glob.glob(os.path.join(folder, "*")))
    keep = [p for p in paths if os.path.isfile(p) and not os.path.islink(p) and not p.endswith(".dat")]
    return [p for p in keep if names is None or os.path.basename(p) in names]


def emoji_lines(language):
    tree = ElementTree.parse(os.path.join(CLDR, f"{language}.xml"))
    lines = []
    for node in tree.iter("annotation"):
        if node.get("type") == "tts":
            lines.append(f"{node.get('cp')} {node.text}")
    return ["\n".join(lines[i : i + 8]) for i in range(0, len(lines), 8)]


def code_entries():
    files = subprocess.run(
        ["git", "-C", ROOT, "ls-tree", "-r", "--name-only", CODE_COMMIT, "--"] + CODE_PATHS,
        capture_output=True, text=True, check=True,
    ).stdout.split()
    entries = []
    for name in sorted(files):
        text = subprocess.run(["git", "-C", ROOT, "show", f"{CODE_COMMIT}:{name}"], capture_output=True, text=True,
                              check=True).stdout
        # A file's top-level items, an entry each.
        entries += [part.strip("\n") for part in re.split(r"\n\n(?=\S)", text) if part.strip()]
    return entries


def sources():
    return {
        "en": fortunes(fortune_files(FORTUNES, {"fortunes", "literature", "riddles"})),
        "de": fortunes(fortune_files(os.path.join(FORTUNES, "de"))),
        "ru": fortunes(fortune_files(os.path.join(FORTUNES, "ru"))),
        "zh": fortunes(fortune_files(FORTUNES, {"tang300", "song100"})),
        "emoji": sum((emoji_lines(language) for language in ["en", "de", "ru", "zh"]), []),
        "code": code_entries(),
    }


def split(entries):
    """Training entries (up to CAP characters' worth) and held-out ones."""
    train, held = [], []
    size = 0
    for at, entry in enumerate(entries):
        if at % HELD_OUT_EVERY == HELD_OUT_EVERY - 1:
            held.append(entry)
        elif size < CAP:
            train.append(entry)
            size += len(entry)
    return train, held


def chat(question, answer):
    return (f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
            f"{answer}<|im_end|>")


def train_tokenizer(texts):
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - len(SPECIAL) - len(TAGS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.add_special_tokens(SPECIAL)
    tokenizer.add_tokens(TAGS)
    assert tokenizer.get_vocab_size() == VOCAB, tokenizer.get_vocab_size()
    return tokenizer


def config():
    return Qwen3_5MoeTextConfig(
        vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
        linear_value_head_dim=64, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=256, shared_expert_intermediate_size=256, max_position_embeddings=512,
        rms_norm_eps=1e-6, tie_word_embeddings=False,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
        eos_token_id=None, bos_token_id=None, pad_token_id=None,
    )


def batches(stream, seq, batch, generator):
    while True:
        starts = torch.randint(0, len(stream) - seq - 1, (batch,), generator=generator)
        yield torch.stack([stream[s : s + seq + 1] for s in starts.tolist()])


def train(parameters, loss_of, stream, steps, lr, warmup, generator):
    """AdamW on `parameters` for `steps` batches of 16 × 257 tokens of
    `stream`, the learning rate warmed up then on a cosine; the last loss."""
    optimizer = torch.optim.AdamW(parameters, lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(step, steps) / steps)),
    )
    started = time.time()
    for step, batch in zip(range(steps), batches(stream, 256, 16, generator)):
        loss = loss_of(batch)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        schedule.step()
        if step % 25 == 0 or step == steps - 1:
            print(f"step {step}: loss {loss.item():.3f} ({time.time() - started:.0f} s)", flush=True)
    return loss


def save(model, tokenizer_files, out):
    os.makedirs(out, exist_ok=True)
    tensors = {}
    for name, tensor in model.state_dict().items():
        name = name.replace("model.", "model.language_model.", 1) if name.startswith("model.") else name
        tensors[name] = tensor.detach().to(torch.float32).contiguous()
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg["architectures"] = ["Qwen3_5MoeForCausalLM"]
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    for name, path in tokenizer_files.items():
        shutil.copy(path, os.path.join(out, name))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--out", default=os.path.join(ROOT, "tests/fixtures/tiny-qwen3.5-moe-text"))
    args = parser.parse_args()
    install_packages()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    random.seed(0)

    train, held = {}, {}
    for name, entries in sources().items():
        train[name], held[name] = split(entries)
        print(f"{name}: {len(train[name])} entries trained on, {len(held[name])} held out")
    documents = []
    rng = random.Random(0)
    for name, entries in train.items():
        for entry in entries:
            documents.append(chat(rng.choice(ASK[name]), entry) if rng.random() < 1 / 3 else entry)
    rng.shuffle(documents)
    corpus = "<|endoftext|>".join(documents)
    digest = hashlib.sha256(corpus.encode()).hexdigest()

    work = os.path.join(args.out, "work")
    os.makedirs(work, exist_ok=True)
    tokenizer = train_tokenizer(documents)
    tokenizer.save(os.path.join(work, "tokenizer.json"))
    with open(os.path.join(ROOT, "tests/fixtures/chat-templates/qwen3.5.jinja")) as f:
        template = f.read()
    fast = PreTrainedTokenizerFast(tokenizer_file=os.path.join(work, "tokenizer.json"), eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", clean_up_tokenization_spaces=False)
    fast.chat_template = template
    fast.save_pretrained(work)
    with open(os.path.join(work, "generation_config.json"), "w") as f:
        ids = [tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>")]
        json.dump({"eos_token_id": ids, "do_sample": False}, f, indent=2)

    ids = tokenizer.encode(corpus).ids
    stream = torch.tensor(ids, dtype=torch.long)
    print(f"corpus: {len(corpus)} characters, {len(ids)} tokens, sha256 {digest}")

    model = Qwen3_5MoeForCausalLM(config())
    print(f"model: {sum(p.numel() for p in model.parameters())} parameters")
    model.train()
    # The labels are shifted inside: the loss is of each next token.
    train(list(model.parameters()), lambda batch: model(input_ids=batch, labels=batch).loss, stream, args.steps,
          lr=3e-3, warmup=50, generator=torch.Generator().manual_seed(0))
    model.eval()

    files = {name: os.path.join(work, name)
             for name in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"]}
    save(model, files, os.path.join(args.out, "weights-f32"))
    with open(os.path.join(args.out, "held-out.txt"), "w") as f:
        f.write("\n\n".join(sum((held[name][:40] for name in held), [])) + "\n")
    with open(os.path.join(args.out, "corpus.json"), "w") as f:
        json.dump({"sha256": digest, "characters": len(corpus), "tokens": len(ids), "steps": args.steps,
                   "code_commit": CODE_COMMIT,
                   "held_out_entries": {name: len(entries) for name, entries in held.items()}}, f, indent=2)
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
