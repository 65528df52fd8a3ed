//! The output set: headers (or, on the body path, filter-state values that
//! Envoy copies into headers) handed to the rank for one decision.

use crate::config::outputs::{Output, Sink};
use crate::config::{Config, Mode};
use crate::place::{Placed, Pools, Prefill};
use crate::read::Reading;
use crate::read::identity::{hex16, hex16_bytes};
use crate::read::turn::TurnKind;

/// Output header names: the wire contract's.
pub use tether_wire::headers as names;

/// Filter-state key (without Envoy's `wasm.` prefix) carrying `header` on the body path.
pub fn state_key(header: &str) -> String {
    format!("tether.{header}")
}

/// The request headers of a decision, in a stable order: each (name, value)
/// is handed to `emit` from stack buffers. The header path sets them straight
/// into Envoy's map, so it pays no allocation or formatting per header.
pub fn for_each_request_header(
    cfg: &Config,
    pools: &Pools,
    read: &Reading,
    placed: &Placed,
    mut emit: impl FnMut(&'static str, &[u8]),
) {
    let out = cfg.outputs;
    let id = &read.identity;
    let key = hex16_bytes(read.key);
    if out.has(Output::Key) {
        emit(names::KEY, &key);
    }
    if out.has(Output::KeySource) {
        emit(names::KEY_SOURCE, read.source.as_bytes());
    }
    if out.has(Output::Tenant) {
        emit(names::TENANT, &hex16_bytes(id.tenant_hash()));
    }
    if out.has(Output::Session) {
        emit(names::SESSION, &hex16_bytes(id.session_hash()));
    }
    if out.has(Output::Subagent) {
        emit(names::SUBAGENT, &hex16_bytes(id.subagent_hash()));
    }
    if let (true, Some(p)) = (out.has(Output::Parent), id.parent_hash()) {
        emit(names::PARENT, &hex16_bytes(p));
    }
    for_each_marker(cfg, read, |o, value| {
        if out.has(o)
            && let Sink::Header(name) = o.sink()
        {
            emit(name, value);
        }
    });
    if let (Mode::Pick, Some(p)) = (cfg.mode, &placed.pick) {
        if out.has(Output::Destination) {
            emit(names::DESTINATION, pools.decode.destination(p).as_bytes());
        }
        if out.has(Output::DpRank) {
            emit(names::DP_RANK, Decimal::new(u64::from(p.rank)).as_bytes());
        }
        let prefiller = match placed.prefill {
            Prefill::Remote(i) => pools.prefill.as_ref().and_then(|pp| pp.endpoints().get(i)),
            Prefill::Holder(i) => pools.decode.endpoints().get(i),
            Prefill::Off | Prefill::Local | Prefill::Pull(_) => None,
        };
        if let (true, Some(e)) = (out.has(Output::Prefiller), prefiller) {
            emit(names::PREFILLER, e.address.as_bytes());
        }
        if let (true, Prefill::Pull(i)) = (out.has(Output::PullFrom), placed.prefill)
            && let Some(e) = pools.decode.endpoints().get(i)
        {
            emit(names::PULL_FROM, e.address.as_bytes());
        }
    }
    if out.has(Output::SessionId) {
        emit(names::SESSION_ID, &key);
    }
}

/// The turn markers of a decision as (output, value): prompt end, kind,
/// count, interval — whichever are known. Header-path decisions carry a
/// prompt end without kind: the header fast path never reads the body, so it
/// cannot tell what ended the turn; but an agent request ends at a turn
/// boundary, and without this marker the engine would retain nothing for the
/// most common harnesses. The engine retains it with its default interval.
pub fn for_each_marker(cfg: &Config, read: &Reading, mut emit: impl FnMut(Output, &[u8])) {
    if read.turn.is_none() && read.header_path {
        emit(Output::PromptEnd, b"1");
    }
    if let Some(t) = read.turn {
        emit(Output::PromptEnd, if t.prompt_end { b"1" } else { b"0" });
        emit(Output::TurnKind, t.kind.name().as_bytes());
        if let Some(n) = t.count {
            emit(Output::Turn, Decimal::new(u64::from(n)).as_bytes());
        }
        emit(
            Output::RetentionMs,
            Decimal::new(retention(cfg, t.kind)).as_bytes(),
        );
    }
}

/// A decimal number written on the stack.
struct Decimal {
    digits: [u8; 20],
    start: usize,
}

impl Decimal {
    fn new(mut n: u64) -> Self {
        let mut digits = [b'0'; 20];
        let mut start = digits.len();
        loop {
            start -= 1;
            if let Some(d) = digits.get_mut(start) {
                *d = b'0' + (n % 10) as u8;
            }
            n /= 10;
            if n == 0 {
                break;
            }
        }
        Self { digits, start }
    }

    fn as_bytes(&self) -> &[u8] {
        self.digits.get(self.start..).unwrap_or_default()
    }
}

/// `retention_ms[kind]`.
pub fn retention(cfg: &Config, kind: TurnKind) -> u64 {
    cfg.retention_ms.get(kind)
}

/// `x-tether-debug` response value: `source=…;key=…;endpoint=…;rank=…;kind=…`.
pub fn debug_value(pools: &Pools, read: &Reading, placed: &Placed) -> String {
    let endpoint = placed
        .primary()
        .and_then(|i| pools.decode.endpoints().get(i))
        .map_or("-", |e| e.address.as_str());
    let rank = placed
        .pick
        .as_ref()
        .map_or_else(|| "-".to_owned(), |p| p.rank.to_string());
    let kind = read.turn.map_or("-", |t| t.kind.name());
    format!(
        "source={};key={};endpoint={endpoint};rank={rank};kind={kind};path={}",
        read.source,
        hex16(read.key),
        if read.header_path { "header" } else { "body" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_decimals_match_display() {
        for n in [
            0,
            7,
            10,
            99,
            1_000,
            86_400_000,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            assert_eq!(Decimal::new(n).as_bytes(), n.to_string().as_bytes());
        }
    }
}
