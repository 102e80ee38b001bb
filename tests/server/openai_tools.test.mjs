// Tool calling through the official `openai` npm client against `atom serve --enable-auto-tool-choice
// --tool-call-parser hermes` on the CPU backend (a tiny Qwen3 with dummy weights and Qwen3's real
// tokenizer and chat template). Random weights write no tool calls, so the exact response shapes
// are checked by the fake-backend tests (http_protocol_test); here: the flags, the requests a
// client sends in a tool loop, well-formed answers, and tag text that is not a call staying content.
// Run by ctest: node --test tests/server/openai_tools.test.mjs (ATOM_BIN and ATOM_SOURCE_DIR set).
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { makeModelDir, startServe } from './serve_util.mjs';

const SRC = process.env.ATOM_SOURCE_DIR;
const BIN = process.env.ATOM_BIN;
const require = createRequire(path.join(SRC, 'tests/node/package.json'));
const OpenAI = require('openai');

const TOOL_CALL_TOKEN = 151657;  // '<tool_call>' in Qwen3's tokenizer (an added, non-special token)
const tools = [{
  type: 'function',
  function: {
    name: 'get_weather', description: 'Current weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
}];

let server, base, client, modelDir;
const model = 'tiny-qwen3';

function args(dir, extra) {
  return ['serve', dir, '--device', 'cpu', '--load-format', 'dummy', '--host', '127.0.0.1', '--port', '0',
    '--max-model-len', '1024', '--served-model-name', model, ...extra];
}

function startServer(dir, extra) {
  return startServe(BIN, args(dir, extra));
}

// Runs `atom serve` expecting it to refuse to start; resolves with its exit code and stderr.
function refusedStart(dir, extra) {
  return new Promise((resolve) => {
    const p = spawn(BIN, args(dir, extra), { stdio: ['ignore', 'ignore', 'pipe'] });
    let log = '';
    p.stderr.on('data', (d) => { log += d.toString(); });
    p.on('exit', (code) => resolve({ code, log }));
  });
}

before(async () => {
  modelDir = makeModelDir(SRC, 'atom-tools-');
  server = await startServer(modelDir, ['--enable-auto-tool-choice', '--tool-call-parser', 'hermes']);
  base = `http://127.0.0.1:${server.port}`;
  client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });
});

after(() => {
  if (server) server.proc.kill('SIGKILL');
  fs.rmSync(modelDir, { recursive: true, force: true });
});

test('the tool flags are checked at start-up as vLLM does', async () => {
  let r = await refusedStart(modelDir, ['--enable-auto-tool-choice']);
  assert.notEqual(r.code, 0);
  assert.match(r.log, /--enable-auto-tool-choice requires --tool-call-parser/);
  r = await refusedStart(modelDir, ['--enable-auto-tool-choice', '--tool-call-parser', 'nope']);
  assert.notEqual(r.code, 0);
  assert.match(r.log, /invalid tool call parser: nope \(choose from \{ hermes, llama3_json, deepseek_v3, deepseek_v31, qwen3_coder, glm45, kimi_k2, mistral, pythonic, openai \}\)/);
  r = await refusedStart(modelDir, ['--reasoning-parser', 'qwen']);
  assert.notEqual(r.code, 0);
  assert.match(r.log, /invalid reasoning parser: qwen \(choose from \{ deepseek_r1, deepseek_v3, glm45, kimi_k2, openai_gptoss, qwen3 \}\)/);
});

function checkToolCalls(calls) {
  assert.ok(Array.isArray(calls));
  for (const c of calls) {
    assert.match(c.id, /^chatcmpl-tool-[0-9a-f]+$/);
    assert.equal(c.type, 'function');
    assert.equal(typeof c.function.name, 'string');
    JSON.parse(c.function.arguments);
  }
}

test('tool_choice auto: a well-formed answer, streamed and not, with the tools in the prompt', async () => {
  const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const r = await client.chat.completions.create({ model, messages, tools, tool_choice: 'auto', max_tokens: 16,
    temperature: 0 });
  const m = r.choices[0].message;
  assert.equal(m.role, 'assistant');
  checkToolCalls(m.tool_calls);
  assert.ok(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason));
  assert.equal(r.choices[0].finish_reason === 'tool_calls', m.tool_calls.length > 0);
  // The template rendered the tools: the prompt is longer than without them.
  const plain = await client.chat.completions.create({ model, messages, max_tokens: 1 });
  assert.ok(r.usage.prompt_tokens > plain.usage.prompt_tokens + 20, `${r.usage.prompt_tokens} vs ${plain.usage.prompt_tokens}`);

  const stream = await client.chat.completions.create({ model, messages, tools, max_tokens: 16, temperature: 0,
    stream: true });
  let content = '', finish = null;
  const calls = [];
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta ?? {};
    content += d.content ?? '';
    for (const tc of d.tool_calls ?? []) {
      calls[tc.index] ??= { id: tc.id, type: tc.type, function: { name: tc.function?.name, arguments: '' } };
      calls[tc.index].function.arguments += tc.function?.arguments ?? '';
    }
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(content, m.content ?? '');
  assert.equal(finish, r.choices[0].finish_reason);
  assert.deepEqual(calls.map((c) => [c.function.name, c.function.arguments]),
    m.tool_calls.map((c) => [c.function.name, c.function.arguments]));
});

