//! Benchmark floors and host probes: the cheapest header-only and body-reading
//! proxy-wasm filters, plus two probe modes that make Envoy's host rules visible.
//!
//! The plugin configuration (JSON) picks the mode; the contract is documented
//! in `docs/wasm-host.md` ("The floor filter"):
//! - `{"mode":"header"}`: set request header `x-floor: 1` and continue.
//! - `{"mode":"body","dst":"ip:port"}`: pause the body until end of stream, then
//!   hand `dst` to Envoy through the `set_envoy_filter_state` foreign function
//!   (key `envoy.network.transport_socket.original_dst_address`), without reading
//!   the body.
//! - `{"mode":"body-state","key":"…"}`: pause the body until end of stream,
//!   then set the property `tether.x-tether-key` = `key` (Envoy filter state
//!   `wasm.tether.x-tether-key`, the channel tether's body path uses), without
//!   reading the body: the body floor inside tether's own Envoy chain.
//! - `{"mode":"probe"}`: buffer the body, then try to read and replace a request
//!   header from the last body callback and report the host statuses and the
//!   buffered body size as response headers.
//! - `{"mode":"pause"}`: pause in the request-header callback; a body callback,
//!   if the host ever delivers one, answers with a local `200 body delivered`.
//! - `{"mode":"local","at":"headers"|"body"}`: answer locally (`418`, details
//!   `floor_local`, header `x-floor-local: 1`, body `local reply`) from the
//!   request-header callback or at the body's end, and report what the
//!   response callbacks then see: the response-header callback adds
//!   `x-floor-response-seen` (status, details, the local header, the names of
//!   the headers present) and the response body callback upper-cases the body
//!   — so a client sees which callbacks ran; `on_log` logs the final
//!   `response.code` and `response.code_details`. Optional `details`, `body`,
//!   `headers` (`[[name, value], …]`) shape the local reply.

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, Bytes, ContextType, LogLevel, MapType, Status};
use std::net::SocketAddr;
use xxhash_rust::xxh3::xxh3_64;

/// Filter-state key read by an `ORIGINAL_DST` cluster to pick the upstream.
const ORIGINAL_DST_KEY: &str = "envoy.network.transport_socket.original_dst_address";

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| Box::new(FloorRoot { mode: None }));
}}

/// What the filter does per request, parsed once from the plugin configuration.
#[derive(Clone, Debug)]
enum Mode {
    Header,
    Body {
        dst: String,
    },
    BodyState {
        key: String,
    },
    /// `body-state` plus the header-map copy and the body-end reads of
    /// tether's body path.
    BodyRead {
        key: String,
    },
    /// `body-read` plus the least decision a filter keyed on a body field can
    /// make: the last `"<field>":"…"` in the bytes read, hashed (xxh3) into
    /// the key. No JSON walk, no head hash, no other source.
    BodyKey {
        field: String,
    },
    Probe,
    Pause,
    /// Answer locally from the request headers (`true`) or at the body's end.
    Local {
        at_headers: bool,
        details: String,
        body: String,
        headers: Vec<(String, String)>,
    },
}

struct FloorRoot {
    mode: Option<Mode>,
}

impl Context for FloorRoot {}

