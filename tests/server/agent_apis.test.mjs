// The APIs coding agents speak, through their official npm clients: the OpenAI Responses API
// (`openai`'s responses.create / responses.stream, whose stream helper rebuilds the response from
// the events and throws on any event out of order) and the Anthropic Messages API
// (`@anthropic-ai/sdk`'s messages.create / messages.stream, which does the same).
//  - A scripted server (atom_fake_serve with the hermes tool parser and the qwen3 reasoning
//    parser) says given things: a reasoning block and a tool call, then an answer that can only
//    come when the tool's result (or the previous response) reached the prompt.
//  - `atom serve` on the demo model (trained weights, greedy): each API's text equals what
//    /v1/chat/completions answers for the same conversation, streamed equals whole, stop
//    sequences and max tokens end answers as each API reports them, and a forced tool call's
//    arguments validate against its schema (Ajv).
// Run by ctest: node --test tests/server/agent_apis.test.mjs (ATOM_BIN, ATOM_FAKE_SERVE, ATOM_SOURCE_DIR).
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { startServe } from './serve_util.mjs';

const SRC = process.env.ATOM_SOURCE_DIR;
const BIN = process.env.ATOM_BIN;
const require = createRequire(path.join(SRC, 'tests/node/package.json'));
const OpenAI = require('openai').default;
const Anthropic = require('@anthropic-ai/sdk').default;
const Ajv = require('ajv/dist/2020').default;

const weatherSchema = { type: 'object', properties: { city: { type: 'string', maxLength: 12 } }, required: ['city'],
  additionalProperties: false };
const CALL = '<think>The user wants the weather. Call get_weather.</think>' +
  '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';

