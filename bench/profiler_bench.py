#!/usr/bin/env python3
"""What the profiler costs per engine operation, ours and stock, side by side.

Runs bench/engine_bench.c (empty operations through MXEnginePushSyncND) against:
  * mxnet-rt built with the `no-profiler-sites` feature (event sites compiled out),
  * mxnet-rt with the profiler stopped, and running (profile_all, no dumps),
  * the stock 1.9.1 library with its profiler stopped and running,
alternating libraries, several rounds. Reports each variant's median, and the ratios the
profiler issue targets (stopped / no sites <= 1.02, running / stopped <= 2) as the median over
rounds of each round's ratio: the two runs of a round are adjacent in time, so a ratio is less
exposed to the machine's drift than a ratio of overall medians. Markdown on stdout and in
bench/results/profiler.md.

    .venv/bin/python bench/profiler_bench.py [--quick]

Builds target/noprof/release/libmxnet.so itself (cargo, feature no-profiler-sites).
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import tempfile

from common import ROOT, build, libraries, run as run_bench, write_result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer ops and repetitions")
    args = ap.parse_args()
    n, reps, rounds = (50_000, 3, 3) if args.quick else (200_000, 5, 9)
    subprocess.run(["cargo", "build", "--release", "--lib", "-p", "mxnet-rt", "--features", "no-profiler-sites",
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
            rounds_m = []  # per round: {variant: median}
            for r in range(rounds):
                # Alternate the order, so that no variant always runs first or last.
                order = list(variants.items()) if r % 2 == 0 else list(variants.items())[::-1]
                this = {}
                for name, (lib, prof) in order:
                    rs = [x["us_per_op"] for x in run_bench(exe, lib, [pattern, n, reps], MXNET_ENGINE_TYPE=engine, ENGINE_BENCH_PROFILE=prof)]
                    samples[name] += rs
                    this[name] = statistics.median(rs)
                rounds_m.append(this)
            m = {k: statistics.median(v) for k, v in samples.items()}

            def ratio(a, b):
                return statistics.median(x[a] / x[b] for x in rounds_m)
            lines.append(
                f"| {engine} | {pattern} | " + " | ".join(f"{m[k]:.3f}" for k in variants)
                + f" | {ratio('rt, stopped', 'rt, no sites'):.3f} | {ratio('rt, running', 'rt, stopped'):.2f}"
                + f" | {ratio('stock, running', 'stock, stopped'):.2f} |"
            )
            print(lines[-1], flush=True)
    lines += instruction_counts(exe, variants)
    write_result("profiler.md", "\n".join(lines))


def instruction_counts(exe, variants):
    """Instructions per operation under valgrind's callgrind, NaiveEngine chain: exact where
    the timings are noisy. Two runs of different lengths per variant; their difference over the
    difference in operations leaves out loading and setting up the library."""
    if shutil.which("valgrind") is None:
        return ["", "(valgrind not found: no instruction counts)"]
    short, long = 10_000, 30_000

    def collected(lib, prof, n):
        env = dict(os.environ, MXNET_LIBRARY_PATH=str(lib), MXNET_ENGINE_TYPE="NaiveEngine", ENGINE_BENCH_PROFILE=prof)
        out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", str(exe), "chain", str(n), "1"],
                             env=env, capture_output=True, text=True, timeout=900)
        found = re.search(r"Collected : (\d+)", out.stderr)
        if out.returncode != 0 or not found:
            raise RuntimeError(f"callgrind {lib}: {out.stderr.strip()[-2000:]}")
        return int(found.group(1))

    per_op = {name: (collected(lib, prof, long) - collected(lib, prof, short)) / (long - short)
              for name, (lib, prof) in variants.items()}
    base, stopped = per_op["rt, no sites"], per_op["rt, stopped"]
    return ["", "Instructions per operation (callgrind; NaiveEngine, chain; exact, unlike the timings):", "",
            "| " + " | ".join(variants) + " | rt stopped / no sites |", "|" + "---|" * (len(variants) + 1),
            "| " + " | ".join(f"{per_op[k]:.0f}" for k in variants) + f" | {stopped / base:.3f} |"]


if __name__ == "__main__":
    main()
