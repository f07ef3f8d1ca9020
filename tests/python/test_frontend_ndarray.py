"""NDArray programs through the unchanged stock MXNet 1.9.1 frontend, checked against NumPy:
creation, arithmetic (reflected and in-place too), broadcasting, comparisons, shape methods,
reductions, dot, conversions, copies and synchronisation."""
import mxnet as mx
import numpy as np
import pytest


def rand(shape, dtype="float32", seed=0):
    return np.random.default_rng(seed).uniform(-3, 3, size=shape).astype(dtype)


def same(got, want, rtol=1e-6, atol=1e-6):
    assert isinstance(got, mx.nd.NDArray), type(got)
    g = got.asnumpy()
    want = np.asarray(want)
    assert g.shape == want.shape, (g.shape, want.shape)
    assert g.dtype == want.dtype, (g.dtype, want.dtype)
    np.testing.assert_allclose(g.astype("float64"), want.astype("float64"), rtol=rtol, atol=atol)


# ---- creation ----

@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "uint8", "int32", "int8", "int64"])
def test_array_from_numpy_and_lists(dtype):
    x = (np.arange(24).reshape(2, 3, 4) % 7).astype(dtype)
    a = mx.nd.array(x, dtype=dtype)
    assert a.shape == (2, 3, 4) and a.dtype == np.dtype(dtype) and a.size == 24 and a.ndim == 3
    assert a.context == mx.cpu()
    same(a, x)
    same(mx.nd.array(x.tolist(), dtype=dtype), x)


def test_array_default_dtype_is_float32():
    same(mx.nd.array([[1, 2], [3, 4]]), np.array([[1, 2], [3, 4]], dtype="float32"))
    same(mx.nd.array(np.arange(3, dtype="float64")), np.arange(3, dtype="float32"))
    same(mx.nd.array(mx.nd.array([1.5, 2.5])), np.array([1.5, 2.5], dtype="float32"))


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "uint8"])
def test_zeros_ones_full(dtype):
    same(mx.nd.zeros((2, 3), dtype=dtype), np.zeros((2, 3), dtype))
    same(mx.nd.ones((4,), dtype=dtype), np.ones((4,), dtype))
    same(mx.nd.full((3, 2), 7, dtype=dtype), np.full((3, 2), 7, dtype))
    same(mx.nd.zeros_like(mx.nd.ones((2, 2), dtype=dtype)), np.zeros((2, 2), dtype))
    same(mx.nd.ones_like(mx.nd.zeros((2, 2), dtype=dtype)), np.ones((2, 2), dtype))
    same(mx.nd.zeros(5, dtype=dtype), np.zeros(5, dtype))


def test_arange_variants():
    same(mx.nd.arange(5), np.arange(5, dtype="float32"))
    same(mx.nd.arange(2, 11, 3), np.arange(2, 11, 3, dtype="float32"))
    same(mx.nd.arange(1, -2, -0.5), np.arange(1, -2, -0.5, dtype="float32"))
    same(mx.nd.arange(0, 4, repeat=2), np.repeat(np.arange(4, dtype="float32"), 2))
    same(mx.nd.arange(6, dtype="int32"), np.arange(6, dtype="int32"))
    same(mx.nd.arange(0, 1, 0.25, dtype="float64"), np.arange(0, 1, 0.25))


def test_empty_then_assign():
    a = mx.nd.empty((2, 3))
    assert a.shape == (2, 3) and a.dtype == np.float32
    a[:] = 4.5
    same(a, np.full((2, 3), 4.5, "float32"))
    b = mx.nd.empty((2, 3), dtype="int32")
    b[:] = np.arange(6).reshape(2, 3)
    same(b, np.arange(6, dtype="int32").reshape(2, 3))


def test_linspace_eye():
    same(mx.nd.linspace(0, 1, 5), np.linspace(0, 1, 5, dtype="float32"))
    same(mx.nd.eye(3, 4, k=1), np.eye(3, 4, k=1, dtype="float32"))


# ---- arithmetic ----

BINARY = [
    ("+", lambda a, b: a + b), ("-", lambda a, b: a - b), ("*", lambda a, b: a * b),
    ("/", lambda a, b: a / b), ("**", lambda a, b: abs(a) ** b), ("%", lambda a, b: a % b),
]


