// `atom serve` on the embedded demo model (models/kjv-tiny, trained weights) through the official
// `openai` npm client, against what PyTorch and HF tokenizers produced for the same requests
// (tests/fixtures/references/kjv-tiny.json, recorded by tools/train_demo_model.py): chat
// completions that stop at EOS by themselves, a stop string met in natural text, streamed text
// equal to the non-streamed text, and logprobs equal to the recorded ones.
// Run by ctest: node --test tests/server/demo_model.test.mjs (ATOM_BIN and ATOM_SOURCE_DIR set).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { startServe } from './serve_util.mjs';

const SRC = process.env.ATOM_SOURCE_DIR;
const BIN = process.env.ATOM_BIN;
const require = createRequire(path.join(SRC, 'tests/node/package.json'));
const OpenAI = require('openai');
const REF = JSON.parse(fs.readFileSync(path.join(SRC, 'tests/fixtures/references/kjv-tiny.json'), 'utf8'));
const MODEL = 'kjv-tiny';
// Largest |atom - PyTorch| logprob through the server: measured 6.2e-6 over 440 (fp32 CPU against
// fp32 GPU; 5.9e-6 in tests/engine/demo_model_test); 1.2e-5 is about twice that.
const LOGPROB_TOL = 1.2e-5;
const MAX_TOKENS = 64;  // what the tool's greedy runs were capped at

let server, client;

before(async () => {
  server = await startServe(BIN, ['serve', path.join(SRC, 'models/kjv-tiny'), '--device', 'cpu', '--host', '127.0.0.1',
    '--port', '0', '--served-model-name', MODEL]);
  client = new OpenAI({ baseURL: `http://127.0.0.1:${server.port}/v1`, apiKey: 'none', maxRetries: 0 });
});

after(() => {
  if (server) server.proc.kill('SIGKILL');
});

// vLLM's rule: EOS ends a request with "stop" only before the length cap (checked first).
const stopsAtEos = (c) => [0, 2].includes(c.tokens.at(-1)) && c.tokens.length < MAX_TOKENS;
const stopping = REF.chat.filter(stopsAtEos);

async function streamedChat(body) {
  const stream = await client.chat.completions.create({ ...body, stream: true });
  let text = '', finish = null;
  for await (const chunk of stream) {
    if (!chunk.choices.length) continue;
    text += chunk.choices[0].delta.content ?? '';
    finish = chunk.choices[0].finish_reason ?? finish;
  }
  return { text, finish };
}

test('chat completions stop at EOS by themselves with PyTorch\'s text; streaming gives the same text', async () => {
  assert.ok(stopping.length >= 2, 'the references hold chat completions that stop at EOS');
  for (const c of stopping) {
    const body = { model: MODEL, messages: c.messages, max_tokens: MAX_TOKENS, temperature: 0 };
    const r = await client.chat.completions.create(body);
    assert.equal(r.choices[0].finish_reason, 'stop', JSON.stringify(c.messages));
    assert.equal(r.choices[0].message.content, c.text);
    assert.equal(r.usage.prompt_tokens, c.prompt_ids.length);
    assert.equal(r.usage.completion_tokens, c.tokens.length);  // the EOS token counts, as in vLLM
    const s = await streamedChat(body);
    assert.equal(s.text, r.choices[0].message.content);
    assert.equal(s.finish, 'stop');
  }
});

test('text completions end at EOS, and a stop string met in natural text ends them early', async () => {
  const withStop = REF.completions.filter((c) => stopsAtEos(c) && c.stop);
  assert.ok(withStop.length >= 2, 'the references hold completions with a stop string');
  for (const c of withStop) {
    const r = await client.completions.create({ model: MODEL, prompt: c.prompt, max_tokens: MAX_TOKENS, temperature: 0 });
    assert.equal(r.choices[0].text, c.text);
    assert.equal(r.choices[0].finish_reason, 'stop');
    const s = await client.completions.create({ model: MODEL, prompt: c.prompt, max_tokens: MAX_TOKENS, temperature: 0,
      stop: [c.stop] });
    assert.equal(s.choices[0].text, c.text_before_stop, `stop ${JSON.stringify(c.stop)}`);
    assert.equal(s.choices[0].finish_reason, 'stop');
    assert.equal(s.choices[0].stop_reason, c.stop);
    // Streamed, the text is the same and the stop string never leaks out.
    const stream = await client.completions.create({ model: MODEL, prompt: c.prompt, max_tokens: MAX_TOKENS, temperature: 0,
      stop: [c.stop], stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
    assert.equal(text, c.text_before_stop);
  }
});

function expectTopsNear(gotTop, wantTop, where) {
  // want: [[id, logprob, text], ...] in rank order; got: { text: logprob } or [{ token, logprob }]
  const got = Array.isArray(gotTop) ? Object.fromEntries(gotTop.map((t) => [t.token, t.logprob])) : gotTop;
  assert.equal(Object.keys(got).length, wantTop.length, where);
  let worst = 0;
  for (const [, lp, text] of wantTop) {
    assert.ok(text in got, `${where}: ${JSON.stringify(text)} missing from ${JSON.stringify(got)}`);
    worst = Math.max(worst, Math.abs(got[text] - lp));
  }
  assert.ok(worst <= LOGPROB_TOL, `${where}: max |logprob diff| ${worst}`);
  return worst;
}

test('logprobs equal PyTorch\'s: completions and chat, top 5 at every step', async () => {
  let worst = 0, compared = 0;
  for (const g of REF.greedy) {
    const steps = g.top_logprobs.length;
    const r = await client.completions.create({ model: MODEL, prompt: g.prompt, max_tokens: steps, temperature: 0,
      logprobs: 5, ignore_eos: true });
    const lp = r.choices[0].logprobs;
    assert.equal(lp.top_logprobs.length, steps);
    for (let s = 0; s < steps; ++s) {
      const want = g.top_logprobs[s];
      assert.equal(lp.tokens[s], want[0][2]);
      assert.ok(Math.abs(lp.token_logprobs[s] - want[0][1]) <= LOGPROB_TOL);
      worst = Math.max(worst, expectTopsNear(lp.top_logprobs[s], want, `${g.prompt} step ${s}`));
      compared += want.length;
    }
  }
  for (const c of stopping) {
    const steps = c.top_logprobs.length;
    const r = await client.chat.completions.create({ model: MODEL, messages: c.messages, max_tokens: steps,
      temperature: 0, logprobs: true, top_logprobs: 5 });
    const content = r.choices[0].logprobs.content;
    assert.equal(content.length, Math.min(steps, c.tokens.length));
    for (let s = 0; s < content.length; ++s) {
      assert.equal(content[s].token, c.top_logprobs[s][0][2]);
      worst = Math.max(worst, expectTopsNear(content[s].top_logprobs, c.top_logprobs[s], `chat step ${s}`));
      compared += c.top_logprobs[s].length;
    }
  }
  console.log(`logprobs: ${compared} compared, max |diff| ${worst.toExponential(2)}`);
  assert.ok(compared > 100);
});