describe('scripted answers (fake backend)', () => {
  let fake, dir, openai, anthropic;
  before(async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'atom-agent-apis-'));
    const replies = path.join(dir, 'replies.json');
    // The first reply whose key the prompt contains: keys that only a carried-over history or a
    // tool result puts into the prompt come first.
    fs.writeFileSync(replies, JSON.stringify({
      default: 'I do not know.',
      replies: [
        ['Sunny, 21 C', '<think>The tool says sunny.</think>It is sunny in Paris, 21 C.'],
        ['The code word is XYZZY-7.', 'You told me XYZZY-7.'],
        ['Say the code word', 'The code word is XYZZY-7.'],
        ['You are a pirate', 'Arr, matey.'],
        ['weather', CALL],
      ],
    }));
    fake = await startServe(process.env.ATOM_FAKE_SERVE,
      [replies, '--enable-auto-tool-choice', '--tool-call-parser', 'hermes', '--reasoning-parser', 'qwen3']);
    openai = new OpenAI({ baseURL: `http://127.0.0.1:${fake.port}/v1`, apiKey: 'unused', maxRetries: 0 });
    anthropic = new Anthropic({ baseURL: `http://127.0.0.1:${fake.port}`, apiKey: 'unused', maxRetries: 0 });
  });
  after(() => {
    if (fake) fake.proc.kill('SIGKILL');
    fs.rmSync(dir, { recursive: true, force: true });
  });

  const rtools = [{ type: 'function', name: 'get_weather', description: 'Current weather in a city',
    parameters: weatherSchema }];
  const atools = [{ name: 'get_weather', description: 'Current weather in a city', input_schema: weatherSchema }];

  function checkCallResponse(r) {
    assert.equal(r.object, 'response');
    assert.match(r.id, /^resp_[0-9a-f]{32}$/);
    assert.equal(r.status, 'completed');
    assert.deepEqual(r.output.map((o) => o.type), ['reasoning', 'function_call']);
    assert.equal(r.output[0].content[0].text, 'The user wants the weather. Call get_weather.');
    const call = r.output[1];
    assert.equal(call.name, 'get_weather');
    assert.deepEqual(JSON.parse(call.arguments), { city: 'Paris' });
    assert.match(call.call_id, /^call_[0-9a-f]{32}$/);
    assert.equal(call.status, 'completed');
    assert.ok(r.usage.input_tokens > 0 && r.usage.output_tokens === Buffer.byteLength(CALL));
    assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
    return call;
  }

  test('responses: a tool call, whole and streamed, then the tool loop', async () => {
    const input = 'What is the weather in Paris?';
    const whole = await openai.responses.create({ model: 'fake-model', input, tools: rtools });
    const call = checkCallResponse(whole);
    assert.equal(whole.output_text, '');

    const events = [];
    const stream = openai.responses.stream({ model: 'fake-model', input, tools: rtools });
    stream.on('event', (e) => events.push(e));
    const streamed = await stream.finalResponse();
    checkCallResponse(streamed);
    const types = events.map((e) => e.type);
    assert.deepEqual(types.slice(0, 2), ['response.created', 'response.in_progress']);
    assert.equal(types.at(-1), 'response.completed');
    assert.deepEqual(events.map((e) => e.sequence_number), events.map((_, i) => i));
    const args = events.filter((e) => e.type === 'response.function_call_arguments.delta').map((e) => e.delta).join('');
    assert.deepEqual(JSON.parse(args), { city: 'Paris' });
    assert.equal(types.filter((t) => t === 'response.output_item.added').length, 2);
    assert.equal(types.filter((t) => t === 'response.output_item.done').length, 2);
    const reasoning = events.filter((e) => e.type === 'response.reasoning_text.delta').map((e) => e.delta).join('');
    assert.equal(reasoning, 'The user wants the weather. Call get_weather.');

    // The client sends the call and its output back: the answer needs the output in the prompt.
    const next = await openai.responses.create({ model: 'fake-model', tools: rtools, input: [
      { role: 'user', content: input },
      { type: 'function_call', call_id: call.call_id, name: call.name, arguments: call.arguments },
      { type: 'function_call_output', call_id: call.call_id, output: 'Sunny, 21 C' },
    ] });
    assert.equal(next.output_text, 'It is sunny in Paris, 21 C.');
    assert.deepEqual(next.output.map((o) => o.type), ['reasoning', 'message']);
    assert.equal(next.output[1].status, 'completed');
  });

  test('responses: previous_response_id continues a stored conversation; retrieve and delete', async () => {
    const first = await openai.responses.create({ model: 'fake-model', input: 'Say the code word',
      instructions: 'Be brief.' });
    assert.equal(first.output_text, 'The code word is XYZZY-7.');
    assert.equal(first.instructions, 'Be brief.');
    // Without the history the default answer comes back; with it, the one keyed on the first answer.
    const alone = await openai.responses.create({ model: 'fake-model', input: 'What did you say?' });
    assert.equal(alone.output_text, 'I do not know.');
    const second = await openai.responses.create({ model: 'fake-model', input: 'What did you say?',
      previous_response_id: first.id });
    assert.equal(second.output_text, 'You told me XYZZY-7.');
    assert.equal(second.previous_response_id, first.id);
    // Streamed responses are stored too, and continue the same way.
    const s = await openai.responses.stream({ model: 'fake-model', input: 'Say the code word' }).finalResponse();
    const third = await openai.responses.create({ model: 'fake-model', input: '?', previous_response_id: s.id });
    assert.equal(third.output_text, 'You told me XYZZY-7.');

    const got = await openai.responses.retrieve(first.id);
    assert.equal(got.id, first.id);
    assert.deepEqual(got.output, first.output);
    await openai.responses.delete(first.id);
    await assert.rejects(openai.responses.retrieve(first.id), (e) => e.status === 404);
    await assert.rejects(openai.responses.create({ model: 'fake-model', input: 'x', previous_response_id: first.id }),
      (e) => e.status === 404 && e.param === 'previous_response_id');
    const unstored = await openai.responses.create({ model: 'fake-model', input: 'x', store: false });
    await assert.rejects(openai.responses.retrieve(unstored.id), (e) => e.status === 404);
  });

  test('responses: unsupported input items and tools are 400s naming them', async () => {
    await assert.rejects(openai.responses.create({ model: 'fake-model', input: [
      { role: 'user', content: [{ type: 'input_image', image_url: 'http://x/y.png' }] }] }),
    (e) => e.status === 400 && e.param === 'input' &&
      /input\[0\]\.content\[0\]: this model \(fake-model\) takes no images/.test(e.message));
    await assert.rejects(openai.responses.create({ model: 'fake-model', input: 'x', tools: [{ type: 'web_search' }] }),
      (e) => e.status === 400 && e.param === 'tools' && /web_search/.test(e.message));
    await assert.rejects(openai.responses.create({ model: 'fake-model', input: 'x', max_output_tokens: 0 }),
      (e) => e.status === 400 && e.param === 'max_output_tokens');
    await assert.rejects(openai.responses.create({ model: 'fake-model', input: 'x', background: true }),
      (e) => e.status === 400 && e.param === 'background');
  });

  function checkToolUse(m) {
    assert.equal(m.type, 'message');
    assert.match(m.id, /^msg_[0-9a-f]{32}$/);
    assert.equal(m.stop_reason, 'tool_use');
    assert.deepEqual(m.content.map((b) => b.type), ['thinking', 'tool_use']);
    assert.equal(m.content[0].thinking, 'The user wants the weather. Call get_weather.');
    assert.equal(m.content[1].name, 'get_weather');
    assert.deepEqual(m.content[1].input, { city: 'Paris' });
    assert.equal(m.usage.output_tokens, Buffer.byteLength(CALL));
    return m.content[1];
  }

  test('messages: a tool_use, whole and streamed, then the tool_result loop', async () => {
    const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
    const whole = await anthropic.messages.create({ model: 'fake-model', max_tokens: 512, messages, tools: atools });
    const use = checkToolUse(whole);

    const events = [];
    const stream = anthropic.messages.stream({ model: 'fake-model', max_tokens: 512, messages, tools: atools });
    stream.on('streamEvent', (e) => events.push(e.type));
    checkToolUse(await stream.finalMessage());
    assert.equal(events[0], 'message_start');
    assert.deepEqual(events.slice(-2), ['message_delta', 'message_stop']);
    assert.equal(events.filter((t) => t === 'content_block_start').length, 2);
    assert.equal(events.filter((t) => t === 'content_block_stop').length, 2);

    const next = await anthropic.messages.create({ model: 'fake-model', max_tokens: 512, tools: atools, messages: [
      ...messages,
      { role: 'assistant', content: [{ type: 'tool_use', id: use.id, name: use.name, input: use.input }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'Sunny, 21 C' }] },
    ] });
    assert.equal(next.stop_reason, 'end_turn');
    assert.deepEqual(next.content.map((b) => b.type), ['thinking', 'text']);
    assert.equal(next.content[1].text, 'It is sunny in Paris, 21 C.');
  });

  test('messages: system, streamed text, max_tokens, errors in Anthropic\'s envelope', async () => {
    const r = await anthropic.messages.create({ model: 'fake-model', max_tokens: 64, system: 'You are a pirate.',
      messages: [{ role: 'user', content: 'Hello' }] });
    assert.equal(r.content[0].text, 'Arr, matey.');
    let text = '';
    const st = anthropic.messages.stream({ model: 'fake-model', max_tokens: 64,
      system: [{ type: 'text', text: 'You are a pirate.' }], messages: [{ role: 'user', content: 'Hello' }] });
    st.on('text', (t) => { text += t; });
    const done = await st.finalMessage();
    assert.equal(text, 'Arr, matey.');
    assert.equal(done.stop_reason, 'end_turn');
    const cut = await anthropic.messages.create({ model: 'fake-model', max_tokens: 4, messages: [{ role: 'user', content: 'Hello' }] });
    assert.equal(cut.stop_reason, 'max_tokens');
    assert.equal(cut.content[0].text, 'I do');
    assert.equal(cut.usage.output_tokens, 4);

    await assert.rejects(anthropic.messages.create({ model: 'fake-model', messages: [{ role: 'user', content: 'x' }] }),
      (e) => e.status === 400 && e.error?.type === 'error' && e.error.error.type === 'invalid_request_error' &&
        /max_tokens/.test(e.error.error.message));
    await assert.rejects(anthropic.messages.create({ model: 'fake-model', max_tokens: 8, messages: [{ role: 'user',
      content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }] }),
    (e) => e.status === 400 &&
      /messages\[0\]\.content\[0\]: this model \(fake-model\) takes no images/.test(e.error.error.message));
    await assert.rejects(anthropic.messages.create({ model: 'nope', max_tokens: 8, messages: [{ role: 'user', content: 'x' }] }),
      (e) => e.status === 404 && e.error.error.type === 'not_found_error');
  });
});

