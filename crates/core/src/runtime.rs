//! The process-wide runtime: the one owner of the library's lifecycle.
//!
//! Owns: [`Runtime`], one static value built at compile time (no lazy initialisation on
//! the path of every call): the call gate and the completion gate that keep calls out of the
//! moment of `fork` ([`enter_call`], [`enter_completion`]), the kernel thread count set by
//! `MXSetNumOMPThreads`, the shutdown flag, and the table of [`Part`]s, one per [`Stage`],
//! through which it drives the fork protocol (`pthread_atfork`: prepare in stage order,
//! parent and child in reverse) and shutdown (`MXNotifyShutdown`, and process exit) in one
//! fixed order. Also the build's feature list.
//!
//! The parts' own state lives with them, each in one process-wide slot (the engine and the
//! custom-operator threads in a [`crate::sync::Started`], the kernel pool behind its lock):
//! the engine, operators and autograd sit above this module in the layers and reach their
//! state without a context argument, so the runtime cannot hold it; instead each part hands
//! the runtime its lifecycle hooks when it starts ([`Runtime::adopt`]). The parts below
//! this module need no hooks at the fork (configuration and storage are used only inside
//! calls, and no call is in progress then), except the profiler, whose dump thread takes its
//! locks outside calls: its stage, the last, holds them across the fork and writes the
//! trace at shutdown and exit.
//! `docs/design/runtime.md` lists every process-wide value and who owns it.

use crate::error::{Error, Result};
use std::cell::{Cell, RefCell};
use std::ffi::CStr;
use std::panic::catch_unwind;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{OnceLock, PoisonError, RwLockReadGuard, RwLockWriteGuard};

/// The MXNet version this library is ABI-compatible with, as `MXGetVersion` reports it:
/// major*10000 + minor*100 + patch. The 1.9.1 Python frontend compares against it, so it is
/// the version of the ABI we implement, not of this crate (see `MXGetConfig` for ours).
pub const MXNET_VERSION: i32 = 10901;

/// Runs when the library is loaded (before `dlopen` returns): registers the process hooks
/// (fork and exit) and creates the configuration registry, which prints the warnings for
/// unknown `MXNET_*` variables, so that they appear whatever the program calls first. A
/// panic here is contained; the registry is then created at the first API call instead.
#[cfg(any(target_os = "linux", target_os = "macos"))]
#[used]
#[cfg_attr(target_os = "linux", link_section = ".init_array")]
#[cfg_attr(target_os = "macos", link_section = "__DATA,__mod_init_func")]
static ON_LOAD: extern "C" fn() = on_load;

#[cfg(any(target_os = "linux", target_os = "macos"))]
extern "C" fn on_load() {
    let _ = std::panic::catch_unwind(|| {
        register_process_hooks();
        let reg = crate::config::global();
        if let Err(e) = crate::profiler::autostart(reg) {
            eprintln!("[mxnet-rt] profiler autostart: {e}");
        }
    });
}

/// The parts of the library the runtime drives, in their order. Before `fork` (in the
/// parent) their hooks run in this order; after it, in the parent and in the child, in the
/// reverse order, whatever order they started in. At shutdown they run in this order. The
/// call gate comes first: once it is closed no thread is inside a call, so the engine can be
/// quiesced without new pushes arriving, and quiescing it finishes the operations that could
/// still use the later parts' threads; at shutdown the engine finishes what was pushed before
/// the custom-operator threads stop, and the profiler writes its trace last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The call gate ([`enter_call`]): closed before `fork`, opened again after it.
    CallGate = 0,
    /// Finish pushed work before `fork` and at shutdown; a child starts a new engine.
    Engine = 1,
    /// The completion gate ([`enter_completion`]): closed once the engine is idle.
    CompletionGate = 2,
    /// The custom operators' helper threads: stopped at shutdown; a child starts new ones.
    CustomOpThreads = 3,
    /// The kernel thread pool: a child builds a new one.
    KernelPool = 4,
    /// The profiler: holds its locks across `fork`; writes its trace at shutdown and at
    /// process exit if it ran.
    Profiler = 5,
}

