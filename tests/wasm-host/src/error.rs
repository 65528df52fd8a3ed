//! Errors of the host: what went wrong loading or running a module.

/// Everything the host can report; a trap or a panic in the module is a value
/// of this type, never a crash of the host.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("cannot read module {path}: {source}")]
    ReadModule {
        path: String,
        source: std::io::Error,
    },
    #[error("module does not compile: {0}")]
    Compile(String),
    #[error("module is not a proxy-wasm 0.2 module: {0}")]
    NotProxyWasm(String),
    #[error("module cannot be instantiated: {0}")]
    Instantiate(String),
    /// The module trapped (a Rust panic ends in `unreachable`); `guest_message`
    /// is what the module itself said just before (panic message, error log).
    #[error("module trapped in {callback}: {}{trap}", guest_message.as_deref().map(|m| format!("{m} ")).unwrap_or_default())]
    Trap {
        callback: String,
        trap: String,
        guest_message: Option<String>,
    },
    #[error("module used up its instruction budget in {callback} ({budget} fuel)")]
    OutOfFuel { callback: String, budget: u64 },
    #[error("module called proc_exit({code}) in {callback}")]
    Exit { callback: String, code: i32 },
    #[error("proxy_on_vm_start returned false{}", logs_suffix(.logs))]
    VmStartRejected { logs: Vec<String> },
    #[error("proxy_on_configure rejected the plugin configuration{}", logs_suffix(.logs))]
    ConfigureRejected { logs: Vec<String> },
    #[error("the VM failed earlier and cannot run {callback}")]
    VmFailed { callback: String },
    #[error("unknown context {0}")]
    UnknownContext(u32),
}

fn logs_suffix(logs: &[String]) -> String {
    if logs.is_empty() {
        String::new()
    } else {
        format!(": {}", logs.join("; "))
    }
}
