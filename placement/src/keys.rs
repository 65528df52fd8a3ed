//! Routing-key hashes: what the gateway derives from an identity, and what the
//! ranks, replay and the simulator must derive identically.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Fixed seed of every tether hash (keys must agree across gateway replicas).
pub const SEED: u64 = 0x7e7e_4e52_5445_5448;

/// Hash of length-prefixed parts (so `("ab","c")` and `("a","bc")` differ).
/// Built on the stack when it fits: this runs several times per request on
/// the gateway's header path, where a heap allocation each time is measurable
/// in V8.
pub fn hash_parts(parts: &[&[u8]]) -> u64 {
    let total: usize = parts.iter().map(|p| p.len() + 4).sum();
    let mut stack = [0u8; 128];
    if let Some(buf) = stack.get_mut(..total) {
        let mut rest: &mut [u8] = buf;
        for p in parts {
            let len = u32::try_from(p.len()).unwrap_or(u32::MAX).to_le_bytes();
            for chunk in [len.as_slice(), p] {
                let (head, tail) = rest.split_at_mut(chunk.len());
                head.copy_from_slice(chunk);
                rest = tail;
            }
        }
        return xxh3_64_with_seed(buf, SEED);
    }
    let mut buf = Vec::with_capacity(total);
    for p in parts {
        buf.extend_from_slice(&u32::try_from(p.len()).unwrap_or(u32::MAX).to_le_bytes());
        buf.extend_from_slice(p);
    }
    xxh3_64_with_seed(&buf, SEED)
}

/// The routing key: `xxh3(tenant ‖ session ‖ subagent)` (empty subagent = the main agent).
pub fn routing_key(tenant: &[u8], session: &[u8], subagent: Option<&[u8]>) -> u64 {
    hash_parts(&[tenant, session, subagent.unwrap_or_default()])
}

/// `x-tether-tenant`.
pub fn tenant_hash(tenant: &[u8]) -> u64 {
    hash_parts(&[b"tenant", tenant])
}

/// `x-tether-session`: the run, scoped by tenant.
pub fn session_hash(tenant: &[u8], session: &[u8]) -> u64 {
    hash_parts(&[b"session", tenant, session])
}

/// `x-tether-subagent`: 0 for the main agent.
pub fn subagent_hash(tenant: &[u8], subagent: Option<&[u8]>) -> u64 {
    subagent.map_or(0, |s| hash_parts(&[b"subagent", tenant, s]))
}

/// `x-tether-parent`.
pub fn parent_hash(tenant: &[u8], parent: &[u8]) -> u64 {
    hash_parts(&[b"parent", tenant, parent])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The allocation-free path agrees with the plain definition.
    #[test]
    fn stack_hashing_matches_the_plain_definition() {
        let plain = |parts: &[&[u8]]| {
            let mut buf = Vec::new();
            for p in parts {
                buf.extend_from_slice(&(p.len() as u32).to_le_bytes());
                buf.extend_from_slice(p);
            }
            xxh3_64_with_seed(&buf, SEED)
        };
        let long = vec![b'x'; 300];
        for parts in [
            &[][..],
            &[b"".as_slice()][..],
            &[b"tenant".as_slice(), b"t1"][..],
            &[b"a".as_slice(), b"bc", b""][..],
            &[b"session".as_slice(), &long[..240]][..],
            &[b"session".as_slice(), &long[..]][..],
        ] {
            assert_eq!(hash_parts(parts), plain(parts));
        }
    }

    #[test]
    fn every_part_is_in_every_hash() {
        assert_ne!(session_hash(b"t1", b"s"), session_hash(b"t2", b"s"));
        assert_ne!(
            subagent_hash(b"t1", Some(b"a")),
            subagent_hash(b"t2", Some(b"a"))
        );
        assert_ne!(parent_hash(b"t1", b"p"), parent_hash(b"t2", b"p"));
        assert_ne!(
            routing_key(b"t1", b"s", None),
            routing_key(b"t2", b"s", None)
        );
        assert_ne!(
            routing_key(b"", b"s", None),
            routing_key(b"", b"s", Some(b"a"))
        );
        assert_eq!(subagent_hash(b"t", None), 0);
    }

    /// Each hash is its documented definition: a domain tag, then the parts.
    #[test]
    fn hashes_are_their_definitions() {
        assert_eq!(tenant_hash(b"t1"), hash_parts(&[b"tenant", b"t1"]));
        assert_ne!(tenant_hash(b"t1"), tenant_hash(b"t2"));
        assert_eq!(
            session_hash(b"t", b"s"),
            hash_parts(&[b"session", b"t", b"s"])
        );
        assert_eq!(
            subagent_hash(b"t", Some(b"a")),
            hash_parts(&[b"subagent", b"t", b"a"])
        );
        assert_eq!(
            parent_hash(b"t", b"p"),
            hash_parts(&[b"parent", b"t", b"p"])
        );
        assert_eq!(
            routing_key(b"t", b"s", None),
            hash_parts(&[b"t", b"s", b""])
        );
    }
}
