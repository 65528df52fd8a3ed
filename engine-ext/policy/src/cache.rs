//! The rank's retention cache: prefix hits, turn-boundary retention, eviction order and the two tiers.
//!
//! Lifecycle of one request, as an engine integration drives it:
//! 1. [`RetentionCache::admit`] before prefill: matches the prompt's block chain on
//!    the device, continues the match on the host tier and restores those blocks
//!    (checksums verified; any mismatch or failed copy is a miss, never wrong KV),
//!    refreshes the key's retention, and allocates slots for the rest.
//! 2. [`RetentionCache::finish_prefill`] when the prompt's KV is computed: publishes
//!    the new blocks and, for a prompt-end marker, retains the prompt (and for hybrid
//!    models its state snapshots), superseding the key's previous retention.
//! 3. [`RetentionCache::release`] when the request finishes.
//!
//! Making room for a block always follows one order: unreferenced unretained blocks
//! (LRU, tails first, subtrees with their heads); then expired retentions, dropped;
//! then the least valuable live retention, offloaded to the host tier if it fits there
//! (else dropped). Nothing in this module reads a clock: every call takes `now`.

use crate::config::{ConfigError, Millis, PolicyConfig};
use crate::hash::{BlockHash, dead_block_hash};
use crate::host::{HostKind, HostTier};
use crate::marker::{RetentionKey, TurnMarker};
use crate::payload::{MoveError, Mover, SlotId, StateSlot, split};
use crate::pool::{BlockPool, KvEvent};
use crate::record::{DeviceRecord, HostRecord, RecordMeta};
use crate::rewrite::{TailRewrites, rewritten};
use crate::states::StatePool;
use crate::victims::{Class, VictimIndex};
use std::collections::HashMap;
use thiserror::Error;

/// The engine's id for a running request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// Why a request could not be served by the cache.
#[derive(Debug, Error)]
pub enum CacheError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Every slot is pinned by running requests; the prompt does not fit now.
    #[error("no device block free for a prompt of {need} blocks")]
    OutOfBlocks {
        /// Blocks the prompt needs.
        need: usize,
    },
    /// The request id is already running.
    #[error("request {0:?} is already admitted")]
    Duplicate(RequestId),
    /// The request id is not running.
    #[error("request {0:?} is not admitted")]
    Unknown(RequestId),
}

impl CacheError {
    /// Who failed: a full pool is transient, everything else is the caller's mistake.
    pub fn fault(&self) -> crate::Fault {
        match self {
            CacheError::OutOfBlocks { .. } => crate::Fault::Transient,
            CacheError::Config(_) | CacheError::Duplicate(_) | CacheError::Unknown(_) => {
                crate::Fault::Caller
            }
        }
    }
}

/// Why the host tier could not serve what it held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreMiss {
    /// A payload failed its checksum; it and the records needing it were dropped.
    Checksum,
    /// The copy into device memory failed part-way; the restored range was discarded.
    Copy(String),
}

impl RestoreMiss {
    /// Both misses are device-side: corrupt host memory or a failed copy. The blocks are
    /// recomputed; the request itself is fine.
    pub fn fault(&self) -> crate::Fault {
        crate::Fault::Device
    }
}

/// What [`RetentionCache::admit`] gives the engine.
#[derive(Debug, Clone, PartialEq)]
pub struct Admission {
    /// One device slot per full prompt block (the request's block table).
    pub slots: Vec<SlotId>,
    /// Leading blocks whose KV is valid (device hits plus restored); prefill starts after them.
    pub cached_blocks: usize,
    /// Of those, blocks restored from the host tier for this request.
    pub restored_blocks: usize,
    /// For hybrid models: the snapshot to resume the linear state from (at `cached_blocks`).
    pub state: Option<StateSlot>,
    /// True when that snapshot was restored from the host tier for this request (its
    /// `state_bytes` crossed the host link).
    pub state_restored: bool,
    /// Set when host-tier data existed but could not be used.
    pub miss: Option<RestoreMiss>,
    /// True when the key's retention had been prefetched and this request is its
    /// first hit (an engine whose prefetch copy is still in flight waits for it).
    pub prefetch_hit: bool,
}

/// Snapshots the engine must write after [`RetentionCache::finish_prefill`] retained a prompt end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Retained {
    /// (boundary in blocks, slot) for each new snapshot, prompt end first.
    pub state_slots: Vec<(usize, StateSlot)>,
}

/// Counters for metrics and the benchmark.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Retentions created.
    pub retained: u64,
    /// Retentions replaced by the same key's next prompt end.
    pub superseded: u64,
    /// Retentions refreshed by a hit.
    pub refreshed: u64,
    /// Expired retentions dropped for room.
    pub expired_dropped: u64,
    /// Live retentions moved to the host tier.
    pub offloaded: u64,
    /// Live retentions dropped because the host tier could not take them.
    pub dropped: u64,
    /// Blocks restored from the host tier.
    pub restored_blocks: u64,
    /// Restores refused by a checksum mismatch or failed copy.
    pub restore_misses: u64,
    /// Host retentions brought back to the device ahead of their return ([`RetentionCache::prefetch`]).
    pub prefetched: u64,
    /// Blocks those prefetches restored.
    pub prefetched_blocks: u64,
    /// Prefetched retentions hit by their key's next request.
    pub prefetch_used: u64,
    /// Prefetched retentions that left the device (expired, offloaded, dropped) unhit.
    pub prefetch_wasted: u64,
    /// Hybrid retentions that also kept the snapshot their turn resumed from (the
    /// resume anchor, `cache::anchor`).
    pub anchors: u64,
}

