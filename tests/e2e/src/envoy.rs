//! A guard-owned Envoy process: start from a bootstrap template, wait until
//! ready, expose its ports, admin and log; killed on drop.

use crate::error::io;
use crate::{HarnessError, paths, prometheus, template};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How to start an Envoy; see [`Envoy::builder`].
#[derive(Debug, Clone)]
pub struct EnvoyBuilder {
    vars: BTreeMap<String, String>,
    concurrency: u32,
    log_level: String,
    ready_timeout: Duration,
    envoy: Option<PathBuf>,
}

impl Default for EnvoyBuilder {
    fn default() -> Self {
        Self {
            vars: BTreeMap::new(),
            concurrency: 1,
            log_level: "info".to_owned(),
            ready_timeout: Duration::from_secs(30),
            envoy: None,
        }
    }
}

impl EnvoyBuilder {
    /// Sets a template variable (`${NAME}` in the bootstrap).
    pub fn var(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.vars.insert(name.into(), value.into());
        self
    }

    /// Sets the plugin configuration (`${PLUGIN_CONFIG}`), quoted for YAML.
    pub fn plugin_config(self, json: &serde_json::Value) -> Self {
        self.var("PLUGIN_CONFIG", template::yaml_string(&json.to_string()))
    }

    /// Worker threads (`--concurrency`), default 1.
    pub fn concurrency(mut self, n: u32) -> Self {
        self.concurrency = n;
        self
    }

    /// Envoy's log level (`-l`), default `info`.
    pub fn log_level(mut self, level: impl Into<String>) -> Self {
        self.log_level = level.into();
        self
    }

    /// How long to wait for `/ready`, default 30 s.
    pub fn ready_timeout(mut self, t: Duration) -> Self {
        self.ready_timeout = t;
        self
    }

    /// An explicit Envoy binary instead of `$TETHER_ENVOY`.
    pub fn envoy_bin(mut self, path: impl Into<PathBuf>) -> Self {
        self.envoy = Some(path.into());
        self
    }

