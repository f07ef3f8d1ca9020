"""A resnet18_v1 training run on this library against stock 1.9.1's, from the same parameters
and data (issue 39's question: does our float32 loss trajectory drift from stock's because of
a bug, or because of float rounding?).

The answer these tests pin down: rounding. In float64 both libraries compute the same
function, and the trajectories agree to about 1e-11 over several SGD-with-momentum steps
(BatchNorm training statistics and running averages, convolution, pooling and dense gradients,
the graph's in-place plan and the optimizer all included). In float32 the runs part where a
ReLU input sits within float32 rounding of zero (one was 4.3e-7 in float64 at the parameters
after step 1; with another kernel split of ours one flips in the first step): which side of
the kink it lands on moves that channel's gradient by about 1/batch, and the layers below it.
Stock's own two float32 paths (oneDNN, and `MXNET_MKLDNN_ENABLED=0`) part at that step by as
much or more. An exact float32 match would need stock's summation order in every kernel.

Each library runs in its own process: ours through MXNET_LIBRARY_PATH, stock without it.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from differential import run_stock_process

pytestmark = pytest.mark.skipif("MXNET_LIBRARY_PATH" not in os.environ,
                                reason="MXNET_LIBRARY_PATH is not set: this would compare stock with itself")

CHILD = r'''
import sys, json, numpy as np
import mxnet as mx
from mxnet import gluon, autograd
dtype, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
mx.random.seed(0)
net = gluon.model_zoo.vision.get_model('resnet18_v1', classes=10)
net.initialize(mx.init.Xavier())
net(mx.nd.zeros((1, 3, 32, 32)))
if dtype == 'float64':
    net.cast('float64')
rs = np.random.RandomState(42)
params = net.collect_params()
names = sorted(params.keys())
for n in names:
    p = params[n]
    v = rs.uniform(0.5, 1.5, p.shape) if n.endswith(('gamma', 'running_var')) else rs.uniform(-0.05, 0.05, p.shape)
    p.set_data(mx.nd.array(v, dtype=dtype))
net.hybridize()
x = mx.nd.array(rs.uniform(-1, 1, (32, 3, 32, 32)), dtype=dtype)
y = mx.nd.array(rs.randint(0, 10, (32,)), dtype=dtype)
lossf = gluon.loss.SoftmaxCrossEntropyLoss()
tr = gluon.Trainer(params, 'sgd', {'learning_rate': 0.1, 'momentum': 0.9})
SAMPLE = 4096
def snap(arrs):
    return {n: (a.ravel() if a.size <= SAMPLE else a.ravel()[::(a.size + SAMPLE - 1) // SAMPLE]) for n, a in arrs.items()}
losses = []
for s in range(steps):
    with autograd.record():
        l = lossf(net(x), y)
    l.backward()
    if s == 0:
        np.savez(out + '_grad.npz', **snap({n: params[n].grad().asnumpy() for n in names if params[n].grad_req != 'null'}))
    tr.step(32)
    losses.append(float(l.mean().asscalar()))
    np.savez(out + '_p%d.npz' % s, **snap({n: params[n].data().asnumpy() for n in names}))
json.dump(losses, open(out + '.json', 'w'))
'''


def run(ours: bool, dtype: str, steps: int, tmp: str):
    env = dict(os.environ)
    lib = env.pop("MXNET_LIBRARY_PATH", None)
    if ours:
        assert lib, "MXNET_LIBRARY_PATH must name our library"
        env["MXNET_LIBRARY_PATH"] = lib
    out = os.path.join(tmp, ("ours" if ours else "stock") + dtype)
    args = [sys.executable, "-W", "ignore", "-c", CHILD, dtype, str(steps), out]
    if ours:
        r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    else:
        r = run_stock_process(args, timeout=600, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def max_rel(a_file, b_file):
    """Largest over tensors of max|a - b| / max|b|."""
    a, b = np.load(a_file), np.load(b_file)
    assert sorted(a.files) == sorted(b.files)
    worst = 0.0
    for n in a.files:
        x, y = a[n].astype(np.float64), b[n].astype(np.float64)
        worst = max(worst, float(np.abs(x - y).max() / (np.abs(y).max() + 1e-300)))
    return worst


@pytest.fixture(scope="module")
def tmp():
    with tempfile.TemporaryDirectory() as d:
        yield d


def test_float64_training_follows_stock(tmp):
    # Same function: five steps at learning rate 0.1 agree to 1e-9 (measured: 1e-14 after the
    # first step, growing 3-5x per step to about 2e-12 by the fifth), parameters, losses and
    # first-step gradients alike. Stock's optimizer and BatchNorm momentum are float32 scalars,
    # so lr 0.1 is 0.10000000149 on both sides.
    steps = 5
    o, s = run(True, "float64", steps, tmp), run(False, "float64", steps, tmp)
    assert max_rel(o + "_grad.npz", s + "_grad.npz") < 1e-11
    lo, ls = json.load(open(o + ".json")), json.load(open(s + ".json"))
    for k in range(steps):
        assert abs(lo[k] - ls[k]) <= 1e-9 * abs(ls[k]), (k, lo, ls)
        assert max_rel(o + "_p%d.npz" % k, s + "_p%d.npz" % k) < 1e-9, k


def close_fraction(a_file, b_file, rtol):
    """The fraction of all elements within rtol of their tensor's largest value."""
    a, b = np.load(a_file), np.load(b_file)
    close = total = 0
    for n in a.files:
        x, y = a[n].astype(np.float64), b[n].astype(np.float64)
        close += int((np.abs(x - y) <= rtol * np.abs(y).max()).sum())
        total += y.size
    return close / total


def test_float32_first_step_follows_stock(tmp):
    # One float32 step. The loss (the forward) agrees to float32 rounding. The gradients agree
    # as far as rounding and ReLU kinks allow: a ReLU input within rounding of zero lands on
    # either side in either library, and the one sample it flips moves the gradient of that
    # channel and of every layer below it. Measured with two kernel splits of ours: every
    # entry within 1e-5 of its tensor's largest value; or 96% within 1e-3, all but 0.001%
    # within 1e-2, and tensor norms within 7e-4 (stock's own oneDNN and native paths differ by
    # 6e-2 at this step). A wrong kernel moves them far more, and the float64 test above shows
    # the functions are the same.
    o, s = run(True, "float32", 1, tmp), run(False, "float32", 1, tmp)
    lo, ls = json.load(open(o + ".json")), json.load(open(s + ".json"))
    assert abs(lo[0] - ls[0]) <= 1e-5 * abs(ls[0])
    assert close_fraction(o + "_grad.npz", s + "_grad.npz", 1e-2) > 0.999
    a, b = np.load(o + "_grad.npz"), np.load(s + "_grad.npz")
    for n in a.files:
        na, nb = np.linalg.norm(a[n].astype(np.float64)), np.linalg.norm(b[n].astype(np.float64))
        assert abs(na - nb) <= 1e-2 * nb, n
