//! Shared fixtures: each module is compiled once per test binary.

use std::sync::OnceLock;
use tether_wasm_host::{HostOptions, Plugin};

pub fn abi_plugin() -> &'static Plugin {
    static P: OnceLock<Plugin> = OnceLock::new();
    P.get_or_init(|| {
        Plugin::new(include_str!("abi_guest.wat").as_bytes(), true).expect("abi guest compiles")
    })
}

pub fn floor_plugin() -> &'static Plugin {
    static P: OnceLock<Plugin> = OnceLock::new();
    P.get_or_init(|| {
        let path = tether_wasm_host::module_path("TETHER_FLOOR_WASM", "tether_floor_filter.wasm")
            .unwrap_or_else(|e| panic!("{e}"));
        Plugin::from_file(path).expect("floor filter compiles")
    })
}

pub fn options(config: &str) -> HostOptions {
    HostOptions {
        plugin_config: config.as_bytes().to_vec(),
        ..HostOptions::default()
    }
}
