#!/usr/bin/python3
"""DeepSeek-V4.1 (DeepseekV41ForCausalLM) in plain PyTorch, written from its public definition
(ROCm/ATOM's atom/models/deepseek_v41/{config,attention,model,moe}.py and
atom/model_ops/deepseek_v41/{compressor,mhc,indexer,paged_scoring,rotary}.py,
atom/model_ops/engram_layer.py; read, not copied), for atom's src/models/deepseek_v41.cpp.
transformers has no V4.1. Text only; one sequence scored whole, in fp32 on the CPU.

  /usr/bin/python3 tools/deepseek_v41_reference.py [FIXTURES_DIR]

Builds a tiny random checkpoint, saves it as a Hugging Face folder (config.json with text_config
and vision_config, model.safetensors in DeepSeek's release names, BF16 weights with the mHC
coefficients, sinks and routing biases F32, two vision tensors the text model must skip), reloads
the saved folder fresh in fp32 and writes FIXTURES_DIR/references/deepseek_v41.safetensors in
tools/make_fixtures.py's format (input_ids, logits, greedy_prompt, greedy_tokens, greedy_margins),
its index plane FP8 (the config's index_cache_dtype), and deepseek_v41_fp4_index.safetensors, the
same weights with index_cache_dtype fp4.
Then the same for deepseek_v41_fp8 (3 layers) in DeepSeek's native format: FP8 e4m3 linears in
32 x 32 blocks with F8_E8M0 scales, the Engram table FP8 with an F8_E8M0 scale per 32 values of a
row, FP4 e2m1 routed experts (tools/make_v4_quantized_fixture.py's encoders), the reference
reading the file back through its own decoder (load_dequantized).

What the forward computes (per layer, CSA2 role from config.py's rules):
  * Engram (engram layers), before the attention seam: per hyper-connection stream j,
    R_j += sigmoid(sgn(g) sqrt(max(|g|, 1e-6))) v, g = <rms(k_j) k_weight_j, rms(R_j) q_weight_j>
    / sqrt(D), [k_0..k_{hc-1}, v] = wkv(table rows of the n-gram hash heads), eps rms_norm_eps.
    Token ids go through Engram's compressed vocabulary first (tools/engram_vocab_reference.py's
    rules) when the checkpoint has a tokenizer: deepseek_v41's is a byte-level BPE of the 256
    bytes, where "A" and "a", or " ", "\t" and "\n", share an id; deepseek_v41_fp8 has none (ids
    hashed as they are).
  * Single-pass mHC: at each seam the mixes (pre, post, comb; V4's Sinkhorn) are predicted from
    the residual, the sublayer's input is the residual collapsed by the PREVIOUS seam's pre (the
    embedding's stream 0 first), the residual is expanded with this seam's post and comb, and this
    seam's pre is carried on. The final hidden is the residual collapsed by the last pre (no
    hc_head), then norm and head.
  * Attention as V4 but with no per-head query norm: q = rope(wq_b(q_norm(wq_a x))), one key/value
    row rope(kv_norm(wkv x)); keys are the sliding window (the last sliding_window tokens, self
    included) plus, on a compressed layer, the selected compressed rows of its KV owner; softmax
    with a sink per head, scale head_dim^-1/2; inverse RoPE on the output; grouped wo_a, wo_b.
    Window layers use the window RoPE (rope_theta), compressed ones the compress RoPE
    (compress_rope_theta with YaRN, no attention factor), interleaved pairs on the last
    qk_rope_head_dim channels.
  * CSA2 compression (FULL layers): groups of `ratio` (1 or 2) tokens, no overlap, no position
    bias: latent = norm(sum_j softmax_j(wgate x_j) * wkv x_j) (ratio 1: norm(wkv x)); the main
    row is rope(latent) at the group's first position; the index key is rope(k_norm(wk latent))
    there. A query at position p sees (p + 1) // ratio rows.
  * Index top-k (FULL and REINDEX): score = sum_h w_h relu(q_h . k), w = weights_proj(x)
    index_head_dim^-1/2 index_n_heads^-1/2, q_h = rope(indexer.wq_b(q_norm(wq_a x))); the top
    index_topk visible rows (all when there are no more), ties to the smaller row. A consumer of a
    candidate source scores only inside the source's blocks. The candidate source picks
    candidate_topk_blocks blocks of candidate_block_size rows by their best visible score, the
    newest visible block always kept. REUSE layers take their top-k owner's rows.
  * V4's MoE: sqrt(softplus) scores, selection by score + gate.bias, renormalised weights times
    routed_scaling_factor; routed and shared experts silu(min(g, limit)) * clamp(u, +-limit).
  * The index plane (index_cache_dtype; ROCm/ATOM's index_write.py and paged_scoring.py): the
    scorer reads the keys as stored and the query as it rounds it. fp8 (default): each key row is
    one block, s = 2^ceil(log2(max(amax, 1e-4) / 448)) (ue8m0), codes e4m3(k / s) nearest even;
    the query e4m3 with one fp32 scale amax / 448 per (token, head) row (not a power of two).
    fp4: keys and query alike E2M1 (nearest even) with s = 2^ceil(log2(amax / 6)) per 32
    elements. Written here from the formats' arithmetic (torch 1.13 has no float8 type); the
    F32 plane (index_cache_dtype "none", this tool only) is kept to show what the rounding moves.
The FP8 rounding of the window keys and of the activations is not modelled (fp32).
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import engram_reference as er  # noqa: E402
from moonvit_reference import load_safetensors, save_safetensors  # noqa: E402

NAME = "deepseek_v41"
# Layers: 0 window, 1 FULL (ratio 2, engram), 2 FULL (ratio 1, candidate source),
# 3 REINDEX (ratio 1, candidates from 2), 4 REUSE (ratio 1: KV of 2, top-k of 3); draft layer
# 5 window (not read).
TEXT = dict(
    model_type="deepseek_v41_text", hidden_size=64, vocab_size=256, num_hidden_layers=5,
    num_nextn_predict_layers=1, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
    qk_rope_head_dim=8, q_lora_rank=48, o_lora_rank=16, o_groups=2, index_n_heads=4,
    index_head_dim=32, index_topk=4, sliding_window=8, moe_intermediate_size=16,
    n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, routed_scaling_factor=1.5,
    swiglu_limit=10.0, scoring_func="sqrtsoftplus", hc_mult=4, hc_sinkhorn_iters=20,
    hc_eps=1e-6, rms_norm_eps=1e-6, max_position_embeddings=512, rope_theta=10000.0,
    compress_rope_theta=160000.0,
    rope_scaling=dict(type="yarn", factor=4.0, original_max_position_embeddings=64,
                      beta_fast=32, beta_slow=1),
    compress_ratios=[0, 2, 1, 1, 1, 0], kv_source_layer_ids=[1, 2],
    index_source_layer_ids=[1, 2, 3], candidate_source_layer_id=2, candidate_topk_blocks=2,
    candidate_block_size=4, index_topk_tie_break="small_position", index_cache_dtype="fp8",
    engram_layer_ids=[1], engram_max_ngram_size=3, engram_n_heads=2, engram_head_dim=8,
    engram_vocab_size=[40, 40], engram_pad_token_id=2, engram_compressed_vocab_size=256,
    engram_seed=7, engram_kernel_size=4)
ROOT = dict(architectures=["DeepseekV41ForCausalLM"], model_type="deepseek_v41",
            dtype="bfloat16", bos_token_id=0, eos_token_id=1, pad_token_id=2,
            image_token_id=255, tie_word_embeddings=False,
            vision_config=dict(model_type="deepseek_v41_vision", hidden_size=16, patch_size=2,
                               num_hidden_layers=1))
PROMPT_TOKENS, GREEDY_PROMPT, GREEDY_STEPS = 40, 36, 12
# A fixture is redrawn while some discrete choice is closer than these to a tie.
ROUTER_MARGIN, INDEX_MARGIN, GREEDY_MARGIN = 2e-4, 2e-4, 2e-2


# ----------------------------------------------------------------------------------------------
# Topology (config.py's build_attention_topology, as docs/deepseek_v41.md states it)
def topology(c):
    L = c["num_hidden_layers"]
    ratios, kv, ix = c["compress_ratios"], c["kv_source_layer_ids"], c["index_source_layer_ids"]
    cand = c.get("candidate_source_layer_id", -1)
    out, kv_owner, topk_owner = [], -1, -1
    for i in range(L):
        r = ratios[i]
        if r == 0:
            out.append(dict(ratio=0, mode="window"))
            continue
        if i in kv:
            kv_owner = i
        if i in ix:
            topk_owner = i
        mode = "full" if i == kv_owner else "reindex" if i == topk_owner else "reuse"
        uses = cand >= 0 and i >= cand
        out.append(dict(ratio=r, mode=mode, kv_owner=kv_owner, topk_owner=topk_owner,
                        produces=uses and i == cand, consumes=uses and i != cand))
    return out


# ----------------------------------------------------------------------------------------------
# RoPE (rotary.py): interleaved pairs of the last `dim` channels.
def rope_freqs(dim, base, scaling=None):
    f = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    if scaling:
        orig, factor = scaling["original_max_position_embeddings"], scaling["factor"]

        def corrected(rot):
            return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))
        low = max(math.floor(corrected(scaling["beta_fast"])), 0)
        high = min(math.ceil(corrected(scaling["beta_slow"])), dim - 1)
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / max(high - low, 1e-3)).clamp(0, 1)
        f = f / factor * ramp + f * (1 - ramp)
    return f


def rope(x, pos, freqs, inverse=False):
    """x [..., T?, ..., W] with positions pos [T] on dim 0; rotates the last 2 len(freqs) channels."""
    dim = 2 * freqs.numel()
    ang = torch.outer(torch.as_tensor(pos, dtype=torch.float32), freqs)  # [T, dim/2]
    cos, sin = ang.cos(), ang.sin()
    if inverse:
        sin = -sin
    shape = [ang.shape[0]] + [1] * (x.dim() - 2) + [dim // 2]
    cos, sin = cos.view(shape), sin.view(shape)
    out = x.clone()
    t = x[..., -dim:]
    x0, x1 = t[..., 0::2], t[..., 1::2]
    out[..., -dim:][..., 0::2] = x0 * cos - x1 * sin
    out[..., -dim:][..., 1::2] = x1 * cos + x0 * sin
    return out


def rms(x, w=None, eps=1e-6):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


# ----------------------------------------------------------------------------------------------
# The index plane's formats, as the rounding of an fp32 tensor (values on the format's grid).
def e4m3_round(v):
    """float8_e4m3fn, nearest even, saturating at 448 (|v| < 2^-6: multiples of 2^-9)."""
    v = v.double().clamp(-448.0, 448.0)
    _, e = torch.frexp(v)  # |v| = m 2^e, m in [0.5, 1)
    quantum = torch.where(v.abs() < 2.0 ** -6, torch.full_like(v, 2.0 ** -9),
                          torch.pow(2.0, (e - 4).double()))
    return (torch.round(v / quantum) * quantum).clamp(-448.0, 448.0).float()


def e2m1_round(v):
    """E2M1 (0, 0.5, 1, 1.5, 2, 3, 4, 6), nearest even, saturating at 6."""
    v = v.double().clamp(-6.0, 6.0)
    a = v.abs()
    quantum = torch.where(a < 2, torch.full_like(v, 0.5),
                          torch.where(a < 4, torch.full_like(v, 1.0), torch.full_like(v, 2.0)))
    return (torch.round(v / quantum) * quantum).clamp(-6.0, 6.0).float()


def pow2_ceil(v):
    """2^ceil(log2(v)) for positive v, exactly."""
    m, e = torch.frexp(v.double())
    return torch.pow(2.0, torch.where(m == 0.5, e - 1, e).double())


def index_key(k, fmt):
    """Index keys [n, D] as the plane stores them, read back."""
    if fmt == "fp8":
        scale = (k.abs().amax(-1, keepdim=True).clamp(min=1e-4) / 448.0).float()  # fp32
        scale = pow2_ceil(scale).float()
        return e4m3_round(k * (1.0 / scale)) * scale
    if fmt == "fp4":
        return fp4_round(k)
    assert fmt == "none"
    return k


def fp4_round(x):
    g = x.reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
    amax = g.abs().amax(-1, keepdim=True).double().clamp(min=6 * 2.0 ** -126)
    scale = pow2_ceil(amax / 6).float()
    return (e2m1_round(g / scale) * scale).reshape(x.shape)


def index_query(q, fmt):
    """The index query [.., heads, D] as the scorer takes it."""
    if fmt == "fp8":
        scale = q.abs().amax(-1, keepdim=True) / 448.0
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        return torch.where(scale > 0, e4m3_round(q / safe) * safe, q)
    if fmt == "fp4":
        return fp4_round(q)
    return q


# ----------------------------------------------------------------------------------------------
class Model:
    def __init__(self, c, W, lookup=None):
        self.c, self.W, self.lookup = c, W, lookup
        self.index_fmt = c.get("index_cache_dtype", "fp8")
        self.topo = topology(c)
        rd = c["qk_rope_head_dim"]
        self.window_freqs = rope_freqs(rd, c["rope_theta"])
        self.compress_freqs = rope_freqs(rd, c["compress_rope_theta"], c["rope_scaling"])
        self.hash_sizes = er.head_sizes(c["engram_layer_ids"], c["engram_max_ngram_size"],
                                        c["engram_vocab_size"], c["engram_n_heads"])
        self.margins = dict(router=float("inf"), index=float("inf"), blocks=float("inf"))

    def note(self, what, kept, dropped):
        """The gap between the last row kept and the first dropped. Scores of exactly 0 (every
        head's ReLU at 0) tie exactly in any implementation and go to the smaller row."""
        if not (kept == 0.0 and dropped == 0.0):
            self.margins[what] = min(self.margins[what], kept - dropped)

    def w(self, name):
        return self.W[name]

    # -- single-pass mHC ------------------------------------------------------------------------
    def mixes(self, R, p):
        c, hc = self.c, self.c["hc_mult"]
        flat = R.flatten(-2)
        m = (flat @ self.w(p + "_fn").t()) * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True)
                                                           + c["rms_norm_eps"])
        scale, base, eps = self.w(p + "_scale"), self.w(p + "_base"), c["hc_eps"]
        pre = torch.sigmoid(m[:, :hc] * scale[0] + base[:hc]) + eps
        post = 2 * torch.sigmoid(m[:, hc:2 * hc] * scale[1] + base[hc:2 * hc])
        comb = m[:, 2 * hc:].view(-1, hc, hc) * scale[2] + base[2 * hc:].view(hc, hc)
        comb = comb.softmax(-1) + eps
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
        for _ in range(c["hc_sinkhorn_iters"] - 1):
            comb = comb / (comb.sum(-1, keepdim=True) + eps)
            comb = comb / (comb.sum(-2, keepdim=True) + eps)
        return pre, post, comb

    @staticmethod
    def expand(y, R, post, comb):
        # R'_k = post_k y + sum_j comb[j, k] R_j
        return torch.einsum("tjk,tjd->tkd", comb, R) + post.unsqueeze(-1) * y.unsqueeze(1)

    @staticmethod
    def collapse(R, pre):
        return (R * pre.unsqueeze(-1)).sum(1)

    # -- Engram ---------------------------------------------------------------------------------
    def engram(self, L, R, ids):
        c, p = self.c, f"layers.{L}.engram"
        N, heads = c["engram_max_ngram_size"], c["engram_n_heads"]
        mult = er.multipliers(c["engram_seed"], L, N, c["engram_compressed_vocab_size"])
        lookup = self.lookup if self.lookup is not None else np.arange(c["vocab_size"])
        rows = er.hash_rows(lookup[np.asarray(ids, dtype=np.int64)], mult, self.hash_sizes[L], N,
                            heads, int(lookup[c["engram_pad_token_id"]]))
        T, D, hc = R.shape[0], c["hidden_size"], c["hc_mult"]
        emb = self.w(p + ".embed.weight")[torch.from_numpy(rows)].reshape(T, -1)
        kv = emb @ self.w(p + ".wkv.weight").t()
        k, v = kv[:, :hc * D].view(T, hc, D), kv[:, hc * D:]
        eps = c["rms_norm_eps"]
        g = (rms(k, self.w(p + ".k_weight"), eps) * rms(R, self.w(p + ".q_weight"), eps)).sum(-1)
        g = g / math.sqrt(D)
        g = g.abs().clamp_min(1e-6).sqrt() * g.sign()
        return R + g.sigmoid().unsqueeze(-1) * v.unsqueeze(1)

    # -- attention ------------------------------------------------------------------------------
    def attention(self, L, x, state):
        c, spec, p = self.c, self.topo[L], f"layers.{L}.attn"
        T, H, Dh = x.shape[0], c["num_attention_heads"], c["head_dim"]
        eps, pos = c["rms_norm_eps"], list(range(x.shape[0]))
        freqs = self.compress_freqs if spec["ratio"] else self.window_freqs
        qr = rms(x @ self.w(p + ".wq_a.weight").t(), self.w(p + ".q_norm.weight"), eps)
        q = rope((qr @ self.w(p + ".wq_b.weight").t()).view(T, H, Dh), pos, freqs)
        kv = rope(rms(x @ self.w(p + ".wkv.weight").t(), self.w(p + ".kv_norm.weight"), eps),
                  pos, freqs)
        selected = [[] for _ in range(T)]
        if spec["ratio"]:
            r = spec["ratio"]
            if spec["mode"] == "full":
                self.compress(L, x, state, freqs)
            main = state[spec["kv_owner"]]["main"]
            if spec["mode"] == "reuse":
                selected = state[spec["topk_owner"]]["selected"]
            else:
                selected = self.select(L, x, qr, state, freqs)
                state[L]["selected"] = selected
        sink = self.w(p + ".attn_sink")
        W_ = c["sliding_window"]
        out = torch.zeros(T, H, Dh)
        for t in range(T):
            keys = [kv[j] for j in range(max(0, t - W_ + 1), t + 1)]
            keys = [main[w] for w in selected[t]] + keys
            K = torch.stack(keys)  # [n, Dh]
            logit = (q[t] @ K.t()) / math.sqrt(Dh)  # [H, n]
            full = torch.cat([sink.view(H, 1), logit], 1)
            prob = full.softmax(-1)[:, 1:]
            out[t] = prob @ K
        out = rope(out, pos, freqs, inverse=True)
        G, R_ = c["o_groups"], c["o_lora_rank"]
        wo_a = self.w(p + ".wo_a.weight").view(G, R_, -1)
        o = torch.einsum("tgi,gri->tgr", out.reshape(T, G, -1), wo_a).reshape(T, G * R_)
        return o @ self.w(p + ".wo_b.weight").t()

    def compress(self, L, x, state, freqs):
        c, p, r = self.c, f"layers.{L}.attn", self.topo[L]["ratio"]
        n = x.shape[0] // r
        vals = x @ self.w(p + ".compressor.wkv.weight").t()
        if r == 1:
            latent = vals
        else:
            score = x @ self.w(p + ".compressor.wgate.weight").t()
            g_v = vals[: n * r].view(n, r, -1)
            g_s = score[: n * r].view(n, r, -1)
            latent = (g_v * g_s.softmax(1)).sum(1)
        latent = rms(latent[:n], self.w(p + ".compressor.norm.weight"), c["rms_norm_eps"])
        rows_pos = [w * r for w in range(n)]
        main = rope(latent, rows_pos, freqs)
        key = rms(latent @ self.w(p + ".indexer.wk.weight").t(),
                  self.w(p + ".indexer.k_norm.weight"), c["rms_norm_eps"])
        state[L] = dict(main=main, index=index_key(rope(key, rows_pos, freqs), self.index_fmt))

    def select(self, L, x, qr, state, freqs):
        c, spec, p = self.c, self.topo[L], f"layers.{L}.attn.indexer"
        T, NH, DI, r = x.shape[0], c["index_n_heads"], c["index_head_dim"], spec["ratio"]
        k = state[spec["kv_owner"]]["index"]  # [n, DI]
        iq = rope((qr @ self.w(p + ".wq_b.weight").t()).view(T, NH, DI), list(range(T)), freqs)
        iq = index_query(iq, self.index_fmt)
        wts = (x @ self.w(p + ".weights_proj.weight").t()) * (DI ** -0.5 * NH ** -0.5)
        topk, B, nb = c["index_topk"], c["candidate_block_size"], c["candidate_topk_blocks"]
        state.setdefault(L, {})
        if spec["produces"]:
            state[L]["candidates"] = [None] * T
        out = []
        for t in range(T):
            n = (t + 1) // r
            if n == 0:
                out.append([])
                if spec["produces"]:
                    state[L]["candidates"][t] = []
                continue
            score = (torch.relu(iq[t] @ k[:n].t()) * wts[t].view(NH, 1)).sum(0)  # [n]
            if spec["produces"]:
                blocks = (n + B - 1) // B
                best = [float(score[b * B:min(n, (b + 1) * B)].max()) for b in range(blocks)]
                best[blocks - 1] = float("inf")  # the newest block is always kept
                order = sorted(range(blocks), key=lambda b: (-best[b], b))
                chosen = sorted(order[:nb])
                if blocks > nb:
                    self.note("blocks", best[order[nb - 1]], best[order[nb]])
                state[L]["candidates"][t] = chosen
            allowed = list(range(n))
            if spec["consumes"]:
                cand = state[c["candidate_source_layer_id"]]["candidates"][t]
                allowed = [w for w in allowed if w // B in cand]
            if len(allowed) <= topk:
                out.append(sorted(allowed))
                continue
            s = [(float(score[w]), w) for w in allowed]
            s.sort(key=lambda e: (-e[0], e[1]))
            self.note("index", s[topk - 1][0], s[topk][0])
            out.append(sorted(w for _, w in s[:topk]))
        return out

    # -- MoE ------------------------------------------------------------------------------------
    def moe(self, L, x):
        c, p = self.c, f"layers.{L}.ffn"
        lim, K = c["swiglu_limit"], c["num_experts_per_tok"]

        def mlp(x, pre):
            g = x @ self.w(pre + ".w1.weight").t()
            u = x @ self.w(pre + ".w3.weight").t()
            h = F.silu(g.clamp(max=lim)) * u.clamp(-lim, lim)
            return h @ self.w(pre + ".w2.weight").t()

        s = torch.sqrt(F.softplus(x @ self.w(p + ".gate.weight").t()))
        choice = s + self.w(p + ".gate.bias")
        top = choice.topk(K + 1, dim=-1)
        self.margins["router"] = min(self.margins["router"],
                                     float((top.values[:, K - 1] - top.values[:, K]).min()))
        idx = top.indices[:, :K]
        wts = s.gather(1, idx)
        wts = wts / wts.sum(-1, keepdim=True) * c["routed_scaling_factor"]
        out = mlp(x, p + ".shared_experts")
        for t in range(x.shape[0]):
            for j in range(K):
                e = int(idx[t, j])
                out[t] += wts[t, j] * mlp(x[t:t + 1], f"{p}.experts.{e}")[0]
        return out

    # -- the model ------------------------------------------------------------------------------
    def forward(self, ids):
        c, hc = self.c, self.c["hc_mult"]
        eps = c["rms_norm_eps"]
        x = self.w("embed.weight")[torch.tensor(ids)]
        T = x.shape[0]
        R = x.unsqueeze(1).expand(T, hc, x.shape[1]).clone()
        pre = torch.zeros(T, hc)
        pre[:, 0] = 1
        state = {}
        for L in range(c["num_hidden_layers"]):
            p = f"layers.{L}"
            if L in c["engram_layer_ids"]:
                R = self.engram(L, R, ids)
            pre_a, post, comb = self.mixes(R, p + ".hc_attn")
            h = rms(self.collapse(R, pre), self.w(p + ".attn_norm.weight"), eps)
            R = self.expand(self.attention(L, h, state), R, post, comb)
            pre_f, post, comb = self.mixes(R, p + ".hc_ffn")
            h = rms(self.collapse(R, pre_a), self.w(p + ".ffn_norm.weight"), eps)
            R = self.expand(self.moe(L, h), R, post, comb)
            pre = pre_f
        h = rms(self.collapse(R, pre), self.w("norm.weight"), eps)
        return h @ self.w("head.weight").t()


# ----------------------------------------------------------------------------------------------
def random_weights(c, g):
    D, H, Dh, hc = c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["hc_mult"]
    V, ql, ol, G = c["vocab_size"], c["q_lora_rank"], c["o_lora_rank"], c["o_groups"]
    NH, DI, E, M = c["index_n_heads"], c["index_head_dim"], c["n_routed_experts"], \
        c["moe_intermediate_size"]
    W, f32 = {}, set()

    def lin(name, n, k, gain=1.0):
        W[name + ".weight"] = torch.randn(n, k, generator=g) * (gain / math.sqrt(k))

    def norm(name, n):
        W[name + ".weight"] = 1 + 0.2 * torch.randn(n, generator=g)

    W["embed.weight"] = torch.randn(V, D, generator=g)
    lin("head", V, D, 2.0)
    norm("norm", D)
    mixes = (2 + hc) * hc
    topo = topology(c)
    sizes = er.head_sizes(c["engram_layer_ids"], c["engram_max_ngram_size"],
                          c["engram_vocab_size"], c["engram_n_heads"])
    for L, spec in enumerate(topo):
        p = f"layers.{L}"
        norm(p + ".attn_norm", D)
        norm(p + ".ffn_norm", D)
        for s in ("attn", "ffn"):
            W[f"{p}.hc_{s}_fn"] = torch.randn(mixes, hc * D, generator=g) * (2.0 / math.sqrt(hc * D))
            W[f"{p}.hc_{s}_base"] = 0.5 * torch.randn(mixes, generator=g)
            W[f"{p}.hc_{s}_scale"] = 0.5 + 0.5 * torch.rand(3, generator=g)
            f32.update({f"{p}.hc_{s}_fn", f"{p}.hc_{s}_base", f"{p}.hc_{s}_scale"})
        a = p + ".attn"
        W[a + ".attn_sink"] = torch.randn(H, generator=g)
        f32.add(a + ".attn_sink")
        lin(a + ".wq_a", ql, D)
        norm(a + ".q_norm", ql)
        lin(a + ".wq_b", H * Dh, ql, 2.0)
        lin(a + ".wkv", Dh, D)
        norm(a + ".kv_norm", Dh)
        lin(a + ".wo_a", G * ol, H * Dh // G)
        lin(a + ".wo_b", D, G * ol)
        if spec["mode"] == "full":
            lin(a + ".compressor.wkv", Dh, D)
            if spec["ratio"] == 2:
                lin(a + ".compressor.wgate", Dh, D, 3.0)
            norm(a + ".compressor.norm", Dh)
            lin(a + ".indexer.wk", DI, Dh)
            norm(a + ".indexer.k_norm", DI)
        if spec["mode"] in ("full", "reindex"):
            lin(a + ".indexer.wq_b", NH * DI, ql, 2.0)
            lin(a + ".indexer.weights_proj", NH, D, 2.0)
        f = p + ".ffn"
        lin(f + ".gate", E, D, 2.0)
        W[f + ".gate.bias"] = 0.3 * torch.randn(E, generator=g)
        W[f + ".gate.bias_vl"] = 0.3 * torch.randn(E, generator=g)  # image routing: not read
        f32.update({f + ".gate.bias", f + ".gate.bias_vl"})
        for e in range(E):
            lin(f"{f}.experts.{e}.w1", M, D)
            lin(f"{f}.experts.{e}.w3", M, D)
            lin(f"{f}.experts.{e}.w2", D, M)
        lin(f + ".shared_experts.w1", M, D)
        lin(f + ".shared_experts.w3", M, D)
        lin(f + ".shared_experts.w2", D, M)
        if L in c["engram_layer_ids"]:
            e = p + ".engram"
            width = (c["engram_max_ngram_size"] - 1) * c["engram_n_heads"] * c["engram_head_dim"]
            W[e + ".embed.weight"] = torch.randn(int(sizes[L].sum()), c["engram_head_dim"],
                                                 generator=g)
            lin(e + ".wkv", (hc + 1) * D, width, 2.0)
            W[e + ".k_weight"] = 1 + 0.2 * torch.randn(hc, D, generator=g)
            W[e + ".q_weight"] = 1 + 0.2 * torch.randn(hc, D, generator=g)
    # The vision tower's tensors (the text model skips them unread).
    W["vision.patch_embed.proj.weight"] = torch.randn(16, 12, generator=g)
    W["image_newline"] = torch.randn(D, generator=g)
    return W, f32


def engram_rows(c):
    sizes = er.head_sizes(c["engram_layer_ids"], c["engram_max_ngram_size"],
                          c["engram_vocab_size"], c["engram_n_heads"])
    return [int(sizes[L].sum()) for L in c["engram_layer_ids"]]


def greedy(model, prompt, steps):
    seq, gen, margins = list(prompt), [], []
    for _ in range(steps):
        row = model.forward(seq)[-1]
        top = row.topk(2)
        gen.append(int(top.indices[0]))
        margins.append(float(top.values[0] - top.values[1]))
        seq.append(gen[-1])
    return gen, margins


# ----------------------------------------------------------------------------------------------
# A byte-level BPE tokenizer of the 256 bytes (token i is byte i), and Engram's compressed
# vocabulary of it by tools/engram_vocab_reference.py's rules.
def write_tokenizer(out_dir):
    import engram_vocab_reference as evr
    b2c = {b: c for c, b in evr.bytes_to_unicode().items()}
    bl = dict(type="ByteLevel", add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok = dict(version="1.0", truncation=None, padding=None, added_tokens=[], normalizer=None,
               pre_tokenizer=bl, post_processor=None, decoder=bl,
               model=dict(type="BPE", dropout=None, unk_token=None,
                          continuing_subword_prefix=None, end_of_word_suffix=None,
                          fuse_unk=False, byte_fallback=False,
                          vocab={b2c[i]: i for i in range(256)}, merges=[]))
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
        f.write("\n")


def compressed_lookup(tokenizer_json):
    import engram_vocab_reference as evr
    j = json.load(open(tokenizer_json, encoding="utf-8"))
    byte_of = evr.bytes_to_unicode()
    tokens = {v: k for k, v in j["model"]["vocab"].items()}
    keys, lookup = {}, []
    for tid in range(len(tokens)):
        tok = tokens[tid]
        text = bytes(byte_of[ch] for ch in tok).decode("utf-8", errors="replace")
        if "\ufffd" in text:
            key = tok
        else:
            n = evr.normalize(text)
            key = n if n else text
        lookup.append(keys.setdefault(key, len(keys)))
    return np.asarray(lookup, dtype=np.int64), len(keys)


# ----------------------------------------------------------------------------------------------
# The native quantised format (tools/make_v4_quantized_fixture.py's encoders): FP8 e4m3 linears in
# 32 x 32 blocks with F8_E8M0 scales ".scale", FP4 e2m1 routed experts ([rows, K/2] I8, the low
# nibble the even column) with F8_E8M0 scales per 32 values along K.
FP8_MODULES = (".attn.wq_a", ".attn.wq_b", ".attn.wkv", ".attn.wo_a", ".attn.wo_b",
               ".indexer.wq_b", ".shared_experts.w1", ".shared_experts.w2", ".shared_experts.w3",
               ".engram.wkv")
QUANT = dict(quant_method="fp8", fmt="e4m3", weight_block_size=[32, 32], scale_fmt="ue8m0",
             activation_scheme="dynamic", expert_dtype="fp4")


def save_quantized(W, f32, path):
    import make_v4_quantized_fixture as mq
    out = {}
    for name, t in W.items():
        mod = name[:-len(".weight")] if name.endswith(".weight") else None
        v = t.float().numpy()
        if mod and mod.endswith(FP8_MODULES + (".engram.embed",)):
            # The Engram table: one scale per 32 values of a row; the linears: 32 x 32 blocks.
            bn = 1 if mod.endswith(".engram.embed") else 32
            codes, (sdtype, sc), _ = mq.quantize_fp8(mq_bf16(v), bn, 32, True)
            out[name] = ("F8_E4M3", v.shape, codes.tobytes())
            out[mod + ".scale"] = (sdtype, sc.shape, sc.tobytes())
        elif mod and ".ffn.experts." in mod:
            packed, sc, _ = mq.quantize_fp4(mq_bf16(v))
            out[name] = ("I8", packed.shape, packed.view(np.int8).tobytes())
            out[mod + ".scale"] = ("F8_E8M0", sc.shape, sc.tobytes())
        elif name in f32:
            out[name] = ("F32", v.shape, np.ascontiguousarray(v, np.float32).tobytes())
        else:
            out[name] = ("BF16", v.shape, mq.bf16_bytes(mq_bf16(v)))
    mq.write_safetensors(path, out)


def mq_bf16(v):
    """v rounded to BF16 values (nearest even), as F32."""
    u = np.ascontiguousarray(v, np.float32).view(np.uint32)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def load_dequantized(path):
    """Every tensor of a native-format file as F32: FP8 codes times their block's 2^(e - 127),
    FP4 nibbles times their group's 2^(e - 127); decoded here from the bit layouts."""
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    raw = {k: (e, data[e["data_offsets"][0]:e["data_offsets"][1]])
           for k, e in header.items() if k != "__metadata__"}

    def e4m3(b):
        e, m = (b >> 3) & 15, (b & 7).astype(np.float64)
        v = np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * 2.0 ** (e.astype(np.float64) - 7))
        return np.where(b & 0x80, -v, v)

    e2m1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    out = {}
    for k, (e, b) in raw.items():
        if k.endswith(".scale"):
            continue
        shape, dt = e["shape"], e["dtype"]
        if dt == "BF16":
            v = (np.frombuffer(b, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif dt == "F32":
            v = np.frombuffer(b, np.float32)
        elif dt == "F8_E4M3":
            se, sb = raw[k[:-len(".weight")] + ".scale"]
            sc = 2.0 ** (np.frombuffer(sb, np.uint8).astype(np.float64) - 127)
            sc = sc.reshape(se["shape"])
            rows, cols = shape
            bn = 1 if k.endswith(".engram.embed.weight") else 32
            full = np.repeat(np.repeat(sc, bn, 0), 32, 1)[:rows, :cols]
            v = e4m3(np.frombuffer(b, np.uint8).reshape(shape)) * full
        elif dt == "I8":
            se, sb = raw[k[:-len(".weight")] + ".scale"]
            sc = 2.0 ** (np.frombuffer(sb, np.uint8).astype(np.float64) - 127)
            sc = sc.reshape(se["shape"])
            u = np.frombuffer(b, np.uint8).reshape(shape)
            nib = np.stack([u & 15, u >> 4], -1).reshape(shape[0], shape[1] * 2)
            val = np.where(nib & 8, -e2m1[nib & 7], e2m1[nib & 7])
            v = val * np.repeat(sc, 32, 1)
            shape = list(v.shape)
        else:
            raise ValueError(f"{k}: {dt}")
        out[k] = torch.from_numpy(np.asarray(v, np.float32).reshape(shape).copy())
    return out


# The quantised fixture: 3 layers (FULL ratio 2 with Engram; FULL ratio 1; REUSE), experts of
# 32 (FP4 groups of 32 along K), Engram rows of 32 (one FP8 scale each), in DeepSeek's native
# format.
TEXT_FP8 = dict(TEXT, num_hidden_layers=3, num_nextn_predict_layers=0,
                moe_intermediate_size=32, compress_ratios=[2, 1, 1], kv_source_layer_ids=[0, 1],
                index_source_layer_ids=[0, 1], candidate_source_layer_id=-1,
                engram_layer_ids=[0], engram_head_dim=32)


def build(root, name, text, quantized, tokenizer, also_fp4=False):
    """The fixture and its reference with the config's index plane (fp8); with also_fp4, a second
    reference of the same weights with index_cache_dtype fp4 (NAME_fp4_index), every choice of
    both away from a tie."""
    text = dict(text)
    text["engram_num_embeddings"] = engram_rows(text)
    out_dir = os.path.join(root, "models", name)
    os.makedirs(out_dir, exist_ok=True)
    lookup = None
    if tokenizer:
        write_tokenizer(out_dir)
        lookup, size = compressed_lookup(os.path.join(out_dir, "tokenizer.json"))
        text["engram_compressed_vocab_size"] = size
    config = dict(ROOT)
    if quantized:
        config["quantization_config"] = QUANT
    config["text_config"] = text
    V = text["vocab_size"]
    weights = os.path.join(out_dir, "model.safetensors")
    for attempt in range(40):
        g = torch.Generator().manual_seed(1000 + attempt)
        W, f32 = random_weights(text, g)
        ids = torch.randint(3, V, (PROMPT_TOKENS,), generator=g).tolist()
        prompt = torch.randint(3, V, (GREEDY_PROMPT,), generator=g).tolist()
        # Round to what the file holds, then check the choices on the reloaded weights below.
        if quantized:
            save_quantized(W, f32, weights)
        else:
            save_safetensors(W, weights, bf16=[k for k in W if k not in f32])
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
            f.write("\n")
        with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
            json.dump(dict(bos_token_id=0, eos_token_id=1, pad_token_id=2), f, indent=2)
            f.write("\n")
        # Reload fresh, fp32.
        with open(os.path.join(out_dir, "config.json")) as f:
            cfg = json.load(f)["text_config"]
        loaded = load_dequantized(weights) if quantized else load_safetensors(weights)
        loaded = {k: v.float() for k, v in loaded.items()}
        runs = {}
        ok = True
        for fmt in [cfg["index_cache_dtype"]] + (["fp4"] if also_fp4 else []):
            model = Model(dict(cfg, index_cache_dtype=fmt), loaded, lookup)
            logits = model.forward(ids)
            gen, margins = greedy(model, prompt, GREEDY_STEPS)
            m = model.margins
            ok = ok and (m["router"] > ROUTER_MARGIN and m["index"] > INDEX_MARGIN and
                         m["blocks"] > INDEX_MARGIN and min(margins) > GREEDY_MARGIN and
                         len(set(gen)) >= 4)
            print(f"{name} attempt {attempt} index {fmt}: router {m['router']:.3g} index "
                  f"{m['index']:.3g} blocks {m['blocks']:.3g} greedy min margin "
                  f"{min(margins):.3g} tokens {gen}")
            runs[fmt] = (logits, gen, margins)
        if ok:
            break
    else:
        raise SystemExit("no draw kept every choice away from a tie")
    ref_dir = os.path.join(root, "references")
    os.makedirs(ref_dir, exist_ok=True)
    # What the index plane's rounding moves: the same weights with the keys and query in fp32.
    plain = Model(dict(cfg, index_cache_dtype="none"), loaded, lookup).forward(ids)
    for fmt, (logits, gen, margins) in runs.items():
        rel = float((logits - plain).abs().max() / plain.abs().max())
        print(f"{name} index {fmt}: max |dlogit| / max |logit| against an fp32 index plane "
              f"{rel:.3g}")
        out = name + ("" if fmt == cfg["index_cache_dtype"] else "_" + fmt + "_index")
        save_safetensors({
            "input_ids": torch.tensor(ids, dtype=torch.int64),
            "logits": logits.contiguous(),
            "greedy_prompt": torch.tensor(prompt, dtype=torch.int64),
            "greedy_tokens": torch.tensor(gen, dtype=torch.int64),
            "greedy_margins": torch.tensor(margins, dtype=torch.float32),
        }, os.path.join(ref_dir, out + ".safetensors"))
        print(out, "logits std", float(logits.std()), "greedy", gen,
              "size", os.path.getsize(weights))


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
    build(root, NAME, TEXT, quantized=False, tokenizer=True, also_fp4=True)
    build(root, NAME + "_fp8", TEXT_FP8, quantized=True, tokenizer=False)


if __name__ == "__main__":
    main()
