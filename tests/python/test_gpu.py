"""GPU contexts through the stock 1.9.1 frontend: every operator with a GPU form on gpu(0)
against the same call on cpu(0) (whose results the other suites compare with stock), copies
between devices, a Gluon MLP imperative and hybridized, five model-zoo networks (forward),
and the clear error of an operator without a GPU form. Skips (saying so) on a machine without a CUDA driver or GPU; there it
checks that gpu(0) is refused with a clear error."""
import numpy as np
import pytest

import mxnet as mx

GPUS = mx.context.num_gpus()
needs_gpu = pytest.mark.skipif(GPUS == 0, reason="no CUDA driver or GPU on this machine")
RNG = np.random.default_rng(7)


def rand(*shape, dtype="float32", positive=False):
    x = RNG.random(shape) * 2 + 0.1 if positive else RNG.random(shape) * 4 - 2
    return x.astype(dtype)


def both(fn, *arrays, **kw):
    """fn on cpu copies and on gpu copies of `arrays`; returns (gpu result, cpu result)."""
    c = [mx.nd.array(a, ctx=mx.cpu(), dtype=a.dtype) for a in arrays]
    g = [mx.nd.array(a, ctx=mx.gpu(0), dtype=a.dtype) for a in arrays]
    rg, rc = fn(*g, **kw), fn(*c, **kw)
    assert rg.context == mx.gpu(0), rg.context
    return rg.asnumpy(), rc.asnumpy()


def close(g, c, dtype):
    tol = 2e-5 if dtype == "float32" else 1e-12
    assert g.dtype == c.dtype and g.shape == c.shape
    np.testing.assert_allclose(g, c, rtol=tol, atol=tol)


@pytest.mark.skipif(GPUS > 0, reason="this machine has a GPU")
def test_without_a_gpu_gpu0_is_refused_clearly():
    with pytest.raises(mx.MXNetError, match=r"gpu\(0\) is not available"):
        mx.nd.zeros((2,), ctx=mx.gpu(0)).wait_to_read()
    assert mx.context.num_gpus() == 0


UNARY = ["abs", "sign", "round", "ceil", "floor", "square", "exp", "sin", "tanh", "sigmoid", "relu",
         "negative", "softsign"]
POSITIVE = ["sqrt", "rsqrt", "log", "log1p", "reciprocal", "cbrt"]


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_elementwise_broadcast_and_scalars(dtype):
    for name in UNARY:
        close(*both(getattr(mx.nd, name), rand(3, 50, dtype=dtype)), dtype)
    for name in POSITIVE:
        close(*both(getattr(mx.nd, name), rand(3, 50, dtype=dtype, positive=True)), dtype)
    a, b = rand(4, 1, 5, dtype=dtype), rand(3, 1, dtype=dtype)
    for fn in [lambda x, y: x + y, lambda x, y: x - y, lambda x, y: x * y, lambda x, y: x / y,
               lambda x, y: mx.nd.broadcast_maximum(x, y), lambda x, y: x > y, lambda x, y: x % y]:
        close(*both(fn, a, b), dtype)
        close(*both(fn, a, a), dtype)
    x = rand(7, 9, dtype=dtype)
    for fn in [lambda v: v + 1.5, lambda v: 2 - v, lambda v: v * 3, lambda v: 1 / (v + 10),
               lambda v: v ** 2, lambda v: v % 0.7, lambda v: v >= 0.25]:
        close(*both(fn, x), dtype)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_reductions_softmax_activations(dtype):
    x = rand(4, 5, 6, dtype=dtype)
    for name in ["sum", "mean", "max", "min", "prod", "nansum"]:
        fn = getattr(mx.nd, name)
        close(*both(fn, x), dtype)
        close(*both(fn, x, axis=1), dtype)
        close(*both(fn, x, axis=(0, 2), keepdims=True), dtype)
        close(*both(fn, x, axis=1, exclude=True), dtype)
    for fn in [mx.nd.softmax, mx.nd.log_softmax, mx.nd.softmin]:
        close(*both(fn, x), dtype)
        close(*both(fn, x, axis=1, temperature=2.0), dtype)
        close(*both(fn, x, axis=0), dtype)
    for act in ["relu", "sigmoid", "tanh", "softrelu", "softsign"]:
        close(*both(mx.nd.Activation, x, act_type=act), dtype)
    for act in ["leaky", "elu", "selu", "gelu"]:
        g, c = both(mx.nd.LeakyReLU, x, act_type=act, slope=0.3)
        np.testing.assert_allclose(g, c, rtol=1e-6, atol=1e-6)  # the CPU's erf is an approximation


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_matrix_products(dtype):
    tol = 1e-4 if dtype == "float32" else 1e-12
    cases = [
        (mx.nd.dot, (rand(64, 128, dtype=dtype), rand(128, 32, dtype=dtype)), {}),
        (mx.nd.dot, (rand(128, 64, dtype=dtype), rand(32, 128, dtype=dtype)), {"transpose_a": True, "transpose_b": True}),
        (mx.nd.batch_dot, (rand(6, 16, 24, dtype=dtype), rand(6, 24, 8, dtype=dtype)), {}),
        (mx.nd.FullyConnected, (rand(16, 3, 20, dtype=dtype), rand(10, 60, dtype=dtype), rand(10, dtype=dtype)), {"num_hidden": 10}),
        (mx.nd.FullyConnected, (rand(4, 6, 60, dtype=dtype), rand(10, 60, dtype=dtype)), {"num_hidden": 10, "no_bias": True, "flatten": False}),
    ]
    for fn, arrays, kw in cases:
        g, c = both(fn, *arrays, **kw)
        np.testing.assert_allclose(g, c, rtol=tol, atol=tol)