const STAGES: usize = 6;

/// A part of the library whose lifecycle the runtime drives (see [`Stage`]). The hooks run
/// inside `pthread_atfork` handlers and at exit. A prepare hook may wait (for the gate, for
/// pending work, for a lock it then holds across the fork); the hooks after `fork` take no
/// lock another thread may hold. A panic in a hook is caught and skips only that hook.
pub trait Part: Sync {
    /// In the parent, before `fork`.
    fn prepare_fork(&self) {}
    /// In the parent, after `fork`.
    fn parent_after_fork(&self) {}
    /// In the child, after `fork`.
    fn child_after_fork(&self) {}
    /// `MXNotifyShutdown`: finish work and stop threads. Calls that arrive afterwards (the
    /// frontend frees handles in `__del__` after it) must still work.
    fn shutdown(&self) {}
    /// At process exit (`atexit`).
    fn at_exit(&self) {}
}

/// Where in the lifecycle the hooks run.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Point {
    Prepare,
    Parent,
    Child,
    Shutdown,
    Exit,
}

/// Registers the process hooks with `pthread_atfork` and `atexit` (once; at load, so that
/// the call gate works from the first call), and adopts the runtime's own parts.
fn register_process_hooks() {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    REGISTERED.call_once(|| {
        RUNTIME.adopt_own(Stage::CallGate, &CallGate);
        RUNTIME.adopt_own(Stage::CompletionGate, &CompletionGate);
        RUNTIME.adopt_own(Stage::Profiler, &ProfilerStage);
        // SAFETY: plain extern "C" functions with no captured state.
        unsafe {
            libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child));
            libc::atexit(at_exit);
        }
    });
}

extern "C" fn fork_prepare() {
    let _ = RUNTIME.run(Point::Prepare);
}

extern "C" fn fork_parent() {
    let _ = RUNTIME.run(Point::Parent);
}

extern "C" fn fork_child() {
    // As stock: a forked child (a DataLoader worker) runs kernels on one thread unless it asks
    // for more (`MXSetNumOMPThreads`), and its engine starts MXNET_MP_WORKER_NTHREADS workers.
    RUNTIME.forked.store(true, Ordering::Relaxed);
    RUNTIME.omp_threads.store(1, Ordering::Relaxed);
    let _ = RUNTIME.run(Point::Child);
}

extern "C" fn at_exit() {
    let _ = RUNTIME.run(Point::Exit);
}

/// The call gate's part in the fork protocol.
struct CallGate;

impl Part for CallGate {
    fn prepare_fork(&self) {
        close(&RUNTIME.gate);
    }
    fn parent_after_fork(&self) {
        open_gate();
    }
    fn child_after_fork(&self) {
        open_gate();
    }
}

/// The completion gate's part in the fork protocol.
struct CompletionGate;

impl Part for CompletionGate {
    fn prepare_fork(&self) {
        close(&RUNTIME.completion_gate);
    }
    fn parent_after_fork(&self) {
        open_gate();
    }
    fn child_after_fork(&self) {
        open_gate();
    }
}

/// The profiler: its locks across `fork` (its dump thread takes them outside any call), and
/// its trace at the end, written if it ran and the file is not finished.
struct ProfilerStage;

impl Part for ProfilerStage {
    fn prepare_fork(&self) {
        crate::profiler::fork_prepare();
    }
    fn parent_after_fork(&self) {
        crate::profiler::fork_release();
    }
    fn child_after_fork(&self) {
        crate::profiler::fork_release();
    }
    fn shutdown(&self) {
        crate::profiler::final_dump();
    }
    fn at_exit(&self) {
        crate::profiler::final_dump();
    }
}

