//! Who failed — the caller, the device or a passing condition — so an engine integration
//! can choose between recomputing, retrying and aborting.

/// The class of a failure, carried by every error of the engine and the copy engine.
///
/// What an integration does with each (the vLLM connector, `docs/vllm.md`):
/// - [`Fault::Caller`]: the request or configuration is wrong (bad ids, shapes, a
///   request id used twice); retrying cannot help — fail the request (or start-up).
/// - [`Fault::Device`]: memory or the driver failed (a checksum mismatch in host
///   memory, a CUDA error); the data is unusable — recompute it, and stop using the
///   tier if it keeps happening.
/// - [`Fault::Transient`]: nothing is wrong but there is no room now (every block
///   pinned, device memory exhausted); recompute or retry later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// The caller passed something invalid.
    Caller,
    /// The device, the driver or memory failed.
    Device,
    /// A resource is exhausted for now.
    Transient,
}

impl Fault {
    /// A stable lower-case name (`caller`, `device`, `transient`) for logs and bindings.
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::Caller => "caller",
            Fault::Device => "device",
            Fault::Transient => "transient",
        }
    }
}
