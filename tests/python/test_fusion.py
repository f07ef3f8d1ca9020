"""Inference fusion (MXNET_MKLDNN_ENABLED, on by default): a hybridized forward that records
nothing runs each convolution together with the BatchNorm, ReLU, clip and addition that read
only its result, as one operation. The outputs must be those of the unfused graph bit for bit
(each step uses the arithmetic of the operator it replaces); the profiler shows which
operators ran. Each case runs in a child process per setting, since the setting is read from
the environment. The networks' outputs against stock's are in test_gluon_models_vs_stock.py,
which runs with fusion on."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(not os.environ.get("MXNET_LIBRARY_PATH"),
                                reason="fusion is mxnet-rt's; stock's wheel does not fuse without a backend")

CHILD = r"""
import json, sys
import numpy as np
import mxnet as mx
from mxnet import autograd, gluon
from mxnet.gluon import nn
case, mode, dtype = sys.argv[1], sys.argv[2], sys.argv[3]


class Edges(gluon.HybridBlock):
    # Chains that must stop early or not start: a BatchNorm output that is also a head, an
    # addend computed after the convolution, a BatchNorm with use_global_stats, a clip; a
    # BatchNorm heading a chain of its own (b0, on the input).
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.b0 = nn.BatchNorm()
            self.c1, self.b1 = nn.Conv2D(8, 3, padding=1), nn.BatchNorm()
            self.c2, self.b2 = nn.Conv2D(8, 3, padding=1, use_bias=False), nn.BatchNorm(use_global_stats=True)
            self.c3, self.c4, self.c5 = nn.Conv2D(8, 1), nn.Conv2D(8, 3, padding=1, strides=1), nn.Conv2D(8, 1)

    def hybrid_forward(self, F, x):
        a = self.b1(self.c1(F.Activation(self.b0(x), act_type="relu")))
        r = F.Activation(a, act_type="relu")
        s = F.clip(self.b2(self.c2(r)), 0.0, 0.3)
        u = self.c3(s)
        v = F.Activation(u + self.c4(r), act_type="relu")
        w = self.c5(v) + v
        return a, s, w


if case == "edges":
    net = Edges()
    shape = (2, 3, 12, 10)
else:
    net = gluon.model_zoo.vision.get_model(case, classes=10)
    # DenseNet's last pooling needs 224x224 inputs.
    shape = (1, 3, 224, 224) if case.startswith("densenet") else (2, 3, 32, 32)
net.initialize()
net.cast(dtype)
net.infer_shape(mx.nd.zeros(shape, dtype=dtype))
rng = np.random.RandomState(0)
for k, p in sorted(net.collect_params().items()):
    v = rng.uniform(0.5, 1.5, p.shape) if k.endswith(("running_var", "gamma")) else rng.uniform(-0.3, 0.3, p.shape)
    p.set_data(mx.nd.array(v, dtype=dtype))
net.hybridize(static_alloc=True, static_shape=True)
x = mx.nd.array(np.random.RandomState(1).uniform(-1, 1, shape), dtype=dtype)


def run():
    if mode == "train":
        with autograd.train_mode():
            return net(x)
    return net(x)


run()
mx.profiler.set_config(profile_all=True, aggregate_stats=True, filename="fusion_profile.json")
mx.profiler.set_state("run")
outs = run()
outs = [o.asnumpy() for o in (outs if isinstance(outs, (list, tuple)) else [outs])]
mx.profiler.set_state("stop")
counts = {}
for line in mx.profiler.dumps(reset=True).splitlines():
    f = line.split()
    if len(f) >= 2 and f[0] in ("Convolution", "BatchNorm", "Activation", "elemwise_add", "clip"):
        counts[f[0]] = int(f[1])
print(json.dumps({"outs": [o.astype(np.float64).tolist() for o in outs], "counts": counts}))
"""


def child(case, enabled, mode="infer", dtype="float32", tmp_path=None):
    # Algorithms by the heuristic, not timing: a timed choice (direct or im2col for a
    # depthwise layer) may differ between processes, and with it the rounding.
    env = dict(os.environ, MXNET_MKLDNN_ENABLED="1" if enabled else "0", MXNET_CUDNN_AUTOTUNE_DEFAULT="0")
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", CHILD, case, mode, dtype], env=env,
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    return [np.array(o) for o in got["outs"]], got["counts"]


@pytest.mark.parametrize("case", ["resnet18_v1", "resnet18_v2", "mobilenetv2_0.25", "densenet121"])
def test_fused_networks_equal_the_unfused_graph(case, tmp_path):
    fused, fc = child(case, True, tmp_path=tmp_path)
    plain, pc = child(case, False, tmp_path=tmp_path)
    for a, b in zip(fused, plain):
        np.testing.assert_array_equal(a, b)
    # The same convolutions ran; what followed them was computed with them.
    assert fc["Convolution"] == pc["Convolution"] > 0
    assert pc["BatchNorm"] > 0 and fc.get("BatchNorm", 0) < pc["BatchNorm"], (fc, pc)
    if case == "resnet18_v1":
        # Every BatchNorm, addition and ReLU of ResNet-v1 follows a convolution.
        assert fc.get("BatchNorm", 0) == fc.get("elemwise_add", 0) == fc.get("Activation", 0) == 0, fc
    if case == "densenet121":
        # Every ReLU follows a convolution's BatchNorm or heads' one: a chain headed by a
        # BatchNorm shows as one BatchNorm.
        assert fc.get("Activation", 0) == 0 < pc["Activation"] and 0 < fc["BatchNorm"] < pc["BatchNorm"], (fc, pc)
        assert np.isfinite(fused[0]).all() and np.abs(fused[0]).max() > 0
    if case.startswith("mobilenet"):
        assert pc["clip"] > 0 and fc.get("clip", 0) == 0, (fc, pc)


@pytest.mark.parametrize("mode,dtype", [("infer", "float32"), ("train", "float32"), ("infer", "float64")])
def test_chains_stop_where_they_must(mode, dtype, tmp_path):
    fused, fc = child("edges", True, mode, dtype, tmp_path)
    plain, pc = child("edges", False, mode, dtype, tmp_path)
    assert len(fused) == 3
    for a, b in zip(fused, plain):
        np.testing.assert_array_equal(a, b)
    if dtype == "float64":
        assert fc == pc, (fc, pc)  # float32 only
    elif mode == "train":
        # b0 and b1 normalize with batch statistics in training mode: their chains do not
        # apply (their ReLUs run alone); b2 (use_global_stats) and its clip still fuse, and
        # so does c4's sum and ReLU.
        assert fc["BatchNorm"] == 2 and fc["Activation"] == 2 and fc.get("clip", 0) == 0, fc
    else:
        # b1's output is a head: its chain ends with it, and the ReLU reading it runs on its
        # own; b0 and its ReLU are one operation. b2 and the clip fuse; so do the two sums whose other addend was computed
        # before their convolution (c3's sum is c4's chain).
        assert fc["BatchNorm"] == 1 and fc.get("clip", 0) == 0 and fc["Activation"] == 1, fc
        assert pc["BatchNorm"] == 3 and pc["Activation"] == 3, pc
        assert fc.get("elemwise_add", 0) == 0 and pc["elemwise_add"] == 2, (fc, pc)
