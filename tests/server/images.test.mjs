// Images in chat requests through `atom serve` and the official `openai` npm client (issue 38
// item 3): Kimi-K2.5's tiny fixture (tests/fixtures/models/kimi_k25: a MoonViT tower, vocabulary
// 512, image_token_id 500) with a byte-level tokenizer whose id 500 is `<|media_pad|>` and a chat
// template that renders image parts as Kimi-K2.5's does; and a text-only model refusing images.
// Run by ctest: node --test tests/server/images.test.mjs (ATOM_BIN and ATOM_SOURCE_DIR set).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { makeByteModelDir, startServe } from './serve_util.mjs';

const SRC = process.env.ATOM_SOURCE_DIR;
const BIN = process.env.ATOM_BIN;
const require = createRequire(path.join(SRC, 'tests/node/package.json'));
const OpenAI = require('openai');

const FIXTURE = path.join(SRC, 'tests/fixtures/models/kimi_k25');
const HAVE_FIXTURE = fs.existsSync(path.join(FIXTURE, 'config.json'));
const SKIP = HAVE_FIXTURE ? false
  : 'tests/fixtures/models/kimi_k25 is missing (the tiny Kimi-K2.5 fixture with a vision tower, ' +
    'tools/make_vision_fixture.py): the end-to-end image tests need it';

const image = (name) => fs.readFileSync(path.join(SRC, 'tests/fixtures/images', name));
const dataUrl = (name, type) => `data:${type};base64,${image(name).toString('base64')}`;

// Special tokens of the tokenizer written beside the fixture (ids 256.. are specials).
const SPECIALS = { 500: '<|media_pad|>', 501: '<|media_begin|>', 502: '<|media_content|>', 503: '<|media_end|>',
  504: '<|im_user|>', 505: '<|im_assistant|>', 506: '<|im_middle|>', 507: '<|im_end|>', 508: '<|im_system|>' };

// Kimi-K2.5's chat template's content rendering (moonshotai/Kimi-K2.5 chat_template.jinja,
// render_content): string content as is, a list of parts with image / image_url parts as the
// media placeholder.
const TEMPLATE = `{%- for message in messages -%}
{%- if message['role'] == 'user' -%}<|im_user|>user<|im_middle|>
{%- elif message['role'] == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>
{%- else -%}<|im_system|>{{ message['role'] }}<|im_middle|>{%- endif -%}
{%- if message['content'] is string -%}{{ message['content'] }}
{%- elif message['content'] is not none -%}{%- for content in message['content'] -%}
{%- if content['type'] == 'image' or content['type'] == 'image_url' -%}<|media_begin|>image<|media_content|><|media_pad|><|media_end|>
{%- else -%}{{ content['text'] }}{%- endif -%}{%- endfor -%}{%- endif -%}<|im_end|>
{%- endfor -%}
{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}`;

// The fixture's files and a byte-level BPE of `vocab` ids: the 256 bytes, then special tokens.
function kimiModelDir(vocab) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'atom-images-'));
  for (const f of fs.readdirSync(FIXTURE)) {
    if (f.startsWith('tokenizer') || !fs.statSync(path.join(FIXTURE, f)).isFile()) continue;
    fs.copyFileSync(path.join(FIXTURE, f), path.join(dir, f));
  }
  const v = {};
  let extra = 0;
  for (let b = 0; b < 256; ++b) {
    const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    v[String.fromCodePoint(printable ? b : 256 + extra++)] = b;
  }
  const added = [];
  for (let id = 256; id < vocab; ++id)
    added.push({ id, content: SPECIALS[id] ?? `<|s${id}|>`, single_word: false, lstrip: false, rstrip: false,
      normalized: false, special: true });
  const tj = { version: '1.0', truncation: null, padding: null, added_tokens: added, normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: null, decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab: v, merges: [] } };
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tj));
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify({ eos_token: '<|im_end|>', chat_template: TEMPLATE }));
  return dir;
}

function fixtureConfig() {
  const c = JSON.parse(fs.readFileSync(path.join(FIXTURE, 'config.json'), 'utf8'));
  const vocab = c.text_config?.vocab_size ?? c.vocab_size;
  const pad = c.media_placeholder_token_id ?? c.image_token_id;
  return { vocab, pad };
}

