"""Reductions and index searches through the stock 1.9.1 frontend, against NumPy."""
import numpy as np
import pytest

import mxnet as mx

RNG = np.random.default_rng(11)

REDUCERS = [
    ("sum", np.sum),
    ("mean", np.mean),
    ("prod", np.prod),
    ("max", np.max),
    ("min", np.min),
    ("nansum", np.nansum),
    ("nanprod", np.nanprod),
]

AXES = [None, 0, 1, -1, (0, 2), (1, 2), (0, 1, 2), (-3, -1), ()]


def np_axis(axis, ndim, exclude):
    if axis is None or axis == ():
        return None
    axes = (axis,) if isinstance(axis, int) else axis
    axes = tuple(a % ndim for a in axes)
    if exclude:
        axes = tuple(i for i in range(ndim) if i not in axes)
    return axes


def expected(ref, x, axis, keepdims, exclude):
    ax = np_axis(axis, x.ndim, exclude)
    out = ref(x.astype(np.float64), axis=ax, keepdims=keepdims)
    out = np.asarray(out)
    if out.ndim == 0:
        out = out.reshape((1,) * x.ndim if keepdims else (1,))
    return out


@pytest.mark.parametrize("name,ref", REDUCERS)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions_over_axes(name, ref, keepdims):
    x = RNG.uniform(0.5, 1.5, size=(3, 4, 5)).astype(np.float32)
    if name.startswith("nan"):
        x[0, 1, 2] = np.nan
        x[2, 3, 0] = np.nan
    for axis in AXES:
        for exclude in (False, True):
            kw = dict(keepdims=keepdims, exclude=exclude)
            if axis is not None:
                kw["axis"] = axis
            out = getattr(mx.nd, name)(mx.nd.array(x), **kw)
            want = expected(ref, x, axis, keepdims, exclude)
            assert out.shape == want.shape, (name, axis, keepdims, exclude)
            np.testing.assert_allclose(out.asnumpy(), want, rtol=1e-5, atol=1e-6, err_msg=f"{name} {kw}")


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, np.int64, np.int8])
def test_reduction_dtypes(dtype):
    x = RNG.integers(-4, 5, size=(4, 6)).astype(dtype)
    a = mx.nd.array(x, dtype=dtype)
    for name, ref in [("sum", np.sum), ("max", np.max), ("min", np.min)]:
        out = getattr(mx.nd, name)(a, axis=1)
        assert out.dtype == dtype
        np.testing.assert_allclose(out.asnumpy(), ref(x, axis=1), rtol=1e-3)
    np.testing.assert_allclose(mx.nd.sum(a).asnumpy(), [x.sum()], rtol=1e-3)


def test_size_one_and_aliases():
    x = RNG.uniform(size=(1, 5, 1)).astype(np.float32)
    np.testing.assert_allclose(mx.nd.sum(mx.nd.array(x), axis=0).asnumpy(), x.sum(axis=0), rtol=1e-6)
    np.testing.assert_allclose(mx.nd.sum(mx.nd.array(x), axis=(0, 2)).asnumpy(), x.sum(axis=(0, 2)), rtol=1e-6)
    np.testing.assert_allclose(mx.nd.sum_axis(mx.nd.array(x), axis=1).asnumpy(), x.sum(axis=1), rtol=1e-6)
    np.testing.assert_allclose(mx.nd.max_axis(mx.nd.array(x), axis=1).asnumpy(), x.max(axis=1))
    np.testing.assert_allclose(mx.nd.min_axis(mx.nd.array(x), axis=1).asnumpy(), x.min(axis=1))
    np.testing.assert_allclose(mx.nd.array(x).sum(axis=1, keepdims=True).asnumpy(), x.sum(axis=1, keepdims=True), rtol=1e-6)


def test_max_propagates_nan():
    x = np.array([[1.0, np.nan, 3.0], [4.0, 5.0, 6.0]], dtype=np.float32)
    out = mx.nd.max(mx.nd.array(x), axis=1).asnumpy()
    assert np.isnan(out[0]) and out[1] == 6.0