describe('the demo model (trained weights, greedy)', () => {
  const MODEL = 'kjv-tiny';
  let server, openai, anthropic;
  before(async () => {
    server = await startServe(BIN, ['serve', path.join(SRC, 'models/kjv-tiny'), '--device', 'cpu', '--host', '127.0.0.1',
      '--port', '0', '--served-model-name', MODEL, '--enable-prefix-caching', '--enable-prompt-tokens-details']);
    openai = new OpenAI({ baseURL: `http://127.0.0.1:${server.port}/v1`, apiKey: 'none', maxRetries: 0 });
    anthropic = new Anthropic({ baseURL: `http://127.0.0.1:${server.port}`, apiKey: 'none', maxRetries: 0 });
  });
  after(() => {
    if (server) server.proc.kill('SIGKILL');
  });

  const system = 'Answer in the words of the King James Bible.';
  const question = 'Who made the heaven and the earth?';
  const chat = (extra = {}) => openai.chat.completions.create({ model: MODEL, temperature: 0, max_tokens: 40,
    messages: [{ role: 'system', content: system }, { role: 'user', content: question }], ...extra });

  test('each API answers what chat completions answers; streamed equals whole', async () => {
    const ref = await chat();
    const want = ref.choices[0].message.content;
    assert.ok(want.length > 10, 'the demo model writes an answer');

    const r = await openai.responses.create({ model: MODEL, temperature: 0, max_output_tokens: 40,
      instructions: system, input: question });
    assert.equal(r.output_text, want);
    assert.equal(r.usage.input_tokens, ref.usage.prompt_tokens);
    assert.equal(r.usage.output_tokens, ref.usage.completion_tokens);
    assert.equal(r.status, ref.choices[0].finish_reason === 'length' ? 'incomplete' : 'completed');
    // The same prompt again: served from the prefix cache, whole 16-token blocks short of its last token.
    const hit = Math.floor((ref.usage.prompt_tokens - 1) / 16) * 16;
    assert.ok(hit > 0);
    assert.equal(r.usage.input_tokens_details.cached_tokens, hit);
    // Chat completions report the same hit (vLLM's prompt_tokens_details, counted on the first
    // update and kept through the later ones).
    assert.equal(ref.usage.prompt_tokens_details.cached_tokens, 0);
    assert.equal((await chat()).usage.prompt_tokens_details.cached_tokens, hit);
    let deltas = '';
    const rs = openai.responses.stream({ model: MODEL, temperature: 0, max_output_tokens: 40, instructions: system,
      input: question });
    rs.on('response.output_text.delta', (e) => { deltas += e.delta; });
    const rsFinal = await rs.finalResponse();
    assert.equal(deltas, want);
    assert.equal(rsFinal.output_text, want);

    const m = await anthropic.messages.create({ model: MODEL, temperature: 0, max_tokens: 40, system,
      messages: [{ role: 'user', content: question }] });
    assert.equal(m.content[0].text, want);
    // Anthropic counts cached prompt tokens apart from input_tokens.
    assert.equal(m.usage.cache_read_input_tokens, hit);
    assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, ref.usage.prompt_tokens);
    assert.equal(m.usage.output_tokens, ref.usage.completion_tokens);
    assert.equal(m.stop_reason, ref.choices[0].finish_reason === 'length' ? 'max_tokens' : 'end_turn');
    let text = '';
    const ms = anthropic.messages.stream({ model: MODEL, temperature: 0, max_tokens: 40, system,
      messages: [{ role: 'user', content: question }] });
    ms.on('text', (t) => { text += t; });
    await ms.finalMessage();
    assert.equal(text, want);

    const counted = await anthropic.messages.countTokens({ model: MODEL, system,
      messages: [{ role: 'user', content: question }] });
    assert.equal(counted.input_tokens, ref.usage.prompt_tokens);
  });

  test('stop sequences and length limits end answers as each API reports them', async () => {
    const want = (await chat()).choices[0].message.content;
    const words = want.split(/\s+/).filter((w) => /^[a-z]{3,}$/.test(w));
    assert.ok(words.length >= 2, `the answer has words to stop at: ${want}`);
    const stop = words[1];
    const before = want.slice(0, want.indexOf(stop));
    const m = await anthropic.messages.create({ model: MODEL, temperature: 0, max_tokens: 40, system,
      stop_sequences: [stop], messages: [{ role: 'user', content: question }] });
    assert.equal(m.stop_reason, 'stop_sequence');
    assert.equal(m.stop_sequence, stop);
    assert.equal(m.content[0].text, before);

    const r = await openai.responses.create({ model: MODEL, temperature: 0, max_output_tokens: 3, instructions: system,
      input: question });
    assert.equal(r.status, 'incomplete');
    assert.deepEqual(r.incomplete_details, { reason: 'max_output_tokens' });
    assert.equal(r.usage.output_tokens, 3);
    assert.ok(want.startsWith(r.output_text) && r.output_text.length > 0);
  });

  test('a forced tool call validates against its schema through both APIs', async () => {
    const validate = new Ajv({ strict: false }).compile(weatherSchema);
    const r = await openai.responses.create({ model: MODEL, input: question, max_output_tokens: 100,
      tools: [{ type: 'function', name: 'get_weather', parameters: weatherSchema }],
      tool_choice: { type: 'function', name: 'get_weather' } });
    const calls = r.output.filter((o) => o.type === 'function_call');
    assert.equal(calls.length, 1);
    assert.equal(calls[0].name, 'get_weather');
    assert.ok(validate(JSON.parse(calls[0].arguments)), JSON.stringify(validate.errors) + calls[0].arguments);

    const m = await anthropic.messages.create({ model: MODEL, max_tokens: 100, messages: [{ role: 'user', content: question }],
      tools: [{ name: 'get_weather', input_schema: weatherSchema }], tool_choice: { type: 'tool', name: 'get_weather' } });
    const uses = m.content.filter((b) => b.type === 'tool_use');
    assert.equal(uses.length, 1);
    assert.equal(m.stop_reason, 'tool_use');
    assert.ok(validate(uses[0].input), JSON.stringify(validate.errors) + JSON.stringify(uses[0].input));
  });
});
