"""The Winograd convolution algorithm (float32 3x3 stride-1 layers) against stock 1.9.1.

The algorithm selection normally times it against im2col + GEMM; here an algorithm cache
file (`MXNET_RT_CONV_ALGO_CACHE`) names it for every layer, so that each case runs through
it whatever the timings, and the selection log shows that it did. The same goes for the
data gradient of each case (dY convolved with the flipped, transposed weights), which
training selects the same way. Its rounding differs from
a direct sum (36 multiplications per 4x4 outputs and channel instead of 144, with the
transforms' small multiples), so the outputs agree with stock's to a few 1e-6 of their
scale, not to the bit."""
import os
import subprocess
import sys

import numpy as np
import pytest

from differential import assert_close_results, run_script

pytestmark = pytest.mark.skipif("MXNET_LIBRARY_PATH" not in os.environ,
                                reason="MXNET_LIBRARY_PATH is not set: no library of ours to compare")

# (name, batch, channels, filters, height, width, pad, bias): partial tiles, a batch, the
# unit path (a 56x56 image), the phased path (one small image), no padding, padding 2.
CASES = [
    ("partial", 1, 8, 6, 13, 11, 1, True),
    ("batch", 2, 16, 32, 28, 28, 1, False),
    ("resnet", 1, 64, 64, 56, 56, 1, True),
    ("small", 1, 32, 16, 14, 14, 1, True),
    ("unpadded", 3, 4, 5, 9, 7, 0, True),
    ("pad2", 1, 4, 4, 6, 6, 2, True),
]
# The hybridized block's convolution (fused with its BatchNorm and ReLU in inference).
BLOCK = (1, 8, 16, 20, 20)

SCRIPT = r"""
import pickle, sys
import numpy as np
import mxnet as mx
from mxnet import gluon

cases = %r
block = %r
rs = np.random.RandomState(5)
res = {}
for name, n, c, f, h, w, pad, bias in cases:
    x = mx.nd.array(rs.uniform(-1, 1, (n, c, h, w)), dtype="float32")
    wt = mx.nd.array(rs.uniform(-1, 1, (f, c, 3, 3)) / np.sqrt(9 * c), dtype="float32")
    args = dict(kernel=(3, 3), pad=(pad, pad), num_filter=f)
    if bias:
        b = mx.nd.array(rs.uniform(-1, 1, (f,)), dtype="float32")
        res[name] = mx.nd.Convolution(x, wt, b, **args).asnumpy()
    else:
        res[name] = mx.nd.Convolution(x, wt, no_bias=True, **args).asnumpy()
    # The data gradient, for a random head gradient.
    x.attach_grad()
    with mx.autograd.record():
        y = mx.nd.Convolution(x, wt, no_bias=True, **args)
    y.backward(mx.nd.array(rs.uniform(-1, 1, y.shape), dtype="float32"))
    res[name + "_dx"] = x.grad.asnumpy()
n, c, f, h, w = block
net = gluon.nn.HybridSequential()
net.add(gluon.nn.Conv2D(f, 3, padding=1, in_channels=c), gluon.nn.BatchNorm(in_channels=f),
        gluon.nn.Activation("relu"))
net.initialize(mx.init.Xavier())
for p in net.collect_params().values():
    p.set_data(mx.nd.array(rs.uniform(0.5, 1.5, p.shape) if p.name.endswith(("var", "gamma"))
                           else rs.uniform(-0.5, 0.5, p.shape), dtype="float32"))
net.hybridize(static_alloc=True, static_shape=True)
res["block"] = net(mx.nd.array(rs.uniform(-1, 1, (n, c, h, w)), dtype="float32")).asnumpy()
with open(sys.argv[-1], "wb") as out:
    pickle.dump(res, out)
""" % (CASES, BLOCK)


