#!/usr/bin/python3
"""Kimi-K2.5's MoonViT tower and patchmerger projector in plain PyTorch, written from the public
definition as the checkpoint names it (vLLM's kimi_k25_vit.py and Moonshot's modeling code, read,
not copied): a second reference beside transformers' Kimi_K25 port (tools/make_vision_fixture.py),
using torch's own ops for each piece (F.conv2d, F.interpolate bicubic, F.layer_norm, GELU tanh and
erf, softmax attention per image, complex multiplication for the 2D rotary embedding).

  /usr/bin/python3 tools/moonvit_reference.py OUT_DIR

Runs on this machine's Debian PyTorch (python3-torch 1.13). Writes OUT_DIR/models/kimi_k25/ when
it does not exist (the text model is tests/fixtures/models/deepseek_v3's, under the checkpoint's
language_model.* names, so transformers' text references hold for it; the vision tower and
projector are random, bf16-representable) and OUT_DIR/references/kimi_k25_torch.safetensors:
  resize_src [5, 7, 3], resize_up [9, 12, 3], resize_down [3, 2, 3]   F.interpolate bicubic
  pixel_values [P, 3, 14, 14], grid_thw [I, 3]   two images: an 8 x 8 grid and a 2 x 6 one
  vision_hidden [P, D], image_embeds [M, H]      this forward's outputs
  /usr/bin/python3 tools/moonvit_reference.py OUT_DIR float64
writes OUT_DIR/references/kimi_k25_hf_f64.safetensors: the kimi_k25_hf fixture's tower and
projector in float64 on transformers' own images (vision_hidden, image_embeds); kimi_k3 and video
write the K3 tower's and the video references.
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))


def load_safetensors(path):
    import struct
    import numpy as np
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        raw = data[a:b]
        dt = v["dtype"]
        if dt == "BF16":
            u = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            t = torch.from_numpy(u.view(np.float32).copy())
        elif dt == "F32":
            t = torch.from_numpy(np.frombuffer(raw, dtype=np.float32).copy())
        elif dt == "I64":
            t = torch.from_numpy(np.frombuffer(raw, dtype=np.int64).copy())
        else:
            raise ValueError(f"{k}: dtype {dt}")
        out[k] = t.reshape(v["shape"])
    return out


def save_safetensors(tensors, path, bf16=()):
    import struct
    import numpy as np
    header, blobs, off = {}, [], 0
    for k in sorted(tensors):
        t = tensors[k].contiguous()
        if k in bf16:
            u = t.float().numpy().view(np.uint32)
            raw = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).tobytes()
            dt = "BF16"
        elif t.dtype == torch.int64:
            raw, dt = t.numpy().tobytes(), "I64"
        else:
            raw, dt = t.float().numpy().tobytes(), "F32"
        header[k] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def bf16_round(t):
    import numpy as np
    u = t.float().numpy().view(np.uint32)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return torch.from_numpy(r.astype(np.uint32).view(np.float32).copy())


def vision_dims(vc):
    """(hidden, heads, intermediate, qkv width) in the hub's names (vt_*) or transformers'."""
    D = vc.get("vt_hidden_size", vc.get("hidden_size"))
    H = vc.get("vt_num_attention_heads", vc.get("num_attention_heads"))
    inter = vc.get("vt_intermediate_size", vc.get("intermediate_size"))
    return D, H, inter, vc.get("qkv_hidden_size") or D


def norm(x, w, b, kind, eps):
    if kind == "layernorm":
        return F.layer_norm(x, (x.shape[-1],), w, b, eps)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def tower(p, vc, pix, grids, rms_eps=None, trace=None):
    """The tower's last hidden state [P, D] (after final_layernorm). Kimi-K2.5's MoonViT, or
    Kimi-K3's MoonViT3d (norm_type rmsnorm, no biases unless attn_bias / linear_bias /
    patch_embed_proj_bias, pos_emb_interpolation_mode bilinear), by vc's fields. trace: a list
    that gets the embedded patches (position grid added) and then each block's output."""
    D, H, _, Q = vision_dims(vc)
    hd = Q // H
    kind = vc.get("norm_type", "layernorm")
    eps = 1e-5 if kind == "layernorm" else rms_eps
    mode = vc.get("pos_emb_interpolation_mode", "bicubic")
    pre = "vision_tower."
    g = lambda k: p.get(k)  # noqa: E731  absent biases are None
    x = F.conv2d(pix, p[pre + "patch_embed.proj.weight"], g(pre + "patch_embed.proj.bias"),
                 stride=vc["patch_size"]).reshape(pix.shape[0], D)
    grid = p[pre + "patch_embed.pos_emb.weight"]
    pos, cis = [], []
    freqs = 1.0 / (10000.0 ** (torch.arange(0, hd, 4)[: hd // 4].float() / hd))
    # The fixed time table of a video's frames: sin | cos of frame * 10000^(-k / (D / 2)).
    omega = 1.0 / 10000.0 ** (torch.arange(D // 2, dtype=torch.float64) / (D / 2.0))
    for t, h, w in grids:
        if (h, w) == tuple(grid.shape[:2]):
            pe = grid
        else:
            pe = F.interpolate(grid.permute(2, 0, 1)[None], size=(h, w), mode=mode,
                               align_corners=False)[0].permute(1, 2, 0)
        pe = pe.reshape(1, h * w, D).repeat(t, 1, 1)
        if t > 1:
            ang = torch.arange(t, dtype=torch.float64)[:, None] * omega[None]
            pe = pe + torch.cat([ang.sin(), ang.cos()], 1).float()[:, None, :]
        pos.append(pe.reshape(t * h * w, D))
        rows = torch.arange(h).repeat_interleave(w).float()
        cols = torch.arange(w).repeat(h).float()
        xc = torch.polar(torch.ones(h * w, hd // 4), torch.outer(cols, freqs))
        yc = torch.polar(torch.ones(h * w, hd // 4), torch.outer(rows, freqs))
        cis.append(torch.stack([xc, yc], -1).reshape(h * w, hd // 2).repeat(t, 1))
    x = x + torch.cat(pos)
    if trace is not None:
        trace.append(x)
    cis = torch.cat(cis)
    bounds = [0]
    for t, h, w in grids:
        bounds.append(bounds[-1] + t * h * w)

    def rope(v):  # [N, H, hd] as complex pairs (2m, 2m + 1)
        c = torch.view_as_complex(v.reshape(v.shape[0], H, hd // 2, 2).contiguous())
        return torch.view_as_real(c * cis[:, None, :]).reshape(v.shape[0], H, hd)

    i = 0
    while pre + f"encoder.blocks.{i}.wqkv.weight" in p:
        b = pre + f"encoder.blocks.{i}."
        h = norm(x, p[b + "norm0.weight"], g(b + "norm0.bias"), kind, eps)
        qkv = F.linear(h, p[b + "wqkv.weight"], g(b + "wqkv.bias")).reshape(-1, 3, H, hd)
        q, k, v = rope(qkv[:, 0]), rope(qkv[:, 1]), qkv[:, 2]
        outs = []
        for s, e in zip(bounds[:-1], bounds[1:]):
            qs, ks, vs = (u[s:e].transpose(0, 1) for u in (q, k, v))  # [H, n, hd]
            a = torch.softmax(qs @ ks.transpose(1, 2) / hd ** 0.5, dim=-1)
            outs.append((a @ vs).transpose(0, 1).reshape(e - s, Q))
        x = x + F.linear(torch.cat(outs), p[b + "wo.weight"], g(b + "wo.bias"))
        h = norm(x, p[b + "norm1.weight"], g(b + "norm1.bias"), kind, eps)
        h = F.gelu(F.linear(h, p[b + "mlp.fc0.weight"], g(b + "mlp.fc0.bias")), approximate="tanh")
        x = x + F.linear(h, p[b + "mlp.fc1.weight"], g(b + "mlp.fc1.bias"))
        if trace is not None:
            trace.append(x)
        i += 1
    return norm(x, p[pre + "encoder.final_layernorm.weight"],
                g(pre + "encoder.final_layernorm.bias"), kind, eps)


def project(p, vc, hidden, grids, eps):
    """The 2x2 merge (temporal mean) and the projector: K2.5's patchmerger (pre_norm LayerNorm,
    biases) or K3's patchmergerv2 (no biases, post_norm RMSNorm on the text width)."""
    D = vision_dims(vc)[0]
    merged, at = [], 0
    for t, h, w in grids:
        s = hidden[at:at + t * h * w].reshape(t, h // 2, 2, w // 2, 2, D)
        merged.append(s.permute(0, 1, 3, 2, 4, 5).mean(0).reshape(-1, 4, D))
        at += t * h * w
    m = torch.cat(merged)
    if vc.get("mm_projector_type", "patchmerger") == "patchmergerv2":
        m = F.gelu(F.linear(m.reshape(-1, 4 * D), p["mm_projector.proj.0.weight"]))
        m = F.linear(m, p["mm_projector.proj.2.weight"])
        return norm(m, p["mm_projector.post_norm.weight"], None, "rmsnorm", eps)
    m = F.layer_norm(m, (D,), p["mm_projector.pre_norm.weight"], p["mm_projector.pre_norm.bias"],
                     eps).reshape(-1, 4 * D)
    m = F.gelu(F.linear(m, p["mm_projector.proj.0.weight"], p["mm_projector.proj.0.bias"]))
    return F.linear(m, p["mm_projector.proj.2.weight"], p["mm_projector.proj.2.bias"])


def make_checkpoint(folder, src="tests/fixtures/models/deepseek_v3"):
    """kimi_k25 from the deepseek_v3 fixture's text model and a random tower."""
    text_cfg = json.load(open(os.path.join(src, "config.json")))
    text = load_safetensors(os.path.join(src, "model.safetensors"))
    vc = dict(patch_size=14, pos_emb_height=4, pos_emb_width=4, pos_emb_time=4,
              num_attention_heads=4, num_hidden_layers=2, hidden_size=64, intermediate_size=96,
              hidden_act="gelu_pytorch_tanh", merge_kernel_size=[2, 2], model_type="kimi_k25_vision")
    D, I, Ht = vc["hidden_size"], vc["intermediate_size"], text_cfg["hidden_size"]
    g = torch.Generator().manual_seed(7)

    def rnd(*shape, scale=None):
        fan = shape[-1] if len(shape) > 1 else 1
        s = scale if scale is not None else fan ** -0.5
        return bf16_round(torch.randn(shape, generator=g) * s)

    w = {}
    pre = "vision_tower."
    w[pre + "patch_embed.proj.weight"] = rnd(D, 3, 14, 14, scale=588 ** -0.5)
    w[pre + "patch_embed.proj.bias"] = rnd(D, scale=0.1)
    w[pre + "patch_embed.pos_emb.weight"] = rnd(4, 4, D, scale=0.5)
    for i in range(vc["num_hidden_layers"]):
        b = pre + f"encoder.blocks.{i}."
        for n in ("norm0", "norm1"):
            w[b + n + ".weight"] = bf16_round(1 + 0.1 * torch.randn(D, generator=g))
            w[b + n + ".bias"] = rnd(D, scale=0.1)
        w[b + "wqkv.weight"], w[b + "wqkv.bias"] = rnd(3 * D, D), rnd(3 * D, scale=0.1)
        w[b + "wo.weight"], w[b + "wo.bias"] = rnd(D, D), rnd(D, scale=0.1)
        w[b + "mlp.fc0.weight"], w[b + "mlp.fc0.bias"] = rnd(I, D), rnd(I, scale=0.1)
        w[b + "mlp.fc1.weight"], w[b + "mlp.fc1.bias"] = rnd(D, I), rnd(D, scale=0.1)
    w[pre + "encoder.final_layernorm.weight"] = bf16_round(1 + 0.1 * torch.randn(D, generator=g))
    w[pre + "encoder.final_layernorm.bias"] = rnd(D, scale=0.1)
    w["mm_projector.pre_norm.weight"] = bf16_round(1 + 0.1 * torch.randn(D, generator=g))
    w["mm_projector.pre_norm.bias"] = rnd(D, scale=0.1)
    w["mm_projector.proj.0.weight"], w["mm_projector.proj.0.bias"] = rnd(4 * D, 4 * D), rnd(4 * D, scale=0.1)
    w["mm_projector.proj.2.weight"], w["mm_projector.proj.2.bias"] = rnd(Ht, 4 * D), rnd(Ht, scale=0.1)
    for k, v in text.items():
        if k.startswith("model."):
            w["language_model." + k] = v
        elif k.startswith("lm_head."):
            w["language_model." + k] = v
        else:
            raise ValueError(k)
    os.makedirs(folder, exist_ok=True)
    save_safetensors(w, os.path.join(folder, "model.safetensors"), bf16=set(w))
    cfg = dict(architectures=["KimiK25ForConditionalGeneration"], model_type="kimi_k25",
               text_config=text_cfg, vision_config=vc, projection_hidden_size=D,
               projection_layer_norm_eps=1e-5, image_token_id=500, tie_word_embeddings=False,
               dtype="bfloat16")
    json.dump(cfg, open(os.path.join(folder, "config.json"), "w"), indent=2)
    gen = os.path.join(src, "generation_config.json")
    if os.path.exists(gen):
        open(os.path.join(folder, "generation_config.json"), "w").write(open(gen).read())


def rewrite_raw(path, drop_prefixes, add):
    """Rewrites a safetensors file keeping its other tensors' bytes and dtypes: tensors under
    drop_prefixes go, `add` (name -> F32 tensor, stored as BF16) comes in."""
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", None)
    keep = {k: v for k, v in header.items() if not k.startswith(drop_prefixes)}
    tmp = path + ".new"
    save_safetensors(add, tmp, bf16=set(add))
    with open(tmp, "rb") as f:
        m = struct.unpack("<Q", f.read(8))[0]
        new_header = json.loads(f.read(m))
        new_data = f.read()
    os.remove(tmp)
    out_header, blobs, off = {}, [], 0
    for k in sorted(list(keep) + list(new_header)):
        if k in keep:
            a, b = keep[k]["data_offsets"]
            raw, dt, shape = data[a:b], keep[k]["dtype"], keep[k]["shape"]
        else:
            a, b = new_header[k]["data_offsets"]
            raw, dt, shape = new_data[a:b], new_header[k]["dtype"], new_header[k]["shape"]
        out_header[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if meta:
        out_header["__metadata__"] = meta
    h = json.dumps(out_header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for blob in blobs:
            f.write(blob)


K3_VISION = dict(model_type="kimi_k3_vision", patch_size=14, init_pos_emb_height=4,
                 init_pos_emb_width=4, init_pos_emb_time=4, vt_hidden_size=32,
                 vt_num_attention_heads=2, vt_num_hidden_layers=2, vt_intermediate_size=48,
                 merge_kernel_size=[2, 2], merge_type="sd2_tpool", mm_projector_type="patchmergerv2",
                 norm_type="rmsnorm", pos_emb_interpolation_mode="bilinear", projector_ln_eps=1e-5)


def add_k3_tower(folder):
    """Kimi-K3's MoonViT3d and patchmergerv2 (random, bf16-representable) into a K3 text fixture,
    replacing its placeholder vision tensors; the text weights' bytes are kept."""
    cfg = json.load(open(os.path.join(folder, "config.json")))
    vc = dict(K3_VISION, text_hidden_size=cfg["text_config"]["hidden_size"])
    D, H, I, _ = vision_dims(vc)
    Ht = vc["text_hidden_size"]
    g = torch.Generator().manual_seed(9)

    def rnd(*shape, scale=None):
        fan = shape[-1] if len(shape) > 1 else 1
        return bf16_round(torch.randn(shape, generator=g) * (scale if scale else fan ** -0.5))

    def gain(n):
        return bf16_round(1 + 0.1 * torch.randn(n, generator=g))

    w, pre = {}, "vision_tower."
    w[pre + "patch_embed.proj.weight"] = rnd(D, 3, 14, 14, scale=588 ** -0.5)
    w[pre + "patch_embed.pos_emb.weight"] = rnd(4, 4, D, scale=0.5)
    for i in range(vc["vt_num_hidden_layers"]):
        b = pre + f"encoder.blocks.{i}."
        w[b + "norm0.weight"], w[b + "norm1.weight"] = gain(D), gain(D)
        w[b + "wqkv.weight"], w[b + "wo.weight"] = rnd(3 * D, D), rnd(D, D)
        w[b + "mlp.fc0.weight"], w[b + "mlp.fc1.weight"] = rnd(I, D), rnd(D, I)
    w[pre + "encoder.final_layernorm.weight"] = gain(D)
    w["mm_projector.proj.0.weight"] = rnd(4 * D, 4 * D)
    w["mm_projector.proj.2.weight"] = rnd(Ht, 4 * D)
    w["mm_projector.post_norm.weight"] = gain(Ht)
    rewrite_raw(os.path.join(folder, "model.safetensors"), ("vision_tower.", "mm_projector."), w)
    cfg["vision_config"] = vc
    json.dump(cfg, open(os.path.join(folder, "config.json"), "w"), indent=2)


def references(out, folder, name, rms_eps=None, grids=((1, 8, 8), (1, 2, 6))):
    cfg = json.load(open(os.path.join(folder, "config.json")))
    vc = cfg["vision_config"]
    p = {k: v.float() for k, v in load_safetensors(os.path.join(folder, "model.safetensors")).items()
         if k.startswith(("vision_tower.", "mm_projector."))}
    g = torch.Generator().manual_seed(3)
    grids = [tuple(x) for x in grids]
    pix = torch.rand((sum(t * h * w for t, h, w in grids), 3, 14, 14), generator=g) * 2 - 1
    eps = cfg.get("projection_layer_norm_eps", vc.get("projector_ln_eps", 1e-5))
    with torch.no_grad():
        hidden = tower(p, vc, pix, grids, rms_eps)
        embeds = project(p, vc, hidden, grids, eps)
    refs = dict(pixel_values=pix, grid_thw=torch.tensor(grids, dtype=torch.int64),
                vision_hidden=hidden, image_embeds=embeds)
    save_safetensors(refs, os.path.join(out, "references", name + ".safetensors"))
    print(name, "image_embeds", tuple(embeds.shape), "std", float(embeds.std()),
          "hidden std", float(hidden.std()))


def main():
    out = sys.argv[1]
    if len(sys.argv) > 2 and sys.argv[2] == "kimi_k3":
        # Kimi-K3's tower in the kimi_k3 fixture; its RMSNorms at nn.RMSNorm's default eps in the
        # checkpoint's dtype (bf16: 2^-7), as the tower runs in deployment.
        folder = os.path.join(out, "models", "kimi_k3")
        if "vt_hidden_size" not in json.load(open(os.path.join(folder, "config.json")))["vision_config"]:
            add_k3_tower(folder)
        references(out, folder, "kimi_k3_vision_torch", rms_eps=2.0 ** -7)
        return
    if len(sys.argv) > 2 and sys.argv[2] == "float64":
        # The kimi_k25_hf fixture (made by transformers) in float64 on transformers' own images:
        # the exact answer both float32 towers approximate (its patch embedding reaches ~600, so
        # each float32 tower's summation order shows at 1e-4).
        folder = os.path.join(out, "models", "kimi_k25_hf")
        cfg = json.load(open(os.path.join(folder, "config.json")))
        p = {}
        for f in sorted(os.listdir(folder)):
            if f.endswith(".safetensors"):
                p.update({k.replace("vision_tower.encoder.patch_embed.", "vision_tower.patch_embed."):
                          v.double() for k, v in load_safetensors(os.path.join(folder, f)).items()
                          if k.startswith(("vision_tower.", "mm_projector."))})
        hf = load_safetensors(os.path.join(out, "references", "kimi_k25_hf.safetensors"))
        grids = [tuple(int(v) for v in g) for g in hf["grid_thw"]]
        with torch.no_grad():
            hidden = tower(p, cfg["vision_config"], hf["pixel_values"].double(), grids)
            embeds = project(p, cfg["vision_config"], hidden, grids,
                             cfg.get("projection_layer_norm_eps", 1e-5))
        for name, t in (("vision_hidden", hidden), ("image_embeds", embeds)):
            print(name, "transformers (float32) vs float64: max |diff|",
                  float((hf[name].double() - t).abs().max()))
        save_safetensors(dict(vision_hidden=hidden.float(), image_embeds=embeds.float()),
                         os.path.join(out, "references", "kimi_k25_hf_f64.safetensors"))
        return
    if len(sys.argv) > 2 and sys.argv[2] == "video":
        # Video grids (frames attend jointly, the fixed time table, the merge's temporal mean)
        # through kimi_k25's tower, beside an image.
        references(out, os.path.join(out, "models", "kimi_k25"), "kimi_k25_video_torch",
                   grids=((3, 4, 6), (1, 2, 2), (2, 2, 4)))
        return
    folder = os.path.join(out, "models", "kimi_k25")
    if not os.path.exists(os.path.join(folder, "config.json")):
        make_checkpoint(folder)
    cfg = json.load(open(os.path.join(folder, "config.json")))
    vc = cfg["vision_config"]
    p = {k: v.float() for k, v in load_safetensors(os.path.join(folder, "model.safetensors")).items()
         if k.startswith(("vision_tower.", "mm_projector."))}
    g = torch.Generator().manual_seed(3)
    grids = [(1, 8, 8), (1, 2, 6)]
    pix = torch.rand((sum(t * h * w for t, h, w in grids), 3, 14, 14), generator=g) * 2 - 1
    with torch.no_grad():
        hidden = tower(p, vc, pix, grids)
        embeds = project(p, vc, hidden, grids, cfg.get("projection_layer_norm_eps", 1e-5))
        rs = torch.randn((5, 7, 3), generator=torch.Generator().manual_seed(11))
        chw = rs.permute(2, 0, 1)[None]
        up = F.interpolate(chw, size=(9, 12), mode="bicubic", align_corners=False)
        down = F.interpolate(chw, size=(3, 2), mode="bicubic", align_corners=False)
    refs = dict(resize_src=rs, resize_up=up[0].permute(1, 2, 0), resize_down=down[0].permute(1, 2, 0),
                pixel_values=pix, grid_thw=torch.tensor(grids, dtype=torch.int64),
                vision_hidden=hidden, image_embeds=embeds)
    os.makedirs(os.path.join(out, "references"), exist_ok=True)
    save_safetensors(refs, os.path.join(out, "references", "kimi_k25_torch.safetensors"))
    print("image_embeds", tuple(embeds.shape), "std", float(embeds.std()),
          "hidden std", float(hidden.std()))


if __name__ == "__main__":
    main()