#[derive(Debug)]
struct Running {
    hashes: Vec<BlockHash>,
    slots: Vec<SlotId>,
    /// The cached slot each block is published as (equal to `slots[i]` unless a duplicate).
    canonical: Vec<Option<SlotId>>,
    state_pin: Option<BlockHash>,
    /// The retention key the request was admitted or retained under.
    key: Option<RetentionKey>,
    /// Slots past the full prompt blocks: the prompt's partial block and the output's
    /// ([`RetentionCache::grow`]; empty unless `hold_tail_blocks`).
    tail: Vec<SlotId>,
}

/// Which block slots an allocation may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Room {
    /// Anything, in the eviction order (a request's own blocks and snapshots).
    Any,
    /// Only what holds nothing retained or running: empty slots, unpinned cached
    /// blocks, unpinned snapshots (a prefetch).
    Free,
}

/// Where a usable prefix comes from.
struct Plan {
    device: usize,
    restore: usize,
    state: Option<(BlockHash, bool)>,
}

/// What an admission fetched from the host tier for [`RetentionCache::scatter_restore`]
/// to write: the restored blocks' bytes, the snapshot's bytes, and the state slot already
/// reserved for that snapshot at admission (`None`: allocate it there).
struct Fetched<'a> {
    blocks: &'a [u8],
    state: Option<&'a [u8]>,
    room: Option<(BlockHash, StateSlot)>,
}

/// Block counts at which a hybrid prompt of `n` full blocks keeps state snapshots: the
/// prompt end first, then every `checkpoint_every_tokens` (latest first), so when slots
/// run short the boundaries most likely to be resumed from are the ones kept. All are
/// rounded down to `state_align_tokens`: the prompt end is the last boundary the engine
/// can resume at, the one the session's next turn (which resends this prompt) resumes
/// from. Empty for attention-only models.
pub fn snapshot_boundaries(cfg: &PolicyConfig, n: usize) -> Vec<usize> {
    let align = cfg.state_align_blocks();
    let n = n / align * align;
    if !cfg.hybrid() || n == 0 {
        return Vec::new();
    }
    let mut bounds = vec![n];
    let every = (cfg.checkpoint_every_tokens / cfg.block_size).next_multiple_of(align);
    if every > 0 {
        bounds.extend(
            (1..n.div_ceil(every))
                .rev()
                .map(|k| k * every)
                .filter(|&b| b < n),
        );
    }
    bounds
}

/// Retention cache of one rank (device block pool, state slots, records, host tier).
#[derive(Debug)]
pub struct RetentionCache {
    cfg: PolicyConfig,
    pool: BlockPool,
    states: StatePool,
    records: HashMap<RetentionKey, DeviceRecord>,
    victims: VictimIndex,
    host: HostTier,
    running: HashMap<RequestId, Running>,
    stats: Stats,
    /// Scratch: hashes of blocks the last LRU eviction removed.
    evicted: Vec<BlockHash>,
    /// Dead tail blocks published so far: makes each one's hash unique.
    dead_blocks: u64,
    /// How far returning requests rewrite their key's previous prompt (hybrid models:
    /// where a retention's snapshot goes, `crate::rewrite`).
    rewrites: TailRewrites,
}

