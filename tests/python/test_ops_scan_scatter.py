"""`cumsum` (`_np_cumsum`) and `scatter_nd` with their gradients (issue 35) on this library
against stock 1.9.1 in the same test: shapes, axes, dtypes (the sum runs in the output
type), symbolic inference, and bad input."""
import os

import numpy as np
import pytest

from differential import assert_both_refuse, run_script

pytestmark = pytest.mark.skipif("MXNET_LIBRARY_PATH" not in os.environ,
                                reason="MXNET_LIBRARY_PATH is not set: no library of ours to compare")

SCRIPT = r"""
import pickle, sys
import numpy as np
import mxnet as mx
rng = np.random.RandomState(0)
res = {}
for shape in ((7,), (3, 4), (2, 3, 5), (4, 1, 3)):
    x0 = rng.uniform(-2, 2, shape)
    for axis in [None] + list(range(len(shape))):
        for dtype in ("float32", "float64", "float16"):
            x = mx.nd.array(x0, dtype=dtype)
            x.attach_grad()
            with mx.autograd.record():
                y = mx.nd.cumsum(x) if axis is None else mx.nd.cumsum(x, axis=axis)
            y.backward(mx.nd.array(rng.uniform(-1, 1, y.shape), dtype=dtype))
            res["cumsum", shape, axis, dtype] = (y.asnumpy(), x.grad.asnumpy())
ints = mx.nd.array([[100, 100, 100], [50, 60, 70]], dtype="int32")
for dtype in ("int8", "int32", "int64", "uint8"):
    res["cumsum-int", dtype] = mx.nd.cumsum(ints.astype(dtype), axis=1).asnumpy()
res["cumsum-bool"] = mx.nd.cumsum(mx.nd.array([1, 0, 1, 1]).astype("bool")).asnumpy()
for out in ("float64", "int32", "float16", "int8"):
    res["cumsum-dtype", out] = mx.nd.cumsum(mx.nd.array([[1.5, 2.25], [3.0, -7.5]]), axis=0, dtype=out).asnumpy()
s = mx.sym.cumsum(mx.sym.var("a"), axis=1)
res["cumsum-sym"] = (s.infer_shape(a=(2, 3)), mx.sym.cumsum(mx.sym.var("a")).infer_shape(a=(2, 3)))
ex = mx.sym.cumsum(mx.sym.var("a"), axis=0).bind(mx.cpu(), {"a": mx.nd.array([[1, 2], [3, 4]])})
res["cumsum-sym-out"] = ex.forward()[0].asnumpy()

for dshape, ishape, oshape, idx in (
        ((3,), (1, 3), (5,), [[0, 4, 2]]),
        ((2, 4), (1, 2), (3, 4), [[2, 0]]),
        ((2,), (2, 2), (3, 4), [[0, 2], [3, 1]]),
        ((2, 2, 3), (2, 2, 2), (4, 4, 3), [[[0, 1], [3, 2]], [[1, 1], [0, 3]]])):
    for dtype in ("float32", "float64", "int32"):
        data = mx.nd.array(rng.uniform(-3, 3, dshape), dtype=dtype)
        indices = mx.nd.array(idx, dtype="int64" if dtype == "int32" else "float32")
        res["scatter_nd", dshape, oshape, dtype] = mx.nd.scatter_nd(data, indices, shape=oshape).asnumpy()
    data = mx.nd.array(rng.uniform(-3, 3, dshape))
    data.attach_grad()
    with mx.autograd.record():
        y = mx.nd.scatter_nd(data, mx.nd.array(idx), shape=oshape)
    y.backward(mx.nd.array(rng.uniform(-1, 1, oshape)))
    res["scatter_nd-grad", dshape, oshape] = data.grad.asnumpy()
s = mx.sym.scatter_nd(mx.sym.var("d"), mx.sym.var("i"), shape=(3, 4))
res["scatter_nd-sym"] = s.infer_shape(d=(2,), i=(2, 2))

errs = {}
def attempt(key, f):
    try:
        f().wait_to_read()
        errs[key] = None
    except mx.base.MXNetError as e:
        errs[key] = "MXNetError: " + str(e).splitlines()[0]
attempt("cumsum-axis", lambda: mx.nd.cumsum(mx.nd.ones((2, 3)), axis=2))
attempt("cumsum-dtype", lambda: mx.nd.cumsum(mx.nd.ones((2, 3)), dtype="bool"))
attempt("scatter_nd-data-shape", lambda: mx.nd.scatter_nd(mx.nd.ones((3,)), mx.nd.array([[0, 1]]), shape=(4,)))
attempt("scatter_nd-index-rank", lambda: mx.nd.scatter_nd(mx.nd.ones((2,)), mx.nd.array([[0, 1]] * 3), shape=(4, 4)))
res["errors"] = errs
with open(sys.argv[-1], "wb") as f:
    pickle.dump(res, f)
"""


def test_against_stock(tmp_path):
    ours = run_script(SCRIPT, "ours", tmp_path)
    stock = run_script(SCRIPT, "stock", tmp_path)
    assert ours.keys() == stock.keys()
    assert_both_refuse(ours["errors"], stock["errors"])
    for key, val in ours.items():
        if key == "errors":
            continue
        elif key[0] == "cumsum" and key[3] == "float16":
            # Stock's float16 kernel rounds each partial sum; so does ours: equal.
            for a, b in zip(val, stock[key]):
                assert a.dtype == b.dtype
                np.testing.assert_array_equal(a, b, err_msg=str(key))
        elif key[0] == "cumsum":
            for a, b in zip(val, stock[key]):
                assert a.dtype == b.dtype
                np.testing.assert_allclose(a, b, rtol=1e-6 if key[3] == "float32" else 1e-13, err_msg=str(key))
        elif isinstance(val, np.ndarray):
            assert val.dtype == stock[key].dtype, key
            np.testing.assert_allclose(val, stock[key], rtol=1e-6, err_msg=str(key))
        else:
            assert val == stock[key], key


def test_cumsum_takes_negative_axes():
    """Stock 1.9.1 fails on a negative axis (its kernel indexes the shape with it); NumPy and
    this library count from the end."""
    import mxnet as mx
    x = np.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(mx.nd.cumsum(mx.nd.array(x), axis=-1).asnumpy(), np.cumsum(x, axis=-1))
    np.testing.assert_array_equal(mx.nd.cumsum(mx.nd.array(x), axis=-2).asnumpy(), np.cumsum(x, axis=-2))


def test_scatter_nd_checks_its_indices():
    import mxnet as mx
    # Stock does not check (it writes out of bounds); here the kernel fails with IndexError.
    with pytest.raises(IndexError, match="out of bounds"):
        mx.nd.scatter_nd(mx.nd.ones((2,)), mx.nd.array([[0, 5]]), shape=(4,)).wait_to_read()
    out = mx.nd.scatter_nd(mx.nd.array([1.0, 2.0]), mx.nd.array([[-1, 0]]), shape=(4,))
    np.testing.assert_array_equal(out.asnumpy(), [2.0, 0.0, 0.0, 1.0])
