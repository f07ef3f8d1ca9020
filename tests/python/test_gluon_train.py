"""Gluon on mxnet-rt through the stock 1.9.1 frontend: seed 004's CNN learns on synthetic
data imperatively and hybridized, its profile holds the forward and backward operators and
the SGD update, hybridized and imperative runs agree, parameters save and load, exported
models round-trip with stock MXNet (the wheel's own library, run in a subprocess), and the
other layers, initialisers and optimisers the issue lists work."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import mxnet as mx
from mxnet import autograd, gluon, profiler
from differential import run_stock_process


def make_data(n=512, seed=0):
    """Ten binary 28×28 prototypes; each sample is its class's prototype plus noise."""
    rng = np.random.RandomState(seed)
    protos = (rng.uniform(0, 1, (10, 1, 28, 28)) > 0.7).astype("float32")
    labels = rng.randint(0, 10, n)
    x = protos[labels] * 0.8 + rng.uniform(0, 0.2, (n, 1, 28, 28)).astype("float32")
    return x.astype("float32"), labels.astype("float32")


def tutorial_net():
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


def train(net, hybrid, epochs=3, optimizer="sgd", opt_params=None, n=512, init=None):
    mx.random.seed(7)
    np.random.seed(7)  # DataLoader's shuffle
    net.collect_params().initialize(init or mx.init.Xavier(), ctx=mx.cpu(), force_reinit=True)
    if hybrid:
        net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), optimizer, opt_params or {"learning_rate": 0.1})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x, y = make_data(n)
    loader = gluon.data.DataLoader(gluon.data.ArrayDataset(x, y), batch_size=64, shuffle=True)
    losses = []
    for _ in range(epochs):
        total, count = 0.0, 0
        for data, label in loader:
            with autograd.record():
                out = net(data)
                loss = loss_fn(out, label)
            loss.backward()
            trainer.step(data.shape[0])
            total += float(loss.sum().asscalar())
            count += data.shape[0]
        losses.append(total / count)
    acc = (net(mx.nd.array(x)).argmax(axis=1).asnumpy() == y).mean()
    return losses, acc


@pytest.mark.parametrize("hybrid", [False, True], ids=["imperative", "hybridized"])
def test_tutorial_cnn_learns(hybrid):
    losses, acc = train(tutorial_net(), hybrid, epochs=6)
    assert losses[0] > losses[-1], losses
    assert losses[-1] < 0.5, f"loss {losses} does not fall well below chance (ln 10 = 2.30)"
    assert acc > 0.9, acc


def test_hybridized_matches_imperative():
    x = mx.nd.array(make_data(8)[0])
    net = tutorial_net()
    net.initialize(mx.init.Xavier())
    imperative = net(x).asnumpy()
    grads = {}
    with autograd.record():
        loss = net(x).sum()
    loss.backward()
    for k, p in net.collect_params().items():
        grads[k] = p.grad().asnumpy().copy()
    net.hybridize()
    hybrid = net(x).asnumpy()
    np.testing.assert_allclose(hybrid, imperative, rtol=1e-5, atol=1e-6)
    with autograd.record():
        loss = net(x).sum()
    loss.backward()
    for k, p in net.collect_params().items():
        np.testing.assert_allclose(p.grad().asnumpy(), grads[k], rtol=1e-4, atol=1e-6, err_msg=k)


def tutorial_step(hybrid, train=True):
    """One step of the tutorial network on a batch of 64: forward only, or forward, loss,
    backward and an SGD update. Returns a function running it; it returns the output or loss."""
    net = tutorial_net()
    net.initialize(mx.init.Xavier())
    if hybrid:
        net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x, y = make_data(64)
    data, label = mx.nd.array(x), mx.nd.array(y)

    def step():
        if not train:
            return net(data)
        with autograd.record():
            loss = loss_fn(net(data), label)
        loss.backward()
        trainer.step(64)
        return loss

    return step


