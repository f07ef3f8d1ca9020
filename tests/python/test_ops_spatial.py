"""`GridGenerator` (affine and warp), `BilinearSampler` and `SpatialTransformer` with their
gradients (issue 35) on this library against stock 1.9.1 in the same test: points inside,
on the border and outside the data, float32 and float64, a Gluon spatial-transformer block
hybridized, symbolic inference, and bad input."""
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
def grads(key, f, *arrays):
    for a in arrays:
        a.attach_grad()
    with mx.autograd.record():
        y = f(*arrays)
    y.backward(mx.nd.array(rng.uniform(-1, 1, y.shape), dtype=y.dtype))
    res[key] = [y.asnumpy()] + [a.grad.asnumpy() for a in arrays]
# Stock's GridGenerator takes float32 only ("Other DTypes are not supported!").
aff = mx.nd.array([[1.0, 0.1, 0.05, -0.2, 0.9, 0.1], [0.7, -0.3, 0.2, 0.25, 1.2, -0.3]])
grads("grid-affine", lambda a: mx.nd.GridGenerator(a, transform_type="affine", target_shape=(4, 5)), aff)
flow = mx.nd.array(rng.uniform(-2, 2, (2, 2, 3, 4)))
grads("grid-warp", lambda f: mx.nd.GridGenerator(f, transform_type="warp"), flow)
for dtype in ("float32", "float64"):
    data = mx.nd.array(rng.uniform(-1, 1, (2, 3, 5, 6)), dtype=dtype)
    # Grid points inside, near the border and outside [-1, 1].
    grid = mx.nd.array(rng.uniform(-1.3, 1.3, (2, 2, 4, 7)), dtype=dtype)
    grads(("sampler", dtype), lambda d, g: mx.nd.BilinearSampler(d, g), data, grid)
    loc = mx.nd.array([[0.9, 0.2, 0.1, -0.1, 0.8, -0.05], [1.1, 0.0, -0.2, 0.1, 0.7, 0.3]], dtype=dtype)
    grads(("st", dtype), lambda d, l: mx.nd.SpatialTransformer(d, l, target_shape=(4, 3), transform_type="affine",
                                                              sampler_type="bilinear"), data, loc)
ident = mx.nd.array([[1, 0, 0, 0, 1, 0]])
img = mx.nd.array(rng.uniform(0, 1, (1, 2, 4, 4)))
res["identity"] = mx.nd.BilinearSampler(img, mx.nd.GridGenerator(ident, transform_type="affine", target_shape=(4, 4))).asnumpy()

class STN(mx.gluon.HybridBlock):
    def __init__(self, **kw):
        super(STN, self).__init__(**kw)
        with self.name_scope():
            self.loc = mx.gluon.nn.Dense(6, in_units=2 * 6 * 6)
            self.conv = mx.gluon.nn.Conv2D(3, 3, in_channels=2)
    def hybrid_forward(self, F, x):
        theta = self.loc(x)
        grid = F.GridGenerator(theta, transform_type="affine", target_shape=(5, 5))
        return self.conv(F.BilinearSampler(x, grid))
net = STN()
net.initialize(mx.init.Normal(0.1))
for name, p in sorted(net.collect_params().items()):
    p.set_data(mx.nd.array(rng.uniform(-0.1, 0.1, p.shape)))
net.loc.bias.set_data(mx.nd.array([1, 0, 0, 0, 1, 0]))
net.hybridize()
x = mx.nd.array(rng.uniform(-1, 1, (2, 2, 6, 6)))
with mx.autograd.record():
    out = net(x)
out.backward()
res["stn"] = [out.asnumpy()] + [p.grad().asnumpy() for _, p in sorted(net.collect_params().items())]
s = mx.sym.BilinearSampler(mx.sym.var("d"), mx.sym.GridGenerator(mx.sym.var("t"), transform_type="affine", target_shape=(3, 4)))
res["sym"] = (s.list_arguments(), s.list_outputs(), s.infer_shape(d=(2, 3, 8, 8), t=(2, 6)))
s = mx.sym.SpatialTransformer(mx.sym.var("d"), mx.sym.var("l"), target_shape=(3, 4), transform_type="affine", sampler_type="bilinear")
res["sym-st"] = (s.list_outputs(), s.infer_shape(d=(2, 3, 8, 8), l=(2, 6)))

errs = {}
def attempt(key, f):
    try:
        f().wait_to_read()
        errs[key] = None
    except mx.base.MXNetError as e:
        errs[key] = "MXNetError: " + str(e).splitlines()[0]
attempt("affine-shape", lambda: mx.nd.GridGenerator(mx.nd.ones((2, 5)), transform_type="affine", target_shape=(3, 3)))
attempt("warp-shape", lambda: mx.nd.GridGenerator(mx.nd.ones((2, 3, 4, 4)), transform_type="warp"))
attempt("type", lambda: mx.nd.GridGenerator(mx.nd.ones((2, 6)), transform_type="perspective"))
attempt("grid-channels", lambda: mx.nd.BilinearSampler(mx.nd.ones((1, 2, 4, 4)), mx.nd.ones((1, 3, 4, 4))))
attempt("st-loc", lambda: mx.nd.SpatialTransformer(mx.nd.ones((1, 2, 4, 4)), mx.nd.ones((1, 4)), target_shape=(2, 2),
                                                   transform_type="affine", sampler_type="bilinear"))
res["errors"] = errs
with open(sys.argv[-1], "wb") as f:
    pickle.dump(res, f)
"""


def _tol(dtype):
    return (2e-5, 2e-6) if dtype == np.float32 else (1e-11, 1e-12)


def test_against_stock(tmp_path):
    ours = run_script(SCRIPT, "ours", tmp_path)
    stock = run_script(SCRIPT, "stock", tmp_path)
    assert_both_refuse(ours["errors"], stock["errors"])
    assert_close_results(ours, stock, _tol, skip=["errors"])


def test_identity_transform_reproduces_the_image():
    import mxnet as mx
    img = mx.nd.array(np.arange(32.0).reshape(1, 2, 4, 4))
    grid = mx.nd.GridGenerator(mx.nd.array([[1, 0, 0, 0, 1, 0]]), transform_type="affine", target_shape=(4, 4))
    np.testing.assert_allclose(mx.nd.BilinearSampler(img, grid).asnumpy(), img.asnumpy(), rtol=1e-5, atol=1e-5)
    # float64 (stock's GridGenerator takes float32 only).
    grid64 = mx.nd.GridGenerator(mx.nd.array([[1, 0, 0, 0, 1, 0]], dtype="float64"), transform_type="affine",
                                 target_shape=(4, 4))
    assert grid64.dtype == np.float64
    np.testing.assert_allclose(grid64.asnumpy(), grid.asnumpy(), rtol=1e-6)
