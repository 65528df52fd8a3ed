//! Load polling from the root context (wasm only). Every worker's root context
//! ticks (one VM per Envoy thread, the main thread's included); the first tick
//! of a period to claim it in shared data (compare-and-swap on the last poll
//! time) sends one `GET /load` per endpoint with `dispatch_http_call` to the
//! configured cluster, steered by `x-gateway-destination-endpoint`
//! (`override_host`). Each reply is read into the shared view (again by
//! compare-and-swap); every root copies the shared view into its VM's
//! [`LoadView`] on each tick, where the HTTP contexts read it with no host call.
//! A view is therefore stale by up to two poll periods plus the poll's time.
//! An endpoint has at most one poll outstanding per worker: one slower than
//! the period is waited for up to `timeout_ms`, not sent again.
//!
//! With `residency`, a decode endpoint's reply also carries its residency
//! summary: the polling VM checks it, writes its blob to shared data only when
//! the content changed, and records `(content hash, time)` in a small shared
//! index. Every root reads that index on its tick and re-reads a blob only when
//! the hash differs from the one it decoded ([`ResidencyView::sync`]), so a
//! worker decodes each new summary once and requests never touch shared data.

use super::host;
use crate::config::load::LoadConfig;
use crate::emit::metrics::Fixed;
use crate::place::load_view::{LoadView, MAX_REPLY_BYTES, Sample, due};
use crate::place::residency_view::{self, ResidencyView};
use proxy_wasm::types::{BufferType, LogLevel, MapType};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use tether_placement::Resident;
use tether_placement::residency::Summary;

/// Shared-data key of the last claimed poll time (u64 LE, ms).
const CLAIM_KEY: &str = "tether.load.claim";
/// Shared-data key of the encoded view.
const VIEW_KEY: &str = "tether.load.view";
/// Compare-and-swap attempts when publishing a sample.
const CAS_TRIES: usize = 4;
/// Shared-data key of the residency index ([`residency_view::parse_index`]).
const RESIDENCY_INDEX_KEY: &str = "tether.residency.index";

/// Shared-data key of decode endpoint `i`'s residency blob.
fn residency_blob_key(i: usize) -> String {
    format!("tether.residency.{i}")
}

/// Residency polling: the VM's decoded view and how many targets are decode
/// endpoints (the only ones whose summaries place keys).
pub struct ResidencyPoll {
    pub view: Rc<RefCell<ResidencyView>>,
    pub decode: usize,
}

pub struct Poller {
    cfg: LoadConfig,
    /// `ip:port` per view index: decode endpoints, then prefill endpoints.
    targets: Vec<String>,
    /// Outstanding polls: token → (view index, when it was sent, ms).
    pending: HashMap<u32, (usize, u64)>,
    view: Rc<RefCell<LoadView>>,
    residency: Option<ResidencyPoll>,
}

impl Poller {
    pub fn new(
        cfg: LoadConfig,
        targets: Vec<String>,
        view: Rc<RefCell<LoadView>>,
        residency: Option<ResidencyPoll>,
    ) -> Self {
        Self {
            cfg,
            targets,
            pending: HashMap::new(),
            view,
            residency,
        }
    }

    /// Brings this VM's residency view to the shared index, re-reading only
    /// the blobs whose content changed.
    fn sync_residency(&self) {
        let Some(rp) = &self.residency else {
            return;
        };
        let Ok((Some(bytes), _)) = host::get_shared(RESIDENCY_INDEX_KEY) else {
            return;
        };
        let Some(index) = residency_view::parse_index(&bytes, rp.decode) else {
            return;
        };
        let Ok(mut mine) = rp.view.try_borrow_mut() else {
            return;
        };
        for (i, (hash, at_ms)) in index.into_iter().enumerate() {
            mine.sync(i, hash, at_ms, || {
                host::get_shared(&residency_blob_key(i))
                    .ok()
                    .and_then(|(b, _)| b)
            });
        }
    }

