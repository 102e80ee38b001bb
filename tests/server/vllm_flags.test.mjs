// vLLM launch scripts run unchanged: a table of `vllm serve` command lines (their flags, after
// the binary name) starts `atom serve`, which then answers /v1/models under the served name; the
// flags that mean nothing here are accepted with one start-up line each; bad values are refused
// by name before the weights load.
// Run by ctest: node --test tests/server/vllm_flags.test.mjs (ATOM_BIN and ATOM_SOURCE_DIR set).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { spawnSync } from 'node:child_process';
import { makeModelDir, startServe } from './serve_util.mjs';

const SRC = process.env.ATOM_SOURCE_DIR;
const BIN = process.env.ATOM_BIN;
const base = ['--device', 'cpu', '--load-format', 'dummy', '--host', '127.0.0.1', '--port', '0'];

// Each: the argv after `serve` (MODEL stands for the folder), what the log must show.
const lines = [
  { argv: ['MODEL', '--served-model-name', 'm1', '--max-model-len', '2k', '--dtype', 'bfloat16',
    '--gpu-memory-utilization', '0.9', '--max-num-seqs', '8', '--disable-log-requests',
    '--disable-log-stats', '--uvicorn-log-level', 'warning', '--trust-remote-code'],
    name: 'm1', log: [/--disable-log-requests is accepted and ignored/, /--uvicorn-log-level is accepted/,
      /--trust-remote-code is accepted/, /max_model_len 2000/] },
  { argv: ['--model', 'MODEL', '--served-model-name', 'm2', '--max-model-len', '2K',
    '--enable-chunked-prefill', '--swap-space', '16', '--max-logprobs', '5',
    '--max-num-batched-tokens', '1k', '--tensor-parallel-size', '1'],
    name: 'm2', log: [/--swap-space is accepted and ignored/, /max_model_len 2048/,
      /max_num_batched_tokens 1000/] },
  { argv: ['MODEL', '--tokenizer', 'MODEL', '--served-model-name', 'm3', '--dtype', 'auto',
    '--enable-prefix-caching', '--kv-cache-dtype', 'auto', '--seed', '0'],
    name: 'm3', log: [/from MODEL/] },
];

test('vLLM command lines start the server', async () => {
  const dir = makeModelDir(SRC, 'atom-vllm-flags-');
  try {
    for (const l of lines) {
      const argv = ['serve', ...l.argv.map((a) => (a === 'MODEL' ? dir : a)), ...base];
      const s = await startServe(BIN, argv);
      try {
        const r = await (await fetch(`http://127.0.0.1:${s.port}/v1/models`)).json();
        assert.equal(r.data[0].id, l.name);
        assert.match(s.log(), /loading the model/);  // what the refusals below must not reach
        for (const re of l.log) {
          const want = new RegExp(re.source.replace('MODEL', dir.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')));
          assert.match(s.log(), want, `${l.argv.join(' ')}`);
        }
        if (l.name === 'm2') {  // --max-logprobs 5
          const bad = await fetch(`http://127.0.0.1:${s.port}/v1/completions`, { method: 'POST',
            headers: { 'Content-Type': 'application/json' },
            body: JSON.stringify({ model: 'm2', prompt: 'Hi', max_tokens: 1, logprobs: 6 }) });
          assert.equal(bad.status, 400);
          assert.match(JSON.stringify(await bad.json()), /greater than max allowed: 5/);
        }
      } finally {
        s.proc.kill('SIGKILL');
      }
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('bad flag values are refused by name before the weights load', () => {
  const dir = makeModelDir(SRC, 'atom-vllm-bad-');
  // A model whose embedding is smaller than the tokenizer's ids.
  const small = makeModelDir(SRC, 'atom-vllm-small-');
  const cfgPath = `${small}/config.json`;
  const cfg = JSON.parse(fs.readFileSync(cfgPath, 'utf8'));
  cfg.vocab_size = 1000;
  fs.writeFileSync(cfgPath, JSON.stringify(cfg));
  try {
    const run = (...argv) => spawnSync(BIN, ['serve', ...argv, ...base], { encoding: 'utf8', timeout: 60000 });
    const cases = [
      [[dir, '--max-model-len', '32x'], /--max-model-len '32x'/],
      [[dir, '--max-model-len', '1.5K'], /--max-model-len '1.5K'/],
      [[dir, '--max-model-len', '100k'], /--max-model-len 100000 is longer than the model's max_position_embeddings 4096/],
      [[dir, '--dtype', 'bogus'], /--dtype 'bogus'/],
      [[], /needs a model folder/],
      [[dir, '--model', '/elsewhere'], /the model is given twice/],
      [[dir, '--chat-template', '{% if %}'], /the chat template does not parse/],
      [[small, '--tokenizer', dir], /produces ids up to 151668, but the model's vocab_size is 1000/],
    ];
    for (const [argv, re] of cases) {
      const r = run(...argv);
      assert.notEqual(r.status, 0, argv.join(' '));
      assert.match(r.stderr, re, argv.join(' '));
      assert.doesNotMatch(r.stderr, /loading the model/, `${argv.join(' ')}: checked after the weights`);
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
    fs.rmSync(small, { recursive: true, force: true });
  }
});
