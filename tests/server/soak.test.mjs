// A CI-sized soak of `atom serve` on the CPU backend (issue 22): a few thousand requests with
// random sampling parameters, prompt lengths, n, streaming or not, invalid ones, client aborts at
// random points and clients that drop mid-request, ATOM_SOAK_CONCURRENCY at a time. At the end:
// no error but the expected 4xx, no request running or waiting, every KV block and state slot
// free, RSS back within a margin of its warm baseline, and /metrics counters consistent with what
// the clients saw. Seeded (ATOM_SOAK_SEED) so a failure can be replayed.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import { makeModelDir, startServe } from './serve_util.mjs';

const SRC = process.env.ATOM_SOURCE_DIR;
const BIN = process.env.ATOM_BIN;
const REQUESTS = Number(process.env.ATOM_SOAK_REQUESTS || 2000);
const CONCURRENCY = Number(process.env.ATOM_SOAK_CONCURRENCY || 24);
const SEED = Number(process.env.ATOM_SOAK_SEED || 22);
// The soak stops issuing requests after this many seconds (CI machines differ; the count run is
// printed), so the test stays bounded in time; REQUESTS is the most it sends.
const SECONDS = Number(process.env.ATOM_SOAK_SECONDS || 80);
const MAX_MODEL_LEN = 512;
let server, base, dir;

// mulberry32: a small seeded generator.
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

const rssMiB = (pid) => Number(fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/)[1]) / 1024;

async function metrics() {
  const text = await (await fetch(`${base}/metrics`)).text();
  const one = (re) => { const m = text.match(re); return m ? Number(m[1]) : 0; };
  const http = {};
  for (const m of text.matchAll(/^http_requests_total\{handler="([^"]+)",method="([^"]+)",status="(\w+)"\} (\d+)/gm))
    http[`${m[1]} ${m[3]}`] = Number(m[4]);  // status classes as vLLM's: 2xx, 4xx
  const success = {};
  for (const m of text.matchAll(/^vllm:request_success_total\{[^}]*finished_reason="(\w+)"\} ([0-9.e+]+)/gm))
    success[m[1]] = Number(m[2]);
  return {
    text, http, success,
    running: one(/^vllm:num_requests_running\{[^}]*\} ([0-9.e+-]+)$/m),
    waiting: one(/^vllm:num_requests_waiting\{[^}]*\} ([0-9.e+-]+)$/m),
    kv: one(/^vllm:kv_cache_usage_perc\{[^}]*\} ([0-9.e+-]+)$/m),
    slots: one(/^atom:state_slot_usage_perc\{[^}]*\} ([0-9.e+-]+)$/m),
    prompt: one(/^vllm:prompt_tokens_total\{[^}]*\} ([0-9.e+-]+)$/m),
    generation: one(/^vllm:generation_tokens_total\{[^}]*\} ([0-9.e+-]+)$/m),
  };
}

