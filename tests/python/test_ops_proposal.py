"""`_contrib_Proposal` and `_contrib_MultiProposal` (issue 35) on this library against stock
1.9.1 in the same test: proposals and scores for several anchor sets, image sizes smaller
than the feature map, small boxes, IoU-loss deltas, few survivors (rows repeat), the
symbolic form, and bad input."""
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
def inputs(n, anchors, h, w, info):
    cls = rng.uniform(0, 1, (n, 2 * anchors, h, w))
    # Distinct scores (ties sort by position in both, but keep the test about the algorithm).
    cls += np.arange(cls.size).reshape(cls.shape) * 1e-6
    deltas = rng.uniform(-0.3, 0.3, (n, 4 * anchors, h, w))
    return mx.nd.array(cls), mx.nd.array(deltas), mx.nd.array(info)
cases = [
    ("default", dict(), 1, 12, 5, 6, [[80, 96, 1.0]]),
    ("small-image", dict(scales=(2, 4), ratios=(0.5, 1, 2), rpn_pre_nms_top_n=40, rpn_post_nms_top_n=12), 1, 6, 6, 7, [[50, 60, 1.0]]),
    ("min-size", dict(scales=(1, 2), ratios=(1,), rpn_min_size=20, threshold=0.5, feature_stride=8), 1, 2, 5, 5, [[40, 40, 1.5]]),
    ("iou", dict(scales=(8,), ratios=(0.5, 2), iou_loss=True, rpn_post_nms_top_n=10), 1, 2, 4, 4, [[64, 64, 1.0]]),
    ("repeat", dict(scales=(8,), ratios=(1,), rpn_pre_nms_top_n=5, rpn_post_nms_top_n=9, threshold=0.1), 1, 1, 3, 3, [[48, 48, 1.0]]),
]
for name, kw, n, anchors, h, w, info in cases:
    cls, deltas, im_info = inputs(n, anchors, h, w, info)
    out, score = mx.nd.contrib.Proposal(cls, deltas, im_info, output_score=True, **kw)
    res["proposal", name] = (out.asnumpy(), score.asnumpy())
    res["proposal-plain", name] = mx.nd.contrib.Proposal(cls, deltas, im_info, **kw).asnumpy()
cls, deltas, im_info = inputs(3, 12, 5, 6, [[80, 96, 1.0], [48, 64, 2.0], [80, 40, 0.5]])
out, score = mx.nd.contrib.MultiProposal(cls, deltas, im_info, output_score=True, rpn_post_nms_top_n=20)
res["multi"] = (out.asnumpy(), score.asnumpy())
s = mx.sym.contrib.Proposal(mx.sym.var("c"), mx.sym.var("b"), mx.sym.var("i"), rpn_post_nms_top_n=7, output_score=True)
res["sym"] = (s.list_outputs(), s.infer_shape(c=(1, 24, 5, 5), b=(1, 48, 5, 5), i=(1, 3)))
s = mx.sym.contrib.MultiProposal(mx.sym.var("c"), mx.sym.var("b"), mx.sym.var("i"), rpn_post_nms_top_n=7)
res["sym-multi"] = (s.list_outputs(), s.infer_shape(c=(2, 24, 5, 5), b=(2, 48, 5, 5), i=(2, 3)))

errs = {}
def attempt(key, f):
    try:
        f().wait_to_read()
        errs[key] = None
    except mx.base.MXNetError as e:
        errs[key] = "MXNetError: " + str(e).splitlines()[0]
c, b, i = inputs(2, 12, 4, 4, [[64, 64, 1.0]] * 2)
attempt("proposal-batch", lambda: mx.nd.contrib.Proposal(c, b, i))
c, b, i = inputs(1, 12, 4, 4, [[64, 64, 1.0]])
attempt("anchors", lambda: mx.nd.contrib.Proposal(c, b, i, scales=(8,)))
attempt("image-too-big", lambda: mx.nd.contrib.Proposal(c, b, mx.nd.array([[200, 64, 1.0]])))
res["errors"] = errs
with open(sys.argv[-1], "wb") as f:
    pickle.dump(res, f)
"""


def test_against_stock(tmp_path):
    ours = run_script(SCRIPT, "ours", tmp_path)
    stock = run_script(SCRIPT, "stock", tmp_path)
    assert_both_refuse(ours["errors"], stock["errors"])
    assert_close_results(ours, stock, lambda dtype: (1e-5, 1e-4), skip=["errors"])