impl RootContext for FloorRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let raw = self.get_plugin_configuration().unwrap_or_default();
        match parse_mode(&raw) {
            Ok(mode) => {
                self.mode = Some(mode);
                true
            }
            Err(msg) => {
                let _ = hostcalls::log(LogLevel::Error, &format!("floor filter: {msg}"));
                false
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let mode = self.mode.clone()?;
        Some(Box::new(FloorHttp {
            mode,
            body_calls: 0,
            set_status: None,
            get_status: None,
            body_size: 0,
            response_body: 0,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// Validates the configuration; the error names the offending field.
fn parse_mode(raw: &[u8]) -> Result<Mode, String> {
    let value: serde_json::Value =
        serde_json::from_slice(raw).map_err(|e| format!("configuration is not JSON: {e}"))?;
    let mode = value
        .get("mode")
        .and_then(|m| m.as_str())
        .ok_or("field `mode` is missing or not a string")?;
    match mode {
        "header" => Ok(Mode::Header),
        "probe" => Ok(Mode::Probe),
        "pause" => Ok(Mode::Pause),
        "local" => {
            let at_headers = match value.get("at").and_then(|a| a.as_str()) {
                Some("headers") => true,
                Some("body") => false,
                _ => return Err("field `at` must be \"headers\" or \"body\" (mode `local`)".into()),
            };
            let text = |name: &str, default: &str| -> Result<String, String> {
                match value.get(name) {
                    None => Ok(default.to_owned()),
                    Some(v) => v
                        .as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| format!("field `{name}` must be a string (mode `local`)")),
                }
            };
            Ok(Mode::Local {
                at_headers,
                details: text("details", "floor_local")?,
                body: text("body", "local reply")?,
                headers: match value.get("headers") {
                    None => vec![("x-floor-local".to_owned(), "1".to_owned())],
                    Some(h) => serde_json::from_value(h.clone()).map_err(|e| {
                        format!(
                            "field `headers` must be a list of [name, value] (mode `local`): {e}"
                        )
                    })?,
                },
            })
        }
        "body-state" | "body-read" => {
            let key = value
                .get("key")
                .and_then(|k| k.as_str())
                .filter(|k| !k.is_empty())
                .ok_or_else(|| {
                    format!("field `key` is missing or not a non-empty string (mode `{mode}`)")
                })?
                .to_owned();
            Ok(if mode == "body-state" {
                Mode::BodyState { key }
            } else {
                Mode::BodyRead { key }
            })
        }
        "body-key" => {
            let field = value
                .get("field")
                .and_then(|k| k.as_str())
                .filter(|k| !k.is_empty())
                .ok_or("field `field` is missing or not a non-empty string (mode `body-key`)")?;
            Ok(Mode::BodyKey {
                field: format!("\"{field}\""),
            })
        }
        "body" => {
            let dst = value
                .get("dst")
                .and_then(|d| d.as_str())
                .ok_or("field `dst` is missing or not a string (mode `body` needs \"ip:port\")")?;
            dst.parse::<SocketAddr>()
                .map_err(|_| format!("field `dst` is not an ip:port address: {dst:?}"))?;
            Ok(Mode::Body {
                dst: dst.to_owned(),
            })
        }
        other => Err(format!(
            "field `mode` has unknown value {other:?} (expected header, body, body-state, body-read, body-key, probe, pause or local)"
        )),
    }
}

struct FloorHttp {
    mode: Mode,
    body_calls: u32,
    set_status: Option<u32>,
    get_status: Option<u32>,
    body_size: usize,
    /// Response body bytes seen by the response body callback (local mode).
    response_body: usize,
}

/// The first read of tether's scanner with its default outputs: the two
/// 16 KiB ends of the body, or the whole body when the ends would cover it.
/// Returns the last range read (the tail, or the whole body).
fn read_body_ends(size: usize) -> Option<Bytes> {
    const END: usize = 16 * 1024;
    let ranges = if size <= 2 * END {
        vec![(0, size)]
    } else {
        vec![(0, END), (size - END, END)]
    };
    let mut last = None;
    for (start, len) in ranges {
        match hostcalls::get_buffer(proxy_wasm::types::BufferType::HttpRequestBody, start, len) {
            Ok(b) => last = b,
            Err(s) => log_status("get request body", s),
        }
    }
    last
}

/// Hands `key` to Envoy as filter state `wasm.tether.x-tether-key`, tether's
/// body-path channel (the body floors h, l and m alike).
fn set_key(key: &str) {
    if let Err(s) = hostcalls::set_property(vec!["tether.x-tether-key"], Some(key.as_bytes())) {
        log_status("set_property", s);
    }
}

/// Key of mode `body-key` when the field is not in the bytes read.
const BODY_KEY_MISSING: &str = "body-key-missing";

/// The raw value of the last `"<field>": "…"` in `buf` (`quoted` = the field
/// name in quotes): a byte search, not a JSON walk — the least a filter keyed
/// on a body field does.
fn last_string_member<'b>(buf: &'b [u8], quoted: &str) -> Option<&'b [u8]> {
    let name = quoted.as_bytes();
    let at = buf.windows(name.len()).rposition(|w| w == name)?;
    let rest = &buf[at + name.len()..];
    let colon = rest.iter().position(|b| !b.is_ascii_whitespace())?;
    if rest[colon] != b':' {
        return None;
    }
    let rest = &rest[colon + 1..];
    let open = rest.iter().position(|b| !b.is_ascii_whitespace())?;
    if rest[open] != b'"' {
        return None;
    }
    let value = &rest[open + 1..];
    let mut i = 0;
    while i < value.len() {
        match value[i] {
            b'\\' => i += 2,
            b'"' => return Some(&value[..i]),
            _ => i += 1,
        }
    }
    None
}

/// The local reply of mode `local`.
fn send_local(details: &str, body: &str, headers: &[(String, String)]) {
    raw::send_local_response(418, details, body.as_bytes(), headers);
}

impl Context for FloorHttp {}

impl HttpContext for FloorHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, _eos: bool) -> Action {
        match &self.mode {
            Mode::Header => {
                if let Err(s) =
                    hostcalls::set_map_value(MapType::HttpRequestHeaders, "x-floor", Some("1"))
                {
                    log_status("set x-floor", s);
                }
                Action::Continue
            }
            Mode::Pause => Action::Pause,
            Mode::Local {
                at_headers: true,
                details,
                body,
                headers,
            } => {
                send_local(details, body, headers);
                Action::Pause
            }
            Mode::BodyRead { .. } | Mode::BodyKey { .. } => {
                // The whole map in one call, as tether's header callback reads it.
                if let Err(s) = hostcalls::get_map_bytes(MapType::HttpRequestHeaders) {
                    log_status("get request headers", s);
                }
                Action::Continue
            }
            Mode::Body { .. } | Mode::BodyState { .. } | Mode::Probe | Mode::Local { .. } => {
                Action::Continue
            }
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.body_calls += 1;
        self.body_size = body_size;
        match &self.mode {
            Mode::Pause => {
                let _ = hostcalls::send_http_response(200, vec![], Some(b"body delivered"));
                Action::Pause
            }
            Mode::Local {
                at_headers: true, ..
            } => {
                let _ = hostcalls::log(
                    LogLevel::Info,
                    &format!(
                        "floor local: request body callback after the local reply ({body_size} bytes)"
                    ),
                );
                Action::Continue
            }
            Mode::Header => Action::Continue,
            _ if !end_of_stream => Action::Pause,
            Mode::Local {
                details,
                body,
                headers,
                ..
            } => {
                send_local(details, body, headers);
                Action::Pause
            }
            Mode::Body { dst } => {
                let args = filter_state_args(ORIGINAL_DST_KEY, dst);
                if let Err(s) =
                    hostcalls::call_foreign_function("set_envoy_filter_state", Some(&args))
                {
                    log_status("set_envoy_filter_state", s);
                }
                Action::Continue
            }
            Mode::BodyRead { key } => {
                let _ = read_body_ends(body_size);
                set_key(key);
                Action::Continue
            }
            Mode::BodyKey { field } => {
                let tail = read_body_ends(body_size);
                let key = match tail.as_deref().and_then(|t| last_string_member(t, field)) {
                    Some(v) => format!("{:016x}", xxh3_64(v)),
                    None => BODY_KEY_MISSING.to_owned(),
                };
                set_key(&key);
                Action::Continue
            }
            Mode::BodyState { key } => {
                set_key(key);
                Action::Continue
            }
            Mode::Probe => {
                self.get_status = Some(raw::get_request_header(":path"));
                self.set_status = Some(raw::replace_request_header("x-floor-probe", "1"));
                Action::Continue
            }
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _eos: bool) -> Action {
        if let Mode::Local { .. } = self.mode {
            let seen = local_seen();
            if let Err(s) = hostcalls::add_map_value(
                MapType::HttpResponseHeaders,
                "x-floor-response-seen",
                &seen,
            ) {
                log_status("add x-floor-response-seen", s);
            }
        }
        if let Mode::Probe = self.mode {
            let report = [
                ("x-floor-body-calls", self.body_calls.to_string()),
                ("x-floor-body-size", self.body_size.to_string()),
                ("x-floor-get-status", status_text(self.get_status)),
                ("x-floor-set-status", status_text(self.set_status)),
            ];
            for (name, value) in report {
                if let Err(s) =
                    hostcalls::set_map_value(MapType::HttpResponseHeaders, name, Some(&value))
                {
                    log_status(name, s);
                }
            }
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        if let Mode::Local { .. } = self.mode {
            log_local_end();
        }
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if let Mode::Local { .. } = self.mode {
            self.response_body = body_size;
            if !end_of_stream {
                return Action::Pause;
            }
            // Same length, so the content-length Envoy already sent stays right.
            let body = hostcalls::get_buffer(
                proxy_wasm::types::BufferType::HttpResponseBody,
                0,
                body_size,
            )
            .ok()
            .flatten()
            .unwrap_or_default();
            if let Err(s) = hostcalls::set_buffer(
                proxy_wasm::types::BufferType::HttpResponseBody,
                0,
                body_size,
                &body.to_ascii_uppercase(),
            ) {
                log_status("set response body", s);
            }
        }
        Action::Continue
    }
}

/// Logs what the stream's last callback sees (mode `local`): `floor local: log
/// code=… details=…`.
fn log_local_end() {
    let prop = |path: Vec<&str>| {
        hostcalls::get_property(path)
            .ok()
            .flatten()
            .unwrap_or_default()
    };
    let code = prop(vec!["response", "code"]);
    let code = <[u8; 8]>::try_from(code.as_slice()).map_or(-1, i64::from_le_bytes);
    let details = String::from_utf8_lossy(&prop(vec!["response", "code_details"])).into_owned();
    let _ = hostcalls::log(
        LogLevel::Info,
        &format!("floor local: log code={code} details={details}"),
    );
}

/// What the response-header callback sees of a local reply:
/// `status=…;details=…;local=…;names=<sorted names>`.
fn local_seen() -> String {
    let get = |name: &str| {
        hostcalls::get_map_value(MapType::HttpResponseHeaders, name)
            .ok()
            .flatten()
            .unwrap_or_else(|| "-".to_owned())
    };
    let details = hostcalls::get_property(vec!["response", "code_details"])
        .ok()
        .flatten()
        .map_or_else(
            || "-".to_owned(),
            |d| String::from_utf8_lossy(&d).into_owned(),
        );
    let mut names: Vec<String> = hostcalls::get_map(MapType::HttpResponseHeaders)
        .map(|m| m.into_iter().map(|(k, _)| k).collect())
        .unwrap_or_default();
    names.sort();
    format!(
        "status={};details={details};local={};names={}",
        get(":status"),
        get("x-floor-local"),
        names.join(",")
    )
}

fn status_text(status: Option<u32>) -> String {
    status.map_or_else(|| "none".to_owned(), |s| s.to_string())
}

fn log_status(what: &str, status: Status) {
    let _ = hostcalls::log(
        LogLevel::Warn,
        &format!("floor filter: {what} failed: {status:?}"),
    );
}

/// Protobuf `SetEnvoyFilterStateArguments{path=1, value=2}`; `span=3` is left at
/// its default (0, FilterChain), which proto3 encodes by omission.
fn filter_state_args(path: &str, value: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.len() + value.len() + 8);
    for (tag, field) in [(0x0a_u8, path), (0x12_u8, value)] {
        out.push(tag);
        let mut len = field.len();
        while len >= 0x80 {
            out.push((len as u8 & 0x7f) | 0x80);
            len >>= 7;
        }
        out.push(len as u8);
        out.extend_from_slice(field.as_bytes());
    }
    out
}

/// Header calls that report the raw host status: the SDK's wrappers panic on
/// any status but `Ok`, and the probe exists to observe exactly those statuses.
mod raw {
    use proxy_wasm::types::MapType;

    #[link(wasm_import_module = "env")]
    unsafe extern "C" {
        fn proxy_get_header_map_value(
            map_type: MapType,
            key_data: *const u8,
            key_size: usize,
            return_value_data: *mut *mut u8,
            return_value_size: *mut usize,
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
        fn proxy_replace_header_map_value(
            map_type: MapType,
            key_data: *const u8,
            key_size: usize,
            value_data: *const u8,
            value_size: usize,
        ) -> u32;
    }

    /// `proxy_send_local_response` with details (the SDK's wrapper sends none).
    pub fn send_local_response(
        status: u32,
        details: &str,
        body: &[u8],
        headers: &[(String, String)],
    ) {
        let mut map = Vec::new();
        map.extend_from_slice(&(headers.len() as u32).to_le_bytes());
        for (k, v) in headers {
            map.extend_from_slice(&(k.len() as u32).to_le_bytes());
            map.extend_from_slice(&(v.len() as u32).to_le_bytes());
        }
        for (k, v) in headers {
            map.extend_from_slice(k.as_bytes());
            map.push(0);
            map.extend_from_slice(v.as_bytes());
            map.push(0);
        }
        // SAFETY: the host only reads the byte ranges passed, all live for the call.
        let _ = unsafe {
            proxy_send_local_response(
                status,
                details.as_ptr(),
                details.len(),
                body.as_ptr(),
                body.len(),
                map.as_ptr(),
                map.len(),
                -1,
            )
        };
    }

    pub fn get_request_header(name: &str) -> u32 {
        let mut data: *mut u8 = std::ptr::null_mut();
        let mut size: usize = 0;
        // SAFETY: the host reads `name` within its length and writes the two
        // out-pointers, which point at live locals.
        let status = unsafe {
            proxy_get_header_map_value(
                MapType::HttpRequestHeaders,
                name.as_ptr(),
                name.len(),
                &mut data,
                &mut size,
            )
        };
        if !data.is_null() {
            // SAFETY: on success the host returns a buffer it allocated through
            // `proxy_on_memory_allocate` (a `Vec<u8>` of capacity `size`).
            drop(unsafe { Vec::from_raw_parts(data, size, size) });
        }
        status
    }

    pub fn replace_request_header(name: &str, value: &str) -> u32 {
        // SAFETY: the host only reads the two byte ranges, both live for the call.
        unsafe {
            proxy_replace_header_map_value(
                MapType::HttpRequestHeaders,
                name.as_ptr(),
                name.len(),
                value.as_ptr(),
                value.len(),
            )
        }
    }
}
