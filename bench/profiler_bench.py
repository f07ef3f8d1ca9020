#!/usr/bin/env python3
"""What the profiler costs per engine operation, ours and stock, side by side.

Runs bench/engine_bench.c (empty operations through MXEnginePushSyncND) against:
  * mxnet-rt built with the `no-profiler-sites` feature (event sites compiled out),
  * mxnet-rt with the profiler stopped, and running (profile_all, no dumps),
  * the stock 1.9.1 library with its profiler stopped and running,
alternating libraries, several rounds; reports medians and the ratios the profiler issue
targets (stopped / no sites <= 1.02, running / stopped <= 2) as Markdown on stdout and in
bench/results/profiler.md.

    .venv/bin/python bench/profiler_bench.py [--quick]

Builds target/noprof/release/libmxnet.so itself (cargo, feature no-profiler-sites).
"""
import argparse
import os
import statistics
import subprocess
import tempfile

from common import ROOT, build, libraries, run as run_bench, write_result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer ops and repetitions")
    args = ap.parse_args()
    n, reps, rounds = (50_000, 3, 2) if args.quick else (200_000, 5, 3)
    subprocess.run(["cargo", "build", "--release", "--lib", "--features", "no-profiler-sites",
                    "--target-dir", str(ROOT / "target" / "noprof")], check=True, cwd=ROOT)
    libs = libraries()
    variants = {
        "rt, no sites": (ROOT / "target" / "noprof" / "release" / "libmxnet.so", "0"),
        "rt, stopped": (libs["mxnet-rt"], "0"),
        "rt, running": (libs["mxnet-rt"], "1"),
        "stock, stopped": (libs["stock 1.9.1"], "0"),
        "stock, running": (libs["stock 1.9.1"], "1"),
    }
    exe = build("engine_bench.c")
    os.chdir(tempfile.mkdtemp(prefix="profiler_bench"))  # the profiled runs' trace files go here
    lines = [
        "| engine | pattern | " + " | ".join(f"{v} µs/op" for v in variants)
        + " | rt stopped / no sites | rt running / stopped | stock running / stopped |",
        "|---|---|" + "---|" * (len(variants) + 3),
    ]
    for engine in ("ThreadedEnginePerDevice", "NaiveEngine"):
        for pattern in ("chain", "independent"):
            samples = {k: [] for k in variants}
            for _ in range(rounds):
                for name, (lib, prof) in variants.items():
                    rs = run_bench(exe, lib, [pattern, n, reps], MXNET_ENGINE_TYPE=engine, ENGINE_BENCH_PROFILE=prof)
                    samples[name] += [r["us_per_op"] for r in rs]
            m = {k: statistics.median(v) for k, v in samples.items()}
            lines.append(
                f"| {engine} | {pattern} | " + " | ".join(f"{m[k]:.3f}" for k in variants)
                + f" | {m['rt, stopped'] / m['rt, no sites']:.3f} | {m['rt, running'] / m['rt, stopped']:.2f}"
                + f" | {m['stock, running'] / m['stock, stopped']:.2f} |"
            )
            print(lines[-1], flush=True)
    write_result("profiler.md", "\n".join(lines))


if __name__ == "__main__":
    main()
