use crate::import::Format;
use crate::sim::{CacheMode, Policy};

#[test]
fn a_known_name_is_picked_and_an_unknown_one_lists_the_known() {
    assert_eq!(Policy::parse("tether-load"), Ok(Policy::TetherLoad));
    assert_eq!(
        CacheMode::parse("retention-host"),
        Ok(CacheMode::RetentionHost)
    );
    assert_eq!(
        CacheMode::parse("lfu").map_err(|e| e.to_string()),
        Err("unknown cache mode `lfu` (known: lru, retention, retention-host)".to_owned())
    );
    // Formats ignore case and blanks, and the error shows the name as given.
    assert_eq!(Format::parse(" Mooncake "), Ok(Format::Mooncake));
    let e = Format::parse("ShareGPT").map_err(|e| e.to_string());
    assert_eq!(
        e,
        Err(
            "unknown trace format `ShareGPT` (known: tether, mooncake, bailian, agentx, tracelab)"
                .to_owned()
        )
    );
}
