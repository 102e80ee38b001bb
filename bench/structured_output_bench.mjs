// The throughput cost of structured output: `atom serve` on a model folder (default: the demo
// model, models/kjv-tiny, on the CPU) decodes the same requests with and without a grammar, at a
// concurrency of 1 and 64, and prints output tokens per second of each and their ratio. The
// grammar runs are JSON (a schema with free strings, and json_object); the unconstrained runs
// ignore EOS so every request decodes max_tokens. The ratio is the fraction of unconstrained
// decode speed that constrained decoding keeps (1.0: free).
//   node bench/structured_output_bench.mjs [--model DIR] [--device cpu|cuda] [--tokens N]
// ATOM_BIN (default build/atom) names the binary.
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const args = Object.fromEntries(process.argv.slice(2).reduce((a, v, i, all) => (i % 2 ? a : [...a, [v.replace(/^--/, ''), all[i + 1]]]), []));
const model = args.model ?? path.join(root, 'models/kjv-tiny');
const device = args.device ?? 'cpu';
const maxTokens = Number(args.tokens ?? 128);
const bin = process.env.ATOM_BIN ?? path.join(root, 'build/atom');

function startServer() {
  return new Promise((resolve, reject) => {
    const p = spawn(bin, ['serve', model, '--device', device, '--host', '127.0.0.1', '--port', '0',
      '--served-model-name', 'm', '--max-num-seqs', '64'], { stdio: ['ignore', 'ignore', 'pipe'] });
    let log = '';
    p.stderr.on('data', (d) => {
      log += d;
      const m = log.match(/serving .* at http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) resolve({ p, port: Number(m[1]) });
    });
    p.on('exit', (c) => reject(new Error(`server exited ${c}\n${log}`)));
  });
}

const schema = { type: 'object', properties: { book: { type: 'string' }, chapter: { type: 'integer' },
  verse: { type: 'string' }, tags: { type: 'array', items: { type: 'string' } } }, required: ['book', 'chapter', 'verse'] };

async function run(port, concurrency, extra) {
  const one = async (i) => {
    const r = await fetch(`http://127.0.0.1:${port}/v1/completions`, { method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: 'm', prompt: 'And God said, ', max_tokens: maxTokens, temperature: 1.0, seed: i, ...extra }) });
    const j = await r.json();
    if (r.status !== 200) throw new Error(JSON.stringify(j));
    return j.usage.completion_tokens;
  };
  await Promise.all(Array.from({ length: Math.min(concurrency, 4) }, (_, i) => one(1000 + i)));  // warm-up
  const t0 = performance.now();
  const counts = await Promise.all(Array.from({ length: concurrency }, (_, i) => one(i)));
  const s = (performance.now() - t0) / 1000;
  const tokens = counts.reduce((a, b) => a + b, 0);
  return { tokens, s, tps: tokens / s };
}

const { p, port } = await startServer();
try {
  console.log(`model ${model}, device ${device}, max_tokens ${maxTokens}`);
  for (const conc of [1, 64]) {
    const free = await run(port, conc, { ignore_eos: true });
    for (const [name, extra] of [['json_schema', { response_format: { type: 'json_schema', json_schema: { name: 'v', schema } } }],
      ['json_object', { response_format: { type: 'json_object' } }]]) {
      const c = await run(port, conc, extra);
      console.log(`concurrency ${conc}: unconstrained ${free.tps.toFixed(1)} tok/s (${free.tokens} tokens); ` +
        `${name} ${c.tps.toFixed(1)} tok/s (${c.tokens} tokens): ratio ${(c.tps / free.tps).toFixed(3)}`);
    }
  }
} finally {
  p.kill('SIGKILL');
}
