//! The registry table: every configuration variable the runtime knows, in one place.
//!
//! Owns: the list of [`VarSpec`]s, from seeds 000 and 001 (MXNet's environment reference; 001
//! wins where they disagree), plus a few variables of the stock frontend so that setting them
//! draws no typo warning. Nothing else in the crate names a default value: consumers ask the
//! registry.
//!
//! Where 000 and 001 disagree: `MXNET_GPU_COPY_NTHREADS` defaults to 2 (000: 1) and
//! `MXNET_CUDNN_AUTOTUNE_DEFAULT` takes 0, 1 or 2 (000: 0 or 1).
//!
//! `status` says honestly what each variable does in this build today; a capability that starts
//! reading a variable flips its row to `Active`.

use super::spec::{Reading, Status, VarSpec, VarType};

const ANY_INT: VarType = VarType::Int { min: i64::MIN, max: i64::MAX };
const POS_INT: VarType = VarType::Int { min: 1, max: i64::MAX };
/// Thread counts: a value beyond this is a typo, and would start that many threads.
const THREAD_COUNT: VarType = VarType::Int { min: 1, max: 1024 };
/// Allocation round sizes in bytes (up to 1 GiB).
const ROUND_BYTES: VarType = VarType::Int { min: 1, max: 1 << 30 };

/// Build one row; keeps the table below to one call per variable.
#[allow(clippy::too_many_arguments)]
const fn var(
    name: &'static str,
    ty: VarType,
    default: Option<&'static str>,
    reading: Reading,
    status: Status,
    category: &'static str,
    doc: &'static str,
) -> VarSpec {
    VarSpec { name, ty, default, reading, status, category, doc, fallback: None }
}

use Reading::{Dynamic, Once};
use Status::{Active, Frontend, Reserved};

const ENV: &str = "Execution environment";
const THREADS: &str = "Threads";
const MEMORY: &str = "Memory";
const ENGINE: &str = "Engine";
const EXEC: &str = "Execution";
const KVSTORE: &str = "Data communication (KVStore)";
const MEMONGER: &str = "Memonger";
const PROFILER: &str = "Profiler";
const OTHER: &str = "Other";
const TUNING: &str = "Operator tuning";
const FRONTEND: &str = "Python frontend";

