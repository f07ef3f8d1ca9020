//! The process-wide runtime.
//!
//! Owns: the state that outlives single calls and is not configuration: the kernel thread
//! count set by `MXSetNumOMPThreads`, the shutdown flag, the build's feature list, and the
//! fork protocol ([`on_fork`]: the order in which the parts that keep threads get ready for
//! `fork` and start over in the child).
//! Later capabilities (engine, storage, profiler) hang off [`Runtime`] so that it alone fixes
//! their order of creation and shutdown; no other static owns a thread or a resource.

use crate::error::{Error, Result};
use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The MXNet version this library is ABI-compatible with, as `MXGetVersion` reports it:
/// major*10000 + minor*100 + patch. The 1.9.1 Python frontend compares against it, so it is
/// the version of the ABI we implement, not of this crate (see `MXGetConfig` for ours).
pub const MXNET_VERSION: i32 = 10901;

/// Runs when the library is loaded (before `dlopen` returns): creates the configuration
/// registry, which prints the warnings for unknown `MXNET_*` variables, so that they appear
/// whatever the program calls first. A panic here is contained; the registry is then created
/// at the first API call instead.
#[cfg(target_os = "linux")]
#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

#[cfg(target_os = "linux")]
extern "C" fn on_load() {
    let _ = std::panic::catch_unwind(|| {
        let reg = crate::config::global();
        if let Err(e) = crate::profiler::autostart(reg) {
            eprintln!("[mxnet-rt] profiler autostart: {e}");
        }
    });
}

/// The parts of the library that take part in the fork protocol, in the order their hooks
/// run: before `fork` (in the parent) in this order, and in the child in this order, whatever
/// order they started in. The engine comes first: quiescing it finishes the operations that
/// could still use the other parts' threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForkStage {
    /// Finish pushed work before `fork`; a child starts a new engine.
    Engine = 0,
    /// The custom operators' helper threads: a child starts new ones.
    CustomOpThreads = 1,
    /// The kernel thread pool: a child builds a new one.
    KernelPool = 2,
}

const FORK_STAGES: usize = 3;

/// Each stage's hooks: (before `fork`, in the child).
type ForkHooks = (Option<extern "C" fn()>, Option<extern "C" fn()>);

static FORK_HOOKS: [OnceLock<ForkHooks>; FORK_STAGES] = [const { OnceLock::new() }; FORK_STAGES];

/// The one fork protocol: `stage` takes part with these hooks (set once; later calls for the
/// same stage are ignored). One `pthread_atfork` registration, made with the first stage,
/// runs every registered stage's hooks in [`ForkStage`] order.
pub fn on_fork(stage: ForkStage, prepare: Option<extern "C" fn()>, child: Option<extern "C" fn()>) {
    let _ = FORK_HOOKS[stage as usize].set((prepare, child));
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: plain extern "C" functions with no captured state.
        unsafe { libc::pthread_atfork(Some(fork_prepare), None, Some(fork_child)) };
    });
}

extern "C" fn fork_prepare() {
    run_fork_hooks(&FORK_HOOKS, false);
}

extern "C" fn fork_child() {
    run_fork_hooks(&FORK_HOOKS, true);
}

/// Run the registered hooks before `fork` (`child` false) or in the child, in stage order.
fn run_fork_hooks(table: &[OnceLock<ForkHooks>], child: bool) {
    for hooks in table {
        if let Some(&(prepare, in_child)) = hooks.get() {
            if let Some(f) = if child { in_child } else { prepare } {
                f();
            }
        }
    }
}

/// The cores this process may use, read once: `available_parallelism` reads the cgroup and
/// affinity files at every call, and kernels ask for the thread count per loop.
pub fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
}

/// The process-wide runtime.
pub struct Runtime {
    omp_threads: AtomicUsize,
    shut_down: AtomicBool,
}

/// The runtime, created on first use.
pub fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| Runtime { omp_threads: AtomicUsize::new(0), shut_down: AtomicBool::new(false) })
}

impl Runtime {
    /// `MXSetNumOMPThreads`: the number of threads data-parallel kernels may use.
    pub fn set_kernel_threads(&self, n: i32) -> Result<()> {
        if n < 1 {
            return Err(Error::value(format!("number of OMP threads must be >= 1, got {n}")));
        }
        self.omp_threads.store(n as usize, Ordering::Relaxed);
        Ok(())
    }

    /// Whether `MXSetNumOMPThreads` was called.
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

    /// `MXNotifyShutdown`: idempotent. Calls that arrive afterwards (the frontend frees handles
    /// in `__del__` after it) still work.
    pub fn notify_shutdown(&self) {
        self.shut_down.store(true, Ordering::Release);
    }

    pub fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }
}

/// Name and state of every feature (`MXLibInfoFeatures`), in stock's order (runtime.py /
/// libinfo.h); CPU SIMD levels are detected at run time.
pub fn feature_list() -> Vec<(&'static CStr, bool)> {
    let simd = cpu_simd();
    vec![
        (c"CUDA", false),
        (c"CUDNN", false),
        (c"NCCL", false),
        (c"CUDA_RTC", false),
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
        assert!(!on("CUDA") && !on("TVM_OP") && !on("INT64_TENSOR_SIZE"));
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

    /// Hooks run in stage order, whatever order the stages registered in (here the reverse),
    /// and only the registered ones.
    #[test]
    fn hooks_run_in_stage_order_whatever_the_registration_order() {
        extern "C" fn engine_prepare() {
            ORDER.lock().unwrap().push("engine prepare");
        }
        extern "C" fn engine_child() {
            ORDER.lock().unwrap().push("engine child");
        }
        extern "C" fn kernel_child() {
            ORDER.lock().unwrap().push("kernel child");
        }
        let table: [OnceLock<ForkHooks>; FORK_STAGES] = [const { OnceLock::new() }; FORK_STAGES];
        table[ForkStage::KernelPool as usize].set((None, Some(kernel_child))).unwrap();
        table[ForkStage::Engine as usize].set((Some(engine_prepare), Some(engine_child))).unwrap();
        run_fork_hooks(&table, false);
        run_fork_hooks(&table, true);
        assert_eq!(*ORDER.lock().unwrap(), ["engine prepare", "engine child", "kernel child"]);
    }
}
