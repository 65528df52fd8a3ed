//! The `env.proxy_*` imports: the host side of proxy-wasm ABI 0.2.1 for HTTP
//! filters, with Envoy's availability rules for maps and buffers.

use crate::abi::{BufferType, LogLevel, MapType, MetricType, Status, StreamType};
use crate::filter_state;
use crate::guest_memory::{
    Ctx, HostResult, copy_out, finish, read, read_string, write_u32, write_u64,
};
use crate::header_map::HeaderMap;
use crate::properties;
use crate::state::{
    Access, Deferred, ForeignCall, HostState, HttpCall, LocalResponse, Metric, Queue,
};
use std::collections::HashSet;
use wasmtime::Linker;

type Def = wasmtime::Result<()>;

/// Registers every `env.proxy_*` import; returns the names it defined.
#[allow(
    clippy::redundant_closure_call,
    reason = "the closure gives `?` a scope inside `wrap!`"
)]
pub(crate) fn define(linker: &mut Linker<HostState>, defined: &mut HashSet<String>) -> Def {
    macro_rules! wrap {
        ($name:literal, |$c:ident $(, $a:ident : $t:ty)*| $body:expr) => {{
            defined.insert(concat!("env.", $name).to_owned());
            linker.func_wrap("env", $name, |mut $c: Ctx<'_> $(, $a: $t)*| -> wasmtime::Result<i32> {
                *$c.data_mut().host_calls.entry($name).or_default() += 1;
                finish((|| -> HostResult { $body })())
            })?;
        }};
    }

    wrap!("proxy_log", |c, level: i32, ptr: i32, len: i32| {
        let level = LogLevel::from_raw(level).ok_or(Status::BadArgument)?;
        let msg = String::from_utf8_lossy(&read(&mut c, ptr, len)?).into_owned();
        c.data_mut().log(level, "proxy_log", msg);
        Ok(())
    });
    wrap!("proxy_get_log_level", |c, out: i32| {
        let level = c.data().options.log_level as u32;
        write_u32(&mut c, out, level)
    });
    wrap!("proxy_get_current_time_nanoseconds", |c, out: i32| {
        let now = c.data().now_ns;
        write_u64(&mut c, out, now)
    });
    wrap!("proxy_set_tick_period_milliseconds", |c, period: i32| {
        c.data_mut().tick_period_ms = period as u32;
        Ok(())
    });
    wrap!("proxy_set_effective_context", |c, id: i32| {
        let id = id as u32;
        let s = c.data_mut();
        if id != s.root_context_id && !s.streams.contains_key(&id) {
            return Err(Status::BadArgument.into());
        }
        s.current_context = id;
        Ok(())
    });
    wrap!("proxy_done", |c| {
        c.data_mut().done_called = true;
        Ok(())
    });

    // Buffers.
    wrap!(
        "proxy_get_buffer_bytes",
        |c, kind: i32, start: i32, max: i32, ptr_out: i32, size_out: i32| {
            let kind = BufferType::from_raw(kind).ok_or(Status::BadArgument)?;
            let (start, max) = (start as u32 as usize, max as u32 as usize);
            start.checked_add(max).ok_or(Status::BadArgument)?;
            let data = take_buffer(c.data_mut(), kind)?;
            let end = start.saturating_add(max).min(data.len());
            let result = copy_out(
                &mut c,
                data.get(start..end).unwrap_or_default(),
                ptr_out,
                size_out,
            );
            put_buffer(c.data_mut(), kind, data);
            result
        }
    );
    wrap!(
        "proxy_set_buffer_bytes",
        |c, kind: i32, start: i32, size: i32, ptr: i32, len: i32| {
            let kind = BufferType::from_raw(kind).ok_or(Status::BadArgument)?;
            let bytes = read(&mut c, ptr, len)?;
            let buf = buffer_mut(c.data_mut(), kind)?;
            // Envoy's rule: start 0 drains `size` bytes then prepends; a start
            // at or past the end appends; anything in between is refused.
            let start = start as u32 as usize;
            if start != 0 && start < buf.len() {
                return Err(Status::BadArgument.into());
            }
            let start = start.min(buf.len());
            let end = if start == 0 {
                (size as u32 as usize).min(buf.len())
            } else {
                start
            };
            buf.splice(start..end, bytes);
            Ok(())
        }
    );

    // Header maps.
    wrap!(
        "proxy_get_header_map_pairs",
        |c, kind: i32, ptr_out: i32, size_out: i32| {
            let wire = map_mut(c.data_mut(), kind)?.serialize();
            copy_out(&mut c, &wire, ptr_out, size_out)
        }
    );
    wrap!(
        "proxy_set_header_map_pairs",
        |c, kind: i32, ptr: i32, len: i32| {
            let pairs = HeaderMap::deserialize(&read(&mut c, ptr, len)?)
                .map_err(|_| Status::BadArgument)?;
            *map_mut(c.data_mut(), kind)? = pairs;
            Ok(())
        }
    );
    wrap!("proxy_get_header_map_size", |c, kind: i32, out: i32| {
        let size = map_mut(c.data_mut(), kind)?.serialize().len();
        write_u32(&mut c, out, size as u32)
    });
    wrap!(
        "proxy_get_header_map_value",
        |c, kind: i32, kp: i32, kl: i32, ptr_out: i32, size_out: i32| {
            let key = read(&mut c, kp, kl)?;
            let value = map_mut(c.data_mut(), kind)?
                .get(&key)
                .map(<[u8]>::to_vec)
                .ok_or(Status::NotFound)?;
            copy_out(&mut c, &value, ptr_out, size_out)
        }
    );
    wrap!(
        "proxy_replace_header_map_value",
        |c, kind: i32, kp: i32, kl: i32, vp: i32, vl: i32| {
            let (key, value) = (read(&mut c, kp, kl)?, read(&mut c, vp, vl)?);
            map_mut(c.data_mut(), kind)?.replace(&key, &value);
            Ok(())
        }
    );
    wrap!(
        "proxy_add_header_map_value",
        |c, kind: i32, kp: i32, kl: i32, vp: i32, vl: i32| {
            let (key, value) = (read(&mut c, kp, kl)?, read(&mut c, vp, vl)?);
            map_mut(c.data_mut(), kind)?.add(&key, &value);
            Ok(())
        }
    );
    wrap!(
        "proxy_remove_header_map_value",
        |c, kind: i32, kp: i32, kl: i32| {
            let key = read(&mut c, kp, kl)?;
            map_mut(c.data_mut(), kind)?.remove(&key);
            Ok(())
        }
    );

    // Properties.
    wrap!(
        "proxy_get_property",
        |c, pp: i32, pl: i32, ptr_out: i32, size_out: i32| {
            let path = properties::parse_path(&read(&mut c, pp, pl)?);
            let value = properties::lookup(c.data(), &path).ok_or(Status::NotFound)?;
            copy_out(&mut c, &value, ptr_out, size_out)
        }
    );
    wrap!(
        "proxy_set_property",
        |c, pp: i32, pl: i32, vp: i32, vl: i32| {
            let path = properties::parse_path(&read(&mut c, pp, pl)?);
            let value = read(&mut c, vp, vl)?;
            // Envoy keeps these in the stream's filter state (as `wasm.<path>`),
            // so they live and die with the request; from the root context they
            // are VM-wide.
            let s = c.data_mut();
            match s.stream() {
                Some(stream) => stream.set_properties.insert(path, value),
                None => s.set_properties.insert(path, value),
            };
            Ok(())
        }
    );

    // Shared data and queues.
    wrap!(
        "proxy_get_shared_data",
        |c, kp: i32, kl: i32, ptr_out: i32, size_out: i32, cas_out: i32| {
            let key = read_string(&mut c, kp, kl)?;
            let (value, cas) = c
                .data()
                .shared_data
                .get(&key)
                .cloned()
                .ok_or(Status::NotFound)?;
            copy_out(&mut c, &value, ptr_out, size_out)?;
            write_u32(&mut c, cas_out, cas)
        }
    );
    wrap!(
        "proxy_set_shared_data",
        |c, kp: i32, kl: i32, vp: i32, vl: i32, cas: i32| {
            let key = read_string(&mut c, kp, kl)?;
            let value = read(&mut c, vp, vl)?;
            let data = &mut c.data_mut().shared_data;
            let current = data.get(&key).map(|(_, cas)| *cas);
            if cas != 0 && current.is_some_and(|cur| cur != cas as u32) {
                return Err(Status::CasMismatch.into());
            }
            data.insert(key, (value, current.unwrap_or(0).wrapping_add(1).max(1)));
            Ok(())
        }
    );
    wrap!(
        "proxy_register_shared_queue",
        |c, np: i32, nl: i32, out: i32| {
            let name = read_string(&mut c, np, nl)?;
            let s = c.data_mut();
            let vm_id = s.options.vm_id.clone();
            let id = match s
                .queues
                .iter()
                .position(|q| q.vm_id == vm_id && q.name == name)
            {
                Some(i) => i + 1,
                None => {
                    s.queues.push(Queue {
                        vm_id,
                        name,
                        items: Default::default(),
                    });
                    s.queues.len()
                }
            };
            write_u32(&mut c, out, id as u32)
        }
    );
    wrap!(
        "proxy_resolve_shared_queue",
        |c, vp: i32, vl: i32, np: i32, nl: i32, out: i32| {
            let vm_id = read_string(&mut c, vp, vl)?;
            let name = read_string(&mut c, np, nl)?;
            let id = c
                .data()
                .queues
                .iter()
                .position(|q| q.vm_id == vm_id && q.name == name)
                .ok_or(Status::NotFound)?;
            write_u32(&mut c, out, id as u32 + 1)
        }
    );
    wrap!(
        "proxy_enqueue_shared_queue",
        |c, id: i32, vp: i32, vl: i32| {
            let value = read(&mut c, vp, vl)?;
            let s = c.data_mut();
            let queue = s
                .queues
                .get_mut((id as u32 as usize).wrapping_sub(1))
                .ok_or(Status::NotFound)?;
            queue.items.push_back(value);
            s.deferred.push_back(Deferred::QueueReady {
                queue_id: id as u32,
            });
            Ok(())
        }
    );
    wrap!(
        "proxy_dequeue_shared_queue",
        |c, id: i32, ptr_out: i32, size_out: i32| {
            let queue = c
                .data_mut()
                .queues
                .get_mut((id as u32 as usize).wrapping_sub(1))
                .ok_or(Status::NotFound)?;
            let item = queue.items.pop_front().ok_or(Status::Empty)?;
            copy_out(&mut c, &item, ptr_out, size_out)
        }
    );

    // Stream control.
    wrap!("proxy_continue_stream", |c, kind: i32| {
        let kind = StreamType::from_raw(kind).ok_or(Status::BadArgument)?;
        let stream = c.data_mut().stream().ok_or(Status::BadArgument)?;
        match kind {
            StreamType::Request => stream.resume_request = true,
            StreamType::Response => stream.resume_response = true,
        }
        Ok(())
    });
    wrap!("proxy_close_stream", |c, kind: i32| {
        StreamType::from_raw(kind).ok_or(Status::BadArgument)?;
        c.data_mut().stream().ok_or(Status::BadArgument)?.closed = true;
        Ok(())
    });
    wrap!(
        "proxy_send_local_response",
        |c, status: i32, dp: i32, dl: i32, bp: i32, bl: i32, hp: i32, hl: i32, grpc_status: i32| {
            let details = String::from_utf8_lossy(&read(&mut c, dp, dl)?).into_owned();
            let body = read(&mut c, bp, bl)?;
            let headers =
                HeaderMap::deserialize(&read(&mut c, hp, hl)?).map_err(|_| Status::BadArgument)?;
            let stream = c.data_mut().stream().ok_or(Status::BadArgument)?;
            stream.local_response = Some(LocalResponse {
                status: status as u32,
                details,
                headers,
                body,
                grpc_status,
            });
            Ok(())
        }
    );

    // HTTP calls.
    wrap!(
        "proxy_http_call",
        |c,
         up: i32,
         ul: i32,
         hp: i32,
         hl: i32,
         bp: i32,
         bl: i32,
         tp: i32,
         tl: i32,
         timeout: i32,
         token_out: i32| {
            let upstream = read_string(&mut c, up, ul)?;
            let headers =
                HeaderMap::deserialize(&read(&mut c, hp, hl)?).map_err(|_| Status::BadArgument)?;
            let body = read(&mut c, bp, bl)?;
            HeaderMap::deserialize(&read(&mut c, tp, tl)?).map_err(|_| Status::BadArgument)?;
            // Envoy refuses calls without these pseudo-headers.
            if [":method", ":path", ":authority"]
                .iter()
                .any(|h| headers.get(h.as_bytes()).is_none())
            {
                return Err(Status::BadArgument.into());
            }
            let s = c.data_mut();
            let token = s.http_calls.len() as u32 + 1;
            let context_id = s.current_context;
            if let Some(resp) = s
                .scripted_http_responses
                .get_mut(&upstream)
                .and_then(|q| q.pop_front())
            {
                s.ready_http_responses.insert(token, resp);
                s.deferred.push_back(Deferred::HttpCallResponse { token });
            }
            s.http_calls.push(HttpCall {
                token,
                context_id,
                upstream,
                headers,
                body,
                timeout_ms: timeout as u32,
            });
            write_u32(&mut c, token_out, token)
        }
    );

    // Foreign functions.
    wrap!(
        "proxy_call_foreign_function",
        |c, np: i32, nl: i32, ap: i32, al: i32, ptr_out: i32, size_out: i32| {
            let name = String::from_utf8_lossy(&read(&mut c, np, nl)?).into_owned();
            let args = read(&mut c, ap, al)?;
            let s = c.data_mut();
            let status = match name.as_str() {
                "set_envoy_filter_state" => {
                    match filter_state::decode_and_check(
                        &args,
                        &s.options.accepted_filter_state_keys,
                    ) {
                        Ok(entry) => {
                            s.filter_state.push(entry);
                            Status::Ok
                        }
                        Err(status) => status,
                    }
                }
                "clear_route_cache" => {
                    s.route_cache_clears += 1;
                    Status::Ok
                }
                _ => Status::NotFound,
            };
            s.foreign_calls.push(ForeignCall { name, args, status });
            if status != Status::Ok {
                return Err(status.into());
            }
            copy_out(&mut c, &[], ptr_out, size_out)
        }
    );

    // Metrics.
    wrap!(
        "proxy_define_metric",
        |c, kind: i32, np: i32, nl: i32, out: i32| {
            let kind = MetricType::from_raw(kind).ok_or(Status::BadArgument)?;
            let name = read_string(&mut c, np, nl)?;
            let metrics = &mut c.data_mut().metrics;
            let id = match metrics.iter().position(|m| m.name == name) {
                Some(i) if metrics[i].kind == kind => i + 1,
                Some(_) => return Err(Status::BadArgument.into()),
                None => {
                    metrics.push(Metric {
                        name,
                        kind,
                        value: 0,
                        count: 0,
                    });
                    metrics.len()
                }
            };
            write_u32(&mut c, out, id as u32)
        }
    );
    wrap!("proxy_increment_metric", |c, id: i32, offset: i64| {
        let m = metric(c.data_mut(), id)?;
        match m.kind {
            MetricType::Counter if offset < 0 => return Err(Status::BadArgument.into()),
            MetricType::Histogram => return Err(Status::BadArgument.into()),
            _ => m.value = m.value.wrapping_add_signed(offset),
        }
        Ok(())
    });
    wrap!("proxy_record_metric", |c, id: i32, value: i64| {
        let m = metric(c.data_mut(), id)?;
        match m.kind {
            MetricType::Histogram => {
                m.value = m.value.wrapping_add(value as u64);
                m.count += 1;
            }
            _ => m.value = value as u64,
        }
        Ok(())
    });
    wrap!("proxy_get_metric", |c, id: i32, out: i32| {
        let m = metric(c.data_mut(), id)?;
        if m.kind == MetricType::Histogram {
            return Err(Status::BadArgument.into());
        }
        let value = m.value;
        write_u64(&mut c, out, value)
    });

    // gRPC is outside this host's scope: answer so the guest can handle it.
    wrap!(
        "proxy_get_status",
        |_c, _code: i32, _ptr: i32, _size: i32| Err(Status::Unimplemented.into())
    );
    wrap!("proxy_grpc_cancel", |_c, _token: i32| Err(
        Status::Unimplemented.into()
    ));
    wrap!("proxy_grpc_close", |_c, _token: i32| Err(
        Status::Unimplemented.into()
    ));
    Ok(())
}

