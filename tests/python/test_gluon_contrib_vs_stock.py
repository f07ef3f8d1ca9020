"""Gluon's contrib layers built on operators of issue 35, on this library against stock 1.9.1
in the same test.

`gluon.contrib.cnn.DeformableConvolution` and `ModulatedDeformableConvolution`, two of each
in a hybridized network (deformable groups, padding, stride, an activation), with random
offset-predicting weights (Gluon initialises them to zero, which would make the layers plain
convolutions): outputs of both, and for DeformableConvolution the gradients of the input and
of every parameter (stock's CPU build has no ModulatedDeformableConvolution backward).
"""
import os

import numpy as np
import pytest

from differential import assert_close_results, run_script

pytestmark = pytest.mark.skipif("MXNET_LIBRARY_PATH" not in os.environ,
                                reason="MXNET_LIBRARY_PATH is not set: no library of ours to compare")

SCRIPT = r"""
import pickle, sys
import numpy as np
import mxnet as mx
from mxnet import autograd
from mxnet.gluon import nn
from mxnet.gluon.contrib.cnn import DeformableConvolution, ModulatedDeformableConvolution

res = {}
x0 = np.random.RandomState(3).uniform(-1, 1, (2, 4, 9, 8)).astype("float32")
for name, cls in [("dcn", DeformableConvolution), ("dcn2", ModulatedDeformableConvolution)]:
    net = nn.HybridSequential()
    net.add(cls(6, kernel_size=(3, 3), strides=1, padding=1, num_deformable_group=2, in_channels=4),
            cls(4, kernel_size=(3, 2), strides=2, padding=0, activation="relu", in_channels=6))
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    net.hybridize()
    # The deformable weights' input channels are inferred on the first call.
    net(mx.nd.zeros(x0.shape))
    params = sorted(net.collect_params().items())
    for k, p in params:
        p.set_data(mx.nd.array(np.random.RandomState(len(k)).uniform(-0.3, 0.3, p.shape)))
    x = mx.nd.array(x0)
    x.attach_grad()
    with autograd.record():
        y = net(x)
    res[name, "out"] = y.asnumpy()
    if name == "dcn":
        y.backward(mx.nd.array(np.random.RandomState(4).uniform(-1, 1, y.shape)))
        res[name, "dx"] = x.grad.asnumpy()
        for k, p in params:
            res[name, k.split("_", 1)[1]] = p.grad().asnumpy()

with open(sys.argv[-1], "wb") as f:
    pickle.dump(res, f)
"""


def test_deformable_layers(tmp_path):
    ours, stock = run_script(SCRIPT, "ours", tmp_path), run_script(SCRIPT, "stock", tmp_path)
    assert len(ours) == 2 + 1 + 8, sorted(ours)
    assert_close_results(ours, stock, lambda dtype: (1e-4, 1e-5))
