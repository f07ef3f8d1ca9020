"""Creation (_arange, _linspace, _eye), random sampling and optimizer update operators through the
stock MXNet 1.9.1 frontend, compared with NumPy.

Run with MXNET_LIBRARY_PATH pointing at our libmxnet.so (defaults to target/release).
"""

import os

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("MXNET_LIBRARY_PATH", os.path.join(REPO, "target", "release", "libmxnet.so"))

import mxnet as mx  # noqa: E402

BAD = (ValueError, TypeError, mx.base.MXNetError)


# ---------------------------------------------------------------- creation


@pytest.mark.parametrize(
    "start,stop,step,repeat",
    [(0, 10, 1, 1), (0, 10, 3, 1), (0, 10, 3, 2), (2.5, 7.1, 0.7, 1), (10, -3, -1.5, 3), (0, 1, 0.1, 1), (-4, 4, 1, 5)],
)
def test_arange_matches_numpy(start, stop, step, repeat):
    got = mx.nd.arange(start, stop, step, repeat=repeat).asnumpy()
    want = np.repeat(np.arange(start, stop, step, dtype=np.float64), repeat).astype(np.float32)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_arange_stop_none_and_dtypes():
    np.testing.assert_array_equal(mx.nd.arange(6).asnumpy(), np.arange(6, dtype=np.float32))
    for dt in ["int32", "int64", "float64", "float16", "uint8", "int8"]:
        got = mx.nd.arange(1, 9, 2, dtype=dt)
        assert got.dtype == np.dtype(dt)
        np.testing.assert_array_equal(got.asnumpy(), np.arange(1, 9, 2).astype(dt))
    # Integer dtypes step by the step converted to the dtype (stock's kernel).
    np.testing.assert_array_equal(mx.nd.arange(2, 5, 1.5, dtype="int32").asnumpy(), [2, 3])
    np.testing.assert_allclose(mx.nd.arange(2, 5, 1.5, dtype="float64").asnumpy(), [2, 3.5])


@pytest.mark.parametrize("kwargs", [dict(start=0, stop=5, step=0), dict(start=5, stop=0, step=1), dict(start=0, stop=5, step=-1), dict(start=0, stop=3, repeat=0)])
def test_arange_bad_params(kwargs):
    with pytest.raises(BAD):
        mx.nd.arange(**kwargs).asnumpy()


@pytest.mark.parametrize("start,stop,num", [(0, 1, 5), (59.4, 94.6, 9), (35.3, 2.4, 12), (3, 3, 1), (1, 2, 0), (-5, 5, 17)])
@pytest.mark.parametrize("endpoint", [True, False])
def test_linspace_matches_numpy(start, stop, num, endpoint):
    got = mx.nd.linspace(start, stop, num, endpoint=endpoint).asnumpy()
    want = np.linspace(start, stop, num, endpoint=endpoint).astype(np.float32)
    assert got.shape == (num,)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)


def test_linspace_int_dtype_and_errors():
    got = mx.nd.linspace(22.8, 3.7, 17, dtype="int32")
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got.asnumpy(), np.linspace(22.8, 3.7, 17).astype(np.int32))
    with pytest.raises(BAD):
        mx.nd.linspace(0, 1, -1).asnumpy()


@pytest.mark.parametrize("N,M,k", [(3, 0, 0), (7, 7, -10), (6, 7, 6), (3, 3, -4), (4, 6, 2), (5, 3, -1), (1, 1, 0), (0, 0, 0)])
def test_eye_matches_numpy(N, M, k):
    got = mx.nd.eye(N, M, k)
    np.testing.assert_array_equal(got.asnumpy(), np.eye(N, M if M else None, k, dtype=np.float32))
    np.testing.assert_array_equal(mx.nd.eye(N, M, k, dtype="int64").asnumpy(), np.eye(N, M if M else None, k, dtype=np.int64))


def test_eye_negative_size():
    with pytest.raises(BAD):
        mx.nd.eye(-2).asnumpy()


# ---------------------------------------------------------------- random

