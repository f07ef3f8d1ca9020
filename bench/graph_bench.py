#!/usr/bin/env python3
"""Graph building cost of mxnet-rt vs stock MXNet 1.9.1 (the same stock Python frontend on
both libraries), issue 34 item 3: a chain of n `relu` nodes loaded from JSON, a CachedOp
created on it, and a chain of n compositions (`mx.sym.relu(y)` n times). Each measurement is
a fresh interpreter; the libraries alternate; medians of seconds. Markdown on stdout and in
bench/results/graph.md. Linear cost shows as times that grow with n, not n².

    .venv/bin/python bench/graph_bench.py [repetitions]
"""
import json
import os
import statistics
import subprocess
import sys

from common import libraries, write_result

CHILD = r"""
import json, sys, time
import mxnet as mx
n, what = int(sys.argv[1]), sys.argv[2]
t = time.perf_counter()
if what == "compose":
    y = mx.sym.var("x")
    for _ in range(n):
        y = mx.sym.relu(y)
else:
    nodes = [{"op": "null", "name": "x", "inputs": []}]
    nodes += [{"op": "relu", "name": "r%d" % i, "inputs": [[i - 1, 0, 0]]} for i in range(1, n + 1)]
    text = json.dumps({"nodes": nodes, "arg_nodes": [0], "heads": [[n, 0, 0]]})
    t = time.perf_counter()
    s = mx.sym.load_json(text)
    if what == "cachedop":
        t = time.perf_counter()
        op = mx.nd.CachedOp(s)
print(json.dumps({"s": time.perf_counter() - t}))
"""

CASES = [("load_json", 20000), ("load_json", 100000), ("cachedop", 20000), ("cachedop", 100000),
         ("compose", 5000), ("compose", 20000), ("compose", 50000)]


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    libs = libraries()
    times = {(c, n, name): [] for c, n in CASES for name in libs}
    for _ in range(reps):
        for case, n in CASES:
            for name, lib in libs.items():
                env = dict(os.environ, MXNET_LIBRARY_PATH=str(lib))
                out = subprocess.run([sys.executable, "-c", CHILD, str(n), case], env=env,
                                     capture_output=True, text=True, timeout=900)
                if out.returncode != 0:
                    sys.exit(f"{name} {case} {n}: {out.stderr.strip()[-500:]}")
                times[(case, n, name)].append(json.loads(out.stdout.strip().splitlines()[-1])["s"])
    names = list(libs)
    rows = ["| case | n | " + " | ".join(f"{x} (s)" for x in names) + " | rt / stock |",
            "|---|---|" + "---|" * (len(names) + 1)]
    for case, n in CASES:
        med = [statistics.median(times[(case, n, x)]) for x in names]
        rows.append(f"| {case} | {n} | " + " | ".join(f"{m:.3f}" for m in med) + f" | {med[0] / med[1]:.2f} |")
    table = ("# Graph building\n\n`.venv/bin/python bench/graph_bench.py`: seconds per case, medians of "
             f"{reps} alternating fresh processes per library.\n\n" + "\n".join(rows) + "\n")
    write_result("graph.md", table)


if __name__ == "__main__":
    main()
