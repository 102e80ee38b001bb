// Structured output through `atom serve` with random weights: every answer must parse and
// validate. JSON answers are checked by Ajv (an independent JSON Schema validator) against a
// corpus of real-world-shaped schemas; regex answers by JavaScript's RegExp; choices by
// membership; tool_choice "required" and a named function through the official openai client.
// The model is the tiny Qwen3 with a byte vocabulary (serve_util's makeByteModelDir), so text is
// written byte by byte and random weights finish strings and objects in reasonable lengths.
// Run by ctest: node --test tests/server/structured_output.test.mjs (ATOM_BIN, ATOM_SOURCE_DIR).
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import { makeByteModelDir, makeModelDir, startServe } from './serve_util.mjs';

const SRC = process.env.ATOM_SOURCE_DIR;
const BIN = process.env.ATOM_BIN;
const require = createRequire(`${SRC}/tests/node/package.json`);
const Ajv = require('ajv/dist/2020').default;
const addFormats = require('ajv-formats');
const OpenAI = require('openai').default;

let server, base, dir, client;
before(async () => {
  dir = makeByteModelDir(SRC, 'atom-structured-');
  server = await startServe(BIN, ['serve', dir, '--device', 'cpu', '--load-format', 'dummy', '--host', '127.0.0.1',
    '--port', '0', '--max-model-len', '4096', '--served-model-name', 'm']);
  base = `http://127.0.0.1:${server.port}`;
  client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0 });
});
after(() => {
  if (server) server.proc.kill('SIGKILL');
  fs.rmSync(dir, { recursive: true, force: true });
});

async function post(route, body) {
  const r = await fetch(`${base}${route}`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'm', ...body }) });
  return { status: r.status, json: await r.json() };
}

// Schemas shaped like the ones applications send (function parameters, extraction, records).
const corpus = [
  { name: 'weather', schema: { type: 'object', properties: { location: { type: 'string', maxLength: 24 },
    unit: { type: 'string', enum: ['celsius', 'fahrenheit'] }, days: { type: 'integer' } },
  required: ['location', 'unit'], additionalProperties: false } },
  { name: 'person', schema: { type: 'object', properties: { name: { type: 'string', maxLength: 20 },
    age: { type: 'integer' }, email: { type: 'string', format: 'email' },
    tags: { type: 'array', items: { type: 'string', maxLength: 8 }, maxItems: 4 } },
  required: ['name', 'age', 'tags'] } },
  { name: 'sentiment', schema: { type: 'object', properties: {
    label: { enum: ['positive', 'negative', 'neutral'] }, score: { type: 'number' } }, required: ['label', 'score'] } },
  { name: 'event', schema: { type: 'object', properties: { title: { type: 'string', maxLength: 30 },
    date: { type: 'string', format: 'date' }, attendees: { type: 'array', minItems: 1, maxItems: 3,
      items: { type: 'object', properties: { id: { type: 'integer' }, rsvp: { type: 'boolean' } }, required: ['id', 'rsvp'] } } },
  required: ['title', 'date', 'attendees'] } },
  { name: 'product', schema: { type: 'object', properties: { sku: { type: 'string', pattern: '^[A-Z]{3}-[0-9]{4}$' },
    price: { type: 'number' }, currency: { const: 'EUR' }, discontinued: { type: ['boolean', 'null'] } },
  required: ['sku', 'price', 'currency', 'discontinued'] } },
  { name: 'tree', schema: { $defs: { node: { type: 'object', properties: { v: { type: 'integer' },
    kids: { type: 'array', maxItems: 1, items: { $ref: '#/$defs/node' } } }, required: ['v', 'kids'] } },
  $ref: '#/$defs/node' } },
  { name: 'shape', schema: { anyOf: [
    { type: 'object', properties: { kind: { const: 'circle' }, r: { type: 'number' } }, required: ['kind', 'r'] },
    { type: 'object', properties: { kind: { const: 'rect' }, w: { type: 'integer' }, h: { type: 'integer' } }, required: ['kind', 'w', 'h'] }] } },
  { name: 'map', schema: { type: 'object', additionalProperties: { type: 'integer' }, maxProperties: 50 } },
];

