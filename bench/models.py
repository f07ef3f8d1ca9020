#!/usr/bin/env python3
"""Model-zoo inference and a ResNet training step on mxnet-rt and on stock MXNet 1.9.1, side by
side (issue 39).

Each measurement is a fresh process on one library running the stock frontend: a hybridized
Gluon model-zoo network (float32, weights from a seeded NumPy stream, so both libraries compute
the same thing), a timed first call (which includes any convolution algorithm timing), a
warm-up, then the median of the timed iterations, each ending with `asnumpy()` of the output;
and the process's peak resident memory. The training row is resnet18_v1 on batch 32 of 32x32
inputs, SGD with momentum, hybridized, `autograd.record` + `backward` + `Trainer.step`.
Libraries alternate process by process; the table shows medians over the repetitions.
Markdown on stdout and in bench/results/models.md.

    .venv/bin/python bench/models.py [repetitions] [iterations] [network,...]
"""
import statistics
import sys

from common import libraries, run_python, write_result

CHILD = r"""
import json, resource, statistics, sys, time
import numpy as np
import mxnet as mx
from mxnet import autograd, gluon
name, batch, iters, train = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "train"
size = 32 if train else 224
rng = np.random.RandomState(0)
net = gluon.model_zoo.vision.get_model(name, classes=10 if train else 1000)
net.initialize()
net.infer_shape(mx.nd.zeros((batch, 3, size, size)))  # shapes only: the first call below is the process's first
for k, p in sorted(net.collect_params().items()):
    v = rng.uniform(0.5, 1.5, p.shape) if k.endswith(("running_var", "gamma")) else rng.uniform(-0.05, 0.05, p.shape)
    p.set_data(mx.nd.array(v))
net.hybridize(static_alloc=True, static_shape=True)
x = mx.nd.array(np.random.RandomState(1).uniform(0, 1, (batch, 3, size, size)))
if train:
    y = mx.nd.array(np.random.RandomState(2).randint(0, 10, (batch,)))
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9})
    def step():
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(batch)
        return loss.asnumpy()
else:
    def step():
        return net(x).asnumpy()
t = time.perf_counter(); step(); first = time.perf_counter() - t
for _ in range(2):
    step()
times = []
for _ in range(iters):
    t = time.perf_counter(); step(); times.append(time.perf_counter() - t)
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"ms": 1e3 * statistics.median(times), "min_ms": 1e3 * min(times), "max_ms": 1e3 * max(times),
                  "first_s": first, "rss_mb": rss}))
"""

CASES = [("resnet18_v1", 1), ("resnet18_v1", 16), ("resnet50_v1", 1), ("resnet50_v1", 16),
         ("densenet121", 1), ("densenet121", 16), ("mobilenetv2_1.0", 1), ("mobilenetv2_1.0", 16),
         ("vgg11", 1), ("vgg11", 16)]


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    iters = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    only = set(sys.argv[3].split(",")) if len(sys.argv) > 3 else None
    libs = libraries()
    cases = [(n, b, "infer") for n, b in CASES] + [("resnet18_v1", 32, "train")]
    if only:
        cases = [c for c in cases if c[0] in only or (c[2] == "train" and "train" in only)]
    rows = []
    for name, batch, kind in cases:
        got = {lib: [] for lib in libs}
        for _ in range(reps):
            for lib_name, lib in libs.items():
                got[lib_name].append(run_python(lib_name, lib, CHILD, name, str(batch), str(iters), kind, timeout=1800))
        med = {lib: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for lib, runs in got.items()}
        ours, stock = med["mxnet-rt"], med["stock 1.9.1"]
        label = f"{name} {'training step' if kind == 'train' else 'inference'}, batch {batch}"
        spread = "/".join(f"{r['ms']:.1f}" for r in got["mxnet-rt"])
        rows.append(f"| {label} | {ours['ms']:.1f} | {stock['ms']:.1f} | {ours['ms'] / stock['ms']:.2f} | "
                    f"{ours['first_s']:.2f} / {stock['first_s']:.2f} | {ours['rss_mb']:.0f} / {stock['rss_mb']:.0f} | {spread} |")
        print(rows[-1], flush=True)
    table = ("| measurement | mxnet-rt (ms) | stock 1.9.1 (ms) | ours / stock | first call (s), ours / stock | "
             "peak RSS (MiB), ours / stock | ours per repetition (ms) |\n|---|---|---|---|---|---|---|\n" + "\n".join(rows))
    write_result("models.md", f"`models.py {reps} {iters}`: medians over {reps} alternating processes per library, "
                 f"{iters} timed iterations each after a warm-up.\n\n" + table)


if __name__ == "__main__":
    main()
