#!/usr/bin/env python3
"""Trains atom's embedded demo model and records the PyTorch references its tests compare against.

Runs on the GPU machine (PyTorch, transformers 5, tokenizers), in one go:
  1. a byte-level BPE tokenizer (Hugging Face `tokenizers`) trained on the training split of the
     King James Version (tools/demo_corpus.py: Debian's bible-kjv-text, public domain);
  2. a small Llama (transformers' LlamaForCausalLM) trained for a few minutes on verse-sized
     documents that end with <|endoftext|>, a fifth of them chat exchanges rendered through the
     chat template, so the model learns to stop by itself;
  3. the folder saved by transformers (config.json, model.safetensors, generation_config.json,
     tokenizer.json, tokenizer_config.json with the chat template), loaded back fresh in fp32
     (TF32 off, eager attention) to record the references: per-token log-likelihoods of held-out
     passages, greedy continuations with their top-2 margins and top logprobs, greedy chat
     completions that stop at EOS, a stop string in natural text, and one next-token distribution
     for the sampling statistics.

  python3 tools/train_demo_model.py --verses kjv_verses.jsonl --out OUT [--train-seconds 120]
  python3 tools/train_demo_model.py --verses kjv_verses.jsonl --out OUT --references-only

writes OUT/kjv-tiny/ (the checkpoint), OUT/train_log.json (the run's numbers) and
OUT/references.json (committed as tests/fixtures/references/kjv-tiny.json). --references-only
records the references again from an existing OUT/kjv-tiny. Everything is seeded.
"""
import argparse
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_corpus as dc  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.set_float32_matmul_precision("highest")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

VOCAB = 4096
SEQ = 256
MODEL = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=704, num_hidden_layers=6,
             num_attention_heads=4, num_key_value_heads=2, head_dim=64,
             max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=True,
             bos_token_id=None, eos_token_id=[0, 2], pad_token_id=0,
             rope_parameters=dict(rope_type="default", rope_theta=10000.0))
GENERATION_CONFIG = dict(eos_token_id=[0, 2], pad_token_id=0)
EOS_IDS = (0, 2)

# Greedy prompts: openings in the corpus's voice (seen and unseen wording alike).
GREEDY_PROMPTS = [
    "In the beginning",
    "And the LORD spake unto Moses, saying,",
    "Blessed are the",
    "And Jesus answered and said unto them,",
    "The heavens declare",
    "Then said he unto his disciples,",
]
GREEDY_TOKENS = 40
TOP_LOGPROBS, TOP_STEPS = 5, 8
# Chat requests: the formats the training exchanges use.
CHAT_PROMPTS = [
    "Continue: And God said, Let there be",
    "Finish the verse: The LORD is my shepherd;",
    "Recite John 3:16.",
    "What does Genesis 1:1 say?",
    "Continue: Blessed are the poor in spirit:",
    "Finish the verse: Jesus wept.",
]
CHAT_MAX_TOKENS = 64
SAMPLE_PROMPT = "And the"
PASSAGE_TOKENS = 64


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def strip_specials(text):
    for s in dc.SPECIAL_TOKENS:
        text = text.replace(s, "\n")
    return text


def train_tokenizer(texts):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, show_progress=False,
                                  special_tokens=dc.SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((strip_specials(t) for t in texts), trainer=trainer)
    for i, s in enumerate(dc.SPECIAL_TOKENS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    assert tok.get_vocab_size() <= VOCAB, tok.get_vocab_size()
    log(f"tokenizer: {tok.get_vocab_size()} tokens")
    return tok


def hf_tokenizer(tok):
    t = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=dc.END_OF_TEXT, pad_token=dc.END_OF_TEXT,
        clean_up_tokenization_spaces=False, model_max_length=MODEL["max_position_embeddings"])
    t.chat_template = dc.CHAT_TEMPLATE
    return t


def save_tokenizer(t, out):
    t.save_pretrained(out)
    # The chat template inside tokenizer_config.json (transformers 5 writes chat_template.jinja).
    path = os.path.join(out, "tokenizer_config.json")
    with open(path) as f:
        cfg = json.load(f)
    jinja = os.path.join(out, "chat_template.jinja")
    if os.path.exists(jinja):
        with open(jinja) as f:
            cfg["chat_template"] = f.read()
        os.remove(jinja)
    cfg.setdefault("chat_template", dc.CHAT_TEMPLATE)
    assert cfg["chat_template"] == dc.CHAT_TEMPLATE
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)


def token_stream(encode, docs):
    """One stream of every document's ids, each followed by <|endoftext|> (id 0)."""
    ids = []
    for e in encode(docs):
        ids.extend(e)
        ids.append(0)
    return torch.tensor(ids, dtype=torch.int64)


