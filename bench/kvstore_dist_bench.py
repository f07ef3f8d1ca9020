#!/usr/bin/env python3
"""Distributed KVStore of mxnet-rt vs stock MXNet 1.9.1 (the same stock Python frontend on both
libraries). Ours runs N workers under `mpirun -np N` (MPI allreduce, no servers); stock runs N
workers of its parameter-server flow (one scheduler and one server, on loopback), which is how
stock's `dist_sync` runs on one machine. Measured on rank 0:
- `dist_sync` pushpull of a 4M-element float32 gradient on 2 workers (GB/s of gradient per
  worker);
- a data-parallel `gluon.Trainer(kvstore='dist_sync')` step of an MLP (batch 64 per worker) on
  1 and on 2 workers (steps/s per worker).
Each repetition starts fresh processes; the libraries alternate to share the machine's noise.
Medians; Markdown on stdout and in bench/results/kvstore_dist.md. Needs Open MPI (`mpirun`).

    .venv/bin/python bench/kvstore_dist_bench.py [repetitions]
"""
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys

from common import libraries, write_result

CHILD = r"""
import json, sys, time
import mxnet as mx, numpy as np
from mxnet import autograd, gluon
what = sys.argv[1]
kv = mx.kv.create("dist_sync")
out = {}
if what == "pushpull":
    N = 4 * 1024 * 1024
    kv.init(0, mx.nd.zeros((N,)))
    g = mx.nd.ones((N,))
    for _ in range(3):
        kv.pushpull(0, g)
    mx.nd.waitall()
    reps = 20
    t = time.perf_counter()
    for _ in range(reps):
        kv.pushpull(0, g)
    mx.nd.waitall()
    out["pushpull"] = reps * N * 4 / 1e9 / (time.perf_counter() - t)
else:
    X = mx.nd.array(np.random.RandomState(kv.rank).uniform(-1, 1, (64, 256)))
    Y = mx.nd.array(np.random.RandomState(kv.rank + 10).randint(0, 10, (64,)))
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(512, activation="relu", in_units=256), gluon.nn.Dense(512, activation="relu", in_units=512),
            gluon.nn.Dense(10, in_units=512))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9}, kvstore=kv)
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    def step():
        with autograd.record():
            l = loss(net(X), Y)
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
    out["step"] = reps / (time.perf_counter() - t)
kv._barrier()
if kv.rank == 0:
    print(json.dumps(out))
"""

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def last_json(text, who):
    lines = [line for line in text.strip().splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{who}: no result")
    return json.loads(lines[-1])


def run_ours(lib, what, workers):
    env = dict(os.environ, MXNET_LIBRARY_PATH=str(lib), **MPI_ENV)
    r = subprocess.run(["mpirun", "-np", str(workers), "--bind-to", "none", sys.executable, "-W", "ignore", "-c",
                        CHILD, what], env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"mxnet-rt: {r.stderr[-2000:]}")
    return last_json(r.stdout, "mxnet-rt")


def run_stock(what, workers):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "MXNET_LIBRARY_PATH"}
    env.update(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(port), DMLC_NUM_SERVER="1",
               DMLC_NUM_WORKER=str(workers))
    procs = [subprocess.Popen([sys.executable, "-W", "ignore", "-c", CHILD, what], env=dict(env, DMLC_ROLE=role),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for role in ["scheduler", "server"] + ["worker"] * workers]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"stock: {err[-2000:]}")
    return last_json("".join(o for o, _ in outs[2:]), "stock")


ROWS = [
    ("pushpull", 2, "`dist_sync` pushpull of 4M float32 on 2 workers (GB/s per worker)"),
    ("step", 1, "`Trainer(kvstore='dist_sync')` MLP 256-512-512-10 step, batch 64, 1 worker (steps/s)"),
    ("step", 2, "same, 2 workers (steps/s per worker)"),
]


def main():
    if shutil.which("mpirun") is None:
        sys.exit("mpirun not found: install Open MPI (apt-get install openmpi-bin)")
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    ours_lib = libraries()["mxnet-rt"]
    runs = {("ours", w, k): [] for k, w, _ in ROWS} | {("stock", w, k): [] for k, w, _ in ROWS}
    for _ in range(reps):
        for key, workers, _ in ROWS:
            runs["ours", workers, key].append(run_ours(ours_lib, key, workers)[key])
            runs["stock", workers, key].append(run_stock(key, workers)[key])
    load = os.getloadavg()[0]
    lines = [f"Medians of {reps} runs each (fresh processes), libraries alternating ({os.cpu_count()} CPUs, load "
             f"average {load:.1f} at the end). Ours: workers under mpirun; stock: its parameter-server flow with "
             "one server and one scheduler besides the workers. Higher is better; the ratio is ours / stock.", "",
             "| measurement | mxnet-rt | stock 1.9.1 | ours / stock |", "|---|---|---|---|"]
    for key, workers, what in ROWS:
        a, b = statistics.median(runs["ours", workers, key]), statistics.median(runs["stock", workers, key])
        lines.append(f"| {what} | {a:.2f} | {b:.2f} | {a / b:.2f}× |")
    write_result("kvstore_dist.md", "\n".join(lines))


if __name__ == "__main__":
    main()
