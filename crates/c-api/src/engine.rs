//! C API: the engine (stock MXEnginePush*, MXEngineSetBulkSize, MXNDArrayWaitAll) and our
//! additions for C callers (MXEngineNewVar, MXEngineDeleteVar, MXEngineWaitForVar,
//! MXEngineCompleteAsync).

use super::ffi::{self, out};
use super::types::{ContextHandle, EngineFnPropertyHandle, EngineVarHandle};
use crate::handle::HandleTable;
use mxnet_core::context::Context;
use mxnet_core::engine::{self, Completion, FnProperty, Push, RunContext, Var, VarList};
use mxnet_core::error::{Error, ErrorKind, Result};
use mxnet_core::sync::Mutex;
use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, OnceLock};

/// An asynchronous function: `(RunContext* rctx, void* on_complete, void* param)`. It must
/// finish by calling `MXEngineCompleteAsync(on_complete, error_or_NULL)`, from any thread.
pub type EngineAsyncFunc = Option<unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_void)>;
/// A synchronous function: `(RunContext* rctx, void* param)`.
pub type EngineSyncFunc = Option<unsafe extern "C" fn(*mut c_void, *mut c_void)>;
/// Frees `param` once the operation has finished.
pub type EngineFuncParamDeleter = Option<unsafe extern "C" fn(*mut c_void)>;

pub(crate) fn vars() -> &'static HandleTable<Var> {
    static T: OnceLock<HandleTable<Var>> = OnceLock::new();
    T.get_or_init(|| HandleTable::new(2, "EngineVar"))
}

fn completions() -> &'static HandleTable<Mutex<Option<Completion>>> {
    static T: OnceLock<HandleTable<Mutex<Option<Completion>>>> = OnceLock::new();
    T.get_or_init(|| HandleTable::new(3, "on_complete"))
}

/// The caller's `param` and deleter: the deleter runs once, when the operation has finished.
struct CParam {
    param: *mut c_void,
    deleter: EngineFuncParamDeleter,
}
// SAFETY: the C API contract hands `param` to the engine, which may run the function and the
// deleter on a worker thread; the caller promises that is allowed (as with stock MXNet).
unsafe impl Send for CParam {}

impl Drop for CParam {
    fn drop(&mut self) {
        if let Some(d) = self.deleter {
            // SAFETY: the caller's deleter for its own param, called exactly once.
            unsafe { d(self.param) }
        }
    }
}

/// A raw pointer that may cross to a worker thread (see `CParam`).
#[derive(Clone, Copy)]
struct SendPtr(*mut c_void);
// SAFETY: as for CParam.
unsafe impl Send for SendPtr {}

/// Where a push's variables come from: engine variable handles or NDArray handles.
pub(crate) trait VarHandles {
    /// The variable behind a handle (one more reference to it).
    fn var(&self, h: *mut c_void) -> Result<Arc<Var>>;
}

/// Engine variable handles (MXEngineNewVar).
pub(crate) struct EngineVars;

impl VarHandles for EngineVars {
    fn var(&self, h: *mut c_void) -> Result<Arc<Var>> {
        vars().get(h)
    }
}

/// A C array of `n` handles, checked on use.
#[derive(Clone, Copy)]
pub(crate) struct HandleList {
    pub ptr: *const *mut c_void,
    pub n: c_int,
    pub what: &'static str,
}

impl HandleList {
    /// # Safety
    /// `ptr` must point to `n` readable handles when `n > 0`.
    unsafe fn slice<'a>(self) -> Result<&'a [*mut c_void]> {
        if self.n == 0 {
            return Ok(&[]);
        }
        if self.n < 0 {
            return Err(Error::value(format!("{}: negative count {}", self.what, self.n)));
        }
        if self.ptr.is_null() {
            return Err(Error::value(format!("{} is NULL but its count is {}", self.what, self.n)));
        }
        // SAFETY: per this function's contract.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr, self.n as usize) })
    }
}

fn var_list(table: &impl VarHandles, hs: &[*mut c_void]) -> Result<VarList> {
    let mut list = VarList::with_capacity(hs.len());
    for &h in hs {
        list.push(table.var(h)?);
    }
    Ok(list)
}