impl RetentionCache {
    /// A cache configured by `cfg`.
    pub fn try_new(cfg: PolicyConfig) -> Result<Self, CacheError> {
        cfg.validate()?;
        Ok(Self {
            pool: BlockPool::new(cfg.device_blocks),
            states: StatePool::new(cfg.device_blocks / cfg.state_blocks().max(1)),
            host: HostTier::new(cfg.host_bytes),
            records: HashMap::new(),
            victims: VictimIndex::default(),
            running: HashMap::new(),
            stats: Stats::default(),
            evicted: Vec::new(),
            dead_blocks: 0,
            rewrites: TailRewrites::default(),
            cfg,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &PolicyConfig {
        &self.cfg
    }

    /// Counters so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Starts recording KV events (blocks stored / removed on the device) for a KV-aware router.
    pub fn record_events(&mut self) {
        self.pool.record_events();
    }

    /// Takes the KV events recorded since the last call.
    pub fn drain_events(&mut self) -> Vec<KvEvent> {
        self.pool.drain_events()
    }

    /// The device block pool.
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// The host tier.
    pub fn host(&self) -> &HostTier {
        &self.host
    }

    /// The host tier, mutable (fault injection in tests, operator flushes).
    pub fn host_mut(&mut self) -> &mut HostTier {
        &mut self.host
    }

    /// The device state-snapshot pool.
    pub fn states(&self) -> &StatePool {
        &self.states
    }

    /// The device retention of `key`.
    pub fn device_record(&self, key: &RetentionKey) -> Option<&DeviceRecord> {
        self.records.get(key)
    }

    /// Every retention held, on either tier: (key, prompt tokens it lets the
    /// next turn skip, on the device). A key on both tiers appears twice. For a
    /// rank's residency summary (`docs/rank.md` "Residency summary").
    pub fn retained(&self) -> impl Iterator<Item = (RetentionKey, u64, bool)> + '_ {
        let device = self
            .records
            .values()
            .map(|r| (r.meta.key, r.meta.tokens, true));
        let host = self
            .host
            .records()
            .map(|r| (r.meta.key, r.meta.tokens, false));
        device.chain(host)
    }

    /// Device retentions held.
    pub fn device_records(&self) -> usize {
        self.records.len()
    }

    /// Leading blocks of `chain` cached on the device, without side effects.
    pub fn peek_prefix(&self, chain: &[BlockHash]) -> usize {
        self.pool.prefix_len(chain)
    }

    /// Admits a request whose prompt has the full-block chain `hashes`. See the module docs.
    pub fn admit(
        &mut self,
        id: RequestId,
        hashes: &[BlockHash],
        key: Option<RetentionKey>,
        now: Millis,
        mover: &mut dyn Mover,
    ) -> Result<Admission, CacheError> {
        if self.running.contains_key(&id) {
            return Err(CacheError::Duplicate(id));
        }
        let rewrite = key.and_then(|k| self.rewrite_of(&k, hashes));
        let prefetch_hit = key.is_some_and(|k| self.refresh(&k, now));
        let mut miss = None;
        let mut plan = self.plan(hashes, true);
        // Fetch and verify host payloads before any eviction can touch the host tier.
        let mut restored_bytes = Vec::new();
        let mut state_bytes = None;
        if plan.restore > 0 || matches!(plan.state, Some((_, false))) {
            match self.fetch_restore(hashes, &plan) {
                Ok((b, s)) => {
                    restored_bytes = b;
                    state_bytes = s;
                }
                Err(m) => {
                    self.stats.restore_misses += 1;
                    miss = Some(m);
                    plan = self.plan(hashes, false);
                }
            }
        }
        let n = hashes.len();
        let mut run = Running {
            hashes: hashes.to_vec(),
            slots: Vec::with_capacity(n),
            canonical: vec![None; n],
            state_pin: None,
            key,
            tail: Vec::new(),
        };
        for (i, h) in hashes.iter().take(plan.device).enumerate() {
            let Some(s) = self.pool.get(*h) else { break };
            self.pool.acquire(s);
            run.slots.push(s);
            run.canonical[i] = Some(s);
        }
        plan.device = run.slots.len();
        if let Some((b, true)) = plan.state {
            run.state_pin = self.states.pin(b).map(|_| b);
        }
        // A snapshot coming back from the host takes its room before the prompt's own
        // blocks: without it the restored prefix is unusable, so a request that cannot
        // have both waits (as vLLM's scheduler waits for a hybrid request's state
        // pages) rather than recomputing everything — unless the two could never fit.
        let fresh = match (&state_bytes, plan.state) {
            (Some(_), Some((b, false))) => match self.alloc_state(b, now, mover) {
                Some(s) => Some((b, s)),
                None if n + self.cfg.state_blocks() <= self.cfg.device_blocks => {
                    self.release_running(run);
                    return Err(CacheError::OutOfBlocks { need: n });
                }
                None => None,
            },
            _ => None,
        };
        // Allocate the rest: restored blocks first, then the blocks prefill computes.
        while run.slots.len() < n {
            match self.alloc(now, mover) {
                Some(s) => run.slots.push(s),
                None => {
                    self.release_running(run);
                    if let Some((b, _)) = fresh {
                        let backing = self.states.discard(b);
                        self.release_backing(backing);
                    }
                    return Err(CacheError::OutOfBlocks { need: n });
                }
            }
        }
        let mut restored = 0;
        let mut state_restored = false;
        let mut state = run.state_pin.and_then(|b| self.states.get(b));
        if plan.restore > 0 || state_bytes.is_some() {
            let fetched = Fetched {
                blocks: &restored_bytes,
                state: state_bytes.as_deref(),
                room: fresh,
            };
            match self.scatter_restore(&mut run, &plan, fetched, now, mover) {
                Ok((r, s)) => {
                    restored = r;
                    if s.is_some() {
                        state = s;
                        state_restored = true;
                    }
                    self.credit_restore(key, plan.state.map(|(b, _)| b));
                }
                Err(m) => {
                    self.stats.restore_misses += 1;
                    miss = Some(m);
                    plan.restore = 0;
                    // A snapshot is valid only at its own boundary, which the failed
                    // restore did not reach: resume from nothing rather than a wrong state.
                    if let Some(b) = run.state_pin.take() {
                        self.states.unpin_at(b, self.pool.lru_clock());
                    }
                    state = None;
                }
            }
        }
        let mut cached = plan.device + restored;
        if self.cfg.hybrid() && state.is_none() {
            cached = 0;
        }
        self.stats.restored_blocks += restored as u64;
        let adm = Admission {
            slots: run.slots.clone(),
            cached_blocks: cached,
            restored_blocks: restored,
            state,
            state_restored,
            miss,
            prefetch_hit,
        };
        self.running.insert(id, run);
        if let Some(r) = rewrite {
            self.rewrites.observe(r);
        }
        Ok(adm)
    }

    /// Hybrid models: how many trailing full blocks of the key's retained prompt (on
    /// either tier) the returning chain `hashes` rewrites ([`TailRewrites`]); `None`
    /// when the key holds nothing.
    fn rewrite_of(&self, key: &RetentionKey, hashes: &[BlockHash]) -> Option<usize> {
        if !self.cfg.hybrid() {
            return None;
        }
        let (held, past_end) = match self.records.get(key) {
            Some(r) => (&r.hashes, &r.meta.past_end),
            None => self
                .host
                .record(key)
                .map(|r| (&r.hashes, &r.meta.past_end))?,
        };
        let lost = rewritten(held, hashes);
        Some(if lost == 0 {
            rewritten(past_end, &hashes[held.len()..])
        } else {
            lost + past_end.len()
        })
    }

    /// Marks the host record a restore came from as used ([`HostTier::usage`]): for a
    /// hybrid model the record holding the snapshot resumed from (the request's own
    /// when it holds it), else the request's own record.
    fn credit_restore(&mut self, key: Option<RetentionKey>, state: Option<BlockHash>) {
        let owner = match state {
            Some(b) if self.cfg.hybrid() => self.host.state_owner(b, key),
            _ => key,
        };
        if let Some(k) = owner {
            self.host.mark_used(&k);
        }
    }

    /// Decides how much of `hashes` is usable and from where.
    fn plan(&self, hashes: &[BlockHash], use_host: bool) -> Plan {
        let m = self.pool.prefix_len(hashes);
        let hm = if use_host && self.host.capacity() > 0 {
            self.host.prefix_len(&hashes[m..])
        } else {
            0
        };
        let total = m + hm;
        if !self.cfg.hybrid() {
            return Plan {
                device: m,
                restore: hm,
                state: None,
            };
        }
        // A hybrid prefix is usable only up to the deepest boundary with a snapshot.
        for j in (1..=total).rev() {
            let b = hashes[j - 1];
            let on_device = self.states.get(b).is_some();
            let on_host = use_host && self.host.contains(HostKind::State, b);
            if on_device || on_host {
                let device = m.min(j);
                return Plan {
                    device,
                    restore: j - device,
                    state: Some((b, on_device)),
                };
            }
        }
        Plan {
            device: 0,
            restore: 0,
            state: None,
        }
    }

    /// Verified copies of the host payloads a plan restores.
    #[allow(
        clippy::type_complexity,
        reason = "private helper returning the two payload kinds"
    )]
    fn fetch_restore(
        &mut self,
        hashes: &[BlockHash],
        plan: &Plan,
    ) -> Result<(Vec<u8>, Option<Vec<u8>>), RestoreMiss> {
        let state = match plan.state {
            Some((b, false)) => Some(b),
            _ => None,
        };
        self.fetch_range(&hashes[plan.device..plan.device + plan.restore], state)
    }