@pytest.mark.parametrize("name,f", BINARY, ids=[b[0] for b in BINARY])
def test_binary_arrays_and_scalars(name, f):
    x, y = rand((3, 4), seed=1), rand((3, 4), seed=2) + 5  # y > 0 for % and /
    a, b = mx.nd.array(x), mx.nd.array(y)
    tol = dict(rtol=1e-5, atol=1e-5)
    same(f(a, b), f(x, y), **tol)
    same(f(a, 2.5), f(x, np.float32(2.5)), **tol)
    if name != "**":
        same(f(3.0, b), f(np.float32(3.0), y), **tol)  # reflected
    else:
        same(2.0 ** a, np.float32(2.0) ** x, **tol)
    same(f(a, 2), f(x, np.float32(2)), **tol)


def test_unary_and_neg_abs():
    x = rand((2, 5), seed=3)
    a = mx.nd.array(x)
    same(-a, -x)
    same(abs(a), np.abs(x))
    same(a.exp(), np.exp(x), rtol=1e-5)
    same(mx.nd.sqrt(abs(a)), np.sqrt(np.abs(x)), rtol=1e-5)
    same(a.square(), x * x, rtol=1e-5)
    same(mx.nd.sign(a), np.sign(x))
    same(a.clip(-1, 1), np.clip(x, -1, 1))
    same(mx.nd.round(a), np.round(x))
    same(mx.nd.floor(a), np.floor(x))


def test_inplace_operators_keep_identity():
    x = rand((3, 3), seed=4)
    a = mx.nd.array(x)
    orig = a
    a += 1
    a -= mx.nd.ones((3, 3)) * 0.5
    a *= 2
    a /= 4
    assert a is orig
    same(a, ((x + 1 - 0.5) * 2) / 4, rtol=1e-6)
    b = mx.nd.array(x + 10)
    b %= 3
    same(b, np.mod(x + 10, np.float32(3)), rtol=1e-5, atol=1e-5)
    # in-place through a view changes the base
    c = mx.nd.zeros((4, 2))
    v = c[1:3]
    v += 5
    same(c, np.array([[0, 0], [5, 5], [5, 5], [0, 0]], "float32"))


def test_integer_arithmetic():
    x = np.array([[7, -8, 9], [10, 11, -12]], "int32")
    a = mx.nd.array(x, dtype="int32")
    same(a + a, x + x)
    same(a * 3, x * 3)
    same(a - 1, x - 1)
    assert (a / 2).dtype == np.int32


@pytest.mark.parametrize("sa,sb", [((3, 1), (1, 4)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)), ((5,), (1,))])
def test_broadcasting(sa, sb):
    x, y = rand(sa, seed=5), rand(sb, seed=6)
    a, b = mx.nd.array(x), mx.nd.array(y)
    if len(sa) == len(sb):
        same(a + b, x + y)   # NDArray operators broadcast since 1.x
    same(mx.nd.broadcast_add(a, b), x + y)
    same(mx.nd.broadcast_mul(a, b), x * y)
    same(mx.nd.broadcast_maximum(a, b), np.maximum(x, y))
    same(a.broadcast_to(np.broadcast(x, y).shape), np.broadcast_to(x, np.broadcast(x, y).shape))


def test_operator_broadcast_different_ndim():
    x, y = rand((2, 3, 4), seed=7), rand((3, 4), seed=8)
    same(mx.nd.array(x) * mx.nd.array(y), x * y)


def test_comparisons():
    x = np.array([[1, 2, 3], [4, 5, 6]], "float32")
    y = np.array([[3, 2, 1], [4, 0, 9]], "float32")
    a, b = mx.nd.array(x), mx.nd.array(y)
    for op in ["__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"]:
        same(getattr(a, op)(b), getattr(x, op)(y).astype("float32"))
        same(getattr(a, op)(3), getattr(x, op)(3).astype("float32"))
    same(3 < a, (3 < x).astype("float32"))
    same(mx.nd.maximum(a, b), np.maximum(x, y))
    same(mx.nd.minimum(a, 2.5), np.minimum(x, 2.5))
    same(mx.nd.broadcast_equal(a, mx.nd.array([[4], [5]])), (x == np.array([[4], [5]])).astype("float32"))
    same(mx.nd.logical_and(a > 2, b > 2), ((x > 2) & (y > 2)).astype("float32"))