    /// Renders `bootstrap` with the harness defaults (`ADMIN_PORT` and
    /// `LISTEN_PORT` = 0, i.e. ephemeral; `FILTER_WASM`, `FLOOR_WASM` = the
    /// module paths) overridden by the variables set on this builder.
    pub fn render(&self, bootstrap: &str) -> Result<String, HarnessError> {
        let mut vars: BTreeMap<String, String> = [
            ("ADMIN_PORT", "0".to_owned()),
            ("LISTEN_PORT", "0".to_owned()),
            ("FILTER_WASM", paths::filter_wasm().display().to_string()),
            ("FLOOR_WASM", paths::floor_wasm().display().to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        vars.extend(self.vars.clone());
        let text = template::render(bootstrap, &vars)?;
        outputs_aligned(&text)
    }

    fn bin(&self) -> Result<PathBuf, HarnessError> {
        match &self.envoy {
            Some(p) => paths::require(
                "Envoy",
                p.clone(),
                "check the path given to EnvoyBuilder::envoy_bin",
            ),
            None => paths::require_envoy(),
        }
    }

    /// Runs `envoy --mode validate` on the rendered bootstrap.
    pub fn validate(&self, bootstrap: &str) -> Result<(), HarnessError> {
        let yaml = self.render(bootstrap)?;
        let dir = tempfile::tempdir().map_err(io("creating a temp dir"))?;
        let cfg = dir.path().join("bootstrap.yaml");
        std::fs::write(&cfg, yaml).map_err(io("writing the bootstrap"))?;
        let out = Command::new(self.bin()?)
            .arg("--mode")
            .arg("validate")
            .arg("-c")
            .arg(&cfg)
            .arg("-l")
            .arg("warning")
            .output()
            .map_err(|source| HarnessError::Spawn {
                what: "envoy --mode validate".into(),
                source,
            })?;
        if out.status.success() {
            Ok(())
        } else {
            let mut log = String::from_utf8_lossy(&out.stdout).into_owned();
            log.push_str(&String::from_utf8_lossy(&out.stderr));
            Err(HarnessError::Invalid {
                status: out.status.to_string(),
                log: tail(&log, 4000),
            })
        }
    }

    /// Starts Envoy on the rendered bootstrap and waits until `/ready` answers
    /// 200 and every listener has its port.
    pub fn start(&self, bootstrap: &str) -> Result<Envoy, HarnessError> {
        let yaml = self.render(bootstrap)?;
        let dir = tempfile::Builder::new()
            .prefix("tether-envoy-")
            .tempdir()
            .map_err(io("creating a temp dir"))?;
        let cfg = dir.path().join("bootstrap.yaml");
        let admin_file = dir.path().join("admin-address");
        let log_path = dir.path().join("envoy.log");
        std::fs::write(&cfg, yaml).map_err(io("writing the bootstrap"))?;
        let log = std::fs::File::create(&log_path).map_err(io("creating the Envoy log"))?;
        let log2 = log
            .try_clone()
            .map_err(io("cloning the Envoy log handle"))?;
        let child = Command::new(self.bin()?)
            .arg("-c")
            .arg(&cfg)
            .arg("--concurrency")
            .arg(self.concurrency.to_string())
            .arg("-l")
            .arg(&self.log_level)
            .arg("--use-dynamic-base-id")
            .arg("--admin-address-path")
            .arg(&admin_file)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|source| HarnessError::Spawn {
                what: "envoy".into(),
                source,
            })?;
        let mut envoy = Envoy {
            child,
            dir,
            admin: None,
            listeners: Vec::new(),
            log_path,
        };
        envoy.wait_ready(&admin_file, self.ready_timeout)?;
        Ok(envoy)
    }
}

/// A running Envoy. Dropping it kills the process; its temp dir (bootstrap,
/// log) goes with it, so read [`Envoy::log`] before.
#[derive(Debug)]
pub struct Envoy {
    child: Child,
    dir: tempfile::TempDir,
    admin: Option<SocketAddr>,
    listeners: Vec<(String, SocketAddr)>,
    log_path: PathBuf,
}

impl Envoy {
    /// Starts Envoy with default options; see [`EnvoyBuilder::start`].
    pub fn start(bootstrap: &str) -> Result<Envoy, HarnessError> {
        EnvoyBuilder::default().start(bootstrap)
    }

    /// Options: template variables, concurrency, log level, timeouts.
    pub fn builder() -> EnvoyBuilder {
        EnvoyBuilder::default()
    }

    /// Runs `envoy --mode validate` with default options.
    pub fn validate(bootstrap: &str) -> Result<(), HarnessError> {
        EnvoyBuilder::default().validate(bootstrap)
    }

    fn wait_ready(&mut self, admin_file: &Path, timeout: Duration) -> Result<(), HarnessError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().map_err(io("polling Envoy"))? {
                return Err(HarnessError::ExitedEarly {
                    what: "envoy".into(),
                    status: status.to_string(),
                    log: diagnostic(&self.log()),
                });
            }
            if self.admin.is_none() {
                self.admin = std::fs::read_to_string(admin_file)
                    .ok()
                    .and_then(|s| s.trim().parse().ok());
            }
            if let Some(admin) = self.admin
                && matches!(admin_get(admin, "/ready"), Ok((200, _)))
                && let Ok(ls) = self.read_listeners(admin)
                && !ls.is_empty()
                && ls.iter().all(|(_, a)| a.port() != 0)
            {
                self.listeners = ls;
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::NotReady {
                    what: "envoy".into(),
                    secs: timeout.as_secs(),
                    log: diagnostic(&self.log()),
                });
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    fn read_listeners(&self, admin: SocketAddr) -> Result<Vec<(String, SocketAddr)>, HarnessError> {
        let (_, body) = admin_get(admin, "/listeners?format=json")?;
        let v: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| HarnessError::Protocol {
                what: "envoy admin /listeners".into(),
                why: e.to_string(),
            })?;
        let mut out = Vec::new();
        for l in v["listener_statuses"].as_array().into_iter().flatten() {
            let sa = &l["local_address"]["socket_address"];
            let (Some(ip), Some(name)) = (sa["address"].as_str(), l["name"].as_str()) else {
                continue;
            };
            let port = sa["port_value"].as_u64().unwrap_or(0) as u16;
            if let Ok(ip) = ip.parse() {
                out.push((name.to_owned(), SocketAddr::new(ip, port)));
            }
        }
        Ok(out)
    }

