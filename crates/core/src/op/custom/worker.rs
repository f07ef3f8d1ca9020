//! The custom-operator threads: where the frontend callbacks of custom operators run.
//!
//! Owns: a job queue, the threads that take jobs from it, and the monitor that adds threads.
//! Jobs come from engine operations, which must not wait for the frontend, so they only queue
//! a job. A thread runs one job at a time and may block inside it for long (the frontend
//! waits for arrays, or for the result of another custom operator, whose job then needs
//! another thread). Callbacks hold the GIL, so more threads than blocked jobs only contend:
//! one thread starts with the first job, the monitor starts another (up to [`MAX_THREADS`])
//! when jobs are queued, no thread is idle and none took a job for [`STALL`], and a thread
//! beyond the first that finds no work for [`IDLE_EXIT`] exits. Threads hold no lock while
//! they run a job. `MXNotifyShutdown` stops them all
//! ([`shutdown`], after the engine finished what was pushed); a later job starts new ones. A
//! forked child does not have its parent's threads and starts its own at its first job.

use crate::error::{Error, Result};
use crate::sync::{Condvar, Mutex, MutexGuard, Started};
use std::cell::Cell;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A job: called with `Ok(())` on a custom-operator thread to run it, or with the error that
/// kept it from running (no thread could be started).
pub type Job = Box<dyn FnOnce(Result<()>) + Send>;

/// Threads beyond this are not started: jobs wait for a busy thread instead.
pub const MAX_THREADS: usize = 32;

/// How long queued jobs wait with every thread busy and none taking a job before the monitor
/// starts another thread.
/// Long enough that a callback slowed down by a busy GIL does not count as blocked.
pub const STALL: Duration = Duration::from_millis(50);

/// How long a thread beyond the first waits for work before it exits.
pub const IDLE_EXIT: Duration = Duration::from_secs(2);

/// How long [`shutdown`] waits for a thread still inside a callback before leaving it be.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

struct Workers {
    state: Mutex<State>,
    /// Wakes idle threads (a job was queued, or stop).
    work: Condvar,
    /// Wakes the monitor (a job was queued, or stop).
    watch: Condvar,
    /// A thread or the monitor exited.
    exited: Condvar,
}

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    threads: usize,
    idle: usize,
    /// Jobs taken from the queue so far (the monitor's measure of progress).
    taken: u64,
    monitor_running: bool,
    stop: bool,
    handles: Vec<JoinHandle<()>>,
}

thread_local! {
    static IS_CUSTOM_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// The process's custom-operator threads; a forked child starts others.
static WORKERS: Started<Workers> = Started::new();

fn started() -> Option<&'static Workers> {
    WORKERS.get()
}

fn workers() -> &'static Workers {
    let started = WORKERS.get_or_start(|| {
        crate::runtime::runtime().adopt(crate::runtime::Stage::CustomOpThreads, &WorkerStage);
        Ok::<_, std::convert::Infallible>(&*Box::leak(Box::new(Workers {
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            watch: Condvar::new(),
            exited: Condvar::new(),
        })))
    });
    match started {
        Ok(w) => w,
        Err(never) => match never {},
    }
}

/// The threads' part in the runtime's lifecycle: stopped at shutdown; in a forked child they
/// are gone, so the child forgets them (the old state is leaked, its lock may have been held
/// by one of them at the fork).
struct WorkerStage;

impl crate::runtime::Part for WorkerStage {
    fn child_after_fork(&self) {
        WORKERS.forget();
    }
    fn shutdown(&self) {
        shutdown();
    }
}

/// Whether the calling thread is a custom-operator thread.
pub fn on_custom_thread() -> bool {
    IS_CUSTOM_THREAD.try_with(Cell::get).unwrap_or(false)
}

fn spawn_thread(w: &'static Workers, s: &mut State) -> std::io::Result<()> {
    s.handles.retain(|h| !h.is_finished());
    let h = std::thread::Builder::new().name("custom op worker".into()).spawn(move || run(w))?;
    s.threads += 1;
    s.handles.push(h);
    Ok(())
}

/// Queue `job`; it runs on a custom-operator thread, or is called with the error if none
/// exists and none can be started.
pub fn submit(job: Job) {
    let w = workers();
    let mut s = w.state.lock();
    s.jobs.push_back(job);
    if s.threads == 0 {
        if let Err(e) = spawn_thread(w, &mut s) {
            let job = s.jobs.pop_back().expect("pushed above");
            drop(s);
            job(Err(Error::mxnet(format!("cannot start a custom operator thread: {e}"))));
            return;
        }
    }
    if !s.monitor_running {
        // Without a monitor the one thread serves every job (nested waits would stall).
        if let Ok(h) = std::thread::Builder::new().name("custom op monitor".into()).spawn(move || monitor(w)) {
            s.monitor_running = true;
            s.handles.push(h);
        }
    }
    drop(s);
    w.work.notify_one();
    w.watch.notify_one();
}