    /// Writes restored bytes into the request's slots and publishes them.
    fn scatter_restore(
        &mut self,
        run: &mut Running,
        plan: &Plan,
        fetched: Fetched<'_>,
        now: Millis,
        mover: &mut dyn Mover,
    ) -> Result<(usize, Option<StateSlot>), RestoreMiss> {
        let Fetched {
            blocks,
            state,
            room: fresh,
        } = fetched;
        let range = plan.device..plan.device + plan.restore;
        if !range.is_empty()
            && let Err(e) = mover.scatter_blocks(&run.slots[range.clone()], blocks)
        {
            // The snapshot allocated for this restore was never written.
            if let Some((b, _)) = fresh {
                let backing = self.states.discard(b);
                self.release_backing(backing);
            }
            return Err(RestoreMiss::Copy(e.0));
        }
        let mut slot = None;
        if let (Some(bytes), Some((b, false))) = (state, plan.state) {
            let s = match fresh {
                Some((_, s)) => s,
                None => self
                    .alloc_state(b, now, mover)
                    .ok_or_else(|| RestoreMiss::Copy("no state slot".into()))?,
            };
            if let Err(e) = mover.scatter_states(&[s], bytes) {
                let backing = self.states.discard(b);
                self.release_backing(backing);
                return Err(RestoreMiss::Copy(e.0));
            }
            run.state_pin = Some(b);
            slot = Some(s);
        }
        for i in range.clone() {
            self.publish(run, i);
        }
        Ok((range.len(), slot))
    }

    /// Publishes block `i` of a running request as cached (or pins the existing copy).
    fn publish(&mut self, run: &mut Running, i: usize) {
        if run.canonical[i].is_some() {
            return;
        }
        let parent = if i == 0 { None } else { run.canonical[i - 1] };
        let own = run.slots[i];
        if self.pool.insert(own, run.hashes[i], parent) {
            run.canonical[i] = Some(own);
        } else if let Some(existing) = self.pool.get(run.hashes[i]) {
            self.pool.acquire(existing);
            run.canonical[i] = Some(existing);
        }
    }

    /// Publishes the request's computed blocks and, for a prompt-end marker, retains them.
    pub fn finish_prefill(
        &mut self,
        id: RequestId,
        marker: Option<&TurnMarker>,
        now: Millis,
        mover: &mut dyn Mover,
    ) -> Result<Retained, CacheError> {
        let mut run = self.running.remove(&id).ok_or(CacheError::Unknown(id))?;
        for i in 0..run.hashes.len() {
            self.publish(&mut run, i);
        }
        let full = run.canonical.iter().take_while(|c| c.is_some()).count();
        if let Some(m) = marker {
            run.key = Some(m.key);
        }
        let out = match marker.filter(|m| m.prompt_end && self.cfg.retention && full > 0) {
            Some(m) => self.retain(&run, m, now, mover),
            None => self.cache_snapshots(&run, now, mover),
        };
        self.running.insert(id, run);
        Ok(out)
    }

