#!/usr/bin/env python3
"""Train the CNN of MXNet's profiler tutorial (seed 004) with the unmodified stock frontend.

Only the stock `mxnet==1.9.1` Python package is used (`import mxnet`, Gluon, `mx.profiler`).
Which `libmxnet.so` runs underneath is the frontend's choice: with
`MXNET_LIBRARY_PATH=/abs/path/to/mxnet-rt/target/release/libmxnet.so` it is mxnet-rt, without
it the wheel's own library, so the same script compares the two.

The data is generated here, seeded: MNIST-shaped 1x28x28 images, each the binary pattern of its
class (one of ten fixed random patterns) dimmed and covered in noise; the label is the class.
A fresh batch is drawn for every step, so the falling loss is learning, not memorising.

The script trains `--steps` steps of the tutorial's `run_training_iteration` (forward, softmax
cross-entropy, backward, SGD step), prints the loss every `--every` steps, profiles a few
steps in the middle with `mx.profiler` (profile_all, aggregate_stats), prints the aggregate
table (`mx.profiler.dumps()`) and writes the Chrome trace (open it at https://ui.perfetto.dev
or chrome://tracing). It exits with status 1 unless the loss of the last `--every` steps is
below half that of the first `--every` steps.

    MXNET_LIBRARY_PATH=$PWD/target/release/libmxnet.so .venv/bin/python examples/python/train_cnn.py
"""
import argparse
import json
import os
import sys
import time

import numpy as np

import mxnet as mx
from mxnet import autograd, gluon, profiler

BATCH = 64
CLASSES = 10


def tutorial_net():
    """The network of seed 004, as the tutorial builds it."""
    net = gluon.nn.HybridSequential()
    with net.name_scope():
        net.add(gluon.nn.Conv2D(channels=20, kernel_size=5, activation="relu"))
        net.add(gluon.nn.MaxPool2D(pool_size=2, strides=2))
        net.add(gluon.nn.Conv2D(channels=50, kernel_size=5, activation="relu"))
        net.add(gluon.nn.MaxPool2D(pool_size=2, strides=2))
        net.add(gluon.nn.Flatten())
        net.add(gluon.nn.Dense(512, activation="relu"))
        net.add(gluon.nn.Dense(10))
    return net


class SyntheticDigits:
    """An endless, seeded stream of MNIST-shaped batches whose labels follow a fixed rule."""

    def __init__(self, seed):
        self.rng = np.random.RandomState(seed)
        # Ten fixed binary 28x28 patterns, about 30% of the pixels on; the rule is "label = the
        # pattern the image was made from".
        self.patterns = (self.rng.uniform(0, 1, (CLASSES, 1, 28, 28)) > 0.7).astype("float32")

    def batch(self, n=BATCH):
        labels = self.rng.randint(0, CLASSES, n)
        noise = self.rng.uniform(0, 1, (n, 1, 28, 28)).astype("float32")
        images = 0.5 * self.patterns[labels] + 0.5 * noise
        return mx.nd.array(images), mx.nd.array(labels.astype("float32"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    ap.add_argument("--every", type=int, default=25, help="print the mean loss every N steps (default 25)")
    ap.add_argument("--profile-steps", type=int, default=5, help="steps profiled in the middle of training")
    ap.add_argument("--hybridize", action="store_true", help="hybridize the network (a CachedOp graph)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--trace", default=os.path.join("build", "demo", "profile.json"),
                    help="Chrome trace file to write (default build/demo/profile.json)")
    args = ap.parse_args()
    if args.steps < 2 * args.every or args.every < 1:
        ap.error("--steps must cover at least two windows of --every steps")

    lib = getattr(mx.base._LIB, "_name", "?")
    print(f"mxnet {mx.__version__} frontend, library {lib}")

    mx.random.seed(args.seed)
    data = SyntheticDigits(args.seed)
    ctx = mx.cpu()

    # From here on, the tutorial's code.
    net = tutorial_net()
    net.collect_params().initialize(mx.init.Xavier(), ctx=ctx)
    if args.hybridize:
        net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    softmax_cross_entropy = gluon.loss.SoftmaxCrossEntropyLoss()

    def run_training_iteration(data, label):
        data = data.as_in_context(ctx)
        label = label.as_in_context(ctx)
        with autograd.record():
            output = net(data)
            loss = softmax_cross_entropy(output, label)
        loss.backward()
        trainer.step(data.shape[0])
        return loss

    trace = os.path.abspath(args.trace)
    os.makedirs(os.path.dirname(trace), exist_ok=True)
    profiler.set_config(profile_all=True, aggregate_stats=True, filename=trace)
    first_profiled = args.steps // 2
    profiled = range(first_profiled, first_profiled + args.profile_steps)

    print(f"training seed 004's CNN: {args.steps} steps of batch {BATCH}, "
          f"{'hybridized' if args.hybridize else 'imperative'}, SGD lr 0.1; "
          f"profiling steps {profiled.start}-{profiled.stop - 1}")
    window, means = [], []
    t0 = time.perf_counter()
    for step in range(args.steps):
        if step == profiled.start:
            mx.nd.waitall()
            profiler.set_state("run")
        loss = run_training_iteration(*data.batch())
        if step == profiled.stop - 1:
            mx.nd.waitall()  # make sure all operations have completed
            profiler.set_state("stop")
        window.append(float(loss.mean().asscalar()))
        if len(window) == args.every:
            means.append(sum(window) / len(window))
            print(f"  step {step + 1:4d}  loss {means[-1]:.4f}")
            window = []
    mx.nd.waitall()
    seconds = time.perf_counter() - t0
    print(f"trained in {seconds:.1f} s ({seconds / args.steps * 1e3:.1f} ms per step, "
          f"{args.profile_steps} of them profiled)")

    print(f"\n== mx.profiler.dumps(): steps {profiled.start}-{profiled.stop - 1}")
    print(profiler.dumps())
    profiler.dump()
    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    print(f"Chrome trace: {trace} ({len(events)} events); open it at https://ui.perfetto.dev "
          "or chrome://tracing")

    first, last = means[0], means[-1]
    if not (np.isfinite(last) and last < 0.5 * first):
        print(f"FAIL: the loss did not fall: {first:.4f} over the first {args.every} steps, "
              f"{last:.4f} over the last {args.every}", file=sys.stderr)
        return 1
    print(f"OK: the loss fell from {first:.4f} to {last:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
