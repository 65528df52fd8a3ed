use super::*;
use crate::sim::testkit::agent_trace;

#[test]
fn users_own_several_sessions_and_share_addresses() {
    let t = agent_trace(200, 1, 1000, 10, 16);
    let m = IdentityModel::default();
    let ids = Identities::derive(&t, &m);
    // Every fifth session names a user (u0..u19, ten sessions apart): 40 named.
    assert_eq!(ids.users_from_trace, 40);
    // 160 unnamed sessions at 4 per user: about 40 derived users (fewer if a draw is empty).
    assert!(ids.users > 20 + 30 && ids.users <= 20 + 40, "{}", ids.users);
    assert!(ids.addresses <= ids.users.div_ceil(16) && ids.addresses >= 1);
    // Deterministic, and the seed matters.
    let again = Identities::derive(&t, &m);
    let other = Identities::derive(
        &t,
        &IdentityModel {
            seed: 2,
            ..m.clone()
        },
    );
    let keys =
        |i: &Identities| -> Vec<u64> { (0..200).map(|s| i.user_key(SessionId(s))).collect() };
    assert_eq!(keys(&ids), keys(&again));
    assert_ne!(keys(&ids), keys(&other));
    // Two sessions of one named user hash alike.
    assert_eq!(ids.user_key(SessionId(0)), ids.user_key(SessionId(5)));
}

#[test]
fn the_routing_key_separates_subagents_from_their_session() {
    let t = agent_trace(3, 2, 1000, 10, 16);
    let reqs = t.session_requests(SessionId(0));
    let keys: Vec<u64> = reqs.iter().map(|&r| request_key(&t, r).0).collect();
    let agents: Vec<_> = reqs.iter().map(|&r| t.request(r).agent).collect();
    for i in 0..reqs.len() {
        for j in 0..reqs.len() {
            assert_eq!(keys[i] == keys[j], agents[i] == agents[j]);
        }
    }
}