SAMPLERS = {
    "uniform": lambda shape, **kw: mx.nd.random.uniform(-2, 3, shape=shape, **kw),
    "normal": lambda shape, **kw: mx.nd.random.normal(1, 2, shape=shape, **kw),
    "gamma": lambda shape, **kw: mx.nd.random.gamma(2.5, 0.5, shape=shape, **kw),
    "exponential": lambda shape, **kw: mx.nd.random.exponential(4, shape=shape, **kw),
    "poisson": lambda shape, **kw: mx.nd.random.poisson(6, shape=shape, **kw),
    "randint": lambda shape, **kw: mx.nd.random.randint(-5, 7, shape=shape, **kw),
    "sample_uniform": lambda shape, **kw: mx.nd.random.uniform(mx.nd.array([0, 5]), mx.nd.array([1, 9]), shape=shape, **kw),
    "sample_normal": lambda shape, **kw: mx.nd.random.normal(mx.nd.array([0, 5]), mx.nd.array([1, 3]), shape=shape, **kw),
}


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_seed_reproducible_and_seeds_differ(name):
    draw = SAMPLERS[name]
    mx.random.seed(123)
    a = draw((50, 4)).asnumpy()
    b = draw((50, 4)).asnumpy()
    mx.random.seed(123)
    a2 = draw((50, 4)).asnumpy()
    mx.random.seed(124)
    c = draw((50, 4)).asnumpy()
    np.testing.assert_array_equal(a, a2)
    assert not np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_results_do_not_depend_on_thread_count():
    mx.random.seed(7)
    a = mx.nd.random.normal(shape=(300000,)).asnumpy()
    old = os.environ.get("OMP_NUM_THREADS")
    mx.base._LIB.MXSetNumOMPThreads(1)
    try:
        mx.random.seed(7)
        b = mx.nd.random.normal(shape=(300000,)).asnumpy()
    finally:
        mx.base._LIB.MXSetNumOMPThreads(int(old) if old else os.cpu_count())
    np.testing.assert_array_equal(a, b)


N = 200000


def test_uniform_bounds_and_moments():
    for dt in ["float32", "float64", "float16"]:
        x = mx.nd.random.uniform(-2, 3, shape=(N,), dtype=dt)
        assert x.dtype == np.dtype(dt)
        x = x.asnumpy().astype(np.float64)
        assert x.min() >= -2 and x.max() < 3
        assert abs(x.mean() - 0.5) < 0.03
        assert abs(x.std() - 5 / np.sqrt(12)) < 0.03
    x = mx.nd.random.uniform(shape=(3, 4)).asnumpy()
    assert x.dtype == np.float32 and x.shape == (3, 4)


def test_sampling_into_an_output_takes_its_dtype():
    # dtype unset: the output's dtype (Gluon's initializers fill float64 parameters this way);
    # dtype given: it must match, as in stock.
    for dt in ["float64", "float16"]:
        out = mx.nd.zeros((1000,), dtype=dt)
        mx.nd.random.uniform(-1, 1, shape=(1000,), out=out)
        x = out.asnumpy()
        assert x.dtype == np.dtype(dt) and x.min() >= -1 and x.max() <= 1 and x.std() > 0.3
        mx.nd.random.normal(0, 1, shape=(1000,), out=out)
        assert abs(out.asnumpy().astype(np.float64).mean()) < 0.2
    with pytest.raises(BAD):
        mx.nd.random.uniform(-1, 1, shape=(4,), dtype="float32", out=mx.nd.zeros((4,), dtype="float64")).wait_to_read()


def test_normal_moments():
    x = mx.nd.random.normal(1.5, 2.0, shape=(N,)).asnumpy()
    assert abs(x.mean() - 1.5) < 0.03 and abs(x.std() - 2.0) < 0.03
    # Roughly Gaussian tails: ~4.55% beyond two sigma.
    assert abs(np.mean(np.abs(x - 1.5) > 4.0) - 0.0455) < 0.005