test('Kimi-K2.5 fixture: an image reaches the model, counted in usage; a remote URL is refused beside it', { skip: SKIP }, async () => {
  const { vocab, pad } = fixtureConfig();
  assert.equal(pad, 500, 'the tokenizer written here has <|media_pad|> at 500');
  assert.ok(vocab > 508, `the fixture's vocabulary (${vocab}) holds the specials`);
  const dir = kimiModelDir(vocab);
  const s = await startServe(BIN, ['serve', dir, '--device', 'cpu', '--load-format', 'auto', '--host', '127.0.0.1',
    '--port', '0', '--max-model-len', '256', '--served-model-name', 'kimi-tiny', '--limit-mm-per-prompt', '{"image": 2}']);
  try {
    const client = new OpenAI({ baseURL: `http://127.0.0.1:${s.port}/v1`, apiKey: 'none', maxRetries: 0 });
    const ask = (parts) => client.chat.completions.create({ model: 'kimi-tiny', max_tokens: 3, temperature: 0,
      logprobs: true, top_logprobs: 3, messages: [{ role: 'user', content: parts }] });
    const text = await ask([{ type: 'text', text: 'hi' }]);
    // photo.png (170 x 120) is 14 x 10 patches padded: 35 merged tokens; gray1.png (40 x 30) 2 x 2: 4.
    const photo = { type: 'image_url', image_url: { url: dataUrl('photo.png', 'image/png') } };
    const gray = { type: 'image_url', image_url: { url: dataUrl('gray1.png', 'image/png') } };
    const withPhoto = await ask([{ type: 'text', text: 'hi' }, photo]);
    // The template adds <|media_begin|> "image" <|media_content|> <|media_pad|> <|media_end|>: 9
    // tokens, the placeholder expanded to the image's 35.
    assert.equal(withPhoto.usage.prompt_tokens, text.usage.prompt_tokens + 8 + 35);
    const withGray = await ask([{ type: 'text', text: 'hi' }, gray]);
    assert.equal(withGray.usage.prompt_tokens, text.usage.prompt_tokens + 8 + 4);
    // The image's features reach the model: the same image gives the same first-token logprobs,
    // another image others.
    const again = await ask([{ type: 'text', text: 'hi' }, photo]);
    const first = (r) => r.choices[0].logprobs.content[0].top_logprobs.map((t) => t.logprob);
    assert.deepEqual(first(again), first(withPhoto));
    assert.equal(again.choices[0].message.content, withPhoto.choices[0].message.content);
    assert.notDeepEqual(first(withGray), first(withPhoto));
    // A remote URL is a 400 naming the part while a good request beside it is served.
    const [good, bad] = await Promise.all([
      ask([{ type: 'text', text: 'hi' }, photo]),
      ask([{ type: 'text', text: 'hi' }, { type: 'image_url', image_url: { url: 'https://example.com/a.png' } }])
        .then(() => null, (e) => e),
    ]);
    assert.deepEqual(first(good), first(withPhoto));
    assert.ok(bad, 'the remote URL was served');
    assert.equal(bad.status, 400);
    assert.match(bad.message, /messages\[0\]\.content\[1\]: the server fetches no URLs/);
    // --limit-mm-per-prompt '{"image": 2}'.
    const three = await ask([photo, gray, photo]).then(() => null, (e) => e);
    assert.equal(three?.status, 400);
    assert.match(three.message, /content\[2\]: at most 2 image\(s\)/);
    // A truncated image.
    const cut = `data:image/png;base64,${image('photo.png').subarray(0, 300).toString('base64')}`;
    const broken = await ask([{ type: 'image_url', image_url: { url: cut } }]).then(() => null, (e) => e);
    assert.equal(broken?.status, 400);
    assert.match(broken.message, /messages\[0\]\.content\[0\]: /);
    // Still serving.
    assert.deepEqual(first(await ask([{ type: 'text', text: 'hi' }, photo])), first(withPhoto));
  } finally {
    s.proc.kill('SIGTERM');
  }
});

