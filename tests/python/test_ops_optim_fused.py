"""Fused optimizer operators and AMP/internal operators (issue 35) on this library against
stock 1.9.1 in the same test: `preloaded_multi_*` SGD forms, `multi_lars` and the LARS
optimizer built on them, `_multi_adamw_update`/`_multi_mp_adamw_update`, `amp_multicast`
(types, gradient, symbolic inference), and the internal `_grad_add`,
`_identity_with_attr_like_rhs`, `_zeros_without_dtype`, `_set_value`, `_onehot_encode`,
`_CrossDeviceCopy`; with bad input for each."""
import os

import numpy as np
import pytest

from differential import assert_both_refuse, assert_close_results, run_script

pytestmark = pytest.mark.skipif("MXNET_LIBRARY_PATH" not in os.environ,
                                reason="MXNET_LIBRARY_PATH is not set: no library of ours to compare")

SCRIPT = r"""
import pickle, sys
import numpy as np
import mxnet as mx
rng = np.random.RandomState(0)
res = {}
shapes = [(3, 4), (5,), (2, 2, 3)]
n = len(shapes)
def arrs(dtype, lo=-1.0, hi=1.0):
    return [mx.nd.array(rng.uniform(lo, hi, s), dtype=dtype) for s in shapes]
def flat(*groups):
    return [x for t in zip(*groups) for x in t]
def np_(xs):
    return [x.asnumpy() for x in xs]

for dtype in ("float32", "float64", "float16"):
    for clip in (-1.0, 0.3):
        lrs = mx.nd.array(rng.uniform(0.01, 0.2, n))
        wds = mx.nd.array(rng.uniform(0.0, 0.1, n))
        w, g, m = arrs(dtype), arrs(dtype, -2, 2), arrs(dtype)
        w1 = [x.copy() for x in w]
        mx.nd.preloaded_multi_sgd_update(*(flat(w1, g) + [lrs, wds]), num_weights=n, rescale_grad=0.7,
                                         clip_gradient=clip, out=w1)
        res["pre-sgd", dtype, clip] = np_(w1)
        w2, m2 = [x.copy() for x in w], [x.copy() for x in m]
        mx.nd.preloaded_multi_sgd_mom_update(*(flat(w2, g, m2) + [lrs, wds]), num_weights=n, momentum=0.9,
                                             rescale_grad=0.7, clip_gradient=clip, out=w2)
        res["pre-mom", dtype, clip] = np_(w2 + m2)
        if dtype == "float16":
            w3, w32 = [x.copy() for x in w], [x.astype("float32") for x in w]
            mx.nd.preloaded_multi_mp_sgd_update(*(flat(w3, g, w32) + [lrs, wds]), num_weights=n,
                                                rescale_grad=0.7, clip_gradient=clip, out=w3)
            res["pre-mp", clip] = np_(w3 + w32)
            w4, w32 = [x.copy() for x in w], [x.astype("float32") for x in w]
            m32 = [x.astype("float32") for x in m]
            mx.nd.preloaded_multi_mp_sgd_mom_update(*(flat(w4, g, m32, w32) + [lrs, wds]), num_weights=n,
                                                    momentum=0.9, rescale_grad=0.7, clip_gradient=clip, out=w4)
            res["pre-mp-mom", clip] = np_(w4 + m32 + w32)

lrs = mx.nd.array(rng.uniform(0.01, 0.2, 6))
wss = mx.nd.array([4.0, 0.0, 1.0, 2.0, 3.0, 9.0])
gss = mx.nd.array([1.0, 2.0, 0.0, 3.0, 4.0, 0.5])
wds = mx.nd.array(rng.uniform(0.0, 0.1, 6))
res["lars"] = mx.nd.multi_lars(lrs, wss, gss, wds, eta=0.001, eps=1e-8, rescale_grad=0.5).asnumpy()
res["lars-default-rescale"] = mx.nd.multi_lars(lrs, wss, gss, wds, eta=0.01, eps=0.0).asnumpy()
lrs2 = lrs.copy()
mx.nd.multi_lars(lrs2[:4], wss[:4], gss[:4], wds[:4], eta=0.001, eps=1e-8, out=lrs2[:4])
res["lars-into-its-input"] = lrs2.asnumpy()
res["lars-sym"] = mx.sym.multi_lars(*[mx.sym.var(k) for k in "abcd"], eta=0.1, eps=0.0).infer_shape(a=(3,), b=(3,), c=(3,), d=(3,))

# The LARS optimizer: multi_sum_sq, multi_lars and the preloaded updates, with and without
# momentum and multi-precision; names ending in bias skip the trust ratio.
for momentum, mp in ((0.0, False), (0.9, False), (0.9, True), (0.0, True)):
    dtype = "float16" if mp else "float32"
    opt = mx.optimizer.create("lars", learning_rate=0.1, momentum=momentum, wd=0.01, eta=0.01,
                              multi_precision=mp, rescale_grad=0.5,
                              param_idx2name={0: "fc_weight", 1: "fc_bias", 2: "conv_weight"})
    opt.aggregate_num = 2
    up = mx.optimizer.get_updater(opt)
    ws = arrs(dtype)
    for step in range(3):
        gs = arrs(dtype, -1, 1)
        up([0, 1, 2], gs, ws)
    res["lars-opt", momentum, mp] = np_(ws)

# The frontend passes rescale_grad as a float32 array: stock's non-mixed form takes float32
# weights only (its scale must have the weights' type; bad input below).
for dtype in ("float32", "float16"):
    for clip in (-1.0, 0.4):
        w, g, mean = arrs(dtype), arrs(dtype, -2, 2), arrs(dtype, -0.1, 0.1)
        var = arrs(dtype, 0.0, 0.2)
        lrs, wds, etas = list(rng.uniform(0.01, 0.1, n)), list(rng.uniform(0, 0.1, n)), list(rng.uniform(0.5, 1, n))
        if dtype == "float32":
            mx.nd.contrib.multi_adamw_update(w, g, mean, var, rescale_grad=0.8, lrs=lrs, wds=wds, etas=etas,
                                             clip_gradient=clip, out=w)
            res["madamw", dtype, clip] = np_(w + mean + var)
        if dtype == "float16":
            w, mean, var = arrs(dtype), arrs("float32", -0.1, 0.1), arrs("float32", 0, 0.2)
            w32 = [x.astype("float32") for x in w]
            mx.nd.contrib.multi_mp_adamw_update(w, g, mean, var, w32, rescale_grad=0.8, lrs=lrs, wds=wds,
                                                etas=etas, clip_gradient=clip, out=w)
            res["mp-madamw", clip] = np_(w + mean + var + w32)
for scale in (0.0, float("nan"), float("inf")):
    w, g, mean, var = arrs("float32"), arrs("float32"), arrs("float32"), arrs("float32", 0, 1)
    before = np_(w + mean + var)
    mx.nd.contrib.multi_adamw_update(w, g, mean, var, rescale_grad=scale, lrs=[0.1] * n, wds=[0.0] * n,
                                     etas=[1.0] * n, out=w)
    res["madamw-skip", str(scale)] = all(np.array_equal(a, b) for a, b in zip(before, np_(w + mean + var)))

# Stock's CPU build (oneDNN) fails on float16 and float64 arrays in amp_multicast ("unknown
# type for MKLDNN"), so those are compared in inference only and run on their own below.
b32 = mx.nd.array(rng.uniform(-1, 1, (2, 3)))
e32 = mx.nd.array(rng.uniform(-1, 1, (3,)))
i32 = mx.nd.array([1, 2, 3], dtype="int32")
for name, ins, kw in (("f32-i32", (b32, i32), {}), ("i32-f32", (i32, b32), {}), ("f32-f32", (b32, e32), {}),
                      ("narrow", (b32, e32), {"cast_narrow": True}), ("one", (b32,), {})):
    outs = mx.nd.amp_multicast(*ins, num_outputs=len(ins), **kw)
    outs = outs if isinstance(outs, list) else [outs]
    res["multicast", name] = [(o.dtype, o.asnumpy()) for o in outs]
b32.attach_grad(); e32.attach_grad()
with mx.autograd.record():
    x, y = mx.nd.amp_multicast(b32, e32, num_outputs=2)
    loss = (x * 2).sum() + (y * y).sum()
loss.backward()
res["multicast-grad"] = [(v.grad.dtype, v.grad.asnumpy()) for v in (b32, e32)]
s = mx.sym.amp_multicast(mx.sym.var("a"), mx.sym.var("b"), num_outputs=2)
res["multicast-sym"] = (s.list_outputs(), s.infer_shape(a=(2, 3), b=(4,)))
for kw, types in (({}, ("float16", "float32")), ({"cast_narrow": True}, ("float16", "float32")),
                  ({}, ("float64", "float16")), ({}, ("int32", "float16"))):
    t = mx.sym.amp_multicast(mx.sym.var("a"), mx.sym.var("b"), num_outputs=2, **kw)
    ex = t.bind(mx.cpu(), {"a": mx.nd.zeros((2, 3), dtype=types[0]), "b": mx.nd.zeros((4,), dtype=types[1])})
    res["multicast-bind", str(kw), types] = [o.dtype for o in ex.outputs]

p = mx.nd.array(rng.uniform(-1, 1, (3, 4)))
q = mx.nd.array(rng.uniform(-1, 1, (3, 4)))
res["grad_add"] = mx.nd._internal._grad_add(p, q).asnumpy()
p.attach_grad(); q.attach_grad()
with mx.autograd.record():
    r = mx.nd._internal._identity_with_attr_like_rhs(p, q)
r.backward(mx.nd.array(rng.uniform(-1, 1, (3, 4))))
res["identity_like_rhs"] = (r.asnumpy(), p.grad.asnumpy(), q.grad.asnumpy())
res["identity_like_rhs-sym"] = mx.sym._internal._identity_with_attr_like_rhs(mx.sym.var("l"), mx.sym.var("r")).infer_shape(l=(2, 5))
for dtype in ("float32", "int32", "float16"):
    t = mx.nd.zeros((2, 3), dtype=dtype)
    mx.nd._internal._set_value(2.5, out=t)
    res["set_value", dtype] = t.asnumpy()
oh = mx.nd.ones((3, 4))
mx.nd.onehot_encode(mx.nd.array([0, 2, 3]), oh)
res["onehot_encode"] = oh.asnumpy()

errs = {}
def attempt(key, f):
    try:
        f()
        errs[key] = None
    except mx.base.MXNetError as e:
        errs[key] = "MXNetError: " + str(e).splitlines()[0]
w, g = arrs("float32"), arrs("float32")
attempt("pre-lrs-count", lambda: mx.nd.preloaded_multi_sgd_update(*(flat(w, g) + [mx.nd.ones((2,)), mx.nd.ones((3,))]),
                                                                   num_weights=3, out=w).wait_to_read())
attempt("pre-lrs-dtype", lambda: mx.nd.preloaded_multi_sgd_update(*(flat(w, g) + [mx.nd.ones((3,), dtype="float64"), mx.nd.ones((3,))]),
                                                                   num_weights=3, out=w).wait_to_read())
attempt("lars-shape", lambda: mx.nd.multi_lars(mx.nd.ones((3,)), mx.nd.ones((2,)), mx.nd.ones((3,)), mx.nd.ones((3,)),
                                               eta=1.0, eps=0.0).wait_to_read())
attempt("madamw-lrs", lambda: mx.nd.contrib.multi_adamw_update(w, g, [x.copy() for x in w], [x.copy() for x in w],
                                                               rescale_grad=1.0, lrs=[0.1], wds=[0.0] * n, etas=[1.0] * n, out=w))
attempt("madamw-shape", lambda: mx.nd.contrib.multi_adamw_update(w, g, [x.copy() for x in w], [mx.nd.ones((7,))] * n,
                                                                 rescale_grad=1.0, lrs=[0.1] * n, wds=[0.0] * n, etas=[1.0] * n, out=w))
attempt("zeros_without_dtype-name", lambda: mx.nd._internal._zeros_without_dtype(shape=(2,), dtype="float64"))
w64 = arrs("float64")
attempt("madamw-scale-dtype", lambda: mx.nd.contrib.multi_adamw_update(w64, w64, [x.copy() for x in w64], [x.copy() for x in w64],
                                                                       rescale_grad=1.0, lrs=[0.1] * n, wds=[0.0] * n, etas=[1.0] * n, out=w64))
attempt("multicast-count", lambda: mx.nd.amp_multicast(b32, b32, num_outputs=3))
res["errors"] = errs
with open(sys.argv[-1], "wb") as f:
    pickle.dump(res, f)
"""