    fn retain(
        &mut self,
        run: &Running,
        m: &TurnMarker,
        now: Millis,
        mover: &mut dyn Mover,
    ) -> Retained {
        let mut chain: Vec<SlotId> = run.canonical.iter().map_while(|c| *c).collect();
        let full = chain.len();
        let mut out = Retained::default();
        if self.cfg.hybrid() {
            // Blocks past the snapshot's boundary are never resumed from: a hybrid
            // retention ends there — at the aligned boundary the key's next request is
            // expected to keep (`crate::rewrite`; the aligned prompt end until returns
            // show otherwise).
            let end = self.rewrites.boundary(full, self.cfg.state_align_blocks());
            if end == 0 {
                return self.cache_snapshots(run, now, mover);
            }
            chain.truncate(end);
        }
        let n = chain.len();
        for s in &chain {
            self.pool.retain(*s);
        }
        // The previous prompt end stays pinned (out of the victim order) until the new
        // prompt end's snapshot is saved, so the new snapshot takes its room from
        // anything else first; only if nothing else gives way does the old one yield.
        let mut old = self.take_record(&m.key);
        let mut states = Vec::new();
        for b in snapshot_boundaries(&self.cfg, n) {
            let h = run.hashes[b - 1];
            let existed = self.states.get(h).is_some();
            let mut slot = self.alloc_state(h, now, mover);
            if slot.is_none()
                && b == n
                && let Some(o) = old.take()
            {
                self.drop_device_record(o);
                self.stats.superseded += 1;
                slot = self.alloc_state(h, now, mover);
            }
            if let Some(s) = slot {
                states.push((h, s));
                if !existed {
                    out.state_slots.push((b, s));
                }
            }
        }
        self.keep_anchor(run.state_pin, &run.hashes[..n], &mut states);
        // The prompt end's own snapshot, when the retention stops short of it, is cached
        // unpinned as plain prefix caching would (an unchanged resend of this prompt
        // resumes there while it lasts).
        let align = self.cfg.state_align_blocks();
        if self.cfg.hybrid() && full / align * align > n {
            let mut end = Retained::default();
            self.cache_snapshot(run, full / align * align, now, mover, &mut end);
            out.state_slots.splice(0..0, end.state_slots);
        }
        if let Some(o) = old {
            self.drop_device_record(o);
            self.stats.superseded += 1;
        }
        if self.host.remove_record(&m.key).is_some() {
            self.stats.superseded += 1;
        }
        let interval = self.cfg.interval(m.kind, m.retention_ms);
        let bytes = n as u64 * self.cfg.block_bytes + states.len() as u64 * self.cfg.state_bytes;
        let meta = RecordMeta {
            key: m.key,
            kind: m.kind,
            tokens: (n * self.cfg.block_size) as u64,
            created_ms: now,
            last_use_ms: now,
            expires_ms: now.saturating_add(interval),
            bytes,
            past_end: run.hashes[n..full].to_vec(),
        };
        let hashes = run.hashes[..n].to_vec();
        self.insert_record(DeviceRecord {
            meta,
            chain,
            hashes,
            states,
            interval_ms: interval,
            lru_tick: self.pool.lru_clock(),
            prefetched: false,
        });
        self.stats.retained += 1;
        out
    }

    /// Without retention, a hybrid prompt's snapshots are still cached, unpinned, in LRU
    /// order (plain prefix caching of a hybrid model, vLLM `--mamba-cache-mode align`).
    fn cache_snapshots(&mut self, run: &Running, now: Millis, mover: &mut dyn Mover) -> Retained {
        let n = run.canonical.iter().take_while(|c| c.is_some()).count();
        let mut out = Retained::default();
        for b in snapshot_boundaries(&self.cfg, n) {
            self.cache_snapshot(run, b, now, mover, &mut out);
        }
        out
    }

    /// Caches the snapshot at boundary `b` (in blocks) of a running request, unpinned,
    /// unless it is already held; a new one goes into `out` for the engine to write.
    fn cache_snapshot(
        &mut self,
        run: &Running,
        b: usize,
        now: Millis,
        mover: &mut dyn Mover,
        out: &mut Retained,
    ) {
        let h = run.hashes[b - 1];
        if self.states.get(h).is_some() {
            return;
        }
        if let Some(s) = self.alloc_state(h, now, mover) {
            self.states.unpin_at(h, self.pool.lru_clock());
            out.state_slots.push((b, s));
        }
    }

    /// A hit on `key`: refresh its retention on whichever tier holds it. True when
    /// the retention was prefetched and this is its first hit.
    fn refresh(&mut self, key: &RetentionKey, now: Millis) -> bool {
        let mut prefetched = false;
        if let Some(mut r) = self.take_record(key) {
            if r.prefetched {
                r.prefetched = false;
                prefetched = true;
                self.stats.prefetch_used += 1;
            }
            r.meta.refresh(now, r.interval_ms);
            r.lru_tick = self.pool.lru_clock();
            self.insert_record(r);
            self.stats.refreshed += 1;
        } else if self.host.refresh(key, now) {
            self.stats.refreshed += 1;
        }
        prefetched
    }

    fn insert_record(&mut self, rec: DeviceRecord) {
        self.victims.insert(&rec.meta);
        let replaced = self.records.insert(rec.meta.key, rec);
        debug_assert!(replaced.is_none(), "insert_record over a live record");
    }

    fn take_record(&mut self, key: &RetentionKey) -> Option<DeviceRecord> {
        let rec = self.records.remove(key)?;
        self.victims.remove(key);
        Some(rec)
    }

