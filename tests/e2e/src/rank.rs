//! A guard-owned echo rank: a real `tether-echo-rank` process on an ephemeral
//! port, killed on drop.

use crate::error::io;
use crate::{HarnessError, paths};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running echo rank.
#[derive(Debug)]
pub struct EchoRank {
    name: String,
    addr: SocketAddr,
    child: Child,
}

impl EchoRank {
    /// Starts `tether-echo-rank --name <name>` on 127.0.0.1 (binary located by
    /// [`paths::echo_rank_bin`]).
    pub fn start(name: &str) -> Result<Self, HarnessError> {
        Self::start_with(
            &paths::echo_rank_bin(),
            name,
            "127.0.0.1:0".parse().unwrap_or_else(|_| unreachable!()),
        )
    }

    /// Starts the given echo-rank binary listening on `listen` (port 0 = ephemeral).
    pub fn start_with(bin: &Path, name: &str, listen: SocketAddr) -> Result<Self, HarnessError> {
        let bin = paths::require(
            "tether-echo-rank",
            bin.to_path_buf(),
            "run `cargo build -p tether-e2e --bins`",
        )?;
        let mut child = Command::new(&bin)
            .arg("--name")
            .arg(name)
            .arg("--listen")
            .arg(listen.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|source| HarnessError::Spawn {
                what: format!("echo rank {name}"),
                source,
            })?;
        let addr = read_ready(
            &mut child,
            &format!("echo rank {name}"),
            Duration::from_secs(10),
        )?;
        Ok(Self {
            name: name.to_owned(),
            addr,
            child,
        })
    }

    /// Starts one rank per name.
    pub fn start_many(names: &[&str]) -> Result<Vec<Self>, HarnessError> {
        names.iter().map(|n| Self::start(n)).collect()
    }

    /// The rank's name (echoed as `rank`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Makes the rank answer normally, with 503, or never
    /// ([`crate::echo::FAULT_PATH`], sent to it directly).
    pub fn set_fault(&self, fault: crate::echo::Fault) -> Result<(), HarnessError> {
        use std::io::{Read, Write};
        let what = format!("setting fault {} on {}", fault.word(), self.name);
        let mut s = std::net::TcpStream::connect_timeout(&self.addr, Duration::from_secs(2))
            .map_err(io(what.clone()))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(io(what.clone()))?;
        let body = fault.word();
        write!(
            s,
            "POST {} HTTP/1.1\r\nhost: rank\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            crate::echo::FAULT_PATH,
            body.len()
        )
        .map_err(io(what.clone()))?;
        let mut reply = String::new();
        s.read_to_string(&mut reply).map_err(io(what.clone()))?;
        if reply.starts_with("HTTP/1.1 200") {
            Ok(())
        } else {
            Err(HarnessError::Protocol {
                what,
                why: reply.lines().next().unwrap_or_default().to_owned(),
            })
        }
    }
}

/// Waits for a child's first stdout line, `READY <ip:port>` (how the echo
/// rank and `tether-rank` report readiness); a thread bounds the wait. On
/// failure the child is killed and the error names `what`.
pub(crate) fn read_ready(
    child: &mut Child,
    what: &str,
    within: Duration,
) -> Result<SocketAddr, HarnessError> {
    let stdout = child.stdout.take().ok_or_else(|| HarnessError::Protocol {
        what: what.to_owned(),
        why: "no stdout pipe".into(),
    })?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let r = BufReader::new(stdout).read_line(&mut line).map(|_| line);
        let _ = tx.send(r);
    });
    let line = match rx.recv_timeout(within) {
        Ok(r) => r.map_err(io(format!("reading {what}'s stdout")))?,
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(HarnessError::NotReady {
                what: what.to_owned(),
                secs: within.as_secs(),
                log: String::new(),
            });
        }
    };
    match line
        .trim()
        .strip_prefix("READY ")
        .and_then(|a| a.parse().ok())
    {
        Some(addr) => Ok(addr),
        None => {
            let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
            Err(HarnessError::ExitedEarly {
                what: what.to_owned(),
                status,
                log: line,
            })
        }
    }
}

impl Drop for EchoRank {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
