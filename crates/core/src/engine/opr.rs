//! Operations: what is pushed to the engine, how it runs and how it reports completion.
//!
//! Owns: [`Opr`] (an operation with its variables, priority, property and context), the
//! function kinds ([`OprFn`]), [`Completion`] (the token an asynchronous operation completes
//! with) and the stock-layout [`RunContext`] handed to C functions.

use super::pool::Pool;
use super::var::Var;
use super::Engine;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::sync::{Condvar, Mutex, SpinLock};
use smallvec::SmallVec;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// Stock `FnProperty` (engine.h), with its numeric values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FnProperty {
    Normal = 0,
    CopyFromGpu = 1,
    CopyToGpu = 2,
    CpuPrioritized = 3,
    Async = 4,
    DeleteVar = 5,
    GpuPrioritized = 6,
    NoSkip = 7,
}

impl FnProperty {
    pub const ALL: [FnProperty; 8] = [
        FnProperty::Normal,
        FnProperty::CopyFromGpu,
        FnProperty::CopyToGpu,
        FnProperty::CpuPrioritized,
        FnProperty::Async,
        FnProperty::DeleteVar,
        FnProperty::GpuPrioritized,
        FnProperty::NoSkip,
    ];
    pub fn from_code(code: i32) -> Result<Self> {
        Self::ALL
            .get(code as usize)
            .copied()
            .filter(|_| code >= 0)
            .ok_or_else(|| Error::value(format!("unknown FnProperty {code} (expected 0..=7)")))
    }
}

/// The run context given to operation functions; laid out like stock's `RunContext`
/// (`{Context ctx; void* stream; void* aux_stream; bool is_bulk;}`).
#[repr(C)]
#[derive(Debug)]
pub struct RunContext {
    pub dev_type: i32,
    pub dev_id: i32,
    pub stream: *mut c_void,
    pub aux_stream: *mut c_void,
    pub is_bulk: bool,
}

impl RunContext {
    pub(crate) fn for_ctx(ctx: Context, is_bulk: bool) -> Self {
        RunContext {
            dev_type: ctx.dev_type as i32,
            dev_id: ctx.dev_id,
            stream: std::ptr::null_mut(),
            aux_stream: std::ptr::null_mut(),
            is_bulk,
        }
    }
}

/// A synchronous function: done when it returns.
pub type SyncFn = Box<dyn FnOnce(&RunContext) -> Result<()> + Send>;
/// An asynchronous function: done when it completes the [`Completion`].
pub type AsyncFn = Box<dyn FnOnce(&RunContext, Completion) + Send>;

pub enum OprFn {
    Sync(SyncFn),
    Async(AsyncFn),
    /// A synchronous C function: no allocation for a closure.
    Raw(RawFn),
}

/// A synchronous C function and its argument, called as `f(run_context, param)`; the
/// deleter (if any) gets `param` exactly once, when this is dropped: after the call, or
/// without it if the operation is skipped.
pub struct RawFn {
    f: CFn,
    param: *mut c_void,
    deleter: Option<CDeleter>,
}

/// A C operation's function: `f(run_context, param)`.
pub type CFn = unsafe extern "C" fn(*mut c_void, *mut c_void);
/// A C operation's param deleter.
pub type CDeleter = unsafe extern "C" fn(*mut c_void);

// SAFETY: the C API's contract hands `param` to the engine, which may call the function and
// the deleter on a worker thread; the caller promises that is allowed (as with stock MXNet).
unsafe impl Send for RawFn {}

impl RawFn {
    /// # Safety
    /// `f(rctx, param)` and then `deleter(param)` must be callable once, from any thread.
    pub unsafe fn new(
        f: unsafe extern "C" fn(*mut c_void, *mut c_void),
        param: *mut c_void,
        deleter: Option<unsafe extern "C" fn(*mut c_void)>,
    ) -> Self {
        RawFn { f, param, deleter }
    }

    /// Call the function (then the deleter, as this is dropped).
    pub fn call(self, rctx: &RunContext) {
        // Inside the library's call gate, as every engine operation is: a fork waits for the
        // operation, so the gate must not be released here (see `runtime::outside_call`).
        // SAFETY: promised by `RawFn::new`'s caller; the function gets a RunContext that
        // lives for the call.
        unsafe { (self.f)(rctx as *const RunContext as *mut c_void, self.param) }
    }

