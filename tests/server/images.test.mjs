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

test('a text-only model refuses an image part by name; a bad --limit-mm-per-prompt stops start-up', async () => {
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
});
