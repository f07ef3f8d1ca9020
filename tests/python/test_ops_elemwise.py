"""Element-wise, scalar and broadcast operators through the stock 1.9.1 frontend, against NumPy."""
import numpy as np
import pytest

import mxnet as mx

RNG = np.random.default_rng(7)


def rand(shape, dtype=np.float32, lo=-3.0, hi=3.0):
    return (RNG.uniform(lo, hi, size=shape)).astype(dtype)


def mxmod(a, b):
    """MXNet's mod: the divisor's sign, x mod 0 = 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.mod(a, b)
    return np.where(b == 0, 0, r).astype(a.dtype)


BINARY = [
    # (elemwise op, broadcast op, numpy function)
    ("elemwise_add", "broadcast_add", np.add),
    ("elemwise_sub", "broadcast_sub", np.subtract),
    ("elemwise_mul", "broadcast_mul", np.multiply),
    ("elemwise_div", "broadcast_div", np.divide),
    ("_mod", "broadcast_mod", mxmod),
    ("_power", "broadcast_power", np.power),
    ("_maximum", "broadcast_maximum", np.maximum),
    ("_minimum", "broadcast_minimum", np.minimum),
    ("_hypot", "broadcast_hypot", np.hypot),
    ("_equal", "broadcast_equal", np.equal),
    ("_not_equal", "broadcast_not_equal", np.not_equal),
    ("_greater", "broadcast_greater", np.greater),
    ("_greater_equal", "broadcast_greater_equal", np.greater_equal),
    ("_lesser", "broadcast_lesser", np.less),
    ("_lesser_equal", "broadcast_lesser_equal", np.less_equal),
    ("_logical_and", "broadcast_logical_and", np.logical_and),
    ("_logical_or", "broadcast_logical_or", np.logical_or),
    ("_logical_xor", "broadcast_logical_xor", np.logical_xor),
]


def operands(name, shape_a, shape_b, dtype):
    if name in ("_power", "broadcast_power"):
        a, b = rand(shape_a, dtype, 0.5, 2.0), rand(shape_b, dtype, -2.0, 2.0)
    else:
        a, b = rand(shape_a, dtype), rand(shape_b, dtype)
    if name in ("_equal", "broadcast_equal", "_not_equal", "broadcast_not_equal", "_logical_and", "broadcast_logical_and",
                "_logical_or", "broadcast_logical_or", "_logical_xor", "broadcast_logical_xor",
                "_greater_equal", "broadcast_greater_equal", "_lesser_equal", "broadcast_lesser_equal"):
        a, b = np.round(a), np.round(b)  # ties and zeros occur
    return a, b


def get_op(name):
    return getattr(mx.nd, name, None) or getattr(mx.nd._internal, name)


@pytest.mark.parametrize("ew,bc,ref", BINARY)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_binary_same_shape_and_broadcast(ew, bc, ref, dtype):
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    a, b = operands(ew, (4, 5), (4, 5), dtype)
    out = get_op(ew)(mx.nd.array(a, dtype=dtype), mx.nd.array(b, dtype=dtype))
    assert out.dtype == dtype and out.shape == (4, 5)
    np.testing.assert_allclose(out.asnumpy(), ref(a, b).astype(dtype), **tol)
    for sa, sb in [((2, 3, 4), (3, 1)), ((1, 5), (4, 1)), ((3, 1, 2), (1, 4, 1)), ((6,), (1,)), ((2, 3), (2, 3)),
                   ((257, 33), (33,)), ((1,), (3, 1, 2))]:
        a, b = operands(bc, sa, sb, dtype)
        out = get_op(bc)(mx.nd.array(a, dtype=dtype), mx.nd.array(b, dtype=dtype))
        want = ref(a, b).astype(dtype)
        assert out.shape == want.shape, (bc, sa, sb)
        np.testing.assert_allclose(out.asnumpy(), want, **tol)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8, np.uint8, np.float16])
def test_binary_other_dtypes(dtype):
    lo, hi = (0, 10) if dtype == np.uint8 else (-10, 10)
    a = RNG.integers(lo, hi, size=(3, 4)).astype(dtype)
    b = RNG.integers(1, 5, size=(3, 4)).astype(dtype)
    x, y = mx.nd.array(a, dtype=dtype), mx.nd.array(b, dtype=dtype)
    tol = dict(rtol=1e-3) if dtype == np.float16 else dict(rtol=0)
    np.testing.assert_allclose((x + y).asnumpy(), a + b, **tol)
    np.testing.assert_allclose((x * y).asnumpy(), a * b, **tol)
    np.testing.assert_allclose((x - y).asnumpy(), (a - b).astype(dtype), **tol)
    np.testing.assert_allclose((x % y).asnumpy(), mxmod(a, b), **tol)
    np.testing.assert_allclose(mx.nd.broadcast_maximum(x, y[0:1]).asnumpy(), np.maximum(a, b[0:1]), **tol)
    np.testing.assert_allclose((x > y).asnumpy(), (a > b).astype(dtype))
    if dtype != np.float16:
        # Integer division truncates toward zero (C semantics).
        np.testing.assert_array_equal((x / y).asnumpy(), np.trunc(a / b).astype(dtype))
        assert (x / y).dtype == dtype


def test_int_wraps_and_divides_by_zero():
    a = mx.nd.array([100, -100, 7], dtype=np.int8)
    np.testing.assert_array_equal((a + a).asnumpy(), np.array([-56, 56, 14], dtype=np.int8))
    z = mx.nd.zeros((3,), dtype=np.int32)
    np.testing.assert_array_equal((mx.nd.array([1, 2, 3], dtype=np.int32) / z).asnumpy(), [0, 0, 0])


SCALAR = [
    ("_plus_scalar", lambda x, s: x + s),
    ("_minus_scalar", lambda x, s: x - s),
    ("_rminus_scalar", lambda x, s: s - x),
    ("_mul_scalar", lambda x, s: x * s),
    ("_div_scalar", lambda x, s: x / s),
    ("_rdiv_scalar", lambda x, s: s / x),
    ("_mod_scalar", lambda x, s: mxmod(x, np.full_like(x, s))),
    ("_rmod_scalar", lambda x, s: mxmod(np.full_like(x, s), x)),
    ("_power_scalar", lambda x, s: np.abs(x) ** s),
    ("_rpower_scalar", lambda x, s: s ** x),
    ("_maximum_scalar", np.maximum),
    ("_minimum_scalar", np.minimum),
    ("_hypot_scalar", np.hypot),
    ("_equal_scalar", np.equal),
    ("_not_equal_scalar", np.not_equal),
    ("_greater_scalar", np.greater),
    ("_greater_equal_scalar", np.greater_equal),
    ("_lesser_scalar", np.less),
    ("_lesser_equal_scalar", np.less_equal),
    ("_logical_and_scalar", np.logical_and),
    ("_logical_or_scalar", np.logical_or),
    ("_logical_xor_scalar", np.logical_xor),
]


@pytest.mark.parametrize("name,ref", SCALAR)
def test_scalar_ops(name, ref):
    x = np.round(rand((5, 7)), 1)
    x[x == 0] = 0.5
    if name == "_power_scalar":
        x = np.abs(x)
    for s in (2.0, -1.5, 0.0):
        if s == 0.0 and name in ("_rdiv_scalar",):
            continue
        out = getattr(mx.nd._internal, name)(mx.nd.array(x), scalar=s)
        assert out.dtype == np.float32
        np.testing.assert_allclose(out.asnumpy(), ref(x, np.float32(s)).astype(np.float32), rtol=1e-5, atol=1e-5,
                                   err_msg=f"{name} scalar={s}")


def test_scalar_cast_to_int_dtype():
    x = mx.nd.array([1, 2, 3], dtype=np.int32)
    # The scalar is cast to the input dtype first (2.7 -> 2).
    np.testing.assert_array_equal(mx.nd._internal._plus_scalar(x, scalar=2.7).asnumpy(), [3, 4, 5])
    np.testing.assert_array_equal(mx.nd._internal._greater_scalar(x, scalar=1.5).asnumpy(), [0, 1, 1])


def test_frontend_arithmetic_and_inplace():
    a = rand((3, 4))
    b = rand((1, 4))
    x, y = mx.nd.array(a), mx.nd.array(b)
    np.testing.assert_allclose((x + y).asnumpy(), a + b, rtol=1e-6)
    np.testing.assert_allclose((2 - x).asnumpy(), 2 - a, rtol=1e-6)
    np.testing.assert_allclose((-x).asnumpy(), -a)
    np.testing.assert_allclose((x ** 2).asnumpy(), a ** 2, rtol=1e-6)
    np.testing.assert_allclose((2 ** y).asnumpy(), 2 ** b, rtol=1e-6)
    np.testing.assert_allclose((x == x).asnumpy(), np.ones_like(a))
    np.testing.assert_allclose((x != 0.5).asnumpy(), (a != 0.5).astype(np.float32))
    z = mx.nd.array(a)
    z += y
    np.testing.assert_allclose(z.asnumpy(), a + b, rtol=1e-6)
    z *= 2
    np.testing.assert_allclose(z.asnumpy(), (a + b) * 2, rtol=1e-6)
    z -= 1
    z /= 4
    np.testing.assert_allclose(z.asnumpy(), ((a + b) * 2 - 1) / 4, rtol=1e-6)


def test_aliases_resolve():
    x, y = mx.nd.array([1.0, 2.0]), mx.nd.array([3.0, 5.0])
    for alias, want in [("_plus", [4, 7]), ("_Minus", [-2, -3]), ("_Mul", [3, 10]), ("broadcast_plus", [4, 7]),
                        ("broadcast_minus", [-2, -3]), ("_Greater", [0, 0]), ("_Maximum", [3, 5])]:
        op = getattr(mx.nd._internal, alias, None) or getattr(mx.nd, alias)
        np.testing.assert_allclose(op(x, y).asnumpy(), want, err_msg=alias)


def test_binary_errors():
    with pytest.raises(mx.base.MXNetError, match="cannot be broadcast"):
        mx.nd.broadcast_add(mx.nd.ones((2, 3)), mx.nd.ones((4, 3))).wait_to_read()
    with pytest.raises(mx.base.MXNetError, match="shape"):
        mx.nd.elemwise_add(mx.nd.ones((2, 3)), mx.nd.ones((3, 2))).wait_to_read()
    with pytest.raises(mx.base.MXNetError, match="dtype"):
        mx.nd.broadcast_mul(mx.nd.ones((2,)), mx.nd.ones((2,), dtype=np.int32)).wait_to_read()
    with pytest.raises(mx.base.MXNetError, match="scalar"):
        mx.nd._internal._plus_scalar(mx.nd.ones((2,)), scalar="abc")


UNARY = [
    ("negative", np.negative, (-3, 3)),
    ("abs", np.abs, (-3, 3)),
    ("sign", np.sign, (-3, 3)),
    ("ceil", np.ceil, (-3, 3)),
    ("floor", np.floor, (-3, 3)),
    ("trunc", np.trunc, (-3, 3)),
    ("fix", np.fix, (-3, 3)),
    ("rint", np.rint, (-3, 3)),
    ("square", np.square, (-3, 3)),
    ("sqrt", np.sqrt, (0.1, 4)),
    ("rsqrt", lambda v: 1 / np.sqrt(v), (0.1, 4)),
    ("cbrt", np.cbrt, (-4, 4)),
    ("rcbrt", lambda v: 1 / np.cbrt(v), (0.1, 4)),
    ("exp", np.exp, (-3, 3)),
    ("expm1", np.expm1, (-3, 3)),
    ("log", np.log, (0.1, 4)),
    ("log10", np.log10, (0.1, 4)),
    ("log2", np.log2, (0.1, 4)),
    ("log1p", np.log1p, (-0.5, 4)),
    ("sin", np.sin, (-3, 3)),
    ("cos", np.cos, (-3, 3)),
    ("tan", np.tan, (-1, 1)),
    ("arcsin", np.arcsin, (-0.9, 0.9)),
    ("arccos", np.arccos, (-0.9, 0.9)),
    ("arctan", np.arctan, (-3, 3)),
    ("sinh", np.sinh, (-3, 3)),
    ("cosh", np.cosh, (-3, 3)),
    ("tanh", np.tanh, (-3, 3)),
    ("arcsinh", np.arcsinh, (-3, 3)),
    ("arccosh", np.arccosh, (1.1, 4)),
    ("arctanh", np.arctanh, (-0.9, 0.9)),
    ("degrees", np.degrees, (-3, 3)),
    ("radians", np.radians, (-3, 3)),
    ("reciprocal", np.reciprocal, (0.2, 3)),
    ("relu", lambda v: np.maximum(v, 0), (-3, 3)),
    ("sigmoid", lambda v: 1 / (1 + np.exp(-v)), (-3, 3)),
    ("softsign", lambda v: v / (1 + np.abs(v)), (-3, 3)),
    ("logical_not", lambda v: (v == 0).astype(v.dtype), (-1, 1)),
    ("_copy", lambda v: v, (-3, 3)),
    ("BlockGrad", lambda v: v, (-3, 3)),
    ("stop_gradient", lambda v: v, (-3, 3)),
]


@pytest.mark.parametrize("name,ref,rng", UNARY)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_unary(name, ref, rng, dtype):
    x = rand((6, 9), np.float64, *rng)
    if name == "logical_not":
        x = np.round(x)
    x = x.astype(dtype)
    op = getattr(mx.nd, name, None) or getattr(mx.nd._internal, name)
    out = op(mx.nd.array(x, dtype=dtype))
    assert out.dtype == dtype and out.shape == x.shape
    want = ref(x.astype(np.float64)).astype(dtype)
    tol = {np.float32: 1e-5, np.float64: 1e-12, np.float16: 2e-3}[dtype]
    np.testing.assert_allclose(out.asnumpy().astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)


def test_round_half_away_from_zero():
    x = mx.nd.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 2.4])
    np.testing.assert_array_equal(mx.nd.round(x).asnumpy(), [-3, -2, -1, 1, 2, 3, 2])
    np.testing.assert_array_equal(mx.nd.rint(x).asnumpy(), [-2, -2, -0, 0, 2, 2, 2])


def test_unary_int_dtypes():
    a = np.array([-7, -1, 0, 3, 100], dtype=np.int64) * (2 ** 40) + 1
    x = mx.nd.array(a, dtype=np.int64)
    # Rounding is exact on large integers.
    for op in ("ceil", "floor", "round", "trunc", "fix", "rint"):
        np.testing.assert_array_equal(getattr(mx.nd, op)(x).asnumpy(), a, err_msg=op)
    np.testing.assert_array_equal(mx.nd.abs(x).asnumpy(), np.abs(a))
    np.testing.assert_array_equal(mx.nd.negative(x).asnumpy(), -a)
    small = mx.nd.array([0, 1, 4, 9], dtype=np.int32)
    np.testing.assert_array_equal(mx.nd.sqrt(small).asnumpy(), [0, 1, 2, 3])
    assert mx.nd.sqrt(small).dtype == np.int32
    np.testing.assert_array_equal(mx.nd.sign(mx.nd.array([-3, 0, 5], dtype=np.int32)).asnumpy(), [-1, 0, 1])


def test_unary_bool_is_type_error():
    b = mx.nd.array([1, 0], dtype=np.bool_)
    with pytest.raises(mx.base.MXNetError, match="bool"):
        mx.nd.exp(b).wait_to_read()


def test_clip():
    x = rand((4, 5))
    np.testing.assert_allclose(mx.nd.clip(mx.nd.array(x), -1, 0.5).asnumpy(), np.clip(x, -1, 0.5))
    np.testing.assert_allclose(mx.nd.array(x).clip(0.25, 0.75).asnumpy(), np.clip(x, 0.25, 0.75))
    xi = np.arange(-5, 5, dtype=np.int32)
    np.testing.assert_array_equal(mx.nd.clip(mx.nd.array(xi, dtype=np.int32), -2, 3).asnumpy(), np.clip(xi, -2, 3))
    with pytest.raises(mx.base.MXNetError, match="a_max"):
        mx.nd.clip(mx.nd.array(x), a_min=0)
    # Stock tests the upper bound first (so a_min > a_max gives a_max above it, a_min below),
    # and NaN passes through; a large mixed array takes the vectorised path.
    big = np.random.RandomState(3).uniform(-3, 3, 1 << 16).astype(np.float32)
    big[::97] = np.nan
    got = mx.nd.clip(mx.nd.array(big), 2, 1).asnumpy()
    np.testing.assert_array_equal(got, np.where(big > 1, 1, np.where(big < 2, 2, big)))
    got = mx.nd.clip(mx.nd.array(big), -1, 1).asnumpy()
    np.testing.assert_array_equal(got, np.where(big > 1, 1, np.where(big < -1, -1, big)))


def test_large_parallel_arrays():
    a = rand((1 << 20,))
    b = rand((1 << 20,))
    x, y = mx.nd.array(a), mx.nd.array(b)
    np.testing.assert_allclose((x * y + 1).asnumpy(), a * b + 1, rtol=1e-6)
    m = rand((512, 1024))
    r = rand((1, 1024))
    np.testing.assert_allclose(mx.nd.broadcast_sub(mx.nd.array(m), mx.nd.array(r)).asnumpy(), m - r, rtol=1e-6)
    c = rand((512, 1))
    np.testing.assert_allclose(mx.nd.broadcast_div(mx.nd.array(m), mx.nd.array(c)).asnumpy(), m / c, rtol=1e-5)
    np.testing.assert_allclose(mx.nd.exp(mx.nd.array(m)).asnumpy(), np.exp(m), rtol=1e-5)