/// How the calling thread stands with the gate.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum GateUse {
    /// Outside any call.
    Outside,
    /// Inside a call: holds the gate shared (nested calls take nothing).
    Inside,
    /// One of the library's own threads: never takes the gate.
    Own,
    /// Inside a call that completes engine work ([`enter_completion`]): nested calls take
    /// nothing (the completion gate covers them).
    Completing,
}

/// The calling thread's side of the gate, in one thread-local (each access to one costs a
/// call into the dynamic loader in a shared library, and every call enters and leaves).
struct GateSlot {
    /// How many calls into the library are in progress on this thread (nested calls count).
    depth: Cell<u32>,
    /// How many of them complete engine work ([`enter_completion`]).
    completing: Cell<u32>,
    /// How many engine operations this thread is running ([`in_operation`]).
    operations: Cell<u32>,
    /// The shared hold of the outermost call in progress on this thread.
    held: RefCell<Option<RwLockReadGuard<'static, ()>>>,
    /// One of the library's own threads.
    own: Cell<bool>,
}

impl GateSlot {
    fn usage(&self) -> GateUse {
        if self.own.get() {
            GateUse::Own
        } else if self.completing.get() > 0 {
            GateUse::Completing
        } else if self.held.try_borrow().map_or(true, |h| h.is_some()) {
            GateUse::Inside
        } else {
            GateUse::Outside
        }
    }
}

thread_local! {
    static GATE_SLOT: GateSlot =
        const {
            GateSlot {
                depth: Cell::new(0),
                completing: Cell::new(0),
                operations: Cell::new(0),
                held: RefCell::new(None),
                own: Cell::new(false),
            }
        };
    /// The exclusive holds taken before `fork` by the forking thread (the call gate, then the
    /// completion gate); dropped after it, last first (in the parent, and in the child, where
    /// the same thread continues).
    static CLOSED: RefCell<Vec<RwLockWriteGuard<'static, ()>>> = const { RefCell::new(Vec::new()) };
}

/// The calling thread's standing (`Err` while the thread is being torn down).
fn gate_use() -> std::result::Result<GateUse, std::thread::AccessError> {
    GATE_SLOT.try_with(GateSlot::usage)
}

/// Whether the calling thread is inside a call into the library (for the C boundary's panic
/// hook: a panic inside a call is reported as the call's error, not printed).
pub fn in_call() -> bool {
    GATE_SLOT.try_with(|s| s.depth.get() > 0).unwrap_or(false)
}

/// A call in progress: counted in the thread's depth, and holding the gate when it is the
/// thread's outermost call (not for a library thread, nor while the thread is being torn
/// down); released when dropped.
pub struct CallGuard {
    counted: bool,
    outermost: bool,
}

impl Drop for CallGuard {
    #[inline]
    fn drop(&mut self) {
        if self.counted {
            let _ = GATE_SLOT.try_with(|s| {
                s.depth.set(s.depth.get() - 1);
                if self.outermost {
                    s.held.borrow_mut().take();
                }
            });
        }
    }
}

fn release_gate() {
    let _ = GATE_SLOT.try_with(|s| s.held.borrow_mut().take());
}

/// Enter a call into the library (the C boundary does, for every exported function): waits
/// while a `fork` is being prepared.
#[inline]
pub fn enter_call() -> CallGuard {
    GATE_SLOT
        .try_with(|s| {
            s.depth.set(s.depth.get() + 1);
            let mut held = s.held.borrow_mut();
            let outermost = !s.own.get() && s.completing.get() == 0 && held.is_none();
            if outermost {
                *held = Some(RUNTIME.gate.read().unwrap_or_else(PoisonError::into_inner));
            }
            CallGuard { counted: true, outermost }
        })
        .unwrap_or(CallGuard { counted: false, outermost: false })
}