    /// Ends a request: drops its pins, tail first so chain tails are evicted before heads.
    pub fn release(&mut self, id: RequestId) -> Result<(), CacheError> {
        let run = self.running.remove(&id).ok_or(CacheError::Unknown(id))?;
        let key = run.key;
        self.release_running(run);
        // The key's retention was in use until now: it ranks against unpinned blocks
        // as if released with this request's blocks, as plain LRU would rank them.
        if let Some(r) = key.and_then(|k| self.records.get_mut(&k)) {
            r.lru_tick = self.pool.lru_clock();
        }
        Ok(())
    }

    /// Lets `key`'s retention go on both tiers: a copy of it elsewhere took its next
    /// turn (a state rebalanced in a tool gap), so this one will not be asked for. Its
    /// device blocks join the free queue cold, tail first, as a retention that yielded
    /// (still cached for another key that shares them); its host record is dropped.
    /// True when either tier held one.
    pub fn forget(&mut self, key: &RetentionKey) -> bool {
        let device = self.take_record(key);
        let held = device.is_some();
        if let Some(rec) = device {
            self.drop_device_record_cold(rec);
        }
        self.host.remove_record(key).is_some() || held
    }

    /// `tokens` as a share of this cache's device KV (its blocks × block size): how
    /// much of a rank a state of that size fills.
    pub fn device_share(&self, tokens: u64) -> f64 {
        let slots = self.pool.capacity() * self.cfg.block_size;
        tokens as f64 / slots.max(1) as f64
    }

    /// Moves `key`'s live device retention to the host tier now, as pressure would
    /// (checksummed, restorable bit-exactly): a copy of the state on another rank (a
    /// state rebalanced in a tool gap) is expected to take the key's next turn, so
    /// this rank's device room is worth more to its other sessions, while the host
    /// copy still serves the turn if it comes back here. True when the device
    /// record moved; false when there was none, it had expired, or the host tier
    /// refused it (it stays on the device).
    pub fn demote(&mut self, key: &RetentionKey, now: Millis, mover: &mut dyn Mover) -> bool {
        if !self.records.contains_key(key) || self.victims.class_of(key, now) != Class::Live {
            return false;
        }
        self.displace(std::slice::from_ref(key), now, mover) && !self.records.contains_key(key)
    }

    /// Holds enough slots for `tokens` tokens of a running request (its prompt, then
    /// prompt + generated after each decode step), as vLLM's block manager does; a no-op
    /// unless `hold_tail_blocks`. The slots come in the usual eviction order. Returns the
    /// slots added; `OutOfBlocks` when nothing gives way (a real engine would preempt;
    /// the slots taken so far stay held).
    pub fn grow(
        &mut self,
        id: RequestId,
        tokens: usize,
        now: Millis,
        mover: &mut dyn Mover,
    ) -> Result<usize, CacheError> {
        if !self.cfg.hold_tail_blocks {
            return Ok(0);
        }
        let mut run = self.running.remove(&id).ok_or(CacheError::Unknown(id))?;
        let need = tokens.div_ceil(self.cfg.block_size);
        let mut added = 0;
        let mut out = Ok(0);
        while run.hashes.len() + run.tail.len() < need {
            match self.alloc(now, mover) {
                Some(s) => {
                    run.tail.push(s);
                    added += 1;
                }
                None => {
                    out = Err(CacheError::OutOfBlocks { need });
                    break;
                }
            }
        }
        self.running.insert(id, run);
        out.map(|_: usize| added)
    }

    /// A request's tail slots, released tail first: published as dead blocks (a hash
    /// no prompt has, chained under the last prompt block) when the prompt was computed,
    /// so they age in the free queue ahead of the prompt's blocks as vLLM's do; freed
    /// empty when it was not (nothing was written to them).
    fn release_tail(&mut self, run: &mut Running) {
        let computed = run.canonical.last().is_none_or(|c| c.is_some());
        let mut parent = run.canonical.last().copied().flatten();
        if computed {
            for &s in &run.tail {
                self.dead_blocks += 1;
                let hash =
                    dead_block_hash(parent.and_then(|p| self.pool.hash_of(p)), self.dead_blocks);
                parent = self.pool.insert(s, hash, parent).then_some(s);
            }
        }
        for s in run.tail.drain(..).rev() {
            self.pool.release(s);
        }
    }

    fn release_running(&mut self, mut run: Running) {
        self.release_tail(&mut run);
        for i in (0..run.slots.len()).rev() {
            let own = run.slots[i];
            match run.canonical[i] {
                Some(c) if c != own => {
                    self.pool.release(c);
                    self.pool.release(own);
                }
                _ => self.pool.release(own),
            }
        }
        if let Some(b) = run.state_pin {
            self.states.unpin_at(b, self.pool.lru_clock());
        }
    }

    /// Drops a retention that yielded for room: its blocks join the free queue at the
    /// front (it was chosen as older than everything there), tail first.
    fn drop_device_record_cold(&mut self, rec: DeviceRecord) {
        self.stats.prefetch_wasted += u64::from(rec.prefetched);
        for s in &rec.chain {
            self.pool.unretain_cold(*s);
        }
        for (h, _) in &rec.states {
            self.states.unpin_at(*h, self.pool.lru_clock());
        }
    }

    fn drop_device_record(&mut self, rec: DeviceRecord) {
        self.stats.prefetch_wasted += u64::from(rec.prefetched);
        for s in rec.chain.iter().rev() {
            self.pool.unretain(*s);
        }
        for (h, _) in &rec.states {
            self.states.unpin_at(*h, self.pool.lru_clock());
        }
    }

