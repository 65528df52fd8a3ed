use super::*;
use proptest::prelude::*;

/// The reference computation, written out independently of `encode_block`.
fn reference(parent: u128, tokens: &[u32], salt: Option<&[u8]>) -> u128 {
    let mut b = Vec::new();
    b.extend_from_slice(&parent.to_le_bytes());
    b.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
    for t in tokens {
        b.extend_from_slice(&t.to_le_bytes());
    }
    match salt {
        None => b.extend_from_slice(&0u32.to_le_bytes()),
        Some(s) => {
            b.extend_from_slice(&1u32.to_le_bytes());
            b.push(1);
            b.extend_from_slice(&(s.len() as u32).to_le_bytes());
            b.extend_from_slice(s);
        }
    }
    xxh3_128(&b)
}

#[test]
fn partial_tail_is_not_hashed_and_zero_block_size_is_rejected() {
    let h = BlockHasher::try_new(4).expect("nonzero");
    assert_eq!(
        h.hash_prompt(&[1, 2, 3, 4, 5, 6, 7], &RequestKeys::default())
            .len(),
        1
    );
    assert!(BlockHasher::try_new(0).is_none());
    assert_eq!(BlockHasher::default().block_size(), 16);
}

#[test]
fn lora_enters_every_block() {
    let h = BlockHasher::try_new(2).expect("nonzero");
    let toks = [1, 2, 3, 4];
    let plain = h.hash_prompt(&toks, &RequestKeys::default());
    let lora = RequestKeys {
        lora: Some(b"adapter".to_vec()),
        ..Default::default()
    };
    let with = h.hash_prompt(&toks, &lora);
    assert_ne!(plain[0], with[0]);
    let direct = block_hash(with[0], &[3, 4], &[ExtraKey::Lora(b"adapter".to_vec())]);
    assert_eq!(direct, with[1]);
}

proptest! {
    #[test]
    fn chain_equals_reference(tokens in proptest::collection::vec(any::<u32>(), 0..200),
                              bs in 1usize..20,
                              salt in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..12))) {
        let h = BlockHasher::try_new(bs).expect("nonzero");
        let keys = RequestKeys { cache_salt: salt.clone(), lora: None };
        let got = h.hash_prompt(&tokens, &keys);
        let mut parent = ROOT_HASH.0;
        let mut want = Vec::new();
        for (i, c) in tokens.chunks_exact(bs).enumerate() {
            parent = reference(parent, c, if i == 0 { salt.as_deref() } else { None });
            want.push(BlockHash(parent));
        }
        prop_assert_eq!(&got, &want);
        // Extending a prefix of the chain gives the same chain.
        let mut ext = got[..got.len() / 2].to_vec();
        h.extend_hashes(&mut ext, &tokens, &keys);
        prop_assert_eq!(ext, got);
    }

    #[test]
    fn salt_changes_every_block_and_only_salted_chains_collide(
        tokens in proptest::collection::vec(any::<u32>(), 16..128),
        a in proptest::collection::vec(any::<u8>(), 1..8),
        b in proptest::collection::vec(any::<u8>(), 1..8)) {
        let h = BlockHasher::try_new(8).expect("nonzero");
        let ka = RequestKeys { cache_salt: Some(a.clone()), lora: None };
        let kb = RequestKeys { cache_salt: Some(b.clone()), lora: None };
        let ha = h.hash_prompt(&tokens, &ka);
        let hb = h.hash_prompt(&tokens, &kb);
        let hn = h.hash_prompt(&tokens, &RequestKeys::default());
        for i in 0..ha.len() {
            prop_assert_eq!(ha[i] == hb[i], a == b);
            prop_assert_ne!(ha[i], hn[i]);
        }
    }

    #[test]
    fn a_changed_token_changes_its_block_and_everything_downstream_only(
        tokens in proptest::collection::vec(any::<u32>(), 32..160), pos in any::<prop::sample::Index>()) {
        let h = BlockHasher::try_new(16).expect("nonzero");
        let full = tokens.len() / 16 * 16;
        let p = pos.index(full);
        let mut changed = tokens.clone();
        changed[p] = changed[p].wrapping_add(1);
        let x = h.hash_prompt(&tokens, &RequestKeys::default());
        let y = h.hash_prompt(&changed, &RequestKeys::default());
        for i in 0..x.len() {
            prop_assert_eq!(x[i] == y[i], i < p / 16);
        }
    }
}

/// Each kind of extra key has its own tag, so equal bytes of different kinds
/// never give the same block hash; the encoding is the documented one.
#[test]
fn extra_key_kinds_are_told_apart() {
    let salt = block_hash(ROOT_HASH, &[7], &[ExtraKey::CacheSalt(b"x".to_vec())]);
    let lora = block_hash(ROOT_HASH, &[7], &[ExtraKey::Lora(b"x".to_vec())]);
    assert_ne!(salt, lora);
    let encoded = |tag: u8, body: &[u8]| {
        let mut b = Vec::new();
        b.extend_from_slice(&ROOT_HASH.0.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&7u32.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
        b.push(tag);
        b.extend_from_slice(body);
        BlockHash(xxh3_128(&b))
    };
    let x = [1u32.to_le_bytes().as_slice(), b"x"].concat();
    assert_eq!(salt, encoded(1, &x));
    assert_eq!(lora, encoded(2, &x));
    let mm = block_hash(
        ROOT_HASH,
        &[7],
        &[ExtraKey::MultiModal { hash: 5, offset: 3 }],
    );
    let body = [
        20u32.to_le_bytes().as_slice(),
        &5u128.to_le_bytes(),
        &3u32.to_le_bytes(),
    ]
    .concat();
    assert_eq!(mm, encoded(3, &body));
}