/// Run frontend code (a callback the frontend registered) from inside a call: the gate is
/// released meanwhile, as the frontend's own code is not inside the library. A Python
/// callback needs the interpreter lock, which a thread forking from Python holds while it
/// waits for the gate; holding the gate across the callback would deadlock the two.
///
/// Inside an engine operation ([`in_operation`]) the gate is kept: the engine stage of a fork
/// waits for every pending operation, and one that waited here to take the gate again would
/// never finish. Callers hold no lock of the library across it: a fork may happen during
/// `f`, and a lock held then would stay held in the child. Custom operators' forward and
/// backward run on the library's own threads (nothing to release); their property callbacks,
/// delete callbacks and `autograd.Function`'s backward come through here.
///
/// A call that waits on a library thread which itself enters the gate (the ImageRecordIter's
/// reading thread) waits through here too: holding the gate across that wait, a fork
/// prepared meanwhile would wait for the call, the thread for the fork (a waiting writer
/// blocks new readers), and the call for the thread. That call holds the iterator's own lock
/// across the wait (the one exception to the rule above): a forked child is refused before
/// it takes that lock, and another call waiting for it waits outside the gate as well.
/// Inside an engine operation or on a library thread the gate is not released, so such
/// waits must not happen there (the iterators are used from frontend threads).
pub fn outside_call<R>(f: impl FnOnce() -> R) -> R {
    /// Holds the gate again for the rest of the outer call when `f` returns (or unwinds);
    /// the outer call's guard releases it.
    struct Reenter;
    impl Drop for Reenter {
        fn drop(&mut self) {
            let _ = GATE_SLOT
                .try_with(|s| *s.held.borrow_mut() = Some(RUNTIME.gate.read().unwrap_or_else(PoisonError::into_inner)));
        }
    }
    let release = GATE_SLOT.try_with(|s| s.operations.get() == 0 && s.usage() == GateUse::Inside);
    if release != Ok(true) {
        return f();
    }
    release_gate();
    let _reenter = Reenter;
    f()
}

/// An engine operation running on this thread (see [`in_operation`]).
pub struct OperationScope(bool);

impl Drop for OperationScope {
    #[inline]
    fn drop(&mut self) {
        if self.0 {
            let _ = GATE_SLOT.try_with(|s| s.operations.set(s.operations.get() - 1));
        }
    }
}

/// The engine runs every operation it runs on a thread other than its workers inside one:
/// frontend code an operation calls keeps the gate (a fork waits for the operation, so the
/// operation must not wait for the fork). Workers never hold the gate, so need none.
#[inline]
pub fn in_operation() -> OperationScope {
    OperationScope(GATE_SLOT.try_with(|s| s.operations.set(s.operations.get() + 1)).is_ok())
}

/// A completing call in progress: counted in the thread's depth and as completing (calls it
/// makes, such as a frontend deleter freeing arrays, take nothing), and holding the
/// completion gate.
pub struct CompletionGuard {
    counted: bool,
    _held: RwLockReadGuard<'static, ()>,
}

impl Drop for CompletionGuard {
    fn drop(&mut self) {
        if self.counted {
            let _ = GATE_SLOT.try_with(|s| {
                s.depth.set(s.depth.get() - 1);
                s.completing.set(s.completing.get() - 1);
            });
        }
    }
}

/// Enter a call that completes engine work: passes the completion gate (see [`Runtime`]).
pub fn enter_completion() -> CompletionGuard {
    let held = RUNTIME.completion_gate.read().unwrap_or_else(PoisonError::into_inner);
    let counted = GATE_SLOT
        .try_with(|s| {
            s.depth.set(s.depth.get() + 1);
            s.completing.set(s.completing.get() + 1);
        })
        .is_ok();
    CompletionGuard { counted, _held: held }
}

/// Marks the calling thread as one of the library's own: it never takes the call gate.
pub fn mark_library_thread() {
    GATE_SLOT.with(|s| s.own.set(true));
}

