//! Engine tests: randomized DAGs against serial execution for every engine kind and several
//! worker counts, concurrent pushers, failures, deleters, priorities, bulk, back-pressure.

use super::*;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize};
use std::sync::mpsc;
use std::time::Duration;

fn engine(kind: EngineKind, workers: usize) -> &'static Engine {
    let mut o = EngineOptions::new(kind);
    o.cpu_workers = workers;
    o.cpu_priority_workers = 2;
    o.gpu_workers = 2;
    o.gpu_copy_workers = 1;
    o.virtual_gpus = true;
    Engine::start(o)
}

/// Push an operation (on a variable of its own) that holds a worker until the returned
/// sender sends; returns once a worker runs it (on a loaded machine the worker may not have
/// picked it up before the caller's next pushes otherwise).
fn hold_a_worker(e: &'static Engine) -> mpsc::Sender<()> {
    let (gate_tx, gate_rx) = mpsc::channel::<()>();
    let gate_rx = Mutex::new(gate_rx);
    let (started_tx, started_rx) = mpsc::channel::<()>();
    let started_tx = Mutex::new(started_tx);
    e.submit(Push::sync(
        move |_| {
            started_tx.lock().send(()).unwrap();
            let _: () = gate_rx.lock().recv().unwrap();
            Ok(())
        },
        vec![],
        vec![Var::new()],
    ))
    .unwrap();
    started_rx.recv().unwrap();
    gate_tx
}

/// A small deterministic generator (xorshift), so failures reproduce.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

struct OpSpec {
    reads: Vec<usize>,
    writes: Vec<usize>,
    prop: FnProperty,
    ctx: Context,
    priority: i32,
}

fn random_ops(seed: u64, n_ops: usize, n_vars: usize) -> Vec<OpSpec> {
    let mut rng = Rng(seed);
    let props = [FnProperty::Normal, FnProperty::CpuPrioritized, FnProperty::Async, FnProperty::CopyToGpu];
    (0..n_ops)
        .map(|_| {
            let mut chosen: Vec<usize> = Vec::new();
            let k = 1 + rng.below(4.min(n_vars));
            while chosen.len() < k {
                let v = rng.below(n_vars);
                if !chosen.contains(&v) {
                    chosen.push(v);
                }
            }
            let n_writes = 1 + rng.below(chosen.len());
            let writes = chosen.split_off(chosen.len() - n_writes);
            let gpu = rng.below(8) == 0;
            OpSpec {
                reads: chosen,
                writes,
                prop: props[rng.below(props.len())],
                ctx: if gpu { Context::gpu(rng.below(2) as i32) } else { Context::CPU },
                priority: rng.below(3) as i32,
            }
        })
        .collect()
}

fn apply(values: &[AtomicU64], i: usize, op: &OpSpec) {
    let sum: u64 = op.reads.iter().map(|&r| values[r].load(Ordering::Relaxed)).fold(0, u64::wrapping_add);
    for &w in &op.writes {
        let old = values[w].load(Ordering::Relaxed);
        values[w].store(old.wrapping_mul(31).wrapping_add(sum).wrapping_add(i as u64), Ordering::Relaxed);
    }
}

fn run_dag(e: &'static Engine, seed: u64, n_ops: usize, n_vars: usize) {
    let ops = Arc::new(random_ops(seed, n_ops, n_vars));
    let serial: Vec<AtomicU64> = (0..n_vars).map(|v| AtomicU64::new(v as u64)).collect();
    for (i, op) in ops.iter().enumerate() {
        apply(&serial, i, op);
    }
    let values: Arc<Vec<AtomicU64>> = Arc::new((0..n_vars).map(|v| AtomicU64::new(v as u64)).collect());
    let vars: Vec<Arc<Var>> = (0..n_vars).map(|_| Var::new()).collect();
    for i in 0..ops.len() {
        let spec = &ops[i];
        let (o, v) = (ops.clone(), values.clone());
        let const_vars: Vec<_> = spec.reads.iter().map(|&r| vars[r].clone()).collect();
        let mutable_vars: Vec<_> = spec.writes.iter().map(|&w| vars[w].clone()).collect();
        let mut p = if spec.prop == FnProperty::Async {
            // Complete from another thread now and then, as asynchronous work does.
            Push::asynchronous(
                move |_, done| {
                    apply(&v, i, &o[i]);
                    if i % 16 == 0 {
                        std::thread::spawn(move || done.complete(Ok(())));
                    } else {
                        done.complete(Ok(()));
                    }
                },
                const_vars,
                mutable_vars,
            )
        } else {
            Push::sync(
                move |_| {
                    apply(&v, i, &o[i]);
                    Ok(())
                },
                const_vars,
                mutable_vars,
            )
        };
        p.prop = spec.prop;
        p.ctx = spec.ctx;
        p.priority = spec.priority;
        // Some run on the pushing thread when the engine happens to be idle.
        p.cheap = i % 3 == 0;
        e.submit(p).unwrap();
    }
    e.wait_all().unwrap();
    assert_eq!(e.pending(), 0);
    for v in 0..n_vars {
        assert_eq!(values[v].load(Ordering::Relaxed), serial[v].load(Ordering::Relaxed), "var {v}");
    }
}

