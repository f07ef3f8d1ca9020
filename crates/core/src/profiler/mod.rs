//! The profiler: what runs, on which device and thread, for how long; memory in use per
//! device; the user's own domains, tasks, frames, events, counters and markers.
//!
//! Owns: the profiler's configuration (stock's `MXSetProcessProfilerConfig` keys), its state
//! (stopped, running, paused), the recording switches that event sites check, dumps (chrome
//! trace files, always complete JSON) and the aggregate statistics behind `profiler.dumps()`,
//! autostart (`MXNET_PROFILER_AUTOSTART`, `MXNET_PROFILER_MODE`) and the final dump at exit.
//!
//! The `no-profiler-sites` cargo feature compiles the operation and API event sites out; it
//! exists only so that `bench/profiler_bench.py` can measure what the stopped sites cost.
//!
//! Event sites (engine operations, C API calls, storage events, the objects) check one
//! relaxed atomic ([`ops_on`], [`api_on`], [`running`]) and, when it says so, append to their
//! thread's own buffer ([`buffer`]); dumps drain the buffers. Control calls and dumps are
//! serialised on one lock that event sites never take.

pub mod aggregate;
pub mod buffer;
pub mod objects;
pub mod trace;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::sync::{Condvar, Mutex};
use aggregate::{Aggregate, SortBy};
use buffer::{now, Event, Phase, Proc, Text};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use trace::Trace;

/// Stock's profiler mode bits.
pub const SYMBOLIC: u32 = 1;
pub const IMPERATIVE: u32 = 2;
pub const API: u32 = 4;
pub const MEMORY: u32 = 8;
pub const ALL: u32 = SYMBOLIC | IMPERATIVE | API | MEMORY;
/// Set while running and not paused, even when no mode bit is (user objects record then).
const ON: u32 = 16;
/// Set with ON when aggregate statistics are collected.
const AGGREGATE: u32 = 32;

/// The process's profiler. It records every thread's operations and calls into one trace
/// and one set of statistics, so it is one per process (tests that run it take
/// [`TEST_LOCK`]); the runtime writes its trace at shutdown and exit.
struct Profiler {
    /// What is being recorded right now: mode bits | ON, or 0.
    flags: AtomicU32,
    /// Whether [`set_scope`] was ever called: until then, pushes skip the [`SCOPE`] slot.
    scope_used: AtomicBool,
    /// Whether [`annotate`] was ever called: until then, operations skip the [`OP_ARGS`]
    /// slot.
    args_used: AtomicBool,
    /// Configuration, run state, the trace and statistics collected so far, the dump thread.
    state: Mutex<Option<State>>,
    /// Wakes the continuous-dump thread to stop.
    dumper_cv: Condvar,
}

static PROFILER: Profiler = Profiler {
    flags: AtomicU32::new(0),
    scope_used: AtomicBool::new(false),
    args_used: AtomicBool::new(false),
    state: Mutex::new(None),
    dumper_cv: Condvar::new(),
};

/// Whether engine operations of this kind are being recorded.
#[inline]
pub fn ops_on(symbolic: bool) -> bool {
    if cfg!(feature = "no-profiler-sites") {
        return false;
    }
    PROFILER.flags.load(Ordering::Relaxed) & if symbolic { SYMBOLIC } else { IMPERATIVE } != 0
}

/// Whether C API calls are being recorded.
#[inline]
pub fn api_on() -> bool {
    if cfg!(feature = "no-profiler-sites") {
        return false;
    }
    PROFILER.flags.load(Ordering::Relaxed) & API != 0
}

/// Whether the profiler runs (and is not paused).
#[inline]
pub fn running() -> bool {
    PROFILER.flags.load(Ordering::Relaxed) & ON != 0
}

/// Whether the profiler runs with aggregate statistics: the engine then bulks nothing, so
/// the statistics list every operator (stock's `AggregateRunning`).
#[inline]
pub fn aggregate_running() -> bool {
    PROFILER.flags.load(Ordering::Relaxed) & AGGREGATE != 0
}

thread_local! {
    /// Extra `args` for the operation running on this thread (e.g. the convolution algorithm).
    static OP_ARGS: RefCell<Option<String>> = const { RefCell::new(None) };
    /// The scope set by `MXSetProfilerScope` on this thread.
    static SCOPE: RefCell<Option<Arc<str>>> = const { RefCell::new(None) };
    /// The custom operator whose callback runs on this thread ([`custom_scope`]).
    static CUSTOM: RefCell<Option<Arc<str>>> = const { RefCell::new(None) };
}

