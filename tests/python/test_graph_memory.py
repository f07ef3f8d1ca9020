"""Graph memory settings through the stock frontend: in-place writes in hybridized blocks
(MXNET_EXEC_ENABLE_INPLACE), memory sharing between graph nodes (NNVM_EXEC_MATCH_RANGE),
temporary workspaces (MXNET_EXEC_NUM_TEMP) and mirroring (MXNET_BACKWARD_DO_MIRROR). What
they change is read from the storage pool's statistics (MXStorageGetStats, an mxnet-rt
addition); what they must not change (results, gradients) is compared directly."""
import ctypes
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import mxnet as mx
from mxnet import autograd, gluon
from mxnet.base import _LIB


def pool_stats():
    out = ctypes.c_char_p()
    assert _LIB.MXStorageGetStats(ctypes.byref(out)) == 0
    return json.loads(out.value.decode())["cpu(0)"]


def mlp():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(256), gluon.nn.Activation("relu"), gluon.nn.Dense(256), gluon.nn.Activation("tanh"),
            gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    net.hybridize()
    return net


def allocations_of(fn):
    mx.nd.waitall()
    before = pool_stats()["allocations"]
    out = fn()
    mx.nd.waitall()
    return pool_stats()["allocations"] - before, out


@pytest.mark.parametrize("record", [False, True], ids=["inference", "training"])
def test_inplace_writes_save_an_array_per_activation(monkeypatch, record):
    mx.random.seed(5)
    net = mlp()
    x = mx.nd.array(np.random.RandomState(0).uniform(-1, 1, (32, 64)))

    def run():
        if not record:
            return net(x).asnumpy(), None
        with autograd.record():
            y = net(x)
        y.backward()
        return y.asnumpy(), net[0].weight.grad().asnumpy()

    counts = {}
    results = {}
    for flag in ["1", "0"]:
        monkeypatch.setenv("MXNET_EXEC_ENABLE_INPLACE", flag)
        run()  # warm up (shapes, caches)
        counts[flag], results[flag] = allocations_of(run)
    if record:
        # Each Activation writes over the Dense output it reads (Dense keeps its inputs for
        # its gradient, Activation its output, so even a recorded run may share): two arrays
        # fewer.
        assert counts["0"] - counts["1"] == 2, counts
    else:
        # An inference run places its intermediate results in memory slots kept from the
        # previous run: once warm it allocates its output alone, in place or not.
        assert counts == {"1": 1, "0": 1}, counts
    np.testing.assert_array_equal(results["1"][0], results["0"][0])
    if record:
        np.testing.assert_array_equal(results["1"][1], results["0"][1])


def test_inplace_is_refused_where_a_gradient_keeps_the_input(monkeypatch):
    # sigmoid's input is kept by the `exp` that also reads it: an in-place sigmoid would
    # overwrite what exp's gradient needs, so recorded runs must not share it.
    class Net(gluon.HybridBlock):
        def hybrid_forward(self, F, x):
            return F.exp(x * 2) + F.sigmoid(x * 2)

    x = mx.nd.array(np.random.RandomState(1).uniform(-1, 1, (8, 8)))
    x.attach_grad()
    grads = {}
    for flag in ["1", "0"]:
        monkeypatch.setenv("MXNET_EXEC_ENABLE_INPLACE", flag)
        net = Net()
        net.hybridize()
        with autograd.record():
            y = net(x)
        y.backward()
        grads[flag] = x.grad.asnumpy().copy()
    want = 2 * np.exp(2 * x.asnumpy()) + 2 * (1 / (1 + np.exp(-2 * x.asnumpy()))) * (1 - 1 / (1 + np.exp(-2 * x.asnumpy())))
    np.testing.assert_allclose(grads["1"], want, rtol=1e-5)
    np.testing.assert_array_equal(grads["1"], grads["0"])


CHILD = r"""
import ctypes, json, sys, numpy as np, mxnet as mx
from mxnet import autograd, gluon
from mxnet.base import _LIB
mode = sys.argv[1]
mx.random.seed(7)
net = gluon.nn.HybridSequential()
if mode == "chain":
    for _ in range(6):
        net.add(gluon.nn.Dense(512, flatten=False), gluon.nn.Activation("relu"))
else:
    for _ in range(3):
        net.add(gluon.nn.Dense(1024, flatten=False))
        for act in ["tanh", "sigmoid", "softrelu", "tanh"]:
            net.add(gluon.nn.Activation(act))
    net.add(gluon.nn.Dense(10))
net.initialize(mx.init.Xavier(), ctx=mx.cpu())
net.hybridize()
x = mx.nd.array(np.random.RandomState(0).uniform(-1, 1, (256, 512)))
if mode == "chain":
    out = net(x).asnumpy()
else:
    with autograd.record():
        y = net(x)
    y.backward()
    out = net[0].weight.grad().asnumpy()
mx.nd.waitall()
s = ctypes.c_char_p()
_LIB.MXStorageGetStats(ctypes.byref(s))
print(json.dumps({"peak": json.loads(s.value.decode())["cpu(0)"]["peak_bytes_in_use"], "sum": float(np.abs(out).sum())}))
"""


