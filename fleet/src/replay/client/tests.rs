use super::*;

#[test]
fn targets_are_http_urls_with_a_host_and_a_numeric_port() {
    for (s, origin, prefix) in [
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080", ""),
        ("http://[::1]:8080/v2/", "http://[::1]:8080", "/v2"),
        ("http://gateway", "http://gateway", ""),
        ("http://[::1]", "http://[::1]", ""),
    ] {
        let t = Target::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!((t.origin.as_str(), t.prefix.as_str()), (origin, prefix));
    }
    for (s, why) in [
        ("http://not-a-host:abc", "port is not a number"),
        ("http://host:70000", "port is not a number"),
        ("http://host:", "port is not a number"),
        ("https://host:1", "plain http only"),
        ("127.0.0.1:8080", "no scheme"),
    ] {
        let e = Target::parse(s)
            .err()
            .unwrap_or_else(|| panic!("{s} accepted"));
        assert!(e.to_string().contains(why), "{s}: {e}");
    }
}
