//! A guard-owned simulated rank: a real `tether-rank` process (engine-ext/rank)
//! on an ephemeral port, killed on drop.

use crate::rank::read_ready;
use crate::{HarnessError, paths};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running `tether-rank`.
#[derive(Debug)]
pub struct SimRank {
    addr: SocketAddr,
    child: Child,
}

impl SimRank {
    /// Starts `tether-rank --listen 127.0.0.1:0 <args>` (binary located by
    /// [`paths::tether_rank_bin`]) and waits for its `READY <addr>` line.
    pub fn start(args: &[String]) -> Result<Self, HarnessError> {
        let bin = paths::require(
            "tether-rank",
            paths::tether_rank_bin(),
            "run `cargo build -p tether-rank --bin tether-rank`",
        )?;
        let mut child = Command::new(&bin)
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|source| HarnessError::Spawn {
                what: "tether-rank".into(),
                source,
            })?;
        let addr = read_ready(
            &mut child,
            &format!("tether-rank {args:?}"),
            Duration::from_secs(20),
        )?;
        Ok(Self { addr, child })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its process id (for CPU accounting).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its load report (`GET /load`: `server_load`, per-rank gauges and the
    /// residency summary; docs/rank.md).
    pub fn load(&self) -> Result<serde_json::Value, HarnessError> {
        let (status, body) = crate::envoy::admin_get(self.addr, "/load")?;
        let protocol = |why: String| HarnessError::Protocol {
            what: format!("tether-rank {} /load", self.addr),
            why,
        };
        if status != 200 {
            return Err(protocol(format!("status {status}")));
        }
        serde_json::from_slice(&body).map_err(|e| protocol(e.to_string()))
    }

    /// Its metrics (`GET /metrics`, docs/rank.md "Metrics").
    pub fn metrics(&self) -> Result<crate::prometheus::Metrics, HarnessError> {
        let (status, body) = crate::envoy::admin_get(self.addr, "/metrics")?;
        if status != 200 {
            return Err(HarnessError::Protocol {
                what: format!("tether-rank {} /metrics", self.addr),
                why: format!("status {status}"),
            });
        }
        Ok(crate::prometheus::Metrics::parse(&String::from_utf8_lossy(
            &body,
        )))
    }

    /// Kills it now (a rank dying mid-replay).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for SimRank {
    fn drop(&mut self) {
        self.kill();
    }
}