def test_randint_bounds_dtype_and_coverage():
    x = mx.nd.random.randint(-5, 7, shape=(N,))
    assert x.dtype == np.int32
    x = x.asnumpy()
    assert x.min() == -5 and x.max() == 6
    counts = np.bincount(x + 5)
    assert counts.min() > N / 12 * 0.9
    y = mx.nd.random.randint(2**40, 2**40 + 3, shape=(1000,), dtype="int64").asnumpy()
    assert y.dtype == np.int64 and set(np.unique(y)) == {2**40, 2**40 + 1, 2**40 + 2}


@pytest.mark.parametrize(
    "draw,mean,var",
    [
        (lambda: mx.nd.random.gamma(2.5, 0.5, shape=(N,)), 1.25, 0.625),
        (lambda: mx.nd.random.gamma(0.4, 2.0, shape=(N,)), 0.8, 1.6),
        # The frontend's exponential takes the scale (it sends lam = 1 / scale).
        (lambda: mx.nd.random.exponential(0.25, shape=(N,)), 0.25, 0.0625),
        (lambda: mx.nd.random_exponential(lam=4, shape=(N,)), 0.25, 0.0625),
        (lambda: mx.nd.random.poisson(6, shape=(N,)), 6, 6),
        (lambda: mx.nd.random.poisson(150, shape=(N,)), 150, 150),
    ],
)
def test_other_distribution_moments(draw, mean, var):
    x = draw().asnumpy().astype(np.float64)
    assert x.min() >= 0
    assert abs(x.mean() - mean) < 0.02 * max(mean, 1)
    assert abs(x.var() - var) < 0.05 * max(var, 1)


def test_poisson_integral():
    x = mx.nd.random.poisson(3, shape=(1000,)).asnumpy()
    np.testing.assert_array_equal(x, np.round(x))


def test_sample_ops_shapes_and_per_row_moments():
    low = mx.nd.array([[0, 10], [-5, 100]])
    high = mx.nd.array([[1, 20], [-4, 101]])
    x = mx.nd.random.uniform(low, high, shape=(20000,))
    assert x.shape == (2, 2, 20000) and x.dtype == np.float32
    x = x.asnumpy()
    lo, hi = low.asnumpy()[..., None], high.asnumpy()[..., None]
    assert (x >= lo).all() and (x < hi).all()
    np.testing.assert_allclose(x.mean(-1), ((lo + hi) / 2)[..., 0], atol=0.1)
    y = mx.nd.random.normal(mx.nd.array([0, 5]), mx.nd.array([1, 3]), shape=(4, 10000)).asnumpy()
    assert y.shape == (2, 4, 10000)
    np.testing.assert_allclose(y.reshape(2, -1).mean(-1), [0, 5], atol=0.1)
    np.testing.assert_allclose(y.reshape(2, -1).std(-1), [1, 3], rtol=0.05)
    z = mx.nd.random.normal(mx.nd.array([0, 5], dtype="float64"), mx.nd.array([1, 3], dtype="float64"))
    assert z.shape == (2,) and z.dtype == np.float64
    g = mx.nd.sample_gamma(mx.nd.array([1, 4]), mx.nd.array([2, 0.5]), shape=20000).asnumpy()
    np.testing.assert_allclose(g.mean(-1), [2, 2], rtol=0.05)
    e = mx.nd.sample_exponential(mx.nd.array([1, 10]), shape=20000).asnumpy()
    np.testing.assert_allclose(e.mean(-1), [1, 0.1], rtol=0.05)
    p = mx.nd.sample_poisson(mx.nd.array([2, 40]), shape=20000, dtype="float64")
    assert p.dtype == np.float64
    np.testing.assert_allclose(p.asnumpy().mean(-1), [2, 40], rtol=0.05)


def test_like_ops():
    data = mx.nd.zeros((30, 400), dtype="float64")
    x = mx.nd.random.uniform_like(data, low=2, high=4)
    assert x.shape == data.shape and x.dtype == np.float64
    x = x.asnumpy()
    assert x.min() >= 2 and x.max() < 4 and abs(x.mean() - 3) < 0.05
    y = mx.nd.random.normal_like(data, loc=-1, scale=0.5).asnumpy()
    assert abs(y.mean() + 1) < 0.03 and abs(y.std() - 0.5) < 0.03
    e = mx.nd.random.exponential_like(data, lam=2).asnumpy()
    assert abs(e.mean() - 0.5) < 0.03


