//! Load polling from the root context (wasm only). Every worker's root context
//! ticks (one VM per Envoy thread, the main thread's included); the first tick
//! of a period to claim it in shared data (compare-and-swap on the last poll
//! time) sends one `GET /load` per endpoint with `dispatch_http_call` to the
//! configured cluster, steered by `x-gateway-destination-endpoint`
//! (`override_host`). Each reply is read into the shared view (again by
//! compare-and-swap); every root copies the shared view into its VM's
//! [`LoadView`] on each tick, where the HTTP contexts read it with no host call.
//! A view is therefore stale by up to two poll periods plus the poll's time.

use super::host;
use crate::config::load::LoadConfig;
use crate::emit::metrics::Fixed;
use crate::place::load_view::{LoadView, MAX_REPLY_BYTES, Sample, due};
use proxy_wasm::types::{BufferType, LogLevel, MapType};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// Shared-data key of the last claimed poll time (u64 LE, ms).
const CLAIM_KEY: &str = "tether.load.claim";
/// Shared-data key of the encoded view.
const VIEW_KEY: &str = "tether.load.view";
/// Compare-and-swap attempts when publishing a sample.
const CAS_TRIES: usize = 4;

pub struct Poller {
    cfg: LoadConfig,
    /// `ip:port` per view index: decode endpoints, then prefill endpoints.
    targets: Vec<String>,
    /// Outstanding polls: token → view index.
    pending: HashMap<u32, usize>,
    view: Rc<RefCell<LoadView>>,
}

impl Poller {
    pub fn new(cfg: LoadConfig, targets: Vec<String>, view: Rc<RefCell<LoadView>>) -> Self {
        Self {
            cfg,
            targets,
            pending: HashMap::new(),
            view,
        }
    }

    /// One tick: refresh this VM's view from shared data, then poll if this
    /// VM claims the period.
    pub fn tick(&mut self, count: &dyn Fn(Fixed)) {
        let n = self.targets.len();
        if let Ok((Some(bytes), _)) = host::get_shared(VIEW_KEY)
            && let Some(v) = LoadView::decode(&bytes, n)
            && let Ok(mut mine) = self.view.try_borrow_mut()
        {
            *mine = v;
        }
        let Ok(now) = host::now_ms() else {
            count(Fixed::HostError);
            return;
        };
        let Ok((last, cas)) = host::get_shared(CLAIM_KEY) else {
            count(Fixed::HostError);
            return;
        };
        let last = last
            .and_then(|b| b.get(..8).and_then(|b| b.try_into().ok()))
            .map(u64::from_le_bytes);
        if !due(last, now, self.cfg.poll_ms)
            || host::set_shared(CLAIM_KEY, &now.to_le_bytes(), cas).is_err()
        {
            return;
        }
        // Replies that never came (a host that dropped them) do not pile up.
        self.pending.clear();
        let timeout = u32::try_from(self.cfg.timeout_ms).unwrap_or(u32::MAX);
        for (i, addr) in self.targets.iter().enumerate() {
            let headers = [
                (":method", "GET"),
                (":path", "/load"),
                (":authority", addr.as_str()),
                (tether_wire::headers::DESTINATION, addr.as_str()),
            ];
            match host::http_call(&self.cfg.cluster, &headers, timeout) {
                Ok(token) => {
                    self.pending.insert(token, i);
                }
                Err(s) => {
                    count(Fixed::LoadPollFailed);
                    host::log(
                        LogLevel::Warn,
                        &format!(
                            "tether: cannot poll {addr}/load through cluster {:?}: host status {}",
                            self.cfg.cluster, s.0
                        ),
                    );
                }
            }
        }
    }

    /// A poll's reply (or its failure: no headers, no body).
    pub fn response(&mut self, token: u32, body_size: usize, count: &dyn Fn(Fixed)) {
        let Some(i) = self.pending.remove(&token) else {
            return;
        };
        let status = host::header_pairs(MapType::HttpCallResponseHeaders, |n| n == b":status")
            .ok()
            .and_then(|h| h.into_iter().next())
            .and_then(|(_, v)| String::from_utf8(v).ok());
        // Never copy more than the limit plus one byte (enough to refuse it).
        let body = if body_size == 0 {
            Vec::new()
        } else {
            host::get_buffer(
                BufferType::HttpCallResponseBody,
                0,
                body_size.min(MAX_REPLY_BYTES + 1),
            )
            .unwrap_or_default()
        };
        let now = host::now_ms().unwrap_or(0);
        match Sample::from_reply(status.as_deref(), &body, now) {
            Ok(s) => {
                count(Fixed::LoadPollOk);
                if let Ok(mut v) = self.view.try_borrow_mut() {
                    v.record(i, s);
                }
                if !self.publish(i, s) {
                    count(Fixed::HostError);
                }
            }
            Err(e) => {
                count(Fixed::LoadPollBad);
                let addr = self.targets.get(i).map_or("?", String::as_str);
                host::log(
                    LogLevel::Warn,
                    &format!("tether: /load of {addr} not used: {e}"),
                );
            }
        }
    }

    /// Records the sample in the shared view; false when every attempt lost
    /// the compare-and-swap or the host refused.
    fn publish(&self, i: usize, s: Sample) -> bool {
        let n = self.targets.len();
        for _ in 0..CAS_TRIES {
            let Ok((bytes, cas)) = host::get_shared(VIEW_KEY) else {
                return false;
            };
            let mut v = bytes
                .and_then(|b| LoadView::decode(&b, n))
                .unwrap_or_else(|| LoadView::new(n));
            v.record(i, s);
            match host::set_shared(VIEW_KEY, &v.encode(), cas) {
                Ok(()) => return true,
                Err(host::HostStatus(8)) => continue,
                Err(_) => return false,
            }
        }
        false
    }
}
