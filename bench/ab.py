#!/usr/bin/env python3
"""Two builds of mxnet-rt side by side (a change against the build before it): the engine's
push cost, frees from a second thread, operator throughput and the seed 004 CNN's training
step, each measured in alternating processes of the two libraries; medians. Markdown on stdout.

    .venv/bin/python bench/ab.py OLD/libmxnet.so NEW/libmxnet.so [rounds]

Keep a copy of the old build first (`cp target/release/libmxnet.so /tmp/old.so`); the two
libraries must both be built in release mode.
"""
import statistics
import sys
from pathlib import Path

from common import build, run
from train_bench import child

ENGINE = [("chain", 200_000, 5), ("independent", 200_000, 5), ("fanin", 200_000, 5)]
OPS = [("conv1", 0, "gflops"), ("conv2", 0, "gflops"), ("fc", 0, "gflops"), ("add", 16 << 20, "gbps"),
       ("tiny", 20000, "us_per_call")]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    libs = {"old": Path(sys.argv[1]).resolve(), "new": Path(sys.argv[2]).resolve()}
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    engine, nd, ops = build("engine_bench.c"), build("ndarray_bench.c"), build("op_bench.c")
    rows = {}

    def add(key, name, values):
        rows.setdefault(key, {"old": [], "new": []})[name] += values

    import tempfile
    with tempfile.TemporaryDirectory() as cwd:
        for _ in range(rounds):
            for name, lib in libs.items():
                for pattern, n, reps in ENGINE:
                    add(("engine push, ThreadedEnginePerDevice, " + pattern, "µs/op"), name,
                        [r["us_per_op"] for r in run(engine, lib, [pattern, n, reps],
                                                     MXNET_ENGINE_TYPE="ThreadedEnginePerDevice")])
                frees = run(nd, lib, ["free", 20000, 5])
                add(("MXNDArrayFree from a second thread", "µs"), name, [r["other_thread_us"] for r in frees])
                add(("MXNDArrayFree from the pushing thread", "µs"), name, [r["main_thread_us"] for r in frees])
                for case, n, unit in OPS:
                    add((f"op_bench {case}", unit), name, [r[unit] for r in run(ops, lib, [case, n, 5])])
                for hybrid in (False, True):
                    r = child("mxnet-rt", lib, 30, hybrid, False, cwd)
                    add((f"seed 004 CNN training step, {'hybridized' if hybrid else 'imperative'}", "ms"), name,
                        [r["step_ms"]])
    print(f"| measurement | unit | old | new | new / old |\n|---|---|---|---|---|")
    for (label, unit), v in rows.items():
        old, new = statistics.median(v["old"]), statistics.median(v["new"])
        print(f"| {label} | {unit} | {old:.3f} | {new:.3f} | {new / old:.2f} |")


if __name__ == "__main__":
    main()