@pytest.mark.parametrize("hybrid", [False, True], ids=["imperative", "hybridized"])
def test_training_step_profile(tmp_path, hybrid):
    step = tutorial_step(hybrid)
    step()
    mx.nd.waitall()
    trace = tmp_path / "profile_output.json"
    profiler.set_config(profile_all=True, aggregate_stats=True, filename=str(trace))
    profiler.set_state("run")
    step()
    mx.nd.waitall()
    profiler.set_state("stop")
    table = profiler.dumps(reset=True)
    profiler.dump()
    names = {e["name"] for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") in ("B", "X")}
    for op in ["Convolution", "Pooling", "FullyConnected", "_backward_Convolution", "_backward_Pooling",
               "_backward_FullyConnected"]:
        assert op in names, (op, sorted(names))
        assert op in table, op
    assert any("sgd" in n for n in names), sorted(names)
    assert any("sgd" in line for line in table.splitlines())


BULK_OFF = {"MXNET_EXEC_BULK_EXEC_TRAIN": "0", "MXNET_EXEC_BULK_EXEC_INFERENCE": "0"}


def profiled_step_ops(tmp_path, hybrid, train, env, monkeypatch, aggregate=False):
    """Operator events in the trace of one step (trace only, as stock bulks then), and the loss."""
    for k in ["MXNET_EXEC_BULK_EXEC_TRAIN", "MXNET_EXEC_BULK_EXEC_INFERENCE", "MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN"]:
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    mx.random.seed(3)
    step = tutorial_step(hybrid, train)
    step()
    mx.nd.waitall()
    trace = tmp_path / "bulk.json"
    profiler.set_config(profile_all=True, aggregate_stats=aggregate, filename=str(trace))
    profiler.set_state("run")
    out = step().asnumpy()
    mx.nd.waitall()
    profiler.set_state("stop")
    profiler.dump()
    events = json.loads(trace.read_text())["traceEvents"]
    names = [e["name"] for e in events if e.get("ph") in ("B", "X") and e.get("cat") == "operator"]
    return names, out


needs_threaded = pytest.mark.skipif(os.environ.get("MXNET_ENGINE_TYPE") == "NaiveEngine",
                                    reason="NaiveEngine runs every operation at its push: nothing is bulked")


@needs_threaded
def test_bulk_execution_sets_profile_granularity(tmp_path, monkeypatch):
    # Seed 004: bulk execution hides operators in the profile; MXNET_EXEC_BULK_EXEC_INFERENCE
    # and _TRAIN = 0 show each one. As stock: a hybridized forward and every backward pass are
    # bulked by default, an imperative forward is not.
    hyb, loss_bulk = profiled_step_ops(tmp_path, True, True, {}, monkeypatch)
    assert "ImperativeBulk" in hyb, hyb
    for op in ["Convolution", "FullyConnected", "_backward_Convolution", "_backward_FullyConnected"]:
        assert op not in hyb, (op, hyb)
    imp, _ = profiled_step_ops(tmp_path, False, True, {}, monkeypatch)
    assert "Convolution" in imp and "ImperativeBulk" in imp and "_backward_Convolution" not in imp, imp
    inf, _ = profiled_step_ops(tmp_path, True, False, {}, monkeypatch)
    assert inf.count("ImperativeBulk") == 1 and "Convolution" not in inf, inf

    off, loss_off = profiled_step_ops(tmp_path, True, True, BULK_OFF, monkeypatch)
    assert "ImperativeBulk" not in off, off
    for op in ["Convolution", "Pooling", "FullyConnected", "_backward_Convolution", "_backward_Pooling",
               "_backward_FullyConnected"]:
        assert op in off, (op, off)
    # Bulking changes how operations are scheduled, never what they compute.
    np.testing.assert_array_equal(loss_bulk, loss_off)
    inf_off, _ = profiled_step_ops(tmp_path, True, False, BULK_OFF, monkeypatch)
    assert "ImperativeBulk" not in inf_off and inf_off.count("Convolution") == 2, inf_off

    # MAX_NODE_TRAIN = 0 also turns training bulks off (stock's own switch); small segments
    # give more bulks.
    zero, _ = profiled_step_ops(tmp_path, True, True, {"MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN": "0"}, monkeypatch)
    assert "ImperativeBulk" not in zero and "_backward_Convolution" in zero, zero
    small, _ = profiled_step_ops(tmp_path, True, True, {"MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN": "3"}, monkeypatch)
    assert small.count("ImperativeBulk") > hyb.count("ImperativeBulk"), (small, hyb)


@needs_threaded
def test_aggregate_statistics_see_every_operator(tmp_path, monkeypatch):
    # While the profiler aggregates statistics nothing is bulked (as stock), so dumps() lists
    # each operator with bulking on.
    names, _ = profiled_step_ops(tmp_path, True, True, {}, monkeypatch, aggregate=True)
    assert "ImperativeBulk" not in names and "Convolution" in names and "_backward_Convolution" in names, names
    profiler.dumps(reset=True)


def test_bad_bulk_setting_is_refused(monkeypatch):
    net = tutorial_net()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    x, _ = make_data(4)
    monkeypatch.setenv("MXNET_EXEC_BULK_EXEC_INFERENCE", "sometimes")
    with pytest.raises((mx.base.MXNetError, ValueError), match="MXNET_EXEC_BULK_EXEC_INFERENCE"):
        net(mx.nd.array(x)).asnumpy()


def test_save_and_load_parameters(tmp_path):
    x = mx.nd.array(make_data(4)[0])
    net = tutorial_net()
    net.initialize(mx.init.Xavier())
    ref = net(x).asnumpy()
    path = str(tmp_path / "net.params")
    net.save_parameters(path)
    other = tutorial_net()
    other.load_parameters(path)
    np.testing.assert_allclose(other(x).asnumpy(), ref, rtol=1e-6)
    with pytest.raises(Exception):
        gluon.nn.Dense(3).load_parameters(path)


STOCK = r"""
import sys, numpy as np, mxnet as mx
prefix, mode = sys.argv[1], sys.argv[2]
x = mx.nd.array(np.load(prefix + "-x.npy"))
if mode == "load":
    net = mx.gluon.SymbolBlock.imports(prefix + "-symbol.json", ["data"], prefix + "-0000.params")
    np.save(prefix + "-stock-out.npy", net(x).asnumpy())
else:
    mx.random.seed(3)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(4, 3, activation="relu"), mx.gluon.nn.BatchNorm(), mx.gluon.nn.MaxPool2D(2),
            mx.gluon.nn.Flatten(), mx.gluon.nn.Dense(5))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    np.save(prefix + "-stock-out.npy", net(x).asnumpy())
    net.export(prefix)
"""


def run_stock(prefix, mode):
    env = dict(os.environ)
    env.pop("MXNET_LIBRARY_PATH", None)  # the wheel's own libmxnet.so
    out = run_stock_process([sys.executable, "-W", "ignore", "-c", STOCK, prefix, mode], env=env, capture_output=True, text=True,
                            timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]


def test_export_loads_in_stock(tmp_path):
    prefix = str(tmp_path / "ours")
    x = make_data(4)[0][:, :, :12, :12]
    np.save(prefix + "-x.npy", x)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(4, 3, activation="relu"), gluon.nn.BatchNorm(), gluon.nn.MaxPool2D(2),
            gluon.nn.Flatten(), gluon.nn.Dense(5))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    ours = net(mx.nd.array(x)).asnumpy()
    net.export(prefix)
    run_stock(prefix, "load")
    np.testing.assert_allclose(np.load(prefix + "-stock-out.npy"), ours, rtol=1e-4, atol=1e-5)


