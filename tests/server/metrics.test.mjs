// Every vllm: series atom exports moves when it should: requests with known token counts are
// driven through `atom serve` (CPU, one running sequence at a time, so the second request waits
// for the first), and each counter, gauge and histogram is checked against what was sent.
// Run by ctest: node --test tests/server/metrics.test.mjs (ATOM_BIN and ATOM_SOURCE_DIR set).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { makeModelDir, startServe } from './serve_util.mjs';

const SRC = process.env.ATOM_SOURCE_DIR;
const BIN = process.env.ATOM_BIN;
let server, base, dir;

before(async () => {
  dir = makeModelDir(SRC, 'atom-metrics-');
  server = await startServe(BIN, ['serve', dir, '--device', 'cpu', '--load-format', 'dummy', '--host', '127.0.0.1',
    '--port', '0', '--max-model-len', '512', '--served-model-name', 'm', '--max-num-seqs', '1']);
  base = `http://127.0.0.1:${server.port}`;
});

after(() => {
  if (server) server.proc.kill('SIGKILL');
  fs.rmSync(dir, { recursive: true, force: true });
});

// The series of /metrics: name{labels} -> value, and name -> value for the unlabelled-by-le
// (the model's) sample.
async function scrape() {
  const text = await (await fetch(`${base}/metrics`)).text();
  const all = new Map();
  for (const line of text.split('\n')) {
    const m = line.match(/^([a-zA-Z0-9_:]+)(\{[^}]*\})? ([0-9.e+-]+|NaN)$/);
    if (m) all.set(m[1] + (m[2] || ''), Number(m[3]));
  }
  const one = (name, extra = '') => {
    for (const [k, v] of all)
      if (k.startsWith(name + '{') && (extra === '' || k.includes(extra)) && !k.includes('le="')) return v;
    return undefined;
  };
  return { text, one };
}

function completion(body, signal) {
  return fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'm', ...body }), signal });
}