def raw_encoder(tok):
    return lambda docs: [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)]


def hf_encoder(tok):
    return lambda docs: tok(docs, add_special_tokens=False)["input_ids"]


def add_dropout(model, p):
    """Dropout on the embeddings and on every attention and MLP output, in training only: the
    model sees each token ~40 times, and a checkpoint of this size overfits without it."""
    def hook(mod, inputs, out):
        if not mod.training:
            return out
        if isinstance(out, tuple):
            return (F.dropout(out[0], p, True),) + tuple(out[1:])
        return F.dropout(out, p, True)
    handles = [model.model.embed_tokens.register_forward_hook(hook)]
    for layer in model.model.layers:
        handles.append(layer.self_attn.register_forward_hook(hook))
        handles.append(layer.mlp.register_forward_hook(hook))
    return handles


def loss_of(model, x):
    logits = model(input_ids=x).logits
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                           x[:, 1:].reshape(-1))


@torch.no_grad()
def held_out_loss(model, windows, autocast):
    was_training = model.training
    model.eval()
    tot, n = 0.0, 0
    for i in range(0, windows.shape[0], 64):
        x = windows[i:i + 64].to(DEVICE)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast and DEVICE == "cuda"):
            logits = model(input_ids=x).logits
        l = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                            x[:, 1:].reshape(-1), reduction="sum")
        tot += l.item()
        n += x[:, 1:].numel()
    model.train(was_training)
    return tot / n