    /// One free block slot (pinned once, uncached), evicting in policy order: unpinned
    /// blocks (with the unpinned snapshots at their boundaries, now unusable), unpinned
    /// snapshots, then retentions.
    fn alloc(&mut self, now: Millis, mover: &mut dyn Mover) -> Option<SlotId> {
        self.alloc_in(Room::Any, now, mover)
    }

    /// [`RetentionCache::alloc`], limited to `room`: [`Room::Free`] never takes a
    /// retention's blocks.
    fn alloc_in(&mut self, room: Room, now: Millis, mover: &mut dyn Mover) -> Option<SlotId> {
        loop {
            if let Some(s) = self.pool.take_empty() {
                return Some(s);
            }
            // Hybrid models: a retention used less recently than every unpinned block
            // yields first, so a pinned turn (with its snapshot, worth thousands of
            // tokens of KV) never displaces blocks that are more recent. Measured
            // better for hybrid models and worse for attention-only ones (docs/engine.md).
            if let Some(key) = self.colder_record().filter(|_| room == Room::Any) {
                let class = self.victims.class_of(&key, now);
                if self.evict_key(class, key, now, mover) {
                    continue;
                }
            }
            let mut evicted = std::mem::take(&mut self.evicted);
            evicted.clear();
            let freed = self.pool.evict_lru_into(&mut evicted);
            if self.states.used() > 0 {
                for h in &evicted {
                    let backing = self.states.forget_unpinned(*h);
                    self.release_backing(backing);
                }
            }
            self.evicted = evicted;
            if freed > 0 {
                continue;
            }
            // An unpinned snapshot whose boundary a retention holds is part of what that
            // retention keeps (as one whose boundary is cached lives as long as its
            // block): it goes with the retention, not before it.
            let loose = match room {
                Room::Any => self.loose_snapshot().map(|(b, _)| b),
                Room::Free => self.states.unpinned_lru().next().map(|(b, _)| b),
            };
            if let Some(b) = loose {
                let backing = self.states.forget_unpinned(b);
                self.release_backing(backing);
                continue;
            }
            if room == Room::Free || !self.evict_record(now, mover) {
                if let Some(backing) = self.states.evict_unpinned() {
                    self.release_backing(backing);
                    continue;
                }
                return None;
            }
        }
    }

    /// The least recently used retention, when it was last used before the free
    /// queue's front entered the queue.
    fn colder_record(&self) -> Option<RetentionKey> {
        if !self.cfg.hybrid() {
            return None;
        }
        // The next thing evicted otherwise: the free queue's front, or once that is
        // empty the least recently unpinned snapshot.
        let front = self
            .pool
            .lru_front_tick()
            .or_else(|| self.loose_snapshot().map(|(_, t)| t))?;
        let key = self.victims.least_recent()?;
        self.records
            .get(&key)
            .is_some_and(|r| r.lru_tick < front)
            .then_some(key)
    }

    /// The least recently unpinned snapshot whose boundary block no retention holds
    /// (boundary, tick): the snapshot the fallback order evicts before any retention.
    fn loose_snapshot(&self) -> Option<(BlockHash, u64)> {
        self.states
            .unpinned_lru()
            .find(|(b, _)| self.pool.get(*b).is_none_or(|s| self.pool.retains(s) == 0))
    }

    /// Gives the block slots of a removed snapshot back to the pool.
    fn release_backing(&mut self, backing: Vec<SlotId>) {
        for s in backing {
            self.pool.release(s);
        }
    }

    /// The snapshot at `boundary` (pinned once): the existing one, or a new one backed
    /// by `state_blocks` block slots allocated in policy order.
    fn alloc_state(
        &mut self,
        boundary: BlockHash,
        now: Millis,
        mover: &mut dyn Mover,
    ) -> Option<StateSlot> {
        self.alloc_state_in(Room::Any, boundary, now, mover)
    }

    /// [`RetentionCache::alloc_state`], its block slots limited to `room`.
    fn alloc_state_in(
        &mut self,
        room: Room,
        boundary: BlockHash,
        now: Millis,
        mover: &mut dyn Mover,
    ) -> Option<StateSlot> {
        if let Some(s) = self.states.pin(boundary) {
            return Some(s);
        }
        let need = self.cfg.state_blocks();
        let mut backing = Vec::with_capacity(need);
        while backing.len() < need {
            match self.alloc_in(room, now, mover) {
                Some(s) => backing.push(s),
                None => {
                    self.release_backing(backing);
                    return None;
                }
            }
        }
        match self.states.insert(boundary, backing) {
            Ok(s) => Some(s),
            Err(backing) => {
                self.release_backing(backing);
                None
            }
        }
    }

    /// Gives up one device retention: the earliest-expired one (dropped), else the
    /// least valuable live one (offloaded if the host tier takes it, else dropped).
    fn evict_record(&mut self, now: Millis, mover: &mut dyn Mover) -> bool {
        match self.victims.pick(now, None, |_| true) {
            Some((class, key)) => self.evict_key(class, key, now, mover),
            None => false,
        }
    }

    /// Gives up the device retention of `key`: dropped if expired, else offloaded if
    /// the host tier takes it, else dropped.
    fn evict_key(
        &mut self,
        class: Class,
        key: RetentionKey,
        now: Millis,
        mover: &mut dyn Mover,
    ) -> bool {
        let Some(rec) = self.take_record(&key) else {
            return false;
        };
        if class == Class::Expired {
            self.stats.expired_dropped += 1;
        } else if self.offload(&rec, now, mover).is_ok() {
            self.stats.offloaded += 1;
        } else {
            self.stats.dropped += 1;
        }
        self.drop_device_record_cold(rec);
        true
    }