/// # Safety
/// `ctx` must be NULL or point to `{int dev_type; int dev_id;}`.
#[inline]
pub(crate) unsafe fn read_context(ctx: ContextHandle) -> Result<Context> {
    if ctx.is_null() {
        return Err(Error::value("ctx_handle must not be NULL"));
    }
    // SAFETY: per this function's contract.
    let (t, id) = unsafe { (*(ctx as *const i32), *(ctx as *const i32).add(1)) };
    Context::from_codes(t, id)
}

/// # Safety
/// `prop` must be NULL or point to an int.
#[inline]
unsafe fn read_prop(prop: EngineFnPropertyHandle) -> Result<FnProperty> {
    if prop.is_null() {
        return Ok(FnProperty::Normal);
    }
    // SAFETY: per this function's contract.
    FnProperty::from_code(unsafe { *(prop as *const i32) })
}

/// The arguments every push function shares besides its variables and its function, as C
/// passed them.
pub(crate) struct CArgs {
    pub ctx: ContextHandle,
    pub prop: EngineFnPropertyHandle,
    pub priority: c_int,
    pub name: *const c_char,
    pub wait: bool,
}

/// The caller's function (exactly one of the two), its param and the param's deleter.
pub(crate) struct CFunc {
    pub sync_func: EngineSyncFunc,
    pub async_func: EngineAsyncFunc,
    pub param: *mut c_void,
    pub deleter: EngineFuncParamDeleter,
}

/// The shared part of the four push functions: the C caller's operation as a [`Push`], given
/// to [`engine::Engine::submit`], which picks its path.
///
/// # Safety
/// As for MXEnginePushAsync: the handle lists as [`HandleList`] requires, `args.ctx` NULL or
/// pointing to `{int dev_type; int dev_id;}`, `args.prop` NULL or pointing to an int,
/// `args.name` NULL or a NUL-terminated string.
pub(crate) unsafe fn push_c(
    table: &impl VarHandles,
    reads: HandleList,
    writes: HandleList,
    args: CArgs,
    func: CFunc,
) -> Result<()> {
    // SAFETY: per this function's contract.
    let (reads, writes) = unsafe { (reads.slice()?, writes.slice()?) };
    // SAFETY: per this function's contract.
    let (ctx, prop) = unsafe { (read_context(args.ctx)?, read_prop(args.prop)?) };
    if func.sync_func.is_none() == func.async_func.is_none() {
        return Err(Error::value("the operation's function must not be NULL"));
    }
    let engine = engine::global()?;
    let (const_vars, mutable_vars) = (var_list(table, reads)?, var_list(table, writes)?);
    // SAFETY: per this function's contract.
    let name = unsafe { ffi::opt_cstr(args.name, "opr_name") }?;
    // Everything that can fail is checked before the param is taken over: on failure it stays
    // the caller's.
    engine.validate(&const_vars, &mutable_vars, ctx, prop)?;
    // An operation's name is seen only through the profiler (a C function cannot fail, and
    // an asynchronous one names its own failures): interned only while the profiler records
    // operations.
    let name = if mxnet_core::profiler::ops_on(false) { name.map(mxnet_core::intern::intern) } else { None };
    let CFunc { sync_func, async_func, param, deleter } = func;
    let (func, payload) = match (sync_func, async_func) {
        // The param (and its deleter) goes with the function: freed right after the call.
        // SAFETY: the caller's function and deleter with the caller's param, callable on a
        // worker thread as the API promises.
        (Some(f), None) => {
            (engine::Func::Fn(engine::OprFn::Raw(unsafe { engine::RawFn::new(f, param, deleter) })), None)
        }
        // An async function uses its param until it completes: the engine drops it then.
        (None, Some(f)) => {
            let p = SendPtr(param);
            let run = move |rctx: &RunContext, done: Completion| {
                let p = p;
                let token = completions().insert(Arc::new(Mutex::new(Some(done))));
                // SAFETY: as above; `token` is completed through MXEngineCompleteAsync.
                // Inside the call gate, as every engine operation is (see `runtime::outside_call`).
                unsafe { f(rctx as *const RunContext as *mut c_void, token, p.0) };
            };
            (
                engine::Func::Fn(engine::OprFn::Async(Box::new(run))),
                Some(Box::new(CParam { param, deleter }) as engine::Payload),
            )
        }
        _ => unreachable!("exactly one function, checked above"),
    };
    let mut p = Push::with(func, engine::Vars::Listed(const_vars, mutable_vars));
    p.ctx = ctx;
    p.prop = prop;
    p.priority = args.priority;
    p.name = name.as_ref();
    p.payload = payload;
    p.wait = args.wait;
    // Read only while operations are profiled: pushes otherwise skip the thread-local.
    p.scope = if mxnet_core::profiler::ops_on(false) { mxnet_core::profiler::scope() } else { None };
    // A C function's cost is unknown: not cheap (a threaded engine gives it to a worker).
    engine.submit(p)
}

