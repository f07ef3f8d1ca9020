//! The dependency engine: every operation is pushed here and runs asynchronously as soon as
//! the variables it reads and writes allow.
//!
//! Owns: the three engine kinds (`MXNET_ENGINE_TYPE`), the worker pools and the table that
//! picks one for an operation's device and property, pushing and dispatching, error
//! propagation along data edges, waits, bulk execution, back-pressure, and the engine's
//! life around `fork`. Variables live in [`var`], operations in [`opr`], pools in [`pool`].
//!
//! - `NaiveEngine` runs each operation on the thread that makes it ready (the pushing thread
//!   unless another thread holds a conflicting variable) and returns from push when it is
//!   done; no worker thread is started.
//! - `ThreadedEngine` runs everything on one pool of `MXNET_CPU_WORKER_NTHREADS` workers.
//! - `ThreadedEnginePerDevice` (default) has a pool per device and property, created at the
//!   first use of each: CPU workers, CPU prioritized workers, and per GPU compute, copy and
//!   prioritized workers (see [`POOL_TABLE`]).
//!
//! Pushing: every caller pushes through [`Engine::submit`], and [`Engine::route`] alone
//! decides which of four paths an operation takes (its doc is the rule): into this thread's
//! bulk; run here at once, solo or holding all its variables; or queued. A queued operation in
//! a threaded engine goes to a submission queue (crossbeam's `SegQueue`); workers take it from
//! there and register operations with their variables in batches (one registrar at a time,
//! so registration follows push order and two operations sharing two variables cannot each
//! be first in one queue). The pushing thread thus touches no state the workers write per
//! operation. An operation finished on a worker is left in a graveyard for the next push (or
//! wait) to drop, so that the memory and reference counts the pushing thread made stay on its
//! cache lines. NaiveEngine registers on the pushing thread.
//!
//! Solo mode ([`solo`]): while one thread is the only one that has pushed, the operations it
//! runs on the spot (NaiveEngine's, and a threaded engine's cheap ones with nothing pending)
//! skip the variables altogether; the first push from a second thread waits for a running
//! solo operation and ends solo mode for good.
//!
//! Errors: an operation that fails marks the variables it writes; operations that read or
//! write a marked variable are skipped and pass the same failure on. A wait on a marked
//! variable, or `wait_all`, reports the failure once and clears it everywhere it travelled.

pub mod opr;
pub mod pool;
mod solo;
pub mod var;

pub use opr::{AsyncFn, Completion, FnProperty, OprFn, Payload, RawFn, RunContext, SyncFn};
pub use var::Var;

use crate::config;
use crate::context::{Context, DevType};
use crate::error::{Error, Result};
use crate::intern::intern;
use crate::profiler;
use crate::sync::{Condvar, Mutex, Padded, SpinLock};
use crossbeam_queue::SegQueue;
use opr::{Latch, Opr};
use pool::Pool;
use smallvec::SmallVec;
use solo::SoloGuard;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use var::{ErrorCell, Granted};

/// Which engine runs operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    Naive,
    Threaded,
    PerDevice,
}

impl EngineKind {
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "NaiveEngine" => Ok(EngineKind::Naive),
            "ThreadedEngine" => Ok(EngineKind::Threaded),
            "ThreadedEnginePerDevice" => Ok(EngineKind::PerDevice),
            other => Err(Error::value(format!("unknown engine type {other:?}"))),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Naive => "NaiveEngine",
            EngineKind::Threaded => "ThreadedEngine",
            EngineKind::PerDevice => "ThreadedEnginePerDevice",
        }
    }
}

/// The pool classes of `ThreadedEnginePerDevice`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolClass {
    CpuWorker,
    CpuPriority,
    GpuCompute,
    GpuCopy,
    GpuPriority,
}

use PoolClass::*;

/// Which pool runs an operation, by device (row 0: CPU-side memory, row 1: GPU) and
/// `FnProperty` (column, in stock's numbering: normal, copy from GPU, copy to GPU, CPU
/// prioritized, async, delete var, GPU prioritized, no skip).
pub const POOL_TABLE: [[PoolClass; 8]; 2] = [
    [CpuWorker, CpuWorker, CpuWorker, CpuPriority, CpuWorker, CpuWorker, CpuWorker, CpuWorker],
    [GpuCompute, GpuCopy, GpuCopy, GpuCompute, GpuCompute, GpuCompute, GpuPriority, GpuCompute],
];

/// Settings an engine is built with (from the configuration, or given by tests).
#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub kind: EngineKind,
    pub cpu_workers: usize,
    pub cpu_priority_workers: usize,
    pub gpu_workers: usize,
    pub gpu_copy_workers: usize,
    /// Bound on pushed but unfinished operations; 0 is unbounded.
    pub max_pending: usize,
    /// Accept GPU contexts without a GPU (tests of the pool table only).
    pub virtual_gpus: bool,
    /// Read pool sizes from the configuration when each pool starts (the process engine);
    /// otherwise use the sizes above (tests).
    pub threads_from_config: bool,
}

impl EngineOptions {
    pub fn new(kind: EngineKind) -> Self {
        EngineOptions {
            kind,
            cpu_workers: 1,
            cpu_priority_workers: 4,
            gpu_workers: 2,
            gpu_copy_workers: 2,
            max_pending: 0,
            virtual_gpus: false,
            threads_from_config: false,
        }
    }
}

/// An operation's variables: inline up to four (no allocation for a typical push).
pub type VarList = SmallVec<[Arc<Var>; 4]>;

/// A Rust operation the engine either runs where it is, on the pushing thread, without moving
/// it (an operator call carries its parameters and views: moving them costs more than the
/// rest of a tiny call), or takes over into a box when it queues it.
pub trait Job: Send {
    /// Run it (at most once, here or from the function [`Job::boxed`] made).
    fn run(&mut self, rctx: &RunContext) -> Result<()>;
    /// Move it into a function a worker can run later; the job is spent afterwards.
    fn boxed(&mut self) -> SyncFn;
}

/// What an operation runs.
pub enum Func<'a> {
    /// A Rust operation that stays with the caller unless it is queued.
    Job(&'a mut dyn Job),
    /// A boxed Rust closure, a C function or an asynchronous function.
    Fn(OprFn),
}

impl Func<'_> {
    fn is_sync(&self) -> bool {
        !matches!(self, Func::Fn(OprFn::Async(_)))
    }

    /// Run a synchronous function here ([`Engine::route`] sends nothing else here).
    fn call(self, rctx: &RunContext) -> Result<()> {
        match self {
            Func::Job(job) => job.run(rctx),
            Func::Fn(OprFn::Sync(f)) => f(rctx),
            Func::Fn(OprFn::Raw(raw)) => {
                raw.call(rctx);
                Ok(())
            }
            Func::Fn(OprFn::Async(_)) => {
                Err(Error::internal("an asynchronous operation cannot run on the pushing thread"))
            }
        }
    }

    /// What a queued operation keeps.
    fn into_opr_fn(self) -> OprFn {
        match self {
            Func::Job(job) => OprFn::Sync(job.boxed()),
            Func::Fn(f) => f,
        }
    }
}