@needs_gpu
def test_copies_fills_and_conversions():
    x = rand(5, 7)
    g = mx.nd.array(x, ctx=mx.gpu(0))
    np.testing.assert_array_equal(g.asnumpy(), x)
    np.testing.assert_array_equal(g.as_in_context(mx.cpu()).asnumpy(), x)
    np.testing.assert_array_equal(g.copyto(mx.gpu(0)).asnumpy(), x)
    np.testing.assert_array_equal(mx.nd.array(x).copyto(mx.gpu(0)).asnumpy(), x)
    np.testing.assert_array_equal(g.astype("float64").asnumpy(), x.astype("float64"))
    np.testing.assert_array_equal(g.reshape((7, 5)).asnumpy(), x.reshape(7, 5))
    np.testing.assert_array_equal(mx.nd.ones((3, 4), ctx=mx.gpu(0)).asnumpy(), np.ones((3, 4), "float32"))
    np.testing.assert_array_equal(mx.nd.full((2, 2), 2.5, ctx=mx.gpu(0), dtype="float64").asnumpy(), np.full((2, 2), 2.5))
    np.testing.assert_array_equal(mx.nd.zeros((3,), ctx=mx.gpu(0)).asnumpy(), np.zeros(3, "float32"))
    g += 1
    np.testing.assert_allclose(g.asnumpy(), x + 1, rtol=1e-6)
    free, total = mx.context.gpu_memory_info(0)
    assert 0 < free <= total


@needs_gpu
def test_gluon_mlp_on_gpu_equals_cpu():
    def build():
        net = mx.gluon.nn.HybridSequential()
        net.add(mx.gluon.nn.Dense(64, activation="relu"), mx.gluon.nn.Dense(32, activation="tanh"),
                mx.gluon.nn.Dense(10))
        return net

    x = rand(8, 20)
    cpu_net = build()
    cpu_net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    want = cpu_net(mx.nd.array(x)).softmax().asnumpy()
    gpu_net = build()
    gpu_net.initialize(ctx=mx.cpu())
    gpu_net(mx.nd.array(x))
    for (_, p), (_, q) in zip(sorted(gpu_net.collect_params().items()), sorted(cpu_net.collect_params().items())):
        p.set_data(q.data())
    gpu_net.collect_params().reset_ctx(mx.gpu(0))
    for hybrid in [False, True]:
        if hybrid:
            gpu_net.hybridize()
        got = gpu_net(mx.nd.array(x, ctx=mx.gpu(0))).softmax()
        assert got.context == mx.gpu(0)
        np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-5, atol=1e-6)