/// The two handle lists of MXEnginePushAsync and MXEnginePushSync.
fn engine_var_lists(
    reads: EngineVarHandle,
    n_reads: c_int,
    writes: EngineVarHandle,
    n_writes: c_int,
) -> (HandleList, HandleList) {
    (
        HandleList { ptr: reads as *const *mut c_void, n: n_reads, what: "const_vars_handle" },
        HandleList { ptr: writes as *const *mut c_void, n: n_writes, what: "mutable_vars_handle" },
    )
}

/// Push an asynchronous operation that reads `const_vars_handle[0..num_const_vars]` and
/// writes `mutable_vars_handle[0..num_mutable_vars]` (arrays of EngineVarHandle). `ctx_handle`
/// points to `{int dev_type; int dev_id;}`; `prop_handle` to an int FnProperty, or NULL for
/// normal. The deleter (may be NULL) runs exactly once after the operation finished. With
/// `wait`, returns only when the operation has finished. On failure nothing runs and
/// `func_param` stays the caller's.
///
/// # Safety
/// Pointers as described; `async_func` must eventually call MXEngineCompleteAsync.
#[no_mangle]
pub unsafe extern "C" fn MXEnginePushAsync(
    async_func: EngineAsyncFunc,
    func_param: *mut c_void,
    deleter: EngineFuncParamDeleter,
    ctx_handle: ContextHandle,
    const_vars_handle: EngineVarHandle,
    num_const_vars: c_int,
    mutable_vars_handle: EngineVarHandle,
    num_mutable_vars: c_int,
    prop_handle: EngineFnPropertyHandle,
    priority: c_int,
    opr_name: *const c_char,
    wait: bool,
) -> c_int {
    ffi::call("MXEnginePushAsync", || {
        // SAFETY: per this function's contract.
        unsafe {
            let (reads, writes) =
                engine_var_lists(const_vars_handle, num_const_vars, mutable_vars_handle, num_mutable_vars);
            let args = CArgs { ctx: ctx_handle, prop: prop_handle, priority, name: opr_name, wait };
            push_c(&EngineVars, reads, writes, args, CFunc { sync_func: None, async_func, param: func_param, deleter })
        }
    })
}

/// Push a synchronous operation; as MXEnginePushAsync, the function being done when it
/// returns.
///
/// # Safety
/// Pointers as described for MXEnginePushAsync.
#[no_mangle]
pub unsafe extern "C" fn MXEnginePushSync(
    sync_func: EngineSyncFunc,
    func_param: *mut c_void,
    deleter: EngineFuncParamDeleter,
    ctx_handle: ContextHandle,
    const_vars_handle: EngineVarHandle,
    num_const_vars: c_int,
    mutable_vars_handle: EngineVarHandle,
    num_mutable_vars: c_int,
    prop_handle: EngineFnPropertyHandle,
    priority: c_int,
    opr_name: *const c_char,
) -> c_int {
    ffi::call("MXEnginePushSync", || {
        // SAFETY: per this function's contract.
        unsafe {
            let (reads, writes) =
                engine_var_lists(const_vars_handle, num_const_vars, mutable_vars_handle, num_mutable_vars);
            let args = CArgs { ctx: ctx_handle, prop: prop_handle, priority, name: opr_name, wait: false };
            push_c(&EngineVars, reads, writes, args, CFunc { sync_func, async_func: None, param: func_param, deleter })
        }
    })
}

