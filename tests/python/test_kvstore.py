"""KVStore (`mx.kv.create`, issue 37) through the stock 1.9.1 frontend, on this library and on
stock in the same test: `local` and `device` stores with int and string keys, pushes of lists
(stock's summation orders, bit for bit), pulls, pushpull, broadcast, updaters and optimizers,
optimizer states, gradient compression, and `gluon.Trainer` and `Module` over two CPU contexts."""
import os

import numpy as np
import pytest

from differential import assert_same_results, run_script

pytestmark = pytest.mark.skipif("MXNET_LIBRARY_PATH" not in os.environ,
                                reason="MXNET_LIBRARY_PATH is not set: no library of ours to compare")

STORE = r"""
import pickle, sys
import numpy as np
import mxnet as mx

rng = np.random.RandomState(0)
res = {}

def arr(shape, dtype="float32", scale=1.0, ctx=None):
    return mx.nd.array(rng.uniform(-1, 1, shape) * scale, dtype=dtype, ctx=ctx or mx.cpu())

for name in ("local", "device"):
    kv = mx.kv.create(name)
    res[name, "type"] = (kv.type, kv.rank, kv.num_workers)
    # Int keys; values whose sum depends on the order of additions (large and small).
    kv.init([3, 5, 7], [arr((4, 5)), arr((7,)), arr((2, 3), "float64")])
    # (A key is always pushed the same number of values: stock sizes its buffers once.)
    for n in (1, 2, 3, 4, 5, 6, 9):
        kv.init(100 + n, arr((4, 5)))
        for step in range(2):
            vals = [arr((4, 5), scale=10.0 ** (k % 4), ctx=mx.cpu(k % 3)) for k in range(n)]
            kv.push(100 + n, vals)
            outs = [mx.nd.zeros((4, 5), ctx=mx.cpu(k)) for k in range(2)]
            kv.pull(100 + n, out=outs)
            res[name, "push", n, step] = [o.asnumpy() for o in outs]
    # Several keys in one call, out of order, with repeats.
    a, b, c = arr((7,)), arr((2, 3), "float64"), arr((7,))
    kv.push([7, 5, 7, 5], [b, a, b * 2, c])
    o5, o7 = mx.nd.zeros((7,)), mx.nd.zeros((2, 3), dtype="float64")
    kv.pull([5, 7], out=[o5, o7])
    res[name, "multi"] = (o5.asnumpy(), o7.asnumpy())
    # Pull into another dtype converts.
    o16 = mx.nd.zeros((7,), dtype="float16")
    kv.pull(5, out=o16)
    res[name, "pull-f16"] = o16.asnumpy()
    # pushpull with and without `out`.
    g = [arr((7,)) for _ in range(2)]
    kv.pushpull(5, g)
    res[name, "pushpull-inplace"] = [x.asnumpy() for x in g]
    out = [mx.nd.zeros((7,)) for _ in range(2)]
    kv.pushpull(5, [arr((7,)), arr((7,))], out=out)
    res[name, "pushpull-out"] = [x.asnumpy() for x in out]
    # Stock's single-value push keeps the pushed array itself: a later write shows in a pull.
    v = arr((7,))
    kv.push(5, v)
    v += 1
    kv.pull(5, out=o5)
    res[name, "alias"] = o5.asnumpy()
    # String keys, other dtypes, broadcast.
    ks = mx.kv.create(name)
    ks.init("w", arr((3, 3), "float16"))
    ks.push("w", [arr((3, 3), "float16") for _ in range(5)])
    ow = mx.nd.zeros((3, 3), dtype="float16")
    ks.pull("w", out=ow)
    res[name, "f16"] = ow.asnumpy()
    ks.init("i", mx.nd.array([1, 2, 3], dtype="int32"))
    ks.push("i", [mx.nd.array([2 ** 30, 5, -7], dtype="int32")] * 3)
    oi = mx.nd.zeros((3,), dtype="int32")
    ks.pull("i", out=oi)
    res[name, "int32"] = oi.asnumpy()
    bo = [mx.nd.zeros((2, 2), ctx=mx.cpu(k)) for k in range(3)]
    ks.broadcast("bias", arr((2, 2)), out=bo)
    res[name, "broadcast"] = [x.asnumpy() for x in bo]

    # A custom updater: called with the key, the sum and the stored value.
    ku = mx.kv.create(name)
    ku.init([0, 1], [mx.nd.ones((2, 2)), mx.nd.ones((3,))])
    seen = []
    def update(key, inp, stored):
        seen.append((key, inp.asnumpy().copy(), stored.asnumpy().copy()))
        stored += inp * 2
    ku._set_updater(update)
    ku.push([1, 0], [arr((3,)), arr((2, 2))])
    ku.push(0, [arr((2, 2)), arr((2, 2))])
    o0, o1 = mx.nd.zeros((2, 2)), mx.nd.zeros((3,))
    ku.pull([0, 1], out=[o0, o1])
    res[name, "updater"] = (seen, o0.asnumpy(), o1.asnumpy())
    kus = mx.kv.create(name)
    kus.init("x", mx.nd.ones((2,)))
    keys = []
    kus._set_updater(lambda k, i, s: keys.append(k))
    kus.push("x", mx.nd.ones((2,)))
    res[name, "str-updater-key"] = keys

    # Optimizers inside the store (update_on_kvstore), and their states.
    for opt in (mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=1e-3),
                mx.optimizer.Adam(learning_rate=0.01)):
        ko = mx.kv.create(name)
        ko.init(["a", "b"], [arr((5, 4)), arr((4,))])
        ko.set_optimizer(opt)
        for step in range(4):
            ko.push(["a", "a", "b"], [arr((5, 4), ctx=mx.cpu(0)), arr((5, 4), ctx=mx.cpu(1)), arr((4,))])
        w = [mx.nd.zeros((5, 4)), mx.nd.zeros((4,))]
        ko.pull(["a", "b"], out=w)
        res[name, "optimizer", type(opt).__name__] = [x.asnumpy() for x in w]
    path = sys.argv[-2] + "/" + name + ".states"
    ko.save_optimizer_states(path)
    kl = mx.kv.create(name)
    kl.init(["a", "b"], w)
    kl.set_optimizer(mx.optimizer.Adam(learning_rate=0.01))
    kl.load_optimizer_states(path)
    kl.push("a", mx.nd.ones((5, 4)))
    ko.push("a", mx.nd.ones((5, 4)))
    x, y = mx.nd.zeros((5, 4)), mx.nd.zeros((5, 4))
    kl.pull("a", out=x)
    ko.pull("a", out=y)
    res[name, "states"] = (x.asnumpy(), y.asnumpy())

# A device store sums in the dtype the key was initialised with.
km = mx.kv.create("device")
km.init(0, mx.nd.zeros((6,)))
km.push(0, [arr((6,), "float16", ctx=mx.cpu(0)), arr((6,), "float16", ctx=mx.cpu(1))])
om = mx.nd.zeros((6,))
km.pull(0, out=om)
res["mixed-dtype"] = om.asnumpy()

# 2-bit gradient compression on a device store: thresholds sent, residuals kept per source.
kc = mx.kv.create("device")
kc.set_gradient_compression({"type": "2bit", "threshold": 0.5})
kc.init(["g", "h"], [mx.nd.zeros((40,)), mx.nd.zeros((3, 7))])
for step in range(4):
    g = [arr((40,), ctx=mx.cpu(k)) for k in range(2)]
    out = [mx.nd.zeros((40,), ctx=mx.cpu(k)) for k in range(2)]
    kc.pushpull("g", g, out=out)
    res["compressed", step] = [o.asnumpy() for o in out]
    h = arr((3, 7))
    kc.pushpull("h", h, out=[mx.nd.zeros((3, 7))])
    oh = mx.nd.zeros((3, 7))
    kc.pull("h", out=oh)
    res["compressed-one", step] = oh.asnumpy()

# Errors stock raises too: duplicate init, a key never initialised, mixed key types,
# unknown compression.
def error(f):
    try:
        f()
    except mx.MXNetError:
        return "MXNetError"
    return "ok"
ke = mx.kv.create("local")
ke.init(1, mx.nd.ones((2,)))
res["err", "dup"] = error(lambda: ke.init(1, mx.nd.ones((2,))))
res["err", "uninit"] = error(lambda: ke.pull(2, out=mx.nd.zeros((2,))))
res["err", "mixed"] = error(lambda: ke.init("s", mx.nd.ones((2,))))
kd = mx.kv.create("device")
res["err", "1bit"] = error(lambda: kd.set_gradient_compression({"type": "1bit"}))
res["err", "threshold"] = error(lambda: kd.set_gradient_compression({"type": "2bit", "threshold": -1}))
o = mx.nd.zeros((2,))
ke.pull(1, out=o)
res["err", "kept"] = o.asnumpy()
mx.nd.waitall()
with open(sys.argv[-1], "wb") as f:
    pickle.dump(res, f)
"""


