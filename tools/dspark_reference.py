#!/usr/bin/python3
"""DSpark, DeepSeek-V4's (and V4.1's) block drafter, in plain PyTorch, written from its public
definition (ROCm/ATOM's atom/models/deepseek_v4_dspark.py, atom/spec_decode/dspark_proposer.py;
read, not copied), for atom's src/models/dspark.cpp. One sequence at a time, fp32, on the CPU.

  /usr/bin/python3 tools/dspark_reference.py [FIXTURES_DIR]

Takes the tiny DeepSeek-V4.1 fixture (models/deepseek_v41, tools/deepseek_v41_reference.py) as
the target, adds DSpark stages mtp.0 .. mtp.{S-1} and the config fields the definition reads
(dspark_block_size, dspark_target_layer_ids, dspark_noise_token_id, dspark_markov_rank,
dspark_num_layers), saves the result as models/deepseek_v41_dspark (the target's tensors as they
were), reloads it fresh in fp32 and writes references/deepseek_v41_dspark.safetensors: for each
case i, the prompt, the anchor token, the base logits U [T, V] of the block, the biased logits
U + B [T, V] the drafts are the argmax of, the drafts [T] and the confidences [T].

What the drafter computes (a sequence whose last target-computed token is at position p and
whose next token, the anchor x0, the target has just chosen):
  * aux[j] = concat over L in dspark_target_layer_ids of the target's residual streams after
    layer L at position j, averaged over the hc streams (the proposer's _extract_layer_hidden: the
    HF model's hidden_states[L + 1]); main[j] = main_norm(main_proj(aux[j])) (stage 0's).
  * Every stage keeps its own context rows rope(kv_norm(wkv main[j]), j) for j in the sliding
    window [p - W + 1, p] (W = sliding_window; positions < 0 do not exist).
  * The block: tokens [x0, noise, ..., noise] (T = num_speculative_tokens of them) at positions
    p + 1 .. p + T, embedded and copied into the hc streams. Each stage is a DeepSeek-V4 decoder
    layer (V4's mHC: each site collapses the streams by its own pre; V4's MoE, no hash routing)
    whose attention is q = rope(rms(wq_b(q_norm(wq_a x))) per head), k = v = rope(kv_norm(wkv x)),
    every block query attending to the stage's context rows and to the whole block
    (bidirectional), a sink logit per head, scale head_dim^-1/2, the output rotated back, grouped
    wo_a, wo_b. RoPE: rope_theta, interleaved pairs of the last qk_rope_head_dim channels.
  * The last stage's hc_head collapses the streams (sigmoid(f fn^T scale + base) + hc_eps) into
    h [T, D]; U = head(norm(h)) (the target's head).
  * Markov head: x_{k+1} = argmax_v U_k(v) + (W1[x_k] W2^T)(v), left to right from x0; the drafts
    are x_1 .. x_T. Confidence c_k = sigmoid(proj([h_k ; W1[x_k]])), h pre-norm.
Not modelled: the FP8 e4m3 fake-quantisation of the key/value rows' non-RoPE lanes (the
definition's QAT, blocks of 64; fp32 here as atom's V4.1 keeps its window keys). The confidence-
scheduled verify length (the definition's phase 2) is the engine's, tested on its own
(tests/engine/verify_schedule_test.cpp).

The drafter's weights are random except the Markov head, which is planted so that drafts can be
accepted: W1 gives each token of the target's greedy continuation of the fixture's greedy prompt
its own direction and W2 scores that token's successor there by BIAS, so a block drafted on that
continuation tends to follow it (the base logits, random, decide elsewhere).
"""
import json
import math
import os
import shutil
import struct
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import deepseek_v41_reference as v41  # noqa: E402
from moonvit_reference import load_safetensors, save_safetensors  # noqa: E402

SOURCE, NAME = "deepseek_v41", "deepseek_v41_dspark"
DSPARK = dict(dspark_block_size=5, dspark_target_layer_ids=[1, 3, 4], dspark_noise_token_id=254,
              dspark_markov_rank=48, dspark_num_layers=2)
T_DRAFT = 5
TRACE_STEPS = 24
BIAS = 30.0
ROUTER_MARGIN, TOKEN_MARGIN = 2e-4, 5e-2


