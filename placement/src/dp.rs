//! The data-parallel rank on the chosen endpoint.

use xxhash_rust::xxh3::xxh3_64_with_seed;

const SEED_RANK: u64 = 0x5254_4e4b_7465_7468;

/// DP rank in `[0, dp_size)` from a hash independent of the endpoint choice,
/// so a key keeps its rank when the endpoint set changes.
pub fn dp_rank(key: u64, dp_size: u32) -> u32 {
    if dp_size <= 1 {
        return 0;
    }
    let h = xxh3_64_with_seed(&key.to_le_bytes(), SEED_RANK);
    // Multiply-shift maps uniformly onto [0, dp_size) without modulo bias.
    ((u128::from(h) * u128::from(dp_size)) >> 64) as u32
}