def test_stores_match_stock(tmp_path):
    ours = run_script(STORE, "ours", tmp_path, str(tmp_path))
    stock = run_script(STORE, "stock", tmp_path, str(tmp_path))
    assert_same_results(ours, stock)


TRAINER = r"""
import pickle, sys
import numpy as np
import mxnet as mx
from mxnet import autograd, gluon

res = {}
ctxs = [mx.cpu(0), mx.cpu(1)]
rng = np.random.RandomState(1)
X = rng.uniform(-1, 1, (8, 16, 10)).astype("float32")
Y = rng.randint(0, 4, (8, 16)).astype("float32")
for kvstore, on_kv, opt in [("device", True, "sgd"), ("device", False, "sgd"), ("local", True, "adam"),
                            ("local", False, "adam"), ("device", None, "nag")]:
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(12, activation="relu", in_units=10), gluon.nn.Dense(4, in_units=12))
    net.initialize(ctx=ctxs)
    init = np.random.RandomState(7)  # the libraries' random streams differ: start from NumPy's
    for p in net.collect_params().values():
        p.set_data(mx.nd.array(init.uniform(-0.5, 0.5, p.shape)))
    kw = {"learning_rate": 0.05}
    if opt != "adam":
        kw["momentum"] = 0.9
    trainer = gluon.Trainer(net.collect_params(), opt, kw, kvstore=kvstore, update_on_kvstore=on_kv)
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    for step in range(5):
        xs = gluon.utils.split_and_load(mx.nd.array(X[step]), ctxs)
        ys = gluon.utils.split_and_load(mx.nd.array(Y[step]), ctxs)
        with autograd.record():
            ls = [loss(net(x), y) for x, y in zip(xs, ys)]
        for l in ls:
            l.backward()
        trainer.step(16)
    key = (kvstore, on_kv, opt)
    res[key, "update_on_kvstore"] = trainer._update_on_kvstore
    res[key, "weights"] = {n: [d.asnumpy() for d in p.list_data()] for n, p in net.collect_params().items()}
mx.nd.waitall()
with open(sys.argv[-1], "wb") as f:
    pickle.dump(res, f)
"""