def test_random_bad_params():
    with pytest.raises(BAD):
        mx.nd.random.randint(5, 5, shape=(2,)).asnumpy()
    with pytest.raises(BAD):
        mx.nd.random.normal(0, -1, shape=(2,)).asnumpy()
    with pytest.raises(BAD):
        mx.nd.random.uniform(3, 1, shape=(2,)).asnumpy()
    with pytest.raises(BAD):
        mx.nd.random.gamma(-1, 1, shape=(2,)).asnumpy()
    with pytest.raises(BAD):
        mx.nd.random.uniform(0, 1, shape=(2,), dtype="int32").asnumpy()
    with pytest.raises(BAD):
        mx.nd.random.uniform(mx.nd.array([0, 1]), mx.nd.array([1, 2, 3])).asnumpy()


def test_random_out_and_ctx():
    out = mx.nd.zeros((4, 5))
    mx.nd.random.uniform(1, 2, shape=(4, 5), out=out)
    v = out.asnumpy()
    assert (v >= 1).all() and (v < 2).all()
    x = mx.nd.random.normal(shape=(3,), ctx=mx.cpu(0))
    assert x.context == mx.cpu(0)


# ---------------------------------------------------------------- optimizer updates


def _clip(g, c):
    return np.clip(g, -c, c) if c is not None and c >= 0 else g


def np_sgd(w, g, lr, wd=0, rescale_grad=1, clip_gradient=-1):
    return (1 - lr * wd) * w - lr * _clip(rescale_grad * g, clip_gradient), []


def np_sgd_mom(w, g, mom, lr, momentum=0, wd=0, rescale_grad=1, clip_gradient=-1):
    mom = momentum * mom - lr * wd * w - lr * _clip(rescale_grad * g, clip_gradient)
    return w + mom, [mom]


def np_nag_mom(w, g, mom, lr, momentum=0, wd=0, rescale_grad=1, clip_gradient=-1):
    step = lr * (_clip(rescale_grad * g, clip_gradient) + wd * w)
    mom = momentum * mom
    nw = w - mom + (momentum + 1) * (mom - step)
    return nw, [mom - step]


def np_adam(w, g, mean, var, lr, beta1=0.9, beta2=0.999, epsilon=1e-8, wd=0, rescale_grad=1, clip_gradient=-1):
    g = _clip(rescale_grad * g + wd * w, clip_gradient)
    mean = beta1 * mean + (1 - beta1) * g
    var = beta2 * var + (1 - beta2) * g * g
    return w - lr * mean / (np.sqrt(var) + epsilon), [mean, var]


def np_rmsprop(w, g, n, lr, gamma1=0.95, epsilon=1e-8, wd=0, rescale_grad=1, clip_gradient=-1, clip_weights=-1):
    g = _clip(rescale_grad * g + wd * w, clip_gradient)
    n = (1 - gamma1) * g * g + gamma1 * n
    return _clip(w - lr * g / np.sqrt(n + epsilon), clip_weights), [n]


def np_rmspropalex(w, g, n, gs, delta, lr, gamma1=0.95, gamma2=0.9, epsilon=1e-8, wd=0, rescale_grad=1, clip_gradient=-1, clip_weights=-1):
    g = _clip(rescale_grad * g + wd * w, clip_gradient)
    n = (1 - gamma1) * g * g + gamma1 * n
    gs = (1 - gamma1) * g + gamma1 * gs
    delta = gamma2 * delta - lr * g / np.sqrt(n - gs * gs + epsilon)
    return _clip(w + delta, clip_weights), [n, gs, delta]


def np_signsgd(w, g, lr, wd=0, rescale_grad=1, clip_gradient=-1):
    return (1 - lr * wd) * w - lr * np.sign(g), []