test('json_schema answers parse and validate, completions and chat, over a schema corpus', async () => {
  const ajv = new Ajv({ strict: false });
  addFormats(ajv);
  let seed = 0;
  for (const { name, schema } of corpus) {
    const validate = ajv.compile(schema);
    // Random weights may run a string past max_tokens ("length": a prefix, not checked); most
    // answers must finish, and every finished one must validate.
    let finished = 0;
    for (const route of ['/v1/completions', '/v1/chat/completions']) {
      for (let k = 0; k < 3; ++k) {
        const body = { max_tokens: 2500, temperature: 1.0, seed: seed++,
          response_format: { type: 'json_schema', json_schema: { name, schema } } };
        if (route === '/v1/completions') body.prompt = 'Answer in JSON: ';
        else body.messages = [{ role: 'user', content: 'Answer in JSON.' }];
        const r = await post(route, body);
        assert.equal(r.status, 200, JSON.stringify(r.json));
        const c = r.json.choices[0];
        const text = route === '/v1/completions' ? c.text : c.message.content;
        assert.ok(['stop', 'length'].includes(c.finish_reason), c.finish_reason);
        if (c.finish_reason === 'length') continue;
        ++finished;
        let doc;
        assert.doesNotThrow(() => { doc = JSON.parse(text); }, `${name}: not JSON: ${text}`);
        assert.ok(validate(doc), `${name}: ${text}\n${JSON.stringify(validate.errors)}`);
      }
    }
    assert.ok(finished >= 4, `${name}: only ${finished} of 6 answers finished within max_tokens`);
  }
});

test('json_object, guided_json, structured_outputs and streaming give JSON', async () => {
  const r1 = await post('/v1/completions', { prompt: '{', max_tokens: 1500, seed: 1, response_format: { type: 'json_object' } });
  assert.equal(r1.status, 200);
  const o = JSON.parse(r1.json.choices[0].text);
  assert.equal(typeof o, 'object');
  assert.ok(!Array.isArray(o) && o !== null);
  const schema = corpus[0].schema;
  const ajv = new Ajv({ strict: false });
  const validate = ajv.compile(schema);
  for (const extra of [{ guided_json: schema }, { guided_json: JSON.stringify(schema) }, { structured_outputs: { json: schema } }]) {
    const r = await post('/v1/completions', { prompt: 'x', max_tokens: 1500, seed: 2, ...extra });
    assert.equal(r.status, 200, JSON.stringify(r.json));
    assert.ok(validate(JSON.parse(r.json.choices[0].text)), r.json.choices[0].text);
  }
  // Streamed: the concatenated deltas are the same document as the whole answer.
  const body = { prompt: 'x', max_tokens: 1500, seed: 3, guided_json: schema };
  const whole = (await post('/v1/completions', body)).json.choices[0].text;
  let streamed = '';
  for await (const chunk of await client.completions.create({ model: 'm', ...body, stream: true }))
    streamed += chunk.choices[0]?.text ?? '';
  assert.equal(streamed, whole);
  assert.ok(validate(JSON.parse(streamed)));
});