def test_trainer_on_two_contexts_matches_stock(tmp_path):
    ours = run_script(TRAINER, "ours", tmp_path)
    stock = run_script(TRAINER, "stock", tmp_path)
    assert ours.keys() == stock.keys()
    for key in ours:
        if key[1] == "weights":
            # Dense's matrix products sum in another order than stock's BLAS: ulps apart.
            for name in ours[key]:
                for a, b in zip(ours[key][name], stock[key][name]):
                    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"{key} {name}")
        else:
            assert ours[key] == stock[key], key
    # The copies on both contexts stay identical.
    for key, value in ours.items():
        if key[1] == "weights":
            for name, (a, b) in value.items():
                assert (a == b).all(), (key, name)


BAD = r"""
import pickle, sys
import mxnet as mx
res = {}
def first_line(f):
    try:
        f()
    except Exception as e:  # NotImplementedError is not an MXNetError
        return str(e).splitlines()[0]
    return "ok"
kv = mx.kv.create("local")
kv.init([1, 2], [mx.nd.array([1, 2]), mx.nd.array([3, 4, 5])])
res["dup-in-list"] = first_line(lambda: kv.init([4, 1], [mx.nd.ones((1,)), mx.nd.ones((2,))]))
res["uninit"] = first_line(lambda: kv.pull(4, out=mx.nd.zeros((1,))))
res["push-shape"] = first_line(lambda: kv.push(1, mx.nd.ones((3,))))
res["pull-shape"] = first_line(lambda: kv.pull(2, out=mx.nd.zeros((2,))))
res["push-dtypes"] = first_line(lambda: kv.push(1, [mx.nd.ones((2,)), mx.nd.ones((2,), dtype="float64")]))  # summed in float32
res["dist"] = first_line(lambda: mx.kv.create("dist_async"))
res["nccl"] = first_line(lambda: mx.kv.create("nccl"))
res["barrier"] = first_line(lambda: kv._barrier())
o1, o2 = mx.nd.zeros((2,)), mx.nd.zeros((3,))
kv.pull([1, 2], out=[o1, o2])
res["kept"] = (o1.asnumpy().tolist(), o2.asnumpy().tolist())
with open(sys.argv[-1], "wb") as f:
    pickle.dump(res, f)
"""


