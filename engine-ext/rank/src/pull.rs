//! State pull (`docs/rank.md` "State pull"): a migrated key's new rank takes
//! the retained state from its old holder instead of recomputing it, and the
//! holder's engine schedules nothing for it — it only grants a lease on the
//! retained blocks. The protocol is the vLLM connector's (`docs/vllm.md`,
//! "State pull (NIXL)": `POST /pull/lease`, `/pull/renew`, `/pull/release`,
//! the same JSON); a block is named by `tether-rank`'s own chained block hash
//! (32 hex), which, like the connector's pull chain, is the same on every
//! rank for the same tokens and `cache_salt`.
//!
//! No bytes move: the grant lists the blocks (address 0, the block's bytes,
//! its hash for a checksum) and the puller times their transfer on its own
//! KV link (`SimRequest::kv_in_tokens`). This module holds the pure parts —
//! the lease table, the block match, the JSON of each call — and the
//! puller's two HTTP calls; `server::pull` wires them to the engines.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::Request;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tether_engine::BlockHash;

/// Paths of the lease calls (the connector's).
pub const LEASE: &str = "/pull/lease";
pub const RENEW: &str = "/pull/renew";
pub const RELEASE: &str = "/pull/release";

/// Most block hashes a lease request may carry (the connector's bound).
pub const MAX_HASHES: usize = 65_536;
/// Largest lease request or answer read, bytes (the connector's 4 MiB).
pub const MAX_BODY: usize = 4 << 20;

/// The lease request: the key's retained state, from block `start` of the
/// puller's chain `hashes` (the blocks before it are on the puller's device).
#[derive(Debug, Clone, PartialEq)]
pub struct Ask {
    /// Resident key (`tether_placement::resident_key`).
    pub key: u64,
    /// The puller's block hashes for its prompt's whole blocks, from block 0.
    pub hashes: Vec<BlockHash>,
    /// First block wanted.
    pub start: usize,
    /// The puller's model and KV shape; must equal the holder's.
    pub fingerprint: String,
    /// Free text for the holder's log.
    pub puller: String,
}

impl Ask {
    /// The request body.
    pub fn to_json(&self) -> Value {
        json!({
            "key": format!("{:016x}", self.key),
            "hashes": self.hashes.iter().map(|h| format!("{:032x}", h.0)).collect::<Vec<_>>(),
            "start": self.start,
            "fingerprint": self.fingerprint,
            "puller": self.puller,
        })
    }

    /// Reads a request body; `Err` says which member is wrong (a 400).
    pub fn from_json(body: &[u8]) -> Result<Ask, String> {
        let v: Value = serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
        let key = v["key"]
            .as_str()
            .filter(|k| (1..=16).contains(&k.len()))
            .and_then(|k| u64::from_str_radix(k, 16).ok())
            .ok_or("`key` must be 1-16 hex digits")?;
        let list = v["hashes"].as_array().ok_or("`hashes` must be an array")?;
        if list.len() > MAX_HASHES {
            return Err(format!("`hashes` holds more than {MAX_HASHES}"));
        }
        let hashes = list
            .iter()
            .map(block_hash)
            .collect::<Option<Vec<_>>>()
            .ok_or("`hashes` must be 32-hex-digit strings")?;
        let start = match &v["start"] {
            Value::Null => 0,
            s => s
                .as_u64()
                .and_then(|s| usize::try_from(s).ok())
                .ok_or("`start` must be a non-negative integer")?,
        };
        let text = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
        Ok(Ask {
            key,
            hashes,
            start,
            fingerprint: text("fingerprint"),
            puller: text("puller"),
        })
    }
}

/// One block hash as the calls spell it: 32 hex digits.
pub fn block_hash(v: &Value) -> Option<BlockHash> {
    v.as_str()
        .filter(|s| s.len() == 32)
        .and_then(|s| u128::from_str_radix(s, 16).ok())
        .map(BlockHash)
}

/// How many of the puller's blocks, from `start`, the holder's retained
/// chain `held` serves: the run of equal hashes from block 0 (a block is
/// served only when every token up to its end is the same), past `start`.
pub fn matched(held: &[BlockHash], ask: &[BlockHash], start: usize) -> usize {
    let same = held.iter().zip(ask).take_while(|(a, b)| a == b).count();
    same.saturating_sub(start)
}

