//! Checked access to the guest's linear memory from inside a host call, and
//! returning host-owned bytes into guest-allocated memory.

use crate::abi::Status;
use crate::state::HostState;
use wasmtime::{Caller, Extern, Memory};

pub(crate) type Ctx<'a> = Caller<'a, HostState>;

/// Why a host call did not succeed: a status for the guest, or a trap.
#[derive(Debug)]
pub(crate) enum Fault {
    Status(Status),
    Trap(wasmtime::Error),
}

impl From<Status> for Fault {
    fn from(s: Status) -> Self {
        Fault::Status(s)
    }
}

pub(crate) type HostResult<T = ()> = Result<T, Fault>;

/// Turns a host-call result into the i32 status the guest sees (or a trap).
pub(crate) fn finish(result: HostResult) -> wasmtime::Result<i32> {
    match result {
        Ok(()) => Ok(Status::Ok.code()),
        Err(Fault::Status(s)) => Ok(s.code()),
        Err(Fault::Trap(e)) => Err(e),
    }
}

fn memory(c: &mut Ctx<'_>) -> HostResult<Memory> {
    match c.get_export("memory") {
        Some(Extern::Memory(m)) => Ok(m),
        _ => Err(Status::InternalFailure.into()),
    }
}

fn range(ptr: i32, len: i32) -> HostResult<std::ops::Range<usize>> {
    let start = ptr as u32 as usize;
    let end = start
        .checked_add(len as u32 as usize)
        .ok_or(Status::InvalidMemoryAccess)?;
    Ok(start..end)
}

/// Copies `len` bytes at `ptr` out of the guest.
pub(crate) fn read(c: &mut Ctx<'_>, ptr: i32, len: i32) -> HostResult<Vec<u8>> {
    let mem = memory(c)?;
    let r = range(ptr, len)?;
    mem.data(&*c)
        .get(r)
        .map(<[u8]>::to_vec)
        .ok_or_else(|| Status::InvalidMemoryAccess.into())
}

/// Reads a UTF-8 string argument; invalid text is a `BadArgument`.
pub(crate) fn read_string(c: &mut Ctx<'_>, ptr: i32, len: i32) -> HostResult<String> {
    String::from_utf8(read(c, ptr, len)?).map_err(|_| Status::BadArgument.into())
}

/// Writes bytes into the guest at `ptr`.
pub(crate) fn write(c: &mut Ctx<'_>, ptr: i32, bytes: &[u8]) -> HostResult {
    let mem = memory(c)?;
    let r = range(ptr, bytes.len() as i32)?;
    let dst = mem
        .data_mut(&mut *c)
        .get_mut(r)
        .ok_or(Status::InvalidMemoryAccess)?;
    dst.copy_from_slice(bytes);
    Ok(())
}

pub(crate) fn write_u32(c: &mut Ctx<'_>, ptr: i32, v: u32) -> HostResult {
    write(c, ptr, &v.to_le_bytes())
}

pub(crate) fn write_u64(c: &mut Ctx<'_>, ptr: i32, v: u64) -> HostResult {
    write(c, ptr, &v.to_le_bytes())
}

/// Hands `data` to the guest as the ABI requires: memory from the guest's own
/// allocator (`proxy_on_memory_allocate`, else `malloc`), then its address and
/// size into the two out-pointers. Empty data is returned as (null, 0).
pub(crate) fn copy_out(c: &mut Ctx<'_>, data: &[u8], ptr_out: i32, size_out: i32) -> HostResult {
    if data.is_empty() {
        write_u32(c, ptr_out, 0)?;
        return write_u32(c, size_out, 0);
    }
    let len = i32::try_from(data.len()).map_err(|_| Status::InternalFailure)?;
    let alloc = ["proxy_on_memory_allocate", "malloc"]
        .iter()
        .find_map(|name| c.get_export(name).and_then(Extern::into_func))
        .ok_or(Status::InternalFailure)?;
    let alloc = alloc
        .typed::<i32, i32>(&*c)
        .map_err(|_| Status::InternalFailure)?;
    let addr = alloc.call(&mut *c, len).map_err(Fault::Trap)?;
    if addr == 0 {
        return Err(Status::InternalFailure.into());
    }
    write(c, addr, data)?;
    c.data_mut().bytes_to_guest += data.len() as u64;
    write_u32(c, ptr_out, addr as u32)?;
    write_u32(c, size_out, len as u32)
}