    /// The first listener's address (the ingress in every tether bootstrap).
    /// `start` only returns once at least one listener is bound.
    pub fn listen_addr(&self) -> SocketAddr {
        self.listeners
            .first()
            .map_or_else(|| self.admin_addr(), |(_, a)| *a)
    }

    /// A listener's address by its `name` in the bootstrap.
    pub fn listener(&self, name: &str) -> Option<SocketAddr> {
        self.listeners
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| *a)
    }

    /// The admin address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// GET on the admin interface: (status, body).
    pub fn admin(&self, path: &str) -> Result<(u16, Vec<u8>), HarnessError> {
        admin_get(self.admin_addr(), path)
    }

    /// `/stats/prometheus`, parsed.
    pub fn prometheus(&self) -> Result<prometheus::Metrics, HarnessError> {
        let (status, body) = self.admin("/stats/prometheus")?;
        if status != 200 {
            return Err(HarnessError::Protocol {
                what: "/stats/prometheus".into(),
                why: format!("status {status}"),
            });
        }
        Ok(prometheus::Metrics::parse(&String::from_utf8_lossy(&body)))
    }

    /// Everything Envoy has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Where the log file is (inside the guard's temp dir).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The guard's temp directory (bootstrap, admin address, log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Waits until the log contains `needle`; true if it did before `timeout`.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.log().contains(needle) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Minimal blocking HTTP/1.1 GET (admin interface only): `Connection: close`,
/// read to EOF, de-chunk if needed.
pub fn admin_get(addr: SocketAddr, path: &str) -> Result<(u16, Vec<u8>), HarnessError> {
    let err = |why: String| HarnessError::Http {
        addr: addr.to_string(),
        why,
    };
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| err(e.to_string()))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| err(e.to_string()))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| err(e.to_string()))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| err(e.to_string()))?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| err("no header end".into()))?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| err(format!("bad status line in {head:?}")))?;
    let body = raw[split + 4..].to_vec();
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    Ok((status, if chunked { dechunk(&body) } else { body }))
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size_txt = String::from_utf8_lossy(&b[..eol]);
        let size = usize::from_str_radix(size_txt.split(';').next().unwrap_or("0").trim(), 16)
            .unwrap_or(0);
        if size == 0 || b.len() < eol + 2 + size {
            break;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[(eol + 4 + size).min(b.len())..];
    }
    out
}

/// What to show of a failed Envoy's log: every error/critical line (they can
/// scroll far above the end), then the last 2000 bytes.
pub fn diagnostic(log: &str) -> String {
    let mut out: String = log
        .lines()
        .filter(|l| l.contains("][critical][") || l.contains("][error]["))
        .map(|l| format!("{l}\n"))
        .collect();
    out.push_str("…\n");
    out.push_str(&tail(log, 2000));
    out
}

/// The last `n` bytes of `s` (on a char boundary).
pub fn tail(s: &str, n: usize) -> String {
    let mut start = s.len().saturating_sub(n);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].to_owned()
}

/// A bootstrap holding the tether filter gets the `header_mutation` entries
/// and header-path route its plugin configuration's outputs need
/// (`tether_envoy::outputs::align`), then must pass the outputs check: every
/// test and the benchmark run a chain that consumes exactly what the filter
/// sets. Other bootstraps (and a plugin configuration the filter itself would
/// refuse) pass through unchanged.
fn outputs_aligned(text: &str) -> Result<String, HarnessError> {
    if !text.contains("root_id: tether") {
        return Ok(text.to_owned());
    }
    let Ok(mut doc) = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text) else {
        return Ok(text.to_owned());
    };
    tether_envoy::outputs::align(&mut doc);
    let problems = tether_envoy::outputs::check(&doc);
    if !problems.is_empty() {
        return Err(HarnessError::Outputs(problems));
    }
    serde_yaml_ng::to_string(&doc).map_err(|e| HarnessError::Protocol {
        what: "the aligned bootstrap".into(),
        why: e.to_string(),
    })
}