/// The category of operator events, and of events inside custom operators' callbacks.
const OPERATOR: &str = "operator";
const CUSTOM_OPERATOR: &str = "Custom Operator";

/// Run `f`, a frontend callback of the custom operator `op_type`: recorded as
/// `<op_type>::pure_python` in the `Custom Operator` category, and operators that this thread
/// pushes meanwhile are named `<op_type>::<operator>` in that category (as stock shows them).
pub fn custom_scope<R>(op_type: &str, f: impl FnOnce() -> R) -> R {
    if !ops_on(false) && !ops_on(true) {
        return f();
    }
    let ty: Arc<str> = Arc::from(op_type);
    let previous = CUSTOM.with(|c| c.borrow_mut().replace(ty.clone()));
    let start = now();
    let r = f();
    let end = now();
    CUSTOM.with(|c| *c.borrow_mut() = previous);
    buffer::record(Event {
        name: Text::Shared(Arc::from(format!("{ty}::pure_python"))),
        cat: Text::Static(CUSTOM_OPERATOR),
        proc: Proc::CustomOp,
        tid: buffer::current_tid(),
        ts: start,
        phase: Phase::Complete { dur: end - start },
        args: None,
    });
    r
}

/// The name an operator pushed from this thread is profiled under: `<op_type>::<name>` inside
/// a custom operator's callback, else `name` itself.
pub fn op_name(name: &Arc<str>) -> Arc<str> {
    match CUSTOM.try_with(|c| c.borrow().clone()).ok().flatten() {
        Some(ty) => crate::intern::intern(&format!("{ty}::{name}")),
        None => name.clone(),
    }
}

/// Attach `"key":"value"` to the event of the operation running on this thread (recorded
/// only when operations are being recorded).
pub fn annotate(key: &str, value: &str) {
    if PROFILER.flags.load(Ordering::Relaxed) & (SYMBOLIC | IMPERATIVE) == 0 {
        return;
    }
    let mut kv = String::new();
    trace::json_str(&mut kv, key);
    kv.push(':');
    trace::json_str(&mut kv, value);
    PROFILER.args_used.store(true, Ordering::Relaxed);
    let _ = OP_ARGS.try_with(|a| {
        let mut a = a.borrow_mut();
        match a.as_mut() {
            Some(s) => {
                s.push(',');
                s.push_str(&kv);
            }
            None => *a = Some(kv),
        }
    });
}

/// `MXSetProfilerScope`: the scope operations pushed from this thread are tagged with.
pub fn set_scope(scope: &str) {
    PROFILER.scope_used.store(true, Ordering::Relaxed);
    let _ = SCOPE.try_with(|s| *s.borrow_mut() = (!scope.is_empty()).then(|| Arc::from(scope)));
}

/// This thread's profiler scope, if one is set (captured when an operation is pushed).
pub fn scope() -> Option<Arc<str>> {
    if !PROFILER.scope_used.load(Ordering::Relaxed) {
        return None;
    }
    SCOPE.try_with(|s| s.borrow().clone()).ok().flatten()
}

/// The args [`annotate`]d on this thread since the last call.
fn take_args() -> Option<String> {
    if !PROFILER.args_used.load(Ordering::Relaxed) {
        return None;
    }
    OP_ARGS.try_with(|a| a.borrow_mut().take()).ok().flatten()
}

/// Start of a recorded operation: `Some(start)` when operations of its kind are recorded.
#[inline]
pub fn op_begin(symbolic: bool) -> Option<f64> {
    if ops_on(symbolic) {
        take_args();
        Some(now())
    } else {
        None
    }
}

/// Run `f`, a synchronous operation, recording it if operations of its kind are recorded.
#[inline]
pub fn profiled<R>(
    symbolic: bool,
    name: Option<&Arc<str>>,
    ctx: Context,
    scope: Option<&Arc<str>>,
    f: impl FnOnce() -> R,
) -> R {
    match op_begin(symbolic) {
        Some(start) => {
            let r = f();
            op_end(start, name, ctx, None, scope);
            r
        }
        None => f(),
    }
}