@needs_gpu
def test_an_operator_without_a_gpu_form_says_so():
    x = mx.nd.ones((1, 1, 4, 4), ctx=mx.gpu(0))
    w = mx.nd.ones((1, 1, 3, 3), ctx=mx.gpu(0))
    with pytest.raises(NotImplementedError, match=r"operator Deconvolution on gpu\(0\) is not supported yet"):
        mx.nd.Deconvolution(x, w, kernel=(3, 3), num_filter=1, no_bias=True).wait_to_read()
    # Forms that exist, with parameters they cannot honour yet, say so too.
    with pytest.raises(NotImplementedError, match=r"Dropout on gpu\(0\) while training"):
        with mx.autograd.train_mode():
            mx.nd.Dropout(x, p=0.5).wait_to_read()
    with pytest.raises(NotImplementedError, match="pool_type lp"):
        mx.nd.Pooling(x, kernel=(2, 2), pool_type="lp", p_value=2).wait_to_read()
    with pytest.raises(NotImplementedError, match="symmetric padding"):
        mx.nd.Pooling(mx.nd.ones((1, 1, 6, 6), ctx=mx.gpu(0)), kernel=(3, 3), stride=(2, 2),
                      pooling_convention="full").wait_to_read()
    with pytest.raises((mx.MXNetError, ValueError), match="one context"):
        (x + mx.nd.ones((1, 1, 4, 4))).wait_to_read()


def grads_both(fn, *arrays):
    """d(sum(fn(*x)))/dx on cpu and on gpu: lists of (gpu grad, cpu grad)."""
    out = []
    for ctx in [mx.gpu(0), mx.cpu()]:
        xs = [mx.nd.array(a, ctx=ctx, dtype=a.dtype) for a in arrays]
        for x in xs:
            x.attach_grad()
        with mx.autograd.record():
            y = fn(*xs)
        y.backward()
        out.append([x.grad.asnumpy() for x in xs])
    return list(zip(*out))


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gradients_on_gpu_equal_cpu(dtype):
    tol = 2e-5 if dtype == "float32" else 1e-12
    x = rand(4, 6, dtype=dtype, positive=True)
    b = rand(1, 6, dtype=dtype)
    cases = [
        (lambda v: mx.nd.exp(v) + mx.nd.log(v) * 2, (x,)),
        (lambda v: mx.nd.square(v) - mx.nd.sqrt(v) / 3 + mx.nd.sigmoid(v) * mx.nd.tanh(v), (x,)),
        (lambda v: mx.nd.Activation(v - 1, act_type="relu") + mx.nd.Activation(v, act_type="softrelu"), (x,)),
        (lambda v, w: mx.nd.broadcast_mul(v, w) + mx.nd.broadcast_add(v, w) - mx.nd.broadcast_sub(w, v), (x, b)),
        (lambda v: mx.nd.sum(v, axis=1) * mx.nd.mean(v, axis=1), (x,)),
        (lambda v: 3 * v + 1 - 2 / v, (x,)),
        (lambda v, w: mx.nd.FullyConnected(v, w, mx.nd.ones((1,), ctx=v.context, dtype=v.dtype), num_hidden=1), (x, b)),
    ]
    for k, (fn, arrays) in enumerate(cases):
        for j, (g, c) in enumerate(grads_both(fn, *arrays)):
            np.testing.assert_allclose(g, c, rtol=tol, atol=tol, err_msg=f"case {k}, input {j}")