/// Every known variable, grouped as in seed 001.
pub static VARS: &[VarSpec] = &[
    var("MXNET_LIBRARY_PATH", VarType::AbsPath, None, Dynamic, Frontend, ENV,
        "Absolute path of libmxnet.so; the Python frontend and the mxnet-rt loaders load this file."),
    // --- Threads ---
    var("MXNET_GPU_WORKER_NTHREADS", THREAD_COUNT, Some("2"), Once, Active, THREADS,
        "Maximum number of compute threads per GPU (each with its own CUDA stream)."),
    var("MXNET_GPU_COPY_NTHREADS", THREAD_COUNT, Some("2"), Once, Reserved, THREADS,
        "Maximum number of concurrent memory-copy threads per GPU."),
    var("MXNET_CPU_WORKER_NTHREADS", THREAD_COUNT, Some("1"), Once, Active, THREADS,
        "Number of CPU scheduling threads: how many operators run in parallel on the CPU."),
    var("MXNET_CPU_PRIORITY_NTHREADS", THREAD_COUNT, Some("4"), Once, Active, THREADS,
        "Number of threads for prioritized CPU operations."),
    var("MXNET_CPU_NNPACK_NTHREADS", THREAD_COUNT, Some("4"), Dynamic, Active, THREADS,
        "Threads of the Winograd convolution algorithm (this build's counterpart of NNPACK's fast convolutions; it has no NNPACK): float32 3x3 stride-1 convolutions chosen as `winograd` by the algorithm selection run on at most this many of the kernel threads."),
    var("MXNET_MP_WORKER_NTHREADS", THREAD_COUNT, Some("1"), Once, Active, THREADS,
        "CPU worker threads of the engine in a forked process (a DataLoader worker), in place of MXNET_CPU_WORKER_NTHREADS; kernels there run on one thread unless the process calls MXSetNumOMPThreads."),
    var("MXNET_MP_OPENCV_NUM_THREADS", VarType::Int { min: 0, max: 1024 }, Some("0"), Once, Active, THREADS,
        "Threads of image processing (what stock does with OpenCV: resizing and warping in mx.image, transforms.Resize and the image iterators' augmenters) in a forked process (a DataLoader worker); 0 and 1 run it on the calling thread."),
    // --- Memory ---
    var("MXNET_EXEC_ENABLE_INPLACE", VarType::Bool, Some("true"), Dynamic, Active, MEMORY,
        "In graph runs (CachedOp, executor), an operator that declares it writes its output over an intermediate input that nothing reads later (no gradient keeps it); false: always a new array."),
    var("NNVM_EXEC_MATCH_RANGE", VarType::Int { min: 0, max: 1 << 20 }, Some("16"), Dynamic, Active, MEMORY,
        "0 disables memory sharing between graph nodes: intermediate results (and in-place writes) are kept until the run ends. Above 0 an intermediate's memory returns to the pool after its last reader; the pool matches sizes by its own rounding, so the range value itself is not used."),
    var("MXNET_EXEC_NUM_TEMP", VarType::Int { min: 1, max: 64 }, Some("1"), Dynamic, Active, MEMORY,
        "Temporary workspaces per device, shared round robin by operators that need scratch memory (Convolution and its backward); operators sharing one run one at a time."),
    var("MXNET_GPU_MEM_POOL_RESERVE", VarType::Int { min: 0, max: 100 }, Some("5"), Once, Active, MEMORY,
        "Percentage of GPU memory kept free for things other than arrays: an allocation that would cut into it releases the pool's cache first."),
    var("MXNET_GPU_MEM_POOL_TYPE", VarType::Choice(&["Naive", "Round", "Unpooled"]), Some("Naive"), Once, Active, MEMORY,
        "GPU memory pool: Naive (exact sizes, cached), Round (rounded sizes, cached) or Unpooled."),
    var("MXNET_GPU_MEM_POOL_ROUND_LINEAR_CUTOFF", VarType::Int { min: 0, max: 62 }, Some("24"), Once, Active, MEMORY,
        "Round pool: below 2^T round to a power of two, above it to a multiple of 2^T."),
    var("MXNET_GPU_MEM_LARGE_ALLOC_ROUND_SIZE", ROUND_BYTES, Some("2097152"), Once, Active, MEMORY,
        "Naive pool: allocations larger than this are rounded up to a multiple of it; 1 disables."),
    var("MXNET_CPU_MEM_POOL_TYPE", VarType::Choice(&["Naive", "Round", "Unpooled"]), Some("Naive"), Once, Active, MEMORY,
        "CPU memory pool (as later MXNet versions name it): Naive, Round or Unpooled, as for GPUs."),
    var("MXNET_CPU_MEM_POOL_ROUND_LINEAR_CUTOFF", VarType::Int { min: 0, max: 62 }, Some("24"), Once, Active, MEMORY,
        "CPU Round pool: below 2^T round to a power of two, above it to a multiple of 2^T."),
    var("MXNET_CPU_MEM_LARGE_ALLOC_ROUND_SIZE", ROUND_BYTES, Some("2097152"), Once, Active, MEMORY,
        "CPU Naive pool: allocations larger than this are rounded up to a multiple of it; 1 disables."),
    // --- Engine ---
    var("MXNET_ENGINE_TYPE", VarType::Choice(&["NaiveEngine", "ThreadedEngine", "ThreadedEnginePerDevice"]),
        Some("ThreadedEnginePerDevice"), Once, Active, ENGINE,
        "Execution engine: NaiveEngine (synchronous), ThreadedEngine (one pool) or ThreadedEnginePerDevice."),
    var("MXNET_ENGINE_MAX_PENDING_OPS", VarType::Int { min: 0, max: 1 << 30 }, Some("0"), Once, Active, ENGINE,
        "mxnet-rt addition: bound on pushed but unfinished operations; a push beyond it waits for work to drain. 0: unbounded (stock)."),
    // --- Execution ---
    var("MXNET_EXEC_BULK_EXEC_INFERENCE", VarType::Bool, Some("1"), Dynamic, Active, EXEC,
        "Run a graph's whole forward (CachedOp, executor) as one engine task during inference (profiles show ImperativeBulk); 0: operator by operator."),
    var("MXNET_ELIMINATE_COMMON_EXPR", VarType::Bool, Some("1"), Dynamic, Active, EXEC,
        "Read when an executor is bound or a CachedOp made: operator nodes with the same operator, attributes and inputs are computed once (not those that write an input, draw random numbers or keep a state); a repeated graph output gets a _copy. 0 runs the graph as written."),
    var("MXNET_EXEC_BULK_EXEC_TRAIN", VarType::Bool, Some("1"), Dynamic, Active, EXEC,
        "In training, run graph forwards and every backward pass in bulks of MAX_NODE_TRAIN operators; 0: operator by operator. No bulking while the profiler aggregates statistics."),
    var("MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN", VarType::Int { min: 0, max: 1 << 16 }, Some("15"), Dynamic, Active, EXEC,
        "Most operators in one bulk during training; 0 or 1 turns training bulks off (as stock)."),
    // --- KVStore ---
    var("MXNET_KVSTORE_REDUCTION_NTHREADS", THREAD_COUNT, Some("4"), Dynamic, Active, KVSTORE,
        "Threads that sum a pushed array of at least MXNET_KVSTORE_BIGARRAY_BOUND elements (local and device stores); read at each push."),
    var("MXNET_KVSTORE_BIGARRAY_BOUND", POS_INT, Some("1000000"), Dynamic, Active, KVSTORE,
        "Elements from which a pushed array is summed on MXNET_KVSTORE_REDUCTION_NTHREADS threads; read at each push. (Partitioning across servers needs a distributed store, which this build lacks.)"),
    var("MXNET_KVSTORE_USETREE", VarType::Bool, Some("0"), Dynamic, Reserved, KVSTORE,
        "Use tree reduction for push and pull. Takes effect with several GPUs, which this build does not drive yet: a store sums on the host or its CPU contexts."),
    var("MXNET_KVSTORE_LOGTREE", VarType::Bool, Some("0"), Dynamic, Reserved, KVSTORE,
        "Log the generated reduction trees (with MXNET_KVSTORE_USETREE=1). Takes effect with several GPUs (not driven yet)."),
    var("MXNET_KVSTORE_TREE_ARRAY_BOUND", POS_INT, Some("10000000"), Dynamic, Reserved, KVSTORE,
        "Minimum array size for using several trees (with MXNET_KVSTORE_USETREE=1). Takes effect with several GPUs (not driven yet)."),
    var("MXNET_KVSTORE_TREE_BACKTRACK", VarType::Bool, Some("0"), Dynamic, Reserved, KVSTORE,
        "Generate trees by backtracking instead of Kernighan-Lin (with MXNET_KVSTORE_USETREE=1). Takes effect with several GPUs (not driven yet)."),
    var("MXNET_KVSTORE_TREE_LINK_USAGE_PENALTY", VarType::Float { min: 0.0, max: f64::MAX }, Some("0.7"), Dynamic, Reserved, KVSTORE,
        "Multiplicative penalty for using a link once, in tree generation. Takes effect with several GPUs (not driven yet)."),
    var("MXNET_ENABLE_GPU_P2P", VarType::Bool, Some("1"), Dynamic, Reserved, KVSTORE,
        "Use GPU peer-to-peer communication for the device kvstore when available. Takes effect with several GPUs (not driven yet)."),
    // --- Memonger ---
    var("MXNET_BACKWARD_DO_MIRROR", VarType::Bool, Some("0"), Dynamic, Active, MEMONGER,
        "Recorded calls of cheap operators (activations, pooling, element-wise; not Convolution, FullyConnected, Concat, SoftmaxOutput, Dropout, BatchNorm, dot) keep their inputs, not their outputs, and recompute them in backward; chains of such calls keep only the chain's first input. Read at each recorded call. Backward waits for the gradient work already pushed before each recomputation, so the recomputed values replace released memory; gradients are exact."),
    // --- Profiler ---
    var("MXNET_PROFILER_AUTOSTART", VarType::Bool, Some("0"), Once, Active, PROFILER,
        "Start the profiler when the library loads; write profile.json in the working directory."),
    var("MXNET_PROFILER_MODE", VarType::Bool, Some("0"), Once, Active, PROFILER,
        "0: profile symbolic operators only; 1: profile all operators."),
    // --- Other ---
    var("MXNET_CUDNN_AUTOTUNE_DEFAULT", VarType::Int { min: 0, max: 2 }, Some("1"), Dynamic, Active, OTHER,
        "Convolution algorithm tuning when cudnn_tune is None: 0 off, 1 limited workspace, 2 fastest."),
    var("MXNET_RT_CONV_ALGO_CACHE", VarType::Path, None, Dynamic, Active, OTHER,
        "File that keeps timed convolution algorithm choices across processes (mxnet-rt); unset: memory only."),
    var("MXNET_RT_CONV_ALGO_LOG", VarType::Bool, Some("0"), Dynamic, Active, OTHER,
        "Print the convolution algorithm chosen for each new problem (mxnet-rt)."),
    var("MXNET_CUDA_ALLOW_TENSOR_CORE", VarType::Bool, Some("1"), Once, Active, OTHER,
        "Allow Tensor Core use in CUDA operators; can only be set once in a process (float32 matrix products use them only with the next variable)."),
    var("MXNET_CUDA_TENSOR_OP_MATH_ALLOW_CONVERSION", VarType::Bool, Some("0"), Dynamic, Active, OTHER,
        "Allow float32 matrix products and convolutions on a GPU (dot, batch_dot, FullyConnected through cuBLAS, Convolution through cuDNN) to convert to the Tensor Cores' precision (TF32)."),
    var("MXNET_GLUON_REPO", VarType::Url, Some("https://apache-mxnet.s3-accelerate.dualstack.amazonaws.com/"), Dynamic, Frontend, OTHER,
        "Repository URL for Gluon datasets and pretrained models."),
    var("MXNET_HOME", VarType::Path, Some("~/.mxnet"), Dynamic, Frontend, OTHER,
        "Data directory, e.g. for downloaded Gluon models."),
    var("MXNET_MKLDNN_ENABLED", VarType::Bool, Some("1"), Dynamic, Active, OTHER,
        "The accelerated CPU path of graph runs (this build's counterpart of stock's MKLDNN fusion; it has no MKLDNN): a hybridized forward or executor run that records nothing computes each float32 CPU convolution with the BatchNorm (moving statistics), Activation relu, clip and elemwise_add that read only its result, as one operation whose outputs equal the unfused graph's (with memory sharing on: NNVM_EXEC_MATCH_RANGE above 0). 0: every operator runs on its own."),
    var("MXNET_MKLDNN_CACHE_NUM", VarType::Int { min: -1, max: i64::MAX }, Some("-1"), Once, Reserved, OTHER,
        "Number of entries the MKLDNN cache holds; -1 is unbounded."),
    var("MXNET_ENFORCE_DETERMINISM", VarType::Bool, Some("0"), Dynamic, Active, OTHER,
        "Use only deterministic algorithms; fail if none exists."),
    var("MXNET_CPU_PARALLEL_COPY_SIZE", POS_INT, Some("200000"), Dynamic, Active, OTHER,
        "Minimum number of elements for a multi-threaded CPU-to-CPU copy."),
    var("MXNET_STORAGE_FALLBACK_LOG_VERBOSE", VarType::Bool, Some("1"), Dynamic, Reserved, OTHER,
        "Log when an operator falls back from sparse to dense storage."),
    var("MXNET_SAFE_ACCUMULATION", VarType::Bool, Some("0"), Dynamic, Active, OTHER,
        "Accumulate float32 reductions (sum, mean, prod, norm, ...) and the softmax family in float64; float16 always accumulates in float32 here."),
    // --- Operator tuning ---
    VarSpec {
        fallback: Some("MXNET_ENABLE_OPERATOR_TUNING"),
        ..var("MXNET_USE_OPERATOR_TUNING", VarType::DTypeList, Some("1"), Once, Active, TUNING,
            "Operator tuning (when to parallelise): 0 off, 1 all dtypes, or a list such as float32,float16.")
    },
    var("MXNET_ENABLE_OPERATOR_TUNING", VarType::DTypeList, None, Once, Active, TUNING,
        "Name seed 001 also gives operator tuning; used when MXNET_USE_OPERATOR_TUNING is unset."),
    var("MXNET_USE_NUM_CORES_OPERATOR_TUNING", THREAD_COUNT, None, Once, Active, TUNING,
        "Number of cores operator tuning assumes; unset: all cores of the machine."),
    // --- Read by the stock Python frontend and its test utilities ---
    var("MXNET_ENABLE_CYTHON", VarType::Bool, Some("1"), Dynamic, Frontend, FRONTEND,
        "Let the Python frontend use its Cython modules when present."),
    var("MXNET_ENFORCE_CYTHON", VarType::Bool, Some("0"), Dynamic, Frontend, FRONTEND,
        "Make the Python frontend fail when its Cython modules are missing."),
    var("MXNET_TEST_SEED", ANY_INT, None, Dynamic, Frontend, FRONTEND,
        "Seed used by mxnet.test_utils for reproducible tests."),
    var("MXNET_MODULE_SEED", ANY_INT, None, Dynamic, Frontend, FRONTEND,
        "Module-level seed used by mxnet.test_utils."),
    var("MXNET_TEST_COUNT", POS_INT, None, Dynamic, Frontend, FRONTEND,
        "Number of repetitions for mxnet.test_utils.retry-style tests."),
];