#[test]
fn random_dags_match_serial_execution() {
    let ops = if cfg!(debug_assertions) { 20_000 } else { 200_000 };
    for (kind, workers) in [
        (EngineKind::Naive, 1),
        (EngineKind::Threaded, 1),
        (EngineKind::Threaded, 3),
        (EngineKind::PerDevice, 1),
        (EngineKind::PerDevice, 2),
        (EngineKind::PerDevice, 4),
    ] {
        let e = engine(kind, workers);
        run_dag(e, 0x9e3779b97f4a7c15 ^ workers as u64, ops, 64);
        // Few variables: long dependency chains and heavy contention.
        run_dag(e, 0x1234567 + workers as u64, ops / 10, 3);
        if kind == EngineKind::Naive {
            assert!(e.pools().is_empty(), "NaiveEngine starts no threads");
        }
    }
}

#[test]
fn per_device_pools_follow_the_table_and_start_lazily() {
    let e = engine(EngineKind::PerDevice, 1);
    assert!(e.pools().is_empty());
    let seen: Arc<Mutex<Vec<String>>> = Default::default();
    let push = |ctx: Context, prop: FnProperty| {
        let s = seen.clone();
        let mut p = Push::sync(
            move |_| {
                // The pool's name, without the worker's index.
                let name = std::thread::current().name().unwrap_or("").to_string();
                s.lock().push(name.rsplit_once(' ').map(|(p, _)| p.to_string()).unwrap_or(name));
                Ok(())
            },
            vec![],
            vec![Var::new()],
        );
        p.ctx = ctx;
        p.prop = prop;
        p.wait = true;
        e.submit(p).unwrap();
    };
    push(Context::CPU, FnProperty::Normal);
    push(Context::CPU, FnProperty::CpuPrioritized);
    push(Context::gpu(1), FnProperty::Normal);
    push(Context::gpu(1), FnProperty::CopyFromGpu);
    push(Context::gpu(1), FnProperty::GpuPrioritized);
    let names = seen.lock().clone();
    assert_eq!(
        names,
        ["cpu worker", "cpu priority worker", "gpu(1) worker", "gpu(1) copy worker", "gpu(1) priority worker"]
    );
    let mut pools = e.pools();
    pools.sort();
    assert_eq!(pools.len(), 5);
    // ThreadedEngine: one pool for everything.
    let t = engine(EngineKind::Threaded, 2);
    let mut p = Push::sync(|_| Ok(()), vec![], vec![]);
    p.ctx = Context::gpu(0);
    p.prop = FnProperty::CopyToGpu;
    p.wait = true;
    t.submit(p).unwrap();
    assert_eq!(t.pools(), vec![("engine worker".to_string(), 2)]);
}

#[test]
fn pushes_from_eight_threads() {
    for kind in [EngineKind::Naive, EngineKind::Threaded, EngineKind::PerDevice] {
        let e = engine(kind, 2);
        let shared = Var::new();
        let counter = Arc::new(AtomicI64::new(0));
        let per_thread: Vec<_> = (0..8).map(|_| (Var::new(), Arc::new(AtomicI64::new(0)))).collect();
        std::thread::scope(|s| {
            for (var, count) in &per_thread {
                let (shared, counter) = (shared.clone(), counter.clone());
                s.spawn(move || {
                    for i in 0..2000 {
                        let c = counter.clone();
                        // Non-atomic read-modify-write: only correct if writes are exclusive.
                        e.submit(Push::sync(
                            move |_| {
                                let v = c.load(Ordering::Relaxed);
                                c.store(v + 1, Ordering::Relaxed);
                                Ok(())
                            },
                            vec![],
                            vec![shared.clone()],
                        ))
                        .unwrap();
                        let c = count.clone();
                        let expect = i;
                        e.submit(Push::sync(
                            move |_| {
                                assert_eq!(c.load(Ordering::Relaxed), expect, "push order per var");
                                c.store(expect + 1, Ordering::Relaxed);
                                Ok(())
                            },
                            vec![],
                            vec![var.clone()],
                        ))
                        .unwrap();
                    }
                });
            }
        });
        e.wait_all().unwrap();
        assert_eq!(counter.load(Ordering::Relaxed), 16000, "{kind:?}");
        for (_, c) in &per_thread {
            assert_eq!(c.load(Ordering::Relaxed), 2000);
        }
    }
}

#[test]
fn reads_run_concurrently_writes_alone() {
    let e = engine(EngineKind::PerDevice, 4);
    let v = Var::new();
    let running = Arc::new(AtomicI64::new(0));
    let max_running = Arc::new(AtomicI64::new(0));
    let violations = Arc::new(AtomicUsize::new(0));
    for i in 0..200 {
        let (r, m, bad) = (running.clone(), max_running.clone(), violations.clone());
        let write = i % 10 == 0;
        let f = move |_: &RunContext| {
            let now = r.fetch_add(if write { 1000 } else { 1 }, Ordering::SeqCst) + if write { 1000 } else { 1 };
            m.fetch_max(now, Ordering::SeqCst);
            if (write && now != 1000) || (!write && now >= 1000) {
                bad.fetch_add(1, Ordering::SeqCst);
            }
            std::thread::sleep(Duration::from_micros(200));
            r.fetch_sub(if write { 1000 } else { 1 }, Ordering::SeqCst);
            Ok(())
        };
        let p = if write { Push::sync(f, vec![], vec![v.clone()]) } else { Push::sync(f, vec![v.clone()], vec![]) };
        e.submit(p).unwrap();
    }
    e.wait_all().unwrap();
    assert_eq!(violations.load(Ordering::SeqCst), 0);
    assert!(max_running.load(Ordering::SeqCst) >= 2, "reads never overlapped");
}

