#!/usr/bin/env node
// Hugging Face tokenizers side of bench/tokenizer_bench.cpp (which runs this script and reads
// its last line). Encodes every document of a JSON array one call at a time, awaiting each, so
// the Rust library works on one thread (encode of a single input does not use rayon; the binding
// runs it on one libuv worker); RAYON_NUM_THREADS=1 and TOKENIZERS_PARALLELISM=false make sure.
//   node bench/tokenizer_bench.js DOCS_JSON TOKENIZER_JSON
'use strict';
process.env.RAYON_NUM_THREADS = '1';
process.env.TOKENIZERS_PARALLELISM = 'false';
const fs = require('fs');
const path = require('path');
const {Tokenizer} = require(path.join(__dirname, '..', 'tests', 'node', 'node_modules', '@anush008', 'tokenizers'));

async function main() {
  const [docsFile, tokFile] = process.argv.slice(2);
  const docs = JSON.parse(fs.readFileSync(docsFile, 'utf8'));
  let t0 = process.hrtime.bigint();
  const tok = Tokenizer.fromFile(tokFile);
  const loadS = Number(process.hrtime.bigint() - t0) / 1e9;
  // Warm-up on a slice, as the C++ side does.
  for (let i = 0; i < Math.min(50, docs.length); ++i) await tok.encode(docs[i], null, {addSpecialTokens: false});
  let tokens = 0;
  t0 = process.hrtime.bigint();
  for (const d of docs) tokens += (await tok.encode(d, null, {addSpecialTokens: false})).getLength();
  const encodeS = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(JSON.stringify({load_s: loadS, encode_s: encodeS, tokens}));
}
main().catch((e) => {
  console.error(e);
  process.exit(1);
});