/// Where the leased state lies on the holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    Device,
    Host,
}

impl Tier {
    pub fn name(self) -> &'static str {
        match self {
            Tier::Device => "device",
            Tier::Host => "host",
        }
    }
}

/// A granted lease as the puller reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    /// Lease id; `None` when nothing matched (no lease).
    pub lease: Option<String>,
    /// How long the lease holds from its grant, wall ms.
    pub lease_ms: u64,
    /// First block leased.
    pub start: usize,
    /// Blocks leased (from `start`).
    pub blocks: usize,
}

impl Grant {
    /// The answer body for `blocks` hashes from `start` under `lease`.
    pub fn answer(
        lease: Option<&str>,
        lease_ms: u64,
        start: usize,
        leased: &[BlockHash],
        block_bytes: u64,
        tier: Option<Tier>,
    ) -> Value {
        json!({
            "lease": lease,
            "lease_ms": lease_ms,
            "start": start,
            // No NIXL agent: tether-rank moves no bytes (docs/rank.md).
            "agent": "tether-rank",
            "metadata": "",
            "block_bytes": block_bytes,
            "blocks": leased.iter().map(|h| json!({
                "addr": 0, "len": block_bytes, "checksum": format!("{:032x}", h.0),
            })).collect::<Vec<_>>(),
            "tier": tier.map(Tier::name),
        })
    }

    /// Reads an answer body.
    pub fn from_json(body: &[u8]) -> Result<Grant, String> {
        let v: Value = serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
        let lease = match &v["lease"] {
            Value::Null => None,
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            _ => return Err("`lease` must be a string or null".into()),
        };
        let blocks = v["blocks"]
            .as_array()
            .ok_or("`blocks` must be an array")?
            .len();
        let num = |k: &str| v[k].as_u64().ok_or(format!("`{k}` must be an integer"));
        Ok(Grant {
            lease,
            lease_ms: num("lease_ms")?,
            start: usize::try_from(num("start")?).unwrap_or(usize::MAX),
            blocks,
        })
    }
}

/// One held lease.
#[derive(Debug, Clone, Copy)]
struct Lease {
    expires: Instant,
}

/// The holder's leases: granted, renewed, released, expired. A lease pins
/// nothing in the simulated engine (no bytes move; docs/rank.md "State pull").
#[derive(Debug)]
pub struct Leases {
    ttl: Duration,
    nonce: u64,
    next: AtomicU64,
    held: Mutex<HashMap<String, Lease>>,
    /// Counters: granted, empty (nothing matched), renewed, released,
    /// expired, refused (a bad call: 400, 405, 409, 413).
    pub granted: AtomicU64,
    pub empty: AtomicU64,
    pub renewed: AtomicU64,
    pub released: AtomicU64,
    pub expired: AtomicU64,
    pub refused: AtomicU64,
}

