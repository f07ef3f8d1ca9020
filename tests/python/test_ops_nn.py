"""Linear algebra and neural-network operators through the stock 1.9.1 frontend, against NumPy.

Run with MXNET_LIBRARY_PATH pointing at the built libmxnet.so.
"""

import math

import mxnet as mx
import numpy as np
import pytest

RNG = np.random.RandomState(7)
FLOATS = ["float32", "float64", "float16"]
TOL = {"float32": (1e-5, 1e-5), "float64": (1e-10, 1e-10), "float16": (2e-2, 2e-2)}


def train_mode():
    """Autograd's training mode, or a skip where the library lacks autograd."""
    try:
        mx.autograd.set_training(True)
        mx.autograd.set_training(False)
    except AttributeError as e:
        pytest.skip(f"autograd is not available: {e}")
    return mx.autograd.train_mode()


def arr(*shape, dtype="float32", lo=-1.0, hi=1.0):
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


def close(got, want, dtype="float32", scale=1.0):
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64), rtol=rtol * scale, atol=atol * scale)


# ------------------------------------------------------------------------------------------
# dot, batch_dot, FullyConnected


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_dot_2d(dtype, ta, tb):
    a, b = arr(4, 5, dtype=dtype), arr(5, 3, dtype=dtype)
    a_in = a.T.copy() if ta else a
    b_in = b.T.copy() if tb else b
    got = mx.nd.dot(mx.nd.array(a_in, dtype=dtype), mx.nd.array(b_in, dtype=dtype), transpose_a=ta, transpose_b=tb)
    assert got.dtype == np.dtype(dtype)
    close(got.asnumpy(), a.astype(np.float64) @ b.astype(np.float64), dtype, scale=5)


def test_dot_vectors_and_nd():
    a, b = arr(6), arr(6)
    got = mx.nd.dot(mx.nd.array(a), mx.nd.array(b)).asnumpy()
    assert got.shape == (1,)
    close(got, [a @ b])
    m = arr(3, 6)
    close(mx.nd.dot(mx.nd.array(m), mx.nd.array(b)).asnumpy(), m @ b)
    close(mx.nd.dot(mx.nd.array(b), mx.nd.array(m.T.copy())).asnumpy(), b @ m.T)
    x, y = arr(2, 3, 4), arr(4, 5, 2)
    got = mx.nd.dot(mx.nd.array(x), mx.nd.array(y)).asnumpy()
    assert got.shape == (2, 3, 5, 2)
    close(got, np.tensordot(x, y, axes=([2], [0])))


def test_dot_large_uses_parallel_gemm():
    a, b = arr(300, 200), arr(200, 250)
    close(mx.nd.dot(mx.nd.array(a), mx.nd.array(b)).asnumpy(), a.astype(np.float64) @ b, scale=10)


def test_dot_1024_square_float32():
    # The benchmark's size, through the parallel GEMM; 1027 columns leave edge tiles.
    rng = np.random.default_rng(5)
    a = rng.standard_normal((1024, 1024)).astype(np.float32)
    b = rng.standard_normal((1024, 1027)).astype(np.float32)
    got = mx.nd.dot(mx.nd.array(a), mx.nd.array(b)).asnumpy()
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert np.abs(got - want).max() < 1e-3 * np.abs(want).max()


def test_dot_errors():
    with pytest.raises(mx.base.MXNetError, match="dot"):
        mx.nd.dot(mx.nd.ones((2, 3)), mx.nd.ones((2, 3))).wait_to_read()
    with pytest.raises(mx.base.MXNetError, match="int32"):
        mx.nd.dot(mx.nd.ones((2, 3), dtype="int32"), mx.nd.ones((3, 2), dtype="int32")).wait_to_read()


@pytest.mark.parametrize("ta,tb", [(False, False), (True, True), (False, True)])
def test_batch_dot(ta, tb):
    a, b = arr(3, 4, 5), arr(3, 5, 2)
    a_in = a.transpose(0, 2, 1).copy() if ta else a
    b_in = b.transpose(0, 2, 1).copy() if tb else b
    got = mx.nd.batch_dot(mx.nd.array(a_in), mx.nd.array(b_in), transpose_a=ta, transpose_b=tb).asnumpy()
    close(got, np.matmul(a, b), scale=5)
    with pytest.raises(mx.base.MXNetError, match="batch_dot"):
        mx.nd.batch_dot(mx.nd.ones((2, 3, 4)), mx.nd.ones((3, 4, 5))).wait_to_read()