test('guided_regex, guided_choice and guided_grammar', async () => {
  const patterns = ['[a-z]{3,8}@example\\.(com|org)', '\\d{3}-\\d{2}-\\d{4}', '(yes|no)( because [a-z ]{1,20})?'];
  for (const p of patterns) {
    for (let seed = 0; seed < 4; ++seed) {
      const r = await post('/v1/completions', { prompt: 'x', max_tokens: 200, seed, guided_regex: p });
      assert.equal(r.status, 200, JSON.stringify(r.json));
      assert.match(r.json.choices[0].text, new RegExp(`^(?:${p})$`));
      assert.equal(r.json.choices[0].finish_reason, 'stop');
    }
  }
  const choices = ['Paris', 'London', 'Tokyo', 'New York'];
  const seen = new Set();
  for (let seed = 0; seed < 12; ++seed) {
    const r = await post('/v1/chat/completions', { messages: [{ role: 'user', content: 'Capital?' }], seed, guided_choice: choices });
    assert.ok(choices.includes(r.json.choices[0].message.content), r.json.choices[0].message.content);
    seen.add(r.json.choices[0].message.content);
  }
  assert.ok(seen.size >= 2, 'sampled choices vary');
  const grammar = 'root ::= expr\nexpr ::= term ( [+*] term ){0,4}\nterm ::= [1-9] | "(" expr ")"\n';
  for (let seed = 0; seed < 4; ++seed) {
    const r = await post('/v1/completions', { prompt: 'x', max_tokens: 300, seed, structured_outputs: { grammar } });
    assert.equal(r.status, 200, JSON.stringify(r.json));
    const t = r.json.choices[0].text;
    assert.match(t, /^[0-9+*()]+$/);
    // Balanced parentheses and a valid arithmetic expression: JavaScript evaluates it.
    assert.doesNotThrow(() => Function(`"use strict"; return (${t});`)(), t);
  }
});

test('tool_choice required and a named function produce calls matching the tool schemas', async () => {
  const tools = [
    { type: 'function', function: { name: 'get_weather', parameters: corpus[0].schema } },
    { type: 'function', function: { name: 'set_alarm', parameters: { type: 'object',
      properties: { hour: { type: 'integer' }, label: { type: 'string', maxLength: 12 } }, required: ['hour'] } } },
  ];
  const ajv = new Ajv({ strict: false });
  const byName = Object.fromEntries(tools.map((t) => [t.function.name, ajv.compile(t.function.parameters)]));
  for (let seed = 0; seed < 3; ++seed) {
    const named = await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'alarm' }],
      tools, tool_choice: { type: 'function', function: { name: 'set_alarm' } }, max_tokens: 1500, seed });
    const call = named.choices[0].message.tool_calls[0];
    assert.equal(call.function.name, 'set_alarm');
    assert.ok(byName.set_alarm(JSON.parse(call.function.arguments)), call.function.arguments);
    assert.equal(named.choices[0].finish_reason, 'stop');

    const req = await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'do it' }],
      tools, tool_choice: 'required', max_tokens: 3000, seed });
    const calls = req.choices[0].message.tool_calls;
    assert.ok(calls.length >= 1);
    assert.equal(req.choices[0].finish_reason, 'tool_calls');
    for (const c of calls) {
      assert.ok(c.function.name in byName, c.function.name);
      assert.ok(byName[c.function.name](JSON.parse(c.function.arguments)), c.function.arguments);
      assert.match(c.id, /^chatcmpl-tool-/);
    }
  }
  // Streamed named call: the argument pieces join into the same arguments.
  const body = { model: 'm', messages: [{ role: 'user', content: 'alarm' }], tools, max_tokens: 1500, seed: 9,
    tool_choice: { type: 'function', function: { name: 'set_alarm' } } };
  const whole = (await client.chat.completions.create(body)).choices[0].message.tool_calls[0].function.arguments;
  let args = '', name = '';
  for await (const chunk of await client.chat.completions.create({ ...body, stream: true })) {
    const tc = chunk.choices[0]?.delta?.tool_calls?.[0];
    if (tc?.function?.name) name = tc.function.name;
    if (tc?.function?.arguments) args += tc.function.arguments;
  }
  assert.equal(name, 'set_alarm');
  assert.equal(args, whole);
});

