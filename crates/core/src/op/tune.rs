//! Convolution algorithm selection (seed 003's `cudnn_tune` over
//! `MXNET_CUDNN_AUTOTUNE_DEFAULT`, MegEngine's fast-run cache from seed 002).
//!
//! Owns: the tuning mode resolved per call (per-operator `cudnn_tune` wins over the global
//! default), the in-memory cache of timed choices keyed by (shapes, dtype, parameters) and its
//! optional file, and the determinism filter (`MXNET_ENFORCE_DETERMINISM`).
//!
//! Modes: `off` takes the operator's heuristic choice without timing; `limited_workspace`
//! times every eligible algorithm whose workspace fits the operator's `workspace` limit;
//! `fastest` times every eligible algorithm whatever its workspace. Each algorithm is timed
//! once per key (its run also computes the call's output); the fastest is cached in memory
//! and, when `MXNET_RT_CONV_ALGO_CACHE` names a file, there too (loaded at first use, updated
//! by write-then-rename; an unreadable or malformed file is reported once and ignored).
//! `MXNET_ENFORCE_DETERMINISM=1` keeps only algorithms whose [`AlgoInfo::deterministic`]
//! property is set; every CPU convolution algorithm of this build is deterministic (a fixed
//! summation order, no atomics), so the filter never removes one today.
//! `MXNET_RT_CONV_ALGO_LOG=1` prints one line per selection; [`Tuner::last_choice`] gives the
//! latest choice for a key (for profiler event arguments).

use crate::config::{Registry, Source, Value};
use crate::error::{Error, Result};
use crate::sync::Mutex;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

const CONSUMER: &str = "Convolution algorithm selection";
const FILE_HEADER: &str = "# mxnet-rt convolution algorithm cache v1";

/// How algorithms are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The operator's heuristic; nothing is timed.
    Off,
    /// Time the algorithms whose workspace fits the operator's limit.
    LimitedWorkspace,
    /// Time every algorithm.
    Fastest,
}

impl Mode {
    /// From a `cudnn_tune` parameter value.
    pub fn from_param(s: &str) -> Option<Mode> {
        match s {
            "off" => Some(Mode::Off),
            "limited_workspace" => Some(Mode::LimitedWorkspace),
            "fastest" => Some(Mode::Fastest),
            _ => None,
        }
    }
    /// From `MXNET_CUDNN_AUTOTUNE_DEFAULT` (0, 1, 2).
    pub fn from_level(v: i64) -> Option<Mode> {
        match v {
            0 => Some(Mode::Off),
            1 => Some(Mode::LimitedWorkspace),
            2 => Some(Mode::Fastest),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::LimitedWorkspace => "limited_workspace",
            Mode::Fastest => "fastest",
        }
    }
}

/// The mode of one call: the operator's `cudnn_tune` when given, else the global default.
pub fn resolve_mode(reg: &Registry, per_op: Option<&str>) -> Result<(Mode, Source)> {
    let per_call =
        match per_op {
            Some(s) => Some(Mode::from_param(s).ok_or_else(|| {
                Error::value(format!("cudnn_tune must be off, limited_workspace or fastest, got {s:?}"))
            })?),
            None => None,
        };
    let (mode, source) = reg.resolve_with("MXNET_CUDNN_AUTOTUNE_DEFAULT", per_call, CONSUMER, |v: &Value| {
        v.as_int()
            .and_then(Mode::from_level)
            .ok_or_else(|| Error::internal(format!("MXNET_CUDNN_AUTOTUNE_DEFAULT read as {v:?}")))
    })?;
    Ok((mode.unwrap_or(Mode::LimitedWorkspace), source))
}

/// What the selector knows about one algorithm.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AlgoInfo {
    pub name: &'static str,
    /// Same inputs give bit-identical outputs on every run.
    pub deterministic: bool,
    /// Workspace bytes the algorithm needs for this problem.
    pub workspace: usize,
    /// Estimated seconds for this problem (0: no estimate). A timing mode does not time an
    /// algorithm estimated at more than [`PRUNE`] times the best estimate: the first call of
    /// a network then times only the close calls, instead of running every layer with an
    /// algorithm that cannot win (a direct convolution of a 3×3 layer with 64 filters is ten
    /// times slower than im2col + GEMM).
    pub estimate: f64,
}