def key(n, c, f, h, w, pad, bias, unit=""):
    # `unit`: the stride and dilation as given ("" when left out, "1, 1" as Gluon passes them).
    return (f"Convolution;float32;data=[{n}, {c}, {h}, {w}];weight=[{f}, {c}, 3, 3];stride=[{unit}];"
            f"dilate=[{unit}];pad=[{pad}, {pad}];group=1;bias={'true' if bias else 'false'};"
            f"mode=limited_workspace;ws={1024 << 20};det=0")


def grad_key(n, c, f, h, w, pad, _bias):
    return (f"Convolution backward data;float32;data=[{n}, {c}, {h}, {w}];weight=[{f}, {c}, 3, 3];"
            f"pad=[{pad}, {pad}];mode=limited_workspace;ws={1024 << 20};det=0")


def test_winograd_matches_stock(tmp_path):
    keys = [key(*case[1:]) for case in CASES] + [key(*BLOCK, 1, True, "1, 1")]
    keys += [grad_key(*case[1:]) for case in CASES]
    cache = tmp_path / "algos.txt"
    cache.write_text("# mxnet-rt convolution algorithm cache v1\n" + "".join(f"{k}\twinograd\n" for k in keys))
    env = dict(os.environ, MXNET_RT_CONV_ALGO_CACHE=str(cache), MXNET_RT_CONV_ALGO_LOG="1")
    env.pop("MXNET_CUDNN_AUTOTUNE_DEFAULT", None)
    out = tmp_path / "ours.pkl"
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    for k in keys:
        # The selection log names each layer's algorithm and where the choice came from.
        assert f"{k.split(';mode=')[0]}: algorithm winograd (cache file" in r.stderr, (k, r.stderr[-2000:])
    import pickle
    with open(out, "rb") as f:
        ours = pickle.load(f)
    stock = run_script(SCRIPT, "stock", tmp_path)
    for name in ours:
        scale = float(np.abs(stock[name]).max())
        assert scale > 0.1, name
    assert_close_results(ours, stock, lambda dtype: (1e-4, 2e-5 * max(float(np.abs(v).max()) for v in stock.values())))


DEPTH_SCRIPT = r"""
import pickle, sys
import numpy as np
import mxnet as mx
rs = np.random.RandomState(6)
x = mx.nd.array(rs.uniform(-1, 1, (1, 2, 1, 6, 6)), dtype="float32")
w = mx.nd.array(rs.uniform(-1, 1, (3, 2, 1, 3, 3)), dtype="float32")
y = mx.nd.Convolution(x, w, kernel=(1, 3, 3), pad=(1, 1, 1), num_filter=3, no_bias=True)
with open(sys.argv[-1], "wb") as out:
    pickle.dump({"depth_padded": y.asnumpy()}, out)
"""


def test_depth_padded_volume_is_not_winograd(tmp_path):
    # A depth-1 volume padded in depth has three output planes: not a problem Winograd's
    # algorithm computes, so a cache file naming it for the layer must not make it run.
    k = ("Convolution;float32;data=[1, 2, 1, 6, 6];weight=[3, 2, 1, 3, 3];stride=[];dilate=[];"
         f"pad=[1, 1, 1];group=1;bias=false;mode=limited_workspace;ws={1024 << 20};det=0")
    cache = tmp_path / "algos.txt"
    cache.write_text(f"# mxnet-rt convolution algorithm cache v1\n{k}\twinograd\n")
    env = dict(os.environ, MXNET_RT_CONV_ALGO_CACHE=str(cache), MXNET_RT_CONV_ALGO_LOG="1")
    env.pop("MXNET_CUDNN_AUTOTUNE_DEFAULT", None)
    out = tmp_path / "ours.pkl"
    r = subprocess.run([sys.executable, "-c", DEPTH_SCRIPT, str(out)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "algorithm winograd" not in r.stderr, r.stderr[-2000:]
    import pickle
    with open(out, "rb") as f:
        ours = pickle.load(f)
    stock = run_script(DEPTH_SCRIPT, "stock", tmp_path)
    assert ours["depth_padded"].shape == (1, 3, 3, 6, 6)
    assert_close_results(ours, stock, lambda dtype: (1e-5, 1e-5))
