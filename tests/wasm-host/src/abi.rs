//! Numeric constants of the proxy-wasm ABI 0.2.1 as the host sees them.

use serde::Serialize;

/// Status codes a host call returns to the guest (`WasmResult` in Envoy).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[repr(u32)]
pub enum Status {
    Ok = 0,
    NotFound = 1,
    BadArgument = 2,
    SerializationFailure = 3,
    ParseFailure = 4,
    InvalidMemoryAccess = 6,
    Empty = 7,
    CasMismatch = 8,
    InternalFailure = 10,
    Unimplemented = 12,
}

impl Status {
    /// The value the guest receives.
    pub fn code(self) -> i32 {
        self as i32
    }
}

/// What a stream callback asks the host to do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Continue,
    Pause,
}

impl Action {
    /// 0.2.1 knows Continue (0) and Pause (1); Envoy treats every other value as
    /// a stop as well, so does this host.
    pub fn from_raw(raw: i32) -> Self {
        if raw == 0 {
            Action::Continue
        } else {
            Action::Pause
        }
    }
}

/// Header maps a guest can address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapType {
    RequestHeaders,
    RequestTrailers,
    ResponseHeaders,
    ResponseTrailers,
    HttpCallResponseHeaders,
    HttpCallResponseTrailers,
}

impl MapType {
    pub fn from_raw(raw: i32) -> Option<Self> {
        Some(match raw {
            0 => MapType::RequestHeaders,
            1 => MapType::RequestTrailers,
            2 => MapType::ResponseHeaders,
            3 => MapType::ResponseTrailers,
            6 => MapType::HttpCallResponseHeaders,
            7 => MapType::HttpCallResponseTrailers,
            _ => return None,
        })
    }
}

/// Byte buffers a guest can address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferType {
    RequestBody,
    ResponseBody,
    HttpCallResponseBody,
    VmConfiguration,
    PluginConfiguration,
}

impl BufferType {
    pub fn from_raw(raw: i32) -> Option<Self> {
        Some(match raw {
            0 => BufferType::RequestBody,
            1 => BufferType::ResponseBody,
            4 => BufferType::HttpCallResponseBody,
            6 => BufferType::VmConfiguration,
            7 => BufferType::PluginConfiguration,
            _ => return None,
        })
    }
}

/// Log levels, ordered as the ABI numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogLevel {
    Trace = 0,
    Debug = 1,
    Info = 2,
    Warn = 3,
    Error = 4,
    Critical = 5,
}

impl LogLevel {
    pub fn from_raw(raw: i32) -> Option<Self> {
        Some(match raw {
            0 => LogLevel::Trace,
            1 => LogLevel::Debug,
            2 => LogLevel::Info,
            3 => LogLevel::Warn,
            4 => LogLevel::Error,
            5 => LogLevel::Critical,
            _ => return None,
        })
    }
}

/// Metric kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
}

impl MetricType {
    pub fn from_raw(raw: i32) -> Option<Self> {
        Some(match raw {
            0 => MetricType::Counter,
            1 => MetricType::Gauge,
            2 => MetricType::Histogram,
            _ => return None,
        })
    }
}

/// Stream directions for `proxy_continue_stream` / `proxy_close_stream`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamType {
    Request,
    Response,
}

impl StreamType {
    pub fn from_raw(raw: i32) -> Option<Self> {
        match raw {
            0 => Some(StreamType::Request),
            1 => Some(StreamType::Response),
            _ => None,
        }
    }
}
