#!/usr/bin/env python3
"""Writes a package's gguf.json from its bindings.json: where llama.cpp's
converter (convert_hf_to_gguf.py) puts each checkpoint tensor the bindings
name, and what it changes on the way, for the Qwen3 (`qwen3`), Qwen3.5
dense (`qwen35`), Qwen3.5 MoE (`qwen35moe`) and gpt-oss (`gpt-oss`)
architectures.

The changes, as the converter makes them (conversion/qwen.py):
- Qwen3.5: RMS norm weights are stored plus one (the DeltaNet output norm
  is not); `A_log` as `-exp(A_log)`; `dt_bias` as `ssm_dt.bias`; the
  convolution without its size-1 axis; the experts' fused gate and up
  projection as two tensors; and, where there are more value heads than key
  heads, the value heads reordered from grouped to tiled order in the QKV
  and Z projections, the convolution, `A`, `dt_bias`, `a`, `b` and the
  output projection.
- Qwen3: renames only.
- gpt-oss (conversion/gpt_oss.py, experts not in MXFP4): the experts'
  matrices transposed to `[out, in]`, the fused gate and up projection
  (and its bias) split into two tensors from its interleaved columns,
  the sinks as `attn_sinks.weight`.

Usage: scripts/gguf-names.py models/qwen3.6-35b-a3b qwen35moe
"""
import json, re, sys

package, architecture = sys.argv[1], sys.argv[2]
bindings = json.load(open(f"{package}/bindings.json"))
a = architecture

GPT_OSS = a == "gpt-oss"
metadata = {
    f"{a}.embedding_length": "H",
    f"{a}.attention.head_count": "Heads",
    f"{a}.attention.head_count_kv": "KvHeads",
    f"{a}.attention.key_length": "HeadDim",
    f"{a}.attention.value_length": "HeadDim",
    # θ is a setting of every card; Qwen3.5's packages fix ε.
    f"{a}.rope.freq_base": "Theta",
    f"{a}.attention.layer_norm_rms_epsilon": 1e-6 if a != "qwen3" else "Eps",
}
if GPT_OSS:
    metadata.update({
        f"{a}.block_count": "2 * Groups",
        f"{a}.feed_forward_length": "Inner",
        f"{a}.expert_feed_forward_length": "Inner",
        f"{a}.expert_count": "Experts",
        f"{a}.expert_used_count": "TopK",
        f"{a}.attention.sliding_window": "Window",
        f"{a}.attention.layer_norm_rms_epsilon": "Eps",
        f"{a}.rope.freq_base": "Theta",
        f"{a}.rope.scaling.factor": "RopeFactor",
        f"{a}.rope.scaling.original_context_length": "OriginalContext",
        f"{a}.rope.scaling.yarn_beta_fast": "BetaFast",
        f"{a}.rope.scaling.yarn_beta_slow": "BetaSlow",
        # A list stands for its length: the vocabulary's size.
        "tokenizer.ggml.tokens": "Vocab",
    })
elif a == "qwen3":
    metadata[f"{a}.block_count"] = "Layers"
    metadata[f"{a}.feed_forward_length"] = "Inner"
else:
    metadata.update({
        f"{a}.block_count": "4 * Groups",
        f"{a}.full_attention_interval": 4,
        f"{a}.rope.dimension_count": "HeadDim / 4",
        f"{a}.ssm.conv_kernel": "Width",
        f"{a}.ssm.state_size": "KeyDim",
        f"{a}.ssm.group_count": "KeyHeads",
        f"{a}.ssm.time_step_rank": "ValueHeads",
        f"{a}.ssm.inner_size": "ValueHeads * ValueDim",
    })
if a == "qwen35moe":
    metadata.update({
        f"{a}.expert_count": "Experts",
        f"{a}.expert_used_count": "TopK",
        f"{a}.expert_feed_forward_length": "ExpertInner",
        f"{a}.expert_shared_feed_forward_length": "SharedInner",
    })
if a == "qwen35":
    metadata[f"{a}.feed_forward_length"] = "Inner"