/// End of a recorded operation started at `start` on thread `tid` (None: this thread).
pub fn op_end(start: f64, name: Option<&Arc<str>>, ctx: Context, tid: Option<u32>, scope: Option<&Arc<str>>) {
    let end = now();
    let mut args = take_args();
    if let Some(s) = scope {
        let a = args.get_or_insert_with(String::new);
        if !a.is_empty() {
            a.push(',');
        }
        a.push_str("\"scope\":");
        trace::json_str(a, s);
    }
    match (tid, args) {
        (None, None) => buffer::record_op(name.cloned(), ctx, start, end - start),
        (tid, args) => buffer::record(op_event(
            name.cloned(),
            ctx,
            tid.unwrap_or_else(buffer::current_tid),
            start,
            end - start,
            args,
        )),
    }
}

/// The event of an operation.
pub(crate) fn op_event(
    name: Option<Arc<str>>,
    ctx: Context,
    tid: u32,
    ts: f64,
    dur: f64,
    args: Option<String>,
) -> Event {
    // Only names given by `op_name` inside a custom operator's callback contain "::".
    let cat = if name.as_ref().is_some_and(|n| n.contains("::")) { CUSTOM_OPERATOR } else { OPERATOR };
    Event {
        name: name.map_or(Text::Static("<unnamed>"), Text::Shared),
        cat: Text::Static(cat),
        proc: Proc::Device(ctx),
        tid,
        ts,
        phase: Phase::Complete { dur },
        args: args.map(String::into_boxed_str),
    }
}

/// Start timing a C API call (when [`api_on`]); [`api_call`] records it.
#[inline]
pub fn api_begin() -> f64 {
    buffer::api_begin()
}

/// Record the C API call that [`api_begin`] returned `start` for.
#[inline]
pub fn api_call(api: &'static str, start: f64) {
    buffer::record_api(api, start);
}

/// The event of a C API call.
pub(crate) fn api_event(api: &'static str, tid: u32, ts: f64, dur: f64) -> Event {
    Event {
        name: Text::Static(api),
        cat: Text::Static("MXNET_C_API"),
        proc: Proc::Api,
        tid,
        ts,
        phase: Phase::Complete { dur },
        args: None,
    }
}

/// The kvstore process a profiler call addresses (`profile_process`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessKind {
    Worker,
    Server,
}

impl ProcessKind {
    pub fn from_code(code: i32) -> Result<Self> {
        match code {
            0 => Ok(ProcessKind::Worker),
            1 => Err(Error::not_supported("profiling a kvstore server process")),
            _ => Err(Error::value(format!("profile_process code {code} is not valid (0 worker, 1 server)"))),
        }
    }
}

/// The profiler's configuration; every `set_config` starts again from [`Config::default`].
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub mode: u32,
    pub filename: String,
    pub continuous_dump: bool,
    pub dump_period: f64,
    pub aggregate_stats: bool,
}

impl Default for Config {
    fn default() -> Self {
        // Stock defaults: profile_symbolic, _imperative, _memory and _api are all true.
        Config {
            mode: ALL,
            filename: "profile.json".into(),
            continuous_dump: true,
            dump_period: 1.0,
            aggregate_stats: false,
        }
    }
}

fn parse_bool(key: &str, v: &str) -> Result<bool> {
    match v {
        "True" | "true" | "1" => Ok(true),
        "False" | "false" | "0" => Ok(false),
        _ => Err(Error::mxnet(format!("profiler config {key}: '{v}' is not a boolean (True, False, 1 or 0)"))),
    }
}

