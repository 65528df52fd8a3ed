//! A compiled proxy-wasm module with its import table: compile once, then
//! instantiate a fresh VM per test or per request stream.

use crate::abi::{LogLevel, Status};
use crate::error::HostError;
use crate::state::{HostOptions, HostState};
use crate::vm::FilterVm;
use crate::{hostcalls, wasi};
use std::collections::HashSet;
use std::path::Path;
use wasmtime::{Config, Engine, ExternType, Linker, Module, Val, ValType};

/// The ABI version exports this host speaks.
const ABI_EXPORTS: [&str; 2] = ["proxy_abi_version_0_2_1", "proxy_abi_version_0_2_0"];

/// A compiled module plus everything needed to instantiate it cheaply.
pub struct Plugin {
    engine: Engine,
    module: Module,
    linker: Linker<HostState>,
    metered: bool,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("metered", &self.metered)
            .finish_non_exhaustive()
    }
}

impl Plugin {
    /// Compiles a module from a file, with fuel metering on (instruction
    /// budgets and host-independent cost figures).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, HostError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| HostError::ReadModule {
            path: path.display().to_string(),
            source,
        })?;
        Self::new(&bytes, true)
    }

    /// Compiles a module (binary or WAT text). `metered` turns on wasmtime fuel:
    /// budgets and instruction counts work, execution is somewhat slower.
    pub fn new(bytes: &[u8], metered: bool) -> Result<Self, HostError> {
        let mut config = Config::new();
        config.consume_fuel(metered);
        let engine = Engine::new(&config).map_err(|e| HostError::Compile(e.to_string()))?;
        let module =
            Module::new(&engine, bytes).map_err(|e| HostError::Compile(format!("{e:#}")))?;
        if !module.exports().any(|e| ABI_EXPORTS.contains(&e.name())) {
            return Err(HostError::NotProxyWasm(format!(
                "exports none of {ABI_EXPORTS:?}"
            )));
        }
        let mut linker = Linker::new(&engine);
        let mut defined = HashSet::new();
        hostcalls::define(&mut linker, &mut defined)
            .map_err(|e| HostError::Instantiate(e.to_string()))?;
        wasi::define(&mut linker, &mut defined)
            .map_err(|e| HostError::Instantiate(e.to_string()))?;
        define_unsupported(&mut linker, &module, &defined)?;
        Ok(Self {
            engine,
            module,
            linker,
            metered,
        })
    }

    /// Whether fuel metering is on.
    pub fn metered(&self) -> bool {
        self.metered
    }

    /// Starts a VM: instantiate, `_initialize`, root context, `proxy_on_vm_start`
    /// and `proxy_on_configure`. A rejected configuration is an error carrying
    /// the module's log lines.
    pub fn start(&self, options: HostOptions) -> Result<FilterVm, HostError> {
        FilterVm::start(
            &self.engine,
            &self.module,
            &self.linker,
            self.metered,
            options,
        )
    }
}

/// Imports this host does not implement still link, so that any module loads:
/// a call logs a warning and returns `Unimplemented` (for `env`) or `ENOSYS`
/// (for WASI); an import with a non-i32 result traps when called.
fn define_unsupported(
    linker: &mut Linker<HostState>,
    module: &Module,
    defined: &HashSet<String>,
) -> Result<(), HostError> {
    for import in module.imports() {
        let full = format!("{}.{}", import.module(), import.name());
        let ExternType::Func(ty) = import.ty() else {
            continue;
        };
        if defined.contains(&full) {
            continue;
        }
        let code = if import.module() == "env" {
            Status::Unimplemented.code()
        } else {
            52
        };
        let returns_i32 =
            ty.results().len() == 1 && matches!(ty.results().next(), Some(ValType::I32));
        let no_result = ty.results().len() == 0;
        let name = full.clone();
        linker
            .func_new(
                import.module(),
                import.name(),
                ty.clone(),
                move |mut c, _params, results| {
                    c.data_mut().log(
                        LogLevel::Warn,
                        "host",
                        format!("unsupported import {name} called"),
                    );
                    if returns_i32 {
                        results[0] = Val::I32(code);
                        Ok(())
                    } else if no_result {
                        Ok(())
                    } else {
                        Err(wasmtime::Error::msg(format!(
                            "unsupported import {name} called"
                        )))
                    }
                },
            )
            .map_err(|e| HostError::Instantiate(format!("{full}: {e}")))?;
    }
    Ok(())
}