def _tol(dtype):
    return {np.dtype("float16"): (2e-3, 1e-3), np.dtype("float32"): (2e-6, 1e-7)}.get(dtype, (1e-12, 1e-14))


def test_against_stock(tmp_path):
    ours = run_script(SCRIPT, "ours", tmp_path)
    stock = run_script(SCRIPT, "stock", tmp_path)
    assert_both_refuse(ours["errors"], stock["errors"])
    assert_close_results(ours, stock, _tol, skip=["errors"])
    assert all(ours["madamw-skip", s] for s in ("0.0", "nan", "inf"))


def test_preloaded_sgd_matches_the_formula():
    import mxnet as mx
    w = mx.nd.array([1.0, -2.0, 3.0])
    g = mx.nd.array([0.5, 0.5, -4.0])
    mom = mx.nd.array([0.1, 0.0, -0.1])
    lrs, wds = mx.nd.array([0.1]), mx.nd.array([0.01])
    mx.nd.preloaded_multi_sgd_mom_update(w, g, mom, lrs, wds, num_weights=1, momentum=0.9, clip_gradient=1.0, out=w)
    want_mom = 0.9 * np.array([0.1, 0.0, -0.1]) - 0.1 * 0.01 * np.array([1.0, -2.0, 3.0]) - 0.1 * np.clip([0.5, 0.5, -4.0], -1, 1)
    np.testing.assert_allclose(mom.asnumpy(), want_mom, rtol=1e-6)
    np.testing.assert_allclose(w.asnumpy(), np.array([1.0, -2.0, 3.0]) + want_mom, rtol=1e-6)


