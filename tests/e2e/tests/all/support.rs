//! Shared test helpers: artifact checks that never skip, rank fleets, plugin configs.

use serde_json::{Value, json};
use std::path::PathBuf;
use tether_e2e::agent::Conversation;
use tether_e2e::prometheus::Metrics;
use tether_e2e::{
    EchoRank, EchoReply, Envoy, EnvoyBuilder, HttpClient, Request, Response, bootstrap, paths,
};

pub use tether_e2e::paths::need;

/// Envoy and the tether filter module, or a panic naming the fix.
pub fn need_envoy_and_filter() {
    need(paths::require_envoy());
    need(paths::require_filter_wasm());
}

/// Envoy and the floor filter module.
pub fn need_envoy_and_floor() {
    need(paths::require_envoy());
    need(paths::require_floor_wasm());
}

/// The echo-rank binary Cargo built for these tests.
pub fn echo_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tether-echo-rank"))
}

/// Starts `n` echo ranks named `rank-a`, `rank-b`, ….
pub fn ranks(n: usize) -> Vec<EchoRank> {
    (0..n)
        .map(|i| {
            let name = format!("rank-{}", (b'a' + i as u8) as char);
            EchoRank::start_with(
                &echo_bin(),
                &name,
                "127.0.0.1:0".parse().expect("literal address"),
            )
            .unwrap_or_else(|e| panic!("starting {name}: {e}"))
        })
        .collect()
}

/// A builder with `RANK_<i>_IP/PORT` set for these ranks.
pub fn builder_for(ranks: &[EchoRank]) -> EnvoyBuilder {
    bootstrap::rank_vars(ranks)
        .into_iter()
        .fold(tether_e2e::Envoy::builder(), |b, (k, v)| b.var(k, v))
}

/// Pick-mode endpoints for these ranks (`dp_size` per rank).
pub fn endpoints(ranks: &[EchoRank], dp: &[u32]) -> serde_json::Value {
    serde_json::Value::Array(
        ranks
            .iter()
            .zip(dp.iter().chain(std::iter::repeat(&1)))
            .map(|(r, d)| serde_json::json!({"address": r.addr().to_string(), "weight": 1, "dp_size": d}))
            .collect(),
    )
}

/// Where a request landed: the rank's name and the DP rank it was given.
pub fn place(e: &EchoReply) -> String {
    match e.header("x-data-parallel-rank") {
        Some(dp) => format!("{}/dp{dp}", e.rank),
        None => e.rank.clone(),
    }
}

/// Echo ranks behind one Envoy running the tether filter.
pub struct Fleet {
    pub ranks: Vec<EchoRank>,
    pub envoy: Envoy,
    pub client: HttpClient,
}

impl Fleet {
    /// `n` ranks, pick mode (`dp` sizes per rank, default 1), `extra` merged
    /// into the plugin configuration, on `bootstrap` with `vars`.
    pub fn pick(
        bootstrap: &str,
        n: usize,
        dp: &[u32],
        extra: Value,
        vars: &[(&str, &str)],
    ) -> Fleet {
        need_envoy_and_filter();
        let ranks = ranks(n);
        let mut cfg = json!({"mode": "pick", "endpoints": endpoints(&ranks, dp)});
        merge(&mut cfg, extra);
        Self::start(ranks, bootstrap, &cfg, vars)
    }

    /// `n` ranks, hash mode.
    pub fn hash(n: usize, extra: Value) -> Fleet {
        need_envoy_and_filter();
        let ranks = ranks(n);
        let mut cfg = json!({"mode": "hash"});
        merge(&mut cfg, extra);
        Self::start(ranks, tether_e2e::bootstrap::HASH, &cfg, &[])
    }

    /// Starts Envoy for these ranks with this plugin configuration — with
    /// every output on (`"outputs": "all"`) unless it names its own: the tests
    /// look at every marker. The harness aligns the bootstrap's
    /// `header_mutation` entries to the outputs and checks the chain.
    pub fn start(
        ranks: Vec<EchoRank>,
        bootstrap: &str,
        cfg: &Value,
        vars: &[(&str, &str)],
    ) -> Fleet {
        let mut cfg = cfg.clone();
        if let Some(o) = cfg.as_object_mut() {
            o.entry("outputs").or_insert(json!("all"));
        }
        let cfg = &cfg;
        let builder = vars
            .iter()
            .fold(builder_for(&ranks).plugin_config(cfg), |b, (k, v)| {
                b.var(*k, *v)
            });
        let envoy = builder
            .start(bootstrap)
            .unwrap_or_else(|e| panic!("envoy starts with {cfg}: {e}"));
        Fleet {
            ranks,
            envoy,
            client: HttpClient::new(),
        }
    }