def test_large_sums_are_accurate_and_parallel():
    x = RNG.uniform(size=(1 << 22,)).astype(np.float32)
    np.testing.assert_allclose(mx.nd.sum(mx.nd.array(x)).asnumpy(), [x.astype(np.float64).sum()], rtol=1e-5)
    m = x.reshape(1024, 4096)
    a = mx.nd.array(m)
    for axis in (0, 1):
        np.testing.assert_allclose(mx.nd.sum(a, axis=axis).asnumpy(), m.astype(np.float64).sum(axis=axis), rtol=1e-4)
        np.testing.assert_allclose(mx.nd.mean(a, axis=axis).asnumpy(), m.astype(np.float64).mean(axis=axis), rtol=1e-4)
        np.testing.assert_allclose(mx.nd.max(a, axis=axis).asnumpy(), m.max(axis=axis))
    t = x.reshape(16, 64, 4096)
    np.testing.assert_allclose(mx.nd.sum(mx.nd.array(t), axis=(0, 2)).asnumpy(), t.astype(np.float64).sum(axis=(0, 2)),
                               rtol=1e-4)
    tall = x.reshape(1 << 20, 4)
    np.testing.assert_allclose(mx.nd.sum(mx.nd.array(tall), axis=0).asnumpy(), tall.astype(np.float64).sum(axis=0),
                               rtol=1e-4)


def test_norm():
    x = RNG.uniform(-2, 2, size=(3, 4, 5)).astype(np.float32)
    a = mx.nd.array(x)
    np.testing.assert_allclose(mx.nd.norm(a).asnumpy(), [np.sqrt((x.astype(np.float64) ** 2).sum())], rtol=1e-5)
    for axis in (0, (1, 2), (0, 1), -1):
        for keepdims in (False, True):
            for ord_ in (1, 2):
                out = mx.nd.norm(a, ord=ord_, axis=axis, keepdims=keepdims)
                ax = axis if isinstance(axis, tuple) else (axis,)
                want = np.abs(x).sum(axis=ax, keepdims=keepdims) if ord_ == 1 else \
                    np.sqrt((x ** 2).sum(axis=ax, keepdims=keepdims))
                np.testing.assert_allclose(out.asnumpy(), want, rtol=1e-5, err_msg=f"{axis} {keepdims} {ord_}")
    with pytest.raises(mx.base.MXNetError, match="ord"):
        mx.nd.norm(a, ord=3).wait_to_read()


def test_argmax_argmin():
    x = RNG.permutation(60).reshape(3, 4, 5).astype(np.float32)
    a = mx.nd.array(x)
    for axis in (0, 1, 2, -1):
        for keepdims in (False, True):
            out = mx.nd.argmax(a, axis=axis, keepdims=keepdims)
            want = np.argmax(x, axis=axis)
            if keepdims:
                want = np.expand_dims(want, axis)
            assert out.dtype == np.float32
            np.testing.assert_array_equal(out.asnumpy(), want)
            want = np.argmin(x, axis=axis)
            if keepdims:
                want = np.expand_dims(want, axis)
            np.testing.assert_array_equal(mx.nd.argmin(a, axis=axis, keepdims=keepdims).asnumpy(), want)
    np.testing.assert_array_equal(mx.nd.argmax(a).asnumpy(), [np.argmax(x)])
    m = x.reshape(12, 5)
    np.testing.assert_array_equal(mx.nd.argmax_channel(mx.nd.array(m)).asnumpy(), np.argmax(m, axis=1))
    ties = mx.nd.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]])
    np.testing.assert_array_equal(mx.nd.argmax(ties, axis=1).asnumpy(), [1, 0])
    xi = np.array([[3, 9, 2], [7, 1, 8]], dtype=np.int32)
    out = mx.nd.argmin(mx.nd.array(xi, dtype=np.int32), axis=0)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out.asnumpy(), [0, 1, 0])


def test_bad_axes():
    a = mx.nd.ones((2, 3))
    with pytest.raises(mx.base.MXNetError, match="axis 2"):
        mx.nd.sum(a, axis=2).wait_to_read()
    with pytest.raises(mx.base.MXNetError, match="out of range"):
        mx.nd.argmax(a, axis=-3).wait_to_read()
    with pytest.raises(mx.base.MXNetError, match="more than once"):
        mx.nd.sum(a, axis=(0, -2)).wait_to_read()
    with pytest.raises(mx.base.MXNetError, match="keepdims"):
        mx.nd.sum(a, keepdims="maybe")
    with pytest.raises(mx.base.MXNetError, match="axis"):
        mx.nd.mean(a, axis="x")
