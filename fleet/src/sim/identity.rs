//! What identity each routing policy sees in a trace: the routing key the
//! tether gateway derives, the end user, the client address.
//!
//! Traces record sessions (and sometimes a user); none records the client's
//! network address. A policy that hashes on the user or the address therefore
//! needs them derived, and the derivation is an assumption the report states:
//!
//! - **user**: the session's `user` (scoped by tenant) when the trace has one;
//!   otherwise users are drawn so that each owns `sessions_per_user` sessions
//!   on average — a seeded hash of the session picks one of
//!   `⌈sessions / sessions_per_user⌉` users, so a user's sessions may run at
//!   the same time, as an engineer running several agents does;
//! - **client address**: each user connects from one address, and
//!   `users_per_address` users share one (corporate NAT, an agent platform's
//!   egress, a CI cluster): a seeded hash of the user picks one of
//!   `⌈users / users_per_address⌉` addresses.
//!
//! The tether key needs no assumption: it is the session (plus the agent for a
//! subagent), which the gateway reads from explicit ids (`docs/gateway.md`).

use crate::trace::{RequestId, SessionId, Trace};
use std::collections::HashMap;
use tether_engine::marker::{HexId, RetentionKey};
use tether_placement::hash_parts;
use tether_placement::keys::{routing_key, session_hash, subagent_hash};

/// How users and client addresses are derived when the trace lacks them.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct IdentityModel {
    /// Mean sessions per derived user (≥ 1).
    pub sessions_per_user: f64,
    /// Users behind one client address (≥ 1).
    pub users_per_address: u32,
    /// Seed of the derivation.
    pub seed: u64,
}

impl Default for IdentityModel {
    fn default() -> Self {
        Self {
            sessions_per_user: 4.0,
            users_per_address: 16,
            seed: 1,
        }
    }
}

/// Users and addresses of every session, as derived.
#[derive(Clone, Debug)]
pub struct Identities {
    user: Vec<u64>,
    address: Vec<u64>,
    /// Distinct users.
    pub users: usize,
    /// Distinct client addresses.
    pub addresses: usize,
    /// Sessions whose user came from the trace.
    pub users_from_trace: usize,
}

fn mix(x: u64) -> u64 {
    // splitmix64's finalizer: a bijection, good enough to spread ids.
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Identities {
    /// Derives users and addresses for every session of `trace`.
    pub fn derive(trace: &Trace, model: &IdentityModel) -> Self {
        let n = trace.sessions().len();
        let unnamed = trace.sessions().iter().filter(|s| s.user.is_none()).count();
        let derived_users =
            ((unnamed as f64 / model.sessions_per_user.max(1.0)).ceil() as u64).max(1);
        let mut named: HashMap<(&str, &str), u64> = HashMap::new();
        let mut user = Vec::with_capacity(n);
        for (i, s) in trace.sessions().iter().enumerate() {
            let u = match &s.user {
                Some(u) => {
                    let next = named.len() as u64;
                    *named
                        .entry((s.tenant.as_deref().unwrap_or_default(), u.as_str()))
                        .or_insert(next)
                }
                // Derived users live above every named one.
                None => (1 << 40) + mix(model.seed ^ mix(i as u64)) % derived_users,
            };
            user.push(u);
        }
        let mut distinct: Vec<u64> = user.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let users = distinct.len();
        let addresses = (users as u64)
            .div_ceil(u64::from(model.users_per_address.max(1)))
            .max(1);
        let address: Vec<u64> = user
            .iter()
            .map(|&u| mix(model.seed.rotate_left(17) ^ mix(u)) % addresses)
            .collect();
        let mut used: Vec<u64> = address.clone();
        used.sort_unstable();
        used.dedup();
        Self {
            user,
            address,
            users,
            addresses: used.len(),
            users_from_trace: n - unnamed,
        }
    }

    /// Routing key of a session's user (`x-user-id`-style hashing).
    pub fn user_key(&self, s: SessionId) -> u64 {
        hash_parts(&[b"user", &self.user[s.0 as usize].to_le_bytes()])
    }

    /// Routing key of a session's client address (source-IP hashing).
    pub fn address_key(&self, s: SessionId) -> u64 {
        hash_parts(&[b"client", &self.address[s.0 as usize].to_le_bytes()])
    }
}

/// The routing key of a request as the gateway derives it from explicit ids
/// (the session, plus the agent for a subagent; the main agent has none) and
/// the retention key its turn markers carry.
pub fn request_key(trace: &Trace, id: RequestId) -> (u64, RetentionKey) {
    let r = trace.request(id);
    let s = trace.session(r.session);
    let a = trace.agent(r.agent);
    let tenant = s.tenant.as_deref().unwrap_or_default().as_bytes();
    let sub = a.parent.map(|_| a.id.as_bytes());
    let key = routing_key(tenant, s.id.as_bytes(), sub);
    let rk = RetentionKey {
        tenant: HexId(0),
        session: HexId(u128::from(session_hash(tenant, s.id.as_bytes()))),
        subagent: HexId(u128::from(subagent_hash(tenant, sub))),
    };
    (key, rk)
}

#[cfg(test)]
mod tests;