fn metric(s: &mut HostState, id: i32) -> HostResult<&mut Metric> {
    s.metrics
        .get_mut((id as u32 as usize).wrapping_sub(1))
        .ok_or_else(|| Status::NotFound.into())
}

/// The header map `kind` of the current context, if Envoy would expose it now.
fn map_mut(s: &mut HostState, kind: i32) -> HostResult<&mut HeaderMap> {
    let kind = MapType::from_raw(kind).ok_or(Status::BadArgument)?;
    if let MapType::HttpCallResponseHeaders | MapType::HttpCallResponseTrailers = kind {
        let resp = s
            .current_http_response
            .as_mut()
            .ok_or(Status::BadArgument)?;
        return Ok(if kind == MapType::HttpCallResponseHeaders {
            &mut resp.headers
        } else {
            &mut resp.trailers
        });
    }
    let stream = s.stream().ok_or(Status::BadArgument)?;
    let (map, access) = match kind {
        MapType::RequestHeaders => (&mut stream.request_headers, stream.request_headers_access),
        MapType::RequestTrailers => (&mut stream.request_trailers, stream.request_trailers_access),
        MapType::ResponseHeaders => (&mut stream.response_headers, stream.response_headers_access),
        _ => (
            &mut stream.response_trailers,
            stream.response_trailers_access,
        ),
    };
    match access {
        Access::ReadWrite => Ok(map),
        Access::Gone => Err(Status::BadArgument.into()),
    }
}

