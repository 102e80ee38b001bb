// `atom serve` driven by the official `openai` npm client and by raw HTTP, on the CPU backend:
// a tiny Qwen3 with dummy weights paired with Qwen3's real tokenizer and chat template.
// Run by ctest: node --test tests/server/openai_client.test.mjs (ATOM_BIN and ATOM_SOURCE_DIR set).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import net from 'node:net';
import { createRequire } from 'node:module';
import { makeModelDir, startServe } from './serve_util.mjs';

const SRC = process.env.ATOM_SOURCE_DIR;
const BIN = process.env.ATOM_BIN;
const require = createRequire(path.join(SRC, 'tests/node/package.json'));
const OpenAI = require('openai');
const KEY = 'test-key';

let server, base, client, modelDir, modelName;

function startServer(dir, extra = [], loadFormat = 'dummy') {
  return startServe(BIN, ['serve', dir, '--device', 'cpu', '--load-format', loadFormat, '--host', '127.0.0.1',
    '--port', '0', '--max-model-len', '512', '--served-model-name', 'tiny-qwen3', ...extra]);
}

async function metrics() {
  const text = await (await fetch(`${base}/metrics`)).text();
  const get = (name) => {
    const m = text.match(new RegExp(`^${name}\\{[^}]*\\} ([0-9.e+-]+)$`, 'm'));
    return m ? Number(m[1]) : NaN;
  };
  return { running: get('vllm:num_requests_running'), waiting: get('vllm:num_requests_waiting'),
           kv: get('vllm:kv_cache_usage_perc'), text };
}

async function settled() {
  // Every request finished and every KV block free again.
  for (let i = 0; i < 200; ++i) {
    const m = await metrics();
    if (m.running === 0 && m.waiting === 0 && m.kv === 0) return m;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.fail('requests or KV blocks left over:\n' + (await metrics()).text.split('\n').filter((l) => l.startsWith('vllm:num') || l.startsWith('vllm:kv')).join('\n'));
}

async function post(route, body, headers = {}) {
  const r = await fetch(`${base}${route}`, { method: 'POST', headers: { 'Content-Type': 'application/json',
    Authorization: `Bearer ${KEY}`, ...headers }, body: typeof body === 'string' ? body : JSON.stringify(body) });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, json, text };
}

before(async () => {
  modelDir = makeModelDir(SRC, 'atom-serve-');
  server = await startServer(modelDir, ['--api-key', KEY]);
  base = `http://127.0.0.1:${server.port}`;
  client = new OpenAI({ baseURL: `${base}/v1`, apiKey: KEY, maxRetries: 0 });
  modelName = 'tiny-qwen3';
});

after(() => {
  if (server) server.proc.kill('SIGKILL');
  fs.rmSync(modelDir, { recursive: true, force: true });
});

test('models.list reports the served name', async () => {
  const page = await client.models.list();
  assert.equal(page.data[0].id, modelName);
  assert.equal(page.data[0].object, 'model');
});

test('chat: non-streamed and streamed greedy outputs agree, usage matches /tokenize', async () => {
  const messages = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Name three colours.' }];
  const r = await client.chat.completions.create({ model: modelName, messages, max_tokens: 20, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['length', 'stop'].includes(r.choices[0].finish_reason));
  const tok = await post('/tokenize', { model: modelName, messages });
  assert.equal(r.usage.prompt_tokens, tok.json.count);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);

  const stream = await client.chat.completions.create({ model: modelName, messages, max_tokens: 20, temperature: 0,
    stream: true, stream_options: { include_usage: true } });
  let text = '', first = null, usage = null, finish = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    if (!chunk.choices.length) continue;
    if (first === null) first = chunk.choices[0].delta;
    text += chunk.choices[0].delta.content ?? '';
    finish = chunk.choices[0].finish_reason ?? finish;
  }
  assert.equal(first.role, 'assistant');
  assert.equal(text, r.choices[0].message.content);
  assert.equal(finish, r.choices[0].finish_reason);
  assert.deepEqual(usage, r.usage);
});

