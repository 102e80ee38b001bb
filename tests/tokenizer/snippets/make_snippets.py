#!/usr/bin/env python3
"""Writes the small tokenizer.json files of this folder (run by hand after editing; the outputs are
committed). Each file isolates one component or option so that the reference library's behaviour
for it is checked against atom's, case by case: see tests/node/tokenizer_reference.js."""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))

def char_vocab(extra=(), specials=("<unk>", "<s>", "</s>"), bytes_=False):
    toks = list(specials)
    if bytes_:
        toks += ["<0x%02X>" % b for b in range(256)]
    for c in " ▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-_:;()[]<>/|#@\n\té":
        if c not in toks:
            toks.append(c)
    for t in extra:
        if t not in toks:
            toks.append(t)
    return {t: i for i, t in enumerate(toks)}

MERGES = [("h", "e"), ("he", "l"), ("hel", "l"), ("hell", "o"), ("w", "o"), ("wo", "r"), ("wor", "l"),
          ("worl", "d"), ("▁", "h"), ("▁h", "ello"), ("e", "l"), ("l", "o"), ("el", "lo"), ("▁", "w"),
          ("▁w", "orld"), ("t", "h"), ("th", "e"), ("▁", "the"), ("1", "2"), ("12", "3"),
          ("a", "b"), ("ab", "c"), ("n", "'"), ("n'", "t")]

def merge_products(merges, prefix=""):
    out = []
    for a, b in merges:
        out.append(a + b[len(prefix):] if prefix and b.startswith(prefix) else a + b)
    return out

def bpe(merges=MERGES, as_pairs=False, vocab_extra=(), bytes_=False, **opts):
    products = merge_products(merges, opts.get("continuing_subword_prefix") or "")
    vocab = char_vocab(extra=[t for m in merges for t in m] + products + list(vocab_extra), bytes_=bytes_)
    model = {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
             "vocab": vocab,
             "merges": [[a, b] for a, b in merges] if as_pairs else [f"{a} {b}" for a, b in merges]}
    model.update(opts)
    return model

def added(content, id_, special=True, **kw):
    t = {"id": id_, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": not special, "special": special}
    t.update(kw)
    return t

def tokenizer(model, normalizer=None, pre_tokenizer=None, post_processor=None, decoder=None, added_tokens=()):
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": list(added_tokens),
            "normalizer": normalizer, "pre_tokenizer": pre_tokenizer, "model": model,
            "post_processor": post_processor, "decoder": decoder}

def write(name, tok, texts=None):
    spec = {"tokenizer": tok}
    if texts is not None:
        spec["texts"] = texts
    with open(os.path.join(HERE, name + ".json"), "w") as f:
        json.dump(spec, f, ensure_ascii=False, indent=1)

SPLIT_RE = {"Regex": "[0-9]+|\\s+"}
for behavior in ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
    for invert in [False, True]:
        write(f"split_{behavior.lower()}{'_invert' if invert else ''}",
              tokenizer(bpe(), pre_tokenizer={"type": "Split", "pattern": SPLIT_RE, "behavior": behavior, "invert": invert}))
write("split_string_pattern", tokenizer(bpe(), pre_tokenizer={"type": "Split", "pattern": {"String": "l"}, "behavior": "MergedWithNext", "invert": False}))
write("split_regex_lookahead", tokenizer(bpe(), pre_tokenizer={"type": "Split", "pattern": {"Regex": "\\s+(?!\\S)|\\s+|(?i:'s|'t|n't)|\\p{L}+|\\p{N}{1,2}"}, "behavior": "Isolated", "invert": False}))

meta_decoder = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
for scheme in ["always", "first", "never"]:
    for split in [True, False]:
        write(f"metaspace_{scheme}{'' if split else '_nosplit'}",
              tokenizer(bpe(), pre_tokenizer={"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": split},
                        decoder={"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": split},
                        added_tokens=[added("<s>", 1), added("</s>", 2)]))
write("metaspace_legacy_add_prefix_space", tokenizer(bpe(), pre_tokenizer={"type": "Metaspace", "replacement": "▁", "add_prefix_space": True},
                                                     decoder={"type": "Metaspace", "replacement": "▁", "add_prefix_space": True}))