async function settled() {
  let m;
  for (let i = 0; i < 400; ++i) {
    m = await metrics();
    if (m.running === 0 && m.waiting === 0 && m.kv === 0 && m.slots === 0) return m;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.fail(`left over: running ${m.running}, waiting ${m.waiting}, kv ${m.kv}, state slots ${m.slots}`);
}

// One random request: its route, body, and what it should come to.
function plan(rand, i) {
  const pick = (xs) => xs[Math.floor(rand() * xs.length)];
  const words = Array.from({ length: 1 + Math.floor(rand() * 120) }, () => pick(['the', 'cat', 'sat', 'on', 'a', 'mat',
    'quantum', 'über', '東京', '42', 'tokens', '\n', 'café', 'emoji😀', 'x']));
  const chat = rand() < 0.5;
  const stream = rand() < 0.5;
  const body = { model: 'soak', stream, max_tokens: 1 + Math.floor(rand() * 12) };
  if (rand() < 0.8) body.temperature = rand() * 1.5;
  if (rand() < 0.5) body.top_p = 0.1 + rand() * 0.9;
  if (rand() < 0.4) body.top_k = pick([-1, 1, 5, 50]);
  if (rand() < 0.3) body.min_p = rand() * 0.2;
  if (rand() < 0.3) body.seed = Math.floor(rand() * 1e6);
  if (rand() < 0.3) body.presence_penalty = rand() * 2 - 1;
  if (rand() < 0.3) body.frequency_penalty = rand() * 2 - 1;
  if (rand() < 0.3) body.repetition_penalty = 0.8 + rand() * 0.5;
  if (rand() < 0.2) body.stop = ['\n', 'cat'];
  if (rand() < 0.2) body.ignore_eos = true;
  if (rand() < 0.2) body.min_tokens = Math.floor(rand() * body.max_tokens);
  const n = pick([1, 1, 1, 2, 3]);
  body.n = n;
  if (stream) body.stream_options = { include_usage: true };
  if (chat) {
    body.messages = [{ role: 'user', content: words.join(' ') }];
    if (rand() < 0.3) body.logprobs = true, body.top_logprobs = Math.floor(rand() * 3);
  } else {
    body.prompt = words.join(' ');
    if (rand() < 0.3) body.logprobs = Math.floor(rand() * 3);
  }
  const route = chat ? '/v1/chat/completions' : '/v1/completions';
  const r = rand();
  let fate = 'ok';
  if (r < 0.05) {
    fate = 'bad';
    Object.assign(body, pick([{ top_p: 7 }, { temperature: -1 }, { n: 0 }, { max_tokens: -5 }, { top_k: -7 },
      { logprobs: chat ? 'x' : 99 }, { stop: [1] }, { max_tokens: MAX_MODEL_LEN * 4 }]));
  } else if (r < 0.08) {
    fate = 'bad';  // a prompt longer than the context
    if (chat) body.messages[0].content = 'word '.repeat(MAX_MODEL_LEN * 2); else body.prompt = 'word '.repeat(MAX_MODEL_LEN * 2);
  } else if (r < 0.15) {
    fate = 'abort';
    body.max_tokens = 16;
    body.ignore_eos = true;
  } else if (r < 0.18) {
    fate = 'drop';
  }
  return { i, route, body, fate, abortAfterMs: Math.floor(rand() * 40), abortAfterChunks: 1 + Math.floor(rand() * 4) };
}

// Runs one planned request; returns what the client saw.
async function run(p) {
  const seen = { route: p.route, fate: p.fate, status: 0, choices: 0, completionTokens: 0, promptTokens: 0, problem: null };
  if (p.fate === 'drop') {
    // Headers and half the body, then gone.
    const text = JSON.stringify(p.body);
    await new Promise((resolve) => {
      const s = net.connect(server.port, '127.0.0.1', () => {
        s.write(`POST ${p.route} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${text.length}\r\n\r\n` +
                text.slice(0, text.length >> 1));
        setTimeout(() => { s.destroy(); resolve(); }, p.abortAfterMs);
      });
      s.on('error', resolve);
    });
    return seen;
  }
  const ctl = new AbortController();
  let timer = null;
  if (p.fate === 'abort' && !p.body.stream) timer = setTimeout(() => ctl.abort(), p.abortAfterMs);
  try {
    const r = await fetch(`${base}${p.route}`, { method: 'POST', signal: ctl.signal,
      headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(p.body) });
    seen.status = r.status;
    if (r.status !== 200) {
      const j = await r.json();
      if (!(r.status === 400 && p.fate === 'bad' && j.error && j.error.message))
        seen.problem = `${r.status} for a ${p.fate} request: ${JSON.stringify(j).slice(0, 300)}`;
      return seen;
    }
    if (p.fate === 'bad') seen.problem = `200 for a bad request: ${JSON.stringify(p.body).slice(0, 200)}`;
    if (!p.body.stream) {
      const j = await r.json();
      seen.choices = j.choices.length;
      seen.completionTokens = j.usage.completion_tokens;
      seen.promptTokens = j.usage.prompt_tokens;
      if (j.choices.length !== p.body.n) seen.problem = `${j.choices.length} choices for n=${p.body.n}`;
      for (const c of j.choices)
        if (!['stop', 'length'].includes(c.finish_reason)) seen.problem = `finish_reason ${c.finish_reason}`;
      return seen;
    }
    // SSE: count events, abort after a few when planned.
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = '', events = 0, done = false;
    const finished = new Set();
    for (;;) {
      const { value, done: eof } = await reader.read();
      if (eof) break;
      buf += dec.decode(value, { stream: true });
      let k;
      while ((k = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, k);
        buf = buf.slice(k + 2);
        if (!ev.startsWith('data: ')) { seen.problem = `not an SSE event: ${ev.slice(0, 100)}`; continue; }
        const payload = ev.slice(6);
        if (payload === '[DONE]') { done = true; continue; }
        const j = JSON.parse(payload);
        if (j.error) seen.problem = `stream error: ${JSON.stringify(j.error)}`;
        for (const c of j.choices || []) if (c.finish_reason) finished.add(c.index);
        if (j.usage && j.choices && j.choices.length === 0) {
          seen.completionTokens = j.usage.completion_tokens;
          seen.promptTokens = j.usage.prompt_tokens;
        }
        if (++events === p.abortAfterChunks && p.fate === 'abort') {
          ctl.abort();
          return seen;
        }
      }
    }
    if (p.fate !== 'abort') {
      if (!done) seen.problem = 'stream ended without [DONE]';
      seen.choices = finished.size;
      if (finished.size !== p.body.n) seen.problem = `${finished.size} finished choices for n=${p.body.n}`;
    } else {
      seen.choices = finished.size;  // finished before the planned abort
    }
  } catch (e) {
    if (!(p.fate === 'abort' && ctl.signal.aborted)) seen.problem = `client error: ${e}`;
  } finally {
    if (timer) clearTimeout(timer);
  }
  return seen;
}

async function phase(count, seed, seconds) {
  const rand = rng(seed);
  const plans = Array.from({ length: count }, (_, i) => plan(rand, i));
  const results = [];
  const end = Date.now() + seconds * 1000;
  let next = 0;
  await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
    while (next < plans.length && Date.now() < end) results.push(await run(plans[next++]));
  }));
  return results;
}