// An image a tool returned reaches the model as a user's does: as an OpenAI tool message's image
// part and as an Anthropic tool_result's image block (the same prompt, the same answer, counted);
// /tokenize counts each image's tokens as the engine does; video parts are refused by name.
test('Kimi-K2.5 fixture: tool-result images, /tokenize with images, video parts refused', { skip: SKIP }, async () => {
  const { vocab, pad } = fixtureConfig();
  const dir = kimiModelDir(vocab);
  const s = await startServe(BIN, ['serve', dir, '--device', 'cpu', '--load-format', 'auto', '--host', '127.0.0.1',
    '--port', '0', '--max-model-len', '256', '--served-model-name', 'kimi-tiny', '--limit-mm-per-prompt', '{"image": 2}']);
  try {
    const base = `http://127.0.0.1:${s.port}`;
    const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0 });
    const post = async (route, body) => {
      const r = await fetch(`${base}${route}`, { method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body) });
      return { status: r.status, body: await r.json() };
    };
    const b64 = (name) => image(name).toString('base64');
    const call = { id: 'toolu_1', type: 'function', function: { name: 'screenshot', arguments: '{}' } };
    const chatMessages = (name) => [
      { role: 'user', content: 'take a screenshot' },
      { role: 'assistant', content: null, tool_calls: [call] },
      { role: 'tool', tool_call_id: 'toolu_1', content: [{ type: 'text', text: 'here' },
        { type: 'image_url', image_url: { url: dataUrl(name, 'image/png') } }] }];
    const ask = (messages) => client.chat.completions.create({ model: 'kimi-tiny', max_tokens: 3, temperature: 0,
      logprobs: true, top_logprobs: 3, messages });
    const first = (r) => r.choices[0].logprobs.content[0].top_logprobs.map((t) => t.logprob);
    const photo = await ask(chatMessages('photo.png'));
    const gray = await ask(chatMessages('gray1.png'));
    // The tool message's image is expanded (photo.png 35 tokens, gray1.png 4) and its features
    // reach the model.
    assert.equal(photo.usage.prompt_tokens, gray.usage.prompt_tokens + 35 - 4);
    assert.notDeepEqual(first(photo), first(gray));
    // The same conversation through the Messages API: the same prompt, so the same greedy answer.
    const anthropic = (content) => ({ model: 'kimi-tiny', max_tokens: 3, temperature: 0, messages: [
      { role: 'user', content: 'take a screenshot' },
      { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_1', name: 'screenshot', input: {} }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content }] }] });
    const imageBlock = (name) => ({ type: 'image', source: { type: 'base64', media_type: 'image/png', data: b64(name) } });
    const m = await post('/v1/messages', anthropic([{ type: 'text', text: 'here' }, imageBlock('photo.png')]));
    assert.equal(m.status, 200, JSON.stringify(m.body));
    assert.equal(m.body.usage.input_tokens + (m.body.usage.cache_read_input_tokens ?? 0), photo.usage.prompt_tokens);
    assert.equal(m.body.content.find((b) => b.type === 'text')?.text ?? '', photo.choices[0].message.content);
    const counted = await post('/v1/messages/count_tokens', anthropic([{ type: 'text', text: 'here' }, imageBlock('photo.png')]));
    assert.equal(counted.body.input_tokens, photo.usage.prompt_tokens);
    // A URL source in a tool_result, and one image too many (two in the result, one from the user).
    const url = await post('/v1/messages', anthropic([{ type: 'image', source: { type: 'url', url: 'https://example.com/a.png' } }]));
    assert.equal(url.status, 400);
    assert.match(url.body.error.message, /messages\[2\]\.content\[0\]\.content\[0\]: the server fetches no URLs/);
    const many = anthropic([imageBlock('gray1.png'), imageBlock('gray1.png')]);
    many.messages[2].content.push(imageBlock('gray1.png'));
    const tooMany = await post('/v1/messages', many);
    assert.equal(tooMany.status, 400);
    assert.match(tooMany.body.error.message, /messages\[2\]\.content\[1\]: at most 2 image\(s\)/);

    // /tokenize: the prompt as the engine runs it, photo.png's placeholder as its 35 tokens.
    const tok = await post('/tokenize', { model: 'kimi-tiny', messages: chatMessages('photo.png') });
    assert.equal(tok.status, 200, JSON.stringify(tok.body));
    assert.equal(tok.body.count, photo.usage.prompt_tokens);
    assert.equal(tok.body.tokens.length, tok.body.count);
    assert.equal(tok.body.tokens.filter((t) => t === pad).length, 35);
    const run = tok.body.tokens.indexOf(pad);
    assert.deepEqual(tok.body.tokens.slice(run, run + 35), new Array(35).fill(pad));
    const bad = await post('/tokenize', { messages: [{ role: 'user', content: [
      { type: 'image_url', image_url: { url: `data:image/png;base64,${image('photo.png').subarray(0, 300).toString('base64')}` } }] }] });
    assert.equal(bad.status, 400);
    assert.match(bad.body.error.message, /messages\[0\]\.content\[0\]: /);

    // Video parts: a 400 naming the part; a request beside them is served.
    const [ok, video] = await Promise.all([
      ask(chatMessages('gray1.png')),
      client.chat.completions.create({ model: 'kimi-tiny', max_tokens: 2, messages: [{ role: 'user', content: [
        { type: 'text', text: 'what happens?' }, { type: 'video_url', video_url: { url: 'data:video/mp4;base64,AAAA' } }] }] })
        .then(() => null, (e) => e),
    ]);
    assert.deepEqual(first(ok), first(gray));
    assert.equal(video?.status, 400);
    assert.match(video.message, /messages\[0\]\.content\[1\]: 'video_url' parts are not supported: videos are not supported by this server/);
    const vblock = await post('/v1/messages', { model: 'kimi-tiny', max_tokens: 2, messages: [{ role: 'user', content: [
      { type: 'video', source: { type: 'base64', media_type: 'video/mp4', data: 'AAAA' } }] }] });
    assert.equal(vblock.status, 400);
    assert.match(vblock.body.error.message, /messages\[0\]\.content\[0\]: 'video' parts are not supported/);
  } finally {
    s.proc.kill('SIGTERM');
  }
});

test('a text-only model refuses an image part by name; a bad --limit-mm-per-prompt or --mm-processor-cache-gb stops start-up', async () => {
  const dir = makeByteModelDir(SRC, 'atom-images-text-');
  const s = await startServe(BIN, ['serve', dir, '--device', 'cpu', '--load-format', 'dummy', '--host', '127.0.0.1',
    '--port', '0', '--max-model-len', '256', '--served-model-name', 'tiny']);
  try {
    const client = new OpenAI({ baseURL: `http://127.0.0.1:${s.port}/v1`, apiKey: 'none', maxRetries: 0 });
    const e = await client.chat.completions.create({ model: 'tiny', max_tokens: 2, messages: [{ role: 'user',
      content: [{ type: 'text', text: 'x' }, { type: 'image_url', image_url: { url: dataUrl('gray1.png', 'image/png') } }] }] })
      .then(() => null, (err) => err);
    assert.equal(e?.status, 400);
    assert.match(e.message, /messages\[0\]\.content\[1\]: this model \(tiny\) takes no images/);
    // Text parts are served as before.
    const ok = await client.chat.completions.create({ model: 'tiny', max_tokens: 2,
      messages: [{ role: 'user', content: [{ type: 'text', text: 'x' }] }] });
    assert.equal(ok.choices.length, 1);
  } finally {
    s.proc.kill('SIGTERM');
  }
  await assert.rejects(startServe(BIN, ['serve', dir, '--device', 'cpu', '--load-format', 'dummy', '--host', '127.0.0.1',
    '--port', '0', '--limit-mm-per-prompt', '{"image": -1}']), /--limit-mm-per-prompt: 'image' must be a count/);
  await assert.rejects(startServe(BIN, ['serve', dir, '--device', 'cpu', '--load-format', 'dummy', '--host', '127.0.0.1',
    '--port', '0', '--mm-processor-cache-gb', '-1']), /--mm-processor-cache-gb must be from 0 to 1024/);
});