/// See [`AlgoInfo::estimate`].
pub const PRUNE: f64 = 4.0;

/// A selection, as [`Tuner::last_choice`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub algo: &'static str,
    pub mode: Mode,
    /// How it was made: "heuristic", "estimated" (the one algorithm left after
    /// [`AlgoInfo::estimate`]s), "timed", "cached" or "cache file".
    pub how: &'static str,
}

/// One selection problem.
pub struct Request<'a> {
    /// Identifies the problem: operator, shapes, dtype and parameters.
    pub key: String,
    /// The operator's `cudnn_tune` (`None`: use the global default).
    pub per_op: Option<&'a str>,
    /// The operator's workspace limit in bytes.
    pub workspace_limit: usize,
    pub algos: &'a [AlgoInfo],
    /// The index `off` mode uses.
    pub heuristic: usize,
}

/// The selector: its cache, the files it loaded and counters for tests.
#[derive(Default)]
pub struct Tuner {
    /// Key → (algorithm name, whether it came from the cache file).
    cache: Mutex<HashMap<String, (String, bool)>>,
    loaded: Mutex<HashSet<PathBuf>>,
    last: Mutex<HashMap<String, Choice>>,
    timings: AtomicUsize,
}

/// The process-wide selector.
pub fn global() -> &'static Tuner {
    static T: OnceLock<Tuner> = OnceLock::new();
    T.get_or_init(Tuner::default)
}

fn warn(msg: String) {
    eprintln!("[mxnet-rt] warning: {msg}");
}

/// Drop from `eligible` the algorithms estimated at more than [`PRUNE`] times the best
/// estimate (after the cache was consulted: a cached or measured choice stands); whether any
/// was dropped.
fn prune(req: &Request, eligible: &mut Vec<usize>) -> bool {
    let est = |i: usize| req.algos[i].estimate;
    let best = eligible.iter().map(|&i| est(i)).filter(|&e| e > 0.0).fold(f64::INFINITY, f64::min);
    let before = eligible.len();
    eligible.retain(|&i| est(i) <= 0.0 || est(i) <= PRUNE * best);
    eligible.len() < before
}

impl Tuner {
    /// How many algorithm runs were timed so far.
    pub fn timings(&self) -> usize {
        self.timings.load(Ordering::Relaxed)
    }

    /// The latest choice for `key` (a [`Request::key`]).
    pub fn last_choice(&self, key: &str) -> Option<Choice> {
        self.last.lock().get(key).cloned()
    }

    /// Choose an algorithm for `req` and leave the call's output computed by it: `run(i)`
    /// computes the output with algorithm `i`. Returns the chosen index.
    pub fn select(&self, reg: &Registry, req: &Request, mut run: impl FnMut(usize) -> Result<()>) -> Result<usize> {
        self.select_timed(reg, req, |i| {
            let t = Instant::now();
            run(i)?;
            Ok(t.elapsed().as_secs_f64())
        })
    }