def test_stock_export_loads_here(tmp_path):
    prefix = str(tmp_path / "stock")
    x = make_data(4)[0][:, :, :12, :12]
    np.save(prefix + "-x.npy", x)
    run_stock(prefix, "export")
    net = gluon.SymbolBlock.imports(prefix + "-symbol.json", ["data"], prefix + "-0000.params")
    np.testing.assert_allclose(net(mx.nd.array(x)).asnumpy(), np.load(prefix + "-stock-out.npy"), rtol=1e-4, atol=1e-5)


def bn_dropout_net():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(8, 3), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"), gluon.nn.MaxPool2D(2),
            gluon.nn.Flatten(), gluon.nn.Dropout(0.2), gluon.nn.Dense(10))
    return net


@pytest.mark.parametrize("hybrid", [False, True], ids=["imperative", "hybridized"])
def test_batchnorm_dropout_adam(hybrid):
    losses, acc = train(bn_dropout_net(), hybrid, epochs=3, optimizer="adam", opt_params={"learning_rate": 0.01}, n=256)
    assert losses[-1] < 0.5 * losses[0], losses
    assert acc > 0.8, acc


def test_sgd_momentum_wd_and_initialisers():
    net = tutorial_net()
    losses, acc = train(net, False, epochs=2, opt_params={"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4}, n=256,
                        init=mx.init.Uniform(0.05))
    assert losses[-1] < losses[0], losses
    for init, check in [(mx.init.Zero(), lambda w: np.all(w == 0)), (mx.init.One(), lambda w: np.all(w == 1)),
                        (mx.init.Normal(0.5), lambda w: 0.4 < w.std() < 0.6),
                        (mx.init.Uniform(0.3), lambda w: np.abs(w).max() <= 0.3 and w.std() > 0.1)]:
        d = gluon.nn.Dense(200, in_units=100)
        d.initialize(init)
        assert check(d.weight.data().asnumpy()), init