/// The variables an operation reads and writes (a variable appears once in the two).
pub enum Vars<'a> {
    /// Listed by the caller: [`Engine::submit`] refuses a variable listed twice.
    Listed(VarList, VarList),
    /// Made only when needed: an operation that runs solo needs none, unless it fails (its
    /// written variables are then marked). The maker promises distinct lists.
    Lazy(&'a dyn Fn() -> Result<(VarList, VarList)>),
}

impl Vars<'_> {
    fn lists(self) -> Result<(VarList, VarList)> {
        match self {
            Vars::Listed(reads, writes) => Ok((reads, writes)),
            Vars::Lazy(make) => make(),
        }
    }
}

/// What to push.
pub struct Push<'a> {
    pub func: Func<'a>,
    pub vars: Vars<'a>,
    pub ctx: Context,
    pub prop: FnProperty,
    pub priority: i32,
    /// The name the profiler shows (interned: a queued operation keeps a reference).
    pub name: Option<&'a Arc<str>>,
    /// Dropped once the operation has finished (ran, failed or was skipped).
    pub payload: Option<Payload>,
    /// Return only when the operation has finished.
    pub wait: bool,
    /// Part of a symbolic graph (profiled per the profiler's `profile_symbolic`), not an
    /// imperative call (`profile_imperative`).
    pub symbolic: bool,
    /// The profiler scope of the pushing thread, shown with the operation's event.
    pub scope: Option<Arc<str>>,
    /// Cheaper than handing it to a worker (a kernel on a few elements): a threaded engine
    /// with nothing pending runs it on the pushing thread.
    pub cheap: bool,
}

impl<'a> Push<'a> {
    /// An operation on the CPU with default settings.
    pub fn with(func: Func<'a>, vars: Vars<'a>) -> Self {
        Push {
            func,
            vars,
            ctx: Context::CPU,
            prop: FnProperty::Normal,
            priority: 0,
            name: None,
            payload: None,
            wait: false,
            symbolic: false,
            scope: None,
            cheap: false,
        }
    }
    /// A synchronous operation on the CPU with default settings.
    pub fn sync(
        f: impl FnOnce(&RunContext) -> Result<()> + Send + 'static,
        const_vars: impl Into<VarList>,
        mutable_vars: impl Into<VarList>,
    ) -> Self {
        Push::with(Func::Fn(OprFn::Sync(Box::new(f))), Vars::Listed(const_vars.into(), mutable_vars.into()))
    }
    /// A synchronous C function on `ctx` with default settings.
    pub fn raw(raw: RawFn, const_vars: impl Into<VarList>, mutable_vars: impl Into<VarList>, ctx: Context) -> Self {
        Push { ctx, ..Push::with(Func::Fn(OprFn::Raw(raw)), Vars::Listed(const_vars.into(), mutable_vars.into())) }
    }
    /// An asynchronous operation on the CPU with default settings.
    pub fn asynchronous(
        f: impl FnOnce(&RunContext, Completion) + Send + 'static,
        const_vars: impl Into<VarList>,
        mutable_vars: impl Into<VarList>,
    ) -> Self {
        Push::with(Func::Fn(OprFn::Async(Box::new(f))), Vars::Listed(const_vars.into(), mutable_vars.into()))
    }
}

/// The path an operation takes; chosen by [`Engine::route`] alone.
enum Route {
    /// Appended to this thread's bulk, pushed later as one operation.
    Bulk,
    /// Run on this thread now, without touching its variables: this thread is the only one
    /// that has pushed ([`solo`]).
    Solo(SoloGuard<'static>),
    /// Run on this thread now if it can take all its variables at once, else queued.
    Here,
    /// Registered with its variables and run by a pool's worker when they allow (threaded
    /// engines), or by this thread (NaiveEngine: no pool).
    Queue(Option<&'static Pool>),
}

/// How the profiler names an operation that runs on the pushing thread.
#[derive(Clone, Copy, Default)]
struct OpTag<'a> {
    name: Option<&'a Arc<str>>,
    symbolic: bool,
    scope: Option<&'a Arc<str>>,
}

/// Run an operation's function on this thread, profiled, catching a panic.
#[inline]
fn run_here(tag: OpTag<'_>, ctx: Context, f: impl FnOnce(&RunContext) -> Result<()>) -> Outcome {
    let _op = crate::runtime::in_operation();
    let rctx = RunContext::for_ctx(ctx, false);
    let ran =
        profiler::profiled(tag.symbolic, tag.name, ctx, tag.scope, || catch_unwind(AssertUnwindSafe(|| f(&rctx))));
    match ran {
        Ok(Ok(())) => Outcome::Ok,
        Ok(Err(e)) => Outcome::Failed(e),
        Err(panic) => Outcome::Failed(panic_error(tag.name.map_or("<unnamed>", |n| n), panic.as_ref())),
    }
}

/// A dependency engine.
pub struct Engine {
    opts: EngineOptions,
    cpu_worker: OnceLock<&'static Pool>,
    cpu_priority: OnceLock<&'static Pool>,
    gpu_pools: Mutex<HashMap<(PoolClass, i32), &'static Pool>>,
    create_lock: Mutex<()>,
    /// Taken by the worker that registers submissions: one registrar at a time, so that
    /// registration follows push order. On lines of its own, away from the fields a pushing
    /// thread reads per push.
    register_lock: Padded<Mutex<()>>,
    /// Pushed operations not yet registered with their variables (threaded engines).
    submissions: SegQueue<Arc<Opr>>,
    /// Operations pushed so far (written by pushing threads) and finished so far (written
    /// by the threads that finish them): pending is the difference. Two counters on their
    /// own lines, so that a pusher and a worker do not pass one line back and forth per
    /// operation.
    pushed: Padded<AtomicUsize>,
    finished: Padded<AtomicUsize>,
    /// Operations finished on worker threads, for a pushing or waiting thread to drop (see
    /// [`Engine::bury`]).
    graveyard: SegQueue<Arc<Opr>>,
    idle: Mutex<()>,
    idle_cv: Condvar,
    waiters: AtomicUsize,
    errors: Mutex<Vec<Arc<ErrorCell>>>,
    live_errors: AtomicUsize,
    solo: Padded<solo::Solo>,
    /// Threads running an inline queue ([`Engine::run_inline`]): while none does, the
    /// run-here check skips the thread-local.
    inline_threads: AtomicUsize,
    /// Threads whose bulk size for this engine is above 1; while none is, pushes skip the
    /// thread-local bulk.
    bulk_threads: AtomicUsize,
}

thread_local! {
    static IS_WORKER: Cell<bool> = const { Cell::new(false) };
    /// Pushes from this thread skip back-pressure ([`exempt_from_back_pressure`]).
    static NO_BACK_PRESSURE: Cell<bool> = const { Cell::new(false) };
    /// Operations made ready while this thread already runs one inline (NaiveEngine).
    static INLINE: RefCell<Option<VecDeque<Arc<Opr>>>> = const { RefCell::new(None) };
    static BULK: RefCell<Bulk> = RefCell::new(Bulk::default());
}

pub(crate) fn mark_worker_thread() {
    IS_WORKER.with(|w| w.set(true));
    crate::runtime::mark_library_thread();
}

/// Exempt the calling thread from back-pressure (`MXNET_ENGINE_MAX_PENDING_OPS`): for threads
/// that push on behalf of a pending operation (custom operators' callbacks), which would
/// otherwise wait for that operation, and so for themselves.
pub fn exempt_from_back_pressure() {
    NO_BACK_PRESSURE.with(|c| c.set(true));
}

/// Whether the calling thread is one of the engine's workers.
pub fn on_worker_thread() -> bool {
    IS_WORKER.try_with(|w| w.get()).unwrap_or(false)
}

impl Engine {
    /// Build an engine; it lives for the rest of the process (operations refer to it).
    pub fn start(opts: EngineOptions) -> &'static Engine {
        Box::leak(Box::new(Engine {
            opts,
            cpu_worker: OnceLock::new(),
            cpu_priority: OnceLock::new(),
            gpu_pools: Mutex::new(HashMap::new()),
            create_lock: Mutex::new(()),
            register_lock: Padded(Mutex::new(())),
            submissions: SegQueue::new(),
            pushed: Padded(AtomicUsize::new(0)),
            finished: Padded(AtomicUsize::new(0)),
            graveyard: SegQueue::new(),
            idle: Mutex::new(()),
            idle_cv: Condvar::new(),
            waiters: AtomicUsize::new(0),
            errors: Mutex::new(Vec::new()),
            live_errors: AtomicUsize::new(0),
            solo: Padded(solo::Solo::default()),
            inline_threads: AtomicUsize::new(0),
            bulk_threads: AtomicUsize::new(0),
        }))
    }

