"""Train the multi-token-prediction layer of the trained text model.

The model of `tests/fixtures/tiny-qwen3.5-moe-text` (made by
`train-text-model.py`) stays as it is; beside it this trains the layer
Qwen3.5 checkpoints keep as `mtp.*` (vLLM's `Qwen3NextMultiTokenPredictor`:
at position p, the model's final-normed hidden state and the embedding of
token p + 1, each through its own zero-centered RMS norm, joined
[embedding, hidden], projected by `fc`, one full-attention layer with the
model's mixture of experts, a final norm and the model's head give token
p + 2). transformers drops `mtp.*`, so the layer is written here from
transformers' own blocks. Trained on the same corpus as the model (rebuilt
by `train-text-model.py`'s functions, the same held-out split), the model
frozen; the layer starts as a copy of the model's full-attention layer.

Writes the `mtp.*` tensors into the fixture's `model.safetensors` and
`golden-mtp.json`: for prompts of the held-out text, the layer's logits at
every position as this module computes them.

Run in the venv of `../shared/bench/setup.sh`:
    python scripts/train-text-mtp.py [--steps 300]
"""

import argparse
import importlib.util
import json
import os
import random

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from transformers import Qwen3_5MoeForCausalLM
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeDecoderLayer, Qwen3_5MoeRMSNorm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "tests/fixtures/tiny-qwen3.5-moe-text")
WEIGHTS = os.path.join(FIXTURE, "weights-f32")
FULL_ATTENTION_LAYER = 3


def text_model_script():
    spec = importlib.util.spec_from_file_location("train_text_model", os.path.join(ROOT, "scripts/train-text-model.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class MultiTokenPredictor(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        config = model.config
        hidden = config.hidden_size
        self.pre_fc_norm_embedding = Qwen3_5MoeRMSNorm(hidden, eps=config.rms_norm_eps)
        self.pre_fc_norm_hidden = Qwen3_5MoeRMSNorm(hidden, eps=config.rms_norm_eps)
        self.fc = torch.nn.Linear(2 * hidden, hidden, bias=False)
        self.layers = torch.nn.ModuleList([Qwen3_5MoeDecoderLayer(config, layer_idx=FULL_ATTENTION_LAYER)])
        self.layers[0].load_state_dict(model.model.layers[FULL_ATTENTION_LAYER].state_dict())
        self.norm = Qwen3_5MoeRMSNorm(hidden, eps=config.rms_norm_eps)
        self.norm.load_state_dict(model.model.norm.state_dict())

    def forward(self, model, tokens, hidden):
        """Position p of `hidden` (the model's final-normed states) with
        token p of `tokens` (the token after it): the layer's states."""
        length = tokens.shape[1]
        embedded = self.pre_fc_norm_embedding(model.model.embed_tokens(tokens))
        x = self.fc(torch.cat([embedded, self.pre_fc_norm_hidden(hidden)], dim=-1))
        positions = torch.arange(length).unsqueeze(0).expand(tokens.shape[0], -1)
        rotary = model.model.rotary_emb(x, positions)
        mask = torch.full((length, length), float("-inf")).triu(1)[None, None]
        x = self.layers[0](x, position_embeddings=rotary, attention_mask=mask, position_ids=positions)
        return self.norm(x)


def drafted_logits(model, mtp, ids):
    """The layer's logits at every position but the last of `ids`: at p,
    for token p + 2."""
    with torch.no_grad():
        hidden = model.model(input_ids=ids).last_hidden_state
        return model.lm_head(mtp(model, ids[:, 1:], hidden[:, :-1]))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    random.seed(0)
    text = text_model_script()
    text.install_packages()

    # The model's training documents, as `train-text-model.py` made them.
    documents = []
    rng = random.Random(0)
    for name, entries in text.sources().items():
        train, _ = text.split(entries)
        for entry in train:
            documents.append(text.chat(rng.choice(text.ASK[name]), entry) if rng.random() < 1 / 3 else entry)
    rng.shuffle(documents)
    corpus = "<|endoftext|>".join(documents)
    tokenizer = Tokenizer.from_file(os.path.join(WEIGHTS, "tokenizer.json"))
    stream = torch.tensor(tokenizer.encode(corpus).ids, dtype=torch.long)
    print(f"corpus: {len(corpus)} characters, {len(stream)} tokens")

    model = Qwen3_5MoeForCausalLM.from_pretrained(
        WEIGHTS, key_mapping={r"^model\.language_model\.": "model."}, dtype=torch.float32
    )
    model.eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    mtp = MultiTokenPredictor(model)

    def loss_of(batch):
        with torch.no_grad():
            hidden = model.model(input_ids=batch).last_hidden_state
        # At p: the model's state at p and token p + 1 give token p + 2.
        logits = model.lm_head(mtp(model, batch[:, 1:-1], hidden[:, :-2]))
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 2:].reshape(-1))

    loss = text.train(list(mtp.parameters()), loss_of, stream, args.steps, lr=2e-3, warmup=30,
                      generator=torch.Generator().manual_seed(1))
    mtp.eval()

    # Saved under the checkpoint's names, beside the model's tensors.
    path = os.path.join(WEIGHTS, "model.safetensors")
    tensors = {name: tensor for name, tensor in load_file(path).items() if not name.startswith("mtp.")}
    for name, tensor in mtp.state_dict().items():
        tensors["mtp." + name] = tensor.detach().to(torch.float32).contiguous()
    save_file(tensors, path, metadata={"format": "pt"})

    with open(os.path.join(FIXTURE, "held-out.txt")) as f:
        held_out = f.read().split("\n\n")
    golden = {"steps": args.steps, "final_loss": round(loss.item(), 4), "prompts": []}
    for entry in [held_out[0], held_out[45], held_out[85]]:
        ids = tokenizer.encode(entry).ids[:24]
        logits = drafted_logits(model, mtp, torch.tensor([ids]))[0]
        golden["prompts"].append({"ids": ids, "logits": [[round(v, 5) for v in row.tolist()] for row in logits]})
    with open(os.path.join(FIXTURE, "golden-mtp.json"), "w") as f:
        json.dump(golden, f)


if __name__ == "__main__":
    main()
