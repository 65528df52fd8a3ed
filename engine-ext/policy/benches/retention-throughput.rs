//! CPU benchmark of the retention policy at 1M device blocks: policy decisions per
//! second and bytes of metadata per block (measured with a counting allocator).
//!
//! Run: `cargo bench -p tether-engine --bench retention-throughput [-- --turns N]`

use anyhow::Result;
use clap::Parser;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
use tether_engine::hash::{ROOT_HASH, block_hash};
use tether_engine::marker::HexId;
use tether_engine::{
    BlockHash, MetadataOnly, PolicyConfig, RequestId, RetentionCache, RetentionKey, TurnKind,
    TurnMarker,
};

/// Counts live heap bytes so the benchmark can report what the policy's metadata costs.
struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: delegates every call to `System` unchanged; only adds bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size(), Ordering::Relaxed);
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        // SAFETY: `p` was allocated by `System` with `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        LIVE.fetch_add(n, Ordering::Relaxed);
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[derive(Parser, Debug)]
#[command(about = "Retention policy decisions per second and metadata bytes per block")]
struct Args {
    /// Passed by `cargo bench` to every bench target; ignored.
    #[arg(long, hide = true)]
    bench: bool,
    /// Device blocks per rank.
    #[arg(long, default_value_t = 1 << 20)]
    blocks: usize,
    /// Concurrent sessions.
    #[arg(long, default_value_t = 16_384)]
    sessions: u64,
    /// Turns to time after the pool is full.
    #[arg(long, default_value_t = 200_000)]
    turns: u64,
    /// Host tier as a multiple of device capacity (0 = none).
    #[arg(long, default_value_t = 4)]
    host_factor: u64,
}

/// Deterministic SplitMix64.
fn next(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

struct Session {
    epoch: u64,
    chain: Vec<BlockHash>,
}

fn grow(s: &mut Session, id: u64, by: usize) {
    let mut p = s.chain.last().copied().unwrap_or(ROOT_HASH);
    for _ in 0..by {
        let i = s.chain.len() as u32;
        p = block_hash(p, &[id as u32, s.epoch as u32, i], &[]);
        s.chain.push(p);
    }
}

fn main() -> Result<()> {
    let a = Args::parse();
    let base = LIVE.load(Ordering::Relaxed);
    let cfg = PolicyConfig {
        device_blocks: a.blocks,
        block_bytes: 2 << 20,
        host_bytes: a.host_factor * a.blocks as u64 * (2 << 20),
        ..PolicyConfig::default()
    };
    let mut cache = RetentionCache::try_new(cfg)?;
    let empty_pool = LIVE.load(Ordering::Relaxed) - base;
    let mut mover = MetadataOnly;
    let mut sessions: Vec<Session> = (0..a.sessions)
        .map(|_| Session {
            epoch: 0,
            chain: Vec::new(),
        })
        .collect();
    let (mut rng, mut now, mut id) = (7u64, 0u64, 0u64);
    let mut turn = |cache: &mut RetentionCache,
                    rng: &mut u64,
                    now: &mut u64,
                    id: &mut u64|
     -> Result<(usize, usize)> {
        let s = (next(rng) % a.sessions) as usize;
        let sess = &mut sessions[s];
        if sess.chain.len() >= 256 {
            sess.epoch += 1;
            sess.chain.clear();
        }
        grow(sess, s as u64, 1 + (next(rng) % 16) as usize);
        *now += 5;
        *id += 1;
        let key = RetentionKey {
            tenant: HexId(0),
            session: HexId(s as u128),
            subagent: HexId(sess.epoch as u128),
        };
        let kind = if next(rng).is_multiple_of(4) {
            TurnKind::User
        } else {
            TurnKind::Tool
        };
        let m = TurnMarker {
            key,
            prompt_end: true,
            kind,
            turn: None,
            retention_ms: None,
        };
        let adm = cache.admit(RequestId(*id), &sess.chain, Some(key), *now, &mut mover)?;
        cache.finish_prefill(RequestId(*id), Some(&m), *now, &mut mover)?;
        cache.release(RequestId(*id))?;
        Ok((sess.chain.len(), adm.cached_blocks))
    };
    // Fill: run turns until every slot has held a block once and evictions have begun.
    let t0 = Instant::now();
    let mut fill_turns = 0u64;
    while cache.pool().evicted() == 0 {
        turn(&mut cache, &mut rng, &mut now, &mut id)?;
        fill_turns += 1;
    }
    let fill_secs = t0.elapsed().as_secs_f64();
    let cached = cache.pool().cached();
    let full = LIVE.load(Ordering::Relaxed) - base;
    let records = cache.device_records();
    // Timed steady state.
    let before = cache.stats();
    let evicted0 = cache.pool().evicted();
    let t1 = Instant::now();
    let (mut blocks, mut hits) = (0usize, 0usize);
    for _ in 0..a.turns {
        let (b, h) = turn(&mut cache, &mut rng, &mut now, &mut id)?;
        blocks += b;
        hits += h;
    }
    let secs = t1.elapsed().as_secs_f64();
    let after = cache.stats();
    let evicted = cache.pool().evicted() - evicted0;
    let record_decisions = (after.retained - before.retained)
        + (after.expired_dropped - before.expired_dropped)
        + (after.offloaded - before.offloaded)
        + (after.dropped - before.dropped);
    println!(
        "device pool {} blocks, {} sessions, host tier {}x",
        a.blocks, a.sessions, a.host_factor
    );
    println!(
        "fill: {fill_turns} turns in {fill_secs:.2} s; {cached} blocks cached, {records} device retentions"
    );
    println!(
        "metadata: empty pool {:.1} B/block; full (pool + index + retention records + host records) {:.1} B/block; pool alone (by capacity) {:.1} B/block",
        empty_pool as f64 / a.blocks as f64,
        full as f64 / a.blocks as f64,
        cache.pool().metadata_bytes() as f64 / a.blocks as f64
    );
    println!(
        "steady state: {} turns in {secs:.2} s = {:.0} turns/s (admit + finish_prefill + release); {:.2} M block decisions/s (lookup/pin/publish/retain {blocks} + evict {evicted}); {:.0} retention decisions/s (retain/expire/offload/drop {record_decisions}); hit {:.1} %",
        a.turns,
        a.turns as f64 / secs,
        (blocks as f64 + evicted as f64) / secs / 1e6,
        record_decisions as f64 / secs,
        100.0 * hits as f64 / blocks.max(1) as f64
    );
    Ok(())
}
