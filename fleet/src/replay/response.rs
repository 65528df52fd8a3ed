//! Reading an answer, per API: usage (prompt, cached, output tokens), the
//! rank's simulated timing (`usage.tether`, `x-tether-sim-*`), rank identity,
//! and for streams the arrival times of content deltas (the client's clock,
//! used when the server reports no simulated times). Pure: bytes and
//! timestamps in, numbers out.

use crate::report::observe::{Clock, Served, Timing};
use crate::trace::Api;
use serde_json::Value;

/// Response headers the reader uses (lower-case names).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Headers {
    /// `x-tether-rank`.
    pub rank: Option<String>,
    /// `x-tether-rank-dp`.
    pub dp_rank: Option<u32>,
    /// `x-tether-sim-ttft-ms`.
    pub sim_ttft_ms: Option<f64>,
    /// `x-tether-sim-e2e-ms`.
    pub sim_e2e_ms: Option<f64>,
    /// `x-tether-sim-itl-ms`.
    pub sim_itl_ms: Option<f64>,
    /// `x-tether-sim-queue-ms`.
    pub sim_queue_ms: Option<f64>,
    /// `x-envoy-attempt-count`.
    pub attempts: Option<u32>,
}

impl Headers {
    /// Picks the headers it knows from `(name, value)` pairs.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Self {
        use tether_wire::headers::reply;
        let mut h = Headers::default();
        for (k, v) in pairs {
            let Ok(v) = std::str::from_utf8(v) else {
                continue;
            };
            let v = v.trim();
            match k {
                reply::RANK => h.rank = Some(v.to_owned()),
                reply::DP_RANK => h.dp_rank = v.parse().ok(),
                reply::SIM_TTFT_MS => h.sim_ttft_ms = v.parse().ok(),
                reply::SIM_E2E_MS => h.sim_e2e_ms = v.parse().ok(),
                reply::SIM_ITL_MS => h.sim_itl_ms = v.parse().ok(),
                reply::SIM_QUEUE_MS => h.sim_queue_ms = v.parse().ok(),
                "x-envoy-attempt-count" => h.attempts = v.parse().ok(),
                _ => {}
            }
        }
        h
    }
}

/// Client-clock times of one exchange, ms since the request was sent.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClientTimes {
    /// First content delta (streams) or the whole body (non-streaming).
    pub first_ms: Option<f64>,
    /// Last content delta.
    pub last_ms: Option<f64>,
    /// Content deltas seen.
    pub deltas: u64,
    /// End of the body.
    pub end_ms: f64,
}

/// Usage as the API reports it, normalized.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Usage {
    /// Prompt tokens (Anthropic: input + cache reads + cache writes).
    pub prompt: u64,
    /// Cached prompt tokens.
    pub cached: u64,
    /// Output tokens.
    pub output: u64,
    /// `usage.tether`, when present.
    pub tether: Option<Value>,
}

fn u(v: &Value, path: &[&str]) -> Option<u64> {
    let mut x = v;
    for p in path {
        x = x.get(p)?;
    }
    x.as_u64()
}

/// Normalizes a usage object of `api`; `None` when it lacks the prompt count.
pub fn usage(api: Api, v: &Value) -> Option<Usage> {
    let tether = v.get("tether").filter(|t| t.is_object()).cloned();
    match api {
        Api::Chat | Api::Completions => Some(Usage {
            prompt: u(v, &["prompt_tokens"])?,
            cached: u(v, &["prompt_tokens_details", "cached_tokens"]).unwrap_or(0),
            output: u(v, &["completion_tokens"]).unwrap_or(0),
            tether,
        }),
        Api::Responses => Some(Usage {
            prompt: u(v, &["input_tokens"])?,
            cached: u(v, &["input_tokens_details", "cached_tokens"]).unwrap_or(0),
            output: u(v, &["output_tokens"]).unwrap_or(0),
            tether,
        }),
        Api::Messages => {
            let read = u(v, &["cache_read_input_tokens"]).unwrap_or(0);
            let write = u(v, &["cache_creation_input_tokens"]).unwrap_or(0);
            Some(Usage {
                prompt: u(v, &["input_tokens"])? + read + write,
                cached: read,
                output: u(v, &["output_tokens"]).unwrap_or(0),
                tether,
            })
        }
    }
}

/// The usage object of a non-streaming body.
pub fn body_usage(api: Api, body: &[u8]) -> Option<Usage> {
    let v: Value = serde_json::from_slice(body).ok()?;
    usage(api, v.get("usage")?)
}

/// One server-sent event.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// `event:` name, if any.
    pub name: Option<String>,
    /// `data:` lines joined with `\n`.
    pub data: String,
}

/// Splits an SSE byte stream into events as bytes arrive.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
}

impl SseParser {
    /// Feeds bytes; returns the events they completed.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Event> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some((end, sep)) = find_blank_line(&self.buf) {
            let block: Vec<u8> = self.buf.drain(..end + sep).collect();
            if let Some(e) = parse_event(&block[..end]) {
                out.push(e);
            }
        }
        out
    }

    /// The last event when the stream ends without a blank line.
    pub fn finish(&mut self) -> Option<Event> {
        let block = std::mem::take(&mut self.buf);
        parse_event(&block)
    }
}

fn find_blank_line(b: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i + 1 < b.len() {
        if b[i] == b'\n' && b[i + 1] == b'\n' {
            return Some((i, 2));
        }
        if b[i] == b'\n' && b[i + 1] == b'\r' && b.get(i + 2) == Some(&b'\n') {
            return Some((i, 3));
        }
        i += 1;
    }
    None
}

