// `atom serve` against hostile clients (issue 22): a port already in use, bad Content-Lengths,
// hundreds of trickling sockets, an oversized chunked body, and the memory of rejected huge
// prompts. CPU backend, the tiny Qwen3 with dummy weights and Qwen3's real tokenizer.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import { spawn } from 'node:child_process';
import { makeModelDir, startServe } from './serve_util.mjs';

const SRC = process.env.ATOM_SOURCE_DIR;
const BIN = process.env.ATOM_BIN;
let server, base, dir;

const rssMiB = (pid) => Number(fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/)[1]) / 1024;

// Writes `bytes` on a fresh connection and resolves with everything the server sends back until it
// closes (or `ms` pass: then with what arrived, plus ' [TIMEOUT]').
function raw(bytes, ms = 15000) {
  return new Promise((resolve) => {
    const s = net.connect(server.port, '127.0.0.1');
    let got = '';
    const timer = setTimeout(() => { s.destroy(); resolve(got + ' [TIMEOUT]'); }, ms);
    s.on('data', (d) => { got += d.toString(); });
    s.on('error', () => {});
    s.on('close', () => { clearTimeout(timer); resolve(got); });
    s.write(bytes);
  });
}

before(async () => {
  dir = makeModelDir(SRC, 'atom-limits-');
  server = await startServe(BIN, ['serve', dir, '--device', 'cpu', '--load-format', 'dummy', '--host', '127.0.0.1',
    '--port', '0', '--max-model-len', '512', '--max-request-body-bytes', '8000000']);
  base = `http://127.0.0.1:${server.port}`;
});

after(() => {
  server.proc.kill('SIGKILL');
  fs.rmSync(dir, { recursive: true, force: true });
});

test('a second server on a port in use fails at start-up', async () => {
  const p = spawn(BIN, ['serve', dir, '--device', 'cpu', '--load-format', 'dummy', '--host', '127.0.0.1',
    '--port', String(server.port), '--max-model-len', '512'], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  p.stderr.on('data', (d) => { log += d.toString(); });
  const code = await new Promise((resolve) => p.on('exit', resolve));
  assert.notEqual(code, 0, log);
  assert.match(log, /in use/, log);
  assert.doesNotMatch(log, /serving /, log);
  assert.equal((await fetch(`${base}/health`)).status, 200);
});

test('bad Content-Lengths get an answer at once, not after a timeout', async () => {
  for (const [cl, want] of [['-1', 400], ['100000000000000000000', 413], ['1e9', 400], ['9000000', 413]]) {
    const reply = await raw(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ${cl}\r\n\r\n`, 10000);
    assert.ok(reply.startsWith(`HTTP/1.1 ${want}`), `${cl}: ${reply}`);
    assert.match(reply, /"error"/);
  }
});

test('a chunked body over the limit is refused without holding it', async () => {
  const before = rssMiB(server.proc.pid);
  const reply = await new Promise((resolve) => {
    const s = net.connect(server.port, '127.0.0.1');
    let got = '';
    s.on('data', (d) => { got += d.toString(); });
    s.on('error', () => {});
    s.on('close', () => resolve(got));
    s.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n');
    const chunk = '100000\r\n' + 'a'.repeat(0x100000) + '\r\n';  // 1 MiB chunks, 64 MiB in all
    let n = 0;
    const pump = () => {
      while (n < 64 && !s.destroyed) {
        ++n;
        if (!s.write(chunk)) { s.once('drain', pump); return; }
      }
    };
    pump();
  });
  assert.ok(reply.startsWith('HTTP/1.1 413'), reply.slice(0, 200));
  assert.ok(rssMiB(server.proc.pid) < before + 64, `RSS ${before} -> ${rssMiB(server.proc.pid)} MiB`);
});

test('520 trickling connections starve neither /health nor requests', async () => {
  const socks = [];
  for (let i = 0; i < 520; ++i) {
    const s = net.connect(server.port, '127.0.0.1');
    s.on('error', () => {});
    await new Promise((r) => s.on('connect', r));
    s.write(i % 2 ? 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le'
                  : 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"pro');
    socks.push(s);
  }
  try {
    for (let round = 0; round < 3; ++round) {
      for (const s of socks) s.write('x');
      const h = await fetch(`${base}/health`, { signal: AbortSignal.timeout(20000) });
      assert.equal(h.status, 200);
      const r = await fetch(`${base}/v1/completions`, { method: 'POST', signal: AbortSignal.timeout(20000),
        headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ prompt: 'hi', max_tokens: 2 }) });
      assert.equal(r.status, 200, await r.text());
    }
  } finally {
    for (const s of socks) s.destroy();
  }
});

test('rejected huge prompts do not grow the server memory', async () => {
  const post = (body) => fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify(body) });
  for (let i = 0; i < 5; ++i) assert.equal((await post({ prompt: 'warm up ' + i, max_tokens: 4 })).status, 200);
  const words = Array.from({ length: 4000 }, (_, i) => `w${i % 997}`).join(' ') + ' ';
  const huge = words.repeat(Math.ceil((3 << 20) / words.length)).slice(0, 3 << 20);  // 3 MiB, ~1.5M tokens
  // The first rejection may size caches that stay (the BPE word memo is bounded); the ones after
  // must not add to it. Before the fix each 3 MiB prompt added ~250 MiB, never returned.
  let r = await post({ prompt: huge, max_tokens: 4 });
  assert.equal(r.status, 400);
  const baseline = rssMiB(server.proc.pid);
  for (let i = 0; i < 4; ++i) {
    r = await post({ prompt: huge + i, max_tokens: 4 });
    assert.equal(r.status, 400);
    assert.match((await r.json()).error.message, /maximum context length is 512 tokens/);
  }
  const after = rssMiB(server.proc.pid);
  assert.ok(after < baseline + 64, `RSS grew from ${baseline.toFixed(0)} to ${after.toFixed(0)} MiB over 4 rejected prompts`);
  assert.equal((await fetch(`${base}/health`)).status, 200);
});