#[test]
fn duplicate_variables_are_refused() {
    let e = engine(EngineKind::PerDevice, 1);
    let v = Var::new();
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    let err = e
        .submit(Push::sync(
            move |_| {
                r.store(true, Ordering::SeqCst);
                Ok(())
            },
            vec![v.clone()],
            vec![v.clone()],
        ))
        .unwrap_err();
    assert!(err.to_string().starts_with("ValueError:") && err.to_string().contains("twice"));
    assert!(e.submit(Push::sync(|_| Ok(()), vec![v.clone(), v.clone()], vec![])).is_err());
    let many: Vec<_> = (0..20).map(|_| Var::new()).chain([v.clone()]).collect();
    assert!(e.submit(Push::sync(|_| Ok(()), many, vec![v.clone()])).is_err());
    e.wait_all().unwrap();
    assert!(!ran.load(Ordering::SeqCst));
    assert_eq!(e.pending(), 0);
}

struct Counted(Arc<AtomicUsize>);
impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn failures_propagate_report_once_and_clear() {
    for kind in [EngineKind::Naive, EngineKind::Threaded, EngineKind::PerDevice] {
        let e = engine(kind, 2);
        let (a, b, c, d) = (Var::new(), Var::new(), Var::new(), Var::new());
        let drops = Arc::new(AtomicUsize::new(0));
        let skipped_ran = Arc::new(AtomicBool::new(false));
        let mut fail = Push::sync(|_| Err(Error::value("bad input to op1")), vec![], vec![a.clone()]);
        fail.payload = Some(Box::new(Counted(drops.clone())));
        e.submit(fail).unwrap();
        // Reads the failed var: skipped, and passes the failure on to b.
        let r = skipped_ran.clone();
        let mut skip = Push::sync(
            move |_| {
                r.store(true, Ordering::SeqCst);
                Ok(())
            },
            vec![a.clone()],
            vec![b.clone()],
        );
        skip.payload = Some(Box::new(Counted(drops.clone())));
        e.submit(skip).unwrap();
        // Unrelated: runs.
        let mut ok = Push::sync(|_| Ok(()), vec![c.clone()], vec![d.clone()]);
        ok.payload = Some(Box::new(Counted(drops.clone())));
        e.submit(ok).unwrap();

        e.wait_for_var(&d, false).unwrap();
        let err = e.wait_for_var(&b, false).unwrap_err();
        assert_eq!(err.to_string(), "ValueError: bad input to op1", "{kind:?}");
        // Reported once: cleared on every var it reached, and for wait_all.
        e.wait_for_var(&a, false).unwrap();
        e.wait_all().unwrap();
        assert!(!skipped_ran.load(Ordering::SeqCst));
        assert_eq!(drops.load(Ordering::SeqCst), 3, "each payload dropped exactly once");

        // The engine keeps working, also on the vars that failed.
        let n = Arc::new(AtomicUsize::new(0));
        let n2 = n.clone();
        e.submit(Push::sync(
            move |_| {
                n2.fetch_add(1, Ordering::SeqCst);
                Ok(())
            },
            vec![a.clone()],
            vec![b.clone()],
        ))
        .unwrap();
        e.wait_for_var(&b, false).unwrap();
        assert_eq!(n.load(Ordering::SeqCst), 1);

        // wait_all reports a failure nobody waited for, then it is gone.
        e.submit(Push::sync(|_| panic!("kernel bug"), vec![], vec![c.clone()])).unwrap();
        let err = e.wait_all().unwrap_err().to_string();
        assert!(err.starts_with("InternalError: operation <unnamed> panicked: kernel bug"), "{err}");
        e.wait_all().unwrap();
        e.wait_for_var(&c, false).unwrap();

        // Asynchronous completion with an error, and a dropped completion.
        e.submit(Push::asynchronous(
            |_, done| done.complete(Err(Error::mxnet("device lost"))),
            vec![],
            vec![d.clone()],
        ))
        .unwrap();
        assert_eq!(e.wait_for_var(&d, true).unwrap_err().to_string(), "MXNetError: device lost");
        e.submit(Push::asynchronous(|_, done| drop(done), vec![], vec![d.clone()])).unwrap();
        assert!(e.wait_for_var(&d, false).unwrap_err().to_string().contains("without completing"));
    }
}