@needs_gpu
@pytest.mark.parametrize("hybrid", [False, True])
def test_gluon_mlp_training_on_gpu_equals_cpu(hybrid):
    """Three SGD steps of an MLP with L2 loss: the same losses and weights on gpu(0) as on cpu(0)."""
    x = rand(16, 20)
    y = rand(16, 5)
    results = []
    init = None
    for ctx in [mx.cpu(), mx.gpu(0)]:
        net = mx.gluon.nn.HybridSequential()
        net.add(mx.gluon.nn.Dense(32, activation="relu"), mx.gluon.nn.Dense(5))
        net.initialize(mx.init.Xavier(), ctx=mx.cpu())
        net(mx.nd.array(x))
        params = sorted(net.collect_params().items())
        if init is None:
            init = [p.data().asnumpy() for _, p in params]
        for (_, p), v in zip(params, init):
            p.set_data(mx.nd.array(v))
        net.collect_params().reset_ctx(ctx)
        if hybrid:
            net.hybridize()
        trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "wd": 1e-3})
        loss_fn = mx.gluon.loss.L2Loss()
        losses, first_grads = [], None
        xd, yd = mx.nd.array(x, ctx=ctx), mx.nd.array(y, ctx=ctx)
        for _ in range(3):
            with mx.autograd.record():
                loss = loss_fn(net(xd), yd)
            loss.backward()
            if first_grads is None:
                first_grads = [(n, p.grad().asnumpy()) for n, p in sorted(net.collect_params().items())]
            trainer.step(16)
            losses.append(loss.mean().asscalar())
        results.append((losses, [p.data().asnumpy() for _, p in sorted(net.collect_params().items())], first_grads))
    (cl, cw, cg), (gl, gw, gg) = results
    for (name, g), (_, c) in zip(gg, cg):
        np.testing.assert_allclose(g, c, rtol=1e-4, atol=1e-6, err_msg=f"first gradient of {name}")
    np.testing.assert_allclose(gl, cl, rtol=1e-5)
    assert gl[-1] < gl[0]
    for g, c in zip(gw, cw):
        np.testing.assert_allclose(g, c, rtol=1e-4, atol=1e-5)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_convolution_pooling_batchnorm_concat_on_gpu_equal_cpu(dtype):
    tol = 1e-4 if dtype == "float32" else 1e-10
    nd = mx.nd
    assert mx.runtime.Features().is_enabled("CUDNN")

    def check(fn, *arrays, **kw):
        g, c = both(fn, *arrays, **kw)
        np.testing.assert_allclose(g, c, rtol=tol, atol=tol, err_msg=f"{fn.__name__} {kw}")

    x = rand(2, 4, 9, 8, dtype=dtype)
    w = rand(6, 4, 3, 3, dtype=dtype)
    b = rand(6, dtype=dtype)
    check(nd.Convolution, x, w, b, kernel=(3, 3), num_filter=6)
    check(nd.Convolution, x, w, kernel=(3, 3), num_filter=6, no_bias=True, stride=(2, 1), pad=(1, 2), dilate=(1, 2))
    check(nd.Convolution, x, rand(6, 2, 3, 3, dtype=dtype), kernel=(3, 3), num_filter=6, num_group=2, no_bias=True)
    check(nd.Convolution, x, rand(4, 1, 3, 3, dtype=dtype), kernel=(3, 3), num_filter=4, num_group=4, pad=(1, 1),
          no_bias=True)  # depthwise
    check(nd.Convolution, x, rand(5, 4, 1, 1, dtype=dtype), rand(5, dtype=dtype), kernel=(1, 1), num_filter=5)
    check(nd.Convolution, rand(2, 3, 11, dtype=dtype), rand(4, 3, 3, dtype=dtype), kernel=(3,), num_filter=4,
          no_bias=True, pad=(1,))
    check(nd.Convolution, rand(1, 2, 5, 6, 7, dtype=dtype), rand(3, 2, 2, 3, 3, dtype=dtype), kernel=(2, 3, 3),
          num_filter=3, no_bias=True)
    # The selection modes give the same output (each algorithm is timed once per shape).
    for tune in ["off", "limited_workspace", "fastest"]:
        check(nd.Convolution, x, w, b, kernel=(3, 3), num_filter=6, pad=(1, 1), cudnn_tune=tune)
    for kw in [dict(kernel=(3, 3), stride=(2, 2), pad=(1, 1)), dict(kernel=(2, 2), stride=(2, 2), pool_type="avg"),
               dict(kernel=(3, 3), pad=(1, 1), pool_type="avg"),
               dict(kernel=(3, 3), pad=(1, 1), pool_type="avg", count_include_pad=False),
               dict(kernel=(2, 3), pool_type="sum"), dict(kernel=(1, 1), global_pool=True, pool_type="avg"),
               dict(kernel=(1, 1), global_pool=True, pool_type="max")]:
        check(nd.Pooling, x, **kw)
    check(nd.Pooling, rand(2, 3, 10, dtype=dtype), kernel=(3,), stride=(2,))
    check(nd.Pooling, rand(1, 2, 4, 6, 6, dtype=dtype), kernel=(2, 2, 2), stride=(2, 2, 2), pool_type="avg")
    c = 4
    gamma, beta = rand(c, dtype=dtype), rand(c, dtype=dtype)
    mean, var = rand(c, dtype=dtype), rand(c, dtype=dtype, positive=True)
    for kw in [dict(fix_gamma=False), dict(fix_gamma=True), dict(fix_gamma=False, use_global_stats=True, eps=1e-5)]:
        for out in range(3):
            check(lambda *a, **k: nd.BatchNorm(*a, output_mean_var=True, **k)[out], x, gamma, beta, mean, var, **kw)
    check(nd.BatchNorm, rand(3, 5, 4, dtype=dtype), gamma, beta, mean, var, axis=-1, fix_gamma=False)
    check(nd.BatchNorm, rand(6, 4, dtype=dtype), gamma, beta, mean, var, fix_gamma=False)
    check(lambda *a: nd.concat(*a, dim=1), x, rand(2, 3, 9, 8, dtype=dtype), rand(2, 1, 9, 8, dtype=dtype))
    check(lambda *a: nd.concat(*a, dim=-1), x, rand(2, 4, 9, 2, dtype=dtype))
    check(lambda *a: nd.concat(*a, dim=0), x, x)
    check(nd.clip, x, a_min=-0.5, a_max=1.25)
    check(nd.Dropout, x, p=0.3)