spm_decoder = {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                                                  {"type": "ByteFallback"}, {"type": "Fuse"},
                                                  {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
spm_norm = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
write("byte_fallback", tokenizer(bpe(byte_fallback=True, bytes_=True), normalizer=spm_norm, decoder=spm_decoder,
                                 added_tokens=[added("<unk>", 0), added("<s>", 1), added("</s>", 2)],
                                 post_processor={"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                                                 "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}))
write("unk_fuse", tokenizer(bpe(fuse_unk=True), decoder=spm_decoder))
write("unk_no_fuse", tokenizer(bpe(fuse_unk=False)))
write("no_unk", tokenizer(bpe(unk_token=None)))
write("ignore_merges", tokenizer(bpe(ignore_merges=True, vocab_extra=["helloworld", "abcabc", "world!"])))
write("ignore_merges_off", tokenizer(bpe(ignore_merges=False, vocab_extra=["helloworld", "abcabc", "world!"])))
write("merges_as_pairs", tokenizer(bpe(as_pairs=True, merges=MERGES + [(" ", "h"), ("a b", "c")], vocab_extra=["a b", "a bc", " h"]),
                                   pre_tokenizer={"type": "Split", "pattern": {"String": "|"}, "behavior": "Removed", "invert": False}))
pref_merges = [("h", "##e"), ("he", "##l"), ("hel", "##l"), ("hell", "##o"), ("w", "##o"), ("wo", "##r")]
write("subword_prefix_suffix", tokenizer(bpe(merges=pref_merges, continuing_subword_prefix="##", end_of_word_suffix="</w>",
                                             vocab_extra=["##" + c for c in "abcdefghijklmnopqrstuvwxyz"] + ["o</w>", "##o</w>", "d</w>", "##d</w>", "hello", "wor"]),
                                         pre_tokenizer={"type": "WhitespaceSplit"},
                                         decoder={"type": "BPEDecoder", "suffix": "</w>"}))
write("wordpiece_decoder", tokenizer(bpe(merges=pref_merges, continuing_subword_prefix="##", vocab_extra=["##" + c for c in "abcdefghijklmnopqrstuvwxyz.,!?'"]),
                                     pre_tokenizer={"type": "BertPreTokenizer"}, decoder={"type": "WordPiece", "prefix": "##", "cleanup": True}))

toks = [added("<tok>", 200, special=False), added("<ls>", 201, special=True, lstrip=True), added("<rs>", 202, special=True, rstrip=True),
        added("<both>", 203, special=True, lstrip=True, rstrip=True), added("word", 204, special=False, single_word=True),
        added("HELLO", 205, special=False, normalized=True), added("<raw>", 206, special=False, normalized=False),
        added("<tok>x", 207, special=True), added("ab", 208, special=False, single_word=True, lstrip=True)]
added_texts = ["a <tok> b", "a<tok>b", "a <tok>x b", "x  <ls>  y", "x<ls>y", "\n<ls>\n", "x  <rs>  y", "x <both>  y",
               "word", "a word b", "awordb", "words", "sword", " word ", "word,word", "hello HELLO Hello",
               "a<raw>b <RAW>", "<ls><rs><both>", "ab abc cab ab", " ab", "éword", "word\u00e9", "<tok", "<tok><tok>x<tok>"]
write("added_tokens_flags", tokenizer(bpe(vocab_extra=["HELLO"]), normalizer={"type": "Lowercase"},
                                      pre_tokenizer={"type": "WhitespaceSplit"}, added_tokens=toks), texts=added_texts)
write("added_tokens_bytelevel", tokenizer(bpe(merges=[("Ġ", "h")], vocab_extra=[], ), pre_tokenizer={"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
                                          decoder={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
                                          added_tokens=toks), texts=added_texts)

bl_vocab_chars = []
def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]
bl_chars = bytes_to_unicode()
bl_merges = [("Ġ", "h"), ("Ġh", "e"), ("l", "l"), ("Ġhe", "ll"), ("Ġhell", "o"), ("Ġ", "w"), ("o", "r"), ("Ġw", "or"), ("Ġwor", "l"), ("Ġworl", "d"), ("Ġ", "Ġ"), ("Ċ", "Ċ")]
bl_model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None, "end_of_word_suffix": None,
            "fuse_unk": False, "byte_fallback": False,
            "vocab": {t: i for i, t in enumerate(dict.fromkeys(bl_chars + [a + b for a, b in bl_merges]))},
            "merges": [f"{a} {b}" for a, b in bl_merges]}
bl_dec = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
write("bytelevel_prefix_regex", tokenizer(bl_model, pre_tokenizer={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}, decoder=bl_dec,
                                          post_processor={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}))
write("bytelevel_no_regex", tokenizer(bl_model, pre_tokenizer={"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}, decoder=bl_dec))
write("bytelevel_normalizer", tokenizer(bl_model, normalizer={"type": "ByteLevel"}, decoder=bl_dec))
write("no_decoder", tokenizer(bpe(), pre_tokenizer={"type": "WhitespaceSplit"}))

norms = {
    "lowercase": {"type": "Lowercase"},
    "nfc": {"type": "NFC"}, "nfd": {"type": "NFD"}, "nfkc": {"type": "NFKC"}, "nfkd": {"type": "NFKD"},
    "strip_both": {"type": "Strip", "strip_left": True, "strip_right": True},
    "strip_left": {"type": "Strip", "strip_left": True, "strip_right": False},
    "strip_accents": {"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "StripAccents"}]},
    "replace_regex": {"type": "Replace", "pattern": {"Regex": "[0-9]+"}, "content": "#"},
    "replace_string": {"type": "Replace", "pattern": {"String": "l"}, "content": "LL"},
    "prepend": {"type": "Prepend", "prepend": "▁"},
    "nmt": {"type": "Nmt"},
    "bert": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True, "strip_accents": None, "lowercase": True},
    "bert_keep_case": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": False, "strip_accents": False, "lowercase": False},
}
for name, n in norms.items():
    write(f"normalizer_{name}", tokenizer(bpe(), normalizer=n, pre_tokenizer={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True}))

pres = {
    "digits_individual": {"type": "Digits", "individual_digits": True},
    "digits_contiguous": {"type": "Digits", "individual_digits": False},
    "punctuation": {"type": "Punctuation", "behavior": "Isolated"},
    "punctuation_merged_prev": {"type": "Punctuation", "behavior": "MergedWithPrevious"},
    "whitespace": {"type": "Whitespace"},
    "whitespace_split": {"type": "WhitespaceSplit"},
    "bert": {"type": "BertPreTokenizer"},
    "char_delimiter": {"type": "CharDelimiterSplit", "delimiter": "l"},
    "sequence": {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, {"type": "Digits", "individual_digits": True}, {"type": "Punctuation", "behavior": "Isolated"}]},
    "sequence_split_metaspace_first": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "[0-9]"}, "behavior": "Isolated", "invert": False},
                                                                              {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}]},
}
for name, p in pres.items():
    write(f"pre_{name}", tokenizer(bpe(), pre_tokenizer=p))

template = {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}, "</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}}
specials = [added("<unk>", 0), added("<s>", 1), added("</s>", 2)]
write("post_template_bos_eos", tokenizer(bpe(), pre_tokenizer={"type": "WhitespaceSplit"}, post_processor=template, added_tokens=specials))
write("post_bert", tokenizer(bpe(), pre_tokenizer={"type": "WhitespaceSplit"}, post_processor={"type": "BertProcessing", "sep": ["</s>", 2], "cls": ["<s>", 1]}, added_tokens=specials))
write("post_roberta", tokenizer(bpe(), pre_tokenizer={"type": "WhitespaceSplit"}, post_processor={"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 1], "trim_offsets": True, "add_prefix_space": True}, added_tokens=specials))
write("post_sequence", tokenizer(bpe(), pre_tokenizer={"type": "WhitespaceSplit"}, post_processor={"type": "Sequence", "processors": [{"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}, template]}, added_tokens=specials))
write("decoder_strip_replace", tokenizer(bpe(), pre_tokenizer={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True},
                                         decoder={"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"Regex": "▁+"}, "content": "_"}, {"type": "Strip", "content": "_", "start": 2, "stop": 0}, {"type": "Fuse"}]}))
