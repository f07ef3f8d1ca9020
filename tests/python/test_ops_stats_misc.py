"""`moments` (mean and variance over axes, with gradients), `_contrib_index_array`,
`khatri_rao`, `_contrib_index_copy` and `_contrib_quadratic` (with gradients) (issue 35) on this library against stock 1.9.1 in the same test: several shapes,
axes (negative, all, keepdims), dtypes, imperative and symbolic calls, and bad input."""
import os

import numpy as np
import pytest

from differential import run_script

pytestmark = pytest.mark.skipif("MXNET_LIBRARY_PATH" not in os.environ,
                                reason="MXNET_LIBRARY_PATH is not set: no library of ours to compare")

SCRIPT = r"""
import pickle, sys
import numpy as np
import mxnet as mx
rng = np.random.RandomState(0)
res = {}
for shape, axes, keepdims in (((4, 5), (0,), False), ((4, 5), (1,), True), ((2, 3, 4), (0, 2), False),
                              ((2, 3, 4), (-1,), True), ((3, 2, 2, 5), (0, 1, 2, 3), False), ((6,), (0,), False)):
    x0 = rng.uniform(-2, 3, shape)
    for dtype in ("float32", "float64", "float16"):
        x = mx.nd.array(x0, dtype=dtype)
        x.attach_grad()
        with mx.autograd.record():
            mean, var = mx.nd.moments(x, axes=axes, keepdims=keepdims)
            loss = (mean * mx.nd.array(rng.uniform(-1, 1, mean.shape), dtype=dtype)).sum() + (var * 0.5).sum()
        loss.backward()
        res["moments", shape, axes, keepdims, dtype] = (mean.asnumpy(), var.asnumpy(), x.grad.asnumpy())
res["moments-int"] = [a.asnumpy() for a in mx.nd.moments(mx.nd.array([[1, 2], [4, 7]], dtype="int32"), axes=(1,))]
s = mx.sym.moments(mx.sym.var("x"), axes=(1,))
res["moments-sym"] = (s.list_outputs(), s.infer_shape(x=(3, 4, 5)))
ex = mx.sym.Group(list(s)).bind(mx.cpu(), {"x": mx.nd.array(rng.uniform(0, 1, (3, 4, 5)))})
res["moments-sym-out"] = [o.asnumpy() for o in ex.forward()]
for shape, axes in (((2, 3), None), ((2, 3, 4), (1, 0)), ((3, 2), (-1,)), ((5,), None)):
    x = mx.nd.zeros(shape)
    x.attach_grad()
    with mx.autograd.record():
        idx = mx.nd.contrib.index_array(x, axes=axes) if axes else mx.nd.contrib.index_array(x)
    idx.backward(mx.nd.ones_like(idx))
    res["index_array", shape, axes] = (idx.asnumpy(), x.grad.asnumpy())
a = mx.nd.array(rng.uniform(-1, 1, (2, 3)))
b = mx.nd.array(rng.uniform(-1, 1, (4, 3)))
c = mx.nd.array(rng.uniform(-1, 1, (3, 3)))
res["khatri_rao"] = [mx.nd.khatri_rao(a).asnumpy(), mx.nd.khatri_rao(a, b).asnumpy(), mx.nd.khatri_rao(a, b, c).asnumpy(),
                     mx.nd.khatri_rao(a.astype("float64"), b.astype("float64")).asnumpy()]
res["khatri_rao-sym"] = mx.sym.khatri_rao(mx.sym.var("a"), mx.sym.var("b")).infer_shape(a=(2, 3), b=(4, 3))
for shape, idx_dtype in (((5, 3), "float32"), ((6, 2, 2), "int64")):
    old = mx.nd.array(rng.uniform(-1, 1, shape))
    new = mx.nd.array(rng.uniform(-1, 1, (3,) + shape[1:]))
    idx = mx.nd.array([0, 4, 2], dtype=idx_dtype)
    old.attach_grad(); new.attach_grad()
    with mx.autograd.record():
        y = mx.nd.contrib.index_copy(old, idx, new)
    y.backward(mx.nd.array(rng.uniform(-1, 1, shape)))
    res["index_copy", shape] = (y.asnumpy(), old.grad.asnumpy(), new.grad.asnumpy())
for dtype in ("float32", "float64"):
    x = mx.nd.array(rng.uniform(-2, 2, (4, 5)), dtype=dtype)
    x.attach_grad()
    with mx.autograd.record():
        y = mx.nd.contrib.quadratic(x, a=2.5, b=-3.1, c=0.7)
    y.backward(mx.nd.array(rng.uniform(-1, 1, (4, 5)), dtype=dtype))
    res["quadratic", dtype] = (y.asnumpy(), x.grad.asnumpy())
errs = {}
for k, call in {
    "index-copy-shape": lambda: mx.nd.contrib.index_copy(mx.nd.ones((5, 3)), mx.nd.array([0, 1]), mx.nd.ones((3, 3))),
    "moments-no-axes": lambda: mx.nd.moments(mx.nd.ones((2, 3))),
    "moments-bad-axis": lambda: mx.nd.moments(mx.nd.ones((2, 3)), axes=(2,)),
    "index-bad-axis": lambda: mx.nd.contrib.index_array(mx.nd.ones((2, 3)), axes=(3,)),
    "khatri-columns": lambda: mx.nd.khatri_rao(mx.nd.ones((2, 3)), mx.nd.ones((2, 4))),
}.items():
    try:
        call().wait_to_read()
        errs[k] = None
    except mx.base.MXNetError as e:
        errs[k] = str(e).splitlines()[0]
res["errors"] = errs
with open(sys.argv[-1], "wb") as fh:
    pickle.dump(res, fh)
"""

TOL = {"float32": (1e-5, 1e-6), "float64": (1e-12, 1e-13), "float16": (2e-3, 2e-3)}


def test_against_stock(tmp_path):
    ours = run_script(SCRIPT, "ours", tmp_path)
    stock = run_script(SCRIPT, "stock", tmp_path)
    assert ours.keys() == stock.keys()
    for key in ours:
        if key == "errors":
            for k, msg in ours[key].items():
                assert msg is not None and msg.startswith("MXNetError: "), (k, msg)
                # Stock does not check index_array's axes (it reads past its index table).
                assert stock[key][k] is not None or k == "index-bad-axis", (k, stock[key][k])
            continue
        if key[0] == "moments":
            rtol, atol = TOL[key[-1]]
            for what, a, b in zip(("mean", "var", "grad"), ours[key], stock[key]):
                assert a.dtype == b.dtype and a.shape == b.shape, (key, what)
                np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol,
                                           err_msg=f"{key} {what}")
        elif key[0] == "quadratic":
            for a, b in zip(ours[key], stock[key]):
                assert a.dtype == b.dtype
                np.testing.assert_allclose(a, b, rtol=2e-6 if key[1] == "float32" else 1e-12, err_msg=str(key))
        elif key in ("moments-sym", "khatri_rao-sym"):
            assert ours[key] == stock[key], key
        else:
            for a, b in zip(ours[key], stock[key]):
                assert a.dtype == b.dtype and a.shape == b.shape, key
                np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=str(key))


def test_index_copy_checks_its_index():
    # Stock copies to wherever the index points (past the end too); here it is an error.
    import mxnet as mx
    for bad in ([5], [-1]):
        with pytest.raises(IndexError, match="out of range"):
            mx.nd.contrib.index_copy(mx.nd.zeros((3, 2)), mx.nd.array(bad), mx.nd.ones((1, 2))).wait_to_read()
