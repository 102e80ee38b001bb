"""Where transformers' Kimi-K2.5 vision tower and the plain-PyTorch reference part: both on the
kimi_k25_hf fixture's images in float32 on the CPU (TF32 off), the hidden state compared after the
patch embedding (position grid added) and after every block, and the final outputs. The
reference is tools/moonvit_reference.py (which atom matches to 2e-6); transformers is the port
atom's fixture was made with (2.7e-4 apart at the end). Run on the GPU machine:

  python3 tools/moonvit_layer_diff.py tests/fixtures
"""
import json
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import moonvit_reference as ref  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False
torch.set_float32_matmul_precision("highest")
root = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures"
folder = os.path.join(root, "models", "kimi_k25_hf")
refs = ref.load_safetensors(os.path.join(root, "references", "kimi_k25_hf.safetensors"))
cfg = json.load(open(os.path.join(folder, "config.json")))
vc = cfg["vision_config"]
params = {}
for f in sorted(os.listdir(folder)):
    if f.endswith(".safetensors"):
        params.update({k.replace("vision_tower.encoder.patch_embed.", "vision_tower.patch_embed."):
                       v.float() for k, v in ref.load_safetensors(os.path.join(folder, f)).items()})
pix = refs["pixel_values"].float()
grids = [tuple(int(v) for v in g) for g in refs["grid_thw"]]

trace = []
with torch.no_grad():
    ours = ref.tower(params, vc, pix, grids, trace=trace)

import transformers  # noqa: E402

model = transformers.AutoModelForImageTextToText.from_pretrained(
    folder, dtype=torch.float32, attn_implementation="eager").eval()
vt = model.model.vision_tower
names = [n for n, _ in vt.named_modules()]
print("vision tower modules:", [n for n in names if n.count(".") <= 2][:40])
blocks = sorted(((int(m.group(1)), n) for n in names for m in [re.search(r"layers\.(\d+)$", n)] if m))
seen = {}


def hook(name):
    def f(_m, inp, out):
        o = out[0] if isinstance(out, (tuple, list)) else out
        if hasattr(o, "last_hidden_state"):
            o = o.last_hidden_state
        seen[name] = (inp[0] if inp else None, o)
    return f


mods = dict(vt.named_modules())
for _, n in blocks:
    mods[n].register_forward_hook(hook(n))
with torch.no_grad():
    feats = model.model.get_image_features(pix, refs["grid_thw"], return_dict=True)
theirs = feats.last_hidden_state


def diff(a, b):
    a = a.reshape(-1, a.shape[-1]).float()
    b = b.reshape(-1, b.shape[-1]).float()
    if a.shape != b.shape:
        return f"shapes {tuple(a.shape)} vs {tuple(b.shape)}"
    d = (a - b).abs()
    return f"max |Δ| {d.max():.3g} (rel {(a - b).norm() / b.norm():.3g}), |ref| max {b.abs().max():.3g}"


if blocks:
    first_in = seen[blocks[0][1]][0]
    if first_in is not None:
        print("embedding (input of block 0):", diff(first_in, trace[0]))
for i, (_, n) in enumerate(blocks):
    print(f"block {i} output:", diff(seen[n][1], trace[i + 1]))
print("final hidden vs reference:", diff(theirs, ours))
print("final hidden vs the fixture's stored transformers output:", diff(theirs, refs["vision_hidden"]))