/// Before `fork`: wait until no call is in progress on `gate` (the call gate, or once the
/// engine is idle the completion gate), and let none start. A thread that forks from inside
/// a call (a frontend callback) or from a library thread cannot wait for itself; it forks
/// without closing the gates.
fn close(gate: &'static std::sync::RwLock<()>) {
    if gate_use() != Ok(GateUse::Outside) {
        return;
    }
    let _ = catch_unwind(|| {
        let g = gate.write().unwrap_or_else(PoisonError::into_inner);
        CLOSED.with(|c| c.borrow_mut().push(g));
    });
}

/// After `fork` (parent and child): open the gate closed last.
fn open_gate() {
    let _ = catch_unwind(|| CLOSED.try_with(|c| c.borrow_mut().pop()));
}

/// The cores this process may use, read once: `available_parallelism` reads the cgroup and
/// affinity files at every call, and kernels ask for the thread count per loop.
pub fn cores() -> usize {
    *RUNTIME.cores.get_or_init(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
}

/// The process-wide runtime (see the module's doc).
pub struct Runtime {
    /// The call gate. Every call into the library from a thread the library does not own holds
    /// it shared for the whole call ([`enter_call`]); the fork protocol's first stage takes it
    /// exclusively, so at the moment of `fork` no such call is half done and no lock it takes
    /// (the handle table, the interned names, a storage pool, an engine variable) is held by a
    /// thread the child will not have. std's lock lets no new reader in while a writer waits,
    /// so a fork is not starved by threads that call without pause.
    ///
    /// The library's own threads (engine workers, custom-operator threads) never take it: the
    /// engine stage waits for their work, and a custom operator's callback that calls the
    /// library from its thread must not wait for a fork that waits for that callback.
    gate: std::sync::RwLock<()>,
    /// The completion gate: calls that finish engine work instead of starting it (a C caller's
    /// `MXEngineCompleteAsync` for an asynchronous operation) pass this gate, not the call gate: the
    /// engine stage waits for that operation, so the call must get through while the call gate is
    /// closed. It closes after the engine is idle, so that no completion is half done at the fork.
    completion_gate: std::sync::RwLock<()>,
    /// The part of each [`Stage`], once it started.
    parts: [OnceLock<&'static dyn Part>; STAGES],
    /// `MXSetNumOMPThreads` (0: not set; 1 in a forked child until it sets it).
    omp_threads: AtomicUsize,
    /// Whether this process is a forked child of one that loaded the library.
    forked: AtomicBool,
    shut_down: AtomicBool,
    cores: OnceLock<usize>,
}

/// The runtime: built at compile time, so reaching it costs nothing.
static RUNTIME: Runtime = Runtime::new();

/// The process's runtime.
#[inline]
pub fn runtime() -> &'static Runtime {
    &RUNTIME
}

impl Runtime {
    /// An empty runtime: no part adopted, no gate closed. The process has one ([`runtime`]);
    /// a test may build its own to drive parts of its own.
    pub const fn new() -> Runtime {
        Runtime {
            gate: std::sync::RwLock::new(()),
            completion_gate: std::sync::RwLock::new(()),
            parts: [const { OnceLock::new() }; STAGES],
            omp_threads: AtomicUsize::new(0),
            forked: AtomicBool::new(false),
            shut_down: AtomicBool::new(false),
            cores: OnceLock::new(),
        }
    }

    /// A part started: the runtime drives its lifecycle from now on, at its stage (the first
    /// part adopted at a stage stays; later ones are ignored).
    pub fn adopt(&self, stage: Stage, part: &'static dyn Part) {
        self.adopt_own(stage, part);
        if std::ptr::eq(self, &RUNTIME) {
            register_process_hooks();
        }
    }

    fn adopt_own(&self, stage: Stage, part: &'static dyn Part) {
        let _ = self.parts[stage as usize].set(part);
    }

    /// Run the adopted parts' hooks of one point: before `fork` and at shutdown and exit in
    /// stage order, after `fork` in reverse. A hook that panics is skipped and the others
    /// still run; returns how many panicked.
    fn run(&self, point: Point) -> usize {
        let run = |part: &OnceLock<&'static dyn Part>| {
            let Some(&p) = part.get() else { return 0 };
            catch_unwind(std::panic::AssertUnwindSafe(|| match point {
                Point::Prepare => p.prepare_fork(),
                Point::Parent => p.parent_after_fork(),
                Point::Child => p.child_after_fork(),
                Point::Shutdown => p.shutdown(),
                Point::Exit => p.at_exit(),
            }))
            .is_err() as usize
        };
        match point {
            Point::Prepare | Point::Shutdown | Point::Exit => self.parts.iter().map(run).sum(),
            Point::Parent | Point::Child => self.parts.iter().rev().map(run).sum(),
        }
    }

    /// `MXSetNumOMPThreads`: the number of threads data-parallel kernels may use.
    pub fn set_kernel_threads(&self, n: i32) -> Result<()> {
        if n < 1 {
            return Err(Error::value(format!("number of OMP threads must be >= 1, got {n}")));
        }
        self.omp_threads.store(n as usize, Ordering::Relaxed);
        Ok(())
    }

    /// Whether this process was forked from one that had loaded the library.
    pub fn is_forked_child(&self) -> bool {
        self.forked.load(Ordering::Relaxed)
    }

    /// Whether `MXSetNumOMPThreads` was called (a forked child counts as having set 1).
    pub fn kernel_threads_set(&self) -> bool {
        self.omp_threads.load(Ordering::Relaxed) != 0
    }

    /// The kernel thread count: the `MXSetNumOMPThreads` value, else the machine's cores.
    pub fn kernel_threads(&self) -> usize {
        match self.omp_threads.load(Ordering::Relaxed) {
            0 => cores(),
            n => n,
        }
    }

    /// `MXNotifyShutdown`: every part's shutdown, in stage order (the engine finishes what
    /// was pushed, the custom-operator threads stop, the profiler writes its trace).
    /// Idempotent; calls that arrive afterwards (the frontend frees handles in `__del__`
    /// after it) still work.
    /// A part whose shutdown panicked is reported as an internal error after the others ran.
    pub fn shutdown(&self) -> Result<()> {
        self.shut_down.store(true, Ordering::Release);
        match self.run(Point::Shutdown) {
            0 => Ok(()),
            n => Err(Error::internal(format!("{n} part(s) of the library failed to shut down"))),
        }
    }

    pub fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }
}

