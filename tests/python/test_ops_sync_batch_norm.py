"""`_contrib_SyncBatchNorm` on one device and the legacy `BatchNorm_v1` (issue 35) on this library against stock 1.9.1 in
the same test: training and inference outputs, gradients, the moving statistics (updated in
the backward pass), fix_gamma, output_mean_var, 2-D to 5-D data, Gluon's
`contrib.nn.SyncBatchNorm` block hybridized, and bad input."""
import os

import numpy as np
import pytest

from differential import assert_both_refuse, assert_close_results, run_script

pytestmark = pytest.mark.skipif("MXNET_LIBRARY_PATH" not in os.environ,
                                reason="MXNET_LIBRARY_PATH is not set: no library of ours to compare")

SCRIPT = r"""
import pickle, sys, warnings
import numpy as np
import mxnet as mx
warnings.simplefilter("ignore")
rng = np.random.RandomState(0)
res = {}
for shape in ((4, 3), (2, 3, 5), (2, 4, 3, 3), (2, 2, 2, 3, 2)):
    c = shape[1]
    for fix_gamma, global_stats, train in ((False, False, True), (True, False, True), (False, True, True),
                                           (False, False, False)):
        x = mx.nd.array(rng.uniform(-2, 3, shape))
        gamma = mx.nd.array(rng.uniform(0.5, 1.5, (c,)))
        beta = mx.nd.array(rng.uniform(-1, 1, (c,)))
        mm = mx.nd.array(rng.uniform(-0.5, 0.5, (c,)))
        mv = mx.nd.array(rng.uniform(0.5, 2, (c,)))
        # Stock shares statistics by key across calls: one key per case.
        key = "k%s%d%d%d" % (shape, fix_gamma, global_stats, train)
        kw = dict(key=key, fix_gamma=fix_gamma, use_global_stats=global_stats, momentum=0.8, eps=1e-4)
        if not train:
            # Inference (stock's recorded inference-mode backward returns garbage: not compared).
            y = mx.nd.contrib.SyncBatchNorm(x, gamma, beta, mm, mv, **kw)
            res["sbn", shape, fix_gamma, global_stats, train] = (y.asnumpy(), mm.asnumpy(), mv.asnumpy())
            continue
        for v in (x, gamma, beta):
            v.attach_grad()
        with mx.autograd.record():
            y = mx.nd.contrib.SyncBatchNorm(x, gamma, beta, mm, mv, **kw)
            loss = (y * mx.nd.array(rng.uniform(-1, 1, shape))).sum()
        loss.backward()
        res["sbn", shape, fix_gamma, global_stats, train] = (
            y.asnumpy(), x.grad.asnumpy(), gamma.grad.asnumpy(), beta.grad.asnumpy(), mm.asnumpy(), mv.asnumpy())
# BatchNorm_v1 (stock's legacy kernel: 2-D or 4-D data), through a bound executor.
for shape, fix_gamma, global_stats in (((5, 3), False, False), ((2, 3, 4, 4), True, False), ((2, 3, 4, 4), False, True)):
    s = mx.sym.BatchNorm_v1(mx.sym.var("x"), fix_gamma=fix_gamma, use_global_stats=global_stats, momentum=0.7,
                            eps=1e-4, output_mean_var=True, name="bn")
    args = {"x": mx.nd.array(rng.uniform(-2, 3, shape)), "bn_gamma": mx.nd.array(rng.uniform(0.5, 1.5, (3,))),
            "bn_beta": mx.nd.array(rng.uniform(-1, 1, (3,)))}
    grads = {k: mx.nd.zeros(v.shape) for k, v in args.items()}
    aux = {"bn_moving_mean": mx.nd.array(rng.uniform(-0.5, 0.5, (3,))), "bn_moving_var": mx.nd.array(rng.uniform(0.5, 2, (3,)))}
    ex = s.bind(mx.cpu(), args, args_grad=grads, aux_states=aux)
    outs = [o.asnumpy() for o in ex.forward(is_train=True)]
    ex.backward([mx.nd.array(rng.uniform(-1, 1, shape)), mx.nd.zeros((3,)), mx.nd.zeros((3,))])
    res["v1", shape, fix_gamma, global_stats] = (s.list_arguments(), s.list_auxiliary_states(), outs,
                                                 [grads[k].asnumpy() for k in sorted(grads)], [aux[k].asnumpy() for k in sorted(aux)])
x = mx.nd.array(rng.uniform(-2, 3, (3, 2, 4)))
outs = mx.nd.contrib.SyncBatchNorm(x, mx.nd.ones((2,)), mx.nd.zeros((2,)), mx.nd.zeros((2,)), mx.nd.ones((2,)),
                                   key="omv", output_mean_var=True)
with mx.autograd.train_mode():
    outs_train = mx.nd.contrib.SyncBatchNorm(x, mx.nd.ones((2,)), mx.nd.zeros((2,)), mx.nd.zeros((2,)),
                                             mx.nd.ones((2,)), key="omv-train", output_mean_var=True)
res["output_mean_var-train"] = [o.asnumpy() for o in outs_train]
res["output_mean_var-count"] = len(outs)

net = mx.gluon.nn.HybridSequential()
net.add(mx.gluon.nn.Conv2D(4, 3, in_channels=2), mx.gluon.contrib.nn.SyncBatchNorm(in_channels=4, num_devices=1))
net.initialize(mx.init.Xavier(rnd_type="gaussian"))
params = {k: rng.uniform(-0.5, 0.5, v.shape) for k, v in sorted(net.collect_params().items())}
for k, v in net.collect_params().items():
    if "running_var" in k:
        params[k] = np.abs(params[k]) + 0.5
    v.set_data(mx.nd.array(params[k]))
net.hybridize()
trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
data = mx.nd.array(rng.uniform(-1, 1, (3, 2, 6, 6)))
for step in range(2):
    with mx.autograd.record():
        out = net(data)
        loss = (out * out).mean()
    loss.backward()
    trainer.step(3)
res["gluon-train"] = out.asnumpy()
res["gluon-params"] = {k.split("_", 1)[1]: v.data().asnumpy() for k, v in sorted(net.collect_params().items())}
res["gluon-infer"] = net(data).asnumpy()
s = mx.sym.contrib.SyncBatchNorm(mx.sym.var("x"), key="k", name="sbn")
res["sym"] = (s.list_arguments(), s.list_auxiliary_states(), s.infer_shape(x=(2, 3, 4, 4)))

errs = {}
def attempt(key, f):
    try:
        f().wait_to_read()
        errs[key] = None
    except mx.base.MXNetError as e:
        errs[key] = "MXNetError: " + str(e).splitlines()[0]
attempt("gamma-shape", lambda: mx.nd.contrib.SyncBatchNorm(mx.nd.ones((2, 3, 4)), mx.nd.ones((2,)), mx.nd.ones((3,)),
                                                           mx.nd.ones((3,)), mx.nd.ones((3,)), key="k"))
attempt("no-key", lambda: mx.nd.contrib.SyncBatchNorm(mx.nd.ones((2, 3, 4)), mx.nd.ones((3,)), mx.nd.ones((3,)),
                                                      mx.nd.ones((3,)), mx.nd.ones((3,))))
res["errors"] = errs
with open(sys.argv[-1], "wb") as f:
    pickle.dump(res, f)
"""


def test_against_stock(tmp_path):
    ours = run_script(SCRIPT, "ours", tmp_path)
    stock = run_script(SCRIPT, "stock", tmp_path)
    assert_both_refuse(ours["errors"], stock["errors"])
    assert_close_results(ours, stock, lambda dtype: (2e-4, 2e-5), skip=["errors"])


def test_sync_batch_norm_across_devices_is_not_supported():
    import mxnet as mx
    with pytest.raises(NotImplementedError, match="ndev=2"):
        mx.nd.contrib.SyncBatchNorm(mx.nd.ones((2, 3)), mx.nd.ones((3,)), mx.nd.ones((3,)), mx.nd.ones((3,)),
                                    mx.nd.ones((3,)), key="k", ndev=2).wait_to_read()