def child(mode, script=CHILD, **env):
    e = dict(os.environ)
    for k in ["MXNET_EXEC_ENABLE_INPLACE", "NNVM_EXEC_MATCH_RANGE", "MXNET_BACKWARD_DO_MIRROR"]:
        e.pop(k, None)
    e.update(env)
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", script, mode], env=e, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_match_range_zero_keeps_every_intermediate():
    # Six Dense+relu pairs on 256×512 (512 KiB per result). Sharing returns each result's
    # memory after its last reader; without it all twelve stay until the run ends.
    shared = child("chain")
    kept = child("chain", NNVM_EXEC_MATCH_RANGE="0")
    assert kept["sum"] == shared["sum"]
    assert kept["peak"] >= shared["peak"] + 4 * 512 * 1024, (kept, shared)


def test_mirror_lowers_the_peak_of_a_training_step():
    # Three segments of Dense(1024) and four activations on 256 rows (1 MiB per result).
    # Without mirroring all twelve activation outputs are kept for backward; with it each
    # segment keeps its Dense output and last activation (the next Dense's input), and the
    # rest is recomputed one segment at a time, after the backward work already pushed has
    # run (measured: 46.7 MB peak against 57.7 MB).
    plain = child("mirror")
    mirrored = child("mirror", MXNET_BACKWARD_DO_MIRROR="1")
    np.testing.assert_allclose(mirrored["sum"], plain["sum"], rtol=1e-6)
    assert mirrored["peak"] < plain["peak"] - 2 * 1024 * 1024, (mirrored, plain)


@pytest.mark.parametrize("hybrid", [False, True], ids=["imperative", "hybridized"])
def test_mirrored_gradients_equal_kept_ones(monkeypatch, hybrid):
    # Chains of mirrored calls (each recomputed from the previous one's recomputation),
    # a pooling between convolutions, and an output read twice.
    x = mx.nd.array(np.random.RandomState(3).uniform(-1, 1, (4, 2, 8, 8)))
    grads = {}
    for flag in ["0", "1"]:
        monkeypatch.setenv("MXNET_BACKWARD_DO_MIRROR", flag)
        mx.random.seed(11)
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Conv2D(4, 3, activation="tanh"), gluon.nn.Activation("sigmoid"), gluon.nn.MaxPool2D(2),
                gluon.nn.Activation("softrelu"), gluon.nn.Flatten(), gluon.nn.Dense(8, activation="tanh"),
                gluon.nn.Activation("softsign"), gluon.nn.Dense(3))
        net.initialize(mx.init.Xavier())
        if hybrid:
            net.hybridize()
        with autograd.record():
            y = net(x)
            z = (y * y.sigmoid()).sum()
        z.backward()
        grads[flag] = [p.grad().asnumpy().copy() for p in net.collect_params().values()]
    for a, b in zip(grads["0"], grads["1"]):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)


def test_temporary_workspaces_do_not_change_results(monkeypatch):
    rng = np.random.RandomState(2)
    x = mx.nd.array(rng.uniform(-1, 1, (8, 3, 16, 16)))
    w = mx.nd.array(rng.uniform(-1, 1, (4, 3, 3, 3)))
    outs = []
    for n in ["1", "2", "3"]:
        monkeypatch.setenv("MXNET_EXEC_NUM_TEMP", n)
        ys = [mx.nd.Convolution(x, w, kernel=(3, 3), num_filter=4, no_bias=True, pad=(1, 1)) for _ in range(4)]
        outs.append([y.asnumpy() for y in ys])
    for run in outs[1:]:
        for a, b in zip(run, outs[0]):
            np.testing.assert_array_equal(a, b)
    monkeypatch.setenv("MXNET_EXEC_NUM_TEMP", "0")
    with pytest.raises((mx.base.MXNetError, ValueError), match="MXNET_EXEC_NUM_TEMP"):
        mx.nd.Convolution(x, w, kernel=(3, 3), num_filter=4, no_bias=True).asnumpy()


PLANNED = r"""
import ctypes, json, sys, numpy as np, mxnet as mx
from mxnet import gluon
from mxnet.base import _LIB
mx.random.seed(3)
net = gluon.nn.HybridSequential()
for _ in range(8):
    net.add(gluon.nn.Conv2D(32, 3, padding=1), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"))
net.add(gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(10))
net.initialize(mx.init.Xavier(), ctx=mx.cpu())
net.hybridize(static_alloc=True, static_shape=True)
x = mx.nd.array(np.random.RandomState(0).uniform(-1, 1, (8, 32, 32, 32)))
outs = [net(x).asnumpy() for _ in range(3)]
mx.nd.waitall()
s = ctypes.c_char_p()
_LIB.MXStorageGetStats(ctypes.byref(s))
print(json.dumps({"peak": json.loads(s.value.decode())["cpu(0)"]["peak_bytes_in_use"],
                  "outs": [o.tolist() for o in outs]}))
"""