test('completions: text prompt, echo, n, logprobs, streaming', async () => {
  const r = await client.completions.create({ model: modelName, prompt: 'The capital of France is', max_tokens: 8,
    temperature: 0, logprobs: 2, echo: true, n: 2 });
  assert.equal(r.choices.length, 2);
  assert.ok(r.choices[0].text.startsWith('The capital of France is'));
  assert.equal(r.choices[0].text, r.choices[1].text);  // greedy: both samples agree
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.length, lp.token_logprobs.length);
  assert.equal(lp.token_logprobs[0], null);  // the first prompt token has none
  assert.ok(lp.top_logprobs.at(-1) && Object.keys(lp.top_logprobs.at(-1)).length >= 1);
  assert.equal(r.usage.completion_tokens, 16);

  const s = await client.completions.create({ model: modelName, prompt: 'The capital of France is', max_tokens: 8,
    temperature: 0, stream: true });
  let text = '';
  for await (const c of s) text += c.choices[0]?.text ?? '';
  assert.equal('The capital of France is' + text, r.choices[0].text);
});

test('seeded sampling is reproducible', async () => {
  const ask = () => client.completions.create({ model: modelName, prompt: 'Once upon a time', max_tokens: 12,
    temperature: 1.0, top_p: 0.9, seed: 1234 });
  const [a, b] = await Promise.all([ask(), ask()]);
  assert.equal(a.choices[0].text, b.choices[0].text);
});

test('stop strings end the text where they start', async () => {
  const full = await client.completions.create({ model: modelName, prompt: 'Count:', max_tokens: 24, temperature: 0 });
  const text = full.choices[0].text;
  assert.ok(text.length > 12, text);
  const stop = text.slice(6, 9);
  const at = text.indexOf(stop);
  const r = await client.completions.create({ model: modelName, prompt: 'Count:', max_tokens: 24, temperature: 0, stop: [stop] });
  assert.equal(r.choices[0].text, text.slice(0, at));
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.choices[0].stop_reason, stop);
});