# ---- shapes ----

def test_reshape_transpose_expand_flatten():
    x = rand((2, 3, 4), seed=9)
    a = mx.nd.array(x)
    same(a.reshape((4, 6)), x.reshape(4, 6))
    same(a.reshape(4, -1), x.reshape(4, -1))
    same(a.reshape((0, -1)), x.reshape(2, 12))
    same(a.reshape((-2,)), x)
    same(a.reshape((-3, 4)), x.reshape(6, 4))
    same(a.reshape((-4, 1, 2, 0, 4)), x.reshape(1, 2, 3, 4))
    same(a.T, x.T)
    same(a.transpose(), x.transpose())
    same(a.transpose((1, 0, 2)), x.transpose(1, 0, 2))
    same(a.expand_dims(1), np.expand_dims(x, 1))
    same(a.expand_dims(-1), np.expand_dims(x, -1))
    same(a.flatten(), x.reshape(2, 12))
    same(mx.nd.flatten(a), x.reshape(2, 12))
    same(a.swapaxes(0, 2), x.swapaxes(0, 2))
    same(a.expand_dims(0).squeeze(), x)
    same(a.reshape_like(mx.nd.zeros((6, 4))), x.reshape(6, 4))
    same(mx.nd.concat(a, a, dim=1), np.concatenate([x, x], 1))
    same(mx.nd.stack(a, a, axis=0), np.stack([x, x]))
    parts = mx.nd.split(a, num_outputs=2, axis=2)
    same(parts[1], x[:, :, 2:])
    same(a.tile((1, 2, 1)), np.tile(x, (1, 2, 1)))
    same(a.repeat(2, axis=0), np.repeat(x, 2, 0))
    same(a.flip(axis=1), x[:, ::-1])


def test_reshape_shares_memory():
    a = mx.nd.zeros((2, 3))
    b = a.reshape((3, 2))
    b[:] = 7
    same(a, np.full((2, 3), 7, "float32"))


# ---- reductions ----

@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 2)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions(axis, keepdims):
    x = rand((2, 3, 4), seed=10)
    a = mx.nd.array(x)
    kw = {} if axis is None else {"axis": axis}
    for name, npf in [("sum", np.sum), ("mean", np.mean), ("max", np.max), ("min", np.min), ("prod", np.prod)]:
        want = npf(x, axis=axis, keepdims=keepdims)
        if axis is None and not keepdims:
            want = want.reshape(1)  # 1.9.1 returns shape (1,) for a full reduction
        same(getattr(a, name)(keepdims=keepdims, **kw), np.asarray(want, "float32"), rtol=1e-5, atol=1e-5)
    if axis is not None and not isinstance(axis, tuple):
        same(a.argmax(axis=axis, keepdims=keepdims), np.asarray(np.expand_dims(x.argmax(axis), axis) if keepdims else x.argmax(axis), "float32"))
        same(a.argmin(axis=axis), x.argmin(axis).astype("float32"))


def test_norm_topk_sort():
    x = rand((3, 5), seed=11)
    a = mx.nd.array(x)
    same(a.norm(), np.array([np.linalg.norm(x)], "float32"), rtol=1e-5)
    same(mx.nd.norm(a, ord=1, axis=1), np.abs(x).sum(1), rtol=1e-5)
    same(a.sort(axis=1), np.sort(x, 1))
    same(a.argsort(axis=1), np.argsort(x, 1).astype("float32"))
    same(a.topk(k=2, axis=1, ret_typ="value"), -np.sort(-x, 1)[:, :2])
    same(mx.nd.sum(a, axis=1, exclude=True), x.sum(0), rtol=1e-5)


# ---- dot ----

