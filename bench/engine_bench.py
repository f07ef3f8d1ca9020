#!/usr/bin/env python3
"""Engine overhead of mxnet-rt vs the stock MXNet 1.9.1 libmxnet.so, side by side.

Builds bench/engine_bench.c, then runs it against both libraries for each engine type and
pattern, alternating libraries, several times; reports medians and ratios (ours / stock) as
a Markdown table on stdout and in bench/results/engine.md.

    .venv/bin/python bench/engine_bench.py [--quick]

Needs: target/release/libmxnet.so (cargo build --release) and the stock wheel in the venv
(scripts/test.sh installs mxnet==1.9.1 into .venv).
"""
import argparse
import statistics

from common import build, libraries, run as run_bench, write_result


def run(exe, lib, engine, pattern, n, reps, workers=None):
    extra = {"MXNET_ENGINE_TYPE": engine}
    if workers:
        extra["MXNET_CPU_WORKER_NTHREADS"] = workers
    return run_bench(exe, lib, [pattern, n, reps], **extra)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer ops and repetitions")
    args = ap.parse_args()
    n, reps, rounds = (50_000, 3, 2) if args.quick else (200_000, 5, 5)
    exe = build("engine_bench.c")
    libs = libraries()
    rows = []
    cases = [(e, p) for e in ("ThreadedEnginePerDevice", "ThreadedEngine", "NaiveEngine")
             for p in ("chain", "independent", "fanin")]
    for engine, pattern in cases:
        samples = {k: [] for k in libs}
        for _ in range(rounds):  # alternate libraries to share the machine's noise
            for name, lib in libs.items():
                samples[name] += [r["us_per_op"] for r in run(exe, lib, engine, pattern, n, reps)]
        med = {k: statistics.median(v) for k, v in samples.items()}
        rows.append((engine, pattern, med["mxnet-rt"], med["stock 1.9.1"]))
        print(f"{engine:24} {pattern:12} ours {med['mxnet-rt']:.3f} us/op  stock {med['stock 1.9.1']:.3f} us/op")
    # 4000 independent 50 us operations on 2 CPU workers, against running them serially.
    par = {k: [] for k in libs}
    for _ in range(rounds):
        for name, lib in libs.items():
            par[name] += [r["seconds"] for r in run(exe, lib, "ThreadedEnginePerDevice", "work50us", 4000, reps, workers=2)]
    serial = 4000 * 50e-6
    lines = [
        "| engine | pattern | mxnet-rt µs/op | stock µs/op | ours / stock |",
        "|---|---|---|---|---|",
    ]
    for engine, pattern, ours, stock in rows:
        lines.append(f"| {engine} | {pattern} | {ours:.3f} | {stock:.3f} | {ours / stock:.3f} |")
    lines.append("")
    lines.append("| 4000 × 50 µs ops, 2 CPU workers | seconds (median) | speed-up over serial (0.200 s) |")
    lines.append("|---|---|---|")
    for name in libs:
        s = statistics.median(par[name])
        lines.append(f"| {name} | {s:.4f} | {serial / s:.2f}× |")
    write_result("engine.md", "\n".join(lines))


if __name__ == "__main__":
    main()