test('the client sees vLLM error types', async () => {
  await assert.rejects(client.completions.create({ model: modelName, prompt: 'x', max_tokens: -1 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400);
  await assert.rejects(client.chat.completions.create({ model: modelName, messages: [{ role: 'user', content: 'x' }], temperature: -2 }),
    (e) => e instanceof OpenAI.BadRequestError && /temperature/.test(e.message));
  await assert.rejects(client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
  await assert.rejects(client.completions.create({ model: modelName, prompt: 'word '.repeat(600), max_tokens: 10 }),
    (e) => e instanceof OpenAI.BadRequestError && /maximum context length is 512 tokens/.test(e.message));
  await assert.rejects(client.completions.create({ model: modelName, prompt: 'x', max_tokens: 1_000_000_000 }),
    (e) => e instanceof OpenAI.BadRequestError);
  const bad = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
  await settled();
});

test('hostile requests leave the server healthy with every block free', async () => {
  let r = await post('/v1/chat/completions', '{"messages": [');
  assert.equal(r.status, 400);
  assert.equal(r.json.error.type, 'BadRequestError');
  assert.equal(r.json.error.code, 400);
  for (const body of [{ prompt: 7 }, { prompt: 'x', max_tokens: 'ten' }, { prompt: 'x', n: -3 },
    { prompt: 'x', stop: [1, 2] }, { prompt: 'x', logit_bias: { abc: 1 } }, { prompt: [1, 2, 99999999] },
    { prompt: 'x', top_p: 7 }, { prompt: 'x', stream: 'yes' }, [], 'null']) {
    r = await post('/v1/completions', body);
    assert.equal(r.status, 400, JSON.stringify(body) + ' -> ' + r.text);
    assert.ok(r.json.error.message.length > 0);
  }
  r = await post('/v1/completions', { model: modelName, prompt: 'x', max_tokens: 2, some_new_field: { a: 1 } });
  assert.equal(r.status, 200);
  // 10 MB bodies: refused or answered with an error, never served.
  r = await post('/v1/completions', JSON.stringify({ prompt: 'a'.repeat(10 * 1024 * 1024) }));
  assert.ok(r.status >= 400, r.status);
  r = await post('/v1/completions', 'x'.repeat(10 * 1024 * 1024));
  assert.ok(r.status >= 400, r.status);
  // A slow client that dribbles half a request does not stop others.
  const sock = net.connect(server.port, '127.0.0.1');
  await new Promise((res) => sock.on('connect', res));
  sock.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"prompt"');
  r = await post('/v1/completions', { model: modelName, prompt: 'ok', max_tokens: 3 });
  assert.equal(r.status, 200);
  sock.destroy();
  assert.equal((await fetch(`${base}/health`)).status, 200);
  await settled();
});

test('hostile chat templates and out-of-range integers get 400 naming the limit or parameter', async () => {
  const msgs = [{ role: 'user', content: 'hi' }];
  for (const [tpl, want] of [['{{ a' + '.b'.repeat(40000) + ' }}', /depth limit of 256/],
    ['{{ 1' + ' + 1'.repeat(30000) + ' }}', /depth limit of 256/],
    ['{% for i in range(100000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}', /steps/],
    ["{{ 'x' * 100000000 }}", /limit of \d+ bytes/]]) {
    const r = await post('/v1/chat/completions', { model: modelName, messages: msgs, chat_template: tpl, max_tokens: 2 });
    assert.equal(r.status, 400, r.text.slice(0, 300));
    assert.match(r.json.error.message, want);
  }
  for (const [body, param] of [['{"prompt": "x", "max_tokens": 9223372036854775807}', 'max_tokens'],
    ['{"prompt": "x", "logit_bias": {"4294967301": 100}}', 'logit_bias'],
    ['{"prompt": "x", "stop_token_ids": [4294967301]}', 'stop_token_ids']]) {
    const r = await post('/v1/completions', body);
    assert.equal(r.status, 400, body + ' -> ' + r.text);
    assert.equal(r.json.error.param, param, r.text);
  }
  const ok = await post('/v1/chat/completions', { model: modelName, messages: msgs, max_tokens: 2 });
  assert.equal(ok.status, 200, ok.text);
  assert.equal((await fetch(`${base}/health`)).status, 200);
  await settled();
});

test('a client that disconnects mid-stream frees its request', async () => {
  const controller = new AbortController();
  const stream = await client.completions.create({ model: modelName, prompt: 'Tell a long story', max_tokens: 400,
    ignore_eos: true, stream: true }, { signal: controller.signal });
  let chunks = 0;
  try {
    for await (const c of stream) {
      if (++chunks === 3) {
        controller.abort();
        break;
      }
    }
  } catch (e) {
    assert.ok(controller.signal.aborted, String(e));
  }
  assert.equal(chunks, 3);
  const m = await settled();
  assert.match(m.text, /vllm:request_success_total\{[^}]*finished_reason="abort"\} [1-9]/);
});

test('metrics use vLLM names and types', async () => {
  const { text } = await metrics();
  for (const line of ['# TYPE vllm:num_requests_running gauge', '# TYPE vllm:generation_tokens_total counter',
    '# TYPE vllm:time_to_first_token_seconds histogram', '# TYPE vllm:e2e_request_latency_seconds histogram',
    '# TYPE vllm:request_success_total counter', 'vllm:cache_config_info{'])
    assert.ok(text.includes(line), line);
});

test('SIGTERM serves every request already begun, refuses new connections, then exits 0', async () => {
  const dir = makeModelDir(SRC, 'atom-serve-');
  const s = await startServer(dir, []);
  try {
    const url = `http://127.0.0.1:${s.port}`;
    const c = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'none', maxRetries: 0 });
    const pending = c.completions.create({ model: modelName, prompt: 'Hi', max_tokens: 150, ignore_eos: true });
    // Running in the engine, not just sent.
    for (let i = 0; ; ++i) {
      const m = (await (await fetch(`${url}/metrics`)).text()).match(/^vllm:num_requests_running\{[^}]*\} (\d+)/m);
      if (m && Number(m[1]) >= 1) break;
      assert.ok(i < 400, 'the request never ran');
      await new Promise((r) => setTimeout(r, 25));
    }
    // A second request whose headers the gate has read (it answers 100 Continue) but whose body
    // comes after the signal, and an idle keep-alive connection.
    const body = JSON.stringify({ model: modelName, prompt: 'Hello', max_tokens: 5, ignore_eos: true });
    const part = net.connect(s.port, '127.0.0.1');
    let partIn = '';
    part.on('data', (d) => { partIn += d.toString(); });
    const partClosed = new Promise((r) => part.on('close', r));
    part.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
      `Expect: 100-continue\r\nContent-Length: ${body.length}\r\n\r\n${body.slice(0, 10)}`);
    for (let i = 0; !partIn.includes('100 Continue'); ++i) {
      assert.ok(i < 400, 'no 100 Continue');
      await new Promise((r) => setTimeout(r, 25));
    }
    const idle = net.connect(s.port, '127.0.0.1');
    await new Promise((r) => idle.on('connect', r));
    const idleClosed = new Promise((r) => idle.on('close', r));
    let idleIn = '';
    idle.on('data', (d) => { idleIn += d.toString(); });

    const exited = new Promise((res) => s.proc.on('exit', (code) => res(code)));
    s.proc.kill('SIGTERM');
    for (let i = 0; !s.log().includes('draining'); ++i) {
      assert.ok(i < 400, 'no drain logged');
      await new Promise((r) => setTimeout(r, 25));
    }
    // New connections are refused once the listener is closed.
    for (let i = 0; ; ++i) {
      const refused = await new Promise((r) => {
        const t = net.connect(s.port, '127.0.0.1');
        t.on('error', (e) => r(e.code === 'ECONNREFUSED'));
        t.on('connect', () => { t.destroy(); r(false); });
      });
      if (refused) break;
      assert.ok(i < 200, 'the server still accepts connections while draining');
      await new Promise((r) => setTimeout(r, 25));
    }
    await idleClosed;
    assert.equal(idleIn, '', 'an idle connection closes without an answer');
    part.write(body.slice(10));
    await partClosed;
    // Interim 100 Continue answers first (the gate's, and the parser's behind it), then the answer.
    const [head, json] = partIn.replace(/^(HTTP\/1\.1 100 Continue\r\n\r\n)+/, '').split('\r\n\r\n');
    assert.match(head, /^HTTP\/1\.1 200/);
    assert.match(head, /Connection: close/i);
    assert.equal(JSON.parse(json).usage.completion_tokens, 5);
    const r = await pending;
    assert.equal(r.usage.completion_tokens, 150);
    assert.equal(await exited, 0);
  } finally {
    s.proc.kill('SIGKILL');
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

// Int64 tensor `name` of a safetensors file, as numbers.
function safetensorsInts(file, name) {
  const buf = fs.readFileSync(file);
  const n = Number(buf.readBigUInt64LE(0));
  const t = JSON.parse(buf.subarray(8, 8 + n).toString())[name];
  assert.equal(t.dtype, 'I64');
  const out = [];
  for (let o = 8 + n + t.data_offsets[0]; o < 8 + n + t.data_offsets[1]; o += 8) out.push(Number(buf.readBigInt64LE(o)));
  return out;
}

for (const [flags, engineLine] of [
  [['--tensor-parallel-size', '2'], /engine on 2 ranks/],
  // vLLM's -pp: two pipeline stages of one rank each, the tied head on the second.
  [['-pp', '2'], /engine on 2 ranks from cpu \(2 pipeline stages of 1 tensor-parallel ranks/],
]) test(`${flags.join(' ')} serves transformers' greedy tokens`, async () => {
  // Real weights (dummy ones are drawn per rank's shard, so they differ from one rank's): the
  // qwen3_tied fixture with a byte-level tokenizer that fits its vocabulary, prompted with ids.
  const dir = makeModelDir(SRC, 'atom-serve-tp-', 'tests/fixtures/models/qwen3_tied', { byteTokenizer: true });
  const ref = path.join(SRC, 'tests/fixtures/references/qwen3_tied.safetensors');
  const prompt = safetensorsInts(ref, 'greedy_prompt'), want = safetensorsInts(ref, 'greedy_tokens');
  const s = await startServer(dir, flags, 'auto');
  try {
    assert.match(s.log(), engineLine);
    const r = await fetch(`http://127.0.0.1:${s.port}/v1/completions`, { method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: modelName, prompt, max_tokens: want.length, temperature: 0, ignore_eos: true,
        return_token_ids: true }) });
    const body = await r.json();
    assert.equal(r.status, 200, JSON.stringify(body));
    assert.deepEqual(body.choices[0].token_ids, want);
  } finally {
    s.proc.kill('SIGKILL');
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

// vLLM's DeepSeek recipe: -dp 2 -ep, attention data-parallel over two CPU ranks (each holding every
// MLA head and its own requests' KV), the experts split between them. Three requests at once: the
// reference prompt gives transformers' greedy tokens whichever rank attends for it.
test('-dp 2 -ep serves DeepSeek-V3 with data-parallel attention', async () => {
  const dir = makeModelDir(SRC, 'atom-serve-dp-', 'tests/fixtures/models/deepseek_v3', { byteTokenizer: true });
  const ref = path.join(SRC, 'tests/fixtures/references/deepseek_v3.safetensors');
  const prompt = safetensorsInts(ref, 'greedy_prompt'), want = safetensorsInts(ref, 'greedy_tokens');
  const s = await startServe(BIN, ['serve', dir, '--device', 'cpu', '--host', '127.0.0.1', '--port', '0',
    '--max-model-len', '256', '--served-model-name', 'tiny-qwen3', '-dp', '2', '-ep']);
  try {
    assert.match(s.log(), /2 data-parallel attention, expert-parallel ranks/);
    assert.match(s.log(), /engine on 2 ranks from cpu \(data-parallel attention, each rank \d+ of the blocks/);
    const one = () => fetch(`http://127.0.0.1:${s.port}/v1/completions`, { method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: modelName, prompt, max_tokens: want.length, temperature: 0, ignore_eos: true,
        return_token_ids: true }) }).then(async (r) => ({ status: r.status, body: await r.json() }));
    for (const { status, body } of await Promise.all([one(), one(), one()])) {
      assert.equal(status, 200, JSON.stringify(body));
      assert.deepEqual(body.choices[0].token_ids, want);
    }
  } finally {
    s.proc.kill('SIGKILL');
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('a mixture of experts (GLM-4.5 shape) serves transformers\' greedy tokens, streamed and not', async () => {
  // The glm4_moe fixture (grouped sigmoid routing, shared experts) with a byte-level tokenizer
  // that fits its vocabulary, prompted with token ids.
  const dir = makeModelDir(SRC, 'atom-serve-moe-', 'tests/fixtures/models/glm4_moe', { byteTokenizer: true });
  const ref = path.join(SRC, 'tests/fixtures/references/glm4_moe.safetensors');
  const prompt = safetensorsInts(ref, 'greedy_prompt'), want = safetensorsInts(ref, 'greedy_tokens');
  const s = await startServer(dir, [], 'auto');
  try {
    const body = { model: modelName, prompt, max_tokens: want.length, temperature: 0, ignore_eos: true };
    const r = await fetch(`http://127.0.0.1:${s.port}/v1/completions`, { method: 'POST',
      headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ ...body, return_token_ids: true }) });
    const whole = await r.json();
    assert.equal(r.status, 200, JSON.stringify(whole));
    assert.deepEqual(whole.choices[0].token_ids, want);
    const c = new OpenAI({ baseURL: `http://127.0.0.1:${s.port}/v1`, apiKey: 'none', maxRetries: 0 });
    let streamed = '';
    for await (const chunk of await c.completions.create({ ...body, stream: true }))
      streamed += chunk.choices[0]?.text ?? '';
    assert.equal(streamed, whole.choices[0].text);
  } finally {
    s.proc.kill('SIGKILL');
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
