"""Kimi-K3's text model in plain PyTorch, written from its public definition, for atom's fixtures.

transformers has no Kimi-K3. Its text model is Moonshot's modeling_kimi_linear.py with K3's
options on; this forward follows that definition as ROCm/ATOM, SGLang and vLLM implement it
(../shared/reference/architectures.md section 10), written here without their code:
  - the decoder: KDA or MLA (linear_attn_config's 1-indexed kda_layers / full_attn_layers), then a
    dense MLP (layers < first_k_dense_replace) or the latent MoE;
  - SiTU everywhere: beta tanh(g / beta) sigmoid(g) times up, the up soft-capped by linear_beta;
  - MLA without any rotation (q LoRA; the qk_rope_head_dim channels split off, shared, unrotated),
    softmax scale (nope + rope)^-0.5, q_a_layernorm / kv_a_layernorm at eps 1e-6, the output gate
    o_proj(attn * sigmoid(g_proj(x)));
  - KDA: short causal convs (silu) on q, k, v; the bounded forget gate
    lb * sigmoid(exp(A_log[h]) * (f_b(f_a(x)) + dt_bias)); beta = sigmoid(b_proj(x)); q and k
    L2-normalised (eps 1e-6 inside the root), q scaled by head_dim^-0.5; per head
    S = diag(exp(g)) S; S += beta k (v - S^T k)^T; o = S^T q; then RMSNorm per head times
    o_norm.weight times sigmoid(g_proj(x)) (the full-rank output gate); o_proj;
  - the latent MoE: sigmoid router (the correction bias only chooses), top-k renormalised, times
    routed_scaling_factor; the routed experts on routed_expert_down_proj(x), their weighted sum
    through routed_expert_norm and routed_expert_up_proj; shared experts on x;
  - attention residuals (attn_res_block_size): a bank of the embeddings and each completed block's
    sum of sublayer outputs; each sublayer reads the softmax mix (scores: RMS-normalised rows dotted
    with norm.weight * proj.weight) of the bank and the current block's running sum.
Everything in float32. Parameters are a dict under the checkpoint's own names.
"""
import types

import torch
import torch.nn.functional as F


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def situ_mul(g, u, beta, linear_beta):
    a = beta * torch.tanh(g / beta) * torch.sigmoid(g)
    if linear_beta:
        u = linear_beta * torch.tanh(u / linear_beta)
    return a * u