def test_bad_input_is_refused_and_loses_nothing(tmp_path):
    # Stock accepts some of these silently (a push of another shape replaces the value; a
    # duplicate inside one init list initialises the keys before it) or needs a cluster
    # (dist_async), so this is checked on this library alone. Distributed stores:
    # test_kvstore_dist.py.
    r = run_script(BAD, "ours", tmp_path)
    assert r["dup-in-list"].startswith("MXNetError: duplicate init of key 1"), r
    assert r["uninit"] == "MXNetError: key 4 has not been initialized", r
    assert r["push-shape"] == "MXNetError: shape mismatch for key 1: it was initialized with shape (2), pushed (3)", r
    assert r["pull-shape"] == "MXNetError: shape mismatch for key 2: its value has shape (3), the output (2)", r
    assert r["push-dtypes"] == "ok", r
    assert r["dist"].startswith("NotImplementedError: the asynchronous distributed KVStore 'dist_async'"), r
    assert r["nccl"].startswith("NotImplementedError: the NCCL KVStore"), r
    assert r["barrier"] == "ok", r  # a barrier on one machine returns at once
    assert r["kept"] == ([2.0, 2.0], [3.0, 4.0, 5.0]), r  # the refused calls changed nothing


MODULE = r"""
import pickle, sys
import numpy as np
import mxnet as mx
rng = np.random.RandomState(0)
X = rng.uniform(-1, 1, (64, 10)).astype("float32")
Y = rng.randint(0, 3, (64,)).astype("float32")
it = mx.io.NDArrayIter(X, Y, batch_size=16)
data = mx.sym.var("data")
net = mx.sym.Activation(mx.sym.FullyConnected(data, num_hidden=8, name="fc1"), act_type="relu")
net = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(net, num_hidden=3, name="fc2"), name="softmax")
res = {}
for kv in ("local", "device"):
    mod = mx.mod.Module(net, context=[mx.cpu(0), mx.cpu(1)])
    mod.bind(it.provide_data, it.provide_label)
    init = np.random.RandomState(3)
    shapes = dict(zip(net.list_arguments(), net.infer_shape(data=(16, 10))[0]))
    mod.init_params(arg_params={n: mx.nd.array(init.uniform(-0.5, 0.5, s)) for n, s in shapes.items()
                                if n not in ("data", "softmax_label")})
    mod.init_optimizer(kvstore=kv, optimizer="sgd", optimizer_params={"learning_rate": 0.1, "momentum": 0.9})
    for epoch in range(3):
        it.reset()
        for b in it:
            mod.forward_backward(b)
            mod.update()
    res[kv] = {k: v.asnumpy() for k, v in mod.get_params()[0].items()}
with open(sys.argv[-1], "wb") as f:
    pickle.dump(res, f)
"""


def test_module_on_two_contexts_matches_stock(tmp_path):
    ours = run_script(MODULE, "ours", tmp_path)
    stock = run_script(MODULE, "stock", tmp_path)
    for kv in ("local", "device"):
        assert ours[kv].keys() == stock[kv].keys()
        for name in ours[kv]:
            np.testing.assert_allclose(ours[kv][name], stock[kv][name], rtol=1e-5, atol=1e-6, err_msg=f"{kv} {name}")
