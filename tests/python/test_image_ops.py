"""Image operators of `gluon.data.vision.transforms` and `reset_arrays` (`zero_grad`), through
the stock 1.9.1 frontend, on this library against stock's (issues 35 and 36).

One script runs on each library and records what it sees; both must see the same, bit for
bit: `ToTensor` (HWC and NHWC, uint8 and float64 images), `Normalize` (per-channel and scalar
mean/std, float32 and float64, its gradient), the fixed flips, the random flips (each call
either keeps or mirrors the image), a composed transform, the errors for bad shapes, and
`reset_arrays` both directly and as `collect_params().zero_grad()` after accumulated gradients.
"""
import os

import numpy as np
import pytest

from differential import assert_same_results, run_script

pytestmark = pytest.mark.skipif("MXNET_LIBRARY_PATH" not in os.environ,
                                reason="MXNET_LIBRARY_PATH is not set: this would compare stock with itself")

SCRIPT = r"""
import mxnet as mx, numpy as np, pickle, sys
from mxnet.gluon.data.vision import transforms as T
rs = np.random.RandomState(0)
out = {}
img = mx.nd.array(rs.randint(0, 256, (5, 7, 3)), dtype='uint8')
out['to_tensor'] = T.ToTensor()(img).asnumpy()
out['to_tensor batch'] = T.ToTensor()(mx.nd.array(rs.randint(0, 256, (2, 5, 7, 3)), dtype='uint8')).asnumpy()
out['to_tensor f64'] = mx.nd.image.to_tensor(img.astype('float64')).asnumpy()
t = T.ToTensor()(img)
out['normalize'] = T.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))(t).asnumpy()
out['normalize scalar'] = mx.nd.image.normalize(t.expand_dims(0), mean=0.5, std=0.25).asnumpy()
out['normalize f64'] = mx.nd.image.normalize(t.astype('float64'), mean=(0.1, 0.2, 0.3), std=(0.3, 0.2, 0.1)).asnumpy()
x = t.copy(); x.attach_grad()
with mx.autograd.record():
    y = mx.nd.image.normalize(x, mean=(0.1, 0.2, 0.3), std=(0.3, 0.2, 0.1))
y.backward(mx.nd.ones_like(y) * 2)
out['normalize grad'] = x.grad.asnumpy()
even = mx.nd.array(rs.randint(0, 256, (4, 6, 3)), dtype='uint8')
out['flip lr'] = mx.nd.image.flip_left_right(even).asnumpy()
out['flip tb'] = mx.nd.image.flip_top_bottom(even).asnumpy()
r = [mx.nd.image.random_flip_left_right(even).asnumpy() for _ in range(40)]
out['random lr kinds'] = sorted({'same' if (a == even.asnumpy()).all() else ('flipped' if (a == out['flip lr']).all() else 'other') for a in r})
tf = T.Compose([T.RandomFlipLeftRight(), T.ToTensor(), T.Normalize(0.5, 0.5)])
out['compose shape'] = tf(img).shape
errs = []
for f in [lambda: mx.nd.image.normalize(mx.nd.ones((2, 4, 4)), mean=(1, 2, 3)),
          lambda: mx.nd.image.to_tensor(mx.nd.ones((4, 4))),
          lambda: mx.nd.image.flip_left_right(mx.nd.ones((4, 4, 2)))]:
    try:
        f().wait_to_read(); errs.append('ok')
    except mx.MXNetError as e:
        errs.append('MXNetError')
out['errors'] = errs
a = mx.nd.ones((2, 3)); b = mx.nd.ones((4,), dtype='float64')
mx.nd.reset_arrays(a, b, num_arrays=2)
out['reset'] = (a.asnumpy(), b.asnumpy())
net = mx.gluon.nn.Dense(3, in_units=4); net.initialize(mx.init.One())
for p in net.collect_params().values(): p.grad_req = 'add'
for _ in range(2):
    with mx.autograd.record():
        l = net(mx.nd.ones((2, 4))).sum()
    l.backward()
out['accumulated'] = net.weight.grad().asnumpy()
net.collect_params().zero_grad()
out['zeroed'] = (net.weight.grad().asnumpy(), net.bias.grad().asnumpy())
pickle.dump(out, open(sys.argv[1], 'wb'))
"""


def test_image_ops_and_reset_arrays_match_stock(tmp_path):
    ours, stock = run_script(SCRIPT, "ours", tmp_path), run_script(SCRIPT, "stock", tmp_path)
    assert_same_results(ours, stock)
    # What both must show, spelled out.
    assert ours["to_tensor"].shape == (3, 5, 7) and ours["to_tensor"].dtype == np.float32
    assert 0 <= ours["to_tensor"].min() and ours["to_tensor"].max() <= 1
    assert ours["random lr kinds"] == ["flipped", "same"]
    assert ours["errors"] == ["MXNetError"] * 3
    np.testing.assert_array_equal(ours["accumulated"], np.full((3, 4), 4, "float32"))
    assert not ours["zeroed"][0].any() and not ours["zeroed"][1].any()
    assert not ours["reset"][0].any() and not ours["reset"][1].any()