#[test]
fn no_skip_operations_run_despite_failures() {
    let e = engine(EngineKind::PerDevice, 1);
    let v = Var::new();
    e.submit(Push::sync(|_| Err(Error::mxnet("x")), vec![], vec![v.clone()])).unwrap();
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    let mut p = Push::sync(
        move |_| {
            r.store(true, Ordering::SeqCst);
            Ok(())
        },
        vec![v.clone()],
        vec![],
    );
    p.prop = FnProperty::NoSkip;
    e.submit(p).unwrap();
    assert!(e.wait_all().is_err());
    assert!(ran.load(Ordering::SeqCst));
}

#[test]
fn higher_priority_runs_first() {
    let e = engine(EngineKind::PerDevice, 1);
    // Occupy the only worker until all others are queued.
    let gate_tx = hold_a_worker(e);
    let order: Arc<Mutex<Vec<i32>>> = Default::default();
    let priorities = [0, 5, -1, 5, 3, 0, 10, -7, 3];
    for &prio in &priorities {
        let o = order.clone();
        let mut p = Push::sync(
            move |_| {
                o.lock().push(prio);
                Ok(())
            },
            vec![],
            vec![Var::new()],
        );
        p.priority = prio;
        e.submit(p).unwrap();
    }
    std::thread::sleep(Duration::from_millis(20));
    gate_tx.send(()).unwrap();
    e.wait_all().unwrap();
    let mut want = priorities.to_vec();
    want.sort_by(|a, b| b.cmp(a));
    assert_eq!(*order.lock(), want);
}

#[test]
fn idle_threaded_engines_run_cheap_operations_on_the_pushing_thread() {
    for kind in [EngineKind::Threaded, EngineKind::PerDevice] {
        let e = engine(kind, 2);
        let me = std::thread::current().id();
        let v = Var::new();
        let (tx, rx) = mpsc::channel();
        let cheap = |tx: mpsc::Sender<(u32, std::thread::ThreadId)>, tag: u32, v: &Arc<Var>| {
            let mut p = Push::sync(
                move |_| {
                    tx.send((tag, std::thread::current().id())).unwrap();
                    Ok(())
                },
                vec![],
                vec![v.clone()],
            );
            p.cheap = true;
            p
        };
        // Nothing pending: done here before push returns.
        e.submit(cheap(tx.clone(), 1, &v)).unwrap();
        assert_eq!(rx.try_recv().unwrap(), (1, me));
        // Not cheap: a worker runs it even on an idle engine.
        let t = tx.clone();
        e.submit(Push::sync(
            move |_| {
                let _: () = t.send((2, std::thread::current().id())).unwrap();
                Ok(())
            },
            vec![],
            vec![v.clone()],
        ))
        .unwrap();
        e.wait_all().unwrap();
        let (tag, thread) = rx.try_recv().unwrap();
        assert!(tag == 2 && thread != me);
        // An operation pending on the variable: the cheap one waits behind it, on a worker.
        let gate = Arc::new(AtomicBool::new(false));
        let g = gate.clone();
        let t = tx.clone();
        e.submit(Push::sync(
            move |_| {
                while !g.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let _: () = t.send((3, std::thread::current().id())).unwrap();
                Ok(())
            },
            vec![],
            vec![v.clone()],
        ))
        .unwrap();
        e.submit(cheap(tx.clone(), 4, &v)).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(rx.try_recv().is_err(), "ran before the operation it depends on");
        gate.store(true, Ordering::SeqCst);
        e.wait_all().unwrap();
        let got: Vec<_> = rx.try_iter().collect();
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), vec![3, 4]);
        assert!(got.iter().all(|g| g.1 != me));
        // A failing cheap operation run here reports at the next wait, as on a worker.
        let mut p = Push::sync(|_| Err(Error::value("cheap failure")), vec![], vec![v.clone()]);
        p.cheap = true;
        e.submit(p).unwrap();
        assert_eq!(e.wait_all().unwrap_err().to_string(), "ValueError: cheap failure");
        e.wait_all().unwrap();
    }
}

#[test]
fn naive_engine_runs_on_the_pushing_thread() {
    let e = engine(EngineKind::Naive, 1);
    let me = std::thread::current().id();
    let same = Arc::new(AtomicBool::new(false));
    let s = same.clone();
    e.submit(Push::sync(
        move |_| {
            s.store(std::thread::current().id() == me, Ordering::SeqCst);
            Ok(())
        },
        vec![],
        vec![Var::new()],
    ))
    .unwrap();
    // Push returned: the operation is done.
    assert!(same.load(Ordering::SeqCst));
    assert_eq!(e.pending(), 0);
    // An asynchronous operation completed later from another thread: push waits for it.
    let done_flag = Arc::new(AtomicBool::new(false));
    let d = done_flag.clone();
    e.submit(Push::asynchronous(
        move |_, done| {
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                d.store(true, Ordering::SeqCst);
                done.complete(Ok(()));
            });
        },
        vec![],
        vec![Var::new()],
    ))
    .unwrap();
    assert!(done_flag.load(Ordering::SeqCst));
    assert!(e.pools().is_empty());
}