    /// Options from the configuration registry (read-once variables are fixed here).
    pub fn options_from_config() -> Result<EngineOptions> {
        let reg = config::global();
        let kind = reg
            .get_str("MXNET_ENGINE_TYPE", "engine start")?
            .map(|s| EngineKind::parse(&s))
            .transpose()?
            .unwrap_or(EngineKind::PerDevice);
        let mut opts = EngineOptions::new(kind);
        opts.threads_from_config = true;
        let max = reg.get_int("MXNET_ENGINE_MAX_PENDING_OPS", "engine start")?.unwrap_or(0);
        opts.max_pending = max as usize;
        Ok(opts)
    }

    pub fn kind(&self) -> EngineKind {
        self.opts.kind
    }

    /// Number of pushed operations that have not finished.
    pub fn pending(&self) -> usize {
        // Finished first: an operation is counted pushed before it is counted finished, so
        // the difference never goes below the true count (it may be above it, momentarily).
        let finished = self.finished.load(Ordering::SeqCst);
        self.pushed.load(Ordering::SeqCst).wrapping_sub(finished)
    }

    /// Worker threads started so far, per pool name.
    pub fn pools(&self) -> Vec<(String, usize)> {
        let mut out: Vec<(String, usize)> = [&self.cpu_worker, &self.cpu_priority]
            .iter()
            .filter_map(|c| c.get())
            .map(|p| (p.name().to_string(), p.threads()))
            .collect();
        out.extend(self.gpu_pools.lock().values().map(|p| (p.name().to_string(), p.threads())));
        out
    }

