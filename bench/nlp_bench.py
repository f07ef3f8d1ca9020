#!/usr/bin/env python3
"""NLP workloads on mxnet-rt vs stock MXNet 1.9.1 (whose CPU build runs the fused RNN
through oneDNN and the attention products through MKL), both under the same stock Python
frontend, in one run (issue 35):

- `lm-train`: one training step of Gluon's word language model, small PTB configuration
  (Embedding 10000→200, 2-layer LSTM of 200, dropout 0, Dense 200→10000; sequence 35, batch
  20; SoftmaxCrossEntropyLoss, SGD), hybridized: forward and loss under autograd.record,
  backward, trainer.step, waitall;
- `lstm-train`: the same without the embedding and the decoder: the 2-layer LSTM alone
  (loss = sum of its output), so the recurrent kernels' share is visible;
- `lstm-infer`: the 2-layer LSTM's forward alone, outside autograd;
- `bert-attention`: one BERT-base self-attention block's core, forward and backward under
  autograd (sequence 128, batch 4, 12 heads of 64): interleaved_matmul_selfatt_qk, softmax,
  interleaved_matmul_selfatt_valatt, a residual add and LayerNorm over 768 features.

Each configuration runs in a fresh interpreter per library, the libraries alternating; the
table gives the median step over `steps` steps × `reps` processes and the ratio mxnet-rt /
stock. Markdown on stdout and in bench/results/nlp.md.

    .venv/bin/python bench/nlp_bench.py [steps] [reps]
"""
import json
import os
import statistics
import subprocess
import sys

from common import libraries, write_result

CHILD = r"""
import json, statistics, sys, time
import numpy as np
import mxnet as mx
from mxnet import autograd, gluon

mode, steps = sys.argv[1], int(sys.argv[2])
V, E, H, T, N = 10000, 200, 200, 35, 20


class LM(gluon.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.embed = gluon.nn.Embedding(V, E)
            self.rnn = gluon.rnn.LSTM(H, num_layers=2, input_size=E)
            self.out = gluon.nn.Dense(V, flatten=False, in_units=H)

    def hybrid_forward(self, F, x):
        return self.out(self.rnn(self.embed(x)))


rng = np.random.RandomState(0)
mx.random.seed(1)
if mode == "bert-attention":
    TB, B, HEADS, D = 128, 4, 12, 64
    qkv = mx.nd.array(rng.uniform(-1, 1, (TB, B, HEADS * 3 * D)))
    resid = mx.nd.array(rng.uniform(-1, 1, (TB, B, HEADS * D)))
    gamma, beta = mx.nd.ones((HEADS * D,)), mx.nd.zeros((HEADS * D,))
    qkv.attach_grad()

    def step():
        with autograd.record():
            att = mx.nd.contrib.interleaved_matmul_selfatt_qk(qkv, heads=HEADS)
            att = mx.nd.softmax(att, axis=-1)
            ctx = mx.nd.contrib.interleaved_matmul_selfatt_valatt(qkv, att, heads=HEADS)
            out = mx.nd.LayerNorm(ctx + resid, gamma, beta, axis=-1)
        out.backward()
        mx.nd.waitall()
elif mode == "lm-train":
    net = LM()
    x = mx.nd.array(rng.randint(0, V, (T, N)))
    label = mx.nd.array(rng.randint(0, V, (T, N)))
elif mode != "bert-attention":
    net = gluon.rnn.LSTM(H, num_layers=2, input_size=E)
    x = mx.nd.array(rng.uniform(-1, 1, (T, N, E)))
if mode != "bert-attention":
    net.initialize(mx.init.Uniform(0.1))
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()


def rnn_step():
    if mode == "lstm-infer":
        net(x)
    else:
        with autograd.record():
            out = net(x)
            loss = loss_fn(out, label) if mode == "lm-train" else out.sum()
        loss.backward()
        trainer.step(N)
    mx.nd.waitall()


if mode != "bert-attention":
    step = rnn_step
for _ in range(3):
    step()
times = []
for _ in range(steps):
    t = time.perf_counter()
    step()
    times.append(time.perf_counter() - t)
print(json.dumps({"step_ms": statistics.median(times) * 1e3}))
"""

MODES = ["lm-train", "lstm-train", "lstm-infer", "bert-attention"]


def child(lib_name, lib, mode, steps):
    env = dict(os.environ)
    env.pop("MXNET_LIBRARY_PATH", None)
    if lib_name == "mxnet-rt":
        env["MXNET_LIBRARY_PATH"] = str(lib)
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", CHILD, mode, str(steps)],
                         env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{lib_name} {mode}: {out.stderr.strip()[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["step_ms"]


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    libs = libraries()
    res = {(n, m): [] for n in libs for m in MODES}
    for r in range(reps):
        for m in MODES:
            order = list(libs.items()) if r % 2 == 0 else list(libs.items())[::-1]
            for name, lib in order:
                res[(name, m)].append(child(name, lib, m, steps))
    rt, st = "mxnet-rt", "stock 1.9.1"
    lines = [f"NLP workloads, {os.cpu_count()} cores (median of {steps} steps × {reps} processes per library, "
             "alternating). Word LM: small PTB configuration (Embedding 10000→200, 2-layer LSTM 200, Dense 200→10000; "
             "sequence 35, batch 20), hybridized. BERT attention: sequence 128, batch 4, 12 heads of 64, forward + backward.", "",
             "| workload | mxnet-rt ms | stock ms | ratio (≤ 1 wanted) |", "|---|---|---|---|"]
    for m in MODES:
        a, b = statistics.median(res[(rt, m)]), statistics.median(res[(st, m)])
        lines.append(f"| {m} | {a:.1f} | {b:.1f} | {a / b:.2f} |")
    write_result("nlp.md", "\n".join(lines))


if __name__ == "__main__":
    main()