test('structural_tag: every tagged block holds JSON matching its schema, between free text', async () => {
  // Trigger "<" (byte 60) is made the likeliest token, so tagged blocks follow one another.
  const schema = corpus[0].schema;
  const validate = new Ajv({ strict: false }).compile(schema);
  const tag = { type: 'structural_tag', triggers: ['<'],
    structures: [{ begin: '<tool>', schema, end: '</tool>' }] };
  const forms = [{ response_format: tag }, { structured_outputs: { structural_tag: JSON.stringify(tag) } }];
  for (const [k, extra] of forms.entries()) {
    const r = await post('/v1/completions', { prompt: 'x', max_tokens: 400, seed: 10 + k, logit_bias: { 60: 30 }, ...extra });
    assert.equal(r.status, 200, JSON.stringify(r.json));
    const text = r.json.choices[0].text;
    // Split at each "<tool>": every complete block's JSON validates; the text outside holds no "<".
    const blocks = text.split('<tool>');
    assert.ok(!blocks[0].includes('<'), text);
    assert.ok(blocks.length >= 3, `several tagged blocks: ${text}`);
    let complete = 0;
    for (const b of blocks.slice(1)) {
      const end = b.indexOf('</tool>');
      if (end < 0) continue;  // cut by max_tokens
      assert.ok(validate(JSON.parse(b.slice(0, end))), b.slice(0, end));
      assert.ok(!b.slice(end + '</tool>'.length).includes('<'), b);
      ++complete;
    }
    assert.ok(complete >= 2, text);
  }
  const bad = await post('/v1/completions', { prompt: 'x', max_tokens: 4,
    structured_outputs: { structural_tag: JSON.stringify({ triggers: ['<f'], structures: [{ begin: '<g>', end: '</g>' }] }) } });
  assert.equal(bad.status, 400);
  assert.equal(bad.json.error.param, 'structured_outputs');
  assert.match(bad.json.error.message, /structures\[0\]\.begin/);
});

test('bad structured-output requests are 400s naming the field', async () => {
  const cases = [
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'strang' } } } }, 'response_format', /unknown type 'strang'/],
    [{ guided_regex: '(a' }, 'guided_regex', /regex/],
    [{ guided_regex: '(a)\\1' }, 'guided_regex', /backreference/],
    [{ guided_grammar: 'root ::= root "a"' }, 'guided_grammar', /left-recursive/],
    [{ guided_choice: [] }, 'guided_choice', /non-empty list/],
    [{ guided_json: { type: 'object' }, guided_regex: 'a' }, 'guided_regex', /only one kind of structured output/],
    [{ response_format: { type: 'xml' } }, 'response_format', /unknown response_format type 'xml'/],
  ];
  for (const [extra, param, re] of cases) {
    const r = await post('/v1/completions', { prompt: 'x', max_tokens: 5, ...extra });
    assert.equal(r.status, 400, JSON.stringify(extra));
    assert.equal(r.json.error.param, param, JSON.stringify(r.json));
    assert.match(r.json.error.message, re);
  }
  // The server still serves.
  const ok = await post('/v1/completions', { prompt: 'x', max_tokens: 3, guided_choice: ['a', 'b'] });
  assert.equal(ok.status, 200);
});

