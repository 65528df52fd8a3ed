//! The few WASI preview-1 functions a proxy-wasm guest imports, hand-written:
//! stdout/stderr become logs, clocks follow the host clock, randomness is
//! seeded, there is no environment, and `proc_exit` ends the call with an error.

use crate::guest_memory::{Ctx, HostResult, read, write, write_u32, write_u64};
use crate::state::HostState;
use std::collections::HashSet;
use wasmtime::Linker;

const MODULE: &str = "wasi_snapshot_preview1";
const ERRNO_SUCCESS: i32 = 0;
const ERRNO_BADF: i32 = 8;
const ERRNO_FAULT: i32 = 21;

/// `proc_exit` called by the guest: carried out of the call as a trap.
#[derive(Debug, thiserror::Error)]
#[error("guest called proc_exit({0})")]
pub struct ProcExit(pub i32);

fn errno(r: HostResult) -> i32 {
    if r.is_ok() {
        ERRNO_SUCCESS
    } else {
        ERRNO_FAULT
    }
}

#[allow(
    clippy::redundant_closure_call,
    reason = "the closure gives `?` a scope"
)]
pub(crate) fn define(
    linker: &mut Linker<HostState>,
    defined: &mut HashSet<String>,
) -> wasmtime::Result<()> {
    for name in [
        "fd_write",
        "clock_time_get",
        "clock_res_get",
        "random_get",
        "environ_sizes_get",
        "environ_get",
        "args_sizes_get",
        "args_get",
        "proc_exit",
        "sched_yield",
    ] {
        defined.insert(format!("{MODULE}.{name}"));
    }
    linker.func_wrap(
        MODULE,
        "fd_write",
        |mut c: Ctx<'_>, fd: i32, iovs: i32, n: i32, written_out: i32| -> i32 {
            if fd != 1 && fd != 2 {
                return ERRNO_BADF;
            }
            errno((|| {
                let mut total = 0u32;
                for i in 0..n.max(0) {
                    let iov = read(&mut c, iovs.wrapping_add(i * 8), 8)?;
                    let ptr = i32::from_le_bytes([iov[0], iov[1], iov[2], iov[3]]);
                    let len = i32::from_le_bytes([iov[4], iov[5], iov[6], iov[7]]);
                    let bytes = read(&mut c, ptr, len)?;
                    total = total.wrapping_add(bytes.len() as u32);
                    let s = c.data_mut();
                    if fd == 1 {
                        s.stdout.extend(bytes)
                    } else {
                        s.stderr.extend(bytes)
                    }
                }
                c.data_mut().flush_stdio(false);
                write_u32(&mut c, written_out, total)
            })())
        },
    )?;
    linker.func_wrap(
        MODULE,
        "clock_time_get",
        |mut c: Ctx<'_>, _id: i32, _precision: i64, out: i32| -> i32 {
            let now = c.data().now_ns;
            // Diagnostic: with a metered module built with feature
            // `phase-timing`, the fuel left at each clock read gives the wasm
            // operators of each phase (BENCHMARKS.md, the body path).
            if std::env::var_os("TETHER_FUEL_AT_CLOCK").is_some() {
                eprintln!("fuel at clock read: {}", c.get_fuel().unwrap_or(0));
            }
            errno(write_u64(&mut c, out, now))
        },
    )?;
    linker.func_wrap(
        MODULE,
        "clock_res_get",
        |mut c: Ctx<'_>, _id: i32, out: i32| -> i32 { errno(write_u64(&mut c, out, 1)) },
    )?;
    linker.func_wrap(
        MODULE,
        "random_get",
        |mut c: Ctx<'_>, ptr: i32, len: i32| -> i32 {
            let mut bytes = Vec::with_capacity(len.max(0) as usize + 8);
            while bytes.len() < len.max(0) as usize {
                let r = c.data_mut().next_random();
                bytes.extend_from_slice(&r.to_le_bytes());
            }
            bytes.truncate(len.max(0) as usize);
            errno(write(&mut c, ptr, &bytes))
        },
    )?;
    for name in ["environ_sizes_get", "args_sizes_get"] {
        linker.func_wrap(
            MODULE,
            name,
            |mut c: Ctx<'_>, count_out: i32, size_out: i32| -> i32 {
                errno(write_u32(&mut c, count_out, 0).and_then(|()| write_u32(&mut c, size_out, 0)))
            },
        )?;
    }
    for name in ["environ_get", "args_get"] {
        linker.func_wrap(MODULE, name, |_c: Ctx<'_>, _ptrs: i32, _buf: i32| -> i32 {
            ERRNO_SUCCESS
        })?;
    }
    linker.func_wrap(
        MODULE,
        "proc_exit",
        |_c: Ctx<'_>, code: i32| -> wasmtime::Result<()> {
            Err(wasmtime::Error::new(ProcExit(code)))
        },
    )?;
    linker.func_wrap(MODULE, "sched_yield", |_c: Ctx<'_>| -> i32 {
        ERRNO_SUCCESS
    })?;
    Ok(())
}