fn buffer_mut(s: &mut HostState, kind: BufferType) -> HostResult<&mut Vec<u8>> {
    match kind {
        BufferType::VmConfiguration | BufferType::PluginConfiguration => {
            Err(Status::BadArgument.into())
        }
        BufferType::HttpCallResponseBody => Ok(&mut s
            .current_http_response
            .as_mut()
            .ok_or(Status::NotFound)?
            .body),
        BufferType::RequestBody | BufferType::ResponseBody => {
            let stream = s.stream().ok_or(Status::NotFound)?;
            let (buf, access) = if kind == BufferType::RequestBody {
                (&mut stream.request_body, stream.request_body_access)
            } else {
                (&mut stream.response_body, stream.response_body_access)
            };
            if access == Access::Gone {
                return Err(Status::NotFound.into());
            }
            Ok(buf)
        }
    }
}

/// Moves a readable buffer out (no copy), to be put back with `put_buffer`.
fn take_buffer(s: &mut HostState, kind: BufferType) -> HostResult<Vec<u8>> {
    match kind {
        BufferType::VmConfiguration => Ok(std::mem::take(&mut s.options.vm_config)),
        BufferType::PluginConfiguration => Ok(std::mem::take(&mut s.options.plugin_config)),
        _ => Ok(std::mem::take(buffer_mut(s, kind)?)),
    }
}

fn put_buffer(s: &mut HostState, kind: BufferType, data: Vec<u8>) {
    let slot = match kind {
        BufferType::VmConfiguration => Some(&mut s.options.vm_config),
        BufferType::PluginConfiguration => Some(&mut s.options.plugin_config),
        _ => buffer_mut(s, kind).ok(),
    };
    if let Some(slot) = slot {
        *slot = data;
    }
}