def train(args, train_ids, held_windows, log_rows):
    torch.manual_seed(args.seed)
    cfg = transformers.LlamaConfig(**MODEL)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32,
                                                          attn_implementation="sdpa").to(DEVICE)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params / 1e6:.2f} M parameters")
    add_dropout(model, args.dropout)
    model.train()
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]  # RMSNorm weights: no decay
    opt = torch.optim.AdamW([dict(params=matrices, weight_decay=0.1),
                             dict(params=vectors, weight_decay=0.0)], lr=args.lr,
                            betas=(0.9, 0.95), fused=DEVICE == "cuda")
    g = torch.Generator().manual_seed(args.seed)
    n_windows = train_ids.numel() - SEQ - 1
    stream = train_ids.to(DEVICE)
    offsets = torch.arange(SEQ, device=DEVICE)
    warmup, total = 100, args.max_steps
    best = (float("inf"), None, 0)
    t0 = t_mark = time.time()
    step = 0
    while step < total:
        if step == 30:  # plan the run from the measured step time
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            per_step = (time.time() - t_mark) / 20
            total = max(300, min(args.max_steps, int(args.train_seconds / per_step)))
            log(f"{per_step * 1e3:.1f} ms a step: {total} steps "
                f"({total * args.batch * SEQ / train_ids.numel():.1f} epochs)")
        if step == 10:
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            t_mark = time.time()
        lr = args.lr * min(1.0, (step + 1) / warmup)
        if step >= warmup and total > warmup:
            prog = min(1.0, (step - warmup) / (total - warmup))
            lr = args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * prog)))
        for group in opt.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, n_windows, (args.batch, 1), generator=g).to(DEVICE)
        x = stream[starts + offsets]  # [batch, SEQ] windows at random offsets
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=DEVICE == "cuda"):
            loss = loss_of(model, x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % args.eval_every == 0 or step == total:
            hl = held_out_loss(model, held_windows, autocast=True)
            row = dict(step=step, seconds=round(time.time() - t0, 1), lr=lr,
                       train_loss=round(loss.item(), 4), held_out_loss=round(hl, 4))
            log_rows.append(row)
            log(json.dumps(row))
            if hl < best[0]:
                best = (hl, {k: v.detach().clone() for k, v in model.state_dict().items()}, step)
    log(f"best held-out loss {best[0]:.4f} at step {best[2]} of {step}")
    model.load_state_dict(best[1])
    model.eval()
    return model, best[2], step, n_params


@torch.no_grad()
def logits_of(model, ids):
    return model(input_ids=torch.tensor([ids], device=DEVICE)).logits[0].double()


@torch.no_grad()
def greedy(model, prompt, steps, stop_ids=()):
    """Greedy tokens (a full forward every step: no cache to get wrong), the top-2 margin of each
    step, and the top logprobs of the first TOP_STEPS steps."""
    ids, gen, margins, tops = list(prompt), [], [], []
    for i in range(steps):
        row = logits_of(model, ids)[-1]
        top2 = torch.topk(row, 2)
        t = int(top2.indices[0])
        margins.append(float(top2.values[0] - top2.values[1]))
        if i < TOP_STEPS:
            lp = torch.log_softmax(row, -1)
            tk = torch.topk(lp, TOP_LOGPROBS)
            tops.append([[int(j), float(v)] for v, j in zip(tk.values, tk.indices)])
        gen.append(t)
        ids.append(t)
        if t in stop_ids:
            break
    return gen, margins, tops


def finish_reason(gen):
    """vLLM's finish reason for a greedy run capped at CHAT_MAX_TOKENS: the length cap is checked
    before EOS, so an EOS drawn as the last allowed token ends it with "length". (The committed
    references were recorded labelling that case "stop"; the tests apply this rule themselves.)"""
    return "stop" if gen[-1] in EOS_IDS and len(gen) < CHAT_MAX_TOKENS else "length"


def pick_stop(text):
    """A stop string that greedy text reaches naturally: a later word, with its leading space."""
    words = text.split(" ")
    for i in range(3, len(words)):
        w = words[i]
        stop = " " + w
        if len(w) >= 4 and w.isalpha() and text.find(stop) == len(" ".join(words[:i])):
            return stop, text[:text.find(stop)]
    return None, None


def record_references(ref, tok, train_chs, held_chs, train_info):
    R = dict(train_info)
    # Held-out perplexity of the whole held-out split (documents as trained), fp32.
    held_docs = dc.documents(held_chs, lambda m: tok.apply_chat_template(m, tokenize=False), 2)
    stream = token_stream(hf_encoder(tok), held_docs)
    n = (stream.numel() // SEQ) * SEQ
    R["held_out_tokens"] = int(n)
    R["held_out_perplexity_fp32"] = math.exp(held_out_loss(ref, stream[:n].view(-1, SEQ),
                                                          autocast=False))
    log(f"held-out perplexity (fp32, {n} tokens): {R['held_out_perplexity_fp32']:.3f}")

    # Per-token log-likelihoods of held-out passages (plain documents ending with EOS), each of
    # consecutive verses up to at least PASSAGE_TOKENS tokens: longer than KV blocks and chunks.
    passages = []
    for ch, first in [(held_chs[0], 0), (held_chs[7], 2), (held_chs[15], 1), (held_chs[-1], 0)]:
        count = 1
        while True:
            text = dc.passage(ch, first, count)
            ids = tok(text, add_special_tokens=False)["input_ids"] + [0]
            if len(ids) >= PASSAGE_TOKENS or first + count >= len(ch[2]):
                break
            count += 1
        lp = torch.log_softmax(logits_of(ref, ids), -1)
        per = [float(lp[t, ids[t + 1]]) for t in range(len(ids) - 1)]
        passages.append(dict(where=f"{ch[0]} {ch[1]}:{first + 1}-{first + count}", text=text,
                             ids=ids, token_logprobs=per, total=sum(per)))
        log(f"passage {passages[-1]['where']}: {len(ids)} tokens, "
            f"perplexity {math.exp(-sum(per) / len(per)):.2f}")
    R["passages"] = passages

    # Greedy continuations of text prompts, EOS ignored (as --ignore-eos).
    R["greedy"] = []
    for p in GREEDY_PROMPTS:
        ids = tok(p, add_special_tokens=False)["input_ids"]
        gen, margins, tops = greedy(ref, ids, GREEDY_TOKENS)
        R["greedy"].append(dict(prompt=p, prompt_ids=ids, tokens=gen, margins=margins,
                                text=tok.decode(gen, skip_special_tokens=True),
                                top_logprobs=[[[j, v, tok.decode([j])] for j, v in step]
                                              for step in tops]))
        log(f"greedy {p!r} -> {R['greedy'][-1]['text']!r} (min margin {min(margins):.3g})")

    # Text completions that stop at EOS by themselves, and a stop string in their text.
    R["completions"] = []
    for p in GREEDY_PROMPTS:
        ids = tok(p, add_special_tokens=False)["input_ids"]
        gen, margins, _ = greedy(ref, ids, CHAT_MAX_TOKENS, EOS_IDS)
        text = tok.decode([t for t in gen if t not in EOS_IDS], skip_special_tokens=True)
        stop, before = pick_stop(text)
        R["completions"].append(dict(prompt=p, prompt_ids=ids, tokens=gen, margins=margins,
                                     finish_reason=finish_reason(gen),
                                     text=text, stop=stop, text_before_stop=before))

    # Chat completions through the template, greedy until EOS.
    R["chat"] = []
    for q in CHAT_PROMPTS:
        messages = [{"role": "user", "content": q}]
        rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tok(rendered, add_special_tokens=False)["input_ids"]
        gen, margins, tops = greedy(ref, ids, CHAT_MAX_TOKENS, EOS_IDS)
        finish = finish_reason(gen)
        R["chat"].append(dict(messages=messages, rendered=rendered, prompt_ids=ids, tokens=gen,
                              margins=margins, finish_reason=finish,
                              text=tok.decode([t for t in gen if t not in EOS_IDS],
                                              skip_special_tokens=True),
                              top_logprobs=[[[j, v, tok.decode([j])] for j, v in step]
                                            for step in tops]))
        log(f"chat {q!r} -> {R['chat'][-1]['text']!r} ({finish}, {len(gen)} tokens, "
            f"min margin {min(margins):.3g})")
    if not any(c["finish_reason"] == "stop" for c in R["chat"]):
        log("WARNING: no chat completion stopped at EOS")

    # One next-token distribution for the sampling statistics: the full fp32 log-softmax row.
    ids = tok(SAMPLE_PROMPT, add_special_tokens=False)["input_ids"]
    lp = torch.log_softmax(logits_of(ref, ids)[-1], -1)
    R["sample"] = dict(prompt=SAMPLE_PROMPT, prompt_ids=ids, logprobs=[float(v) for v in lp])
    ent = float(-(lp.exp() * lp).sum())
    log(f"next-token entropy after {SAMPLE_PROMPT!r}: {ent:.3f} nats")
    return R


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--verses", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--train-seconds", type=float, default=120)
    ap.add_argument("--max-steps", type=int, default=6000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--references-only", action="store_true")
    args = ap.parse_args()
    t_start = time.time()
    random.seed(args.seed)
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, device {DEVICE}")

    verses = dc.read_verses(args.verses)
    train_chs, held_chs = dc.split(verses)
    # The tokenizer learns from the same documents, chat turns as plain text.
    plain = dc.documents(train_chs, lambda m: "\n".join(x["content"] for x in m), args.seed)
    tok = train_tokenizer(plain)
    hf = hf_tokenizer(tok)
    render = lambda m: hf.apply_chat_template(m, tokenize=False)  # noqa: E731
    train_docs = dc.documents(train_chs, render, args.seed)
    held_docs = dc.documents(held_chs, render, args.seed + 1)
    train_ids = token_stream(raw_encoder(tok), train_docs)
    held_ids = token_stream(raw_encoder(tok), held_docs)
    n = (held_ids.numel() // SEQ) * SEQ
    held_windows = held_ids[:n].view(-1, SEQ)
    log(f"tokenizer: {tok.get_vocab_size()} tokens; train {len(train_docs)} documents, "
        f"{train_ids.numel()} tokens; held out {len(held_docs)} documents, {held_ids.numel()} "
        f"tokens ({time.time() - t_start:.0f} s)")

    out = os.path.join(args.out, "kjv-tiny")
    log_path = os.path.join(args.out, "train_log.json")
    if not args.references_only:
        rows = []
        model, best_step, steps, n_params = train(args, train_ids, held_windows, rows)
        os.makedirs(out, exist_ok=True)
        model.save_pretrained(out)
        with open(os.path.join(out, "generation_config.json"), "w") as f:
            json.dump(GENERATION_CONFIG, f, indent=2)
        save_tokenizer(hf, out)
        info = dict(torch=torch.__version__, transformers=transformers.__version__,
                    parameters=n_params, train_tokens=int(train_ids.numel()), steps=steps,
                    best_step=best_step, batch=args.batch, seq=SEQ, lr=args.lr,
                    dropout=args.dropout, seed=args.seed, train_seconds=args.train_seconds,
                    log=rows, gpu=torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu")
        with open(log_path, "w") as f:
            json.dump(info, f, indent=2)

    # The references: everything loaded back fresh from the saved folder, in fp32.
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager").to(DEVICE).eval()
    if not args.references_only:
        trained = model.state_dict()
        for k, v in ref.state_dict().items():
            assert torch.equal(v, trained[k]), f"{k} changed through save and load"
        del model, trained
    with open(log_path) as f:
        info = json.load(f)
    fast = getattr(transformers, "PreTrainedTokenizerFast", None) or transformers.TokenizersBackend
    tok2 = fast.from_pretrained(out)
    saved = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    for text in [held_docs[0], train_docs[1], "In the beginning\n<|im_start|>user"]:
        assert tok2(text, add_special_tokens=False)["input_ids"] == saved.encode(
            text, add_special_tokens=False).ids, text
    check = tok2.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                     add_generation_prompt=True)
    assert check == "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n", repr(check)
    R = record_references(ref, tok2, train_chs, held_chs, info)
    with open(os.path.join(args.out, "references.json"), "w") as f:
        json.dump(R, f, ensure_ascii=False)
    sizes = {f: os.path.getsize(os.path.join(out, f)) for f in sorted(os.listdir(out))}
    log(f"saved {out}: {sizes} ({sum(sizes.values()) / 1e6:.1f} MB); "
        f"total {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