def np_signum(w, g, mom, lr, momentum=0, wd=0, rescale_grad=1, clip_gradient=-1, wd_lh=0):
    mom = momentum * mom - (1 - momentum) * wd * w - (1 - momentum) * _clip(rescale_grad * g, clip_gradient)
    return (1 - lr * wd_lh) * w + lr * np.sign(mom), [mom]


def np_ftml(w, g, d, v, z, lr, t, beta1=0.6, beta2=0.999, epsilon=1e-8, wd=0, rescale_grad=1, clip_grad=-1):
    g = _clip(rescale_grad * g + wd * w, clip_grad)
    v = beta2 * v + (1 - beta2) * g * g
    dt = (1 - beta1**t) / lr * (np.sqrt(v / (1 - beta2**t)) + epsilon)
    z = beta1 * z + (1 - beta1) * g - (dt - beta1 * d) * w
    return -z / dt, [dt + 0 * w, v, z]


def np_ftrl(w, g, z, n, lr, lamda1=0.01, beta=1, wd=0, rescale_grad=1, clip_gradient=-1):
    g = _clip(rescale_grad * g, clip_gradient)
    z = z + g - (np.sqrt(n + g * g) - np.sqrt(n)) * w / lr
    n = n + g * g
    nw = (np.sign(z) * lamda1 - z) / ((beta + np.sqrt(n)) / lr + wd) * (np.abs(z) > lamda1)
    return nw, [z, n]


# name, reference, number of states, positive states (second moments), kwargs
UPDATES = [
    ("sgd_update", np_sgd, 0, [], dict(lr=0.1, wd=0.01, rescale_grad=0.5)),
    ("sgd_mom_update", np_sgd_mom, 1, [], dict(lr=0.1, momentum=0.9, wd=0.01, rescale_grad=0.5)),
    ("nag_mom_update", np_nag_mom, 1, [], dict(lr=0.1, momentum=0.9, wd=0.01, rescale_grad=0.5)),
    ("adam_update", np_adam, 2, [1], dict(lr=0.01, beta1=0.8, beta2=0.99, epsilon=1e-6, wd=0.001, rescale_grad=0.5)),
    ("rmsprop_update", np_rmsprop, 1, [0], dict(lr=0.01, gamma1=0.9, wd=0.001, rescale_grad=0.5)),
    ("rmsprop_update", np_rmsprop, 1, [0], dict(lr=0.5, clip_weights=0.3)),
    ("rmspropalex_update", np_rmspropalex, 3, [0], dict(lr=0.01, gamma1=0.9, gamma2=0.8, wd=0.001, rescale_grad=0.5)),
    ("signsgd_update", np_signsgd, 0, [], dict(lr=0.1, wd=0.01, rescale_grad=0.5)),
    ("signum_update", np_signum, 1, [], dict(lr=0.1, momentum=0.9, wd=0.01, wd_lh=0.05, rescale_grad=0.5)),
    ("ftml_update", np_ftml, 3, [0, 1], dict(lr=0.1, t=3, beta1=0.5, wd=0.001, rescale_grad=0.5)),
    ("ftrl_update", np_ftrl, 2, [1], dict(lr=0.1, lamda1=0.05, beta=1.5, wd=0.01, rescale_grad=0.5)),
]


def _states(rng, count, positive, shape, dtype):
    out = []
    for k in range(count):
        s = rng.standard_normal(shape)
        if k in positive:
            s = np.abs(s) + 0.5
        out.append(s.astype(dtype))
    return out


