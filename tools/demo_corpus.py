#!/usr/bin/env python3
"""The demo model's corpus: the King James Version from Debian's bible-kjv-text, as verses.

  python3 tools/demo_corpus.py OUT.jsonl      # needs `apt-get install bible-kjv` (the `bible` program)

writes one verse per line: {"book": "Genesis", "chapter": 1, "verse": 1, "text": "In the ..."}.
tools/train_demo_model.py imports this file for the split and the documents it trains on, so the
same rules make the training data here and on the GPU machine. Python standard library only.
"""
import json
import random
import re
import subprocess
import sys

# Every verse: the `bible` program prints "Book N" headers and "  V text" lines.
KJV_RANGE = "Genesis 1:1-Revelation 22:21"
HEADER = re.compile(r"^(\S.*) (\d+)$")
VERSE = re.compile(r"^\s+(\d+) (.+)$")

# One chapter in HELD_OUT_EVERY is held out (never trained on, the tokenizer included).
HELD_OUT_EVERY = 40
HELD_OUT_PHASE = 17

# Special tokens, in id order: 0 ends a document, 1 and 2 frame a chat turn (ChatML).
END_OF_TEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [END_OF_TEXT, IM_START, IM_END]

# ChatML, as Qwen2 writes it.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def parse_bible_output(text):
    """Verses from `bible -l100000 RANGE` output, in order."""
    verses, book, chapter = [], None, None
    for line in text.splitlines():
        if not line.strip():
            continue
        m = HEADER.match(line)
        if m and not line[0].isspace():
            book, chapter = m.group(1), int(m.group(2))
            continue
        m = VERSE.match(line)
        if not m or book is None:
            raise ValueError(f"unexpected line in the bible program's output: {line!r}")
        verses.append({"book": book, "chapter": chapter, "verse": int(m.group(1)),
                       "text": " ".join(m.group(2).split())})
    return verses


def read_verses(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def chapters(verses):
    """[(book, chapter, [verse texts])] in order."""
    out = []
    for v in verses:
        if not out or out[-1][0] != v["book"] or out[-1][1] != v["chapter"]:
            out.append((v["book"], v["chapter"], []))
        out[-1][2].append(v)
    return out


def split(verses):
    """(train chapters, held-out chapters): every HELD_OUT_EVERY-th chapter is held out."""
    train, held = [], []
    for i, ch in enumerate(chapters(verses)):
        (held if i % HELD_OUT_EVERY == HELD_OUT_PHASE else train).append(ch)
    return train, held


def chat_pair(rng, book, chapter, verse):
    """One user/assistant exchange about a verse: recite it, or finish it."""
    words = verse["text"].split()
    if rng.random() < 0.5 or len(words) < 6:
        q = rng.choice(["Recite {b} {c}:{v}.", "What does {b} {c}:{v} say?", "{b} {c}:{v}"])
        return q.format(b=book, c=chapter, v=verse["verse"]), verse["text"]
    cut = rng.randint(2, len(words) - 3)
    q = rng.choice(["Continue: {t}", "Finish the verse: {t}"])
    return q.format(t=" ".join(words[:cut])), " ".join(words[cut:])


def documents(chs, render_chat, seed, chat_fraction=0.2):
    """Training documents from chapters: runs of 1-3 consecutive verses joined by spaces, and a
    chat_fraction of them as one chat exchange rendered by render_chat(messages) (the chat
    template). Each document is a string; the trainer appends END_OF_TEXT to every one."""
    rng = random.Random(seed)
    docs = []
    for book, chapter, vs in chs:
        i = 0
        while i < len(vs):
            if rng.random() < chat_fraction:
                q, a = chat_pair(rng, book, chapter, vs[i])
                docs.append(render_chat([{"role": "user", "content": q},
                                         {"role": "assistant", "content": a}]))
                i += 1
                continue
            n = rng.choice([1, 1, 2, 3])
            docs.append(" ".join(v["text"] for v in vs[i:i + n]))
            i += n
    return docs


def passage(ch, first, count):
    """count consecutive verses of a chapter from index first, as one document's text."""
    return " ".join(v["text"] for v in ch[2][first:first + count])


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = subprocess.run(["bible", "-l100000", KJV_RANGE], check=True, capture_output=True,
                         text=True).stdout
    verses = parse_bible_output(out)
    if len(verses) != 31102:  # the KJV's count
        sys.exit(f"expected 31102 verses, parsed {len(verses)}")
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        for v in verses:
            f.write(json.dumps(v, ensure_ascii=False) + "\n")
    train, held = split(verses)
    print(f"{len(verses)} verses in {len(train) + len(held)} chapters; "
          f"{len(held)} chapters held out", file=sys.stderr)


if __name__ == "__main__":
    main()