#[test]
fn solo_mode_leaves_variables_untouched_until_a_second_thread_pushes() {
    let e = engine(EngineKind::Naive, 1);
    let v = Var::new();
    let log = Arc::new(Mutex::new(Vec::new()));
    // The only pusher: its operation runs solo, the variable is not taken.
    let v_seen = v.clone();
    e.submit(Push::sync(
        move |_| {
            let _: () = assert!(v_seen.is_idle(), "solo: untracked");
            Ok(())
        },
        vec![],
        vec![v.clone()],
    ))
    .unwrap();
    assert!(!e.solo.is_shared());
    // A solo operation that starts a second pusher on the same variable: that push waits for
    // the operation to end, then ends solo mode for good.
    let second = Arc::new(Mutex::new(None));
    let (l, v2, s2) = (log.clone(), v.clone(), second.clone());
    e.submit(Push::sync(
        move |_| {
            let l2 = l.clone();
            *s2.lock() = Some(std::thread::spawn(move || {
                e.submit(Push::sync(
                    move |_| {
                        let _: () = l2.lock().push("second");
                        Ok(())
                    },
                    vec![],
                    vec![v2],
                ))
                .unwrap();
            }));
            std::thread::sleep(Duration::from_millis(50));
            l.lock().push("solo");
            Ok(())
        },
        vec![],
        vec![v.clone()],
    ))
    .unwrap();
    second.lock().take().unwrap().join().unwrap();
    assert_eq!(*log.lock(), ["solo", "second"]);
    assert!(e.solo.is_shared());
    // Tracked from now on: a running operation holds its variable.
    let v_seen = v.clone();
    e.submit(Push::sync(
        move |_| {
            let _: () = assert!(!v_seen.is_idle(), "tracked");
            Ok(())
        },
        vec![],
        vec![v.clone()],
    ))
    .unwrap();
    // A failure in a solo operation marks what it wrote, as a tracked one does.
    let e = engine(EngineKind::Naive, 1);
    let (a, b) = (Var::new(), Var::new());
    e.submit(Push::sync(|_| Err(Error::value("solo failure")), vec![], vec![a.clone()])).unwrap();
    assert!(!e.solo.is_shared());
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    e.submit(Push::sync(
        move |_| {
            r.store(true, Ordering::SeqCst);
            Ok(())
        },
        vec![a.clone()],
        vec![b.clone()],
    ))
    .unwrap();
    assert!(!ran.load(Ordering::SeqCst), "skipped: it reads the failed variable");
    assert_eq!(e.wait_for_var(&b, false).unwrap_err().to_string(), "ValueError: solo failure");
    // A thread that only waits ends solo mode too (it must not miss a solo operation).
    let e = engine(EngineKind::Naive, 1);
    e.submit(Push::sync(|_| Ok(()), vec![], vec![Var::new()])).unwrap();
    assert!(!e.solo.is_shared());
    std::thread::scope(|t| {
        t.spawn(|| e.wait_all().unwrap());
    });
    assert!(e.solo.is_shared());
}

#[test]
fn bulk_batches_and_keeps_order() {
    let e = engine(EngineKind::PerDevice, 2);
    assert_eq!(e.set_bulk_size(8), 0);
    let v = Var::new();
    let value = Arc::new(AtomicI64::new(0));
    let bulked = Arc::new(AtomicUsize::new(0));
    let drops = Arc::new(AtomicUsize::new(0));
    for i in 0..20 {
        let (val, b) = (value.clone(), bulked.clone());
        let mut p = Push::sync(
            move |rctx| {
                assert_eq!(val.load(Ordering::SeqCst), i);
                val.store(i + 1, Ordering::SeqCst);
                if rctx.is_bulk {
                    b.fetch_add(1, Ordering::SeqCst);
                }
                Ok(())
            },
            vec![],
            vec![v.clone()],
        );
        p.payload = Some(Box::new(Counted(drops.clone())));
        e.submit(p).unwrap();
    }
    // Two full bulks went out; the last four wait in this thread until a wait flushes them.
    e.wait_for_var(&v, false).unwrap();
    assert_eq!(value.load(Ordering::SeqCst), 20);
    assert_eq!(bulked.load(Ordering::SeqCst), 20);
    assert_eq!(drops.load(Ordering::SeqCst), 20);
    assert_eq!(e.set_bulk_size(0), 8);
}

#[test]
fn back_pressure_bounds_pending_operations() {
    let mut o = EngineOptions::new(EngineKind::PerDevice);
    o.max_pending = 4;
    let e = Engine::start(o);
    let v = Var::new();
    let mut max_seen = 0;
    for _ in 0..100 {
        e.submit(Push::sync(
            |_| {
                std::thread::sleep(Duration::from_micros(100));
                Ok(())
            },
            vec![],
            vec![v.clone()],
        ))
        .unwrap();
        max_seen = max_seen.max(e.pending());
    }
    e.wait_all().unwrap();
    assert!(max_seen <= 4, "pending reached {max_seen}");
    assert!(max_seen >= 2, "the producer should have been ahead of the worker");
}

