"""`_contrib_PSROIPooling` (R-FCN's position-sensitive ROI pooling) with its gradient
(issue 35) on this library against stock 1.9.1 in the same test: group sizes, scales, rois
partly outside the map, float32 and float64, and bad input."""
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
rois = [[0, 2.3, 3.1, 40.2, 30.7], [1, 10, 12, 60, 50], [0, -8, -4, 20, 90], [1, 55, 40, 56, 41]]
for od, ps, g, scale, dtype in ((2, 3, 0, 0.125, "float32"), (3, 2, 4, 0.25, "float32"), (1, 4, 2, 0.0625, "float64")):
    group = g or ps
    x = mx.nd.array(rng.uniform(-1, 1, (2, od * group * group, 9, 8)), dtype=dtype)
    r = mx.nd.array(rois, dtype=dtype)
    x.attach_grad()
    with mx.autograd.record():
        y = mx.nd.contrib.PSROIPooling(x, r, spatial_scale=scale, output_dim=od, pooled_size=ps, group_size=g)
    y.backward(mx.nd.array(rng.uniform(-1, 1, y.shape), dtype=dtype))
    res["psroi", od, ps, g, dtype] = (y.asnumpy(), x.grad.asnumpy())
s = mx.sym.contrib.PSROIPooling(mx.sym.var("d"), mx.sym.var("r"), spatial_scale=0.5, output_dim=2, pooled_size=3)
res["sym"] = s.infer_shape(d=(1, 18, 6, 6), r=(5, 5))
errs = {}
def attempt(key, f):
    try:
        f().wait_to_read()
        errs[key] = None
    except mx.base.MXNetError as e:
        errs[key] = "MXNetError: " + str(e).splitlines()[0]
attempt("rois-shape", lambda: mx.nd.contrib.PSROIPooling(mx.nd.ones((1, 8, 4, 4)), mx.nd.ones((2, 4)), spatial_scale=0.5,
                                                         output_dim=2, pooled_size=2))
attempt("scale", lambda: mx.nd.contrib.PSROIPooling(mx.nd.ones((1, 8, 4, 4)), mx.nd.ones((2, 5)), spatial_scale=2.0,
                                                    output_dim=2, pooled_size=2))
res["errors"] = errs
with open(sys.argv[-1], "wb") as f:
    pickle.dump(res, f)
"""


def test_against_stock(tmp_path):
    ours = run_script(SCRIPT, "ours", tmp_path)
    stock = run_script(SCRIPT, "stock", tmp_path)
    assert_both_refuse(ours["errors"], stock["errors"])
    assert_close_results(ours, stock, lambda dtype: (1e-5, 1e-6) if dtype == np.float32 else (1e-12, 1e-13),
                         skip=["errors"])


def test_psroi_pooling_checks_channels_and_batch():
    import mxnet as mx
    with pytest.raises(mx.base.MXNetError, match="channels"):
        mx.nd.contrib.PSROIPooling(mx.nd.ones((1, 7, 4, 4)), mx.nd.array([[0, 0, 0, 3, 3]]), spatial_scale=1.0,
                                   output_dim=2, pooled_size=2).wait_to_read()
    with pytest.raises(mx.base.MXNetError, match="batch"):
        mx.nd.contrib.PSROIPooling(mx.nd.ones((1, 8, 4, 4)), mx.nd.array([[3, 0, 0, 3, 3]]), spatial_scale=1.0,
                                   output_dim=2, pooled_size=2).wait_to_read()