impl Leases {
    /// A table whose leases hold `ttl` from their grant or last renewal.
    pub fn new(ttl: Duration, nonce: u64) -> Self {
        Self {
            ttl,
            nonce,
            next: AtomicU64::new(1),
            held: Mutex::new(HashMap::new()),
            granted: AtomicU64::new(0),
            empty: AtomicU64::new(0),
            renewed: AtomicU64::new(0),
            released: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// Lease length, ms.
    pub fn ttl_ms(&self) -> u64 {
        u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX)
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Lease>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops expired leases (counted) as of `now`.
    fn sweep(&self, t: &mut HashMap<String, Lease>, now: Instant) {
        let before = t.len();
        t.retain(|_, l| l.expires > now);
        self.expired
            .fetch_add((before - t.len()) as u64, Ordering::Relaxed);
    }

    /// A new lease; its id.
    pub fn grant(&self, now: Instant) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let id = format!("{:016x}", n ^ self.nonce);
        let mut t = self.table();
        self.sweep(&mut t, now);
        t.insert(
            id.clone(),
            Lease {
                expires: now + self.ttl,
            },
        );
        self.granted.fetch_add(1, Ordering::Relaxed);
        id
    }

    /// Extends a live lease by the ttl from `now`; false when it expired or
    /// was released (or never was).
    pub fn renew(&self, id: &str, now: Instant) -> bool {
        let mut t = self.table();
        self.sweep(&mut t, now);
        let live = t.get_mut(id).map(|l| l.expires = now + self.ttl).is_some();
        if live {
            self.renewed.fetch_add(1, Ordering::Relaxed);
        }
        live
    }

    /// Ends a live lease; false when it expired or was released (or never was).
    pub fn release(&self, id: &str, now: Instant) -> bool {
        let mut t = self.table();
        self.sweep(&mut t, now);
        let live = t.remove(id).is_some();
        if live {
            self.released.fetch_add(1, Ordering::Relaxed);
        }
        live
    }

    /// Leases held now.
    pub fn active(&self, now: Instant) -> usize {
        let mut t = self.table();
        self.sweep(&mut t, now);
        t.len()
    }
}

/// Reads `{"lease": "<id>"}` (renew, release).
pub fn lease_id(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<Value>(body)
        .ok()?
        .get("lease")?
        .as_str()
        .filter(|s| !s.is_empty() && s.len() <= 64)
        .map(str::to_owned)
}

/// How one pull ended, as `tether_rank_pulls_total{outcome}` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Leased and transferred.
    Ok,
    /// The holder holds nothing of the prompt past what this rank has (no
    /// lease): the rest computed here.
    NotHeld,
    /// This rank has every whole block of the prompt already: nothing asked.
    HeldHere,
    /// The holder could not be reached, refused (non-200, another
    /// fingerprint) or answered something that is no grant: computed here.
    Failed,
    /// No answer within `--pull-timeout-ms`: computed here.
    Timeout,
    /// The lease would end before the transfer does: released, computed here.
    Expired,
}

impl Outcome {
    pub const ALL: [Outcome; 6] = [
        Outcome::Ok,
        Outcome::NotHeld,
        Outcome::HeldHere,
        Outcome::Failed,
        Outcome::Timeout,
        Outcome::Expired,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::NotHeld => "not_held",
            Outcome::HeldHere => "held_here",
            Outcome::Failed => "failed",
            Outcome::Timeout => "timeout",
            Outcome::Expired => "expired",
        }
    }
}

/// The HTTP client pulls are sent with (the prefill legs' type).
pub type Client = crate::pd::LegClient;

/// POSTs `body` to `to` at `path`, within `timeout`: (status, body).
pub async fn post(
    client: &Client,
    to: SocketAddr,
    path: &str,
    body: Vec<u8>,
    timeout: Duration,
) -> Result<(u16, Bytes), Outcome> {
    let call = async {
        let req = Request::builder()
            .method("POST")
            .uri(format!("http://{to}{path}"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|_| Outcome::Failed)?;
        let resp = client.request(req).await.map_err(|_| Outcome::Failed)?;
        let status = resp.status().as_u16();
        let bytes = Limited::new(resp.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|_| Outcome::Failed)?
            .to_bytes();
        Ok((status, bytes))
    };
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| Outcome::Timeout)?
}

/// Asks `to` for a lease; a grant with blocks, or why not.
pub async fn ask(
    client: &Client,
    to: SocketAddr,
    ask: &Ask,
    timeout: Duration,
) -> Result<Grant, Outcome> {
    let body = serde_json::to_vec(&ask.to_json()).map_err(|_| Outcome::Failed)?;
    let (status, answer) = post(client, to, LEASE, body, timeout).await?;
    match status {
        200 => {}
        404 => return Err(Outcome::NotHeld),
        _ => return Err(Outcome::Failed),
    }
    let g = Grant::from_json(&answer).map_err(|_| Outcome::Failed)?;
    match g.lease {
        Some(_) if g.blocks > 0 && g.start == ask.start => Ok(g),
        Some(_) if g.blocks > 0 => Err(Outcome::Failed),
        _ => Err(Outcome::NotHeld),
    }
}

