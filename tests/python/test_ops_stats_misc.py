"""`moments` (mean and variance over axes, with gradients), `_contrib_index_array`,
`khatri_rao`, `_contrib_index_copy` and `_contrib_quadratic` (with gradients), `_histogram`, and
`im2col`/`col2im` (with gradients) (issue 35) on this library against stock 1.9.1 in the same test: several shapes,
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
x = mx.nd.array([[0, 1], [2, 2], [3, 4], [5, -1], [4.999, 0.5], [2.5, float("nan")]])
for dtype in ("float32", "float64", "int32"):
    xd = x.astype(dtype) if dtype != "int32" else mx.nd.array([[0, 1], [2, 2], [3, 4], [5, -1]], dtype="int32")
    res["histogram", dtype] = [a.asnumpy() for a in mx.nd.histogram(xd, bins=5, range=(0, 5))]
    res["histogram-range", dtype] = [a.asnumpy() for a in mx.nd.histogram(xd, bins=3, range=(1, 1))]
    res["histogram-bins", dtype] = [a.asnumpy() for a in mx.nd.histogram(xd, bins=mx.nd.array([0., 2.1, 3., 4.], dtype=dtype))]
res["histogram-sym"] = mx.sym.histogram(mx.sym.var("x"), bins=4, range=(0, 1)).infer_shape(x=(3, 2))
# 2-D only: stock's im2col fails on 1-D and 3-D data (test_im2col_in_1d_and_3d covers ours).
for shape, kw in (((2, 2, 5, 6), dict(kernel=(2, 3))),
                  ((1, 3, 6, 5), dict(kernel=(3, 2), stride=(2, 1), dilate=(1, 2), pad=(1, 1)))):
    x = mx.nd.array(rng.uniform(-1, 1, shape))
    x.attach_grad()
    with mx.autograd.record():
        cols = mx.nd.im2col(x, **kw)
    head = mx.nd.array(rng.uniform(-1, 1, cols.shape))
    cols.backward(head)
    c = mx.nd.array(rng.uniform(-1, 1, cols.shape))
    c.attach_grad()
    with mx.autograd.record():
        img = mx.nd.col2im(c, output_size=shape[2:], **kw)
    img.backward(mx.nd.array(rng.uniform(-1, 1, img.shape)))
    res["im2col", shape] = (cols.asnumpy(), x.grad.asnumpy(), img.asnumpy(), c.grad.asnumpy())
errs = {}
for k, call in {
    "im2col-kernel": lambda: mx.nd.im2col(mx.nd.ones((1, 1, 2, 2)), kernel=(3, 3)),
    "col2im-size": lambda: mx.nd.col2im(mx.nd.ones((1, 4, 5)), output_size=(3, 3), kernel=(2, 2)),
    "histogram-range-order": lambda: mx.nd.histogram(mx.nd.ones((3,)), bins=2, range=(2, 1))[0],
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
        elif key in ("moments-sym", "khatri_rao-sym", "histogram-sym"):
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


def test_im2col_in_1d_and_3d():
    # Against a direct unfolding in NumPy (stock 1.9.1's im2col handles 2-D data only).
    import mxnet as mx
    rng = np.random.RandomState(1)
    x = rng.uniform(-1, 1, (2, 3, 9))
    cols = mx.nd.im2col(mx.nd.array(x), kernel=(3,), stride=(2,), pad=(1,)).asnumpy()
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1)))
    want = np.stack([xp[:, :, j:j + 2 * 5:2] for j in range(3)], axis=2).reshape(2, 9, 5)
    np.testing.assert_allclose(cols, want, rtol=1e-6)
    x3 = rng.uniform(-1, 1, (1, 2, 3, 4, 4))
    cols3 = mx.nd.im2col(mx.nd.array(x3), kernel=(2, 2, 3)).asnumpy()
    blocks = [x3[:, :, d:d + 2, h:h + 2, w:w + 3].reshape(1, 2 * 12) for d in range(2) for h in range(3) for w in range(2)]
    np.testing.assert_allclose(cols3, np.stack(blocks, axis=2), rtol=1e-6)
    # col2im sums each block back: folding columns of ones counts the blocks covering a pixel.
    ones = mx.nd.col2im(mx.nd.ones((1, 2 * 12, 12)), output_size=(3, 4, 4), kernel=(2, 2, 3)).asnumpy()
    cover = np.zeros((3, 4, 4))
    for d in range(2):
        for h in range(3):
            for w in range(2):
                cover[d:d + 2, h:h + 2, w:w + 3] += 1
    np.testing.assert_allclose(ones[0, 0], cover)