def test_dot_and_batch_dot():
    x, y = rand((3, 4), seed=12), rand((4, 5), seed=13)
    a, b = mx.nd.array(x), mx.nd.array(y)
    same(mx.nd.dot(a, b), x @ y, rtol=1e-5, atol=1e-5)
    same(mx.nd.dot(a, a, transpose_b=True), x @ x.T, rtol=1e-5, atol=1e-5)
    same(mx.nd.dot(a, a, transpose_a=True), x.T @ x, rtol=1e-5, atol=1e-5)
    v = rand((4,), seed=14)
    same(mx.nd.dot(a, mx.nd.array(v)), x @ v, rtol=1e-5, atol=1e-5)
    p, q = rand((2, 3, 4), seed=15), rand((2, 4, 2), seed=16)
    same(mx.nd.batch_dot(mx.nd.array(p), mx.nd.array(q)), p @ q, rtol=1e-5, atol=1e-5)
    d = mx.nd.dot(mx.nd.array(x, dtype="float64"), mx.nd.array(y, dtype="float64"))
    same(d, x.astype("float64") @ y.astype("float64"), rtol=1e-6)


# ---- conversions, copies, synchronisation ----

def test_asnumpy_asscalar_and_python_conversions():
    a = mx.nd.array([1.5])
    assert a.asscalar() == 1.5 and isinstance(a.asscalar(), np.float32)
    assert bool(mx.nd.array([1])) and not bool(mx.nd.array([0]))
    assert mx.nd.array([2], dtype="int64").asscalar() == 2
    with pytest.raises(ValueError):
        mx.nd.array([1, 2]).asscalar()
    with pytest.raises(ValueError):
        bool(mx.nd.array([1, 2]))
    assert len(mx.nd.zeros((4, 2))) == 4
    x = rand((2, 3), seed=17)
    assert np.array_equal(mx.nd.array(x).asnumpy(), x)
    assert [row.shape for row in mx.nd.array(x)] == [(3,), (3,)]


def test_copy_copyto_as_in_context():
    x = rand((3, 2), seed=18)
    a = mx.nd.array(x)
    b = a.copy()
    b += 1
    same(a, x)
    c = mx.nd.zeros((3, 2))
    r = a.copyto(c)
    assert r is c
    same(c, x)
    d = a.copyto(mx.cpu())
    assert d is not a and d.context == mx.cpu()
    same(d, x)
    assert a.as_in_context(mx.cpu()) is a
    assert a.as_in_context(mx.cpu(0)) is a
    e = mx.nd.zeros((3, 2), dtype="float64")
    a.copyto(e)
    same(e, x.astype("float64"))
    f = mx.nd.zeros((3, 2), ctx=mx.cpu(1))
    assert f.context == mx.cpu(1)
    same(a.as_in_context(mx.cpu(1)), x)


@pytest.mark.parametrize("dst", ["float64", "float16", "int32", "uint8", "int8", "int64", "bool"])
def test_astype(dst):
    x = np.array([[0.0, 1.7, 2.2], [3.5, 100.0, 0.0]], "float32")
    a = mx.nd.array(x)
    got = a.astype(dst)
    assert got.dtype == np.dtype(dst)
    same(got, x.astype(dst), rtol=1e-3)
    assert a.astype("float32", copy=False) is a
    assert a.astype("float32") is not a


def test_wait_to_read_and_waitall():
    a = mx.nd.ones((100, 100))
    for _ in range(20):
        a = a * 1.01
    a.wait_to_read()
    mx.nd.waitall()
    same(a, np.full((100, 100), 1.01 ** 20, "float32"), rtol=1e-5)


def test_out_argument_and_context_manager():
    a = mx.nd.ones((2, 2))
    out = mx.nd.zeros((2, 2))
    r = mx.nd.elemwise_add(a, a, out=out)
    assert r is out
    same(out, np.full((2, 2), 2, "float32"))
    with mx.cpu(0):
        z = mx.nd.zeros((1,))
    assert z.context == mx.cpu(0)
    assert mx.current_context() == mx.cpu()


def test_repr_and_str():
    a = mx.nd.array([[1, 2], [3, 4]])
    assert "<NDArray 2x2 @cpu(0)>" in repr(a)
    assert "[[1. 2.]" in str(a)


def test_large_elementwise_chain_matches_numpy():
    x = rand((512, 257), seed=19)
    a = mx.nd.array(x)
    got = ((a * 2 + 1) / 3 - a).relu().sum(axis=1)
    same(got, np.maximum((x * 2 + 1) / 3 - x, 0).sum(1), rtol=1e-4, atol=1e-4)