impl Default for Runtime {
    fn default() -> Self {
        Runtime::new()
    }
}

/// Name and state of every feature (`MXLibInfoFeatures`), in stock's order (runtime.py /
/// libinfo.h); CPU SIMD levels are detected at run time.
pub fn feature_list() -> Vec<(&'static CStr, bool)> {
    let simd = cpu_simd();
    vec![
        // CUDA is loaded at run time: on when a driver and a GPU were found; cuDNN when its
        // library loads too (NCCL is not used yet).
        (c"CUDA", crate::cuda::available()),
        (c"CUDNN", crate::cuda::dnn::available()),
        (c"NCCL", false),
        (c"CUDA_RTC", crate::cuda::rtc::available()),
        (c"TENSORRT", false),
        (c"CPU_SSE", simd.sse),
        (c"CPU_SSE2", simd.sse2),
        (c"CPU_SSE3", simd.sse3),
        (c"CPU_SSE4_1", simd.sse4_1),
        (c"CPU_SSE4_2", simd.sse4_2),
        (c"CPU_SSE4A", simd.sse4a),
        (c"CPU_AVX", simd.avx),
        (c"CPU_AVX2", simd.avx2),
        // Kernels run on a Rust thread pool, not OpenMP.
        (c"OPENMP", false),
        (c"SSE", cfg!(target_feature = "sse2")),
        (c"F16C", simd.f16c),
        (c"JEMALLOC", false),
        (c"BLAS_OPEN", false),
        (c"BLAS_ATLAS", false),
        (c"BLAS_MKL", false),
        (c"BLAS_APPLE", false),
        (c"LAPACK", false),
        (c"MKLDNN", false),
        (c"OPENCV", false),
        (c"CAFFE", false),
        // The profiler is built in (crates/core/src/profiler).
        (c"PROFILER", true),
        (c"DIST_KVSTORE", false),
        (c"CXX14", false),
        // Must stay off: the 1.9.1 frontend switches to the *64 entry points when it is on.
        (c"INT64_TENSOR_SIZE", false),
        (c"SIGNAL_HANDLER", false),
        (c"DEBUG", cfg!(debug_assertions)),
        (c"TVM_OP", false),
    ]
}