/// Releases a lease on `to`; whether the holder still held it.
pub async fn release(client: &Client, to: SocketAddr, lease: &str, timeout: Duration) -> bool {
    let body = json!({ "lease": lease }).to_string().into_bytes();
    matches!(post(client, to, RELEASE, body, timeout).await, Ok((200, _)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(n: u128) -> BlockHash {
        BlockHash(n)
    }

    #[test]
    fn an_ask_round_trips_and_bad_members_are_named() {
        let a = Ask {
            key: 0x0b3c,
            hashes: vec![h(1), h(u128::MAX)],
            start: 1,
            fingerprint: "f".into(),
            puller: "p".into(),
        };
        let body = serde_json::to_vec(&a.to_json()).unwrap();
        assert_eq!(Ask::from_json(&body).unwrap(), a);
        for (bad, member) in [
            (json!({"hashes": []}), "key"),
            (json!({"key": "zz", "hashes": []}), "key"),
            (json!({"key": "1"}), "hashes"),
            (json!({"key": "1", "hashes": ["12"]}), "hashes"),
            (json!({"key": "1", "hashes": [], "start": -1}), "start"),
        ] {
            let e = Ask::from_json(bad.to_string().as_bytes()).unwrap_err();
            assert!(e.contains(member), "{bad}: {e}");
        }
        assert!(Ask::from_json(b"{").is_err());
        let many = vec!["0".repeat(32); MAX_HASHES + 1];
        let e = Ask::from_json(json!({"key": "1", "hashes": many}).to_string().as_bytes());
        assert!(e.unwrap_err().contains("more than"));
    }

    #[test]
    fn only_the_common_prefix_past_start_is_served() {
        let held = [h(1), h(2), h(3), h(4)];
        assert_eq!(matched(&held, &[h(1), h(2), h(3), h(4), h(5)], 0), 4);
        assert_eq!(matched(&held, &[h(1), h(2), h(9), h(4)], 0), 2);
        assert_eq!(matched(&held, &[h(1), h(2), h(3)], 1), 2);
        assert_eq!(matched(&held, &[h(1), h(2)], 3), 0);
        assert_eq!(matched(&held, &[h(7)], 0), 0);
    }

    #[test]
    fn a_grant_reads_back_and_an_empty_one_has_no_lease() {
        let v = Grant::answer(Some("ab"), 30_000, 2, &[h(5), h(6)], 4096, Some(Tier::Host));
        assert_eq!(v["tier"], "host");
        assert_eq!(v["blocks"][1]["checksum"], format!("{:032x}", 6));
        let g = Grant::from_json(v.to_string().as_bytes()).unwrap();
        assert_eq!(
            g,
            Grant {
                lease: Some("ab".into()),
                lease_ms: 30_000,
                start: 2,
                blocks: 2
            }
        );
        let none = Grant::answer(None, 30_000, 0, &[], 4096, None);
        assert_eq!(
            Grant::from_json(none.to_string().as_bytes()).unwrap().lease,
            None
        );
        assert!(Grant::from_json(br#"{"lease": 3, "blocks": []}"#).is_err());
    }

    #[test]
    fn leases_expire_renew_and_release_once() {
        let t = Leases::new(Duration::from_millis(100), 7);
        let t0 = Instant::now();
        let a = t.grant(t0);
        let b = t.grant(t0);
        assert_ne!(a, b);
        assert_eq!(t.active(t0), 2);
        assert!(t.renew(&a, t0 + Duration::from_millis(80)));
        // b expired at 100 ms; a was renewed to 180 ms.
        assert!(!t.release(&b, t0 + Duration::from_millis(150)));
        assert!(t.release(&a, t0 + Duration::from_millis(150)));
        assert!(!t.release(&a, t0 + Duration::from_millis(150)), "once");
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        assert_eq!(
            (n(&t.granted), n(&t.renewed), n(&t.released), n(&t.expired)),
            (2, 1, 1, 1)
        );
        assert_eq!(lease_id(br#"{"lease":"ab"}"#).as_deref(), Some("ab"));
        assert_eq!(lease_id(br#"{"lease":""}"#), None);
        assert_eq!(lease_id(b"nope"), None);
    }
}