/// mxnet-rt addition: finish an asynchronous operation. `on_complete` is the token its
/// function received; `error` is NULL for success, else the failure's text (an
/// `ErrorType: message` prefix picks the error type, otherwise MXNetError). The failure marks
/// the variables the operation writes and is reported at the next wait on them. Completing a
/// token twice is an error.
///
/// # Safety
/// `error` must be NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn MXEngineCompleteAsync(on_complete: *mut c_void, error: *const c_char) -> c_int {
    ffi::call_completing("MXEngineCompleteAsync", || {
        // SAFETY: per this function's contract.
        let error = unsafe { ffi::opt_cstr(error, "error") }?;
        let slot = completions().remove(on_complete)?;
        let done = slot.lock().take().ok_or_else(|| Error::value("on_complete was already completed"))?;
        done.complete(match error {
            None => Ok(()),
            Some(text) => Err(parse_error_text(text)),
        });
        Ok(())
    })
}

/// `"TypeError: x"` → TypeError("x"); text without a known prefix → MXNetError(text).
fn parse_error_text(text: &str) -> Error {
    let kinds = [
        ErrorKind::Value,
        ErrorKind::Type,
        ErrorKind::Index,
        ErrorKind::NotImplemented,
        ErrorKind::Internal,
        ErrorKind::MXNet,
    ];
    for k in kinds {
        if let Some(rest) = text.strip_prefix(k.name()).and_then(|r| r.strip_prefix(": ")) {
            return Error::new(k, rest);
        }
    }
    Error::mxnet(text)
}

/// mxnet-rt addition: create an engine variable for C callers.
///
/// # Safety
/// `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXEngineNewVar(out: *mut EngineVarHandle) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { ffi::call_out("MXEngineNewVar", out, "out", || Ok(vars().insert(Var::new()))) }
}

/// mxnet-rt addition: delete an engine variable. The handle is invalid at once; operations
/// already pushed on it still run, and the variable is freed after the last of them.
#[no_mangle]
pub extern "C" fn MXEngineDeleteVar(var: EngineVarHandle) -> c_int {
    ffi::call("MXEngineDeleteVar", || vars().remove(var).map(drop))
}

/// mxnet-rt addition: wait until the variable's pending writes (`write` 0) or all its pending
/// operations (`write` 1) have finished; -1 with the failure if an operation that wrote it
/// failed (reported once).
#[no_mangle]
pub extern "C" fn MXEngineWaitForVar(var: EngineVarHandle, write: c_int) -> c_int {
    ffi::call("MXEngineWaitForVar", || {
        let v = vars().get(var)?;
        engine::global()?.wait_for_var(&v, write != 0)
    })
}

/// Set the calling thread's bulk size: up to this many consecutive synchronous operations
/// pushed by this thread to one device run as one engine task (0 or 1: no batching).
/// `*prev_bulk_size` receives the previous size.
///
/// # Safety
/// `prev_bulk_size` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXEngineSetBulkSize(bulk_size: c_int, prev_bulk_size: *mut c_int) -> c_int {
    ffi::call("MXEngineSetBulkSize", || {
        // SAFETY: per this function's contract.
        let prev = unsafe { out(prev_bulk_size, "prev_bulk_size") }?;
        if bulk_size < 0 {
            return Err(Error::value(format!("bulk size must be >= 0, got {bulk_size}")));
        }
        let old = engine::global()?.set_bulk_size(bulk_size as usize);
        *prev = old.min(c_int::MAX as usize) as c_int;
        Ok(())
    })
}

/// Wait until every pushed operation has finished; -1 with the first failure that no wait
/// has reported yet (then cleared).
#[no_mangle]
pub extern "C" fn MXNDArrayWaitAll() -> c_int {
    ffi::call("MXNDArrayWaitAll", || match engine::global_if_started() {
        Some(e) => e.wait_all(),
        None => Ok(()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_text_prefixes() {
        assert_eq!(parse_error_text("TypeError: bad").to_string(), "TypeError: bad");
        assert_eq!(parse_error_text("disk on fire").to_string(), "MXNetError: disk on fire");
        assert_eq!(parse_error_text("ValueError:x").to_string(), "MXNetError: ValueError:x");
    }
}
