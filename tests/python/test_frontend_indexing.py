"""NDArray indexing and slice assignment through the unchanged stock 1.9.1 frontend, against
NumPy: basic indices (views), the advanced indices the frontend maps to operators (take,
gather_nd, boolean masks via contrib ops) and `__setitem__` with scalars, arrays and NumPy."""
import mxnet as mx
import numpy as np
import pytest

X = np.arange(60, dtype="float32").reshape(3, 4, 5)


def same(got, want):
    g = got.asnumpy() if isinstance(got, mx.nd.NDArray) else np.asarray(got)
    want = np.asarray(want)
    assert g.shape == want.shape, (g.shape, want.shape)
    np.testing.assert_array_equal(g, want)


BASIC = [
    1, -1, slice(1, 3), slice(None, None, -1), slice(None, None, 2), slice(-2, None), slice(3, 1, -1),
    (1, 2), (slice(None), 2), (slice(None), slice(1, 3)), (1, slice(None), -1), (slice(0, 3, 2), 1, slice(None, None, -2)),
    (Ellipsis, 1), (None, 1), (slice(None), None, 2), (slice(5, 9),), (slice(3, 1),),
]


@pytest.mark.parametrize("key", BASIC, ids=[repr(k) for k in BASIC])
def test_basic_indexing(key):
    same(mx.nd.array(X)[key], X[key])


@pytest.mark.parametrize("key", [
    [0, 2], [[0, 2], [1, 1]], np.array([2, 0]), (slice(None), [0, 3]), ([0, 2], [1, 3]), ([0, 2], slice(None), [1, 4]),
    (1, [0, 3]), ([[0], [2]], [1, 3]),
], ids=lambda k: repr(k).replace(" ", ""))
def test_advanced_indexing_lists(key):
    same(mx.nd.array(X)[key], X[key])


def test_index_with_ndarray():
    a = mx.nd.array(X)
    same(a[mx.nd.array([2, 0])], X[[2, 0]])
    same(a[mx.nd.array([2, 0], dtype="int64")], X[[2, 0]])
    same(a[mx.nd.array([[1], [2]], dtype="int32"), mx.nd.array([0, 3], dtype="int32")], X[[[1], [2]], [0, 3]])


def test_integer_indices_to_one_element_keep_shape_1():
    # 1.9.1 (legacy shapes) gives shape (1,) where NumPy gives a scalar
    same(mx.nd.array([3.0, 4.0, 5.0])[1], np.array([4.0], "float32"))
    same(mx.nd.array(X)[1, 2, 3], X[1, 2, 3].reshape(1))
    same(mx.nd.array(X)[-1, -1, -1], X[-1, -1, -1].reshape(1))


def test_out_of_range_index_lists_fail_on_read():
    # gather_nd runs asynchronously: the IndexError comes with the read, as in stock
    with pytest.raises(IndexError):
        mx.nd.array(X)[[0, 3]].asnumpy()
    with pytest.raises(IndexError):
        mx.nd.array(X)[:, mx.nd.array([4])].asnumpy()


def test_views_share_memory():
    a = mx.nd.array(X)
    v = a[1:3]
    v[:] = 0
    want = X.copy()
    want[1:3] = 0
    same(a, want)
    r = a[1]
    r[:] = -1
    want[1] = -1
    same(a, want)


def test_boolean_index():
    a = mx.nd.array([[1.0, -2.0], [3.0, -4.0], [5.0, 6.0]])
    # legacy mode refuses a bool NDArray key; other dtypes are plain indices; a NumPy bool
    # array is converted to indices 0/1
    with pytest.raises(ValueError, match="boolean indexing in legacy mode"):
        a[mx.nd.array([1, 0, 1], dtype="bool")]
    same(a[mx.nd.array([1, 0, 1], dtype="uint8")], np.array([[3, -4], [1, -2], [3, -4]], "float32"))


SET = [
    (slice(1, 3), 7.0), (slice(1, 3), "array"), (slice(1, 3), "numpy"), ((slice(None), 2), 3.0),
    ((slice(None), 2), "array"), (slice(None), 1.5), (slice(None), "array"), (1, "numpy"), ((0, 1, 2), 9.0),
    ((slice(None, None, 2), slice(None), 1), "numpy"), ((slice(None), slice(None, None, -1)), "numpy"),
    ((Ellipsis, 0), 4.0), ([0, 2], 8.0), ([0, 2], "numpy"), (([0, 2], [1, 3]), 5.0), (-1, "broadcast"),
]


@pytest.mark.parametrize("key,val", SET, ids=[f"{k!r}={v!r}".replace(" ", "") for k, v in SET])
def test_setitem(key, val):
    a = mx.nd.array(X)
    want = X.copy()
    shape = want[key].shape
    if val == "array":
        v = np.random.default_rng(0).uniform(size=shape).astype("float32")
        a[key] = mx.nd.array(v)
    elif val == "numpy":
        v = np.random.default_rng(1).uniform(size=shape).astype("float32")
        a[key] = v
    elif val == "broadcast":
        v = np.arange(shape[-1], dtype="float32")
        a[key] = mx.nd.array(v)
    else:
        v = val
        a[key] = v
    want[key] = v
    same(a, want)


def test_setitem_dtype_conversion_and_int_arrays():
    a = mx.nd.zeros((2, 3), dtype="int32")
    a[0] = np.array([1.7, 2.2, -3.9])
    a[1, :] = 4
    same(a, np.array([[1, 2, -3], [4, 4, 4]], "int32"))
    b = mx.nd.zeros((4,), dtype="float64")
    b[1:3] = mx.nd.array([1.5, 2.5], dtype="float32")
    same(b, np.array([0, 1.5, 2.5, 0]))


def test_index_errors():
    a = mx.nd.array(X)
    with pytest.raises(IndexError):
        a[3]
    with pytest.raises(IndexError):
        a[1, 2, 3, 4]
    with pytest.raises(IndexError):
        a[:, -5]
    with pytest.raises(IndexError):
        a[3] = 1
    with pytest.raises(ValueError, match="does not support slicing"):
        a[1.5]


def test_setitem_shape_mismatch():
    a = mx.nd.zeros((3, 4))
    with pytest.raises((ValueError, mx.base.MXNetError)):
        a[1:3] = np.ones((3, 4))
    with pytest.raises((ValueError, mx.base.MXNetError)):
        a[:] = mx.nd.ones((2, 2))