class KimiK3Text:
    """forward(input_ids [1, T]) -> .logits [1, T, V]; the router margins it saw in min_margin."""

    def __init__(self, text_config, params, root="language_model.model", head="language_model.lm_head"):
        self.c = text_config
        self.p = params
        self.root = root
        self.head = head
        la = text_config["linear_attn_config"]
        self.kda_layers = {i - 1 for i in la["kda_layers"]}
        self.min_margin = float("inf")

    def __call__(self, input_ids):
        return types.SimpleNamespace(logits=self.forward(input_ids[0])[None])

    def w(self, name):
        return self.p[name]

    # ---- sublayers
    def mla(self, x, pre):
        c, w = self.c, self.w
        T, nh = x.shape[0], c["num_attention_heads"]
        nope, rope, vd = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        q = rms(x @ w(pre + "q_a_proj.weight").T, w(pre + "q_a_layernorm.weight"), 1e-6)
        q = (q @ w(pre + "q_b_proj.weight").T).view(T, nh, nope + rope)
        kv = x @ w(pre + "kv_a_proj_with_mqa.weight").T
        ckv, kr = kv[:, : c["kv_lora_rank"]], kv[:, c["kv_lora_rank"]:]
        kvb = (rms(ckv, w(pre + "kv_a_layernorm.weight"), 1e-6) @ w(pre + "kv_b_proj.weight").T)
        kvb = kvb.view(T, nh, nope + vd)
        k = torch.cat([kvb[..., :nope], kr[:, None, :].expand(T, nh, rope)], -1)
        v = kvb[..., nope:]
        s = torch.einsum("thd,shd->hts", q, k) * (nope + rope) ** -0.5
        s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), 1), float("-inf"))
        o = torch.einsum("hts,shd->thd", torch.softmax(s, -1), v).reshape(T, nh * vd)
        if c.get("mla_use_output_gate"):
            o = o * torch.sigmoid(x @ w(pre + "g_proj.weight").T)
        return o @ w(pre + "o_proj.weight").T

    def kda(self, x, pre):
        c, w = self.c, self.w
        la = c["linear_attn_config"]
        T, H, D, K = x.shape[0], la["num_heads"], la["head_dim"], la["short_conv_kernel_size"]

        def conv(name, proj):
            y = (x @ w(pre + proj + ".weight").T).T[None]  # [1, C, T]
            y = F.conv1d(F.pad(y, (K - 1, 0)), w(pre + name + ".weight"), groups=H * D)
            return F.silu(y[0].T)  # [T, C]

        q, k, v = (conv(n + "_conv1d", n + "_proj").view(T, H, D) for n in "qkv")
        f = (x @ w(pre + "f_a_proj.weight").T) @ w(pre + "f_b_proj.weight").T
        f = f.view(T, H, D) + w(pre + "dt_bias").view(H, D)
        a = torch.exp(w(pre + "A_log").reshape(-1)[:H]).view(1, H, 1)
        lb = la.get("gate_lower_bound")
        gk = lb * torch.sigmoid(a * f) if lb is not None else -a * F.softplus(f)
        beta = torch.sigmoid(x @ w(pre + "b_proj.weight").T)  # [T, H]
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6) * D ** -0.5
        k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
        S = torch.zeros(H, D, D, device=x.device)  # [head, key, value]
        o = torch.empty(T, H, D, device=x.device)
        for t in range(T):
            S = torch.exp(gk[t])[:, :, None] * S
            u = v[t] - torch.einsum("hkv,hk->hv", S, k[t])
            S = S + beta[t][:, None, None] * k[t][:, :, None] * u[:, None, :]
            o[t] = torch.einsum("hkv,hk->hv", S, q[t])
        if la.get("use_full_rank_gate"):
            g = x @ w(pre + "g_proj.weight").T
        else:
            g = (x @ w(pre + "g_a_proj.weight").T) @ w(pre + "g_b_proj.weight").T
        o = rms(o, w(pre + "o_norm.weight"), c["rms_norm_eps"]) * torch.sigmoid(g.view(T, H, D))
        return o.reshape(T, H * D) @ w(pre + "o_proj.weight").T

    def glu(self, x, pre, gate="gate_proj", up="up_proj", down="down_proj"):
        c, w = self.c, self.w
        beta = c.get("activation_situ_beta") or 1.0
        return situ_mul(x @ w(pre + gate + ".weight").T, x @ w(pre + up + ".weight").T, beta,
                        c.get("activation_situ_linear_beta")) @ w(pre + down + ".weight").T

    def moe(self, x, pre):
        c, w = self.c, self.w
        E, k = c["num_experts"], c["num_experts_per_token"]
        s = torch.sigmoid(x @ w(pre + "gate.weight").T)
        choice = s + w(pre + "gate.e_score_correction_bias")
        top = torch.topk(choice, k + 1, dim=-1)
        self.min_margin = min(self.min_margin, float((top.values[:, k - 1] - top.values[:, k]).min()))
        idx = top.indices[:, :k]
        wt = s.gather(-1, idx)
        if c.get("moe_renormalize", True):
            wt = wt / (wt.sum(-1, keepdim=True) + 1e-20)
        wt = wt * c.get("routed_scaling_factor", 1.0)
        latent = c.get("routed_expert_hidden_size")
        z = x @ w(pre + "routed_expert_down_proj.weight").T if latent else x
        y = torch.zeros(x.shape[0], z.shape[1], device=x.device)
        for t in range(x.shape[0]):
            for j in range(k):
                e = int(idx[t, j])
                y[t] += wt[t, j] * self.glu(z[t : t + 1], f"{pre}experts.{e}.", "w1", "w3", "w2")[0]
        if latent:
            if c.get("latent_moe_use_norm"):
                y = rms(y, w(pre + "routed_expert_norm.weight"), c["rms_norm_eps"])
            y = y @ w(pre + "routed_expert_up_proj.weight").T
        if c.get("num_shared_experts", 0):
            y = y + self.glu(x, pre + "shared_experts.")
        return y

    def attn_res(self, rows, base):
        V = torch.stack(rows)  # [n, T, H]
        sw = self.w(base + "_norm.weight") * self.w(base + "_proj.weight")[0]
        score = (V * torch.rsqrt(V.pow(2).mean(-1, keepdim=True) + self.c["rms_norm_eps"]) * sw).sum(-1)
        return (torch.softmax(score, 0)[..., None] * V).sum(0)

    # ---- model
    def forward(self, ids):
        c, w = self.c, self.w
        eps, bs = c["rms_norm_eps"], c.get("attn_res_block_size")
        prefix = w(self.root + ".embed_tokens.weight")[ids]
        bank = []
        for i in range(c["num_hidden_layers"]):
            pre = f"{self.root}.layers.{i}."
            h = self.attn_res(bank + [prefix], pre + "self_attention_res") if bs and bank else prefix
            if bs and i % bs == 0:
                bank.append(prefix)
                prefix = None
            x = rms(h, w(pre + "input_layernorm.weight"), eps)
            a = self.kda(x, pre + "self_attn.") if i in self.kda_layers else self.mla(x, pre + "self_attn.")
            prefix = a if prefix is None else prefix + a
            h = self.attn_res(bank + [prefix], pre + "mlp_res") if bs else prefix
            x = rms(h, w(pre + "post_attention_layernorm.weight"), eps)
            if i < c.get("first_k_dense_replace", 1):
                m = self.glu(x, pre + "mlp.")
            else:
                m = self.moe(x, pre + "block_sparse_moe.")
            prefix = prefix + m
        if bs:
            prefix = self.attn_res(bank + [prefix], self.root + ".output_attn_res")
        return rms(prefix, w(self.root + ".norm.weight"), eps) @ w(self.head + ".weight").T
