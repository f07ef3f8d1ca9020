#!/usr/bin/env python3
"""KVStore of mxnet-rt vs stock MXNet 1.9.1 (the same stock Python frontend on both libraries):
push+pull throughput of `local` and `device` stores summing 2 and 4 copies of a 4M-element
float32 gradient over CPU contexts (GB/s of gradient summed), and a data-parallel training
step of a small MLP with `gluon.Trainer(kvstore='device')` over two CPU contexts, with and
without `update_on_kvstore` (steps/s). Each repetition is a fresh interpreter; the libraries
alternate to share the machine's noise. Medians; Markdown on stdout and in
bench/results/kvstore.md.

    .venv/bin/python bench/kvstore_bench.py [repetitions]
"""
import os
import statistics
import sys

from common import libraries, run_python, write_result

CHILD = r"""
import json, time
import mxnet as mx, numpy as np
from mxnet import autograd, gluon
out = {}
N = 4 * 1024 * 1024
for name in ("local", "device"):
    for copies in (2, 4):
        kv = mx.kv.create(name)
        kv.init(0, mx.nd.zeros((N,)))
        grads = [mx.nd.ones((N,), ctx=mx.cpu(k)) for k in range(copies)]
        kv.pushpull(0, grads)  # warm-up: buffers allocated
        mx.nd.waitall()
        reps = 20
        t = time.perf_counter()
        for _ in range(reps):
            kv.pushpull(0, grads)
        mx.nd.waitall()
        out[f"{name}{copies}"] = reps * copies * N * 4 / 1e9 / (time.perf_counter() - t)

ctxs = [mx.cpu(0), mx.cpu(1)]
X = mx.nd.array(np.random.RandomState(0).uniform(-1, 1, (64, 256)))
Y = mx.nd.array(np.random.RandomState(1).randint(0, 10, (64,)))
for on_kv in (True, False):
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(512, activation="relu", in_units=256), gluon.nn.Dense(512, activation="relu", in_units=512),
            gluon.nn.Dense(10, in_units=512))
    net.initialize(mx.init.Xavier(), ctx=ctxs)
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9},
                            kvstore="device", update_on_kvstore=on_kv)
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    xs, ys = gluon.utils.split_and_load(X, ctxs), gluon.utils.split_and_load(Y, ctxs)
    def step():
        with autograd.record():
            ls = [loss(net(x), y) for x, y in zip(xs, ys)]
        for l in ls:
            l.backward()
        trainer.step(64)
    for _ in range(3):
        step()
    mx.nd.waitall()
    reps = 30
    t = time.perf_counter()
    for _ in range(reps):
        step()
    mx.nd.waitall()
    out[f"trainer{int(on_kv)}"] = reps / (time.perf_counter() - t)
print(json.dumps(out))
"""

ROWS = [
    ("local2", "`local` pushpull, 2 × 4M float32 (GB/s summed)"),
    ("local4", "`local` pushpull, 4 × 4M float32 (GB/s summed)"),
    ("device2", "`device` pushpull, 2 × 4M float32 (GB/s summed)"),
    ("device4", "`device` pushpull, 4 × 4M float32 (GB/s summed)"),
    ("trainer1", "`Trainer(kvstore='device')`, MLP 256-512-512-10, batch 64 on 2 CPU contexts, update on kvstore (steps/s)"),
    ("trainer0", "same, `update_on_kvstore=False` (steps/s)"),
]


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    libs = libraries()
    runs = {k: [] for k in libs}
    for _ in range(reps):
        for name, lib in libs.items():
            runs[name].append(run_python(name, lib, CHILD))
    ours, stock = ("mxnet-rt", "stock 1.9.1")
    med = {k: {key: statistics.median(r[key] for r in runs[k]) for key, _ in ROWS} for k in runs}
    load = os.getloadavg()[0]
    lines = [f"Medians of {reps} fresh interpreters each, libraries alternating ({os.cpu_count()} CPUs, load average "
             f"{load:.1f} at the end). Higher is better in every row; the ratio is ours / stock.", "",
             "| measurement | mxnet-rt | stock 1.9.1 | ours / stock |", "|---|---|---|---|"]
    for key, what in ROWS:
        a, b = med[ours][key], med[stock][key]
        lines.append(f"| {what} | {a:.2f} | {b:.2f} | {a / b:.2f}× |")
    write_result("kvstore.md", "\n".join(lines))


if __name__ == "__main__":
    main()
