use super::*;

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

fn target(s: &str) -> Target {
    Target::parse(s).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn ranks_are_found_by_address_by_gateway_endpoint_or_as_the_one_target() {
    let one = [target("http://127.0.0.1:9000")];
    let gw = names(&["127.0.0.1:8001", "127.0.0.1:8002"]);
    let origins = |seen: &[&str], targets: &[Target], gw: &[String]| -> Vec<String> {
        discover_ranks(&names(seen), targets, gw)
            .into_iter()
            .map(|(o, _)| o)
            .collect()
    };
    // Ranks that name themselves by address are asked there.
    assert_eq!(
        origins(&["127.0.0.1:8002"], &one, &gw),
        ["http://127.0.0.1:8002"]
    );
    // Ranks with their own ids: every gateway endpoint is asked.
    assert_eq!(
        origins(&["gpu-0", "gpu-1"], &one, &gw),
        ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    );
    // One named rank behind one target and no gateway known: the target is the rank.
    assert_eq!(origins(&["gpu-0"], &one, &[]), ["http://127.0.0.1:9000"]);
    // Named ranks, several targets, no gateway: nowhere to ask (the replay warns).
    let two = [target("http://127.0.0.1:1"), target("http://127.0.0.1:2")];
    assert!(origins(&["gpu-0"], &two, &[]).is_empty());
}