impl Config {
    /// Parse `set_config` keys and values (strings as the frontend sends them).
    pub fn parse(pairs: &[(&str, &str)]) -> Result<Config> {
        let mut c = Config::default();
        let mut all = false;
        let mut bits = [(SYMBOLIC, true), (IMPERATIVE, true), (MEMORY, true), (API, true)];
        for &(k, v) in pairs {
            match k {
                "profile_all" => all = parse_bool(k, v)?,
                "profile_symbolic" => bits[0].1 = parse_bool(k, v)?,
                "profile_imperative" => bits[1].1 = parse_bool(k, v)?,
                "profile_memory" => bits[2].1 = parse_bool(k, v)?,
                "profile_api" => bits[3].1 = parse_bool(k, v)?,
                "filename" => {
                    if v.is_empty() {
                        return Err(Error::mxnet("profiler config filename must not be empty"));
                    }
                    c.filename = v.to_string();
                }
                "continuous_dump" => c.continuous_dump = parse_bool(k, v)?,
                "dump_period" => {
                    c.dump_period = v
                        .trim()
                        .parse::<f64>()
                        .ok()
                        .filter(|p| p.is_finite() && *p > 0.0)
                        .ok_or_else(|| Error::mxnet(format!("profiler config dump_period: '{v}' is not a positive number of seconds")))?;
                }
                "aggregate_stats" => c.aggregate_stats = parse_bool(k, v)?,
                "profile_process" => match v {
                    "worker" => {}
                    "server" => return Err(Error::not_supported("profiling a kvstore server process")),
                    _ => return Err(Error::mxnet(format!("profiler config profile_process: '{v}' is not one of worker, server"))),
                },
                _ => {
                    return Err(Error::mxnet(format!(
                        "unknown profiler config key '{k}' (known: profile_all, profile_symbolic, profile_imperative, \
                         profile_memory, profile_api, filename, continuous_dump, dump_period, aggregate_stats, profile_process)"
                    )))
                }
            }
        }
        c.mode = if all { ALL } else { bits.iter().filter(|b| b.1).fold(0, |m, b| m | b.0) };
        Ok(c)
    }
}

struct State {
    config: Config,
    running: bool,
    paused: bool,
    /// Started since the last configuration or finished dump: dumps are allowed.
    has_run: bool,
    trace: Trace,
    aggregate: Aggregate,
    /// Bumped to stop the continuous-dump thread.
    dumper_gen: u64,
    dumper: Option<std::thread::JoinHandle<()>>,
}

fn with_state<R>(f: impl FnOnce(&mut State) -> R) -> R {
    let mut g = PROFILER.state.lock();
    let st = g.get_or_insert_with(|| State {
        config: Config::default(),
        running: false,
        paused: false,
        has_run: false,
        trace: Trace::default(),
        aggregate: Aggregate::default(),
        dumper_gen: 0,
        dumper: None,
    });
    f(st)
}

/// Make the recording switches and the storage subscription match the state.
fn apply_flags(st: &State) {
    let on = st.running && !st.paused;
    let flags = if on { st.config.mode | ON | if st.config.aggregate_stats { AGGREGATE } else { 0 } } else { 0 };
    let memory_was = PROFILER.flags.swap(flags, Ordering::SeqCst) & MEMORY != 0;
    let memory = flags & MEMORY != 0;
    if memory && !memory_was {
        crate::storage::events::subscribe(Some(Arc::new(|e: &crate::storage::events::StorageEvent| {
            use crate::storage::events::StorageEvent::{Alloc, Free};
            let (Alloc { ctx, stats, .. } | Free { ctx, stats, .. }) = *e;
            buffer::record(Event {
                name: Text::Static("Memory"),
                cat: Text::Static(aggregate::STORAGE_CATEGORY),
                proc: Proc::Storage(ctx),
                tid: buffer::current_tid(),
                ts: now(),
                phase: Phase::Memory { bytes: stats.bytes_in_use as u64 },
                args: None,
            });
        })));
    } else if !memory && memory_was {
        crate::storage::events::subscribe(None);
    }
}

/// `MXSetProcessProfilerConfig`: replace the configuration (unspecified keys take their
/// defaults again), start a new output file and new statistics.
pub fn set_config(pairs: &[(&str, &str)]) -> Result<()> {
    let config = Config::parse(pairs)?;
    with_state(|st| {
        // As stock: a new configuration removes the old output file (a regular file only:
        // never a device such as /dev/null, a FIFO or a link).
        let path = std::path::Path::new(&config.filename);
        if !trace::is_special(path) {
            let _ = std::fs::remove_file(path);
        }
        st.config = config;
        st.trace = Trace::default();
        st.aggregate.reset();
        buffer::discard();
        st.has_run = st.running;
        apply_flags(st);
    });
    Ok(())
}

