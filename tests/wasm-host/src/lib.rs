//! proxy-wasm host on wasmtime (skeleton).