fn run(w: &'static Workers) {
    IS_CUSTOM_THREAD.with(|c| c.set(true));
    crate::runtime::mark_library_thread();
    crate::engine::exempt_from_back_pressure();
    let mut s = w.state.lock();
    loop {
        if let Some(job) = s.jobs.pop_front() {
            s.taken += 1;
            drop(s);
            // A job completes its operation even when it panics (its completion token does).
            let _ = catch_unwind(AssertUnwindSafe(|| job(Ok(()))));
            s = w.state.lock();
            continue;
        }
        if s.stop {
            break;
        }
        s.idle += 1;
        let idle_out;
        (s, idle_out) = w.work.wait_for(s, IDLE_EXIT);
        s.idle -= 1;
        if idle_out && s.jobs.is_empty() && s.threads > 1 {
            break;
        }
    }
    s.threads -= 1;
    drop(s);
    w.exited.notify_all();
}

/// Whether queued jobs wait with every thread busy.
fn waiting(s: &State) -> bool {
    !s.jobs.is_empty() && s.idle == 0
}

fn monitor(w: &'static Workers) {
    let mut s: MutexGuard<State> = w.state.lock();
    while !s.stop {
        // Sleep only while nothing is queued (every submit wakes the monitor); with jobs
        // queued, look every STALL, as a thread may take a job and leave the rest waiting.
        if s.jobs.is_empty() {
            s = w.watch.wait(s);
            continue;
        }
        let seen = s.taken;
        let deadline = Instant::now() + STALL;
        while !s.stop && Instant::now() < deadline {
            s = w.watch.wait_for(s, deadline.saturating_duration_since(Instant::now())).0;
        }
        if !s.stop && waiting(&s) && s.taken == seen && s.threads < MAX_THREADS {
            // Every thread is blocked inside a job: start one for the queue.
            let _ = spawn_thread(w, &mut s);
            w.work.notify_one();
        }
    }
    s.monitor_running = false;
    drop(s);
    w.exited.notify_all();
}

/// Stop the threads and the monitor once the queue is empty, and join them; a thread still
/// inside a callback after [`STOP_TIMEOUT`] is left running (and keeps serving the queue).
/// Jobs queued afterwards start new threads. Does nothing on a custom-operator thread (it
/// would wait for itself).
pub fn shutdown() {
    let Some(w) = started() else { return };
    if on_custom_thread() {
        return;
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    let mut s = w.state.lock();
    s.stop = true;
    w.work.notify_all();
    w.watch.notify_all();
    while s.threads > 0 || s.monitor_running {
        let timed_out;
        (s, timed_out) = w.exited.wait_for(s, deadline.saturating_duration_since(Instant::now()));
        if timed_out {
            break;
        }
    }
    s.stop = false;
    let all_gone = s.threads == 0 && !s.monitor_running;
    let handles = std::mem::take(&mut s.handles);
    drop(s);
    if all_gone {
        for h in handles {
            let _ = h.join();
        }
    }
    // Otherwise the handles are dropped (detached): the exited threads are gone, the busy
    // one goes on serving the queue.
}

/// Threads started and not stopped (tests).
#[cfg(test)]
pub fn threads() -> usize {
    started().map_or(0, |w| w.state.lock().threads)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;

    /// Job 1 blocks until job 2 has run; returns the order they finished in.
    fn blocked_then_released() -> Vec<&'static str> {
        let (tx, rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel::<&'static str>();
        let d1 = done_tx.clone();
        submit(Box::new(move |r| {
            r.unwrap();
            assert!(on_custom_thread());
            rx.recv_timeout(Duration::from_secs(10)).expect("the second job ran");
            d1.send("first").unwrap();
        }));
        submit(Box::new(move |r| {
            r.unwrap();
            done_tx.send("second").unwrap();
            tx.send(()).unwrap();
        }));
        let mut got = vec![done_rx.recv_timeout(Duration::from_secs(10)).unwrap()];
        got.push(done_rx.recv_timeout(Duration::from_secs(10)).unwrap());
        got
    }

    /// A job that blocks until a later job ran still lets that later job run (the monitor
    /// starts a thread), also when idle threads exist; shutdown leaves the queue usable.
    #[test]
    fn blocked_job_does_not_starve_later_jobs() {
        for _ in 0..3 {
            assert_eq!(blocked_then_released(), ["second", "first"]);
        }
        assert!(!on_custom_thread());

        static RAN: AtomicUsize = AtomicUsize::new(0);
        shutdown();
        let (tx, rx) = mpsc::channel();
        submit(Box::new(move |r| {
            r.unwrap();
            RAN.fetch_add(1, Ordering::SeqCst);
            tx.send(()).unwrap();
        }));
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(RAN.load(Ordering::SeqCst), 1);
        assert!(threads() >= 1);
    }
}