# Checkpoint name (after `model.layers.N.`) to the file's (after `blk.N.`).
LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight" if a != "qwen3" else "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.experts.down_proj": "ffn_down_exps.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
    "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight",
    "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight",
    "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight",
    "linear_attn.A_log": "ssm_a",
    "linear_attn.dt_bias": "ssm_dt.bias",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.sinks": "attn_sinks.weight",
    "mlp.router.weight": "ffn_gate_inp.weight",
    "mlp.router.bias": "ffn_gate_inp.bias",
    "mlp.experts.down_proj_bias": "ffn_down_exps.bias",
}
GLOBAL = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}


def tiled(axis, start, head):
    return {"tiled_heads": {"axis": axis, "from": start, "groups": "KeyHeads",
                            "per_group": "ValueHeads / KeyHeads", "head": head}}


def changes(name):
    """What the converter does to checkpoint tensor `name`, in order."""
    if GPT_OSS:
        return ["transposed"] if name.endswith("mlp.experts.down_proj") else []
    if a == "qwen3":
        return []
    out = []
    qk = "2 * KeyHeads * KeyDim"
    reorder = {
        "linear_attn.in_proj_qkv.weight": tiled(0, qk, "ValueDim"),
        "linear_attn.in_proj_z.weight": tiled(0, 0, "ValueDim"),
        "linear_attn.in_proj_b.weight": tiled(0, 0, 1),
        "linear_attn.in_proj_a.weight": tiled(0, 0, 1),
        "linear_attn.A_log": tiled(0, 0, 1),
        "linear_attn.dt_bias": tiled(0, 0, 1),
        "linear_attn.conv1d.weight": tiled(0, qk, "ValueDim"),
        "linear_attn.out_proj.weight": tiled(1, 0, "ValueDim"),
    }
    for suffix, change in reorder.items():
        if name.endswith(suffix):
            out.append(change)
    if name.endswith(".A_log"):
        out.append("negated_exp")
    elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        out.append({"plus": 1})
    return out


tensors = {}
for param, name in bindings.items():
    short = re.sub(r"^model\.(language_model\.)?", "", name)
    layer = re.match(r"layers\.(\d+)\.(.*)$", short)
    if layer:
        n, rest = layer.groups()
        if rest == "mlp.experts.gate_up_proj" and GPT_OSS:
            # [experts, in, 2 × out], gate and up interleaved along the last axis.
            halves = {"tiled_heads": {"axis": 2, "from": 0, "groups": "Inner", "per_group": 2, "head": 1}}
            tensors[param] = {"concat": [f"blk.{n}.ffn_gate_exps.weight", f"blk.{n}.ffn_up_exps.weight"], "axis": 2,
                              "changes": [halves, "transposed"]}
            continue
        if rest == "mlp.experts.gate_up_proj_bias":
            halves = {"tiled_heads": {"axis": 1, "from": 0, "groups": "Inner", "per_group": 2, "head": 1}}
            tensors[param] = {"concat": [f"blk.{n}.ffn_gate_exps.bias", f"blk.{n}.ffn_up_exps.bias"], "axis": 1,
                              "changes": [halves]}
            continue
        if rest == "mlp.experts.gate_up_proj":
            tensors[param] = {"concat": [f"blk.{n}.ffn_gate_exps.weight", f"blk.{n}.ffn_up_exps.weight"], "axis": 1}
            continue
        target = f"blk.{n}.{LAYER[rest]}"
    else:
        target = GLOBAL[short]
    steps = changes(name)
    tensors[param] = {"tensor": target, "changes": steps} if steps else target

out = {"architecture": a, "metadata": metadata, "tensors": tensors}
with open(f"{package}/gguf.json", "w") as f:
    f.write("{\n")
    f.write(f'"architecture": {json.dumps(a)},\n')
    f.write('"metadata": {\n' + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in metadata.items()) + "\n},\n")
    f.write('"tensors": {\n' + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in tensors.items()) + "\n}\n}\n")
