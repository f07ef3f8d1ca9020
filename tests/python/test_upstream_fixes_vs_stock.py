"""Behaviours upstream 1.9.1 unit tests check (issue 35), on this library against stock in
the same test: NaN handling of `maximum`/`minimum`/`relu` and relu's gradient
(`test_ndarray_nan_comparison`); topk's gradient on int32 (`test_order`); `reshape` to fewer
elements outside numpy-shape mode, which the frontend turns into ValueError
(`test_ndarray_reshape`); a freed graph's outputs used in a new recording
(`test_cached`); in-place frontend calls while recording (`test_ndarray_indexing`);
zero-size arrays in legacy files and the shape-semantics checks of loading
(`test_save_load_scalar_zero_size_ndarrays`); and graph inference of Concat's and
SliceChannel's inputs from their outputs and of `where`
(`test_incomplete_infer_*`, `test_where_partial_shape`, `test_rnn.test_zoneout`).
"""
import os

import pytest

from differential import assert_same_results, run_script

pytestmark = pytest.mark.skipif("MXNET_LIBRARY_PATH" not in os.environ,
                                reason="MXNET_LIBRARY_PATH is not set: no library of ours to compare")

SCRIPT = r"""
import os, pickle, sys, tempfile
import numpy as np
import mxnet as mx
from mxnet import autograd, nd

res = {}


def attempt(key, fn):
    # The result, or the error's class (and whether it is stock's in-place refusal).
    try:
        res[key] = fn()
    except (mx.base.MXNetError, ValueError) as e:
        res[key] = type(e).__name__ + (" (in place)" if "Inplace operations" in str(e) else "")


nan = np.nan
a = nd.array([[nan, 1.0, -2.0], [3.0, nan, 0.0]])
b = nd.array([[0.5, nan, -1.0], [nan, nan, 2.0]])
res["maximum"] = nd.maximum(a, b).asnumpy()
res["minimum"] = nd.minimum(a, b).asnumpy()
res["maximum_scalar"] = nd.maximum(a, 0.5).asnumpy()
res["broadcast_minimum"] = nd.broadcast_minimum(a, nd.array([[0.0, nan, 1.0]])).asnumpy()
res["relu"] = nd.relu(a).asnumpy()
x = a.copy()
x.attach_grad()
with autograd.record():
    y = nd.relu(x)
y.backward(nd.array([[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]))
res["relu_grad"] = x.grad.asnumpy()

# topk's gradient on int32 data.
t = nd.array([5, 1, 9, 3, 7], dtype="int32")
t.attach_grad()
with autograd.record():
    v = nd.topk(t, k=2, ret_typ="value")
v.backward(nd.array([1, 2], dtype="int32"))
res["topk_int_grad"] = t.grad.asnumpy()

# reshape to fewer elements: the C call views the leading ones; the frontend raises.
r = nd.arange(30).reshape((2, 3, 5))
attempt("reshape_fewer", lambda: r.reshape((2, 3)).asnumpy())
attempt("reshape_more", lambda: r.reshape((7, 5)).asnumpy())

# A freed graph's output in a new recording is a constant.
w = nd.array([1.0, 3.0])
w.attach_grad()
with autograd.record():
    y = w * w
y.backward()
with autograd.record():
    z = y * w
z.backward(retain_graph=True)
res["freed_constant_grad"] = w.grad.asnumpy()

# In-place frontend calls while recording.
def setitem():
    q = nd.zeros((3, 2))
    val = nd.ones((2,))
    val.attach_grad()
    with autograd.record():
        q[0] = val
    return q.asnumpy()
attempt("setitem_recording", setitem)
def iadd():
    q = nd.zeros((2,))
    with autograd.record():
        q += nd.ones((2,))
    return q.asnumpy()
attempt("iadd_recording", iadd)
def iadd_recorded():
    q = nd.zeros((2,))
    val = nd.ones((2,))
    val.attach_grad()
    with autograd.record():
        q += val
    return q.asnumpy()
attempt("iadd_of_a_variable_recording", iadd_recorded)
def copyto_view():
    q = nd.zeros((3, 2))
    with autograd.record():
        q[:] = nd.ones((3, 2))
    return q.asnumpy()
attempt("whole_assign_recording", copyto_view)

# Zero-size arrays in files, and which shape semantics may load which file.
d = tempfile.mkdtemp()
shapes = [(2, 0, 1), (0,), (0, 4), (2, 1)]
arrays = [nd.array(np.arange(np.prod(s)).reshape(s)) for s in shapes]
f = os.path.join(d, "legacy")
nd.save(f, arrays)
res["legacy_roundtrip"] = [(l.shape, l.asnumpy()) for l in nd.load(f)]
with mx.np_shape(True):
    attempt("legacy_file_in_np_scope", lambda: len(nd.load(f)))
    g = os.path.join(d, "np")
    nd.save(g, [nd.array(np.ones(())), nd.array(np.zeros((0, 3)))])
    res["np_roundtrip"] = [(l.shape, l.asnumpy()) for l in nd.load(g)]
attempt("np_file_in_legacy", lambda: len(nd.load(g)))

# Graph inference from outputs.
def args_of(s, **kw):
    shapes, outs, _ = s.infer_shape_partial(**kw)
    return dict(zip(s.list_arguments(), shapes)), outs
sa = mx.sym.Variable("a", shape=(0, 10))
sc = mx.sym.Variable("c", shape=(5,))
res["slicechannel_squeeze"] = args_of(mx.sym.SliceChannel(sa, num_outputs=10, axis=1, squeeze_axis=True)[1] + sc)
sa = mx.sym.Variable("a", shape=(0, 15, 0))
sc = mx.sym.Variable("c", shape=(3, 5, 2))
res["slicechannel"] = args_of(mx.sym.SliceChannel(sa, num_outputs=3)[1] + sc)
ca, cb = mx.sym.Variable("a", shape=(0, 10)), mx.sym.Variable("b", shape=(0, 5))
cd = mx.sym.Variable("d", shape=(2, 0))
res["concat"] = args_of(cd + mx.sym.Concat(ca, cb, num_args=2, dim=1))
ca, cb = mx.sym.Variable("a", shape=(4, 3)), mx.sym.Variable("b", shape=(0, 3))
res["concat_one_unknown"] = args_of(mx.sym.Concat(ca, cb, dim=0) + mx.sym.Variable("e", shape=(10, 3)))
cond, wx, wy = mx.sym.Variable("cond"), mx.sym.Variable("x"), mx.sym.Variable("y")
wh = mx.sym.where(cond, wx, wy)
res["where_cond_unknown"] = args_of(wh, cond=(0, 2), x=(0, 2), y=(0, 2))
res["where_cond_1d_unknown"] = args_of(wh, cond=(0,), x=(2, 2), y=(2, 2))
res["where_fills_y"] = args_of(wh, cond=(4, 3), x=(4, 3), y=(0, 3))
res["where_from_output"] = args_of(wh + mx.sym.Variable("o", shape=(4, 3)), cond=(4, 3))
res["where_1d_cond"] = args_of(wh, cond=(4,), x=(4, 0), y=(0, 6))

with open(sys.argv[-1], "wb") as fh:
    pickle.dump(res, fh)
"""


def test_upstream_behaviours_match_stock(tmp_path):
    ours = run_script(SCRIPT, "ours", tmp_path)
    stock = run_script(SCRIPT, "stock", tmp_path)
    assert_same_results(ours, stock)