def test_inference_runs_reuse_memory_slots():
    # 24 results of 1 MiB each (8×32×32×32 float32). Planned, a run holds a few at a time and
    # the next run reuses them; with NNVM_EXEC_MATCH_RANGE=0 every result is kept to the end
    # of its run. The outputs are the same, run after run.
    planned, kept = child("planned", PLANNED), child("planned", PLANNED, NNVM_EXEC_MATCH_RANGE="0")
    for o in planned["outs"][1:] + kept["outs"]:
        np.testing.assert_array_equal(np.array(o), np.array(planned["outs"][0]))
    assert planned["peak"] + 12 * 2**20 < kept["peak"], (planned["peak"], kept["peak"])


def test_planned_runs_keep_earlier_outputs_and_shared_values():
    # A head that later nodes also read, a value with several readers, an in-place chain: the
    # outputs of one run must survive the next run, which reuses the memory slots.
    class Net(gluon.HybridBlock):
        def hybrid_forward(self, F, x):
            a = F.relu(x * 2)
            b = a + F.sigmoid(a)
            c = F.tanh(a) * b
            return a, F.relu(c) + b

    net = Net()
    net.hybridize(static_alloc=True, static_shape=True)
    rng = np.random.RandomState(4)
    xs = [rng.uniform(-1, 1, (16, 64)) for _ in range(3)]
    outs = [net(mx.nd.array(x)) for x in xs]

    def want(x):
        a = np.maximum(x * 2, 0)
        b = a + 1 / (1 + np.exp(-a))
        return a, np.maximum(np.tanh(a) * b, 0) + b

    for x, (a, c) in zip(xs, outs):
        wa, wc = want(x)
        np.testing.assert_allclose(a.asnumpy(), wa, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(c.asnumpy(), wc, rtol=1e-5, atol=1e-6)


GROWING = r"""
import ctypes, json, sys, numpy as np, mxnet as mx
from mxnet import gluon
from mxnet.base import _LIB
def stats():
    mx.nd.waitall()
    s = ctypes.c_char_p()
    _LIB.MXStorageGetStats(ctypes.byref(s))
    return json.loads(s.value.decode())["cpu(0)"]
class Dense(gluon.HybridBlock):
    # A DenseNet block: each layer's input is the concatenation of all earlier results.
    def __init__(self, **kw):
        super().__init__(**kw)
        self.layers = gluon.nn.HybridSequential()
        for _ in range(5):
            layer = gluon.nn.HybridSequential()
            layer.add(gluon.nn.Conv2D(16, 1), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"))
            self.layers.add(layer)
    def hybrid_forward(self, F, x):
        for layer in self.layers:
            x = F.concat(x, layer(x), dim=1)
        return F.flatten(x)
net = Dense()
net.initialize(mx.init.Xavier(), ctx=mx.cpu())
x = mx.nd.array(np.random.RandomState(0).uniform(-1, 1, (16, 16, 32, 32)))
net.infer_shape(x)  # parameter shapes only: the first run below is the process's first
net.hybridize(static_alloc=True, static_shape=True)
outs, after = [], []
for _ in range(3):
    outs.append(net(x).asnumpy())
    after.append(stats())
net.hybridize(False)
want = net(x).asnumpy()  # imperative: the reference
print(json.dumps({"peak": after[0]["peak_bytes_in_use"], "in_use": [a["bytes_in_use"] for a in after],
                  "later_peak": after[-1]["peak_bytes_in_use"],
                  "errors": [float(np.abs(o - want).max()) for o in outs], "scale": float(np.abs(want).max())}))
"""


@pytest.mark.parametrize("fuse", ["1", "0"])
def test_first_run_sizes_its_slots_before_it_starts(fuse):
    # Concatenations of 16, 32, ..., 96 channels (1, 2, ..., 6 MiB): grown one by one as the
    # run went, each old size stayed held by the run's pending operations (23 MiB above what
    # the run keeps). The slots are sized from the shapes first, so the run's peak is what it
    # keeps (its slots) plus the head and the pool's per-call scratch.
    # One thread: the convolutions' scratch grows with the thread count.
    r = child("growing", GROWING, MXNET_MKLDNN_ENABLED=fuse, OMP_NUM_THREADS="1")
    # Each run gives the imperative forward's values. The peak is the process's before the
    # imperative run.
    assert r["scale"] > 0 and max(r["errors"]) <= 1e-5 * r["scale"], r
    head = 16 * 96 * 32 * 32 * 4
    assert r["peak"] - r["in_use"][0] < head + 2 * 2**20, r
    # Later runs keep the same slots (the flatten head is not written over one, which would
    # leave with the caller and be allocated again) and never need more memory.
    assert r["in_use"][0] == r["in_use"][1] == r["in_use"][2] and r["later_peak"] == r["peak"], r
