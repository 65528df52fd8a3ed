//! The real `tether-rank` binary: starts, serves, and refuses bad flags and
//! profiles at start, naming the field.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_tether-rank")
}

struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_binary_serves_over_loopback() {
    let mut child = Child(
        Command::new(bin())
            .args([
                "--profile",
                &crate::harness::profile_path().display().to_string(),
            ])
            .args([
                "--listen",
                "127.0.0.1:0",
                "--speedup",
                "100",
                "--cache",
                "retention-host",
                "--host-gib",
                "1",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("READY ")
        .unwrap_or_else(|| panic!("no READY line: {line:?}"));
    let body = serde_json::to_vec(&crate::harness::chat("bin", &["hi"], 3)).unwrap();
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    write!(
        c,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    c.write_all(&body).unwrap();
    let mut reply = String::new();
    c.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("\"cached_tokens\":0"), "{reply}");
    // Without --rank-id the rank names itself by its bound address.
    assert!(
        reply.contains(&format!("x-tether-rank: {addr}\r\n")),
        "{reply}"
    );
}

fn refusal(args: &[&str]) -> String {
    let out = Command::new(bin()).args(args).output().unwrap();
    assert!(!out.status.success(), "{args:?} started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn bad_flags_and_profiles_fail_at_start_naming_the_field() {
    let p = crate::harness::profile_path().display().to_string();
    assert!(refusal(&["--profile", &p, "--speedup", "0"]).contains("--speedup"));
    assert!(refusal(&["--profile", &p, "--cache", "retention-host"]).contains("--host-gib"));
    assert!(refusal(&["--profile", &p, "--host-gib", "1"]).contains("--host-gib"));
    assert!(refusal(&["--profile", &p, "--prefetch"]).contains("--prefetch"));
    assert!(refusal(&["--profile", &p, "--kv-tokens", "3"]).contains("--kv-tokens"));
    assert!(
        refusal(&["--profile", &p, "--max-num-batched-tokens", "8"])
            .contains("--max-num-batched-tokens")
    );
    assert!(refusal(&["--profile", &p, "--cache", "fifo"]).contains("--cache"));
    assert!(
        refusal(&["--profile", "/nonexistent/profile.json"]).contains("/nonexistent/profile.json")
    );
    let dir = std::env::temp_dir().join(format!("tether-rank-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    v["decode"]["points"][0]["itl_ms"] = serde_json::json!("fast");
    std::fs::write(&bad, v.to_string()).unwrap();
    let e = refusal(&["--profile", &bad.display().to_string()]);
    assert!(e.contains("decode.points[0].itl_ms"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