    /// As [`Tuner::select`], with `run(i)` returning how many seconds algorithm `i` took: for
    /// a caller whose algorithms must be warmed up before they are timed (cuDNN's first call
    /// of an algorithm prepares it) or whose work finishes elsewhere (a GPU).
    pub fn select_timed(
        &self,
        reg: &Registry,
        req: &Request,
        mut run: impl FnMut(usize) -> Result<f64>,
    ) -> Result<usize> {
        let (mode, _) = resolve_mode(reg, req.per_op)?;
        let det = reg.get_bool("MXNET_ENFORCE_DETERMINISM", CONSUMER)?.unwrap_or(false);
        let mut eligible: Vec<usize> = (0..req.algos.len()).filter(|&i| !det || req.algos[i].deterministic).collect();
        if eligible.is_empty() {
            return Err(Error::value(format!(
                "{}: MXNET_ENFORCE_DETERMINISM is set but no deterministic algorithm exists for this problem",
                req.key
            )));
        }
        if mode == Mode::LimitedWorkspace {
            let fits: Vec<usize> =
                eligible.iter().copied().filter(|&i| req.algos[i].workspace <= req.workspace_limit).collect();
            eligible = if fits.is_empty() {
                // Nothing fits: the algorithm with the least workspace.
                vec![*eligible.iter().min_by_key(|&&i| req.algos[i].workspace).expect("non-empty")]
            } else {
                fits
            };
        }
        let (chosen, how) = if mode == Mode::Off || eligible.len() == 1 {
            let i = if eligible.contains(&req.heuristic) { req.heuristic } else { eligible[0] };
            run(i)?;
            (i, "heuristic")
        } else {
            let full_key = match mode {
                Mode::LimitedWorkspace => {
                    format!("{};mode={};ws={};det={}", req.key, mode.name(), req.workspace_limit, det as u8)
                }
                _ => format!("{};mode={};det={}", req.key, mode.name(), det as u8),
            };
            let file = reg.get_str("MXNET_RT_CONV_ALGO_CACHE", CONSUMER).unwrap_or_else(|e| {
                warn(format!("{e}; the algorithm cache file is not used"));
                None
            });
            if let Some(f) = file.as_deref() {
                self.load_file(Path::new(f));
            }
            let cached = self.cache.lock().get(&full_key).cloned();
            match cached.and_then(|(name, from_file)| {
                eligible.iter().copied().find(|&i| req.algos[i].name == name).map(|i| (i, from_file))
            }) {
                Some((i, from_file)) => {
                    run(i)?;
                    (i, if from_file { "cache file" } else { "cached" })
                }
                None if prune(req, &mut eligible) && eligible.len() == 1 => {
                    // Not measured, so not cached: the estimate is cheap to make again.
                    run(eligible[0])?;
                    (eligible[0], "estimated")
                }
                None => {
                    let mut best = (eligible[0], f64::INFINITY);
                    for &i in &eligible {
                        let secs = run(i)?;
                        self.timings.fetch_add(1, Ordering::Relaxed);
                        if secs < best.1 {
                            best = (i, secs);
                        }
                    }
                    if Some(&best.0) != eligible.last() {
                        run(best.0)?;
                    }
                    self.cache.lock().insert(full_key, (req.algos[best.0].name.to_string(), false));
                    if let Some(f) = file {
                        self.save_file(Path::new(&f));
                    }
                    (best.0, "timed")
                }
            }
        };
        let choice = Choice { algo: req.algos[chosen].name, mode, how };
        crate::profiler::annotate("algo", choice.algo);
        crate::profiler::annotate("algo_selection", how);
        if reg.get_bool("MXNET_RT_CONV_ALGO_LOG", CONSUMER)?.unwrap_or(false) {
            eprintln!("[mxnet-rt] {}: algorithm {} ({how}, mode {})", req.key, choice.algo, mode.name());
        }
        self.last.lock().insert(req.key.clone(), choice);
        Ok(chosen)
    }

    /// Merge `path` into the cache (once per path).
    fn load_file(&self, path: &Path) {
        if !self.loaded.lock().insert(path.to_path_buf()) {
            return;
        }
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => {
                warn(format!("MXNET_RT_CONV_ALGO_CACHE={}: cannot read ({e}); ignored", path.display()));
                return;
            }
        };
        match parse_cache(&text) {
            Ok(entries) => {
                let mut c = self.cache.lock();
                for (k, v) in entries {
                    c.entry(k).or_insert((v, true));
                }
            }
            Err(line) => {
                warn(format!(
                    "MXNET_RT_CONV_ALGO_CACHE={}: malformed line {line}; the file is ignored",
                    path.display()
                ));
            }
        }
    }

    fn save_file(&self, path: &Path) {
        let mut entries: Vec<(String, String)> =
            self.cache.lock().iter().map(|(k, v)| (k.clone(), v.0.clone())).collect();
        entries.sort();
        let mut text = format!("{FILE_HEADER}\n");
        for (k, v) in entries {
            text.push_str(&format!("{k}\t{v}\n"));
        }
        let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
        let r = std::fs::write(&tmp, text).and_then(|_| std::fs::rename(&tmp, path));
        if let Err(e) = r {
            let _ = std::fs::remove_file(&tmp);
            warn(format!("MXNET_RT_CONV_ALGO_CACHE={}: cannot write ({e})", path.display()));
        }
    }
}

