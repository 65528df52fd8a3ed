//! A minimal HTTP/1.0 POST for a puller's lease requests (docs/vllm.md, "State pull
//! (NIXL)"), run with the GIL released.
//!
//! The puller asks for a lease from a thread of vLLM's engine-core process while the
//! scheduler loop runs; a Python HTTP client there needs the GIL for every step of the
//! exchange and got it only between the loop's switch intervals: the lease round trip took
//! 330–460 ms (median) between two idle CPU engines. Here the whole exchange runs without
//! the GIL.

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

/// The largest answer read (a lease for 65,536 blocks is about 6 MiB of JSON).
const MAX_ANSWER: u64 = 64 << 20;

/// POSTs `body` (JSON) to `http://host:port{path}` and returns `(status, body)`. `host` is
/// an IP address. A connection that fails or an answer that does not come within
/// `timeout_ms`, or is not HTTP, raises `OSError`.
#[pyfunction]
pub fn http_post<'py>(
    py: Python<'py>,
    host: &str,
    port: u16,
    path: &str,
    body: &[u8],
    timeout_ms: u64,
) -> PyResult<(u16, Bound<'py, PyBytes>)> {
    let ip: IpAddr = host
        .parse()
        .map_err(|_| PyOSError::new_err(format!("{host}: not an IP address")))?;
    let addr = SocketAddr::new(ip, port);
    let request = [
        format!(
            "POST {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
        body,
    ]
    .concat();
    let timeout = Duration::from_millis(timeout_ms.max(1));
    let answer = py
        .detach(|| exchange(addr, &request, timeout))
        .map_err(|e| PyOSError::new_err(format!("http://{addr}{path}: {e}")))?;
    let (status, payload) = parse(&answer)
        .ok_or_else(|| PyOSError::new_err(format!("http://{addr}{path}: not an HTTP answer")))?;
    Ok((status, PyBytes::new(py, payload)))
}

fn exchange(addr: SocketAddr, request: &[u8], timeout: Duration) -> std::io::Result<Vec<u8>> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.set_nodelay(true)?;
    s.write_all(request)?;
    let mut answer = Vec::new();
    // HTTP/1.0: the server closes the connection after its answer.
    s.take(MAX_ANSWER).read_to_end(&mut answer)?;
    Ok(answer)
}

/// `(status, body)` of an HTTP/1.x answer.
fn parse(answer: &[u8]) -> Option<(u16, &[u8])> {
    let end = answer.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&answer[..end]).ok()?;
    let mut status = head.lines().next()?.split_whitespace();
    if !status.next()?.starts_with("HTTP/1.") {
        return None;
    }
    let code = status.next()?.parse().ok()?;
    Some((code, &answer[end + 4..]))
}