/// `MXSetProcessProfilerState`: run (true) or stop (false).
pub fn set_state(run: bool) -> Result<()> {
    let stale_dumper = with_state(|st| {
        if run && !st.running {
            st.running = true;
            st.paused = false;
            st.has_run = true;
            if st.config.continuous_dump && st.dumper.is_none() {
                st.dumper_gen += 1;
                let gen = st.dumper_gen;
                let period = std::time::Duration::from_secs_f64(st.config.dump_period);
                st.dumper = std::thread::Builder::new()
                    .name("profiler dump".into())
                    .spawn(move || continuous_dump(gen, period))
                    .ok();
            }
        } else if !run && st.running {
            st.running = false;
            st.paused = false;
            st.dumper_gen += 1;
            PROFILER.dumper_cv.notify_all();
        }
        apply_flags(st);
        if !run {
            st.dumper.take()
        } else {
            None
        }
    });
    if let Some(h) = stale_dumper {
        let _ = h.join();
    }
    Ok(())
}

fn continuous_dump(gen: u64, period: std::time::Duration) {
    let mut g = PROFILER.state.lock();
    loop {
        g = PROFILER.dumper_cv.wait_for(g, period).0;
        let Some(st) = g.as_mut() else { return };
        if st.dumper_gen != gen {
            return;
        }
        let _ = dump_locked(st, false);
    }
}

/// `MXProcessProfilePause`: pause (true) or resume (false) recording.
pub fn pause(paused: bool) {
    with_state(|st| {
        st.paused = paused;
        apply_flags(st);
    });
}

/// Move buffered events into the trace and the statistics.
fn collect(st: &mut State) {
    let (events, threads) = buffer::drain();
    if st.config.aggregate_stats {
        st.aggregate.add(&events, trace::event_name);
    }
    st.trace.add(&events, &threads);
}

fn dump_locked(st: &mut State, finished: bool) -> Result<()> {
    if !st.has_run {
        return Err(Error::mxnet("Profiler hasn't been run. Config and start profiler first"));
    }
    collect(st);
    st.trace.write(&st.config.filename)?;
    if finished {
        st.trace = Trace::default();
        st.has_run = st.running;
    }
    Ok(())
}

/// `MXDumpProcessProfile`: write everything recorded so far as one complete trace file;
/// `finished` ends the file (the next dump starts a new one).
pub fn dump(finished: bool) -> Result<()> {
    with_state(|st| dump_locked(st, finished))
}

/// `MXAggregateProfileStatsPrintEx`: the statistics as a table (`json` false) or JSON; ''
/// when aggregate_stats is off. Pending events are flushed to the trace file first.
pub fn dumps(reset: bool, json: bool, sort_by: SortBy, ascending: bool) -> Result<String> {
    with_state(|st| {
        if !st.config.aggregate_stats {
            return Ok(String::new());
        }
        collect(st);
        if st.has_run {
            st.trace.write(&st.config.filename)?;
        }
        let out = if json { st.aggregate.json(sort_by, ascending) } else { st.aggregate.table(sort_by, ascending) };
        if reset {
            st.aggregate.reset();
        }
        Ok(out)
    })
}

/// Number of events of `name` in `category` in the statistics.
#[cfg(test)]
fn aggregate_count(category: &str, name: &str) -> u64 {
    with_state(|st| {
        collect(st);
        st.aggregate.count(category, name)
    })
}