// Reasoning models (--reasoning-parser): the reasoning block is free and the grammar applies after
// it, as vLLM's. Qwen3's tokenizer (<think> 151667, </think> 151668) on dummy weights; logit_bias
// makes the tags the likeliest tokens, so where the grammar allows a tag it is drawn.
describe('structured output after reasoning', () => {
  const THINK = 151667, END = 151668;
  let rserver, rdir, rbase;
  before(async () => {
    rdir = makeModelDir(SRC, 'atom-structured-reasoning-');
    rserver = await startServe(BIN, ['serve', rdir, '--device', 'cpu', '--load-format', 'dummy', '--host', '127.0.0.1',
      '--port', '0', '--max-model-len', '1024', '--served-model-name', 'r', '--reasoning-parser', 'qwen3']);
    rbase = `http://127.0.0.1:${rserver.port}`;
  });
  after(() => {
    if (rserver) rserver.proc.kill('SIGKILL');
    fs.rmSync(rdir, { recursive: true, force: true });
  });
  const ask = async (body) => {
    const r = await fetch(`${rbase}/v1/chat/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: 'r', messages: [{ role: 'user', content: 'Give me JSON.' }], temperature: 0,
        return_token_ids: true, response_format: { type: 'json_object' }, ...body }) });
    const j = await r.json();
    assert.equal(r.status, 200, JSON.stringify(j));
    return j.choices[0];
  };

  test('a prompt that opened the block: the end tag may come first, then JSON', async () => {
    // The request's template opens the block, as thinking templates do.
    const c = await ask({ chat_template: "{% for m in messages %}{{ m['content'] }}{% endfor %}<think>\n",
      logit_bias: { [END]: 100 }, max_tokens: 200 });
    assert.equal(c.token_ids[0], END, 'the end tag is drawn while reasoning is free');
    assert.ok(!c.token_ids.slice(1).includes(END), 'after the block the grammar masks the tag');
    assert.equal(typeof JSON.parse(c.message.content), 'object', c.message.content);
    assert.equal(c.message.reasoning_content, null);
  });

  test('an output may open the block itself; inside it the grammar does not apply', async () => {
    const c = await ask({ logit_bias: { [THINK]: 100 }, max_tokens: 8 });
    assert.equal(c.token_ids[0], THINK);
    assert.ok(c.token_ids.every((t) => t === THINK), 'free inside the block: the biased tag every step');
    assert.equal(c.finish_reason, 'length');
    // Without a reasoning parser the grammar applies from the first token: no tag at all.
    const r = await fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'x' }], return_token_ids: true,
        response_format: { type: 'json_object' }, max_tokens: 40, temperature: 0 }) });
    const j = await r.json();
    assert.equal(typeof JSON.parse(j.choices[0].message.content), 'object');
  });

  // Thinking off (Qwen3's template closes the block in the prompt: <think>\n\n</think>\n\n), or a
  // template that closes it itself: the answer is the content, constrained from its first token
  // (vLLM's reasoning end found in the prompt). The gate used to let <think> through first, and
  // the answer ran unconstrained into reasoning_content.
  for (const [what, body] of [
    ['enable_thinking false', { chat_template_kwargs: { enable_thinking: false } }],
    ['a template that closes the block', {
      chat_template: "{% for m in messages %}{{ m['content'] }}{% endfor %}<think>\n\n</think>\n\n" }],
  ]) {
    test(`${what}: the grammar applies from the first token`, async () => {
      const c = await ask({ ...body, logit_bias: { [THINK]: 100, [END]: 100 }, max_tokens: 200 });
      assert.ok(!c.token_ids.includes(THINK) && !c.token_ids.includes(END), `no tag: ${c.token_ids.slice(0, 8)}`);
      assert.equal(typeof JSON.parse(c.message.content), 'object', c.message.content);
      assert.equal(c.message.reasoning_content, null);
    });
  }

  // Without --reasoning-parser atom splits <think> blocks by the chat template (vLLM does not);
  // --reasoning-parser none turns that off: the tag stays in the content.
  test('--reasoning-parser none: no split', async () => {
    const noneServer = await startServe(BIN, ['serve', rdir, '--device', 'cpu', '--load-format', 'dummy',
      '--host', '127.0.0.1', '--port', '0', '--max-model-len', '1024', '--served-model-name', 'r',
      '--reasoning-parser', 'none']);
    try {
      const body = { model: 'r', messages: [{ role: 'user', content: 'x' }], temperature: 0, max_tokens: 3,
        logit_bias: { [THINK]: 100 } };
      const at = async (b) => (await (await fetch(`${b}/v1/chat/completions`, { method: 'POST',
        headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) })).json()).choices[0].message;
      const split = await at(rbase);  // --reasoning-parser qwen3: the block is reasoning
      assert.ok(!split.content, JSON.stringify(split));
      const kept = await at(`http://127.0.0.1:${noneServer.port}`);
      assert.equal(kept.reasoning_content ?? null, null);
      assert.equal(kept.content, '<think><think><think>');
    } finally {
      noneServer.proc.kill('SIGKILL');
    }
  });
});