@needs_gpu
def test_batchnorm_training_statistics_on_gpu_equal_cpu():
    """In training BatchNorm normalises by the batch's statistics and outputs them (mean and
    inverse standard deviation), as on the CPU."""
    x, gamma, beta = rand(4, 3, 5, 5), rand(3), rand(3)
    mean, var = np.zeros(3, "float32"), np.ones(3, "float32")
    got = []
    for ctx in [mx.gpu(0), mx.cpu()]:
        arrs = [mx.nd.array(a, ctx=ctx) for a in (x, gamma, beta, mean, var)]
        with mx.autograd.train_mode():
            outs = mx.nd.BatchNorm(*arrs, fix_gamma=False, output_mean_var=True, eps=1e-5)
        got.append([o.asnumpy() for o in outs])
    for g, c in zip(*got):
        np.testing.assert_allclose(g, c, rtol=1e-4, atol=1e-4)


ZOO = ["resnet18_v1", "resnet50_v1", "mobilenetv2_1.0", "vgg11_bn", "densenet121"]


@needs_gpu
@pytest.mark.parametrize("name", ZOO)
def test_model_zoo_forward_on_gpu_equals_cpu(name):
    """A model-zoo network (random weights, fixed seed) gives on gpu(0) what it gives on
    cpu(0), imperative and hybridized; the largest difference is reported relative to the
    largest output."""
    mx.random.seed(3)
    net = mx.gluon.model_zoo.vision.get_model(name, pretrained=False)
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    x = rand(2, 3, 224, 224)
    want = net(mx.nd.array(x)).asnumpy()
    scale = float(np.max(np.abs(want)))
    assert np.isfinite(scale) and scale > 0
    net.collect_params().reset_ctx(mx.gpu(0))
    for hybrid in [False, True]:
        if hybrid:
            net.hybridize()
        got = net(mx.nd.array(x, ctx=mx.gpu(0)))
        assert got.context == mx.gpu(0)
        err = float(np.max(np.abs(got.asnumpy() - want))) / scale
        print(f"{name} hybrid={hybrid}: max |gpu - cpu| / max |cpu| = {err:.1e}")
        assert err < 1e-4, (name, hybrid, err)