    fn pool_threads(&self, class: PoolClass) -> Result<usize> {
        let from_config = |name: &str, consumer: &'static str, default: usize| -> Result<usize> {
            if !self.opts.threads_from_config {
                return Ok(default);
            }
            Ok(config::global().get_int(name, consumer)?.map(|v| v as usize).unwrap_or(default))
        };
        match (self.opts.kind, class) {
            (_, CpuWorker) if crate::runtime::runtime().is_forked_child() => from_config(
                "MXNET_MP_WORKER_NTHREADS",
                "CPU worker pool start in a forked process",
                self.opts.cpu_workers,
            ),
            (_, CpuWorker) => from_config("MXNET_CPU_WORKER_NTHREADS", "CPU worker pool start", self.opts.cpu_workers),
            (_, CpuPriority) => {
                from_config("MXNET_CPU_PRIORITY_NTHREADS", "CPU priority pool start", self.opts.cpu_priority_workers)
            }
            (_, GpuCompute) => from_config("MXNET_GPU_WORKER_NTHREADS", "GPU worker pool start", self.opts.gpu_workers),
            (_, GpuCopy) => from_config("MXNET_GPU_COPY_NTHREADS", "GPU copy pool start", self.opts.gpu_copy_workers),
            (_, GpuPriority) => Ok(1),
        }
    }

    /// The pool that runs operations of `prop` on `ctx`, started on first use.
    fn pool_for(&'static self, ctx: Context, prop: FnProperty) -> Result<Option<&'static Pool>> {
        let class = match self.opts.kind {
            EngineKind::Naive => return Ok(None),
            // One global pool: the CPU worker pool serves every device and property.
            EngineKind::Threaded => CpuWorker,
            EngineKind::PerDevice => POOL_TABLE[usize::from(ctx.dev_type == DevType::Gpu)][prop as usize],
        };
        let cell = match class {
            CpuWorker => &self.cpu_worker,
            CpuPriority => &self.cpu_priority,
            _ => {
                let key = (class, ctx.dev_id);
                if let Some(p) = self.gpu_pools.lock().get(&key) {
                    return Ok(Some(*p));
                }
                let threads = self.pool_threads(class)?;
                let name = match class {
                    GpuCopy => format!("gpu({}) copy worker", ctx.dev_id),
                    GpuPriority => format!("gpu({}) priority worker", ctx.dev_id),
                    _ => format!("gpu({}) worker", ctx.dev_id),
                };
                let mut pools = self.gpu_pools.lock();
                if let Some(p) = pools.get(&key) {
                    return Ok(Some(*p));
                }
                let p = Pool::start(&name, threads, self).map_err(thread_error)?;
                pools.insert(key, p);
                return Ok(Some(p));
            }
        };
        if let Some(p) = cell.get() {
            return Ok(Some(*p));
        }
        let _guard = self.create_lock.lock();
        if let Some(p) = cell.get() {
            return Ok(Some(*p));
        }
        let threads = self.pool_threads(class)?;
        let name = match (self.opts.kind, class) {
            (EngineKind::Threaded, _) => "engine worker",
            (_, CpuPriority) => "cpu priority worker",
            _ => "cpu worker",
        };
        let p = Pool::start(name, threads, self).map_err(thread_error)?;
        let _ = cell.set(p);
        Ok(Some(p))
    }

    /// Push an operation: the one way in, for every caller. It runs, now or later, on the
    /// path [`Engine::route`] picks. Fails, running nothing, on a variable listed twice, a
    /// device that does not exist or a pool that cannot start.
    pub fn submit(&'static self, p: Push<'_>) -> Result<()> {
        self.submit_as(p, true)
    }

    /// [`Engine::submit`]; `may_bulk` false for a bulk being pushed, and for waits.
    fn submit_as(&'static self, p: Push<'_>, may_bulk: bool) -> Result<()> {
        if let Vars::Listed(reads, writes) = &p.vars {
            check_distinct(reads, writes)?;
        }
        match self.route(&p, may_bulk)? {
            Route::Bulk => self.bulk_append(p),
            Route::Solo(guard) => {
                self.run_solo(guard, p);
                Ok(())
            }
            Route::Here => self.run_here_or_queue(p),
            Route::Queue(pool) => self.enqueue(p, pool),
        }
    }

    /// Which way an operation goes. The whole rule, in order:
    /// 1. **Bulk**: while this thread batches operations (a bulk size above 1, a threaded
    ///    engine, the profiler's aggregate statistics off), a synchronous operation of normal
    ///    property on the bulk's device, not waited for, joins the bulk. Anything else pushes
    ///    the bulk first.
    /// 2. **Here**, on the pushing thread, now: a synchronous function, on NaiveEngine; or on
    ///    a threaded engine, a cheap one ([`Push::cheap`]) on a host device, pushed from
    ///    outside the workers while nothing is pending and no thread bulks (every earlier
    ///    operation has finished, so running it now keeps push order). Not while a failure is
    ///    recorded (its variables' marks must be checked on the way) or this thread runs a
    ///    NaiveEngine inline queue (which must keep its order). **Solo** while this thread is
    ///    the only one that has pushed: no variable is touched ([`solo`]); otherwise it takes
    ///    all its variables at once, or, finding one held, is queued behind it.
    /// 3. **Queue**: registered with its variables and run when they allow; by a worker of
    ///    the pool for its device and property ([`POOL_TABLE`]) in a threaded engine, which
    ///    registers it from the submission queue; by this thread in NaiveEngine.
    fn route(&'static self, p: &Push<'_>, may_bulk: bool) -> Result<Route> {
        self.check_context(p.ctx)?;
        let sync = p.func.is_sync();
        if may_bulk && self.bulk_threads.load(Ordering::Relaxed) > 0 {
            if sync
                && self.opts.kind != EngineKind::Naive
                && p.prop == FnProperty::Normal
                && !p.wait
                && !crate::profiler::aggregate_running()
                && bulk_accepts(self, p.ctx)
            {
                return Ok(Route::Bulk);
            }
            self.flush_bulk();
        }
        if sync && self.runs_here(p.ctx, p.cheap) {
            return Ok(match self.solo.enter() {
                Some(guard) => Route::Solo(guard),
                None => Route::Here,
            });
        }
        Ok(Route::Queue(self.pool_for(p.ctx, p.prop)?))
    }

    /// Rule 2 of [`Engine::route`], but for solo mode.
    #[inline]
    fn runs_here(&self, ctx: Context, cheap: bool) -> bool {
        let allowed = match self.opts.kind {
            EngineKind::Naive => true,
            _ => {
                cheap
                    && ctx.dev_type.is_host()
                    && self.bulk_threads.load(Ordering::Relaxed) == 0
                    && self.pending() == 0
                    && !on_worker_thread()
            }
        };
        allowed && self.live_errors.load(Ordering::Acquire) == 0 && !self.in_inline_queue()
    }

    /// Everything that can make [`Engine::submit`] fail, checked before the operation exists:
    /// a caller that hands over resources (a C deleter) checks first, so that on failure the
    /// resources stay its own.
    pub fn validate(
        &'static self,
        const_vars: &[Arc<Var>],
        mutable_vars: &[Arc<Var>],
        ctx: Context,
        prop: FnProperty,
    ) -> Result<()> {
        check_distinct(const_vars, mutable_vars)?;
        self.check_context(ctx)?;
        self.pool_for(ctx, prop).map(drop)
    }

    /// Fails for a context whose device this engine cannot run operations on.
    #[inline]
    pub fn check_context(&self, ctx: Context) -> Result<()> {
        if !self.opts.virtual_gpus {
            ctx.check_available()?;
        }
        Ok(())
    }

    /// Route `Solo`: run without touching the variables; a failure marks the written ones.
    fn run_solo(&'static self, guard: SoloGuard<'static>, p: Push<'_>) {
        let Push { func, vars, ctx, name, payload, symbolic, scope, .. } = p;
        let tag = OpTag { name, symbolic, scope: scope.as_ref() };
        if let Outcome::Failed(e) = run_here(tag, ctx, |rctx| func.call(rctx)) {
            let cell = self.record_failure(e);
            if let Ok((_, writes)) = vars.lists() {
                writes.iter().for_each(|v| v.mark_failed(&cell));
            }
        }
        drop(guard);
        drop(payload);
    }

    /// Route `Here`: run on this thread holding all the variables, taken at once; or, when one
    /// is held or waited for, or a failure is recorded, queue it. Taking all or nothing needs
    /// no registration lock: an operation that never waits in a variable's queue cannot close
    /// a cycle with one that registers.
    fn run_here_or_queue(&'static self, p: Push<'_>) -> Result<()> {
        self.apply_back_pressure();
        let Push { func, vars, ctx, prop, priority, name, payload, wait, symbolic, scope, cheap } = p;
        let (reads, writes) = vars.lists()?;
        // Counted pending before it takes its variables and while it holds them: a fork from
        // another thread waits for it (the child would otherwise inherit variables held for
        // good). Not taken: counted finished again, and queued.
        self.pushed.fetch_add(1, Ordering::SeqCst);
        if self.take_all(&reads, &writes) && !self.failure_recorded(&reads, &writes) {
            let tag = OpTag { name, symbolic, scope: scope.as_ref() };
            let outcome = run_here(tag, ctx, |rctx| func.call(rctx));
            let granted = self.release_vars(&reads, &writes, outcome);
            drop(payload);
            if !granted.is_empty() {
                self.dispatch_granted(granted);
            }
            self.finish_one();
            return Ok(());
        }
        self.finish_one();
        let vars = Vars::Listed(reads, writes);
        let p = Push { func, vars, ctx, prop, priority, name, payload, wait, symbolic, scope, cheap };
        self.enqueue(p, self.pool_for(ctx, prop)?)
    }

    /// Route `Queue`: make the operation; a threaded engine hands it to the workers, which
    /// register it with its variables in batches (the pushing thread touches no shared
    /// variable state); NaiveEngine registers it here and runs what becomes ready. Returns
    /// when it has finished if it is waited for.
    fn enqueue(&'static self, p: Push<'_>, pool: Option<&'static Pool>) -> Result<()> {
        let (reads, writes) = p.vars.lists()?;
        self.solo.note_pusher();
        self.apply_back_pressure();
        if pool.is_some() {
            self.reap_sometimes();
        }
        let n_const = reads.len();
        let mut vars = reads;
        vars.extend(writes);
        let done = (p.wait && pool.is_some()).then(|| Arc::new(Latch::default()));
        let op = Arc::new(Opr {
            func: SpinLock::new(Some(p.func.into_opr_fn())),
            wait: AtomicUsize::new(vars.len() + 1),
            vars,
            n_const,
            priority: p.priority,
            prop: p.prop,
            ctx: p.ctx,
            name: p.name.cloned(),
            symbolic: p.symbolic,
            scope: p.scope,
            payload: SpinLock::new(p.payload),
            completed: Default::default(),
            done: done.clone(),
            engine: self,
            pool,
        });
        self.pushed.fetch_add(1, Ordering::SeqCst);
        if let Some(pool) = pool {
            self.submissions.push(op);
            pool.wake_for_submission();
        } else {
            let keep = op.clone();
            self.register(op);
            self.wait_inline(&keep);
        }
        if let Some(l) = done {
            l.wait();
        }
        Ok(())
    }

    /// NaiveEngine: register on the pushing thread. Registration is serialised (two
    /// operations that share two variables must not each be first in one of their queues);
    /// an operation with one variable cannot close such a cycle and skips the lock.
    fn register(&'static self, op: Arc<Opr>) {
        let _order = (op.vars.len() > 1).then(|| self.register_lock.lock());
        self.register_locked(op);
    }

    fn register_locked(&'static self, op: Arc<Opr>) {
        for (i, v) in op.vars.iter().enumerate() {
            let granted = if i < op.n_const { v.append_read(&op) } else { v.append_write(&op) };
            if granted {
                op.grant();
            }
        }
        if op.grant() {
            self.dispatch(op);
        }
    }

    /// Workers: register pushed operations, a batch at a time, if no other worker does.
    /// Returns whether there was anything to register.
    pub(crate) fn drain_submissions(&'static self) -> bool {
        if self.submissions.is_empty() {
            return false;
        }
        let Some(_order) = self.register_lock.try_lock() else {
            return false;
        };
        let mut any = false;
        for _ in 0..256 {
            let Some(op) = self.submissions.pop() else { break };
            any = true;
            self.register_locked(op);
        }
        any
    }

    /// Pushed operations wait to be registered by a worker.
    pub(crate) fn has_submissions(&self) -> bool {
        !self.submissions.is_empty()
    }

    /// After [`Engine::take_all`]: whether a failure is recorded anywhere, in which case the
    /// variables are given back (the operation must go the way that checks their marks).
    fn failure_recorded(&'static self, reads: &[Arc<Var>], writes: &[Arc<Var>]) -> bool {
        if self.live_errors.load(Ordering::Acquire) == 0 {
            return false;
        }
        self.give_back(reads, writes);
        true
    }

    /// Take every variable of an operation at once, or none: one that finds a variable held
    /// or waited for gives back what it took.
    fn take_all(&'static self, reads: &[Arc<Var>], writes: &[Arc<Var>]) -> bool {
        for (i, v) in reads.iter().enumerate() {
            if !v.try_acquire(false) {
                self.give_back(&reads[..i], &[]);
                return false;
            }
        }
        for (i, v) in writes.iter().enumerate() {
            if !v.try_acquire(true) {
                self.give_back(reads, &writes[..i]);
                return false;
            }
        }
        true
    }

    /// Release variables taken by [`Engine::take_all`] for an operation that will not run
    /// here after all.
    fn give_back(&'static self, reads: &[Arc<Var>], writes: &[Arc<Var>]) {
        let granted = self.release_vars(reads, writes, Outcome::Ok);
        self.dispatch_granted(granted);
    }

    /// Whether this thread runs an inline queue (NaiveEngine, [`Engine::run_inline`]). Only
    /// this thread changes its own part of the count, so a relaxed load sees it.
    #[inline]
    fn in_inline_queue(&self) -> bool {
        self.inline_threads.load(Ordering::Relaxed) > 0 && INLINE.with(|q| q.borrow().is_some())
    }

    /// NaiveEngine: wait for an operation that could not run at once. Operations queued on
    /// this thread meanwhile (pushed from inside a running one) run here, so a nested push
    /// does not wait for itself.
    fn wait_inline(&'static self, op: &Opr) {
        let mut spins = 0u32;
        while !op.completed.load(Ordering::Acquire) {
            let next = INLINE.with(|q| q.borrow_mut().as_mut().and_then(|q| q.pop_front()));
            if let Some(next) = next {
                let _op = crate::runtime::in_operation();
                self.execute(next);
                continue;
            }
            spins += 1;
            if spins < 100 {
                std::hint::spin_loop();
            } else if spins < 1000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
    }

    fn dispatch_granted(&'static self, granted: Granted) {
        for next in granted.into_vec() {
            if next.grant() {
                self.dispatch(next);
            }
        }
    }

    fn dispatch(&'static self, op: Arc<Opr>) {
        match &op.pool {
            Some(pool) => pool.push(op),
            None => self.run_inline(op),
        }
    }

    /// NaiveEngine: run on this thread; operations made ready meanwhile are queued and run
    /// by the outermost call, so a long chain does not recurse.
    fn run_inline(&'static self, op: Arc<Opr>) {
        let queued = INLINE.with(|q| match q.borrow_mut().as_mut() {
            Some(queue) => {
                queue.push_back(op.clone());
                true
            }
            None => false,
        });
        if queued {
            return;
        }
        INLINE.with(|q| *q.borrow_mut() = Some(VecDeque::new()));
        self.inline_threads.fetch_add(1, Ordering::Relaxed);
        let _op = crate::runtime::in_operation();
        let mut next = Some(op);
        while let Some(op) = next {
            self.execute(op);
            next = INLINE.with(|q| q.borrow_mut().as_mut().and_then(|q| q.pop_front()));
        }
        INLINE.with(|q| *q.borrow_mut() = None);
        self.inline_threads.fetch_sub(1, Ordering::Relaxed);
    }

    /// Run a ready operation (on a worker, or inline for NaiveEngine). Threads that are not
    /// the engine's workers enter `runtime::in_operation` first (workers never take the call
    /// gate, so they need not).
    pub(crate) fn execute(&'static self, op: Arc<Opr>) {
        let inherited = if self.live_errors.load(Ordering::Acquire) > 0 && op.prop != FnProperty::NoSkip {
            op.vars.iter().find_map(|v| v.failure())
        } else {
            None
        };
        let func = op.take_fn();
        if let Some(cell) = inherited {
            drop(func);
            self.complete(op, Outcome::Inherited(cell));
            return;
        }
        let rctx = RunContext::for_ctx(op.ctx, false);
        match func {
            Some(OprFn::Sync(f)) => self.run_sync(op, &rctx, f),
            Some(OprFn::Raw(raw)) => self.run_sync(op, &rctx, |rctx: &RunContext| {
                raw.call(rctx);
                Ok(())
            }),
            Some(OprFn::Async(f)) => {
                let started = profiler::op_begin(op.symbolic).map(|t| (t, profiler::buffer::current_tid()));
                let completion = Completion::new(op, started);
                // A panic drops the completion, which finishes the operation with an error.
                let _user = pool::UserCode::enter();
                let _ = catch_unwind(AssertUnwindSafe(|| f(&rctx, completion)));
            }
            None => self.complete(op, Outcome::Failed(Error::internal("operation ran twice"))),
        }
    }

    fn run_sync(&'static self, op: Arc<Opr>, rctx: &RunContext, f: impl FnOnce(&RunContext) -> Result<()>) {
        let r = profiler::profiled(op.symbolic, op.name.as_ref(), op.ctx, op.scope.as_ref(), || {
            let _user = pool::UserCode::enter();
            catch_unwind(AssertUnwindSafe(|| f(rctx)))
        })
        .unwrap_or_else(|p| Err(panic_error(op.name(), p.as_ref())));
        self.complete(op, r.map_or_else(Outcome::Failed, |_| Outcome::Ok));
    }

    /// Finish an operation (called by [`Completion`]).
    pub(crate) fn finish(&'static self, op: Arc<Opr>, error: Option<Error>) {
        self.complete(op, error.map_or(Outcome::Ok, Outcome::Failed));
    }

    fn complete(&'static self, op: Arc<Opr>, outcome: Outcome) {
        let payload = op.payload.lock().take();
        let granted = self.release_vars(op.const_vars(), op.mutable_vars(), outcome);
        drop(payload);
        op.completed.store(true, Ordering::Release);
        let done = op.done.clone();
        // Buried before the latch wakes a waiter, whose reap then finds it.
        if op.pool.is_some() && on_worker_thread() {
            self.bury(op);
        } else {
            drop(op);
        }
        if let Some(l) = done {
            l.set();
        }
        self.dispatch_granted(granted);
        self.finish_one();
    }

    /// Leave a finished operation for a pushing or waiting thread to drop. The thread that
    /// pushed it allocated it and holds references to its variables: freeing it there is a
    /// local free, and the variables' reference counts stay on that thread's cache lines,
    /// where a worker's drop would pull them over (two cache misses per operation, one on
    /// each side). Dropping runs no operation's code (the payload was dropped already), but
    /// the last reference to a variable over lent memory releases it to its lender (a DLPack
    /// deleter, foreign code that may take its own locks, such as Python's GIL, and must not
    /// call back into the library); so a lender sees its memory back at the next push or wait
    /// after the last array over it is freed, not necessarily at that free.
    fn bury(&self, op: Arc<Opr>) {
        self.graveyard.push(op);
    }

    /// Drop the buried operations (those buried meanwhile wait for the next reap).
    pub(crate) fn reap(&self) {
        for _ in 0..self.graveyard.len() {
            drop(self.graveyard.pop());
        }
    }

    /// [`Engine::reap`] every [`REAP_EVERY`]th push of this thread, so the graveyard's line
    /// (which the workers write) is read once per batch.
    fn reap_sometimes(&self) {
        thread_local! {
            static PUSHES: Cell<usize> = const { Cell::new(0) };
        }
        if PUSHES.with(|c| {
            let n = c.get().wrapping_add(1);
            c.set(n);
            n % REAP_EVERY == 0
        }) {
            self.reap();
        }
    }

    /// Release an operation's variables, marking the written ones with its failure.
    fn release_vars(&'static self, reads: &[Arc<Var>], writes: &[Arc<Var>], outcome: Outcome) -> Granted {
        let cell = match outcome {
            Outcome::Ok => None,
            Outcome::Inherited(cell) => Some(cell),
            Outcome::Failed(e) => Some(self.record_failure(e)),
        };
        let mut granted = Granted::default();
        for v in reads {
            v.complete_read(&mut granted);
        }
        for v in writes {
            v.complete_write(cell.as_ref(), &mut granted);
        }
        granted
    }

    fn finish_one(&self) {
        let finished = self.finished.fetch_add(1, Ordering::SeqCst) + 1;
        if self.waiters.load(Ordering::SeqCst) > 0 {
            // The finisher that brings the count to a waiter's bound sees it here: finishes
            // are totally ordered, and the pushes counted so far are read after this one.
            let left = self.pushed.load(Ordering::SeqCst).wrapping_sub(finished);
            if left == 0 || (self.opts.max_pending > 0 && left < self.opts.max_pending) {
                let _g = self.idle.lock();
                self.idle_cv.notify_all();
            }
        }
    }

    fn record_failure(&self, e: Error) -> Arc<ErrorCell> {
        let cell = ErrorCell::new(e);
        let mut errors = self.errors.lock();
        if errors.len() >= 64 {
            errors.retain(|c| c.is_set());
        }
        errors.push(cell.clone());
        self.live_errors.store(errors.len(), Ordering::Release);
        cell
    }

    fn wait_until(&self, done: impl Fn(usize) -> bool) {
        if done(self.pending()) {
            return;
        }
        // Look for a while before sleeping: work that ends within [`WAIT_SPIN`] (what a
        // producer that keeps up with the workers leaves) costs no wake-up, and a thread
        // woken from sleep by a worker is often placed on that worker's CPU, where it and the
        // worker then take turns until the scheduler moves one of them (milliseconds during
        // which every push waits for the worker's time slice).
        let start = std::time::Instant::now();
        while start.elapsed() < WAIT_SPIN {
            for _ in 0..16 {
                std::hint::spin_loop();
            }
            if done(self.pending()) {
                return;
            }
        }
        let mut g = self.idle.lock();
        self.waiters.fetch_add(1, Ordering::SeqCst);
        while !done(self.pending()) {
            g = self.idle_cv.wait(g);
        }
        self.waiters.fetch_sub(1, Ordering::SeqCst);
    }

    #[inline(always)]
    fn apply_back_pressure(&self) {
        if self.opts.max_pending > 0 {
            self.apply_back_pressure_bound();
        }
    }

    /// [`Engine::apply_back_pressure`] with a bound set.
    #[inline(never)]
    fn apply_back_pressure_bound(&self) {
        let max = self.opts.max_pending;
        if !on_worker_thread() && !NO_BACK_PRESSURE.with(Cell::get) && !self.in_inline_queue() {
            self.wait_until(|pending| pending < max);
        }
    }

    fn refuse_on_worker(&self, what: &str) -> Result<()> {
        if on_worker_thread() || self.in_inline_queue() {
            return Err(Error::mxnet(format!(
                "{what} was called from inside an engine operation; it would wait for itself"
            )));
        }
        Ok(())
    }

    /// Wait until every pushed operation has finished, without reporting failures.
    pub fn wait_idle(&self) {
        self.flush_bulk();
        self.wait_until(|pending| pending == 0);
        self.reap();
    }

    /// Wait until every pushed operation has finished; report (and clear) the first failure
    /// that no wait has reported yet.
    pub fn wait_all(&self) -> Result<()> {
        self.refuse_on_worker("WaitAll")?;
        // A thread that waits takes part like one that pushes: it must not miss another
        // thread's solo operation in progress.
        self.solo.note_pusher();
        self.wait_idle();
        let cells = std::mem::take(&mut *self.errors.lock());
        self.live_errors.store(0, Ordering::Release);
        let mut first = None;
        for c in cells {
            if let Some(e) = c.take() {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Wait until `var` can be read (`write` false: pending writes done) or written (all
    /// pending operations done); report (and clear) a failure it carries.
    pub fn wait_for_var(&'static self, var: &Arc<Var>, write: bool) -> Result<()> {
        self.refuse_on_worker("WaitForVar")?;
        self.solo.note_pusher();
        self.flush_bulk();
        // With deferred registration (threaded engines) a variable can look idle while an
        // operation on it still waits to be registered: only the pending count is a safe
        // shortcut there.
        let ready = if self.opts.kind == EngineKind::Naive {
            if write {
                var.is_idle()
            } else {
                var.is_readable()
            }
        } else {
            self.pending() == 0
        };
        if !ready {
            let (c, m) = if write { (vec![], vec![var.clone()]) } else { (vec![var.clone()], vec![]) };
            let mut p = Push::sync(|_| Ok(()), c, m);
            p.prop = FnProperty::NoSkip;
            p.wait = true;
            let name = intern("WaitForVar");
            p.name = Some(&name);
            self.submit_as(p, false)?;
        }
        // The finished operations on it may hold the data's last references.
        self.reap();
        match var.take_failure() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    // --- bulk execution ---

    fn bulk_append(&'static self, p: Push<'_>) -> Result<()> {
        let (const_vars, mutable_vars) = p.vars.lists()?;
        let full = BULK.with(|b| {
            let mut b = b.borrow_mut();
            let f: SyncFn = match p.func.into_opr_fn() {
                OprFn::Sync(f) => f,
                OprFn::Raw(r) => r.boxed(),
                OprFn::Async(_) => unreachable!("only sync operations are bulked"),
            };
            b.ctx = p.ctx;
            b.engine = Some(self);
            b.funcs.push(f);
            if let Some(payload) = p.payload {
                b.payloads.push(payload);
            }
            for v in mutable_vars {
                b.const_vars.retain(|c| !Arc::ptr_eq(c, &v));
                if !b.mutable_vars.iter().any(|m| Arc::ptr_eq(m, &v)) {
                    b.mutable_vars.push(v);
                }
            }
            for v in const_vars {
                if !b.mutable_vars.iter().chain(&b.const_vars).any(|m| Arc::ptr_eq(m, &v)) {
                    b.const_vars.push(v);
                }
            }
            b.funcs.len() >= b.size
        });
        if full {
            self.flush_bulk();
        }
        Ok(())
    }

    /// Push the calling thread's pending bulk as one operation (nothing to do while no
    /// thread bulks on this engine).
    pub fn flush_bulk(&self) {
        if self.bulk_threads.load(Ordering::Relaxed) > 0 {
            flush_thread_bulk();
        }
    }

    /// Set the calling thread's bulk size (operations batched into one engine task);
    /// returns the previous size. Flushes what was batched so far.
    pub fn set_bulk_size(&'static self, size: usize) -> usize {
        // Whichever engine the batched operations are for: the count that keeps them in
        // order there is dropped below.
        flush_thread_bulk();
        BULK.with(|b| {
            let mut b = b.borrow_mut();
            let old = std::mem::replace(&mut b.size, size);
            // The engine this thread counts itself bulking on: this one while the size is
            // above 1.
            if let Some(e) = b.counted.take() {
                e.bulk_threads.fetch_sub(1, Ordering::Relaxed);
            }
            if size > 1 {
                self.bulk_threads.fetch_add(1, Ordering::Relaxed);
                b.counted = Some(self);
            }
            old
        })
    }
}

enum Outcome {
    Ok,
    Failed(Error),
    Inherited(Arc<ErrorCell>),
}

fn panic_error(name: &str, payload: &(dyn std::any::Any + Send)) -> Error {
    let msg = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into());
    Error::internal(format!("operation {name} panicked: {msg}"))
}

fn thread_error(e: std::io::Error) -> Error {
    Error::mxnet(format!("cannot start an engine worker thread: {e}"))
}

/// A variable may appear once in an operation's lists.
#[inline]
fn check_distinct(const_vars: &[Arc<Var>], mutable_vars: &[Arc<Var>]) -> Result<()> {
    if const_vars.len() + mutable_vars.len() < 2 {
        return Ok(());
    }
    check_distinct_slow(const_vars, mutable_vars)
}

fn check_distinct_slow(const_vars: &[Arc<Var>], mutable_vars: &[Arc<Var>]) -> Result<()> {
    let ptrs: SmallVec<[*const Var; 16]> = const_vars.iter().chain(mutable_vars).map(Arc::as_ptr).collect();
    check_distinct_ptrs(&ptrs)
}

/// [`check_distinct`] for an operation's variables by address (reads, then writes).
pub fn check_distinct_ptrs(ptrs: &[*const Var]) -> Result<()> {
    let dup = || {
        Error::value(
            "an engine variable appears twice in the operation's variables (twice in one list, \
             or both read and written); list it once, as mutable if the operation writes it",
        )
    };
    if ptrs.len() <= 8 {
        for (i, p) in ptrs.iter().enumerate() {
            if ptrs[i + 1..].contains(p) {
                return Err(dup());
            }
        }
    } else {
        let mut all: SmallVec<[*const Var; 64]> = SmallVec::from_slice(ptrs);
        all.sort_unstable();
        if all.windows(2).any(|w| w[0] == w[1]) {
            return Err(dup());
        }
    }
    Ok(())
}

/// Pushes between two of a pushing thread's [`Engine::reap`]s.
const REAP_EVERY: usize = 32;

/// How long a thread that waits for pushed operations to finish looks before it sleeps (see
/// [`Engine::wait_until`]).
const WAIT_SPIN: std::time::Duration = std::time::Duration::from_micros(50);

/// Operations of one thread waiting to be pushed as one engine task.
struct Bulk {
    size: usize,
    /// The engine whose [`Engine::bulk_threads`] counts this thread (its size is above 1).
    counted: Option<&'static Engine>,
    engine: Option<&'static Engine>,
    ctx: Context,
    funcs: Vec<SyncFn>,
    payloads: Vec<Payload>,
    const_vars: Vec<Arc<Var>>,
    mutable_vars: Vec<Arc<Var>>,
}

impl Default for Bulk {
    fn default() -> Self {
        Bulk {
            size: 0,
            counted: None,
            engine: None,
            ctx: Context::CPU,
            funcs: Vec::new(),
            payloads: Vec::new(),
            const_vars: Vec::new(),
            mutable_vars: Vec::new(),
        }
    }
}

/// Push the calling thread's pending bulk, if any, to its engine as one operation.
fn flush_thread_bulk() {
    let taken = BULK.try_with(|b| b.borrow_mut().take()).ok().flatten();
    if let Some((engine, push)) = taken {
        // The pool exists (it was used for the bulk's ops' context before), the vars are
        // distinct by construction; a failure here could only be a pool start failure.
        if let Err(e) = engine.submit_as(push, false) {
            engine.record_failure(e);
        }
    }
}

fn bulk_accepts(engine: &'static Engine, ctx: Context) -> bool {
    BULK.try_with(|b| {
        let b = b.borrow();
        b.counted.is_some_and(|c| std::ptr::eq(c, engine))
            && (b.funcs.is_empty() || (b.ctx == ctx && b.engine.is_some_and(|e| std::ptr::eq(e, engine))))
    })
    .unwrap_or(false)
}

impl Bulk {
    fn take(&mut self) -> Option<(&'static Engine, Push<'static>)> {
        if self.funcs.is_empty() {
            return None;
        }
        let engine = self.engine?;
        let funcs = std::mem::take(&mut self.funcs);
        let payloads = std::mem::take(&mut self.payloads);
        let run = Box::new(move |outer: &RunContext| {
            let rctx = RunContext {
                dev_type: outer.dev_type,
                dev_id: outer.dev_id,
                stream: outer.stream,
                aux_stream: outer.aux_stream,
                is_bulk: true,
            };
            for f in funcs {
                f(&rctx)?;
            }
            Ok(())
        });
        let (reads, writes) = (std::mem::take(&mut self.const_vars), std::mem::take(&mut self.mutable_vars));
        let mut push = Push::with(Func::Fn(OprFn::Sync(run)), Vars::Listed(reads.into(), writes.into()));
        push.ctx = self.ctx;
        // Stock's name for a bulk in profiles.
        static NAME: OnceLock<Arc<str>> = OnceLock::new();
        push.name = Some(NAME.get_or_init(|| intern("ImperativeBulk")));
        push.payload = (!payloads.is_empty()).then(|| Box::new(payloads) as Payload);
        Some((engine, push))
    }
}

impl Drop for Bulk {
    fn drop(&mut self) {
        if let Some(e) = self.counted.take() {
            e.bulk_threads.fetch_sub(1, Ordering::Relaxed);
        }
        // A thread that ends with batched operations still pushes them.
        if let Some((engine, push)) = self.take() {
            let _ = catch_unwind(AssertUnwindSafe(|| engine.submit_as(push, false)));
        }
    }
}

/// How a graph executor bulks operations (seeds 000/001, "Execution Options"): read at each
/// bind, so a change applies to the next executor or hybridized block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecBulk {
    /// Run the whole graph as one bulk during inference.
    pub inference: bool,
    /// Run training graphs as bulked segments.
    pub train: bool,
    /// Largest segment during training.
    pub max_node_train: usize,
}

impl ExecBulk {
    /// The settings from `MXNET_EXEC_BULK_EXEC_INFERENCE`, `_TRAIN` and `_MAX_NODE_TRAIN`.
    pub fn from_config(reg: &config::Registry) -> Result<Self> {
        const BY: &str = "executor bind";
        Ok(ExecBulk {
            inference: reg.get_bool("MXNET_EXEC_BULK_EXEC_INFERENCE", BY)?.unwrap_or(true),
            train: reg.get_bool("MXNET_EXEC_BULK_EXEC_TRAIN", BY)?.unwrap_or(true),
            max_node_train: reg.get_int("MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN", BY)?.unwrap_or(15) as usize,
        })
    }

    /// The bulk size for a graph of `nodes` operations (1: no bulking).
    pub fn segment_size(&self, training: bool, nodes: usize) -> usize {
        match (training, self.train, self.inference) {
            (true, true, _) => self.max_node_train.max(1),
            (false, _, true) => nodes.max(1),
            _ => 1,
        }
    }

    /// The bulk size of a backward pass (a training computation: 1 when training bulks nothing).
    pub fn backward_size(&self) -> usize {
        if self.train {
            self.max_node_train.max(1)
        } else {
            1
        }
    }
}

/// The calling thread's bulk size for a while (a graph call, a backward pass): restored when
/// dropped, which also pushes what was batched.
pub struct BulkScope {
    engine: &'static Engine,
    prev: usize,
    changed: bool,
}

impl Engine {
    /// Bulk up to `size` operations per engine task on this thread until the scope ends
    /// (`size` ≤ 1: none).
    pub fn bulk_scope(&'static self, size: usize) -> BulkScope {
        let current = BULK.with(|b| b.borrow().size);
        let changed = size.max(1) != current.max(1);
        let prev = if changed { self.set_bulk_size(size) } else { current };
        BulkScope { engine: self, prev, changed }
    }
}

impl Drop for BulkScope {
    fn drop(&mut self) {
        if self.changed {
            self.engine.set_bulk_size(self.prev);
        }
    }
}

// --- the process-wide engine ---

/// The process's engine; a forked child starts another.
static ENGINE: crate::sync::Started<Engine> = crate::sync::Started::new();

/// The process-wide engine, started at first use from the configuration. A bad engine
/// setting fails this call (and every later one until it is corrected).
#[inline]
pub fn global() -> Result<&'static Engine> {
    match ENGINE.get() {
        Some(e) => Ok(e),
        None => start_global(),
    }
}

#[cold]
fn start_global() -> Result<&'static Engine> {
    ENGINE.get_or_start(|| {
        let engine = Engine::start(Engine::options_from_config()?);
        crate::runtime::runtime().adopt(crate::runtime::Stage::Engine, &EngineStage);
        Ok(engine)
    })
}

/// The process-wide engine if it was started.
pub fn global_if_started() -> Option<&'static Engine> {
    ENGINE.get()
}

/// The engine's part in the runtime's lifecycle: before `fork` and at shutdown it finishes
/// what was pushed (not on a worker thread, which would wait for itself); a child starts a
/// new engine. Failures stay recorded; nothing is torn down, so later calls still work.
struct EngineStage;

impl crate::runtime::Part for EngineStage {
    fn prepare_fork(&self) {
        self.shutdown();
    }
    fn child_after_fork(&self) {
        ENGINE.forget();
    }
    fn shutdown(&self) {
        if let Some(e) = global_if_started() {
            if !on_worker_thread() {
                e.wait_idle();
            }
        }
    }
}

#[cfg(test)]
mod tests;