    /// Copies a device record to the host tier: gather the payloads the host lacks,
    /// checksum them, store, and record. Fails (changing nothing) when it does not fit.
    fn offload(
        &mut self,
        rec: &DeviceRecord,
        now: Millis,
        mover: &mut dyn Mover,
    ) -> Result<(), MoveError> {
        if self.host.capacity() == 0 {
            return Err(MoveError("no host tier".into()));
        }
        let state_hashes: Vec<BlockHash> = rec.states.iter().map(|(h, _)| *h).collect();
        let missing_b = self.host.pin_present(HostKind::Block, &rec.hashes);
        let missing_s = self.host.pin_present(HostKind::State, &state_hashes);
        let unpin_present = |host: &mut HostTier| {
            let present_b: Vec<BlockHash> = rec
                .hashes
                .iter()
                .filter(|h| !missing_b.contains(h))
                .copied()
                .collect();
            let present_s: Vec<BlockHash> = state_hashes
                .iter()
                .filter(|h| !missing_s.contains(h))
                .copied()
                .collect();
            host.unpin(HostKind::Block, &present_b);
            host.unpin(HostKind::State, &present_s);
        };
        let need = missing_b.len() as u64 * self.cfg.block_bytes
            + missing_s.len() as u64 * self.cfg.state_bytes;
        let v = rec.meta.priority();
        if !self.host.make_room(need, v, Some(rec.meta.key), now) {
            unpin_present(&mut self.host);
            return Err(MoveError("host tier full of more valuable state".into()));
        }
        let slots: Vec<SlotId> = rec
            .hashes
            .iter()
            .zip(&rec.chain)
            .filter(|(h, _)| missing_b.contains(h))
            .map(|(_, s)| *s)
            .collect();
        let sslots: Vec<StateSlot> = rec
            .states
            .iter()
            .filter(|(h, _)| missing_s.contains(h))
            .map(|(_, s)| *s)
            .collect();
        let gathered = mover
            .gather_blocks(&slots)
            .and_then(|b| split(b, slots.len()))
            .and_then(|b| {
                mover
                    .gather_states(&sslots)
                    .and_then(|s| split(s, sslots.len()))
                    .map(|s| (b, s))
            });
        let (bp, sp) = match gathered {
            Ok(x) => x,
            Err(e) => {
                unpin_present(&mut self.host);
                return Err(e);
            }
        };
        for (h, p) in missing_b.iter().zip(bp) {
            self.host.put(HostKind::Block, *h, p, self.cfg.block_bytes);
        }
        for (h, p) in missing_s.iter().zip(sp) {
            self.host.put(HostKind::State, *h, p, self.cfg.state_bytes);
        }
        self.host.insert_record(HostRecord {
            meta: rec.meta.clone(),
            hashes: rec.hashes.clone(),
            states: state_hashes,
            interval_ms: rec.interval_ms,
        });
        Ok(())
    }

    /// Checks every accounting invariant across pool, states, records and host tier.
    pub fn check(&self) -> Result<(), String> {
        self.pool.check()?;
        self.host.check()?;
        if !self.victims.matches(self.records.values().map(|r| &r.meta)) {
            return Err("device victim index disagrees with records".into());
        }
        let mut retains: HashMap<SlotId, u32> = HashMap::new();
        let mut refs: HashMap<SlotId, u32> = HashMap::new();
        let mut state_pins = 0u64;
        for r in self.records.values() {
            for (s, h) in r.chain.iter().zip(&r.hashes) {
                if self.pool.hash_of(*s) != Some(*h) {
                    return Err(format!(
                        "record {:?} pins slot {s:?} not holding its block",
                        r.meta.key
                    ));
                }
                *retains.entry(*s).or_default() += 1;
            }
            state_pins += r.states.len() as u64;
        }
        for s in self.states.backing_slots() {
            if self.pool.hash_of(s).is_some() {
                return Err(format!("slot {s:?} backs a snapshot and holds a block"));
            }
            *refs.entry(s).or_default() += 1;
        }
        if let Some(b) = self
            .states
            .boundaries()
            .find(|b| self.pool.get(*b).is_none())
        {
            return Err(format!("snapshot at {b:?} outlived its boundary block"));
        }
        for run in self.running.values() {
            for (i, s) in run.slots.iter().enumerate() {
                *refs.entry(*s).or_default() += 1;
                if let Some(c) = run.canonical[i].filter(|c| c != s) {
                    *refs.entry(c).or_default() += 1;
                }
            }
            for s in &run.tail {
                *refs.entry(*s).or_default() += 1;
            }
            state_pins += u64::from(run.state_pin.is_some());
        }
        for i in 0..self.pool.capacity() {
            let s = SlotId(i as u32);
            if self.pool.retains(s) != retains.get(&s).copied().unwrap_or(0) {
                return Err(format!("slot {i}: retains disagree with records"));
            }
            if self.pool.refs(s) != refs.get(&s).copied().unwrap_or(0) {
                return Err(format!("slot {i}: refs disagree with running requests"));
            }
        }
        if self.states.total_pins() != state_pins {
            return Err(format!(
                "state pins {} != holders {state_pins}",
                self.states.total_pins()
            ));
        }
        self.states.check()?;
        Ok(())
    }
}

mod anchor;
mod prefetch;
pub use prefetch::{PrefetchSkip, Prefetched};
#[cfg(test)]
mod tests;