@pytest.mark.parametrize("dtype", FLOATS)
def test_fully_connected(dtype):
    x, w, b = arr(4, 2, 3, dtype=dtype), arr(5, 6, dtype=dtype), arr(5, dtype=dtype)
    got = mx.nd.FullyConnected(mx.nd.array(x, dtype=dtype), mx.nd.array(w, dtype=dtype), mx.nd.array(b, dtype=dtype), num_hidden=5)
    want = x.reshape(4, 6).astype(np.float64) @ w.T.astype(np.float64) + b
    close(got.asnumpy(), want, dtype, scale=5)
    nb = mx.nd.FullyConnected(mx.nd.array(x, dtype=dtype), mx.nd.array(w, dtype=dtype), num_hidden=5, no_bias=True)
    close(nb.asnumpy(), x.reshape(4, 6).astype(np.float64) @ w.T.astype(np.float64), dtype, scale=5)


def test_fully_connected_no_flatten_and_errors():
    x, w, b = arr(2, 3, 4), arr(6, 4), arr(6)
    got = mx.nd.FullyConnected(mx.nd.array(x), mx.nd.array(w), mx.nd.array(b), num_hidden=6, flatten=False).asnumpy()
    assert got.shape == (2, 3, 6)
    close(got, x @ w.T + b)
    with pytest.raises(mx.base.MXNetError, match="weight"):
        mx.nd.FullyConnected(mx.nd.array(x), mx.nd.ones((5, 4)), mx.nd.array(b), num_hidden=6, flatten=False).wait_to_read()


# ------------------------------------------------------------------------------------------
# Activation, LeakyReLU


def np_act(x, kind):
    x = x.astype(np.float64)
    return {
        "relu": lambda: np.maximum(x, 0),
        "sigmoid": lambda: 1 / (1 + np.exp(-x)),
        "tanh": lambda: np.tanh(x),
        "softrelu": lambda: np.log1p(np.exp(x)),
        "softsign": lambda: x / (1 + np.abs(x)),
    }[kind]()