def test_amp_multicast_on_float16_and_float64():
    """float16 and float64 (stock's CPU build refuses them at run time; its type rule is
    compared above)."""
    import mxnet as mx
    a = mx.nd.array([[0.5, -1.25]], dtype="float16")
    b = mx.nd.array([3.0, 4.0])
    x, y = mx.nd.amp_multicast(a, b, num_outputs=2)
    assert (x.dtype, y.dtype) == (np.float32, np.float32)
    np.testing.assert_array_equal(x.asnumpy(), [[0.5, -1.25]])
    x, y = mx.nd.amp_multicast(a, b, num_outputs=2, cast_narrow=True)
    assert (x.dtype, y.dtype) == (np.float16, np.float16)
    np.testing.assert_array_equal(y.asnumpy(), [3.0, 4.0])
    a.attach_grad()
    with mx.autograd.record():
        x, y = mx.nd.amp_multicast(a, b, num_outputs=2)
        loss = (x * 3).sum()
    loss.backward()
    assert a.grad.dtype == np.float16
    np.testing.assert_array_equal(a.grad.asnumpy(), [[3.0, 3.0]])
    d = mx.nd.array([1.5], dtype="float64")
    x, y = mx.nd.amp_multicast(d, a, num_outputs=2)  # no float32: the first input's type
    assert (x.dtype, y.dtype) == (np.float64, np.float64)
    x, y = mx.nd.amp_multicast(a, d, num_outputs=2)
    assert (x.dtype, y.dtype) == (np.float16, np.float64)


def test_zeros_without_dtype():
    """Stock fails imperatively ("Unknown type enum -1": its Python frontend cannot pass a
    type code); here an unknown type is float32, the type graphs give it."""
    import mxnet as mx
    z = mx.nd._internal._zeros_without_dtype(shape=(2, 3))
    assert z.dtype == np.float32
    np.testing.assert_array_equal(z.asnumpy(), np.zeros((2, 3)))
    out = mx.nd.ones((4,))
    mx.nd._internal._zeros_without_dtype(shape=(4,), out=out)
    np.testing.assert_array_equal(out.asnumpy(), np.zeros(4))


def test_cross_device_copy_is_a_copy():
    """Stock's executor inserts it between devices and cannot run it imperatively; here both
    are a copy."""
    import mxnet as mx
    x = mx.nd.array([[1.0, 2.0], [3.0, -4.0]])
    y = mx.nd._internal._CrossDeviceCopy(x)
    np.testing.assert_array_equal(y.asnumpy(), x.asnumpy())
    s = mx.sym._internal._CrossDeviceCopy(mx.sym.var("x"))
    out = s.bind(mx.cpu(), {"x": x}).forward()[0]
    np.testing.assert_array_equal(out.asnumpy(), x.asnumpy())