/// Variables read by the runtime itself (status `Active`); kept as a function so tests can
/// check the claim against the code that reads them.
pub fn active() -> impl Iterator<Item = &'static VarSpec> {
    VARS.iter().filter(|v| v.status == Active)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_unique_and_defaults_parse() {
        let mut seen = HashSet::new();
        for v in VARS {
            assert!(seen.insert(v.name), "duplicate {}", v.name);
            assert!(v.name.starts_with("MXNET_") || v.name.starts_with("NNVM_"), "{}", v.name);
            assert!(!v.doc.is_empty());
            if let Some(d) = v.default {
                v.ty.parse(v.name, d).unwrap_or_else(|e| panic!("default of {}: {e}", v.name));
            }
            if let Some(f) = v.fallback {
                let target = VARS.iter().find(|x| x.name == f).expect("fallback is known");
                assert_eq!(target.ty, v.ty, "fallback {f} must share the type of {}", v.name);
            }
        }
    }

    /// Every variable named in the two seed documents is in the table.
    #[test]
    fn every_seed_variable_is_registered() {
        let seeds = concat!(
            include_str!("../../../../tests/data/seed_vars_000.txt"),
            include_str!("../../../../tests/data/seed_vars_001.txt")
        );
        let known: HashSet<&str> = VARS.iter().map(|v| v.name).collect();
        let mut count = 0;
        for name in seeds.split_whitespace() {
            count += 1;
            assert!(known.contains(name), "{name} from the seeds is not in the registry");
        }
        assert!(count >= 40, "seed name lists look truncated ({count})");
    }

    #[test]
    fn seed_001_wins_where_seeds_disagree() {
        let get = |n: &str| VARS.iter().find(|v| v.name == n).unwrap();
        assert_eq!(get("MXNET_GPU_COPY_NTHREADS").default, Some("2"));
        assert_eq!(get("MXNET_CUDNN_AUTOTUNE_DEFAULT").ty, VarType::Int { min: 0, max: 2 });
        assert_eq!(get("MXNET_CUDA_ALLOW_TENSOR_CORE").reading, Reading::Once);
    }
}

