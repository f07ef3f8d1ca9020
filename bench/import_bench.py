#!/usr/bin/env python3
"""`import mxnet` cost of mxnet-rt vs stock MXNet 1.9.1 (the same stock Python frontend on both
libraries): wall time of the import, whole-process wall time, and resident memory after the
import and after a small NDArray workload. Each repetition is a fresh interpreter; the libraries
alternate to share the machine's noise. Medians; Markdown on stdout and in
bench/results/import.md.

    .venv/bin/python bench/import_bench.py [repetitions]
"""
import json
import os
import statistics
import subprocess
import sys
import time

from common import libraries, write_result

CHILD = r"""
import json, time
t0 = time.perf_counter()
import mxnet as mx
t1 = time.perf_counter()

def rss_mib():
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024

rss_import, _ = rss_mib()
a = mx.nd.random.uniform(shape=(256, 256))
for _ in range(20):
    a = mx.nd.dot(a, a) / 256 + a.sum(axis=0)
b = a[10:20].asnumpy()
mx.nd.waitall()
t2 = time.perf_counter()
rss_work, peak = rss_mib()
print(json.dumps({"import_s": t1 - t0, "work_s": t2 - t1, "rss_import": rss_import, "rss_work": rss_work, "peak": peak}))
"""


def child(lib_name, lib):
    env = dict(os.environ)
    env.pop("MXNET_LIBRARY_PATH", None)
    if lib_name == "mxnet-rt":
        env["MXNET_LIBRARY_PATH"] = str(lib)  # stock: the wheel loads its own library
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - t
    if out.returncode != 0:
        raise RuntimeError(f"{lib_name}: {out.stderr.strip()[-2000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r["process_s"] = wall
    return r


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    libs = libraries()
    runs = {k: [] for k in libs}
    child("mxnet-rt", libs["mxnet-rt"])  # warm the page cache for both
    child("stock 1.9.1", libs["stock 1.9.1"])
    for _ in range(reps):
        for name, lib in libs.items():
            runs[name].append(child(name, lib))
    med = {k: {f: statistics.median(r[f] for r in v) for f in v[0]} for k, v in runs.items()}
    ours, stock = med["mxnet-rt"], med["stock 1.9.1"]
    rows = [
        ("`import mxnet` (s)", "import_s", "{:.3f}"),
        ("whole process: start, import, workload, exit (s)", "process_s", "{:.3f}"),
        ("resident memory after import (MiB)", "rss_import", "{:.1f}"),
        ("resident memory after the NDArray workload (MiB)", "rss_work", "{:.1f}"),
        ("peak resident memory (MiB)", "peak", "{:.1f}"),
    ]
    lines = [f"Medians of {reps} fresh interpreters each, libraries alternating "
             f"({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end). "
             "Workload: 20 × (256×256 dot, scale, column sum), one slice to NumPy.", "",
             "| measurement | mxnet-rt | stock 1.9.1 | ours / stock |", "|---|---|---|---|"]
    for label, key, fmt in rows:
        lines.append(f"| {label} | {fmt.format(ours[key])} | {fmt.format(stock[key])} | {ours[key] / stock[key]:.2f} |")
    write_result("import.md", "\n".join(lines))


if __name__ == "__main__":
    main()
