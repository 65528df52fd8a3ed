// Runs the scanner benchmark compiled for wasm32-wasip1 inside Node's V8 (Envoy's wasm engine).
// Usage: node filter/benches/run-wasm.mjs path/to/scan-*.wasm
import { readFile } from 'node:fs/promises';
import { WASI } from 'node:wasi';
import { argv } from 'node:process';

const wasi = new WASI({ version: 'preview1', args: ['scan'], env: {} });
const module = await WebAssembly.compile(await readFile(argv[2]));
const instance = await WebAssembly.instantiate(module, wasi.getImportObject());
wasi.start(instance);
