#!/usr/bin/env python3
"""Inference through the Predict API (c_predict_api.h) against the Python frontend, on
mxnet-rt and on stock MXNet 1.9.1 (issue 38: the Predict API must be at least as fast as the
Python frontend). A model-zoo network is exported once by the stock frontend (random weights
from a seeded NumPy stream); then each measurement is a fresh process on one library that
runs it either through the Predict API (ctypes calls of MXPredSetInput, MXPredForward,
MXPredGetOutput) or through the frontend (`SymbolBlock.imports`, hybridized, `asnumpy()` of
the output), and reports the median of the timed iterations after a warm-up. Libraries and
ways alternate; the table shows medians over the repetitions. Markdown on stdout and in
bench/results/predict.md.

    .venv/bin/python bench/predict_bench.py [repetitions] [iterations]
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

from common import libraries, write_result

EXPORT = r"""
import sys
import numpy as np
import mxnet as mx
from mxnet import gluon
name, out = sys.argv[1], sys.argv[2]
rng = np.random.RandomState(0)
net = gluon.model_zoo.vision.get_model(name)
net.initialize()
net(mx.nd.zeros((1, 3, 224, 224)))
for k, p in sorted(net.collect_params().items()):
    v = rng.uniform(0.5, 1.5, p.shape) if k.endswith(("running_var", "gamma")) else rng.uniform(-0.05, 0.05, p.shape)
    p.set_data(mx.nd.array(v))
net.hybridize()
net(mx.nd.zeros((1, 3, 224, 224)))
net.export(out + "/" + name)
"""

CHILD = r"""
import ctypes, json, statistics, sys, time
import numpy as np
lib_path, prefix, way, batch, iters = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
x = np.random.RandomState(1).uniform(0, 1, (batch, 3, 224, 224)).astype(np.float32)
times = []
if way == "predict":
    lib = ctypes.CDLL(lib_path)
    lib.MXGetLastError.restype = ctypes.c_char_p
    def ok(rc):
        if rc != 0:
            raise RuntimeError(lib.MXGetLastError().decode())
    sym = open(prefix + "-symbol.json", "rb").read()
    par = open(prefix + "-0000.params", "rb").read()
    keys = (ctypes.c_char_p * 1)(b"data")
    indptr = (ctypes.c_uint32 * 2)(0, 4)
    shape = (ctypes.c_uint32 * 4)(batch, 3, 224, 224)
    h = ctypes.c_void_p()
    ok(lib.MXPredCreate(sym, par, len(par), 1, 0, 1, keys, indptr, shape, ctypes.byref(h)))
    y = np.zeros((batch, 1000), np.float32)
    xp, yp = x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p)
    for i in range(iters + 3):
        t = time.perf_counter()
        ok(lib.MXPredSetInput(h, b"data", xp, x.size))
        ok(lib.MXPredForward(h))
        ok(lib.MXPredGetOutput(h, 0, yp, y.size))
        if i >= 3:
            times.append(time.perf_counter() - t)
    ok(lib.MXPredFree(h))
else:
    import warnings
    import mxnet as mx
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = mx.gluon.SymbolBlock.imports(prefix + "-symbol.json", ["data"], prefix + "-0000.params")
    net.hybridize(static_alloc=True, static_shape=True)
    for i in range(iters + 3):
        t = time.perf_counter()
        y = net(mx.nd.array(x)).asnumpy()
        if i >= 3:
            times.append(time.perf_counter() - t)
print(json.dumps({"ms": 1000 * statistics.median(times)}))
"""

MODELS = [("resnet18_v1", 1), ("resnet18_v1", 8), ("mobilenet1.0", 1)]
WAYS = ["predict", "frontend"]


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    iters = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    libs = libraries()
    names = list(libs)
    tmp = tempfile.mkdtemp(prefix="predict-bench-")
    stock_env = {k: v for k, v in os.environ.items() if k != "MXNET_LIBRARY_PATH"}
    for model in sorted({m for m, _ in MODELS}):
        subprocess.run([sys.executable, "-c", EXPORT, model, tmp], env=stock_env, check=True, timeout=900)
    times = {}
    for _ in range(reps):
        for model, batch in MODELS:
            for way in WAYS:
                for name, lib in libs.items():
                    env = dict(stock_env, MXNET_LIBRARY_PATH=str(lib)) if name == "mxnet-rt" else stock_env
                    out = subprocess.run([sys.executable, "-c", CHILD, str(lib), f"{tmp}/{model}", way, str(batch),
                                          str(iters)], env=env, capture_output=True, text=True, timeout=900)
                    if out.returncode != 0:
                        sys.exit(f"{name} {model} {way}: {out.stderr.strip()[-800:]}")
                    ms = json.loads(out.stdout.strip().splitlines()[-1])["ms"]
                    times.setdefault((model, batch, way, name), []).append(ms)
    rows = ["| model | batch | way | " + " | ".join(f"{x} (ms)" for x in names) + " | rt / stock |",
            "|---|---|---|" + "---|" * (len(names) + 1)]
    for model, batch in MODELS:
        for way in WAYS:
            med = [statistics.median(times[(model, batch, way, x)]) for x in names]
            rows.append(f"| {model} | {batch} | {way} | " + " | ".join(f"{m:.2f}" for m in med)
                        + f" | {med[0] / med[1]:.2f} |")
    rows.append("")
    rows.append("Predict API / frontend on the same library:")
    rows.append("")
    rows.append("| model | batch | " + " | ".join(names) + " |")
    rows.append("|---|---|" + "---|" * len(names))
    for model, batch in MODELS:
        ratios = [statistics.median(times[(model, batch, "predict", x)])
                  / statistics.median(times[(model, batch, "frontend", x)]) for x in names]
        rows.append(f"| {model} | {batch} | " + " | ".join(f"{r:.2f}" for r in ratios) + " |")
    table = (f"# Predict API against the Python frontend\n\nMedians of {reps} fresh processes per cell "
             f"(each the median of {iters} iterations after 3 warm-up ones), libraries and ways alternating; "
             "one CPU machine, one run.\n\n" + "\n".join(rows) + "\n")
    write_result("predict.md", table)


if __name__ == "__main__":
    main()
