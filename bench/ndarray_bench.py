#!/usr/bin/env python3
"""NDArray and storage costs of mxnet-rt vs stock MXNet 1.9.1, side by side in one run:
create + free of a small array through the C API, and SyncCopyFromCPU of 64 MiB against this
machine's memcpy bandwidth. Medians; Markdown on stdout and in bench/results/ndarray.md.

    .venv/bin/python bench/ndarray_bench.py
"""
import statistics

from common import build, libraries, run, write_result


def main():
    libs = libraries()
    exe = build("ndarray_bench.c")
    create = {k: [] for k in libs}
    copy = {k: [] for k in libs}
    memcpy = []
    for _ in range(3):  # alternate the libraries to share the machine's noise
        for name, lib in libs.items():
            create[name] += [r["us_per_op"] for r in run(exe, lib, ["create", 200_000, 3])]
            for r in run(exe, lib, ["copy", 64, 5]):
                copy[name].append(r["copy_gbps"])
                memcpy.append(r["memcpy_gbps"])
    c = {k: statistics.median(v) for k, v in create.items()}
    g = {k: statistics.median(v) for k, v in copy.items()}
    m = statistics.median(memcpy)
    lines = [
        "| measurement | mxnet-rt | stock 1.9.1 | ours / stock |",
        "|---|---|---|---|",
        f"| create + free of a 4-float array (µs) | {c['mxnet-rt']:.3f} | {c['stock 1.9.1']:.3f} | {c['mxnet-rt'] / c['stock 1.9.1']:.3f} |",
        f"| SyncCopyFromCPU of 64 MiB (GB/s) | {g['mxnet-rt']:.2f} | {g['stock 1.9.1']:.2f} | {g['mxnet-rt'] / g['stock 1.9.1']:.3f} |",
        f"| same, as a share of memcpy ({m:.2f} GB/s on this machine) | {g['mxnet-rt'] / m:.0%} | {g['stock 1.9.1'] / m:.0%} | |",
    ]
    write_result("ndarray.md", "\n".join(lines))


if __name__ == "__main__":
    main()