@pytest.mark.parametrize("name,ref,nstates,positive,kwargs", UPDATES)
@pytest.mark.parametrize("clip", [None, 0.4])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_update_matches_numpy_and_mutates_states(name, ref, nstates, positive, kwargs, clip, dtype):
    rng = np.random.default_rng(hash((name, clip, dtype)) & 0xFFFF)
    shape = (5, 7)
    w0 = rng.standard_normal(shape).astype(dtype)
    g0 = (3 * rng.standard_normal(shape)).astype(dtype)
    s0 = _states(rng, nstates, positive, shape, dtype)
    kw = dict(kwargs)
    if clip is not None:
        kw["clip_grad" if name == "ftml_update" else "clip_gradient"] = clip
    w, g = mx.nd.array(w0, dtype=dtype), mx.nd.array(g0, dtype=dtype)
    states = [mx.nd.array(s, dtype=dtype) for s in s0]
    getattr(mx.nd, name)(w, g, *states, out=w, **kw)
    # Stock declares these scalars `float`: a float64 update uses their float32 values.
    scalars = {"lr", "wd", "rescale_grad", "clip_gradient", "clip_grad", "momentum", "wd_lh", "beta1", "beta2",
               "gamma1", "gamma2", "clip_weights", "lamda1", "beta"}
    if name != "ftml_update":  # FTML's epsilon is a double in stock
        scalars.add("epsilon")
    import inspect
    defaults = {k: v.default for k, v in inspect.signature(ref).parameters.items() if v.default is not v.empty}
    ref_kw = {k: float(np.float32(v)) if k in scalars and v is not None else v for k, v in {**defaults, **kw}.items()}
    want_w, want_s = ref(w0.astype(np.float64), g0.astype(np.float64), *[s.astype(np.float64) for s in s0], **ref_kw)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == "float32" else dict(rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(w.asnumpy(), want_w, **tol)
    for got, want in zip(states, want_s):
        np.testing.assert_allclose(got.asnumpy(), want, **tol)
    # The gradient is read only.
    np.testing.assert_array_equal(g.asnumpy(), g0)


@pytest.mark.parametrize("name,ref,nstates,positive,kwargs", UPDATES[:4])
def test_update_into_separate_output(name, ref, nstates, positive, kwargs):
    rng = np.random.default_rng(5)
    w0, g0 = rng.standard_normal((4, 3)).astype("float32"), rng.standard_normal((4, 3)).astype("float32")
    s0 = _states(rng, nstates, positive, (4, 3), "float32")
    w, g, states = mx.nd.array(w0), mx.nd.array(g0), [mx.nd.array(s) for s in s0]
    out = getattr(mx.nd, name)(w, g, *states, **kwargs)
    want_w, _ = ref(w0.astype(np.float64), g0.astype(np.float64), *[s.astype(np.float64) for s in s0], **kwargs)
    np.testing.assert_allclose(out.asnumpy(), want_w, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(w.asnumpy(), w0)


def test_update_float16():
    w0 = np.linspace(-1, 1, 16).astype("float16")
    g0 = np.linspace(2, -2, 16).astype("float16")
    w, g, m = mx.nd.array(w0, dtype="float16"), mx.nd.array(g0, dtype="float16"), mx.nd.zeros(16, dtype="float16")
    mx.nd.sgd_mom_update(w, g, m, lr=0.1, momentum=0.9, out=w)
    want, (mom,) = np_sgd_mom(w0.astype(np.float64), g0.astype(np.float64), np.zeros(16), lr=0.1, momentum=0.9)
    np.testing.assert_allclose(w.asnumpy().astype(np.float64), want, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(m.asnumpy().astype(np.float64), mom, rtol=2e-3, atol=2e-3)


def test_repeated_adam_steps_like_the_optimizer():
    # Several steps of the stock optimizer class drive adam_update with out=weight.
    opt = mx.optimizer.Adam(learning_rate=0.05, wd=0.01, clip_gradient=1.0)
    updater = mx.optimizer.get_updater(opt)
    rng = np.random.default_rng(1)
    w0 = rng.standard_normal((6,)).astype("float32")
    w = mx.nd.array(w0)
    ww, mean, var = w0.astype(np.float64), np.zeros(6), np.zeros(6)
    for t in range(1, 6):
        g0 = rng.standard_normal((6,)).astype("float32")
        updater(0, mx.nd.array(g0), w)
        lr = 0.05 * np.sqrt(1 - 0.999**t) / (1 - 0.9**t)
        ww, (mean, var) = np_adam(ww, g0.astype(np.float64), mean, var, lr=lr, wd=0.01, clip_gradient=1.0)
    np.testing.assert_allclose(w.asnumpy(), ww, rtol=1e-4, atol=1e-5)


def test_update_bad_inputs():
    w = mx.nd.ones((3,))
    with pytest.raises(BAD):
        mx.nd.sgd_update(w, mx.nd.ones((4,)), lr=0.1, out=w)
    with pytest.raises(BAD):
        mx.nd.sgd_update(w, mx.nd.ones((3,), dtype="float64"), lr=0.1, out=w)
    with pytest.raises(BAD):
        mx.nd.sgd_update(w, mx.nd.ones((3,)), out=w)  # lr is required
    wi = mx.nd.ones((3,), dtype="int32")
    with pytest.raises(BAD):
        mx.nd.sgd_update(wi, wi, lr=0.1, out=wi).asnumpy()
    with pytest.raises(BAD):
        mx.nd.ftml_update(w, w, w, w, w, lr=0.1)  # t is required


# ---------------------------------------------------------------- mixed precision and multi-weight SGD


@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("clip", [-1.0, 0.2])
def test_mp_sgd_updates(momentum, clip):
    rng = np.random.default_rng(3)
    w32_0 = rng.standard_normal((4, 5)).astype("float32")
    g0 = rng.standard_normal((4, 5)).astype("float16")
    m0 = rng.standard_normal((4, 5)).astype("float32")
    w = mx.nd.array(w32_0, dtype="float16")
    g, w32, mom = mx.nd.array(g0, dtype="float16"), mx.nd.array(w32_0), mx.nd.array(m0)
    kw = dict(lr=0.1, wd=0.01, rescale_grad=0.5, clip_gradient=clip)
    gg = g0.astype(np.float64)
    if momentum:
        mx.nd.mp_sgd_mom_update(w, g, mom, w32, momentum=momentum, out=w, **kw)
        want, (want_m,) = np_sgd_mom(w32_0.astype(np.float64), gg, m0.astype(np.float64), momentum=momentum, **kw)
        np.testing.assert_allclose(mom.asnumpy(), want_m, rtol=1e-5, atol=1e-6)
    else:
        mx.nd.mp_sgd_update(w, g, w32, out=w, **kw)
        want, _ = np_sgd(w32_0.astype(np.float64), gg, **kw)
    np.testing.assert_allclose(w32.asnumpy(), want, rtol=1e-5, atol=1e-6)
    assert w.dtype == np.float16
    np.testing.assert_allclose(w.asnumpy().astype(np.float64), want, rtol=2e-3, atol=2e-3)


def test_mp_nag_mom_update():
    rng = np.random.default_rng(4)
    w32_0, m0 = rng.standard_normal(7).astype("float32"), rng.standard_normal(7).astype("float32")
    g0 = rng.standard_normal(7).astype("float16")
    w, g, mom, w32 = mx.nd.array(w32_0, dtype="float16"), mx.nd.array(g0, dtype="float16"), mx.nd.array(m0), mx.nd.array(w32_0)
    mx.nd.mp_nag_mom_update(w, g, mom, w32, lr=0.1, momentum=0.8, wd=0.01, out=w)
    want, (want_m,) = np_nag_mom(w32_0.astype(np.float64), g0.astype(np.float64), m0.astype(np.float64), lr=0.1, momentum=0.8, wd=0.01)
    np.testing.assert_allclose(w32.asnumpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mom.asnumpy(), want_m, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_multi_sgd_updates(momentum):
    rng = np.random.default_rng(8)
    shapes = [(3, 4), (5,), (2, 2, 2)]
    lrs, wds = (0.1, 0.2, 0.05), (0.0, 0.01, 0.1)
    w0 = [rng.standard_normal(s).astype("float32") for s in shapes]
    g0 = [rng.standard_normal(s).astype("float32") for s in shapes]
    m0 = [rng.standard_normal(s).astype("float32") for s in shapes]
    ws, gs, ms = [mx.nd.array(x) for x in w0], [mx.nd.array(x) for x in g0], [mx.nd.array(x) for x in m0]
    kw = dict(num_weights=3, lrs=lrs, wds=wds, rescale_grad=0.5, clip_gradient=0.3)
    if momentum:
        mx.nd.multi_sgd_mom_update(*[a for t in zip(ws, gs, ms) for a in t], out=ws, momentum=momentum, **kw)
    else:
        mx.nd.multi_sgd_update(*[a for t in zip(ws, gs) for a in t], out=ws, **kw)
    for i in range(3):
        args = dict(lr=lrs[i], wd=wds[i], rescale_grad=0.5, clip_gradient=0.3)
        if momentum:
            want, (want_m,) = np_sgd_mom(w0[i].astype(np.float64), g0[i].astype(np.float64), m0[i].astype(np.float64), momentum=momentum, **args)
            np.testing.assert_allclose(ms[i].asnumpy(), want_m, rtol=1e-5, atol=1e-6)
        else:
            want, _ = np_sgd(w0[i].astype(np.float64), g0[i].astype(np.float64), **args)
        np.testing.assert_allclose(ws[i].asnumpy(), want, rtol=1e-5, atol=1e-6)


def test_multi_mp_sgd_mom_update():
    rng = np.random.default_rng(9)
    shapes = [(6,), (2, 3)]
    w32_0 = [rng.standard_normal(s).astype("float32") for s in shapes]
    g0 = [rng.standard_normal(s).astype("float16") for s in shapes]
    ws = [mx.nd.array(x, dtype="float16") for x in w32_0]
    gs = [mx.nd.array(x, dtype="float16") for x in g0]
    ms = [mx.nd.zeros(s) for s in shapes]
    w32s = [mx.nd.array(x) for x in w32_0]
    mx.nd.multi_mp_sgd_mom_update(*[a for t in zip(ws, gs, ms, w32s) for a in t], out=ws, num_weights=2, lrs=[0.1, 0.2], wds=[0.0, 0.1], momentum=0.5)
    for i in range(2):
        want, (want_m,) = np_sgd_mom(w32_0[i].astype(np.float64), g0[i].astype(np.float64), np.zeros(shapes[i]), lr=[0.1, 0.2][i], wd=[0.0, 0.1][i], momentum=0.5)
        np.testing.assert_allclose(w32s[i].asnumpy(), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ms[i].asnumpy(), want_m, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ws[i].asnumpy().astype(np.float64), want, rtol=2e-3, atol=2e-3)


def test_multi_sgd_bad_params():
    w, g = mx.nd.ones(3), mx.nd.ones(3)
    with pytest.raises(BAD):
        mx.nd.multi_sgd_update(w, g, out=[w], num_weights=1, lrs=(0.1, 0.2), wds=(0.0,))
    with pytest.raises(BAD):
        mx.nd.multi_sgd_update(w, g, w, out=[w], num_weights=1, lrs=(0.1,), wds=(0.0,))
    with pytest.raises(BAD):
        mx.nd.multi_sgd_update(w, mx.nd.ones(4), out=[w], num_weights=1, lrs=(0.1,), wds=(0.0,))
    with pytest.raises(BAD):
        mx.nd.mp_sgd_update(w, g, mx.nd.ones(3, dtype="float64"), lr=0.1, out=w)


def test_sgd_optimizer_class_updates_weights():
    # The stock SGD optimizer aggregates into multi_sgd_mom_update.
    opt = mx.optimizer.create("sgd", learning_rate=0.01, wd=0.001, rescale_grad=0.5, clip_gradient=1.0, momentum=0.9)
    w = mx.nd.ones((3, 4))
    st = opt.create_state_multi_precision(0, w)
    ww, mom = np.ones((3, 4)), np.zeros((3, 4))
    for _ in range(3):
        opt.update_multi_precision(0, w, mx.nd.full((3, 4), 0.3), st)
        ww, (mom,) = np_sgd_mom(ww, np.full((3, 4), 0.3), mom, lr=0.01, wd=0.001, rescale_grad=0.5, clip_gradient=1.0, momentum=0.9)
    np.testing.assert_allclose(w.asnumpy(), ww, rtol=1e-5)