test('gauges, counters and histograms follow the requests', async () => {
  const m0 = await scrape();
  const count0 = (n) => m0.one(`${n}_count`) ?? 0;
  const sum0 = (n) => m0.one(`${n}_sum`) ?? 0;
  const total0 = (n, extra) => m0.one(n, extra) ?? 0;
  // Idle: nothing running or waiting.
  assert.equal(m0.one('vllm:num_requests_running'), 0);
  assert.equal(m0.one('vllm:num_requests_waiting'), 0);

  // A streams 120 tokens; B is sent once A's first token is out and waits for A (max-num-seqs 1).
  const t0 = Date.now();
  const a = await completion({ prompt: 'The quick brown fox', max_tokens: 120, ignore_eos: true, stream: true,
    stream_options: { include_usage: true } });
  const reader = a.body.getReader();
  const dec = new TextDecoder();
  let aText = '';
  while (!aText.includes('"text"')) aText += dec.decode((await reader.read()).value);
  const bPromise = completion({ prompt: 'Hello there, how are you today', max_tokens: 7, ignore_eos: true });
  // While A decodes and B waits, the gauges say so (and some KV is in use).
  let sawBoth = false;
  for (let i = 0; i < 100 && !sawBoth; ++i) {
    const m = await scrape();
    sawBoth = m.one('vllm:num_requests_running') === 1 && m.one('vllm:num_requests_waiting') === 1 &&
      m.one('vllm:kv_cache_usage_perc') > 0;
    if (!sawBoth) await new Promise((r) => setTimeout(r, 5));
  }
  assert.ok(sawBoth, 'running 1, waiting 1 and KV in use while A decodes and B waits');
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    aText += dec.decode(value);
  }
  const tA = (Date.now() - t0) / 1000;
  const b = await (await bPromise).json();
  const aUsage = JSON.parse(aText.split('\n').filter((l) => l.startsWith('data: {') && l.includes('"usage":{'))
    .pop().slice(6)).usage;
  assert.equal(aUsage.completion_tokens, 120);
  assert.equal(b.usage.completion_tokens, 7);
  const prompt = aUsage.prompt_tokens + b.usage.prompt_tokens;

  // A third request aborted by its client mid-stream.
  const ctl = new AbortController();
  const c = await completion({ prompt: 'Abort me', max_tokens: 400, ignore_eos: true, stream: true }, ctl.signal);
  const cr = c.body.getReader();
  await cr.read();
  ctl.abort();

  let m;
  for (let i = 0; i < 200; ++i) {  // until the abort is counted and everything is idle
    m = await scrape();
    if (m.one('vllm:request_success_total', 'finished_reason="abort"') > total0('vllm:request_success_total', 'finished_reason="abort"') &&
        m.one('vllm:num_requests_running') === 0 && m.one('vllm:kv_cache_usage_perc') === 0) break;
    await new Promise((r) => setTimeout(r, 25));
  }
  const d = (n, extra) => m.one(n, extra) - total0(n, extra);
  const dc = (n) => m.one(`${n}_count`) - count0(n);
  const ds = (n) => m.one(`${n}_sum`) - sum0(n);

  assert.equal(m.one('vllm:num_requests_running'), 0);
  assert.equal(m.one('vllm:num_requests_waiting'), 0);
  assert.equal(m.one('vllm:kv_cache_usage_perc'), 0);
  assert.equal(d('vllm:request_success_total', 'finished_reason="length"'), 2);
  assert.equal(d('vllm:request_success_total', 'finished_reason="abort"'), 1);
  assert.equal(d('vllm:request_success_total', 'finished_reason="stop"'), 0);
  // C's prompt and tokens count too: at least one token before the abort.
  const cPrompt = d('vllm:prompt_tokens_total') - prompt;
  assert.ok(cPrompt > 0, `prompt tokens of the aborted request: ${cPrompt}`);
  const cGen = d('vllm:generation_tokens_total') - 127;
  assert.ok(cGen >= 1 && cGen < 400, `generation tokens of the aborted request: ${cGen}`);
  // Histograms: one observation per request (three), ITL one per token after the first.
  for (const h of ['vllm:time_to_first_token_seconds', 'vllm:e2e_request_latency_seconds',
    'vllm:request_queue_time_seconds', 'vllm:request_prefill_time_seconds', 'vllm:request_decode_time_seconds',
    'vllm:request_inference_time_seconds', 'vllm:request_prompt_tokens', 'vllm:request_generation_tokens',
    'vllm:request_params_n', 'vllm:request_params_max_tokens'])
    assert.equal(dc(h), 3, h);
  // Time per output token needs two tokens.
  assert.equal(dc('vllm:request_time_per_output_token_seconds'), cGen > 1 ? 3 : 2);
  assert.equal(dc('vllm:inter_token_latency_seconds'), 119 + 6 + (cGen - 1));
  assert.equal(ds('vllm:request_generation_tokens'), 127 + cGen);
  assert.equal(ds('vllm:request_prompt_tokens'), prompt + cPrompt);
  assert.equal(ds('vllm:request_params_max_tokens'), 120 + 7 + 400);
  assert.equal(ds('vllm:request_params_n'), 3);
  // Phases: prefill + decode = inference per request; B waited for most of A.
  const [q, p, dd, inf, e2e] = ['vllm:request_queue_time_seconds', 'vllm:request_prefill_time_seconds',
    'vllm:request_decode_time_seconds', 'vllm:request_inference_time_seconds',
    'vllm:e2e_request_latency_seconds'].map(ds);
  assert.ok(Math.abs(p + dd - inf) < 1e-4 * Math.max(1, inf), `prefill ${p} + decode ${dd} vs inference ${inf}`);
  assert.ok(q > 0.5 * tA * 0.5, `queue time ${q} s with B waiting behind A (${tA} s)`);
  assert.ok(e2e + 1e-3 >= q + inf, `e2e ${e2e} >= queue ${q} + inference ${inf}`);
  assert.ok(dd > 0 && p > 0);
  // HTTP requests by handler and status.
  assert.match(m.text, /http_requests_total\{handler="\/v1\/completions",method="POST",status="2xx"\} 3/);
});