    /// Endpoint `i`'s summary from a good `/load` reply at `now`: checked,
    /// recorded in this VM, and published; a bad or absent one makes the
    /// endpoint unknown (a bad one is counted and logged).
    fn residency(&self, i: usize, summary: Option<Summary>, now: u64, count: &dyn Fn(Fixed)) {
        let Some(rp) = self.residency.as_ref().filter(|rp| i < rp.decode) else {
            return;
        };
        let decoded = summary.map(|s| Resident::decode(&s));
        let (hash, resident) = match decoded {
            Some(Ok(r)) => {
                let blob = residency_view::blob(&r);
                let hash = residency_view::content_hash(&blob);
                let known = host::get_shared(RESIDENCY_INDEX_KEY)
                    .ok()
                    .and_then(|(b, _)| b)
                    .and_then(|b| residency_view::parse_index(&b, rp.decode))
                    .and_then(|idx| idx.get(i).map(|e| e.0));
                if known != Some(hash)
                    && host::set_shared(&residency_blob_key(i), &blob, 0).is_err()
                {
                    count(Fixed::HostError);
                    return;
                }
                (hash, Some(r))
            }
            Some(Err(e)) => {
                count(Fixed::of_bad_summary(&e));
                let addr = self.targets.get(i).map_or("?", String::as_str);
                host::log(
                    LogLevel::Warn,
                    &format!("tether: residency of {addr} not used: {e}"),
                );
                (0, None)
            }
            None => (0, None),
        };
        if let Ok(mut v) = rp.view.try_borrow_mut() {
            match resident {
                Some(r) => v.record(i, hash, now, r),
                None => v.sync(i, 0, now, || None),
            }
        }
        for _ in 0..CAS_TRIES {
            let Ok((bytes, cas)) = host::get_shared(RESIDENCY_INDEX_KEY) else {
                count(Fixed::HostError);
                return;
            };
            let index = residency_view::set_index(bytes.as_deref(), rp.decode, i, hash, now);
            match host::set_shared(RESIDENCY_INDEX_KEY, &index, cas) {
                Ok(()) => return,
                Err(host::HostStatus(8)) => continue,
                Err(_) => break,
            }
        }
        count(Fixed::HostError);
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
        self.sync_residency();
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
        // A poll stays outstanding until its reply or its timeout (Envoy
        // calls back at the timeout with a failure: a bad reply), so a reply
        // slower than the poll period is still read, and an endpoint slow to
        // answer gets no second poll meanwhile. Entries older than the
        // timeout and a period (a host that dropped the reply) are let go.
        let horizon = self.cfg.timeout_ms.saturating_add(self.cfg.poll_ms);
        self.pending
            .retain(|_, (_, sent)| now.saturating_sub(*sent) <= horizon);
        let mut waiting = vec![false; self.targets.len()];
        for (j, _) in self.pending.values() {
            if let Some(w) = waiting.get_mut(*j) {
                *w = true;
            }
        }
        let timeout = u32::try_from(self.cfg.timeout_ms).unwrap_or(u32::MAX);
        for ((i, addr), _) in self
            .targets
            .iter()
            .enumerate()
            .zip(&waiting)
            .filter(|(_, w)| !**w)
        {
            let headers = [
                (":method", "GET"),
                (":path", "/load"),
                (":authority", addr.as_str()),
                (tether_wire::headers::DESTINATION, addr.as_str()),
            ];
            match host::http_call(&self.cfg.cluster, &headers, timeout) {
                Ok(token) => {
                    self.pending.insert(token, (i, now));
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
        let Some((i, _)) = self.pending.remove(&token) else {
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
        match Sample::with_residency(status.as_deref(), &body, now) {
            Ok((s, summary)) => {
                count(Fixed::LoadPollOk);
                if let Ok(mut v) = self.view.try_borrow_mut() {
                    v.record(i, s);
                }
                if !self.publish(i, s) {
                    count(Fixed::HostError);
                }
                self.residency(i, summary, now, count);
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
