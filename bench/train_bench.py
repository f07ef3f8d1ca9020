#!/usr/bin/env python3
"""One training step of seed 004's Gluon CNN (Conv2D(20,5,relu) → MaxPool → Conv2D(50,5,relu) →
MaxPool → Flatten → Dense(512,relu) → Dense(10); SoftmaxCrossEntropyLoss; SGD lr 0.1; batch 64
of 1×28×28) on mxnet-rt vs stock MXNet 1.9.1, both under the same stock Python frontend, in one
run. Modes: imperative and hybridized, each with the profiler stopped and running (profile_all,
aggregate_stats); then the profiler's cost again within one process, alternating blocks of steps
with it stopped and running. A step is forward + loss under autograd.record, backward, trainer.step, then
waitall. Each configuration is a fresh interpreter; libraries alternate. Reports the median
step time, the ratio mxnet-rt / stock, the profiler's overhead, and the peak resident memory
the training added over the import (VmHWM after training minus VmRSS after import). Markdown
on stdout and in bench/results/train.md.

    .venv/bin/python bench/train_bench.py [steps] [repetitions]
"""
import json
import os
import statistics
import subprocess
import sys

from common import libraries, write_result

CHILD = r"""
import json, sys, time, os, statistics
import numpy as np
import mxnet as mx
from mxnet import autograd, gluon, profiler

def rss():
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024

steps, hybrid, prof = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3] == "1"
rss0, _ = rss()
mx.random.seed(1)
net = gluon.nn.HybridSequential()
with net.name_scope():
    net.add(gluon.nn.Conv2D(channels=20, kernel_size=5, activation='relu'))
    net.add(gluon.nn.MaxPool2D(pool_size=2, strides=2))
    net.add(gluon.nn.Conv2D(channels=50, kernel_size=5, activation='relu'))
    net.add(gluon.nn.MaxPool2D(pool_size=2, strides=2))
    net.add(gluon.nn.Flatten())
    net.add(gluon.nn.Dense(512, activation="relu"))
    net.add(gluon.nn.Dense(10))
net.collect_params().initialize(mx.init.Xavier(), ctx=mx.cpu())
if hybrid:
    net.hybridize()
trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
rng = np.random.RandomState(0)
data = mx.nd.array(rng.uniform(0, 1, (64, 1, 28, 28)))
label = mx.nd.array(rng.randint(0, 10, 64))

def step():
    with autograd.record():
        out = net(data)
        loss = loss_fn(out, label)
    loss.backward()
    trainer.step(data.shape[0])
    mx.nd.waitall()

for _ in range(3):
    step()
if sys.argv[3] == "alt":
    # The profiler's cost within one process: blocks of steps with it stopped and running,
    # alternating (and alternating which comes first), so both see the same heap, caches and
    # machine load; reports the median step of each state.
    profiler.set_config(profile_all=True, aggregate_stats=True, filename="train_bench_profile.json")
    samples = {False: [], True: []}
    for r in range(steps):
        for running in ((False, True) if r % 2 == 0 else (True, False)):
            profiler.set_state('run' if running else 'stop')
            for _ in range(4):
                t = time.perf_counter()
                step()
                samples[running].append(time.perf_counter() - t)
    profiler.set_state('stop')
    print(json.dumps({"off_ms": statistics.median(samples[False]) * 1e3, "on_ms": statistics.median(samples[True]) * 1e3}))
    sys.exit(0)
if prof:
    profiler.set_config(profile_all=True, aggregate_stats=True, filename="train_bench_profile.json")
    profiler.set_state('run')
times = []
for _ in range(steps):
    t = time.perf_counter()
    step()
    times.append(time.perf_counter() - t)
if prof:
    profiler.set_state('stop')
_, peak = rss()
print(json.dumps({"step_ms": statistics.median(times) * 1e3, "peak_mib": peak - rss0}))
"""


def child(lib_name, lib, steps, hybrid, prof, cwd):
    """`prof`: 0 stopped, 1 running, "alt" both, alternating within one process."""
    env = dict(os.environ)
    env.pop("MXNET_LIBRARY_PATH", None)
    if lib_name == "mxnet-rt":
        env["MXNET_LIBRARY_PATH"] = str(lib)
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", CHILD, str(steps), str(int(hybrid)), str(prof if prof == "alt" else int(prof))],
                         env=env, capture_output=True, text=True, timeout=900, cwd=cwd)
    if out.returncode != 0:
        raise RuntimeError(f"{lib_name}: {out.stderr.strip()[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    import tempfile
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    libs = libraries()
    configs = [(h, p) for h in (False, True) for p in (False, True)]
    res = {(n, h, p): [] for n in libs for (h, p) in configs}
    alt = {(n, h): [] for n in libs for h in (False, True)}
    with tempfile.TemporaryDirectory() as cwd:
        for _ in range(reps):
            for (h, p) in configs:
                for name, lib in libs.items():
                    res[(name, h, p)].append(child(name, lib, steps, h, p, cwd))
            for h in (False, True):
                for name, lib in libs.items():
                    alt[(name, h)].append(child(name, lib, steps, h, "alt", cwd))
    med = {k: (statistics.median(r["step_ms"] for r in v), statistics.median(r["peak_mib"] for r in v)) for k, v in res.items()}
    rt, st = "mxnet-rt", "stock 1.9.1"
    lines = [f"Seed 004 CNN, one training step at batch 64 (median of {steps} steps × {reps} runs; "
             f"peak = resident memory added by training over the import).", "",
             "| mode | profiler | mxnet-rt ms | stock ms | ratio (≤ 0.8 wanted) | mxnet-rt peak MiB | stock peak MiB |",
             "|---|---|---|---|---|---|---|"]
    for (h, p) in configs:
        a, b = med[(rt, h, p)], med[(st, h, p)]
        lines.append(f"| {'hybridized' if h else 'imperative'} | {'running' if p else 'stopped'} | {a[0]:.1f} | {b[0]:.1f} | "
                     f"{a[0] / b[0]:.2f} | {a[1]:.0f} | {b[1]:.0f} |")
    lines.append("")
    for h in (False, True):
        for n in libs:
            off, on = med[(n, h, False)][0], med[(n, h, True)][0]
            lines.append(f"- {n}, {'hybridized' if h else 'imperative'}: the running profiler adds {100 * (on / off - 1):+.1f}% (separate processes)")
    lines += ["", "The profiler's cost within one process: blocks of 4 steps with it stopped and running, "
              f"alternating, {steps} rounds per process × {reps} processes; the median step of each state per "
              "process, then the median over processes (≤ +3% wanted).", "",
              "| mode | library | stopped ms | running ms | the profiler adds | per process |", "|---|---|---|---|---|---|"]
    for h in (False, True):
        for n in libs:
            runs = alt[(n, h)]
            per = [100 * (r["on_ms"] / r["off_ms"] - 1) for r in runs]
            off = statistics.median(r["off_ms"] for r in runs)
            on = statistics.median(r["on_ms"] for r in runs)
            lines.append(f"| {'hybridized' if h else 'imperative'} | {n} | {off:.1f} | {on:.1f} | {statistics.median(per):+.1f}% | "
                         + ", ".join(f"{x:+.1f}%" for x in per) + " |")
    write_result("train.md", "\n".join(lines))


if __name__ == "__main__":
    main()