#[derive(Default)]
struct Simd {
    sse: bool,
    sse2: bool,
    sse3: bool,
    sse4_1: bool,
    sse4_2: bool,
    sse4a: bool,
    avx: bool,
    avx2: bool,
    f16c: bool,
}

#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
fn cpu_simd() -> Simd {
    Simd {
        sse: std::arch::is_x86_feature_detected!("sse"),
        sse2: std::arch::is_x86_feature_detected!("sse2"),
        sse3: std::arch::is_x86_feature_detected!("sse3"),
        sse4_1: std::arch::is_x86_feature_detected!("sse4.1"),
        sse4_2: std::arch::is_x86_feature_detected!("sse4.2"),
        sse4a: std::arch::is_x86_feature_detected!("sse4a"),
        avx: std::arch::is_x86_feature_detected!("avx"),
        avx2: std::arch::is_x86_feature_detected!("avx2"),
        f16c: std::arch::is_x86_feature_detected!("f16c"),
    }
}

#[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
fn cpu_simd() -> Simd {
    Simd::default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feature_names_match_stock_list() {
        let names: Vec<_> = feature_list().iter().map(|(n, _)| n.to_str().unwrap()).collect();
        assert_eq!(names.len(), 32);
        for required in ["TVM_OP", "INT64_TENSOR_SIZE", "CUDA", "CPU_AVX2", "PROFILER"] {
            assert!(names.contains(&required), "{required}");
        }
        let on = |n: &str| feature_list().iter().any(|(k, v)| k.to_str().unwrap() == n && *v);
        assert!(!on("TVM_OP") && !on("INT64_TENSOR_SIZE"));
        assert_eq!(on("CUDA"), crate::cuda::available());
        #[cfg(target_arch = "x86_64")]
        assert!(on("CPU_SSE2"), "x86-64 always has SSE2");
    }

    #[test]
    fn kernel_threads_validation() {
        let rt = runtime();
        assert!(rt.set_kernel_threads(0).is_err());
        assert!(rt.set_kernel_threads(-3).is_err());
        assert!(rt.kernel_threads() >= 1);
    }
}

#[cfg(test)]
mod fork_tests {
    use super::*;
    use std::sync::Mutex;

    static ORDER: Mutex<Vec<&str>> = Mutex::new(Vec::new());

