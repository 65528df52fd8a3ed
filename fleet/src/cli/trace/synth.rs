//! `tether trace synth`: the HTTP requests a replay would send for a trace, for inspection.

use super::import::parse_api;
use crate::cli::input::TraceArgs;
use crate::synth::{Identity, SessionSynth, SynthOptions};
use crate::trace::{Api, SessionId};
use anyhow::{Result, bail};
use clap::Args as ClapArgs;
use serde::Serialize;
use serde_json::value::RawValue;
use std::io::Write;

/// The synthesis flags `tether trace synth` and `tether replay` share.
#[derive(Debug, Clone, ClapArgs)]
pub struct SynthArgs {
    /// Send every request with this API (default: each request's own).
    #[arg(long, value_parser = parse_api)]
    pub api: Option<Api>,
    /// How identity is sent: none, claude-code, session-affinity, dynamo, prompt-cache-key, metadata.
    #[arg(long, default_value = "none", value_parser = Identity::parse)]
    pub identity: Identity,
    /// Model for requests the trace names none for.
    #[arg(long, default_value = "tether-model")]
    pub model: String,
    /// Ask for streamed responses.
    #[arg(long)]
    pub stream: bool,
    /// Ask for exactly the trace's output tokens (vLLM `ignore_eos` + `min_tokens`).
    #[arg(long)]
    pub exact_output: bool,
    /// Mixed into every session and agent id (another replay of the same trace).
    #[arg(long, default_value = "")]
    pub salt: String,
    /// Send each session's tenant in this header.
    #[arg(long)]
    pub tenant_header: Option<String>,
}

impl SynthArgs {
    /// The synthesis options these flags say.
    pub fn options(&self) -> SynthOptions {
        SynthOptions {
            identity: self.identity,
            api: self.api,
            model: self.model.clone(),
            stream: self.stream,
            exact_output: self.exact_output,
            salt: self.salt.clone(),
            tenant_header: self.tenant_header.clone(),
        }
    }
}

/// `tether trace synth`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// The trace and its format.
    #[command(flatten)]
    pub input: TraceArgs,
    /// Only this session (its id in the trace).
    #[arg(long)]
    pub session: Option<String>,
    /// At most this many requests.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Request synthesis.
    #[command(flatten)]
    pub synth: SynthArgs,
    /// Print only the number of requests and body bytes (a synthesis speed check).
    #[arg(long)]
    pub summary: bool,
}

/// One printed request (the body as sent, key order kept).
#[derive(Serialize)]
struct Line<'a> {
    session: &'a str,
    agent: &'a str,
    turn: usize,
    opened_by: &'static str,
    method: &'static str,
    path: &'static str,
    headers: serde_json::Map<String, serde_json::Value>,
    body: &'a RawValue,
}

/// Runs it: one JSON line per request (`session`, `agent`, `turn`,
/// `opened_by`, `method`, `path`, `headers`, `body`).
pub fn run(a: Args) -> Result<()> {
    let trace = a.input.read()?;
    let opts = a.synth.options();
    let sessions: Vec<SessionId> = match &a.session {
        Some(id) => match trace.sessions().iter().position(|s| &s.id == id) {
            Some(i) => vec![SessionId(i as u32)],
            None => bail!("no session `{id}` in {}", a.input.path().display()),
        },
        None => (0..trace.sessions().len() as u32).map(SessionId).collect(),
    };
    let limit = a.limit.unwrap_or(usize::MAX);
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::new(out.lock());
    let (mut n, mut bytes) = (0usize, 0usize);
    let started = std::time::Instant::now();
    'all: for s in sessions {
        for (r, http) in SessionSynth::new(&trace, s, opts.clone()) {
            if n == limit {
                break 'all;
            }
            n += 1;
            bytes += http.body.len();
            if a.summary {
                continue;
            }
            let req = trace.request(r);
            let body = RawValue::from_string(String::from_utf8(http.body)?)?;
            serde_json::to_writer(
                &mut out,
                &Line {
                    session: &trace.session(req.session).id,
                    agent: &trace.agent(req.agent).id,
                    turn: trace.turn_of(r),
                    opened_by: req.opened_by.name(),
                    method: http.method,
                    path: http.path,
                    headers: http
                        .headers
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone().into()))
                        .collect(),
                    body: &body,
                },
            )?;
            out.write_all(b"\n")?;
        }
    }
    out.flush()?;
    if a.summary {
        let secs = started.elapsed().as_secs_f64();
        println!(
            "{n} requests, {:.1} MB of bodies in {secs:.2} s ({:.0} requests/s, {:.0} MB/s)",
            bytes as f64 / 1e6,
            n as f64 / secs,
            bytes as f64 / 1e6 / secs
        );
    }
    Ok(())
}
