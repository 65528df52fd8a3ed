// Runs the scanner benchmark compiled for wasm32-wasip1 inside Node's V8 (Envoy's wasm engine).
// Usage: node filter/benches/run-wasm.mjs path/to/scan-*.wasm [--phases | --file /tmp/body.json chat]
// The proxy-wasm host imports the library links ("env") are never called by
// the benchmark; they are stubbed.
import { readFile } from 'node:fs/promises';
import { WASI } from 'node:wasi';
import { argv } from 'node:process';

const wasi = new WASI({ version: 'preview1', args: ['scan', ...argv.slice(3)], env: {}, preopens: { '/tmp': '/tmp' } });
const module = await WebAssembly.compile(await readFile(argv[2]));
const imports = wasi.getImportObject();
imports.env = {};
for (const imp of WebAssembly.Module.imports(module)) {
  if (imp.module === 'env' && imp.kind === 'function') imports.env[imp.name] = () => 0;
}
const instance = await WebAssembly.instantiate(module, imports);
// The library's proxy-wasm `_initialize` export is not part of a command module: hide it.
wasi.start({ exports: { memory: instance.exports.memory, _start: instance.exports._start } });