test('tag text that is not a complete call stays content, streamed and not', async () => {
  // logit_bias makes the model write '<tool_call>' over and over: a call that never closes.
  const body = { model, messages: [{ role: 'user', content: 'hi' }], tools, max_tokens: 3,
    logit_bias: { [TOOL_CALL_TOKEN]: 100 } };
  const r = await client.chat.completions.create(body);
  assert.equal(r.choices[0].message.content, '<tool_call>'.repeat(3));
  assert.deepEqual(r.choices[0].message.tool_calls, []);
  assert.equal(r.choices[0].finish_reason, 'length');
  const stream = await client.chat.completions.create({ ...body, stream: true });
  let content = '', finish = null, sawCalls = false;
  for await (const chunk of stream) {
    content += chunk.choices[0]?.delta?.content ?? '';
    sawCalls ||= Boolean(chunk.choices[0]?.delta?.tool_calls);
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(content, '<tool_call>'.repeat(3));
  assert.equal(sawCalls, false);
  assert.equal(finish, 'length');
});

test('a tool loop\'s second turn (assistant tool_calls, tool result) is served', async () => {
  const messages = [
    { role: 'user', content: 'What is the weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'chatcmpl-tool-1', type: 'function',
      function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
    { role: 'tool', tool_call_id: 'chatcmpl-tool-1', content: '{"temperature_c": 21}' },
  ];
  const r = await client.chat.completions.create({ model, messages, tools, max_tokens: 8, temperature: 0 });
  assert.equal(r.choices[0].message.role, 'assistant');
  checkToolCalls(r.choices[0].message.tool_calls);
});

test('tool_choice none and required behave as vLLM', async () => {
  const messages = [{ role: 'user', content: 'hi' }];
  const body = { model, messages, tools, max_tokens: 2, logit_bias: { [TOOL_CALL_TOKEN]: 100 } };
  const r = await client.chat.completions.create({ ...body, tool_choice: 'none' });
  assert.equal(r.choices[0].message.content, '<tool_call><tool_call>');
  // "required" constrains decoding to the calls' JSON: the bias toward <tool_call> cannot win, and
  // two tokens are only the start of the list (cut off by length, so it stays content).
  const req = await client.chat.completions.create({ ...body, tool_choice: 'required' });
  assert.equal(req.choices[0].finish_reason, 'length');
  assert.doesNotMatch(req.choices[0].message.content, /tool_call/);
  assert.match(req.choices[0].message.content, /^\[/);
});

// A gpt-oss tool loop end to end: atom's server over the fake backend (tests/server/fake_serve.cpp)
// answering in the harmony format, as gpt-oss writes it (its <|call|> and <|return|> stop tokens
// left out, as the engine leaves them out). As vLLM, a harmony model needs no tool flags; calls
// come back with vLLM's shapes: json.dumps(...) arguments when not streamed, the model's text
// streamed.
describe('gpt-oss (harmony) tool calls through the fake server', () => {
  let fake, fakeClient, dir;
  const harmonyCall = '<|channel|>analysis<|message|>The user wants the weather in Paris. Use get_weather.' +
    '<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json' +
    '<|message|>{"city":"Paris"}';
  const harmonyFinal = '<|channel|>analysis<|message|>The tool says 21 C.<|end|><|start|>assistant' +
    '<|channel|>final<|message|>It is 21 °C in Paris.';

  before(async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'atom-harmony-'));
    const replies = path.join(dir, 'replies.json');
    // The second turn's prompt holds the tool's result.
    fs.writeFileSync(replies, JSON.stringify({ default: harmonyCall, replies: [['temperature_c', harmonyFinal]] }));
    fake = await startServe(process.env.ATOM_FAKE_SERVE, [replies, '--harmony']);
    fakeClient = new OpenAI({ baseURL: `http://127.0.0.1:${fake.port}/v1`, apiKey: 'unused', maxRetries: 0 });
  });
  after(() => {
    if (fake) fake.proc.kill('SIGKILL');
    fs.rmSync(dir, { recursive: true, force: true });
  });

  const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];

  test('not streamed: the call, the analysis as reasoning, no content', async () => {
    const r = await fakeClient.chat.completions.create({ model: 'fake-model', messages, tools });
    const m = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    assert.equal(m.content, null);
    assert.equal(m.reasoning_content, 'The user wants the weather in Paris. Use get_weather.');
    assert.equal(m.tool_calls.length, 1);
    checkToolCalls(m.tool_calls);
    assert.equal(m.tool_calls[0].function.name, 'get_weather');
    assert.equal(m.tool_calls[0].function.arguments, '{"city": "Paris"}');
  });

  test('streamed: the client assembles the same call', async () => {
    const stream = fakeClient.chat.completions.stream({ model: 'fake-model', messages, tools });
    let reasoning = '';
    stream.on('chunk', (chunk) => { reasoning += chunk.choices[0]?.delta?.reasoning_content ?? ''; });
    const done = await stream.finalChatCompletion();
    const m = done.choices[0].message;
    assert.equal(done.choices[0].finish_reason, 'tool_calls');
    assert.equal(reasoning, 'The user wants the weather in Paris. Use get_weather.');
    assert.equal(m.tool_calls.length, 1);
    assert.match(m.tool_calls[0].id, /^chatcmpl-tool-[0-9a-f]+$/);
    assert.equal(m.tool_calls[0].function.name, 'get_weather');
    assert.deepEqual(JSON.parse(m.tool_calls[0].function.arguments), { city: 'Paris' });
    assert.ok(!m.content);
  });

  test('the client\'s tool runner completes the loop', async () => {
    const seen = [];
    const runner = fakeClient.chat.completions.runTools({
      model: 'fake-model', messages, stream: true,
      tools: [{
        type: 'function',
        function: {
          name: 'get_weather', description: 'Current weather in a city', parse: JSON.parse,
          parameters: tools[0].function.parameters,
          function: async (args) => { seen.push(args); return { temperature_c: 21 }; },
        },
      }],
    });
    const content = await runner.finalContent();
    assert.deepEqual(seen, [{ city: 'Paris' }]);
    assert.equal(content, 'It is 21 °C in Paris.');
  });
});