/// The entries of a cache file, or the number of the first malformed line.
fn parse_cache(text: &str) -> std::result::Result<Vec<(String, String)>, usize> {
    let mut lines = text.lines().enumerate();
    match lines.next() {
        Some((_, h)) if h.trim() == FILE_HEADER => {}
        _ => return Err(1),
    }
    let mut out = Vec::new();
    for (n, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let (k, v) = line.split_once('\t').ok_or(n + 1)?;
        if k.is_empty() || v.is_empty() || v.contains('\t') || !v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(n + 1);
        }
        out.push((k.to_string(), v.to_string()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{vars::VARS, MapEnv};

    fn reg(pairs: &[(&str, &str)]) -> Registry {
        Registry::new(VARS, Box::new(MapEnv::with(pairs)))
    }

    const ALGOS: &[AlgoInfo] = &[
        AlgoInfo { name: "direct", deterministic: true, workspace: 0, estimate: 0.0 },
        AlgoInfo { name: "im2col_gemm", deterministic: true, workspace: 1 << 20, estimate: 0.0 },
        AlgoInfo { name: "racy", deterministic: false, workspace: 0, estimate: 0.0 },
    ];

    fn req(key: &str, per_op: Option<&'static str>, limit: usize) -> Request<'static> {
        Request { key: key.to_string(), per_op, workspace_limit: limit, algos: ALGOS, heuristic: 1 }
    }

    #[test]
    fn per_op_beats_global_and_global_default_applies() {
        let r = reg(&[("MXNET_CUDNN_AUTOTUNE_DEFAULT", "2")]);
        assert_eq!(resolve_mode(&r, Some("off")).unwrap(), (Mode::Off, Source::PerCall));
        assert_eq!(resolve_mode(&r, None).unwrap(), (Mode::Fastest, Source::Environment));
        let r = reg(&[]);
        assert_eq!(resolve_mode(&r, None).unwrap(), (Mode::LimitedWorkspace, Source::Default));
        // A per-op value means the variable is not read, so a bad one cannot fail the call.
        let r = reg(&[("MXNET_CUDNN_AUTOTUNE_DEFAULT", "7")]);
        assert!(resolve_mode(&r, None).is_err());
        assert_eq!(resolve_mode(&r, Some("fastest")).unwrap().0, Mode::Fastest);
    }

    #[test]
    fn off_uses_the_heuristic_without_timing() {
        let t = Tuner::default();
        let r = reg(&[("MXNET_CUDNN_AUTOTUNE_DEFAULT", "0")]);
        let mut ran = Vec::new();
        let i = t
            .select(&r, &req("k", None, 0), |i| {
                ran.push(i);
                Ok(())
            })
            .unwrap();
        assert_eq!((i, ran, t.timings()), (1, vec![1], 0));
        assert_eq!(t.last_choice("k").unwrap().how, "heuristic");
    }

    #[test]
    fn estimates_keep_hopeless_algorithms_from_being_timed() {
        let t = Tuner::default();
        let r = reg(&[]);
        let mut algos = [ALGOS[0], ALGOS[1]];
        algos[0].estimate = 10.0;
        algos[1].estimate = 1.0;
        let rq = |key: &str, algos: &'static [AlgoInfo]| Request {
            key: key.to_string(),
            per_op: Some("fastest"),
            workspace_limit: 0,
            algos,
            heuristic: 0,
        };
        let leaked: &'static [AlgoInfo] = Box::leak(Box::new(algos));
        let mut ran = Vec::new();
        let i = t
            .select(&r, &rq("far", leaked), |i| {
                ran.push(i);
                Ok(())
            })
            .unwrap();
        assert_eq!((i, ran, t.timings()), (1, vec![1], 0));
        assert_eq!(t.last_choice("far").unwrap().how, "estimated");
        // Within PRUNE of each other: both are timed.
        algos[0].estimate = 3.0;
        let close: &'static [AlgoInfo] = Box::leak(Box::new(algos));
        t.select(&r, &rq("close", close), |_| Ok(())).unwrap();
        assert_eq!(t.timings(), 2);
        assert_eq!(t.last_choice("close").unwrap().how, "timed");
        // `off` still takes the heuristic, whatever the estimates say.
        let off = reg(&[("MXNET_CUDNN_AUTOTUNE_DEFAULT", "0")]);
        let i = t.select(&off, &Request { per_op: None, ..rq("off", leaked) }, |_| Ok(())).unwrap();
        assert_eq!((i, t.last_choice("off").unwrap().how), (0, "heuristic"));
    }

    #[test]
    fn second_call_uses_the_cache() {
        let t = Tuner::default();
        let r = reg(&[]);
        let mut ran = Vec::new();
        let first = t
            .select(&r, &req("k", Some("fastest"), 0), |i| {
                ran.push(i);
                Ok(())
            })
            .unwrap();
        assert_eq!(t.timings(), 3);
        // The output is left computed by the chosen algorithm.
        assert_eq!(*ran.last().unwrap(), first);
        let again = t.select(&r, &req("k", Some("fastest"), 0), |_| Ok(())).unwrap();
        assert_eq!((again, t.timings()), (first, 3));
        assert_eq!(t.last_choice("k").unwrap().how, "cached");
        // Another key is timed again.
        t.select(&r, &req("k2", Some("fastest"), 0), |_| Ok(())).unwrap();
        assert_eq!(t.timings(), 6);
    }

    #[test]
    fn workspace_limit_excludes_big_algorithms() {
        let t = Tuner::default();
        let r = reg(&[]);
        let mut ran = HashSet::new();
        t.select(&r, &req("k", Some("limited_workspace"), 1024), |i| {
            ran.insert(i);
            Ok(())
        })
        .unwrap();
        assert!(!ran.contains(&1));
        assert_eq!(t.timings(), 2);
        let mut ran = HashSet::new();
        t.select(&r, &req("k", Some("fastest"), 1024), |i| {
            ran.insert(i);
            Ok(())
        })
        .unwrap();
        assert!(ran.contains(&1));
    }

    #[test]
    fn determinism_filters_by_property() {
        let t = Tuner::default();
        let r = reg(&[("MXNET_ENFORCE_DETERMINISM", "1")]);
        let mut ran = HashSet::new();
        t.select(&r, &req("k", Some("fastest"), 0), |i| {
            ran.insert(i);
            Ok(())
        })
        .unwrap();
        assert!(!ran.contains(&2) && ran.len() == 2);
        let only_racy = [ALGOS[2]];
        let bad =
            Request { key: "k".into(), per_op: Some("fastest"), workspace_limit: 0, algos: &only_racy, heuristic: 0 };
        assert!(t.select(&r, &bad, |_| Ok(())).is_err());
    }

    #[test]
    fn cache_file_roundtrip_and_malformed_file() {
        let dir = std::env::temp_dir().join(format!("mxnet-rt-tune-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("algos.txt");
        let p = path.to_str().unwrap();
        let r = reg(&[("MXNET_RT_CONV_ALGO_CACHE", p)]);
        let t = Tuner::default();
        let chosen = t.select(&r, &req("k", Some("fastest"), 0), |_| Ok(())).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with(FILE_HEADER) && text.contains(ALGOS[chosen].name));
        // A fresh selector reads the file instead of timing.
        let t2 = Tuner::default();
        assert_eq!(t2.select(&r, &req("k", Some("fastest"), 0), |_| Ok(())).unwrap(), chosen);
        assert_eq!((t2.timings(), t2.last_choice("k").unwrap().how), (0, "cache file"));
        // Malformed: warned about, ignored, timing happens; the file is then rewritten.
        std::fs::write(&path, "garbage\x00\nmore").unwrap();
        let t3 = Tuner::default();
        t3.select(&r, &req("k", Some("fastest"), 0), |_| Ok(())).unwrap();
        assert_eq!(t3.timings(), 3);
        assert!(std::fs::read_to_string(&path).unwrap().starts_with(FILE_HEADER));
        assert_eq!(parse_cache(&format!("{FILE_HEADER}\nkey-without-tab\n")), Err(2));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
