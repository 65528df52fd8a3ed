//! Raw proxy-wasm host calls that report the host status instead of panicking
//! (the SDK's `hostcalls` panic on statuses they do not expect, which kills the
//! VM: see `docs/envoy-mechanisms.md`). Compiled for wasm only.

use proxy_wasm::types::{BufferType, LogLevel, MapType, MetricType};
use std::ptr::null_mut;

/// A host status other than `Ok` (0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostStatus(pub u32);

#[link(wasm_import_module = "env")]
unsafe extern "C" {
    fn proxy_log(level: LogLevel, data: *const u8, size: usize) -> u32;
    fn proxy_get_buffer_bytes(
        t: BufferType,
        start: usize,
        max: usize,
        out: *mut *mut u8,
        out_size: *mut usize,
    ) -> u32;
    fn proxy_set_buffer_bytes(
        t: BufferType,
        start: usize,
        size: usize,
        data: *const u8,
        data_size: usize,
    ) -> u32;
    fn proxy_get_header_map_pairs(t: MapType, out: *mut *mut u8, out_size: *mut usize) -> u32;
    fn proxy_replace_header_map_value(
        t: MapType,
        k: *const u8,
        kl: usize,
        v: *const u8,
        vl: usize,
    ) -> u32;
    fn proxy_add_header_map_value(
        t: MapType,
        k: *const u8,
        kl: usize,
        v: *const u8,
        vl: usize,
    ) -> u32;
    fn proxy_remove_header_map_value(t: MapType, k: *const u8, kl: usize) -> u32;
    fn proxy_set_property(p: *const u8, pl: usize, v: *const u8, vl: usize) -> u32;
    fn proxy_get_property(p: *const u8, pl: usize, out: *mut *mut u8, out_size: *mut usize) -> u32;
    fn proxy_call_foreign_function(
        n: *const u8,
        nl: usize,
        a: *const u8,
        al: usize,
        out: *mut *mut u8,
        out_size: *mut usize,
    ) -> u32;
    fn proxy_send_local_response(
        status: u32,
        details: *const u8,
        details_size: usize,
        body: *const u8,
        body_size: usize,
        headers: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
    fn proxy_define_metric(t: MetricType, n: *const u8, nl: usize, id: *mut u32) -> u32;
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    fn proxy_get_current_time_nanoseconds(out: *mut u64) -> u32;
    fn proxy_get_shared_data(
        k: *const u8,
        kl: usize,
        out: *mut *mut u8,
        out_size: *mut usize,
        cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(k: *const u8, kl: usize, v: *const u8, vl: usize, cas: u32) -> u32;
    fn proxy_increment_metric(id: u32, offset: i64) -> u32;
}

fn check(status: u32) -> Result<(), HostStatus> {
    if status == 0 {
        Ok(())
    } else {
        Err(HostStatus(status))
    }
}

/// Takes ownership of a host-allocated buffer (allocated through the SDK's
/// `proxy_on_memory_allocate`, i.e. a `Vec<u8>` of capacity `size`).
fn adopt(data: *mut u8, size: usize) -> Vec<u8> {
    if data.is_null() {
        return Vec::new();
    }
    // SAFETY: the host wrote `size` bytes into memory it obtained from our
    // allocator with exactly that capacity, and hands ownership to us.
    unsafe { Vec::from_raw_parts(data, size, size) }
}

pub fn log(level: LogLevel, msg: &str) {
    // SAFETY: the host only reads `msg` within its length.
    let _ = unsafe { proxy_log(level, msg.as_ptr(), msg.len()) };
}

/// Up to `max` bytes of a buffer from `start`.
pub fn get_buffer(t: BufferType, start: usize, max: usize) -> Result<Vec<u8>, HostStatus> {
    let (mut data, mut size) = (null_mut(), 0usize);
    // SAFETY: the out-pointers point at live locals.
    check(unsafe { proxy_get_buffer_bytes(t, start, max, &mut data, &mut size) })?;
    Ok(adopt(data, size))
}

/// Replaces `[start, start + size)` of a buffer (Envoy: `start == 0` drains `size` bytes and prepends).
pub fn set_buffer(t: BufferType, start: usize, size: usize, data: &[u8]) -> Result<(), HostStatus> {
    // SAFETY: the host only reads `data` within its length.
    check(unsafe { proxy_set_buffer_bytes(t, start, size, data.as_ptr(), data.len()) })
}

/// The pairs of a header map whose name passes `keep`, in one host call;
/// names are lower-case ASCII in Envoy, values raw bytes.
pub fn header_pairs(
    t: MapType,
    keep: impl Fn(&[u8]) -> bool,
) -> Result<Vec<(String, Vec<u8>)>, HostStatus> {
    let (mut data, mut size) = (null_mut(), 0usize);
    // SAFETY: the out-pointers point at live locals.
    check(unsafe { proxy_get_header_map_pairs(t, &mut data, &mut size) })?;
    Ok(crate::header_pairs::decode_where(&adopt(data, size), keep).unwrap_or_default())
}

pub fn replace_header(t: MapType, name: &str, value: &[u8]) -> Result<(), HostStatus> {
    // SAFETY: the host only reads the two byte ranges.
    check(unsafe {
        proxy_replace_header_map_value(t, name.as_ptr(), name.len(), value.as_ptr(), value.len())
    })
}

/// Appends a header (cheaper than replace when the name is known to be absent).
pub fn add_header(t: MapType, name: &str, value: &[u8]) -> Result<(), HostStatus> {
    // SAFETY: the host only reads the two byte ranges.
    check(unsafe {
        proxy_add_header_map_value(t, name.as_ptr(), name.len(), value.as_ptr(), value.len())
    })
}

pub fn remove_header(t: MapType, name: &str) -> Result<(), HostStatus> {
    // SAFETY: the host only reads `name` within its length.
    check(unsafe { proxy_remove_header_map_value(t, name.as_ptr(), name.len()) })
}

/// Reads a property (`path` segments, e.g. `["upstream", "address"]`);
/// `None` when the host has none.
pub fn get_property(path: &[&str]) -> Result<Option<Vec<u8>>, HostStatus> {
    let joined = path.join("\0");
    let (mut data, mut size) = (null_mut(), 0usize);
    // SAFETY: the host reads `joined` within its length; the out-pointers point at live locals.
    let status = unsafe { proxy_get_property(joined.as_ptr(), joined.len(), &mut data, &mut size) };
    match status {
        0 => Ok(Some(adopt(data, size))),
        // NotFound
        1 => Ok(None),
        s => Err(HostStatus(s)),
    }
}

/// Sets a one-segment property (Envoy: filter state `wasm.<name>`).
pub fn set_property(name: &str, value: &[u8]) -> Result<(), HostStatus> {
    // SAFETY: the host only reads the two byte ranges.
    check(unsafe { proxy_set_property(name.as_ptr(), name.len(), value.as_ptr(), value.len()) })
}

/// Envoy's `set_envoy_filter_state` foreign function: protobuf
/// `SetEnvoyFilterStateArguments{path = 1, value = 2}` (span left at its default).
pub fn set_envoy_filter_state(key: &str, value: &str) -> Result<(), HostStatus> {
    let mut args = Vec::with_capacity(key.len() + value.len() + 8);
    for (tag, field) in [(0x0a_u8, key), (0x12_u8, value)] {
        args.push(tag);
        let mut len = field.len();
        while len >= 0x80 {
            args.push((len & 0x7f) as u8 | 0x80);
            len >>= 7;
        }
        args.push(len as u8);
        args.extend_from_slice(field.as_bytes());
    }
    let name = "set_envoy_filter_state";
    let (mut data, mut size) = (null_mut(), 0usize);
    // SAFETY: the host reads the name and argument ranges and writes the out-pointers (live locals).
    let status = unsafe {
        proxy_call_foreign_function(
            name.as_ptr(),
            name.len(),
            args.as_ptr(),
            args.len(),
            &mut data,
            &mut size,
        )
    };
    drop(adopt(data, size));
    check(status)
}

/// Ends the request with a local reply (no upstream).
pub fn send_local_response(status: u32, details: &str, body: &str) -> Result<(), HostStatus> {
    // An empty serialized header map: zero pairs.
    let headers = 0u32.to_le_bytes();
    // SAFETY: the host only reads the byte ranges passed, all live for the call.
    check(unsafe {
        proxy_send_local_response(
            status,
            details.as_ptr(),
            details.len(),
            body.as_ptr(),
            body.len(),
            headers.as_ptr(),
            headers.len(),
            -1,
        )
    })
}

pub fn define_counter(name: &str) -> Result<u32, HostStatus> {
    let mut id = 0u32;
    // SAFETY: the host reads `name` and writes the id into a live local.
    check(unsafe { proxy_define_metric(MetricType::Counter, name.as_ptr(), name.len(), &mut id) })?;
    Ok(id)
}

pub fn increment(id: u32, by: i64) -> Result<(), HostStatus> {
    // SAFETY: plain value call.
    check(unsafe { proxy_increment_metric(id, by) })
}

/// Calls the root context's `on_tick` every `ms` (0 stops it).
pub fn set_tick_period(ms: u32) -> Result<(), HostStatus> {
    // SAFETY: plain value call.
    check(unsafe { proxy_set_tick_period_milliseconds(ms) })
}

/// The host's wall clock, ms since the Unix epoch.
pub fn now_ms() -> Result<u64, HostStatus> {
    let mut ns = 0u64;
    // SAFETY: the host writes into a live local.
    check(unsafe { proxy_get_current_time_nanoseconds(&mut ns) })?;
    Ok(ns / 1_000_000)
}

/// A shared-data value and its compare-and-swap token; `(None, 0)` when absent
/// (Envoy answers `NotFound`, status 1).
pub fn get_shared(key: &str) -> Result<(Option<Vec<u8>>, u32), HostStatus> {
    let (mut data, mut size, mut cas) = (null_mut(), 0usize, 0u32);
    // SAFETY: the host reads `key` and writes the out-pointers (live locals).
    let status =
        unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas) };
    let value = adopt(data, size);
    match status {
        0 => Ok((Some(value), cas)),
        1 => Ok((None, 0)),
        s => Err(HostStatus(s)),
    }
}

/// Sets a shared-data value if its token is still `cas` (0: unconditionally);
/// `Err(HostStatus(8))` (`CasMismatch`) when another worker wrote first.
pub fn set_shared(key: &str, value: &[u8], cas: u32) -> Result<(), HostStatus> {
    // SAFETY: the host only reads the two byte ranges.
    check(unsafe {
        proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas)
    })
}

/// `dispatch_http_call`: a request to an Envoy cluster; the answer arrives in
/// the root context's `on_http_call_response` with the returned token. It
/// must go through the SDK: its dispatcher records the token, and a response
/// to a token it does not know panics the VM ("invalid token_id"). The SDK
/// panics only on statuses Envoy's `httpCall` never returns (it answers
/// `BadArgument` for an unknown cluster or missing pseudo-headers and
/// `InternalFailure` when the call cannot start).
pub fn http_call(
    cluster: &str,
    headers: &[(&str, &str)],
    timeout_ms: u32,
) -> Result<u32, HostStatus> {
    proxy_wasm::hostcalls::dispatch_http_call(
        cluster,
        headers.to_vec(),
        None,
        Vec::new(),
        std::time::Duration::from_millis(u64::from(timeout_ms)),
    )
    .map_err(|s| HostStatus(s as u32))
}
