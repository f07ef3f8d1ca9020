#!/usr/bin/env python3
"""Operator throughput of mxnet-rt vs stock MXNet 1.9.1, side by side in one run, through the
C ABI (bench/op_bench.c): dot 1024x1024, elemwise_add and sum of 16M floats, the tutorial's two
convolutions, FullyConnected 64x800->512, and the per-call cost of a tiny elemwise_add.
Both libraries run with their default engine (ThreadedEnginePerDevice) and all cores. The
libraries alternate over rounds to share the machine's noise; medians. Markdown on stdout and
in bench/results/ops.md.

    .venv/bin/python bench/op_bench.py
"""
import statistics

from common import build, libraries, run, write_result

CASES = [
    # (case, N, unit, label, target as "ours >= x" or "ours <= x" on the ratio or absolute)
    ("dot", 1024, "gflops", "dot 1024x1024 float32 (GFLOP/s)", "≥ 200 GFLOP/s"),
    ("add", 16 << 20, "gbps", "elemwise_add of 16M floats (GB/s)", "≥ 20 GB/s"),
    ("sum", 16 << 20, "gbps", "sum of 16M floats (GB/s)", "≥ 15 GB/s"),
    ("conv1", 0, "gflops", "Convolution 64x1x28x28, 20 5x5 (GFLOP/s)", "≥ stock"),
    ("conv2", 0, "gflops", "Convolution 64x20x12x12, 50 5x5 (GFLOP/s)", "≥ stock"),
    ("fc", 0, "gflops", "FullyConnected 64x800→512 (GFLOP/s)", "≥ stock"),
    ("tiny", 20000, "us_per_call", "elemwise_add on 1-element arrays (µs per call)", "≤ 1 µs"),
]
ROUNDS = 3
REPS = 5


def main():
    libs = libraries()
    exe = build("op_bench.c")
    results = {(c[0], lib): [] for c in CASES for lib in libs}
    for _ in range(ROUNDS):
        for case, n, unit, _, _ in CASES:
            for name, lib in libs.items():
                results[(case, name)] += [r[unit] for r in run(exe, lib, [case, n, REPS])]
    lines = ["| operation | mxnet-rt | stock 1.9.1 | ours / stock | target |", "|---|---|---|---|---|"]
    for case, _, unit, label, target in CASES:
        ours = statistics.median(results[(case, "mxnet-rt")])
        stock = statistics.median(results[(case, "stock 1.9.1")])
        ratio = ours / stock
        lines.append(f"| {label} | {ours:.2f} | {stock:.2f} | {ratio:.2f}× | {target} |")
    write_result("ops.md", "\n".join(lines))


if __name__ == "__main__":
    main()
