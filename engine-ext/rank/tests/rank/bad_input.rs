//! Bad input gets an API-shaped error and a counter, and the rank keeps serving.

use crate::harness::{Server, chat, total};
use bytes::Bytes;

/// (method, path, headers, body, status, counter reason).
type Case<'a> = (
    &'a str,
    &'a str,
    Vec<(&'a str, &'a str)>,
    Bytes,
    u16,
    &'a str,
);

#[tokio::test]
async fn bad_requests_get_api_shaped_errors_and_counters() {
    let s = Server::start(&["--max-body-bytes", "100000", "--max-model-len", "5000"]).await;
    let cases: Vec<Case> = vec![
        (
            "POST",
            "/v1/chat/completions",
            vec![],
            Bytes::from_static(b"{not json"),
            400,
            "not_json",
        ),
        (
            "POST",
            "/v1/chat/completions",
            vec![],
            Bytes::from_static(b"[1,2]"),
            400,
            "not_object",
        ),
        (
            "POST",
            "/v1/chat/completions",
            vec![],
            Bytes::from_static(b"{\"messages\": 5}"),
            400,
            "bad_field",
        ),
        (
            "POST",
            "/v1/messages",
            vec![],
            Bytes::from_static(b"{\"messages\": []}"),
            400,
            "bad_field",
        ),
        (
            "POST",
            "/v1/completions",
            vec![],
            Bytes::from_static(b"{\"prompt\": \"a\", \"max_tokens\": -1}"),
            400,
            "bad_field",
        ),
        (
            "POST",
            "/v1/chat/completions",
            vec![],
            Bytes::from(vec![b' '; 200_000]),
            413,
            "too_large",
        ),
        (
            "POST",
            "/v1/embeddings",
            vec![],
            Bytes::from_static(b"{}"),
            404,
            "unknown_path",
        ),
        (
            "GET",
            "/v1/chat/completions",
            vec![],
            Bytes::new(),
            405,
            "method",
        ),
        (
            "POST",
            "/v1/chat/completions",
            vec![("x-tether-session", "ab"), ("x-tether-prompt-end", "maybe")],
            Bytes::from(serde_json::to_vec(&chat("s", &["u"], 1)).unwrap()),
            400,
            "bad_marker",
        ),
        (
            "POST",
            "/v1/chat/completions",
            vec![("x-tether-session", "not-hex")],
            Bytes::from(serde_json::to_vec(&chat("s", &["u"], 1)).unwrap()),
            400,
            "bad_marker",
        ),
        (
            "POST",
            "/v1/chat/completions",
            vec![],
            Bytes::from_static(b"{\"messages\": [], \"max_tokens\": 1}"),
            400,
            "bad_prompt",
        ),
        (
            "POST",
            "/v1/chat/completions",
            vec![],
            Bytes::from(serde_json::to_vec(&chat("s", &["u"], 6000)).unwrap()),
            400,
            "bad_prompt",
        ),
    ];
    for (method, path, headers, body, status, reason) in &cases {
        let r = s.send(method, path, headers, body.clone()).await;
        assert_eq!(r.status.as_u16(), *status, "{path} {reason}: {}", r.text());
        let v = r.json();
        if *path == "/v1/messages" {
            assert_eq!(v["type"], "error", "{reason}");
            assert!(v["error"]["message"].is_string());
        } else {
            assert_eq!(v["error"]["code"], *status, "{reason}: {v}");
            assert!(v["error"]["message"].as_str().unwrap().len() > 3);
        }
    }
    let m = s.metrics().await;
    for (_, _, _, _, _, reason) in &cases {
        let want = cases.iter().filter(|c| c.5 == *reason).count() as f64;
        assert_eq!(
            total(&m, "tether_rank_bad_requests_total", &[("reason", reason)]),
            want,
            "{reason}"
        );
    }
    // Still serving.
    let r = s
        .post("/v1/chat/completions", &[], &chat("fine", &["go"], 2))
        .await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn a_client_that_goes_away_is_cancelled() {
    let s = Server::start(&["--speedup", "1"]).await;
    // A long answer at real time: the client hangs up after a moment.
    let body = serde_json::to_vec(&chat("long", &["answer"], 100_000)).unwrap();
    let addr = s.addr;
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    {
        use tokio::io::AsyncWriteExt;
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(req.as_bytes()).await.unwrap();
        c.write_all(&body).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let load = s.get("/load").await.json();
        let m = s.metrics().await;
        if load["server_load"] == 0
            && total(
                &m,
                "vllm:request_success_total",
                &[("finished_reason", "abort")],
            ) == 1.0
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not cancelled: {load}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_responses_chain_continues_only_on_the_rank_that_answered_it() {
    let (a, b) = (Server::start(&[]).await, Server::start(&[]).await);
    let turn = |previous: Option<&str>| {
        let mut body = serde_json::json!({"input": "hello there", "max_output_tokens": 2});
        if let Some(p) = previous {
            body["previous_response_id"] = serde_json::json!(p);
        }
        body
    };
    let first = a.post("/v1/responses", &[], &turn(None)).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let id = first.json()["id"].as_str().unwrap_or_default().to_owned();
    let next = a.post("/v1/responses", &[], &turn(Some(&id))).await;
    assert_eq!(
        next.status,
        200,
        "the rank that answered it: {}",
        next.text()
    );
    for (server, previous) in [
        (&b, id.as_str()),
        (&a, "resp_0123456789abcdef"),
        (&a, "resp_tt1_not_mine"),
    ] {
        let r = server
            .post("/v1/responses", &[], &turn(Some(previous)))
            .await;
        assert_eq!(r.status, 404, "{previous}: {}", r.text());
        assert_eq!(
            r.json()["error"]["message"],
            format!("Response with id '{previous}' not found.")
        );
    }
    assert_eq!(
        total(
            &a.metrics().await,
            "tether_rank_bad_requests_total",
            &[("reason", "unknown_response")]
        ),
        2.0
    );
}
