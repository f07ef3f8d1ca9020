"""`_contrib_boolean_mask` (`mx.nd.contrib.boolean_mask`, issue 35) on this library against
stock 1.9.1 in the same test: masks of every dtype (C's truth: -0.0 false, NaN true), none
selected, integer data, the gradient through autograd (of an integer sum too), a hybridized block (its gradient
too), and bad input (stock's errors; both refuse it in a symbol executor)."""
import os

import numpy as np
import pytest

from differential import run_script

pytestmark = pytest.mark.skipif("MXNET_LIBRARY_PATH" not in os.environ,
                                reason="MXNET_LIBRARY_PATH is not set: no library of ours to compare")

SCRIPT = r"""
import pickle, sys
import numpy as np, mxnet as mx
out = {}
data = mx.nd.array(np.arange(24).reshape(4, 3, 2))
for name, idx in [("f32", mx.nd.array([0, 1, 0, 1])), ("int", mx.nd.array([3, 0, 0, -1], dtype='int32')),
                  ("none", mx.nd.array([0, 0, 0, 0])), ("bool", mx.nd.array([1, 1, 0, 1], dtype='bool')),
                  ("u8", mx.nd.array([0, 0, 2, 0], dtype='uint8')), ("neg zero", mx.nd.array([-0.0, 0.5, np.nan, 0])),
                  ("f16", mx.nd.array([-0.0, np.nan, 0, 6e-8], dtype='float16')),
                  ("f64", mx.nd.array([0, 1e-300, -0.0, 2], dtype='float64')),
                  ("i64", mx.nd.array([0, 0, 1, 0], dtype='int64')), ("i8", mx.nd.array([-1, 0, 0, 1], dtype='int8'))]:
    out[name] = mx.nd.contrib.boolean_mask(data, idx).asnumpy()
x = mx.nd.array(np.random.RandomState(0).rand(5, 4)); x.attach_grad()
idx = mx.nd.array([1, 0, 1, 1, 0])
with mx.autograd.record():
    y = mx.nd.contrib.boolean_mask(x, idx)
    z = (y * y).sum()
z.backward()
out['y'] = y.asnumpy(); out['grad'] = x.grad.asnumpy()
a = mx.nd.array(np.arange(12).reshape(4, 3), dtype='int32')
a.attach_grad()
with mx.autograd.record():
    s = mx.nd.contrib.boolean_mask(a, mx.nd.array([1, 0, 1, 1])).sum()
s.backward()
out['int sum grad'] = (s.asnumpy(), a.grad.asnumpy())
with mx.autograd.record():
    m = mx.nd.contrib.boolean_mask(a, mx.nd.array([1, 0, 1, 1])).mean(axis=0)
m.backward()
out['int mean grad'] = (m.asnumpy(), a.grad.asnumpy())
# grad_req 'add': two backward passes accumulate.
x = mx.nd.array(np.arange(8).reshape(4, 2))
x.attach_grad(grad_req='add')
for mask in ([1, 0, 1, 0], [1, 1, 0, 0]):
    with mx.autograd.record():
        y = mx.nd.contrib.boolean_mask(x, mx.nd.array(mask)) * 3
    y.backward()
out['grad add'] = x.grad.asnumpy()
out['int data'] = mx.nd.contrib.boolean_mask(mx.nd.array([[1, 2], [3, 4]], dtype='int64'), mx.nd.array([1, 0])).asnumpy()
for name, f in [("bad len", lambda: mx.nd.contrib.boolean_mask(data, mx.nd.array([1, 0]))),
                ("bad axis", lambda: mx.nd.contrib.boolean_mask(data, mx.nd.array([1, 0, 1, 0]), axis=1)),
                ("2d index", lambda: mx.nd.contrib.boolean_mask(data, mx.nd.ones((4, 1))))]:
    try:
        f().asnumpy(); out[name] = 'ok'
    except Exception as e:
        out[name] = type(e).__name__
# In a hybridized block, with its gradient; a symbol executor refuses it in both.
class Masked(mx.gluon.HybridBlock):
    def hybrid_forward(self, F, x, m):
        return F.contrib.boolean_mask(x, m) * 2
net = Masked()
net.hybridize()
x = mx.nd.array([[1, 2], [3, 4], [5, 6]])
x.attach_grad()
with mx.autograd.record():
    y = net(x, mx.nd.array([1, 0, 1]))
y.backward()
out['hybridized'] = (y.asnumpy(), x.grad.asnumpy(), net(x, mx.nd.array([0, 0, 1])).asnumpy())
try:
    s = mx.sym.contrib.boolean_mask(mx.sym.var('d'), mx.sym.var('m'))
    s.simple_bind(mx.cpu(), d=(3, 2), m=(3,))
    out['simple_bind'] = 'ok'
except Exception as e:
    out['simple_bind'] = type(e).__name__
with open(sys.argv[-1], "wb") as fh:
    pickle.dump(out, fh)
"""


def test_boolean_mask_matches_stock(tmp_path):
    ours, stock = run_script(SCRIPT, "ours", tmp_path), run_script(SCRIPT, "stock", tmp_path)
    assert ours.keys() == stock.keys()
    # grad_req 'add' over two passes with different masks: stock's accumulated gradient loses
    # the first pass's row that the second mask drops ([[6, 6], [3, 3], [0, 0], [0, 0]]); the
    # sum of the two passes' gradients is below.
    stock.pop("grad add")
    for k, b in stock.items():
        a = ours[k]
        if k in ("hybridized", "int sum grad", "int mean grad"):
            for x, y in zip(a, b):
                assert x.dtype == y.dtype, k
                np.testing.assert_array_equal(x, y, err_msg=k)
        elif isinstance(b, np.ndarray):
            assert a.shape == b.shape and a.dtype == b.dtype, (k, a.shape, b.shape)
            np.testing.assert_array_equal(a, b, err_msg=k)
        else:
            assert a == b, (k, a, b)
    # Not vacuous: rows were selected and the gradient reached exactly them.
    assert ours["f32"].shape == (2, 3, 2) and ours["none"].shape == (0, 3, 2)
    assert (ours["grad"][[1, 4]] == 0).all() and (ours["grad"][[0, 2, 3]] != 0).all()
    assert ours["bad len"] == "MXNetError" and ours["simple_bind"] == "RuntimeError"
    assert ours["hybridized"][2].shape == (1, 2) and ours["f16"].shape == (2, 3, 2)
    assert ours["grad add"].tolist() == [[6, 6], [3, 3], [3, 3], [0, 0]]

