#!/usr/bin/env python3
"""Builds the tiny reference checkpoints under tests/fixtures/models with Hugging Face transformers.

Runs on the GPU machine (transformers 5.17, PyTorch 2.11). For each fixture it:
  1. builds a random-weight model from a config (hidden 64-128, 2-3 layers, vocab <= 1000), with
     weights scaled so the logits are far from flat;
  2. saves it with save_pretrained (bf16 unless the fixture says f32), optionally sharded, and
     optionally rewrites config.json into the legacy layout (rope_theta + rope_scaling,
     torch_dtype) so the loader's both forms are exercised - transformers then reloads that file;
  3. reloads the saved folder in float32 with eager attention (TF32 off) and records the logits
     for fixed token ids plus 16 greedy tokens from a fixed prompt, with each step's top-1/top-2
     margin, into OUT_DIR/references/NAME.safetensors (outside the model folder, whose every
     tensor must belong to the model).

Checkpoints go to OUT_DIR/models/NAME. Usage: python3 tools/make_fixtures.py tests/fixtures [NAME ...]
"""
import json
import math
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import save_file

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.set_float32_matmul_precision("highest")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

FIXTURES = [
    dict(
        name="llama3_gqa",
        cls="LlamaConfig",
        config=dict(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                    num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512,
                    rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                    rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                                         low_freq_factor=1.0, high_freq_factor=4.0,
                                         original_max_position_embeddings=64)),
        generation_config=dict(bos_token_id=1, eos_token_id=[2, 5]),
        tokens=48, seed=1),
    dict(
        name="llama_yarn_bias_legacy",
        cls="LlamaConfig",
        config=dict(vocab_size=512, hidden_size=96, intermediate_size=192, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                    attention_bias=True, mlp_bias=True, max_position_embeddings=256,
                    rms_norm_eps=1e-6, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=8.0,
                                         original_max_position_embeddings=32)),
        legacy_config=True,
        tokens=64, seed=2),
    dict(
        name="llama_linear_sharded_f32",
        cls="LlamaConfig",
        config=dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                    rms_norm_eps=1e-6, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0)),
        save_dtype="float32", shards=2,
        tokens=40, seed=3),
    dict(
        name="qwen3_tied",
        cls="Qwen3Config",
        config=dict(vocab_size=800, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                    max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=True,
                    rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
        tokens=48, seed=4),
    dict(
        name="qwen3_sliding",
        cls="Qwen3Config",
        config=dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                    max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
                    use_sliding_window=True, sliding_window=8, max_window_layers=1,
                    rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
        tokens=40, seed=5),
]

GREEDY_PROMPT = 7
GREEDY_TOKENS = 16
MIN_MARGIN = 0.02


def scale_weights(model, seed):
    """Random weights that keep activations O(1) and logits spread over several units."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                v = 0.75 + 0.5 * torch.rand(p.shape, generator=g)
            elif name.endswith("bias"):
                v = 0.2 * torch.randn(p.shape, generator=g)
            elif "embed_tokens" in name:
                v = torch.randn(p.shape, generator=g)
            elif name.startswith("lm_head"):
                v = 3.0 * torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1])
            else:
                v = 1.2 * torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1])
            p.copy_(v.to(p.dtype))


def to_legacy(config_path):
    """Rewrites a transformers-v5 config.json into the layout older hub files use."""
    with open(config_path) as f:
        c = json.load(f)
    rp = c.pop("rope_parameters")
    c["rope_theta"] = rp.pop("rope_theta")
    rtype = rp.pop("rope_type")
    if rtype != "default":
        rp["type"] = rtype
        c["rope_scaling"] = rp
    else:
        c["rope_scaling"] = None
    if "dtype" in c:
        c["torch_dtype"] = c.pop("dtype")
    with open(config_path, "w") as f:
        json.dump(c, f, indent=2)


@torch.no_grad()
def logits_of(model, ids):
    out = model(input_ids=torch.tensor([ids], device=DEVICE))
    return out.logits[0].float().cpu()


@torch.no_grad()
def greedy(model, prompt, n):
    ids = list(prompt)
    margins = []
    for _ in range(n):
        last = logits_of(model, ids)[-1]
        top = torch.topk(last, 2)
        margins.append(float(top.values[0] - top.values[1]))
        ids.append(int(top.indices[0]))
    return ids[len(prompt):], margins


def build(fx, out_root):
    out = os.path.join(out_root, "models", fx["name"])
    ref_root = os.path.join(out_root, "references")
    os.makedirs(ref_root, exist_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    torch.manual_seed(fx["seed"])
    cfg = getattr(transformers, fx["cls"])(**fx["config"])
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    scale_weights(model, fx["seed"])
    save_dtype = getattr(torch, fx.get("save_dtype", "bfloat16"))
    model = model.to(save_dtype)
    kwargs = {}
    if fx.get("shards"):
        total = sum(p.numel() * p.element_size() for p in model.state_dict().values())
        kwargs["max_shard_size"] = int(total / fx["shards"] * 1.05)
    model.save_pretrained(out, **kwargs)
    if "generation_config" in fx:
        with open(os.path.join(out, "generation_config.json"), "w") as f:
            json.dump(fx["generation_config"], f, indent=2)
    if fx.get("legacy_config"):
        to_legacy(os.path.join(out, "config.json"))

    ref = transformers.AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager").to(DEVICE).eval()
    V = fx["config"]["vocab_size"]
    g = torch.Generator().manual_seed(1000 + fx["seed"])
    ids = torch.randint(3, V, (fx["tokens"],), generator=g).tolist()
    logits = logits_of(ref, ids)
    for attempt in range(50):
        prompt = torch.randint(3, V, (GREEDY_PROMPT,), generator=g).tolist()
        gen, margins = greedy(ref, prompt, GREEDY_TOKENS)
        if min(margins) >= MIN_MARGIN:
            break
    else:
        raise SystemExit(f"{fx['name']}: no prompt with greedy margins >= {MIN_MARGIN}")
    save_file({
        "input_ids": torch.tensor(ids, dtype=torch.int64),
        "logits": logits.contiguous(),
        "greedy_prompt": torch.tensor(prompt, dtype=torch.int64),
        "greedy_tokens": torch.tensor(gen, dtype=torch.int64),
        "greedy_margins": torch.tensor(margins, dtype=torch.float32),
    }, os.path.join(ref_root, fx["name"] + ".safetensors"), metadata={
        "transformers": transformers.__version__, "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
        "attn_implementation": "eager", "compute_dtype": "float32", "tf32": "off",
        "tool": "tools/make_fixtures.py"})
    std = float(logits.std())
    files = sorted(os.listdir(out))
    size = sum(os.path.getsize(os.path.join(out, f)) for f in files)
    size += os.path.getsize(os.path.join(ref_root, fx["name"] + ".safetensors"))
    print(f"{fx['name']}: {files} {size/1e6:.2f} MB, logits std {std:.2f}, "
          f"min greedy margin {min(margins):.3f}, attempts {attempt + 1}")


def main():
    out_root = sys.argv[1]
    names = set(sys.argv[2:])
    os.makedirs(out_root, exist_ok=True)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, device {DEVICE}")
    for fx in FIXTURES:
        if not names or fx["name"] in names:
            build(fx, out_root)


if __name__ == "__main__":
    main()