#[test]
fn many_threads_wait_at_once() {
    let e = engine(EngineKind::PerDevice, 2);
    let v = Var::new();
    let value = Arc::new(AtomicI64::new(0));
    let val = value.clone();
    e.submit(Push::sync(
        move |_| {
            std::thread::sleep(Duration::from_millis(30));
            val.store(42, Ordering::SeqCst);
            Ok(())
        },
        vec![],
        vec![v.clone()],
    ))
    .unwrap();
    std::thread::scope(|s| {
        for i in 0..8 {
            let (v, value) = (v.clone(), value.clone());
            s.spawn(move || {
                if i % 2 == 0 {
                    e.wait_for_var(&v, i % 4 == 0).unwrap();
                } else {
                    e.wait_all().unwrap();
                }
                assert_eq!(value.load(Ordering::SeqCst), 42);
            });
        }
    });
}

#[test]
fn waiting_from_inside_an_operation_is_refused() {
    let e = engine(EngineKind::PerDevice, 1);
    let result: Arc<Mutex<Option<String>>> = Default::default();
    let r = result.clone();
    e.submit(Push::sync(
        move |_| {
            let _: () = *r.lock() = e.wait_all().err().map(|x| x.to_string());
            Ok(())
        },
        vec![],
        vec![Var::new()],
    ))
    .unwrap();
    e.wait_all().unwrap();
    assert!(result.lock().as_deref().unwrap_or("").contains("would wait for itself"));
}

#[test]
fn multi_variable_pushes_from_many_threads_do_not_deadlock() {
    for kind in [EngineKind::Naive, EngineKind::Threaded, EngineKind::PerDevice] {
        let e = engine(kind, 2);
        let vars: Vec<Arc<Var>> = (0..4).map(|_| Var::new()).collect();
        let counts: Arc<Vec<AtomicI64>> = Arc::new((0..4).map(|_| AtomicI64::new(0)).collect());
        let expected: Vec<AtomicI64> = (0..4).map(|_| AtomicI64::new(0)).collect();
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let (vars, counts, expected) = (&vars, counts.clone(), &expected);
                s.spawn(move || {
                    let mut rng = Rng(t * 7919 + 1);
                    for _ in 0..3000 {
                        let a = rng.below(4);
                        let b = (a + 1 + rng.below(3)) % 4;
                        // Opposite orders from different threads: the classic lock-order cycle.
                        let w = if t % 2 == 0 {
                            vec![vars[a].clone(), vars[b].clone()]
                        } else {
                            vec![vars[b].clone(), vars[a].clone()]
                        };
                        expected[a].fetch_add(1, Ordering::Relaxed);
                        expected[b].fetch_add(1, Ordering::Relaxed);
                        let c = counts.clone();
                        e.submit(Push::sync(
                            move |_| {
                                for i in [a, b] {
                                    let v = c[i].load(Ordering::Relaxed);
                                    c[i].store(v + 1, Ordering::Relaxed);
                                }
                                Ok(())
                            },
                            vec![],
                            w,
                        ))
                        .unwrap();
                    }
                });
            }
        });
        e.wait_all().unwrap();
        for i in 0..4 {
            assert_eq!(counts[i].load(Ordering::Relaxed), expected[i].load(Ordering::Relaxed), "{kind:?}");
        }
    }
}

/// A benchmark, not a check: the cost of a push of an empty operation on one variable,
/// without the C boundary. `cargo test --release bench_push_cost -- --ignored --nocapture`.
#[test]
#[ignore]
fn bench_push_cost() {
    for kind in [EngineKind::Naive, EngineKind::PerDevice] {
        let e = engine(kind, 1);
        let v = Var::new();
        let n = 300_000;
        for _ in 0..3 {
            let t = std::time::Instant::now();
            for _ in 0..n {
                e.submit(Push::sync(|_| Ok(()), vec![], vec![v.clone()])).unwrap();
            }
            e.wait_all().unwrap();
            println!("{kind:?}: {:.3} us/op", t.elapsed().as_secs_f64() / n as f64 * 1e6);
        }
    }
}

#[test]
fn exec_bulk_settings_follow_the_configuration() {
    use crate::config::{vars::VARS, MapEnv, Registry};
    let reg = Registry::new(VARS, Box::new(MapEnv::with(&[])));
    let b = ExecBulk::from_config(&reg).unwrap();
    assert_eq!(b, ExecBulk { inference: true, train: true, max_node_train: 15 });
    assert_eq!((b.segment_size(true, 100), b.segment_size(false, 100)), (15, 100));
    let reg = Registry::new(
        VARS,
        Box::new(MapEnv::with(&[("MXNET_EXEC_BULK_EXEC_TRAIN", "0"), ("MXNET_EXEC_BULK_EXEC_INFERENCE", "0")])),
    );
    let b = ExecBulk::from_config(&reg).unwrap();
    assert_eq!((b.segment_size(true, 100), b.segment_size(false, 100)), (1, 1));
    // Dynamic: the next bind sees a change.
    reg.set_env("MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN", Some("3")).unwrap();
    reg.set_env("MXNET_EXEC_BULK_EXEC_TRAIN", Some("1")).unwrap();
    assert_eq!(ExecBulk::from_config(&reg).unwrap().segment_size(true, 100), 3);
    let bad = Registry::new(VARS, Box::new(MapEnv::with(&[("MXNET_EXEC_BULK_EXEC_TRAIN", "yes")])));
    assert!(ExecBulk::from_config(&bad).unwrap_err().to_string().contains("MXNET_EXEC_BULK_EXEC_TRAIN"));
}