#[cfg(test)]
mod strictness {
    use super::*;
    use crate::config::{MapEnv, Registry};

    /// A value each type must refuse.
    fn bad_sample(ty: &VarType) -> String {
        match ty {
            VarType::Int { min, .. } if *min > i64::MIN => (min - 1).to_string(),
            VarType::Int { .. } => "12abc".into(),
            VarType::Bool => "maybe".into(),
            VarType::Float { .. } => "nan".into(),
            VarType::Choice(_) => "Bogus".into(),
            VarType::AbsPath => "relative/libmxnet.so".into(),
            VarType::Path => "  ".into(),
            VarType::Url => "not a url".into(),
            VarType::DTypeList => "float99".into(),
        }
    }

    /// Every variable of the table refuses a bad value at its use and through MXSetEnv, with
    /// a message naming the variable and the value, and keeps accepting its default.
    #[test]
    fn every_variable_is_strict() {
        for spec in VARS {
            let bad = bad_sample(&spec.ty);
            let reg = Registry::new(VARS, Box::new(MapEnv::with(&[(spec.name, bad.as_str())])));
            let e = reg.get(spec.name, "test").unwrap_err().to_string();
            assert!(e.starts_with("ValueError: "), "{e}");
            assert!(e.contains(spec.name) && e.contains(&format!("{bad:?}")), "{e}");
            assert!(e.contains(&spec.ty.accepted()), "{e}");
            assert!(reg.set_env(spec.name, Some(&bad)).is_err(), "{}", spec.name);
            if let Some(d) = spec.default {
                reg.set_env(spec.name, Some(d)).unwrap();
                let got = reg.get(spec.name, "test").unwrap();
                assert_eq!(got.value, Some(spec.ty.parse(spec.name, d).unwrap()), "{}", spec.name);
            }
        }
    }
}
