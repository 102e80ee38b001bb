#!/usr/bin/env python3
"""Builds the Kimi-K2.5 multimodal fixture (MoonViT vision tower, patchmerger projector and a tiny
DeepSeek-V3 text model) with Hugging Face transformers (models/kimi_k25), on the GPU machine.

  python3 tools/make_vision_fixture.py OUT_DIR [PHOTO.png]

Writes OUT_DIR/models/kimi_k25_hf/ (config.json and model.safetensors in the checkpoint's own names,
as Moonshot's hub folders have them: vision_tower.encoder.blocks.N.wqkv, mm_projector.proj.0,
language_model.model.*) and OUT_DIR/references/kimi_k25_hf.safetensors:
  pixel_values [P, 3, 14, 14], grid_thw [I, 3]   the images: PHOTO through transformers'
                                                 Kimi_K25ImageProcessor when given (tests/fixtures/
                                                 images/photo.png), then random pixels on a 2 x 6
                                                 grid
  vision_hidden [P, D]      the tower's last hidden state (after final_layernorm)
  image_embeds [M, H]       the projector's output (get_image_features), M = sum(t*h*w) / 4
  input_ids [T]             text ids with each image's placeholders expanded (image_token_id)
  logits [T, V]             the model's logits for input_ids with the images
  greedy [G]                greedy tokens continuing the prompt (with the images)
  greedy_margin [G]         each greedy step's top-1 / top-2 logit gap
  resize_src [5, 7, 3], resize_up [9, 12, 3], resize_down [3, 2, 3]
                            torch's bicubic F.interpolate (align_corners=False) of a random grid

The saved folder is read back fresh in float32 (eager attention, TF32 off) and every parameter
must arrive with the values the model had: that is how the rewrite into the checkpoint's names
is checked against what transformers reads (its own conversion of the hub layout). If this
transformers does not read that layout, the script says so and keeps transformers' names.
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.set_float32_matmul_precision("highest")

OUT = sys.argv[1]
PHOTO = sys.argv[2] if len(sys.argv) > 2 else None
NAME = "kimi_k25_hf"
IMAGE_TOKEN = 500

TEXT = dict(model_type="deepseek_v3", vocab_size=512, hidden_size=64, intermediate_size=128,
            moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
            n_group=2, topk_group=1, first_k_dense_replace=1, routed_scaling_factor=2.5,
            norm_topk_prob=True, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16,
            qk_rope_head_dim=8, v_head_dim=24, head_dim=8, rms_norm_eps=1e-6,
            max_position_embeddings=256, rope_interleave=True, tie_word_embeddings=False,
            bos_token_id=0, eos_token_id=1,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0))
VISION = dict(patch_size=14, pos_emb_height=4, pos_emb_width=4, pos_emb_time=4,
              num_attention_heads=4, num_hidden_layers=2, hidden_size=64, intermediate_size=96,
              hidden_act="gelu_pytorch_tanh", merge_kernel_size=[2, 2])


def log(*a):
    print(*a, flush=True)


def scaled_init(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and "embed" not in name and "position_embeddings" not in name:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)
            elif "position_embeddings" in name or "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif name.endswith("bias") and "e_score_correction" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            elif "e_score_correction" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
            else:  # norm weights
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
        # bf16-representable values: the folder is saved in bf16, the references read it in f32.
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))


def head_perm(rows, head_dim):
    """transformers' q/k row order (rotate_half halves) from the checkpoint's (complex pairs):
    within a head, transformers' row j < d/2 is the pair's real part 2j, row j + d/2 its
    imaginary part 2j + 1."""
    idx = []
    for h in range(rows // head_dim):
        base = h * head_dim
        idx += [base + 2 * j for j in range(head_dim // 2)]
        idx += [base + 2 * j + 1 for j in range(head_dim // 2)]
    return torch.tensor(idx)


def to_checkpoint_names(sd, head_dim):
    """transformers' parameter names -> the hub checkpoint's (Moonshot's MoonViT names)."""
    out = {}
    qkv = {}
    for k, v in sd.items():
        n = k
        if n.startswith("model.language_model."):
            n = "language_model.model." + n[len("model.language_model."):]
        elif n.startswith("lm_head."):
            n = "language_model." + n
        elif n.startswith("model.mm_projector."):
            n = n[len("model."):].replace(".in_proj.", ".proj.0.").replace(".out_proj.", ".proj.2.")
        elif n.startswith("model.vision_tower."):
            n = n[len("model."):]
            n = n.replace("pos_emb.position_embeddings", "pos_emb.weight")
            n = n.replace("vision_tower.final_layernorm", "vision_tower.encoder.final_layernorm")
            if ".layers." in n:
                pre, rest = n.split(".layers.", 1)
                i, rest = rest.split(".", 1)
                rest = (rest.replace("norm1.", "norm0.").replace("norm2.", "norm1.")
                        .replace("attn.proj.", "wo.").replace("mlp.fc1.", "mlp.fc0.")
                        .replace("mlp.fc2.", "mlp.fc1."))
                n = f"{pre}.encoder.blocks.{i}.{rest}"
                for part in ("q", "k", "v"):
                    tag = f"attn.{part}_proj."
                    if rest.startswith(tag):
                        kind = rest[len(tag):]
                        qkv.setdefault((f"{pre}.encoder.blocks.{i}", kind), {})[part] = v
                        n = None
        if n is not None:
            out[n] = v
    for (blk, kind), parts in qkv.items():
        q, k, v = parts["q"], parts["k"], parts["v"]
        inv = torch.argsort(head_perm(q.shape[0], head_dim))
        out[f"{blk}.wqkv.{kind}"] = torch.cat([q[inv], k[inv], v], 0).contiguous()
    return out


def main():
    log("transformers", transformers.__version__, "torch", torch.__version__)
    from transformers.models.kimi_k25 import modeling_kimi_k25 as mk
    cfg = transformers.Kimi_K25Config(text_config=dict(TEXT), vision_config=dict(VISION),
                                      projection_hidden_size=VISION["hidden_size"],
                                      image_token_id=IMAGE_TOKEN, tie_word_embeddings=False)
    cfg.text_config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = mk.Kimi_K25ForConditionalGeneration(cfg).float().eval()
    scaled_init(model, 7)
    head_dim = VISION["hidden_size"] // VISION["num_attention_heads"]

    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        for c in get_model_conversion_mapping(model):
            log("conversion:", repr(c)[:300])
    except Exception as e:  # noqa: BLE001
        log("conversion mapping not listed:", e)

    # The images: the photograph through transformers' processor (square crop, so its
    # (height, width) order question does not arise; 36 patches at most, so it is downscaled),
    # then random pixels on a 2 x 6 grid: the 4 x 4 position grid is resized down in one
    # direction and up in the other.
    pixels, grids = [], []
    if PHOTO:
        from PIL import Image
        img = Image.open(PHOTO).convert("RGB")
        s = min(img.size)
        img = img.crop((0, 0, s, s))
        proc = transformers.Kimi_K25ImageProcessor()
        feats = proc(images=[img], max_patches=36, return_tensors="pt")
        pixels.append(feats["pixel_values"].float())
        grids.append(feats["image_grid_thw"][0].tolist())
        log("photo", img.size, "grid", grids[-1])
    g = torch.Generator().manual_seed(3)
    h, w = 2, 6
    pixels.append(torch.rand((h * w, 3, 14, 14), generator=g) * 2 - 1)
    grids.append([1, h, w])
    pixel_values = torch.cat(pixels, 0)
    grid_thw = torch.tensor(grids, dtype=torch.long)

    # The prompt: text, image 1's placeholders, text, image 2's, text.
    gen = torch.Generator().manual_seed(5)
    ids = [0]
    for t, gh, gw in grids:
        ids += torch.randint(2, IMAGE_TOKEN, (5,), generator=gen).tolist()
        ids += [IMAGE_TOKEN] * (t * gh * gw // 4)
    ids += torch.randint(2, IMAGE_TOKEN, (7,), generator=gen).tolist()
    input_ids = torch.tensor([ids])

    folder = os.path.join(OUT, "models", NAME)
    os.makedirs(folder, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(folder)
    model.float()
    saved = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            saved.update(load_file(os.path.join(folder, f)))
            os.remove(os.path.join(folder, f))
    log("saved by transformers:", sorted(k for k in saved if "vision" in k or "projector" in k)[:40])
    if any(".wqkv." in k for k in saved):
        # transformers 5.17 writes its renames back only in part (the text layers as
        # language_model.model.blocks.N, the projector's norm as model.mm_projector.pre_norm):
        # the hub's own names, which the reload below must read to the same values.
        ckpt = {}
        for k, v in saved.items():
            k = k.replace("language_model.model.blocks.", "language_model.model.layers.")
            if k.startswith("model.mm_projector."):
                k = k[len("model."):]
            ckpt[k] = v
        layout = "the hub's names (transformers' save, its partial renames undone)"
    else:
        ckpt = to_checkpoint_names(saved, head_dim)
        layout = "rewritten into the checkpoint's names"
    for idx in [f for f in os.listdir(folder) if f.endswith(".index.json")]:
        os.remove(os.path.join(folder, idx))
    save_file(ckpt, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    c = json.load(open(os.path.join(folder, "config.json")))
    c["architectures"] = ["KimiK25ForConditionalGeneration"]
    json.dump(c, open(os.path.join(folder, "config.json"), "w"), indent=2)

    fresh = mk.Kimi_K25ForConditionalGeneration.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager")
    fresh.eval()
    want = dict(model.named_parameters())
    bad = [n for n, p in fresh.named_parameters() if not torch.equal(p, want[n])]
    if bad:
        log(f"{layout}: transformers did not read these back equal:", bad[:20])
        log("keeping transformers' own names")
        save_file({k: v.contiguous() for k, v in saved.items()},
                  os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
        fresh = mk.Kimi_K25ForConditionalGeneration.from_pretrained(
            folder, dtype=torch.float32, attn_implementation="eager").eval()
        bad = [n for n, p in fresh.named_parameters() if not torch.equal(p, want[n])]
        assert not bad, bad[:20]
        layout = "transformers' names"
    log("layout:", layout)

    dev = "cpu"  # fp32 on the CPU: no GPU kernel choices (TF32, fused attention) in the reference
    fresh.to(dev)
    with torch.no_grad():
        feats = fresh.model.get_image_features(pixel_values.to(dev), grid_thw.to(dev), return_dict=True)
        image_embeds = torch.cat(feats.pooler_output, 0)
        vision_hidden = feats.last_hidden_state
        out = fresh(input_ids=input_ids.to(dev), pixel_values=pixel_values.to(dev),
                    image_grid_thw=grid_thw.to(dev))
        logits = out.logits[0]
        seq = input_ids.to(dev)
        greedy, margins = [], []
        for _ in range(8):
            o = fresh(input_ids=seq, pixel_values=pixel_values.to(dev), image_grid_thw=grid_thw.to(dev))
            top = o.logits[0, -1].topk(2)
            greedy.append(int(top.indices[0]))
            margins.append(float(top.values[0] - top.values[1]))
            seq = torch.cat([seq, top.indices[:1].view(1, 1)], 1)
    log("greedy", greedy, "min margin", min(margins))
    log("logits std", float(logits.std()), "image_embeds std", float(image_embeds.std()))
    # torch's bicubic resize (align_corners=False), the position grid's, on its own: up and down.
    rs = torch.randn((5, 7, 3), generator=torch.Generator().manual_seed(11))
    chw = rs.permute(2, 0, 1)[None]
    up = torch.nn.functional.interpolate(chw, size=(9, 12), mode="bicubic", align_corners=False)
    down = torch.nn.functional.interpolate(chw, size=(3, 2), mode="bicubic", align_corners=False)
    refs = dict(resize_src=rs, resize_up=up[0].permute(1, 2, 0).contiguous(),
                resize_down=down[0].permute(1, 2, 0).contiguous(),
                pixel_values=pixel_values, grid_thw=grid_thw.to(torch.int64),
                vision_hidden=vision_hidden.float().cpu(), image_embeds=image_embeds.float().cpu(),
                input_ids=input_ids[0].to(torch.int64), logits=logits.float().cpu(),
                greedy=torch.tensor(greedy, dtype=torch.int64),
                greedy_margin=torch.tensor(margins, dtype=torch.float32))
    os.makedirs(os.path.join(OUT, "references"), exist_ok=True)
    save_file({k: v.contiguous() for k, v in refs.items()},
              os.path.join(OUT, "references", NAME + ".safetensors"))
    log("wrote", folder)


if __name__ == "__main__":
    main()