@pytest.mark.parametrize("kind", ["relu", "sigmoid", "tanh", "softrelu", "softsign"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_activation(kind, dtype):
    x = arr(3, 50, dtype=dtype, lo=-4, hi=4)
    got = mx.nd.Activation(mx.nd.array(x, dtype=dtype), act_type=kind)
    assert got.dtype == np.dtype(dtype)
    close(got.asnumpy(), np_act(x, kind), dtype)


def test_activation_large_and_bad_type():
    x = arr(200000, lo=-30, hi=30)
    close(mx.nd.Activation(mx.nd.array(x), act_type="softrelu").asnumpy(), np.logaddexp(0, x.astype(np.float64)))
    with pytest.raises(mx.base.MXNetError, match="act_type"):
        mx.nd.Activation(mx.nd.ones((2,)), act_type="swish")


def test_leaky_relu_variants():
    x = arr(2, 3, 4, lo=-3, hi=3)
    xd = x.astype(np.float64)
    close(mx.nd.LeakyReLU(mx.nd.array(x), slope=0.1).asnumpy(), np.where(x > 0, x, 0.1 * x))
    close(mx.nd.LeakyReLU(mx.nd.array(x), act_type="elu", slope=0.7).asnumpy(), np.where(x > 0, xd, 0.7 * (np.exp(xd) - 1)))
    a, lam = 1.6732632423543772, 1.0507009873554805
    close(mx.nd.LeakyReLU(mx.nd.array(x), act_type="selu").asnumpy(), lam * np.where(x > 0, xd, a * (np.exp(xd) - 1)))
    erf = np.vectorize(math.erf)
    close(mx.nd.LeakyReLU(mx.nd.array(x), act_type="gelu").asnumpy(), 0.5 * xd * (1 + erf(xd / math.sqrt(2))), scale=2)
    g = np.array([0.1, 0.2, 0.3], dtype=np.float32)
    got = mx.nd.LeakyReLU(mx.nd.array(x), mx.nd.array(g), act_type="prelu").asnumpy()
    close(got, np.where(x > 0, x, g.reshape(1, 3, 1) * x))
    # rrelu at inference: the mean slope.
    got = mx.nd.LeakyReLU(mx.nd.array(x), act_type="rrelu", lower_bound=0.1, upper_bound=0.3).asnumpy()
    close(got, np.where(x > 0, x, 0.2 * x))


def test_rrelu_training_draws_slopes():
    x = arr(2, 3, 4, lo=-3, hi=3)
    with train_mode():
        got = mx.nd.LeakyReLU(mx.nd.array(x), act_type="rrelu", lower_bound=0.1, upper_bound=0.3).asnumpy()
    neg = x < 0
    ratio = got[neg] / x[neg]
    assert ratio.min() >= 0.1 - 1e-6 and ratio.max() <= 0.3 + 1e-6 and ratio.std() > 0


# ------------------------------------------------------------------------------------------
# softmax family, SoftmaxOutput


def np_softmax(x, axis=-1, t=1.0):
    x = x.astype(np.float64) / t
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("axis", [-1, 0, 1, 2])
@pytest.mark.parametrize("dtype", FLOATS)
def test_softmax_axes(axis, dtype):
    x = arr(3, 4, 5, dtype=dtype, lo=-3, hi=3)
    nd = mx.nd.array(x, dtype=dtype)
    close(mx.nd.softmax(nd, axis=axis).asnumpy(), np_softmax(x, axis), dtype)
    close(mx.nd.log_softmax(nd, axis=axis).asnumpy(), np.log(np_softmax(x, axis)), dtype, scale=3)
    close(mx.nd.softmin(nd, axis=axis).asnumpy(), np_softmax(-x.astype(np.float64), axis), dtype)


def test_softmax_temperature_dtype_length():
    x = arr(2, 6, lo=-3, hi=3)
    close(mx.nd.softmax(mx.nd.array(x), temperature=2.5).asnumpy(), np_softmax(x, t=2.5))
    out = mx.nd.softmax(mx.nd.array(x), dtype="float64")
    assert out.dtype == np.float64
    close(out.asnumpy(), np_softmax(x))
    length = mx.nd.array([3, 6], dtype="int32")
    got = mx.nd.softmax(mx.nd.array(x), length, axis=-1, use_length=True).asnumpy()
    want0 = np.concatenate([np_softmax(x[0, :3]), np.zeros(3)])
    close(got[0], want0)
    close(got[1], np_softmax(x[1]))
    big = arr(64, 1000, lo=-10, hi=10)
    close(mx.nd.softmax(mx.nd.array(big)).asnumpy(), np_softmax(big))


def test_softmax_errors():
    with pytest.raises(mx.base.MXNetError, match="axis"):
        mx.nd.softmax(mx.nd.ones((2, 3)), axis=2).wait_to_read()
    with pytest.raises(mx.base.MXNetError, match="softmax"):
        mx.nd.softmax(mx.nd.ones((2, 3), dtype="int32")).wait_to_read()


def test_softmax_output():
    x = arr(4, 3, 2, lo=-2, hi=2)
    got = mx.nd.SoftmaxOutput(mx.nd.array(x), mx.nd.array([0, 1, 2, 0])).asnumpy()
    close(got, np_softmax(x.reshape(4, 6)).reshape(4, 3, 2))
    got = mx.nd.SoftmaxOutput(mx.nd.array(x), mx.nd.zeros((4, 2)), multi_output=True).asnumpy()
    close(got, np_softmax(x, axis=1))
    got = mx.nd.Softmax(mx.nd.array(x), mx.nd.zeros((4, 3)), preserve_shape=True).asnumpy()
    close(got, np_softmax(x, axis=-1))


# ------------------------------------------------------------------------------------------
# Dropout


def test_dropout_inference_is_identity_and_training_masks():
    x = arr(100, 100, lo=1, hi=2)
    np.testing.assert_array_equal(mx.nd.Dropout(mx.nd.array(x), p=0.5).asnumpy(), x)
    np.testing.assert_array_equal(mx.nd.Dropout(mx.nd.array(x), p=0.0, mode="always").asnumpy(), x)
    y = mx.nd.Dropout(mx.nd.array(x), p=0.3, mode="always").asnumpy()
    kept = y != 0
    assert 0.6 < kept.mean() < 0.8
    close(y[kept], x[kept] / 0.7)
    y = mx.nd.Dropout(mx.nd.array(x), p=0.5, mode="always", axes=(1,)).asnumpy()
    # Variational: one decision per row.
    rows = (y != 0).all(axis=1) | (y == 0).all(axis=1)
    assert rows.all() and 0 < (y[:, 0] != 0).mean() < 1
    with pytest.raises(mx.base.MXNetError, match="p must"):
        mx.nd.Dropout(mx.nd.array(x), p=1.5).wait_to_read()


# ------------------------------------------------------------------------------------------
# BatchNorm, LayerNorm


def test_batch_norm_inference():
    x = arr(4, 3, 5, 5, lo=-2, hi=3)
    g, b = arr(3, lo=0.5, hi=1.5), arr(3)
    mm, mv = arr(3), arr(3, lo=0.5, hi=2)
    args = [mx.nd.array(v) for v in (x, g, b, mm, mv)]
    got = mx.nd.BatchNorm(*args, fix_gamma=False, eps=1e-3).asnumpy()
    want = (x - mm.reshape(1, 3, 1, 1)) / np.sqrt(mv.reshape(1, 3, 1, 1) + 1e-3) * g.reshape(1, 3, 1, 1) + b.reshape(1, 3, 1, 1)
    close(got, want, scale=5)
    # Channel axis last.
    got = mx.nd.BatchNorm(mx.nd.array(x), *[mx.nd.array(v) for v in (arr(5), b[:1].repeat(5), np.zeros(5, "f"), np.ones(5, "f"))], axis=-1).asnumpy()
    close(got, x / np.sqrt(1 + 1e-3) + b[0], scale=5)
    with pytest.raises(mx.base.MXNetError, match="gamma"):
        mx.nd.BatchNorm(mx.nd.array(x), mx.nd.ones((4,)), *args[2:]).wait_to_read()


def test_batch_norm_backward_updates_moving_stats():
    # Stock 1.9.1's rule: the training forward uses the batch statistics and leaves the moving
    # ones; the backward updates them (tests/python/test_batchnorm_stats_vs_stock.py compares
    # with stock itself).
    x = arr(4, 3, 5, 5, lo=-2, hi=3)
    b = arr(3)
    mm, mv = arr(3), arr(3, lo=0.5, hi=2)
    args = [mx.nd.array(v) for v in (x, arr(3), b, mm, mv)]
    args[0].attach_grad()
    with mx.autograd.record():
        out, mean, invstd = mx.nd.BatchNorm(*args, fix_gamma=True, output_mean_var=True, momentum=0.8)
    bm, bv = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    close(mean.asnumpy(), bm, scale=5)
    close(invstd.asnumpy(), 1 / np.sqrt(bv + 1e-3), scale=5)
    close(out.asnumpy(), (x - bm.reshape(1, 3, 1, 1)) / np.sqrt(bv.reshape(1, 3, 1, 1) + 1e-3) + b.reshape(1, 3, 1, 1), scale=10)
    np.testing.assert_array_equal(args[3].asnumpy(), mm.astype(np.float32))
    np.testing.assert_array_equal(args[4].asnumpy(), mv.astype(np.float32))
    out.backward()
    close(args[3].asnumpy(), mm * 0.8 + bm * 0.2, scale=5)
    close(args[4].asnumpy(), mv * 0.8 + bv * 0.2, scale=5)


def test_layer_norm():
    x, g, b = arr(3, 4, 6), arr(6), arr(6)
    got = mx.nd.LayerNorm(mx.nd.array(x), mx.nd.array(g), mx.nd.array(b)).asnumpy()
    m, v = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    close(got, (x - m) / np.sqrt(v + 1e-5) * g + b, scale=5)
    g4, b4 = arr(4), arr(4)
    got = mx.nd.LayerNorm(mx.nd.array(x), mx.nd.array(g4), mx.nd.array(b4), axis=1).asnumpy()
    m, v = x.mean(1, keepdims=True), x.var(1, keepdims=True)
    close(got, (x - m) / np.sqrt(v + 1e-5) * g4.reshape(1, 4, 1) + b4.reshape(1, 4, 1), scale=5)


# ------------------------------------------------------------------------------------------
# smooth_l1 (the operator docs/adding-an-operator.md adds)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("sigma", [1.0, 2.0, 0.5])
def test_smooth_l1_values_gradient_and_graph_shape(dtype, sigma):
    x = np.array([-3.0, -1.0 / sigma ** 2, -0.2, 0.0, 0.1, 0.3, 4.5, 1.0], dtype=dtype)
    bsq, ibsq = sigma * sigma, 1.0 / (sigma * sigma)
    x64 = x.astype(np.float64)
    want = np.where(x64 > ibsq, x64 - 0.5 * ibsq, np.where(x64 < -ibsq, -x64 - 0.5 * ibsq, 0.5 * x64 * x64 * bsq))
    got = mx.nd.smooth_l1(mx.nd.array(x, dtype=dtype), scalar=sigma)
    assert got.dtype == np.dtype(dtype)
    close(got.asnumpy(), want, dtype)
    xa = mx.nd.array(x, dtype=dtype)
    xa.attach_grad()
    with mx.autograd.record():
        y = mx.nd.smooth_l1(xa, scalar=sigma)
    y.backward(mx.nd.full(y.shape, 2.0, dtype=dtype))
    want_grad = 2.0 * np.where(x64 > ibsq, 1.0, np.where(x64 < -ibsq, -1.0, bsq * x64))
    close(xa.grad.asnumpy(), want_grad, dtype)
    # Graph inference through the element-wise rule, both ways.
    s = mx.sym.smooth_l1(mx.sym.var("x"), scalar=sigma)
    _, out_shapes, _ = s.infer_shape(x=(2, 3))
    assert out_shapes == [(2, 3)]
    with pytest.raises((TypeError, mx.base.MXNetError), match="supports float32"):
        mx.nd.smooth_l1(mx.nd.array([1, 2], dtype="int32")).asnumpy()


# ------------------------------------------------------------------------------------------
# Pooling


def np_pool2d(x, k, s, p, kind, full=False, include_pad=True):
    n, c, h, w = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])), constant_values=np.nan)
    rnd = (lambda a: -(-a // 1)) if full else math.floor
    oh = int(rnd((h + 2 * p[0] - k[0]) / s[0])) + 1
    ow = int(rnd((w + 2 * p[1] - k[1]) / s[1])) + 1
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            win = xp[:, :, i * s[0]:i * s[0] + k[0], j * s[1]:j * s[1] + k[1]]
            if kind == "max":
                out[:, :, i, j] = np.nanmax(win, axis=(2, 3))
            elif kind == "sum":
                out[:, :, i, j] = np.nansum(win, axis=(2, 3))
            else:
                cnt = win.shape[2] * win.shape[3] if include_pad else (~np.isnan(win[0, 0])).sum()
                out[:, :, i, j] = np.nansum(win, axis=(2, 3)) / cnt
    return out


@pytest.mark.parametrize("kind", ["max", "avg", "sum"])
@pytest.mark.parametrize("k,s,p", [((2, 2), (2, 2), (0, 0)), ((3, 3), (1, 1), (1, 1)), ((3, 2), (2, 1), (1, 0))])
def test_pooling_2d(kind, k, s, p):
    x = arr(2, 3, 7, 6)
    got = mx.nd.Pooling(mx.nd.array(x), kernel=k, stride=s, pad=p, pool_type=kind).asnumpy()
    close(got, np_pool2d(x, k, s, p, kind))


def test_pooling_conventions_global_1d_3d_lp():
    x = arr(1, 2, 7, 7)
    got = mx.nd.Pooling(mx.nd.array(x), kernel=(2, 2), stride=(2, 2), pooling_convention="full").asnumpy()
    assert got.shape == (1, 2, 4, 4)
    close(got, np_pool2d(x, (2, 2), (2, 2), (0, 0), "max", full=True))
    got = mx.nd.Pooling(mx.nd.array(x), kernel=(3, 3), pad=(1, 1), pool_type="avg", count_include_pad=False).asnumpy()
    close(got, np_pool2d(x, (3, 3), (1, 1), (1, 1), "avg", include_pad=False))
    got = mx.nd.Pooling(mx.nd.array(x), global_pool=True, pool_type="avg").asnumpy()
    close(got, x.mean(axis=(2, 3), keepdims=True))
    x1 = arr(2, 3, 9)
    got = mx.nd.Pooling(mx.nd.array(x1), kernel=(3,), stride=(2,), pool_type="max").asnumpy()
    close(got, np.stack([x1[:, :, i:i + 3].max(-1) for i in range(0, 7, 2)], -1))
    x3 = arr(1, 2, 4, 4, 4)
    got = mx.nd.Pooling(mx.nd.array(x3), kernel=(2, 2, 2), stride=(2, 2, 2)).asnumpy()
    close(got, x3.reshape(1, 2, 2, 2, 2, 2, 2, 2).max(axis=(3, 5, 7)))
    got = mx.nd.Pooling(mx.nd.array(x), kernel=(7, 7), pool_type="lp", p_value=2).asnumpy()
    close(got, np.sqrt((x.astype(np.float64) ** 2).sum(axis=(2, 3), keepdims=True)))
    with pytest.raises(mx.base.MXNetError, match="kernel"):
        mx.nd.Pooling(mx.nd.array(x), kernel=(9, 9)).wait_to_read()
    with pytest.raises(mx.base.MXNetError, match="pool_type"):
        mx.nd.Pooling(mx.nd.array(x), kernel=(2, 2), pool_type="median")


# ------------------------------------------------------------------------------------------
# Convolution


def np_conv(x, w, b, stride, pad, dilate, groups):
    n, c, h, wd = x.shape
    f, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    oh = (h + 2 * pad[0] - dilate[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + 2 * pad[1] - dilate[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, f, oh, ow))
    fg = f // groups
    for fi in range(f):
        gi = fi // fg
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, gi * cg:(gi + 1) * cg,
                           i * dilate[0]:i * dilate[0] + stride[0] * (oh - 1) + 1:stride[0],
                           j * dilate[1]:j * dilate[1] + stride[1] * (ow - 1) + 1:stride[1]]
                out[:, fi] += np.einsum("nchw,c->nhw", patch, w[fi, :, i, j].astype(np.float64))
    if b is not None:
        out += b.reshape(1, f, 1, 1)
    return out


@pytest.mark.parametrize("tune", [None, "off", "limited_workspace", "fastest"])
@pytest.mark.parametrize("case", [
    dict(c=3, f=4, g=1, k=(3, 3), s=(1, 1), p=(1, 1), d=(1, 1)),
    dict(c=4, f=6, g=2, k=(3, 2), s=(2, 1), p=(0, 1), d=(1, 2)),
    dict(c=4, f=8, g=1, k=(1, 1), s=(1, 1), p=(0, 0), d=(1, 1)),
])
def test_convolution_2d(tune, case):
    x = arr(2, case["c"], 9, 8)
    w = arr(case["f"], case["c"] // case["g"], *case["k"])
    b = arr(case["f"])
    kw = dict(kernel=case["k"], stride=case["s"], pad=case["p"], dilate=case["d"], num_filter=case["f"], num_group=case["g"])
    if tune is not None:
        kw["cudnn_tune"] = tune
    got = mx.nd.Convolution(mx.nd.array(x), mx.nd.array(w), mx.nd.array(b), **kw).asnumpy()
    close(got, np_conv(x, w, b, case["s"], case["p"], case["d"], case["g"]), scale=5)
    # Repeated call (cached choice) gives the same result.
    again = mx.nd.Convolution(mx.nd.array(x), mx.nd.array(w), mx.nd.array(b), **kw).asnumpy()
    np.testing.assert_array_equal(got, again)


@pytest.mark.parametrize("dtype", FLOATS)
def test_convolution_1d_no_bias_dtypes(dtype):
    x, w = arr(2, 3, 10, dtype=dtype), arr(5, 3, 3, dtype=dtype)
    got = mx.nd.Convolution(mx.nd.array(x, dtype=dtype), mx.nd.array(w, dtype=dtype), kernel=(3,), num_filter=5, no_bias=True, pad=(1,))
    assert got.dtype == np.dtype(dtype)
    want = np_conv(x[:, :, None, :], w[:, :, None, :], None, (1, 1), (0, 1), (1, 1), 1)[:, :, 0, :]
    close(got.asnumpy(), want, dtype, scale=5)


def test_convolution_3d_and_errors():
    x, w = arr(1, 2, 4, 5, 5), arr(3, 2, 2, 3, 3)
    got = mx.nd.Convolution(mx.nd.array(x), mx.nd.array(w), kernel=(2, 3, 3), num_filter=3, no_bias=True).asnumpy()
    want = np.zeros((1, 3, 3, 3, 3))
    for z in range(3):
        for y in range(3):
            for xx in range(3):
                want[0, :, z, y, xx] = np.einsum("cdhw,fcdhw->f", x[0, :, z:z + 2, y:y + 3, xx:xx + 3], w)
    close(got, want, scale=5)
    with pytest.raises(mx.base.MXNetError, match="weight"):
        mx.nd.Convolution(mx.nd.ones((1, 2, 5, 5)), mx.nd.ones((3, 3, 3, 3)), mx.nd.ones((3,)), kernel=(3, 3), num_filter=3).wait_to_read()
    with pytest.raises(mx.base.MXNetError, match="num_group"):
        mx.nd.Convolution(mx.nd.ones((1, 3, 5, 5)), mx.nd.ones((2, 1, 3, 3)), kernel=(3, 3), num_filter=2, num_group=2, no_bias=True).wait_to_read()
    with pytest.raises(mx.base.MXNetError, match="cudnn_tune"):
        mx.nd.Convolution(mx.nd.ones((1, 1, 5, 5)), mx.nd.ones((1, 1, 3, 3)), kernel=(3, 3), num_filter=1, no_bias=True, cudnn_tune="slow")
    with pytest.raises(mx.base.MXNetError, match="larger"):
        mx.nd.Convolution(mx.nd.ones((1, 1, 2, 2)), mx.nd.ones((1, 1, 3, 3)), kernel=(3, 3), num_filter=1, no_bias=True).wait_to_read()


def test_rnn_of_an_empty_sequence_passes_the_state_gradients_through():
    x = mx.nd.array(np.zeros((0, 2, 3)))
    w = mx.nd.ones((4 * 5 * (3 + 5 + 2),))
    h0, c0 = mx.nd.ones((1, 2, 5)), mx.nd.ones((1, 2, 5)) * 2
    for a in (h0, c0):
        a.attach_grad()
    with mx.autograd.record():
        out, hy, cy = mx.nd.RNN(x, w, h0, c0, mode="lstm", state_size=5, num_layers=1, state_outputs=True)
        loss = (hy * 3).sum() + (cy * 4).sum()
    loss.backward()
    assert out.shape == (0, 2, 5)
    np.testing.assert_array_equal(hy.asnumpy(), h0.asnumpy())
    np.testing.assert_array_equal(h0.grad.asnumpy(), np.full((1, 2, 5), 3.0))
    np.testing.assert_array_equal(c0.grad.asnumpy(), np.full((1, 2, 5), 4.0))


def test_resampling_and_deconvolution_sizes_are_checked_not_allocated():
    # An empty batch resized to a huge plane allocates nothing per pixel.
    y = mx.nd.contrib.BilinearResize2D(mx.nd.array(np.zeros((0, 3, 4, 4))), height=1 << 20, width=1 << 20)
    assert y.shape == (0, 3, 1 << 20, 1 << 20)
    y = mx.nd.UpSampling(mx.nd.array(np.zeros((0, 1, 4, 4))), scale=1 << 20, sample_type="nearest", num_args=1)
    assert y.shape == (0, 1, 4 << 20, 4 << 20)
    with pytest.raises(mx.base.MXNetError, match="too large"):
        mx.nd.UpSampling(mx.nd.zeros((1, 1, 4, 4)), scale=1 << 40, sample_type="nearest", num_args=1)
    with pytest.raises(mx.base.MXNetError, match="height and width must be positive"):
        mx.nd.contrib.BilinearResize2D(mx.nd.array(np.zeros((1, 1, 0, 4))), height=2, width=4)
    with pytest.raises(mx.base.MXNetError, match="too large"):
        mx.nd.Deconvolution(mx.nd.zeros((1, 1, 5)), mx.nd.zeros((1, 1, 1)), kernel=(1,), stride=(1 << 62,), num_filter=1)
    with pytest.raises(mx.base.MXNetError, match="too large"):
        mx.nd.RNN(mx.nd.zeros((1, 1, 1)), mx.nd.zeros((1,)), mx.nd.zeros((1, 1, 1)), mode="gru", state_size=1 << 40,
                  num_layers=1 << 20)
