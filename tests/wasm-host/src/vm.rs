//! One running VM: lifecycle callbacks, the guarded call into the guest (fuel,
//! trap → error with the module's own message), deferred work, ticks and HTTP
//! call responses.

use crate::abi::{Action, LogLevel};
use crate::error::HostError;
use crate::header_map::HeaderMap;
use crate::state::{Deferred, HostOptions, HostState, HttpCall, HttpCallResponse, StreamState};
use crate::wasi::ProcExit;
use std::collections::HashMap;
use wasmtime::{Engine, Func, Instance, Linker, Module, Store, Trap, WasmParams, WasmResults};

/// Fuel given to a callback when metering is on but no budget is set.
const UNBUDGETED_FUEL: u64 = u64::MAX / 4;

/// A started VM with its root context configured.
pub struct FilterVm {
    store: Store<HostState>,
    instance: Instance,
    funcs: HashMap<&'static str, Option<Func>>,
    metered: bool,
    failed: bool,
    next_context: u32,
}

impl std::fmt::Debug for FilterVm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FilterVm")
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl FilterVm {
    pub(crate) fn start(
        engine: &Engine,
        module: &Module,
        linker: &Linker<HostState>,
        metered: bool,
        options: HostOptions,
    ) -> Result<Self, HostError> {
        let mut store = Store::new(engine, HostState::new(options));
        if metered {
            store
                .set_fuel(UNBUDGETED_FUEL)
                .map_err(|e| HostError::Instantiate(e.to_string()))?;
        }
        let instance = linker
            .instantiate(&mut store, module)
            .map_err(|e| HostError::Instantiate(format!("{e:#}")))?;
        let mut vm = Self {
            store,
            instance,
            funcs: HashMap::new(),
            metered,
            failed: false,
            next_context: 2,
        };
        if vm.func("_initialize").is_some() {
            vm.invoke::<(), ()>("_initialize", 1, ())?;
        } else if vm.func("_start").is_some() {
            vm.invoke::<(), ()>("_start", 1, ())?;
        }
        let root = vm.store.data().root_context_id;
        vm.invoke::<(i32, i32), ()>("proxy_on_context_create", root, (root as i32, 0))?;
        let vm_size = vm.store.data().options.vm_config.len() as i32;
        let logs = vm.store.data().logs.len();
        if vm.invoke::<(i32, i32), i32>("proxy_on_vm_start", root, (root as i32, vm_size))?
            == Some(0)
        {
            return Err(HostError::VmStartRejected {
                logs: vm.log_lines_since(logs),
            });
        }
        let plugin_size = vm.store.data().options.plugin_config.len() as i32;
        if vm.invoke::<(i32, i32), i32>("proxy_on_configure", root, (root as i32, plugin_size))?
            == Some(0)
        {
            return Err(HostError::ConfigureRejected {
                logs: vm.log_lines_since(logs),
            });
        }
        vm.run_deferred()?;
        Ok(vm)
    }

    /// Host state: logs, metrics, shared data, records of foreign calls, ...
    pub fn state(&self) -> &HostState {
        self.store.data()
    }

    pub fn state_mut(&mut self) -> &mut HostState {
        self.store.data_mut()
    }

    /// Whether a trap has killed this VM (Envoy then fails every request).
    pub fn failed(&self) -> bool {
        self.failed
    }

    fn func(&mut self, name: &'static str) -> Option<Func> {
        let instance = self.instance;
        let store = &mut self.store;
        *self
            .funcs
            .entry(name)
            .or_insert_with(|| instance.get_func(&mut *store, name))
    }

    /// Calls an export with `context` as the current context. A missing export
    /// is `Ok(None)` (the SDK exports all callbacks; hand-written modules may not).
    pub fn invoke<P: WasmParams, R: WasmResults>(
        &mut self,
        callback: &'static str,
        context: u32,
        params: P,
    ) -> Result<Option<R>, HostError> {
        if self.failed {
            return Err(HostError::VmFailed {
                callback: callback.into(),
            });
        }
        let Some(func) = self.func(callback) else {
            return Ok(None);
        };
        let typed = func.typed::<P, R>(&self.store).map_err(|e| {
            HostError::NotProxyWasm(format!("{callback} has the wrong signature: {e}"))
        })?;
        self.store.data_mut().current_context = context;
        let logs_before = self.store.data().logs.len();
        let budget = self
            .store
            .data()
            .options
            .fuel_per_callback
            .unwrap_or(UNBUDGETED_FUEL);
        if self.metered {
            self.store
                .set_fuel(budget)
                .map_err(|e| HostError::Instantiate(e.to_string()))?;
        }
        let started = std::time::Instant::now();
        let result = typed.call(&mut self.store, params);
        let nanos = started.elapsed().as_nanos() as u64;
        *self
            .store
            .data_mut()
            .fuel
            .nanos_by_callback
            .entry(callback.to_owned())
            .or_default() += nanos;
        if self.metered {
            let used = budget - self.store.get_fuel().unwrap_or(0);
            let ledger = &mut self.store.data_mut().fuel;
            *ledger.by_callback.entry(callback.to_owned()).or_default() += used;
            ledger.total += used;
        }
        match result {
            Ok(r) => {
                self.store.data_mut().flush_stdio(false);
                Ok(Some(r))
            }
            Err(e) => {
                self.failed = true;
                self.store.data_mut().flush_stdio(true);
                Err(self.classify(e, callback, logs_before))
            }
        }
    }

    fn classify(&self, e: wasmtime::Error, callback: &str, logs_before: usize) -> HostError {
        let callback = callback.to_owned();
        if let Some(ProcExit(code)) = e.downcast_ref::<ProcExit>() {
            return HostError::Exit {
                callback,
                code: *code,
            };
        }
        if let Some(Trap::OutOfFuel) = e.downcast_ref::<Trap>() {
            let budget = self
                .store
                .data()
                .options
                .fuel_per_callback
                .unwrap_or(UNBUDGETED_FUEL);
            return HostError::OutOfFuel { callback, budget };
        }
        let trap = match e.downcast_ref::<Trap>() {
            Some(t) => format!("(wasm trap: {t})"),
            None => format!("({e})"),
        };
        let said: Vec<String> = self.store.data().logs[logs_before..]
            .iter()
            .filter(|l| l.level >= LogLevel::Error)
            .map(|l| l.message.clone())
            .collect();
        HostError::Trap {
            callback,
            trap,
            guest_message: (!said.is_empty()).then(|| said.join("\n")),
        }
    }

    fn log_lines_since(&self, index: usize) -> Vec<String> {
        self.store.data().logs[index..]
            .iter()
            .map(|l| l.message.clone())
            .collect()
    }

    /// Creates an HTTP context under the root context.
    pub fn create_http_context(&mut self) -> Result<u32, HostError> {
        let id = self.next_context;
        self.next_context += 1;
        self.store
            .data_mut()
            .streams
            .insert(id, StreamState::default());
        let root = self.store.data().root_context_id as i32;
        self.invoke::<(i32, i32), ()>("proxy_on_context_create", id, (id as i32, root))?;
        Ok(id)
    }

    /// Calls a stream callback returning an action (`Continue` if not exported).
    pub fn call_action<P: WasmParams>(
        &mut self,
        callback: &'static str,
        context: u32,
        params: P,
    ) -> Result<Action, HostError> {
        if !self.store.data().streams.contains_key(&context) {
            return Err(HostError::UnknownContext(context));
        }
        Ok(self
            .invoke::<P, i32>(callback, context, params)?
            .map_or(Action::Continue, Action::from_raw))
    }

    /// Ends a stream as Envoy does: `on_done`, `on_log`, `on_delete`.
    pub fn finish_stream(&mut self, context: u32) -> Result<StreamState, HostError> {
        if !self.store.data().streams.contains_key(&context) {
            return Err(HostError::UnknownContext(context));
        }
        self.invoke::<i32, i32>("proxy_on_done", context, context as i32)?;
        self.invoke::<i32, ()>("proxy_on_log", context, context as i32)?;
        self.invoke::<i32, ()>("proxy_on_delete", context, context as i32)?;
        self.run_deferred()?;
        self.store
            .data_mut()
            .streams
            .remove(&context)
            .ok_or(HostError::UnknownContext(context))
    }

    /// Runs work queued by host calls: queue-ready notifications and scripted
    /// HTTP call responses. Each may queue more; all run before returning.
    pub fn run_deferred(&mut self) -> Result<(), HostError> {
        while let Some(work) = self.store.data_mut().deferred.pop_front() {
            let root = self.store.data().root_context_id;
            match work {
                Deferred::QueueReady { queue_id } => {
                    self.invoke::<(i32, i32), ()>(
                        "proxy_on_queue_ready",
                        root,
                        (root as i32, queue_id as i32),
                    )?;
                }
                Deferred::HttpCallResponse { token } => {
                    let Some(resp) = self.store.data_mut().ready_http_responses.remove(&token)
                    else {
                        continue;
                    };
                    self.deliver_http_response(token, resp)?;
                }
            }
        }
        Ok(())
    }

    /// Scripts the response the next `dispatch_http_call` to `upstream` gets;
    /// it is delivered right after the callback that made the call returns.
    pub fn script_http_response(&mut self, upstream: &str, response: HttpCallResponse) {
        self.store
            .data_mut()
            .scripted_http_responses
            .entry(upstream.to_owned())
            .or_default()
            .push_back(response);
    }

    /// Answers an outstanding HTTP call by token (for tests that control timing).
    pub fn respond_http_call(
        &mut self,
        token: u32,
        response: HttpCallResponse,
    ) -> Result<(), HostError> {
        self.deliver_http_response(token, response)?;
        self.run_deferred()
    }

    /// The HTTP calls the guest made whose response has not been delivered.
    pub fn outstanding_http_calls(&self) -> Vec<HttpCall> {
        let s = self.store.data();
        s.http_calls
            .iter()
            .filter(|c| !s.answered_http_calls.contains(&c.token))
            .cloned()
            .collect()
    }

    fn deliver_http_response(
        &mut self,
        token: u32,
        resp: HttpCallResponse,
    ) -> Result<(), HostError> {
        let state = self.store.data();
        let Some(call) = state.http_calls.iter().find(|c| c.token == token) else {
            return Err(HostError::UnknownContext(token));
        };
        let context = call.context_id;
        self.store.data_mut().answered_http_calls.insert(token);
        let args = (
            context as i32,
            token as i32,
            resp.headers.len() as i32,
            resp.body.len() as i32,
            resp.trailers.len() as i32,
        );
        self.store.data_mut().current_http_response = Some(resp);
        let r = self.invoke::<(i32, i32, i32, i32, i32), ()>(
            "proxy_on_http_call_response",
            context,
            args,
        );
        self.store.data_mut().current_http_response = None;
        r.map(|_| ())
    }

    /// Advances the clock by one tick period and calls `proxy_on_tick` if the
    /// module set a period. Returns whether a tick ran.
    pub fn tick(&mut self) -> Result<bool, HostError> {
        let period = self.store.data().tick_period_ms;
        if period == 0 {
            return Ok(false);
        }
        self.advance_clock_ms(u64::from(period));
        let root = self.store.data().root_context_id;
        self.invoke::<i32, ()>("proxy_on_tick", root, root as i32)?;
        self.run_deferred()?;
        Ok(true)
    }

    /// Moves the host clock forward.
    pub fn advance_clock_ms(&mut self, ms: u64) {
        let s = self.store.data_mut();
        s.now_ns = s.now_ns.saturating_add(ms.saturating_mul(1_000_000));
    }

    /// Convenience for tests: a header map from string pairs.
    pub fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        HeaderMap::from_pairs(pairs.iter().copied())
    }
}

impl FilterVm {
    /// Copies guest memory out, for tests of hand-written guests that leave
    /// results at known addresses. `None` when out of bounds.
    pub fn read_guest(&mut self, ptr: u32, len: u32) -> Option<Vec<u8>> {
        let memory = self.instance.get_memory(&mut self.store, "memory")?;
        let start = ptr as usize;
        memory
            .data(&self.store)
            .get(start..start.checked_add(len as usize)?)
            .map(<[u8]>::to_vec)
    }

    /// Reads a little-endian u32 from guest memory.
    pub fn read_guest_u32(&mut self, ptr: u32) -> Option<u32> {
        let b = self.read_guest(ptr, 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}