    /// Sends and returns the raw response (any status).
    pub async fn raw(&self, req: Request) -> Response {
        self.client
            .send(self.envoy.listen_addr(), req)
            .await
            .unwrap_or_else(|e| panic!("no answer: {e}"))
    }

    /// Sends, asserts 200 from a rank, returns what the rank saw.
    pub async fn echo(&self, req: Request) -> EchoReply {
        echo_of(self.raw(req).await)
    }

    /// The rank with this name.
    pub fn rank(&self, name: &str) -> &EchoRank {
        self.ranks
            .iter()
            .find(|r| r.name() == name)
            .unwrap_or_else(|| panic!("no rank {name}"))
    }

    /// Scrapes `/stats/prometheus`, after the filter's counts reached Envoy
    /// (it hands them over once a second, on its root context's tick).
    pub fn metrics(&self) -> Metrics {
        std::thread::sleep(std::time::Duration::from_millis(1300));
        self.envoy
            .prometheus()
            .unwrap_or_else(|e| panic!("scraping /stats/prometheus: {e}"))
    }
}

/// Asserts a 200 from a rank and decodes its echo.
#[track_caller]
pub fn echo_of(resp: Response) -> EchoReply {
    assert_eq!(
        resp.status,
        200,
        "status; body: {}",
        String::from_utf8_lossy(&resp.body[..resp.body.len().min(500)])
    );
    resp.echo()
        .unwrap_or_else(|e| panic!("not an echo reply: {e}"))
}

/// Shallow merge of object `extra` into `base`.
pub fn merge(base: &mut Value, extra: Value) {
    if let (Some(b), Value::Object(e)) = (base.as_object_mut(), extra) {
        b.extend(e);
    }
}

/// A request from a Claude Code-style harness: session (and subagent) in headers.
pub fn header_turn(conv: &Conversation, session: &str, agent: Option<&str>) -> Request {
    let req = Request::post_bytes(conv.api().path(), "application/json", conv.body(&[]))
        .header("x-claude-code-session-id", session);
    match agent {
        Some(a) => req.header("x-claude-code-agent-id", a),
        None => req,
    }
}

/// A request whose only identity is a body field (`prompt_cache_key` etc.).
pub fn body_turn(conv: &Conversation, identity: &[(&str, Value)]) -> Request {
    Request::post_bytes(conv.api().path(), "application/json", conv.body(identity))
}

/// The value of a counter whose name contains `needle` (summed over matches).
pub fn counter(m: &Metrics, needle: &str) -> f64 {
    m.sum(needle)
}

/// Envoy on the bootstrap `tether gateway` renders for these echo ranks
/// (`names`: each rank's name as its stable identity); `tune` adjusts the
/// spec (timeouts, ejection) before rendering.
pub fn gateway(
    mode: tether_envoy::Mode,
    ranks: &[EchoRank],
    names: bool,
    tune: impl FnOnce(&mut tether_envoy::GatewaySpec),
) -> Envoy {
    need_envoy_and_filter();
    let mut spec = tether_envoy::GatewaySpec {
        mode,
        ranks: ranks.iter().map(EchoRank::addr).collect(),
        dp_size: 1,
        plugin_config: serde_json::Map::new(),
        filter_wasm: need(paths::require_filter_wasm()).display().to_string(),
        listen: "127.0.0.1:0".parse().expect("literal"),
        admin: "127.0.0.1:0".parse().expect("literal"),
        retries: 2,
        hash_balance_factor: None,
        rank_names: if names {
            ranks.iter().map(|r| Some(r.name().to_owned())).collect()
        } else {
            Vec::new()
        },
        timeouts: tether_envoy::Timeouts::default(),
        eject_after: 5,
        eject_for_s: 30,
    };
    tune(&mut spec);
    let yaml = tether_envoy::render(&spec).unwrap_or_else(|e| panic!("rendering: {e}"));
    Envoy::builder()
        .log_level("warning")
        .start(&yaml)
        .unwrap_or_else(|e| {
            panic!(
                "envoy starts on the rendered {} bootstrap: {e}",
                mode.name()
            )
        })
}

/// Scrapes `/stats/prometheus` after the filter's once-a-second counter flush.
pub fn metrics_of(envoy: &Envoy) -> Metrics {
    std::thread::sleep(std::time::Duration::from_millis(1300));
    envoy
        .prometheus()
        .unwrap_or_else(|e| panic!("scraping /stats/prometheus: {e}"))
}