    /// Hooks run in stage order before `fork`, at shutdown and at exit, and in reverse order
    /// after `fork`, whatever order the parts started in (here the reverse), and only the
    /// adopted parts'. The test drives a runtime of its own: the process's is untouched.
    #[test]
    fn parts_run_in_stage_order_whatever_the_adoption_order() {
        struct Kernel;
        impl Part for Kernel {
            fn child_after_fork(&self) {
                ORDER.lock().unwrap().push("kernel child");
            }
        }
        struct Engine;
        impl Part for Engine {
            fn prepare_fork(&self) {
                ORDER.lock().unwrap().push("engine prepare");
            }
            fn child_after_fork(&self) {
                ORDER.lock().unwrap().push("engine child");
            }
            fn shutdown(&self) {
                ORDER.lock().unwrap().push("engine shutdown");
            }
        }
        struct Gate;
        impl Part for Gate {
            fn prepare_fork(&self) {
                ORDER.lock().unwrap().push("gate prepare");
            }
            fn parent_after_fork(&self) {
                ORDER.lock().unwrap().push("gate parent");
            }
        }
        struct Profiler;
        impl Part for Profiler {
            fn shutdown(&self) {
                ORDER.lock().unwrap().push("profiler shutdown");
            }
            fn at_exit(&self) {
                ORDER.lock().unwrap().push("profiler exit");
            }
        }
        struct Panics;
        impl Part for Panics {
            fn shutdown(&self) {
                panic!("a hook that fails is skipped");
            }
        }
        let rt = Runtime::new();
        rt.adopt(Stage::Profiler, &Profiler);
        rt.adopt(Stage::KernelPool, &Kernel);
        rt.adopt(Stage::CustomOpThreads, &Panics);
        rt.adopt(Stage::Engine, &Engine);
        rt.adopt(Stage::CallGate, &Gate);
        // A second part for a stage is ignored.
        rt.adopt(Stage::Engine, &Kernel);
        let failed: Vec<usize> =
            [Point::Prepare, Point::Parent, Point::Child, Point::Shutdown, Point::Exit].map(|p| rt.run(p)).to_vec();
        assert_eq!(failed, [0, 0, 0, 1, 0], "the panicking shutdown hook is counted");
        assert_eq!(
            *ORDER.lock().unwrap(),
            [
                "gate prepare",
                "engine prepare",
                "gate parent",
                "kernel child",
                "engine child",
                "engine shutdown",
                "profiler shutdown",
                "profiler exit"
            ]
        );
        assert!(!rt.is_shut_down());
        let e = rt.shutdown().unwrap_err().to_string();
        assert!(e.contains("1 part(s)"), "{e}");
        assert!(rt.is_shut_down() && !runtime().is_shut_down());
    }

    /// A call holds the gate shared; nested calls take nothing; a library thread never takes
    /// it; closing it waits for the call in progress and keeps new ones out until it opens.
    #[test]
    fn the_gate_waits_for_calls_and_keeps_new_ones_out() {
        let outer = enter_call();
        assert!(outer.outermost);
        let inner = enter_call();
        assert!(!inner.outermost, "a nested call takes the gate again");
        drop(inner);
        assert!(gate_use().unwrap() == GateUse::Inside);
        // Frontend code run from inside the call does not hold the gate; a call it makes does.
        outside_call(|| {
            assert!(gate_use().unwrap() == GateUse::Outside);
            assert!(enter_call().outermost);
        });
        assert!(gate_use().unwrap() == GateUse::Inside);
        // Another thread closes the gate: it has to wait for this call.
        static OPENING: AtomicBool = AtomicBool::new(false);
        let (tx, rx) = std::sync::mpsc::channel();
        let closer = std::thread::spawn(move || {
            close(&RUNTIME.gate);
            tx.send(()).unwrap();
            // A library thread is not held up by the closed gate.
            let own = std::thread::spawn(|| {
                mark_library_thread();
                !enter_call().outermost
            });
            assert!(own.join().unwrap());
            std::thread::sleep(std::time::Duration::from_millis(50));
            OPENING.store(true, Ordering::SeqCst);
            open_gate();
        });
        assert!(rx.recv_timeout(std::time::Duration::from_millis(100)).is_err(), "closed during a call");
        drop(outer);
        rx.recv_timeout(std::time::Duration::from_secs(10)).expect("closed once the call ended");
        // New calls wait until the gate opens again.
        drop(enter_call());
        assert!(OPENING.load(Ordering::SeqCst), "a call entered while the gate was closed");
        closer.join().unwrap();
        assert!(gate_use().unwrap() == GateUse::Outside);
    }
}