    /// As a boxed closure (for a bulk, which runs several functions in one operation).
    pub fn boxed(self) -> SyncFn {
        Box::new(move |rctx: &RunContext| {
            self.call(rctx);
            Ok(())
        })
    }
}

impl Drop for RawFn {
    fn drop(&mut self) {
        if let Some(d) = self.deleter {
            // SAFETY: the caller's deleter for its own param, called exactly once (promised
            // callable by `RawFn::new`'s caller).
            unsafe { d(self.param) }
        }
    }
}

/// Something to drop when the operation has finished (e.g. a C deleter guard).
pub type Payload = Box<dyn Send>;

/// A one-shot flag threads can wait on. Setting it makes a system call only when a thread
/// already sleeps on it (both flags change under the lock).
#[derive(Default)]
pub struct Latch {
    /// (set, a thread sleeps on it)
    state: Mutex<(bool, bool)>,
    cv: Condvar,
}

impl Latch {
    pub fn set(&self) {
        let sleeping = {
            let mut s = self.state.lock();
            s.0 = true;
            s.1
        };
        if sleeping {
            self.cv.notify_all();
        }
    }
    pub fn wait(&self) {
        let mut s = self.state.lock();
        while !s.0 {
            s.1 = true;
            s = self.cv.wait(s);
        }
    }
}

/// A pushed operation.
pub struct Opr {
    pub(crate) func: SpinLock<Option<OprFn>>,
    /// Variables read (`..n_const`) then written (`n_const..`); inline up to four, so that an
    /// operation is one allocation.
    pub(crate) vars: SmallVec<[Arc<Var>; 4]>,
    pub(crate) n_const: usize,
    /// Variables still to grant access + 1 (so it cannot fire while being registered).
    pub(crate) wait: AtomicUsize,
    pub(crate) priority: i32,
    pub(crate) prop: FnProperty,
    pub(crate) ctx: Context,
    pub(crate) name: Option<Arc<str>>,
    pub(crate) symbolic: bool,
    pub(crate) scope: Option<Arc<str>>,
    pub(crate) payload: SpinLock<Option<Payload>>,
    pub(crate) completed: AtomicBool,
    pub(crate) done: Option<Arc<Latch>>,
    pub(crate) engine: &'static Engine,
    /// The pool that runs it; `None` runs it inline (NaiveEngine).
    pub(crate) pool: Option<&'static Pool>,
}

impl Opr {
    pub fn const_vars(&self) -> &[Arc<Var>] {
        &self.vars[..self.n_const]
    }
    pub fn mutable_vars(&self) -> &[Arc<Var>] {
        &self.vars[self.n_const..]
    }
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or("<unnamed>")
    }
    pub(crate) fn take_fn(&self) -> Option<OprFn> {
        self.func.lock().take()
    }
    /// Decrement the wait count; true when this made the operation ready.
    pub(crate) fn grant(&self) -> bool {
        self.wait.fetch_sub(1, Ordering::AcqRel) == 1
    }
}

/// The token an asynchronous operation completes with. Completing it (or dropping it, which
/// counts as a failure) finishes the operation exactly once.
pub struct Completion {
    opr: Option<Arc<Opr>>,
    /// When and on which thread the operation started, if the profiler records it.
    started: Option<(f64, u32)>,
}

impl Completion {
    pub(crate) fn new(opr: Arc<Opr>, started: Option<(f64, u32)>) -> Self {
        Completion { opr: Some(opr), started }
    }
    fn profile_end(&self, opr: &Opr) {
        if let Some((t0, tid)) = self.started {
            crate::profiler::op_end(t0, opr.name.as_ref(), opr.ctx, Some(tid), opr.scope.as_ref());
        }
    }
    /// Finish the operation, successfully or with an error.
    pub fn complete(mut self, result: Result<()>) {
        if let Some(opr) = self.opr.take() {
            self.profile_end(&opr);
            let engine = opr.engine;
            engine.finish(opr, result.err());
        }
    }
    pub fn opr_name(&self) -> &str {
        self.opr.as_deref().map(Opr::name).unwrap_or("")
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if let Some(opr) = self.opr.take() {
            self.profile_end(&opr);
            let msg = format!(
                "asynchronous operation {} ended without completing (it panicked or dropped its \
                 completion)",
                opr.name()
            );
            opr.engine.finish(opr, Some(Error::internal(msg)));
        }
    }
}
