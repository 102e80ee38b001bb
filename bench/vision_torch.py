"""transformers' Kimi-K2.5 vision tower and projector (models/kimi_k25), the peer of
cuda_vision_bench: random weights in bf16 on the GPU, K2.5's vision config (transformers'
defaults, printed), the projector into a 7168-wide text model, timed per image.

  python3 bench/vision_torch.py --grids 32x32,74x74 [--attn sdpa]

A grid is the image processor's patches (h x w) for an image size; cuda_vision_bench prints the
grid of each size it measures, so both run the same patches."""
import argparse
import sys

import torch
import transformers

from torch_timing import MATMUL, timed

p = argparse.ArgumentParser()
p.add_argument("--grids", default="32x32,74x74")
p.add_argument("--attn", default="sdpa")
args = p.parse_args()

from transformers.models.kimi_k25 import modeling_kimi_k25 as mk  # noqa: E402

TEXT = dict(model_type="deepseek_v3", vocab_size=1024, hidden_size=7168, intermediate_size=256,
            moe_intermediate_size=64, num_hidden_layers=1, first_k_dense_replace=1,
            num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1,
            num_experts_per_tok=2, n_group=1, topk_group=1, q_lora_rank=64, kv_lora_rank=32,
            qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, head_dim=8)
cfg = transformers.Kimi_K25Config(text_config=TEXT, image_token_id=1000)
vc = cfg.vision_config
print("transformers", transformers.__version__, "torch", torch.__version__,
      torch.cuda.get_device_name(0))
print("vision config:", {k: getattr(vc, k) for k in ("hidden_size", "num_hidden_layers",
                                                      "num_attention_heads", "intermediate_size",
                                                      "pos_emb_height", "pos_emb_width",
                                                      "patch_size")})
cfg._attn_implementation = args.attn
vc._attn_implementation = args.attn
with torch.device("cuda"):
    model = mk.Kimi_K25ForConditionalGeneration(cfg).to(torch.bfloat16).eval()
print("vision attention:", model.model.vision_tower.config._attn_implementation)
D, L, I = vc.hidden_size, vc.num_hidden_layers, vc.intermediate_size
H = cfg.text_config.hidden_size
print(f"\n{'case':34s} {'patches':>10s} {'time':>10s} {'images/s':>12s} {'% matmul':>10s}")
for g in args.grids.split(","):
    gh, gw = (int(x) for x in g.split("x"))
    P = gh * gw
    pix = torch.rand((P, 3, vc.patch_size, vc.patch_size), device="cuda",
                     dtype=torch.bfloat16) * 2 - 1
    grid = torch.tensor([[1, gh, gw]], device="cuda")

    def run():
        with torch.no_grad():
            model.model.get_image_features(pix, grid, return_dict=True)

    t = timed(run, iters=3, reps=5, warmup=2)
    tokens = P / 4
    flops = (L * (2.0 * P * (4 * D * D + 2 * D * I) + 4.0 * P * P * D)
             + 2.0 * P * D * 3 * vc.patch_size ** 2 + 2.0 * tokens * (16 * D * D + 4 * D * H))
    print(f"{'transformers tower ' + g + ' patches':34s} {P:10d} {t * 1e3:7.2f} ms "
          f"{1 / t:12.1f} {100 * flops / MATMUL / t:9.1f}%")
    sys.stdout.flush()