/// A variable's scheduling state sits 128 bytes after its `Arc`'s reference counts (see
/// `Var`), and the `Arc`'s allocation is 256 bytes, word-aligned (mimalloc's plain fast path).
#[test]
fn variable_state_is_two_cache_lines_from_its_counts() {
    let v = Var::new();
    let arc_start = Arc::as_ptr(&v) as usize - 2 * std::mem::size_of::<usize>();
    assert_eq!(v.state_addr() - arc_start, 128);
    assert_eq!(std::mem::size_of::<Var>() + 2 * std::mem::size_of::<usize>(), 256);
    assert_eq!(std::mem::align_of::<Var>(), std::mem::size_of::<usize>());
}

/// An operation finished on a worker is dropped (with its variables, and so their data) once
/// the workers go idle, without another push or a wait from the pushing thread.
#[test]
fn finished_operations_are_dropped_when_workers_go_idle() {
    let e = engine(EngineKind::PerDevice, 1);
    let v = Var::new();
    let weak = Arc::downgrade(&v);
    e.submit(Push::sync(|_| Ok(()), vec![], vec![v])).unwrap();
    let t0 = std::time::Instant::now();
    while weak.strong_count() > 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "the finished operation still holds its variable");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// More operations than a queue batch while the only worker is held up, then more while it
/// works through them: the order of a chain on one variable holds throughout.
#[test]
fn a_long_chain_behind_a_held_worker_keeps_push_order() {
    let e = engine(EngineKind::PerDevice, 1);
    let gate_tx = hold_a_worker(e);
    let n = 3000;
    let v = Var::new();
    let order: Arc<Mutex<Vec<usize>>> = Default::default();
    let push_n = |range: std::ops::Range<usize>| {
        for i in range {
            let o = order.clone();
            e.submit(Push::sync(
                move |_| {
                    o.lock().push(i);
                    Ok(())
                },
                vec![],
                vec![v.clone()],
            ))
            .unwrap();
        }
    };
    push_n(0..n);
    gate_tx.send(()).unwrap();
    push_n(n..2 * n);
    e.wait_all().unwrap();
    assert_eq!(*order.lock(), (0..2 * n).collect::<Vec<_>>());
}

/// A push from a second thread that happens after the first thread's pushes runs after them.
#[test]
fn a_second_pusher_comes_after_the_first_pushers_operations() {
    for workers in [1, 2] {
        let e = engine(EngineKind::PerDevice, workers);
        let v = Var::new();
        let order: Arc<Mutex<Vec<usize>>> = Default::default();
        let n = 2000;
        for i in 0..n {
            let o = order.clone();
            e.submit(Push::sync(
                move |_| {
                    o.lock().push(i);
                    Ok(())
                },
                vec![],
                vec![v.clone()],
            ))
            .unwrap();
        }
        let (o, v2) = (order.clone(), v.clone());
        std::thread::spawn(move || {
            e.submit(Push::sync(
                move |_| {
                    let _: () = o.lock().push(n);
                    Ok(())
                },
                vec![v2],
                vec![],
            ))
            .unwrap();
        })
        .join()
        .unwrap();
        e.wait_all().unwrap();
        assert_eq!(*order.lock(), (0..=n).collect::<Vec<_>>());
    }
}

/// Finished operations hold their variables until they are dropped: a wait drops them, so
/// the last reference to freed data does not outlive the wait, also behind an operation
/// that still runs.
#[test]
fn a_wait_releases_the_variables_of_finished_operations() {
    let e = engine(EngineKind::PerDevice, 2);
    let gate_tx = hold_a_worker(e);
    let v = Var::new();
    let weak = Arc::downgrade(&v);
    for _ in 0..10 {
        e.submit(Push::sync(|_| Ok(()), vec![], vec![v.clone()])).unwrap();
    }
    e.wait_for_var(&v, true).unwrap();
    drop(v);
    assert_eq!(weak.strong_count(), 0, "a finished operation still holds the variable after the wait");
    gate_tx.send(()).unwrap();
    e.wait_all().unwrap();
}

/// C functions (`Func::Raw`, as the C API pushes them): a chain while the only worker is held
/// up keeps push order, every deleter runs once (also for a push refused for a variable
/// listed twice, which runs nothing), and a wait releases the variables.
#[test]
fn c_functions_keep_order_run_deleters_once_and_release_their_variables() {
    use std::ffi::c_void;
    static ORDER: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());
    static DELETED: AtomicUsize = AtomicUsize::new(0);
    extern "C" fn record(_rctx: *mut c_void, param: *mut c_void) {
        ORDER.lock().unwrap().push(param as usize);
    }
    extern "C" fn deleted(_param: *mut c_void) {
        DELETED.fetch_add(1, Ordering::SeqCst);
    }
    // SAFETY: `record` and `deleted` may be called once each, from any thread.
    let raw = |i: usize| unsafe { RawFn::new(record, i as *mut c_void, Some(deleted)) };
    let e = engine(EngineKind::PerDevice, 1);
    let gate_tx = hold_a_worker(e);
    let v = Var::new();
    let weak = Arc::downgrade(&v);
    let n = 3000;
    for i in 0..n {
        e.submit(Push::raw(raw(i), vec![], vec![v.clone()], Context::CPU)).unwrap();
    }
    let refused = e.submit(Push::raw(raw(n), vec![v.clone()], vec![v.clone()], Context::CPU));
    assert!(refused.unwrap_err().to_string().contains("twice"));
    gate_tx.send(()).unwrap();
    drop(v);
    e.wait_all().unwrap();
    assert_eq!(*ORDER.lock().unwrap(), (0..n).collect::<Vec<_>>());
    assert_eq!(DELETED.load(Ordering::SeqCst), n + 1, "each deleter runs once");
    assert_eq!(weak.strong_count(), 0, "an operation still holds the variable after the wait");
}