test('the prefix cache counters count a repeated prompt', async () => {
  const prompt = 'one two three four five six seven eight nine ten '.repeat(8);
  const m0 = await scrape();
  const q0 = m0.one('vllm:prefix_cache_queries_total'), h0 = m0.one('vllm:prefix_cache_hits_total');
  let usage;
  for (let i = 0; i < 2; ++i) usage = (await (await completion({ prompt, max_tokens: 1 })).json()).usage;
  const m = await scrape();
  assert.equal(m.one('vllm:prefix_cache_queries_total') - q0, 2 * usage.prompt_tokens);
  // The second request finds every full block of the first (block size 16).
  const hits = m.one('vllm:prefix_cache_hits_total') - h0;
  assert.equal(hits, Math.floor((usage.prompt_tokens - 1) / 16) * 16);
});

test('/v1/models reports what vLLM reports', async () => {
  const r = await (await fetch(`${base}/v1/models`)).json();
  assert.equal(r.object, 'list');
  const card = r.data[0];
  assert.deepEqual(Object.keys(card).sort(),
    ['created', 'id', 'max_model_len', 'object', 'owned_by', 'parent', 'permission', 'root', 'vocab_size'].sort());
  assert.equal(card.vocab_size, 151669);  // ids the tokenizer and the model share (atom's addition)
  assert.equal(card.id, 'm');
  assert.equal(card.owned_by, 'vllm');
  assert.equal(card.root, dir);
  assert.equal(card.max_model_len, 512);
  assert.equal(card.parent, null);
  const perm = card.permission[0];
  assert.equal(perm.object, 'model_permission');
  for (const [k, v] of Object.entries({ allow_create_engine: false, allow_sampling: true, allow_logprobs: true,
    allow_search_indices: false, allow_view: true, allow_fine_tuning: false, organization: '*', group: null,
    is_blocking: false }))
    assert.equal(perm[k], v, k);
  assert.match(perm.id, /^modelperm-/);
});

// n choices that end at different steps: each choice's finish is sent once and counted once. The
// engine's final update of a request used to repeat the finish reason of every choice that had
// ended in an earlier step, so a stream carried two finish_reason chunks for such a choice and
// vllm:request_success_total counted it twice (the soak's unexplained surplus of finished
// choices). Seeded sampling with common stop strings ends the three choices at different steps.
test('each of n choices is finished and counted once', async () => {
  const reasons = (m) => ['stop', 'length', 'abort'].reduce(
    (a, r) => a + (m.one('vllm:request_success_total', `finished_reason="${r}"`) ?? 0), 0);
  const m0 = await scrape();
  let staggered = 0, requests = 0;
  for (let seed = 1; seed <= 6; ++seed) {
    const body = { prompt: 'Once upon a time', n: 3, max_tokens: 24, temperature: 1.5, seed, stop: ['e', 'a', 'o'] };
    // Streamed: count the finish_reason chunks of each index, and the chunks after each finish.
    const r = await completion({ ...body, stream: true });
    assert.equal(r.status, 200);
    const text = await r.text();
    const finishes = [0, 0, 0], tokensAt = [0, 0, 0];
    let order = 0;
    const finishedAt = [-1, -1, -1];
    for (const ev of text.split('\n\n')) {
      if (!ev.startsWith('data: {')) continue;
      const j = JSON.parse(ev.slice(6));
      for (const c of j.choices) {
        ++order;
        if (c.text) ++tokensAt[c.index];
        if (c.finish_reason) { ++finishes[c.index]; if (finishedAt[c.index] < 0) finishedAt[c.index] = order; }
      }
    }
    assert.deepEqual(finishes, [1, 1, 1], `finish_reason chunks per choice, seed ${seed}: ${text.slice(0, 2000)}`);
    if (new Set(finishedAt).size > 1 && (tokensAt[0] !== tokensAt[1] || tokensAt[1] !== tokensAt[2])) ++staggered;
    // Not streamed.
    const j = await (await completion(body)).json();
    assert.deepEqual(j.choices.map((c) => c.index).sort(), [0, 1, 2]);
    requests += 2;
  }
  // The check above means something only if some choices ended at different steps.
  assert.ok(staggered >= 2, `${staggered} of 6 streamed requests had choices of different lengths`);
  assert.equal(reasons(await scrape()) - reasons(m0), 3 * requests, 'finished choices counted in /metrics');
});