before(async () => {
  dir = makeModelDir(SRC, 'atom-soak-');
  // Under ASan (sanitize.sh's ASAN_OPTIONS) freed memory waits in a quarantine, 256 MiB by
  // default, which the RSS check below would read as growth (448 -> 563 MiB once): the server
  // gets a small one; use-after-free is still caught for the most recent 16 MiB freed.
  if (process.env.ASAN_OPTIONS && !process.env.ASAN_OPTIONS.includes('quarantine_size_mb'))
    process.env.ASAN_OPTIONS += ':quarantine_size_mb=16';
  server = await startServe(BIN, ['serve', dir, '--device', 'cpu', '--load-format', 'dummy', '--host', '127.0.0.1',
    '--port', '0', '--max-model-len', String(MAX_MODEL_LEN), '--served-model-name', 'soak', '--max-num-seqs', '32']);
  base = `http://127.0.0.1:${server.port}`;
});

after(() => {
  server.proc.kill('SIGKILL');
  fs.rmSync(dir, { recursive: true, force: true });
});

test(`soak: ${REQUESTS} random requests, ${CONCURRENCY} at a time`, async () => {
  // Warm up with the same mix, then take the baseline.
  await phase(Math.max(100, REQUESTS >> 4), SEED + 1, 20);
  const m0 = await settled();
  const rss0 = rssMiB(server.proc.pid);

  const t0 = Date.now();
  const results = await phase(REQUESTS, SEED, SECONDS);
  const m1 = await settled();
  const rss1 = rssMiB(server.proc.pid);
  const secs = (Date.now() - t0) / 1000;

  const problems = results.filter((r) => r.problem).map((r) => `${r.route} ${r.fate}: ${r.problem}`);
  assert.deepEqual(problems.slice(0, 10), [], `${problems.length} unexpected results`);
  assert.equal((await fetch(`${base}/health`)).status, 200);

  // /metrics against what the clients saw (deltas over the soak). An aborted or dropped request
  // may or may not have reached the server, so it widens a bound instead of being counted.
  const by = (route, status) => results.filter((r) => r.route === route && r.status === status && r.fate !== 'abort').length;
  const aborted = (route) => results.filter((r) => r.route === route && (r.fate === 'abort' || r.fate === 'drop')).length;
  const delta = (k) => (m1.http[k] || 0) - (m0.http[k] || 0);
  for (const route of ['/v1/completions', '/v1/chat/completions']) {
    assert.equal(delta(`${route} 4xx`), by(route, 400), `${route} 400s`);
    const ok = by(route, 200);
    const got = delta(`${route} 2xx`);
    assert.ok(got >= ok && got <= ok + aborted(route), `${route} 200s: metrics ${got}, clients ${ok} (+${aborted(route)} aborted)`);
    for (const s of Object.keys(m1.http).filter((k) => k.startsWith(route)))
      assert.ok(/ (2xx|4xx)$/.test(s) || delta(s) === 0, `${s}: ${delta(s)}`);
  }
  const finished = (m) => (m.success.stop || 0) + (m.success.length || 0);
  const okChoices = results.filter((r) => r.fate === 'ok' && r.status === 200).reduce((a, r) => a + r.choices, 0);
  const abortedChoices = results.filter((r) => r.fate === 'abort' || r.fate === 'drop').length * 3;
  const fin = finished(m1) - finished(m0);
  assert.ok(fin >= okChoices, `finished choices: metrics ${fin}, clients ${okChoices}`);
  // At most the aborted requests' choices on top (they may have finished before the abort). This
  // once failed (2277 against 1817 + aborted): a choice of n > 1 that ended before its request's
  // last step got its finish reason again with the request's final update, and was counted twice
  // (metrics.test.mjs, 'each of n choices is finished and counted once').
  assert.ok(fin <= okChoices + abortedChoices,
            `finished choices: metrics ${fin}, clients ${okChoices} + ${abortedChoices} possibly aborted`);
  assert.ok((m1.success.abort || 0) - (m0.success.abort || 0) <= abortedChoices);
  const okGen = results.filter((r) => r.fate === 'ok').reduce((a, r) => a + r.completionTokens, 0);
  const okPrompt = results.filter((r) => r.fate === 'ok').reduce((a, r) => a + r.promptTokens, 0);
  assert.ok(m1.generation - m0.generation >= okGen, `generation tokens: metrics ${m1.generation - m0.generation}, clients ${okGen}`);
  assert.ok(m1.prompt - m0.prompt >= okPrompt, `prompt tokens: metrics ${m1.prompt - m0.prompt}, clients ${okPrompt}`);

  // Memory back near the warm baseline: 48 MiB or 25 %, whichever is more; under ASan 50 %, as
  // its allocator keeps the peak's regions (244 -> 300 MiB with a 16 MiB quarantine, 2026-12-06).
  const margin = Math.max(48, rss0 * (process.env.ASAN_OPTIONS ? 0.5 : 0.25));
  assert.ok(rss1 <= rss0 + margin, `RSS ${rss0.toFixed(0)} -> ${rss1.toFixed(0)} MiB (margin ${margin.toFixed(0)})`);
  const fates = {};
  for (const r of results) fates[r.fate] = (fates[r.fate] || 0) + 1;
  console.log(`soak: ${results.length} requests in ${secs.toFixed(1)} s (${JSON.stringify(fates)}), ` +
              `RSS ${rss0.toFixed(0)} -> ${rss1.toFixed(0)} MiB, generated ${m1.generation - m0.generation} tokens`);
});
