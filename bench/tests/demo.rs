//! `make demo` (the `tether-demo` binary) runs its three settings to the end
//! on a cut of the bundled trace and prints the comparison and where the
//! reports and plots are.

use std::process::Command;
use tether_e2e::paths::{self, need};

#[test]
fn demo_compares_three_settings_and_writes_reports() {
    need(paths::require_envoy());
    need(paths::require_filter_wasm());
    let out_dir = std::env::temp_dir().join(format!("tether-demo-test-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_tether-demo"))
        .args(["--sessions", "10", "--speedup", "100", "--out"])
        .arg(&out_dir)
        .current_dir(paths::workspace_root())
        .output()
        .expect("tether-demo runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for setting in [
        "(a) round robin + LRU",
        "(b) tether routing + LRU",
        "(c) tether + retention + host tier",
    ] {
        let row = stdout
            .lines()
            .find(|l| l.starts_with(&format!("| {setting} |")))
            .unwrap_or_else(|| panic!("no row for {setting}:\n{stdout}"));
        assert_eq!(row.matches('|').count(), 7, "{row}");
    }
    assert!(stdout.contains("What the numbers show:"), "{stdout}");
    for f in [
        "compare/compare.md",
        "compare/ttft_cdf.svg",
        "a-round-robin-lru/report.json",
        "c-tether-retention-host/report.md",
    ] {
        assert!(out_dir.join(f).is_file(), "{f} missing");
    }
    let _ = std::fs::remove_dir_all(&out_dir);
}