fn parse_event(block: &[u8]) -> Option<Event> {
    let text = String::from_utf8_lossy(block);
    let mut name = None;
    let mut data: Vec<&str> = Vec::new();
    for line in text.lines() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if let Some(v) = line.strip_prefix("event:") {
            name = Some(v.trim().to_owned());
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push(v.strip_prefix(' ').unwrap_or(v));
        }
    }
    if data.is_empty() && name.is_none() {
        return None;
    }
    Some(Event {
        name,
        data: data.join("\n"),
    })
}

/// Follows one API's event stream: content deltas (with their times) and the final usage.
#[derive(Debug)]
pub struct StreamReader {
    api: Api,
    /// Client times so far.
    pub times: ClientTimes,
    /// The final usage, once seen.
    pub usage: Option<Usage>,
    /// The stream ended properly (`[DONE]`, `response.completed`, `message_stop`).
    pub finished: bool,
}

impl StreamReader {
    /// For `api`.
    pub fn new(api: Api) -> Self {
        Self {
            api,
            times: ClientTimes::default(),
            usage: None,
            finished: false,
        }
    }

    fn delta(&mut self, at_ms: f64) {
        self.times.first_ms.get_or_insert(at_ms);
        self.times.last_ms = Some(at_ms);
        self.times.deltas += 1;
    }

    /// Takes one event that arrived `at_ms` after sending.
    pub fn event(&mut self, e: &Event, at_ms: f64) {
        if e.data == "[DONE]" {
            self.finished = true;
            return;
        }
        let Ok(v) = serde_json::from_str::<Value>(&e.data) else {
            return;
        };
        match self.api {
            Api::Chat | Api::Completions => {
                let choice = v.get("choices").and_then(|c| c.get(0));
                let text = choice.and_then(|c| {
                    c.get("delta")
                        .and_then(|d| d.get("content"))
                        .or_else(|| c.get("text"))
                        .and_then(Value::as_str)
                });
                if text.is_some_and(|t| !t.is_empty()) {
                    self.delta(at_ms);
                }
                if let Some(us) = v.get("usage").filter(|x| x.is_object()) {
                    self.usage = usage(self.api, us);
                }
            }
            Api::Responses => {
                let kind = e
                    .name
                    .as_deref()
                    .or_else(|| v.get("type").and_then(Value::as_str));
                match kind {
                    Some("response.output_text.delta") => self.delta(at_ms),
                    Some("response.completed") => {
                        self.finished = true;
                        if let Some(us) = v.get("response").and_then(|r| r.get("usage")) {
                            self.usage = usage(self.api, us);
                        }
                    }
                    _ => {}
                }
            }
            Api::Messages => {
                let kind = e
                    .name
                    .as_deref()
                    .or_else(|| v.get("type").and_then(Value::as_str));
                match kind {
                    Some("message_start") => {
                        if let Some(us) = v.get("message").and_then(|m| m.get("usage")) {
                            self.usage = usage(self.api, us);
                        }
                    }
                    Some("content_block_delta") => self.delta(at_ms),
                    Some("message_delta") => {
                        if let Some(us) = v.get("usage") {
                            // Anthropic's message_delta usage may carry only output_tokens.
                            match (usage(self.api, us), &mut self.usage) {
                                (Some(full), _) => self.usage = Some(full),
                                (None, Some(prev)) => {
                                    if let Some(o) = u(us, &["output_tokens"]) {
                                        prev.output = o;
                                    }
                                }
                                (None, None) => {}
                            }
                        }
                    }
                    Some("message_stop") => self.finished = true,
                    _ => {}
                }
            }
        }
    }
}

/// Assembles what a served request reported. Simulated times win when the
/// server gives them (`usage.tether`, else the `x-tether-sim-*` headers);
/// otherwise the client's clock: TTFT = first content delta (a non-streaming
/// answer: the whole body), ITL = spread of the deltas, E2E = end of body.
pub fn served(u: Usage, h: &Headers, times: &ClientTimes) -> Served {
    let t = u.tether.as_ref();
    let tf = |k: &str| t.and_then(|t| t.get(k)).and_then(Value::as_f64);
    let tu = |k: &str| t.and_then(|t| t.get(k)).and_then(Value::as_u64);
    let sim_ttft = tf("sim_ttft_ms").or(h.sim_ttft_ms);
    let sim_e2e = tf("sim_e2e_ms").or(h.sim_e2e_ms);
    let timing = match (sim_ttft, sim_e2e) {
        (Some(ttft), Some(e2e)) => Timing {
            clock: Clock::Simulated,
            ttft_ms: ttft,
            itl_ms: tf("sim_itl_ms").or(h.sim_itl_ms).filter(|_| u.output > 1),
            e2e_ms: e2e,
            queue_ms: tf("sim_queue_ms").or(h.sim_queue_ms),
        },
        _ => {
            let first = times.first_ms.unwrap_or(times.end_ms);
            let itl = match (times.first_ms, times.last_ms) {
                (Some(a), Some(b)) if times.deltas > 1 => Some((b - a) / (times.deltas - 1) as f64),
                _ => None,
            };
            Timing {
                clock: Clock::Client,
                ttft_ms: first,
                itl_ms: itl,
                e2e_ms: times.end_ms,
                queue_ms: None,
            }
        }
    };
    Served {
        prompt_tokens: u.prompt,
        cached_tokens: u.cached.min(u.prompt),
        output_tokens: u.output,
        device_cached_tokens: tu("device_cached_tokens"),
        restored_tokens: tu("restored_tokens"),
        rank: h.rank.clone(),
        dp_rank: h
            .dp_rank
            .or_else(|| tu("dp_rank").and_then(|d| u32::try_from(d).ok())),
        attempts: h.attempts.unwrap_or(1).max(1),
        timing,
    }
}

#[cfg(test)]
mod tests;