/// [`Engine::route`] is the rule: bulk, here (solo or holding the variables), queue.
#[test]
fn route_follows_the_rule() {
    let sync = |cheap: bool| {
        let mut p = Push::sync(|_| Ok(()), vec![], vec![Var::new()]);
        p.cheap = cheap;
        p
    };
    let asynchronous = || Push::asynchronous(|_, done| done.complete(Ok(())), vec![], vec![Var::new()]);
    let name = |r: Route| match r {
        Route::Bulk => "bulk",
        Route::Solo(_) => "solo",
        Route::Here => "here",
        Route::Queue(Some(_)) => "workers",
        Route::Queue(None) => "inline",
    };
    // NaiveEngine: every synchronous function here, solo while one thread pushes; an
    // asynchronous one is registered on this thread.
    let naive = engine(EngineKind::Naive, 1);
    assert_eq!(name(naive.route(&sync(false), true).unwrap()), "solo");
    assert_eq!(name(naive.route(&asynchronous(), true).unwrap()), "inline");
    std::thread::scope(|t| {
        t.spawn(|| naive.wait_all().unwrap());
    });
    assert_eq!(name(naive.route(&sync(false), true).unwrap()), "here", "a second thread ended solo mode");
    // A threaded engine: only cheap operations on an idle engine, from outside the workers.
    let e = engine(EngineKind::PerDevice, 1);
    assert_eq!(name(e.route(&sync(false), true).unwrap()), "workers");
    assert_eq!(name(e.route(&sync(true), true).unwrap()), "solo");
    assert_eq!(name(e.route(&asynchronous(), true).unwrap()), "workers");
    let gate_tx = hold_a_worker(e);
    assert_eq!(name(e.route(&sync(true), true).unwrap()), "workers", "something is pending");
    gate_tx.send(()).unwrap();
    e.wait_all().unwrap();
    // A recorded failure: everything is queued, where the variables' marks are checked.
    e.submit(Push::sync(|_| Err(Error::value("x")), vec![], vec![Var::new()])).unwrap();
    assert_eq!(name(e.route(&sync(true), true).unwrap()), "workers");
    assert!(e.wait_all().is_err());
    assert_eq!(name(e.route(&sync(true), true).unwrap()), "solo");
    // A device that does not exist: refused, whatever the path.
    let strict = Engine::start(EngineOptions::new(EngineKind::PerDevice));
    let mut gpu = sync(true);
    gpu.ctx = Context { dev_type: DevType::Gpu, dev_id: 4096 };
    assert!(strict.route(&gpu, true).is_err());
    // A thread that bulks: plain synchronous operations join its bulk; one waited for, or
    // an asynchronous one, pushes the bulk and takes its own way.
    let _scope = e.bulk_scope(4);
    assert_eq!(name(e.route(&sync(false), true).unwrap()), "bulk");
    assert_eq!(name(e.route(&sync(true), true).unwrap()), "bulk");
    let mut waited = sync(false);
    waited.wait = true;
    assert_eq!(name(e.route(&waited, true).unwrap()), "workers");
    assert_eq!(name(e.route(&asynchronous(), true).unwrap()), "workers");
    assert_eq!(name(e.route(&sync(false), false).unwrap()), "workers", "a bulk being pushed");
}

/// A thread that bulks on one engine and then sets a bulk size on another pushes what it
/// batched for the first there, in push order, before the first stops counting it.
#[test]
fn switching_the_bulking_engine_pushes_what_was_batched_in_order() {
    let (e1, e2) = (engine(EngineKind::PerDevice, 1), engine(EngineKind::PerDevice, 1));
    let v = Var::new();
    let order: Arc<Mutex<Vec<usize>>> = Default::default();
    let push = |e: &'static Engine, i: usize| {
        let o = order.clone();
        e.submit(Push::sync(
            move |_| {
                o.lock().push(i);
                Ok(())
            },
            vec![],
            vec![v.clone()],
        ))
        .unwrap();
    };
    e2.set_bulk_size(4);
    push(e2, 0);
    push(e2, 1);
    e1.set_bulk_size(4);
    assert_eq!(e2.bulk_threads.load(Ordering::SeqCst), 0);
    push(e2, 2);
    e2.wait_for_var(&v, true).unwrap();
    assert_eq!(*order.lock(), [0, 1, 2], "the batched operations were pushed first");
    e1.set_bulk_size(0);
    assert_eq!(e1.bulk_threads.load(Ordering::SeqCst), 0);
}