thread_local! {
    /// The profiler's locks, held by the thread that forks from before `fork` to after it.
    static FORK_HOLD: RefCell<Option<(crate::sync::MutexGuard<'static, Option<State>>, buffer::ListHold)>> =
        const { RefCell::new(None) };
}

/// Before `fork` (the runtime's profiler stage, after the engine is idle): take the state and
/// the buffer list, in the order the continuous-dump thread takes them. That thread takes
/// them outside any call, so the call gate does not keep it out of the moment of `fork`; held
/// here, neither lock is held at the fork by a thread the child will not have.
pub fn fork_prepare() {
    let state = PROFILER.state.lock();
    let list = buffer::hold_list();
    let _ = FORK_HOLD.try_with(|h| *h.borrow_mut() = Some((state, list)));
}

/// After `fork`, in the parent and in the child: release what [`fork_prepare`] took.
pub fn fork_release() {
    let _ = FORK_HOLD.try_with(|h| h.borrow_mut().take());
}

/// Write the trace if the profiler ran and the file was not finished (the runtime's last
/// stage, at `MXNotifyShutdown` and at process exit). Every dump is complete, so writing
/// twice is harmless.
pub fn final_dump() {
    let Some(mut g) = PROFILER.state.try_lock_for(std::time::Duration::from_secs(2)) else { return };
    if let Some(st) = g.as_mut() {
        if st.has_run {
            let _ = dump_locked(st, false);
        }
    }
}

/// `MXNET_PROFILER_AUTOSTART=1`: start when the library loads (profile.json in the working
/// directory, written at shutdown and exit); `MXNET_PROFILER_MODE=1` adds imperative
/// operators to the default symbolic ones.
pub fn autostart(reg: &crate::config::Registry) -> Result<()> {
    if reg.get_bool("MXNET_PROFILER_AUTOSTART", "profiler")? != Some(true) {
        return Ok(());
    }
    let all = reg.get_bool("MXNET_PROFILER_MODE", "profiler")? == Some(true);
    with_state(|st| {
        st.config = Config {
            mode: if all { ALL } else { SYMBOLIC },
            // Written at shutdown and exit; no dump thread in every process that autostarts.
            continuous_dump: false,
            ..Config::default()
        };
        st.trace = Trace::default();
    });
    set_state(true)
}

/// Serialises the tests that use the global profiler.
#[cfg(test)]
pub(crate) static TEST_LOCK: Mutex<()> = Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_parsing() {
        let c = Config::parse(&[]).unwrap();
        assert_eq!(c, Config::default());
        let c = Config::parse(&[("profile_all", "True"), ("filename", "x.json"), ("aggregate_stats", "1")]).unwrap();
        assert_eq!((c.mode, c.filename.as_str(), c.aggregate_stats), (ALL, "x.json", true));
        let c = Config::parse(&[("profile_symbolic", "False"), ("profile_api", "0"), ("dump_period", "0.5")]).unwrap();
        assert_eq!(c.mode, IMPERATIVE | MEMORY);
        assert_eq!(c.dump_period, 0.5);
        for (k, v) in [
            ("nope", "1"),
            ("profile_all", "yes"),
            ("dump_period", "-1"),
            ("dump_period", "x"),
            ("filename", ""),
            ("profile_process", "boss"),
        ] {
            let e = Config::parse(&[(k, v)]).unwrap_err();
            assert_eq!(e.kind(), crate::error::ErrorKind::MXNet, "{k}={v}: {e}");
            assert!(e.to_string().contains(k), "{e}");
        }
        assert_eq!(
            Config::parse(&[("profile_process", "server")]).unwrap_err().kind(),
            crate::error::ErrorKind::NotImplemented
        );
        assert!(ProcessKind::from_code(0).is_ok());
        assert!(ProcessKind::from_code(1).is_err());
    }

    #[test]
    fn run_pause_dump_and_statistics() {
        let _g = TEST_LOCK.lock();
        let dir = std::env::temp_dir().join(format!("mxrt-prof-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("p.json");
        let f = file.to_str().unwrap();
        set_config(&[
            ("profile_all", "True"),
            ("aggregate_stats", "True"),
            ("filename", f),
            ("continuous_dump", "False"),
        ])
        .unwrap();
        assert!(dump(false).unwrap_err().to_string().contains("hasn't been run"));
        set_state(true).unwrap();
        let name: Arc<str> = Arc::from("unit_test_op");
        for _ in 0..3 {
            let t = op_begin(false).unwrap();
            annotate("algo", "direct");
            op_end(t, Some(&name), Context::CPU, None, None);
        }
        pause(true);
        assert!(op_begin(false).is_none(), "paused: nothing is recorded");
        pause(false);
        api_call("MXUnitTest", api_begin());
        dump(false).unwrap();
        let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        let ops: Vec<_> =
            doc["traceEvents"].as_array().unwrap().iter().filter(|e| e["name"] == "unit_test_op").collect();
        assert_eq!(ops.len(), 3);
        assert_eq!(ops[0]["args"]["algo"], "direct");
        assert_eq!(aggregate_count("operator", "unit_test_op"), 3);
        let table = dumps(true, false, SortBy::Total, false).unwrap();
        assert!(table.contains("unit_test_op"), "{table}");
        assert!(table.contains("MXUnitTest"), "{table}");
        assert_eq!(aggregate_count("operator", "unit_test_op"), 0, "reset");
        set_state(false).unwrap();
        assert!(op_begin(false).is_none());
        dump(true).unwrap();
        assert!(dump(false).is_err(), "a finished dump needs a new run");
        set_config(&[("filename", f), ("continuous_dump", "False")]).unwrap();
        assert!(!file.exists(), "set_config removes the old output");
        assert_eq!(dumps(false, true, SortBy::Count, false).unwrap(), "", "aggregate_stats off");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