def header_dtypes(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    return {k: v["dtype"] for k, v in h.items() if k != "__metadata__"}


def target_aux(model, ids, layers):
    """The target's logits and aux rows [N, len(layers) D] (streams after each layer L, mean over
    the hc streams); deepseek_v41_reference.Model.forward with the capture."""
    c, hc = model.c, model.c["hc_mult"]
    eps = c["rms_norm_eps"]
    x = model.w("embed.weight")[torch.tensor(ids)]
    T = x.shape[0]
    R = x.unsqueeze(1).expand(T, hc, x.shape[1]).clone()
    pre = torch.zeros(T, hc)
    pre[:, 0] = 1
    state, kept = {}, {}
    for L in range(c["num_hidden_layers"]):
        p = f"layers.{L}"
        if L in c["engram_layer_ids"]:
            R = model.engram(L, R, ids)
        pre_a, post, comb = model.mixes(R, p + ".hc_attn")
        h = v41.rms(model.collapse(R, pre), model.w(p + ".attn_norm.weight"), eps)
        R = model.expand(model.attention(L, h, state), R, post, comb)
        pre_f, post, comb = model.mixes(R, p + ".hc_ffn")
        h = v41.rms(model.collapse(R, pre_a), model.w(p + ".ffn_norm.weight"), eps)
        R = model.expand(model.moe(L, h), R, post, comb)
        pre = pre_f
        kept[L] = R.mean(1)
    h = v41.rms(model.collapse(R, pre), model.w("norm.weight"), eps)
    return h @ model.w("head.weight").t(), torch.cat([kept[L] for L in layers], -1)


class Drafter:
    def __init__(self, c, W):
        self.c, self.W = c, W
        self.mixer = v41.Model(c, W)  # its mixes / collapse / expand (V4's mHC maps)
        self.freqs = v41.rope_freqs(c["qk_rope_head_dim"], c["rope_theta"])
        self.router_margin = float("inf")

    def w(self, name):
        return self.W[name]

    def attention(self, p, x, main_ctx, ctx_pos, pos):
        c = self.c
        T, H, Dh, eps = x.shape[0], c["num_attention_heads"], c["head_dim"], c["rms_norm_eps"]
        qr = v41.rms(x @ self.w(p + ".wq_a.weight").t(), self.w(p + ".q_norm.weight"), eps)
        q = v41.rms((qr @ self.w(p + ".wq_b.weight").t()).view(T, H, Dh), None, eps)
        q = v41.rope(q, pos, self.freqs)

        def kv_of(y, at):
            k = v41.rms(y @ self.w(p + ".wkv.weight").t(), self.w(p + ".kv_norm.weight"), eps)
            return v41.rope(k, at, self.freqs)
        K = torch.cat([kv_of(main_ctx, ctx_pos), kv_of(x, pos)], 0)  # [n, Dh]
        logit = torch.einsum("thd,nd->thn", q, K) / math.sqrt(Dh)
        sink = self.w(p + ".attn_sink").view(1, H, 1).expand(T, H, 1)
        prob = torch.cat([sink, logit], -1).softmax(-1)[..., 1:]
        out = v41.rope(torch.einsum("thn,nd->thd", prob, K), pos, self.freqs, inverse=True)
        G, R_ = c["o_groups"], c["o_lora_rank"]
        wo_a = self.w(p + ".wo_a.weight").view(G, R_, -1)
        o = torch.einsum("tgi,gri->tgr", out.reshape(T, G, -1), wo_a).reshape(T, G * R_)
        return o @ self.w(p + ".wo_b.weight").t()

    def moe(self, p, x):
        c = self.c
        lim, K = c["swiglu_limit"], c["num_experts_per_tok"]

        def mlp(x, pre):
            g = x @ self.w(pre + ".w1.weight").t()
            u = x @ self.w(pre + ".w3.weight").t()
            return (F.silu(g.clamp(max=lim)) * u.clamp(-lim, lim)) @ self.w(pre + ".w2.weight").t()

        s = torch.sqrt(F.softplus(x @ self.w(p + ".gate.weight").t()))
        top = (s + self.w(p + ".gate.bias")).topk(K + 1, dim=-1)
        self.router_margin = min(self.router_margin,
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

    def draft(self, aux, p, x0, T):
        """aux [N >= p + 1, n D]: the block after anchor x0 at position p + 1."""
        c, m = self.c, self.mixer
        hc, eps, Wn = c["hc_mult"], c["rms_norm_eps"], c["sliding_window"]
        main = v41.rms(aux @ self.w("mtp.0.main_proj.weight").t(),
                       self.w("mtp.0.main_norm.weight"), eps)
        ctx_pos = list(range(max(0, p - Wn + 1), p + 1))
        pos = list(range(p + 1, p + 1 + T))
        ids = [x0] + [c["dspark_noise_token_id"]] * (T - 1)
        x = self.w("embed.weight")[torch.tensor(ids)]
        R = x.unsqueeze(1).expand(T, hc, x.shape[1]).clone()
        S = c["dspark_num_layers"]
        for i in range(S):
            s = f"mtp.{i}"
            pre, post, comb = m.mixes(R, s + ".hc_attn")
            h = v41.rms(m.collapse(R, pre), self.w(s + ".attn_norm.weight"), eps)
            R = m.expand(self.attention(s + ".attn", h, main[ctx_pos], ctx_pos, pos), R, post, comb)
            pre, post, comb = m.mixes(R, s + ".hc_ffn")
            h = v41.rms(m.collapse(R, pre), self.w(s + ".ffn_norm.weight"), eps)
            R = m.expand(self.moe(s + ".ffn", h), R, post, comb)
        last = f"mtp.{S - 1}"
        flat = R.flatten(-2)
        mix = (flat @ self.w(last + ".hc_head_fn").t()) * torch.rsqrt(
            flat.pow(2).mean(-1, keepdim=True) + eps)
        wts = torch.sigmoid(mix * self.w(last + ".hc_head_scale")[0] +
                            self.w(last + ".hc_head_base")) + c["hc_eps"]
        h = m.collapse(R, wts)  # [T, D], pre-norm
        U = v41.rms(h, self.w(last + ".norm.weight"), eps) @ self.w("head.weight").t()
        W1 = self.w(last + ".markov_head.markov_w1.weight")
        W2 = self.w(last + ".markov_head.markov_w2.weight")
        toks, logits, margins, emb = [x0], [], [], []
        for k in range(T):
            e = W1[toks[-1]]
            row = U[k] + e @ W2.t()
            top = row.topk(2)
            margins.append(float(top.values[0] - top.values[1]))
            logits.append(row)
            emb.append(e)
            toks.append(int(top.indices[0]))
        conf = torch.sigmoid(torch.cat([h, torch.stack(emb)], -1) @
                             self.w(last + ".confidence_head.proj.weight").t()).view(-1)
        return U, torch.stack(logits), toks[1:], conf, min(margins)


def drafter_weights(c, g, trace_pairs):
    D, H, Dh, hc = c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["hc_mult"]
    V, ql, ol, G = c["vocab_size"], c["q_lora_rank"], c["o_lora_rank"], c["o_groups"]
    E, M, r = c["n_routed_experts"], c["moe_intermediate_size"], c["dspark_markov_rank"]
    nT, S = len(c["dspark_target_layer_ids"]), c["dspark_num_layers"]
    W, f32 = {}, set()

    def lin(name, n, k, gain=1.0):
        W[name + ".weight"] = torch.randn(n, k, generator=g) * (gain / math.sqrt(k))

    def norm(name, n):
        W[name + ".weight"] = 1 + 0.2 * torch.randn(n, generator=g)

    mixes = (2 + hc) * hc
    for i in range(S):
        p = f"mtp.{i}"
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
        f = p + ".ffn"
        lin(f + ".gate", E, D, 2.0)
        W[f + ".gate.bias"] = 0.3 * torch.randn(E, generator=g)
        f32.add(f + ".gate.bias")
        for e in range(E):
            lin(f"{f}.experts.{e}.w1", M, D)
            lin(f"{f}.experts.{e}.w3", M, D)
            lin(f"{f}.experts.{e}.w2", D, M)
        lin(f + ".shared_experts.w1", M, D)
        lin(f + ".shared_experts.w3", M, D)
        lin(f + ".shared_experts.w2", D, M)
    lin("mtp.0.main_proj", D, nT * D)
    norm("mtp.0.main_norm", D)
    last = f"mtp.{S - 1}"
    norm(last + ".norm", D)
    W[last + ".hc_head_fn"] = torch.randn(hc, hc * D, generator=g) * (2.0 / math.sqrt(hc * D))
    W[last + ".hc_head_base"] = 0.5 * torch.randn(hc, generator=g)
    W[last + ".hc_head_scale"] = 0.5 + 0.5 * torch.rand(1, generator=g)
    f32.update({last + ".hc_head_fn", last + ".hc_head_base", last + ".hc_head_scale"})
    # The Markov head: small random, plus a planted direction per token of the target's greedy
    # continuation scoring its successor there (a power of two each, exact in BF16).
    w1 = 0.05 * torch.randn(V, r, generator=g)
    w2 = 0.05 * torch.randn(V, r, generator=g)
    slots = {}
    for a, b in trace_pairs:
        if a not in slots:
            slots[a] = len(slots)
            assert slots[a] < r, "markov rank too small for the trace"
            w1[a] = 0
            w1[a, slots[a]] = 4.0
        w2[b, slots[a]] = BIAS / 4.0
    W[last + ".markov_head.markov_w1.weight"] = w1
    W[last + ".markov_head.markov_w2.weight"] = w2
    W[last + ".confidence_head.proj.weight"] = torch.randn(1, D + r, generator=g) / math.sqrt(D + r)
    f32.add(last + ".confidence_head.proj.weight")
    return W, f32


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
    src, out_dir = os.path.join(root, "models", SOURCE), os.path.join(root, "models", NAME)
    os.makedirs(out_dir, exist_ok=True)
    for f in ("generation_config.json", "tokenizer.json"):
        shutil.copy(os.path.join(src, f), os.path.join(out_dir, f))
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    text = dict(config["text_config"], **DSPARK)
    config["text_config"] = text
    target_path = os.path.join(src, "model.safetensors")
    dtypes = header_dtypes(target_path)
    target_w = load_safetensors(target_path)
    lookup, _ = v41.compressed_lookup(os.path.join(src, "tokenizer.json"))
    ref = load_safetensors(os.path.join(root, "references", SOURCE + ".safetensors"))
    prompt = ref["greedy_prompt"].tolist()
    # The target's greedy continuation of the greedy prompt (the planted Markov pairs).
    target = v41.Model(text, {k: v.float() for k, v in target_w.items()}, lookup)
    trace, _ = v41.greedy(target, prompt, TRACE_STEPS)
    assert trace[:len(ref["greedy_tokens"])] == ref["greedy_tokens"].tolist()
    chain = [prompt[-1]] + trace
    pairs = list(zip(chain[:-1], chain[1:]))
    print("target greedy continuation", trace)
    # Cases: (prompt, anchor position p): the anchor is the target's greedy token after it.
    cases = [prompt, prompt[:5], prompt[:20]]
    weights = os.path.join(out_dir, "model.safetensors")
    for attempt in range(40):
        g = torch.Generator().manual_seed(5000 + attempt)
        W, f32 = drafter_weights(text, g, pairs)
        allw = dict(target_w)
        allw.update(W)
        bf16 = [k for k in target_w if dtypes[k] == "BF16"] + [k for k in W if k not in f32]
        save_safetensors(allw, weights, bf16=bf16)
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
            f.write("\n")
        # Reload fresh, fp32.
        with open(os.path.join(out_dir, "config.json")) as f:
            cfg = json.load(f)["text_config"]
        loaded = {k: v.float() for k, v in load_safetensors(weights).items()}
        tgt = v41.Model(cfg, loaded, lookup)
        d = Drafter(cfg, loaded)
        saved, ok, accepted = {}, True, 0
        for i, ids in enumerate(cases):
            logits, aux = target_aux(tgt, ids, cfg["dspark_target_layer_ids"])
            top = logits[-1].topk(2)
            x0 = int(top.indices[0])
            ok = ok and float(top.values[0] - top.values[1]) > TOKEN_MARGIN
            U, biased, toks, conf, margin = d.draft(aux, len(ids) - 1, x0, T_DRAFT)
            ok = ok and margin > TOKEN_MARGIN
            if i == 0:
                # How many drafts the target's greedy continuation would accept.
                for k, t in enumerate(toks):
                    if t != trace[1 + k]:
                        break
                    accepted += 1
            print(f"attempt {attempt} case {i}: {len(ids)} tokens, anchor {x0}, drafts {toks}, "
                  f"min markov margin {margin:.3g}, confidence {[round(float(v), 3) for v in conf]}")
            saved.update({
                f"case{i}_prompt": torch.tensor(ids, dtype=torch.int64),
                f"case{i}_anchor": torch.tensor([x0], dtype=torch.int64),
                f"case{i}_base_logits": U.contiguous(),
                f"case{i}_logits": biased.contiguous(),
                f"case{i}_tokens": torch.tensor(toks, dtype=torch.int64),
                f"case{i}_confidence": conf.contiguous(),
            })
        print(f"attempt {attempt}: drafter router margin {d.router_margin:.3g}, case 0 drafts "
              f"the trace accepts {accepted}")
        if ok and d.router_margin > ROUTER_MARGIN and accepted >= 2:
            break
    else:
        raise SystemExit("no draw kept every choice away from a tie")
    saved["trace"] = torch.tensor(trace, dtype=torch.int64)
    ref_dir = os.path.join(root, "references")
    save_safetensors(saved, os.path.join(ref_dir, NAME + ".safetensors"))
    print(NAME, "size", os.path.getsize(weights), "base logits std",
          float(saved["case0_base_logits"].std()))


if __name__ == "__main__":
    main()
