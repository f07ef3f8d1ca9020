"""Shape, copy and indexing operators through the stock frontend, against NumPy."""
import mxnet as mx
import numpy as np
import pytest

DTYPES = ["float32", "float64", "float16", "uint8", "int32", "int8", "int64", "bool"]


def arr(shape, dtype="float32", lo=0, hi=10):
    rng = np.random.default_rng(sum(shape) + len(shape))
    return rng.integers(lo, hi, size=shape).astype(dtype)


def nd(x):
    return mx.nd.array(x, dtype=x.dtype)


def check(got, want):
    got = got.asnumpy()
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)


# ---- copies and reshapes ----

@pytest.mark.parametrize("dtype", DTYPES)
def test_copyto_astype_and_reshape_all_dtypes(dtype):
    x = arr((2, 3, 4), dtype)
    a = nd(x)
    b = mx.nd.zeros((2, 3, 4), dtype=dtype)
    a.copyto(b)
    check(b, x)
    check(a.reshape((4, -1)), x.reshape(4, -1))
    check(mx.nd.transpose(a, axes=(2, 0, 1)), x.transpose(2, 0, 1))
    check(mx.nd.flip(a, axis=1), x[:, ::-1])


def test_reshape_codes():
    x = arr((2, 3, 4))
    a = nd(x)
    check(mx.nd.reshape(a, shape=(0, -1)), x.reshape(2, 12))
    check(mx.nd.reshape(a, shape=(-2,)), x)
    check(mx.nd.reshape(a, shape=(-3, 4)), x.reshape(6, 4))
    check(mx.nd.reshape(a, shape=(-4, 1, 2, -2)), x.reshape(1, 2, 3, 4))
    check(mx.nd.reshape(a, shape=(-1, 0), reverse=True), x.reshape(6, 4))
    with pytest.raises(mx.base.MXNetError, match="Reshape"):
        mx.nd.reshape(a, shape=(5, -1))


def test_flatten_expand_squeeze():
    x = arr((2, 1, 3, 1))
    a = nd(x)
    check(mx.nd.flatten(a), x.reshape(2, 3))
    check(mx.nd.expand_dims(a, axis=-1), x[..., None])
    check(mx.nd.expand_dims(a, axis=0), x[None])
    check(mx.nd.squeeze(a), x.squeeze())
    check(mx.nd.squeeze(a, axis=(1,)), x.squeeze(1))
    check(mx.nd.squeeze(nd(np.ones((1, 1), "float32"))), np.ones((1,), "float32"))
    with pytest.raises(mx.base.MXNetError, match="squeeze"):
        mx.nd.squeeze(a, axis=2)
    with pytest.raises(mx.base.MXNetError):
        mx.nd.expand_dims(a, axis=6)


def test_transpose_large_and_swapaxes():
    x = np.random.rand(130, 257).astype("float32")
    check(mx.nd.transpose(nd(x)), x.T)
    y = np.random.rand(3, 65, 40).astype("float64")
    check(mx.nd.transpose(nd(y), axes=(0, 2, 1)), y.transpose(0, 2, 1))
    check(mx.nd.swapaxes(nd(y), dim1=0, dim2=2), y.swapaxes(0, 2))
    check(nd(y).T, y.T)
    with pytest.raises(mx.base.MXNetError, match="transpose"):
        mx.nd.transpose(nd(y), axes=(0, 0, 1))


@pytest.mark.parametrize("src", DTYPES)
def test_cast_between_dtypes(src):
    x = arr((3, 5), src, 0, 100)
    for dst in DTYPES:
        check(mx.nd.cast(nd(x), dtype=dst), x.astype(dst))
        check(nd(x).astype(dst), x.astype(dst))
    f = np.array([-1.5, 2.7, 0.0], "float32")
    check(mx.nd.Cast(nd(f), dtype="int32"), f.astype("int32"))


# ---- joins and splits ----

def test_concat_stack():
    xs = [arr((2, k, 3), "float32") for k in (1, 2, 3)]
    check(mx.nd.concat(*[nd(x) for x in xs], dim=1), np.concatenate(xs, 1))
    ys = [arr((2, 3), "int64") for _ in range(4)]
    check(mx.nd.concat(*[nd(y) for y in ys], dim=0), np.concatenate(ys, 0))
    check(mx.nd.stack(*[nd(y) for y in ys]), np.stack(ys))
    check(mx.nd.stack(*[nd(y) for y in ys], axis=-1), np.stack(ys, -1))
    with pytest.raises(mx.base.MXNetError, match="Concat"):
        mx.nd.concat(nd(xs[0]), nd(xs[1].astype("int64")), dim=1)
    with pytest.raises(mx.base.MXNetError, match="Concat"):
        mx.nd.concat(nd(xs[0]), nd(arr((3, 1, 3))), dim=1)
    with pytest.raises(mx.base.MXNetError, match="stack"):
        mx.nd.stack(nd(ys[0]), nd(xs[0]))


def test_split_and_split_v2():
    x = arr((4, 6, 3))
    outs = mx.nd.split(nd(x), num_outputs=3, axis=1)
    for o, w in zip(outs, np.split(x, 3, axis=1)):
        check(o, w)
    outs = mx.nd.split(nd(x), num_outputs=4, axis=0, squeeze_axis=True)
    for i, o in enumerate(outs):
        check(o, x[i])
    with pytest.raises(mx.base.MXNetError, match="SliceChannel"):
        mx.nd.split(nd(x), num_outputs=4, axis=1)
    outs = mx.nd.split_v2(nd(x), (2, 5), axis=1)
    for o, w in zip(outs, np.split(x, [2, 5], axis=1)):
        check(o, w)
    outs = mx.nd.split_v2(nd(x), 2, axis=0)
    for o, w in zip(outs, np.split(x, 2, axis=0)):
        check(o, w)


# ---- broadcasting, tile, repeat, pad ----

def test_broadcasts():
    x = arr((2, 1, 3))
    check(mx.nd.broadcast_to(nd(x), shape=(2, 4, 3)), np.broadcast_to(x, (2, 4, 3)))
    check(mx.nd.broadcast_to(nd(x), shape=(0, 5, 0)), np.broadcast_to(x, (2, 5, 3)))
    check(nd(x).broadcast_to((2, 2, 3)), np.broadcast_to(x, (2, 2, 3)))
    check(mx.nd.broadcast_axis(nd(x), axis=1, size=4), np.broadcast_to(x, (2, 4, 3)))
    y = arr((1, 2, 1))
    z = nd(arr((4, 2, 5)))
    check(mx.nd.broadcast_like(nd(y), z), np.broadcast_to(y, (4, 2, 5)))
    check(mx.nd.broadcast_like(nd(y), z, lhs_axes=(0,), rhs_axes=(-1,)), np.broadcast_to(y, (5, 2, 1)))
    with pytest.raises(mx.base.MXNetError):
        mx.nd.broadcast_like(nd(y), z, lhs_axes=(), rhs_axes=())
    with pytest.raises(mx.base.MXNetError, match="broadcast_to"):
        mx.nd.broadcast_to(nd(x), shape=(2, 4, 4))
    with pytest.raises(mx.base.MXNetError, match="broadcast_axis"):
        mx.nd.broadcast_axis(nd(x), axis=0, size=3)


def test_tile_repeat_reverse():
    x = arr((2, 3), "int32")
    check(mx.nd.tile(nd(x), reps=(2, 3)), np.tile(x, (2, 3)))
    check(mx.nd.tile(nd(x), reps=(2,)), np.tile(x, (2,)))
    check(mx.nd.tile(nd(x), reps=(2, 1, 2)), np.tile(x, (2, 1, 2)))
    check(mx.nd.repeat(nd(x), repeats=3), np.repeat(x, 3))
    check(mx.nd.repeat(nd(x), repeats=2, axis=-1), np.repeat(x, 2, axis=-1))
    check(mx.nd.repeat(nd(x), repeats=2, axis=0), np.repeat(x, 2, axis=0))
    check(mx.nd.reverse(nd(x), axis=(0, 1)), x[::-1, ::-1])
    with pytest.raises(mx.base.MXNetError, match="repeat"):
        mx.nd.repeat(nd(x), repeats=-1)


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
def test_pad(mode):
    x = np.random.rand(2, 3, 4, 5).astype("float32")
    pw = (0, 0, 0, 0, 1, 2, 3, 1)
    got = mx.nd.pad(nd(x), mode=mode, pad_width=pw, constant_value=7.5)
    kw = {"constant_values": 7.5} if mode == "constant" else {}
    check(got, np.pad(x, [(0, 0), (0, 0), (1, 2), (3, 1)], mode=mode, **kw))
    x5 = np.random.rand(1, 2, 3, 3, 2).astype("float64")
    got = mx.nd.pad(nd(x5), mode=mode, pad_width=(0, 0, 0, 0, 1, 1, 2, 0, 1, 1))
    check(got, np.pad(x5, [(0, 0), (0, 0), (1, 1), (2, 0), (1, 1)], mode=mode))
    with pytest.raises(mx.base.MXNetError, match="Pad"):
        mx.nd.pad(nd(x), mode=mode, pad_width=(0, 0, 1, 1))


def test_like_and_info_ops():
    x = arr((2, 3), "int8")
    check(mx.nd.zeros_like(nd(x)), np.zeros_like(x))
    check(mx.nd.ones_like(nd(x)), np.ones_like(x))
    check(mx.nd.shape_array(nd(x)), np.array([2, 3], "int64"))
    check(mx.nd.size_array(nd(x)), np.array([6], "int64"))
    y = arr((3, 2, 4))
    check(mx.nd.reshape_like(nd(y), nd(arr((6, 4)))), y.reshape(6, 4))
    check(mx.nd.reshape_like(nd(y), nd(arr((6, 9))), lhs_begin=0, lhs_end=2, rhs_begin=0, rhs_end=1), y.reshape(6, 4))
    with pytest.raises(mx.base.MXNetError, match="reshape_like"):
        mx.nd.reshape_like(nd(y), nd(arr((5,))))


# ---- slicing and indexing ----

def test_slice_ops():
    x = arr((5, 6, 4))
    a = nd(x)
    check(mx.nd.slice(a, begin=(1, None), end=(4, 5)), x[1:4, :5])
    check(mx.nd.slice(a, begin=(None, -1), end=(None, None), step=(2, -2)), x[::2, -1::-2])
    check(mx.nd.crop(a, begin=(-3,), end=(None,)), x[-3:])
    check(mx.nd.slice_axis(a, axis=1, begin=-4, end=None), x[:, -4:])
    check(mx.nd.slice_axis(a, axis=2, begin=1, end=3), x[:, :, 1:3])
    check(mx.nd.slice_like(a, nd(arr((2, 3, 4)))), x[:2, :3])
    check(mx.nd.slice_like(a, nd(arr((2, 3, 2))), axes=(0, -1)), x[:2, :, :2])
    with pytest.raises(mx.base.MXNetError, match="slice"):
        mx.nd.slice(a, begin=(3,), end=(1,))
    with pytest.raises(mx.base.MXNetError, match="step"):
        mx.nd.slice(a, begin=(0,), end=(1,), step=(0,))
    with pytest.raises(mx.base.MXNetError, match="slice_axis"):
        mx.nd.slice_axis(a, axis=0, begin=4, end=2)


def test_getitem_setitem_frontend():
    x = arr((4, 5, 6))
    a = nd(x)
    check(a[1], x[1])
    check(a[1:3, ::2], x[1:3, ::2])
    check(a[:, 1, -2:], x[:, 1, -2:])
    check(a[[0, 2], [1, 3]], x[[0, 2], [1, 3]])
    check(a[[3, 0]], x[[3, 0]])  # a slice next to an index array needs _arange (not in this family)
    a[1:3, 2] = 99
    x[1:3, 2] = 99
    check(a, x)
    a[:, :, 1:4:2] = nd(np.full((4, 5, 2), -5, "float32"))
    x[:, :, 1:4:2] = -5
    check(a, x)
    a[[0, 3], [1, 2]] = 7
    x[[0, 3], [1, 2]] = 7
    check(a, x)
    a[:] = 3
    check(a, np.full_like(x, 3))


@pytest.mark.parametrize("mode", ["clip", "wrap", "raise"])
def test_take(mode):
    x = arr((4, 3, 2), "float64")
    idx = np.array([[0, 3], [1, 2]], "int32")
    check(mx.nd.take(nd(x), nd(idx), mode=mode), np.take(x, idx, axis=0, mode=mode))
    check(mx.nd.take(nd(x), nd(idx.astype("float32")), axis=1, mode="clip" if mode == "raise" else mode),
          np.take(x, idx, axis=1, mode="clip" if mode == "raise" else mode))
    bad = np.array([5, -6], "int64")
    if mode == "raise":
        with pytest.raises(mx.base.MXNetError):
            mx.nd.take(nd(x), nd(bad), mode=mode).asnumpy()
    else:
        check(mx.nd.take(nd(x), nd(bad), mode=mode), np.take(x, bad, axis=0, mode=mode))



def test_tiny_kernel_failure_marks_what_it_writes():
    # Tiny arrays: the kernel runs on the calling thread. Its failure is kept on the output,
    # passed on by an operation reading it, reported at the wait on that one; then the
    # engine goes on working.
    x = nd(np.arange(12, dtype="float32").reshape(3, 4))
    bad = mx.nd.pick(x, nd(np.array([0, 3, 5], "float32")), axis=1, mode="raise")
    dependent = bad + 1
    with pytest.raises(mx.base.MXNetError, match="out of bounds"):
        dependent.asnumpy()
    check(x + 1, np.arange(12, dtype="float32").reshape(3, 4) + 1)

def test_pick_one_hot_where():
    x = arr((3, 4))
    idx = np.array([0, 3, 5], "float32")
    check(mx.nd.pick(nd(x), nd(idx), axis=1), x[np.arange(3), np.clip(idx.astype(int), 0, 3)])
    check(mx.nd.pick(nd(x), nd(idx), axis=-1, mode="wrap"), x[np.arange(3), idx.astype(int) % 4])
    k = nd(np.array([[1], [2], [0]], "int32"))
    check(mx.nd.pick(nd(x), k, axis=1, keepdims=True), np.take_along_axis(x, k.asnumpy(), 1))
    with pytest.raises(mx.base.MXNetError, match="pick"):
        mx.nd.pick(nd(x), nd(idx), axis=0)
    with pytest.raises(mx.base.MXNetError, match="pick"):
        mx.nd.pick(nd(x), nd(idx), axis=1, mode="raise").asnumpy()
    oh = mx.nd.one_hot(nd(np.array([1, 0, 4, -1], "int32")), depth=3, on_value=5, off_value=-1, dtype="int32")
    want = np.full((4, 3), -1, "int32")
    want[0, 1] = 5
    want[1, 0] = 5
    check(oh, want)
    c = np.array([[1, 0, 1], [0, 0, 1]], "float32")
    a, b = arr((2, 3), "int64"), arr((2, 3), "int64", 20, 30)
    check(mx.nd.where(nd(c), nd(a), nd(b)), np.where(c, a, b))
    c1 = np.array([0, 1], "uint8")
    check(mx.nd.where(nd(c1), nd(a), nd(b)), np.where(c1[:, None], a, b))
    with pytest.raises(mx.base.MXNetError, match="where"):
        mx.nd.where(nd(np.ones(3, "float32")), nd(a), nd(b))


def test_gather_scatter_nd():
    x = arr((3, 4, 2), "int32")
    idx = np.array([[0, 2, -1], [1, 3, 0]], "int64")
    check(mx.nd.gather_nd(nd(x), nd(idx)), x[idx[0], idx[1]])
    lhs = nd(x.copy())
    rhs = nd(np.full((3, 2), -7, "int32"))
    mx.nd._internal._scatter_set_nd(lhs=lhs, rhs=rhs, indices=nd(idx), shape=x.shape, out=lhs)
    want = x.copy()
    want[idx[0], idx[1]] = -7
    check(lhs, want)
    with pytest.raises(IndexError):  # as stock's gather_nd
        mx.nd.gather_nd(nd(x), nd(np.array([[3]], "int64"))).asnumpy()


def test_slice_assign_ops():
    x = arr((3, 4))
    a = nd(x)
    mx.nd._internal._slice_assign_scalar(a, scalar=9, begin=(1, None), end=(None, None), step=(None, 2), out=a)
    x[1:, ::2] = 9
    check(a, x)
    r = arr((2, 2), "float32", 50, 60)
    out = mx.nd._internal._slice_assign(a, nd(r), begin=(0, 1), end=(2, 3))
    want = x.copy()
    want[0:2, 1:3] = r
    check(out, want)
    check(a, x)
    with pytest.raises(mx.base.MXNetError, match="_slice_assign"):
        mx.nd._internal._slice_assign(a, nd(r), begin=(0, 1), end=(3, 3))


# ---- sorting ----

@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "float16"])
def test_sort_argsort_topk(dtype):
    rng = np.random.default_rng(3)
    x = rng.permutation(60).reshape(3, 4, 5).astype(dtype)
    a = nd(x)
    check(mx.nd.sort(a), np.sort(x, -1))
    check(mx.nd.sort(a, axis=1, is_ascend=False), -np.sort(-x, 1))
    check(mx.nd.sort(a, axis=None), np.sort(x, None))
    check(mx.nd.argsort(a, axis=0), np.argsort(x, 0, kind="stable").astype("float32"))
    check(mx.nd.argsort(a, dtype="int64", is_ascend=False), np.argsort(-x, -1, kind="stable"))
    top = np.argsort(-x, 2, kind="stable")[:, :, :2]
    check(mx.nd.topk(a, k=2), top.astype("float32"))
    check(mx.nd.topk(a, k=2, ret_typ="value"), np.take_along_axis(x, top, 2))
    v, i = mx.nd.topk(a, k=3, axis=1, ret_typ="both", is_ascend=True, dtype="int32")
    ti = np.argsort(x, 1, kind="stable")[:, :3]
    check(v, np.take_along_axis(x, ti, 1))
    check(i, ti.astype("int32"))
    m = mx.nd.topk(a, k=2, ret_typ="mask")
    want = np.zeros_like(x)
    np.put_along_axis(want, top, 1, 2)
    check(m, want)
    with pytest.raises(mx.base.MXNetError, match="topk"):
        mx.nd.topk(a, k=6)


# ---- optional extras ----

def test_amp_cast_depth_space_diag_fill_element():
    x = np.random.rand(2, 8, 3, 4).astype("float32")
    check(mx.nd.amp_cast(nd(x), dtype="float16"), x.astype("float16"))
    i = arr((3,), "int32")
    check(mx.nd.amp_cast(nd(i), dtype="float16"), i)
    b = 2
    d2s = x.reshape(2, b, b, 2, 3, 4).transpose(0, 3, 4, 1, 5, 2).reshape(2, 2, 6, 8)
    check(mx.nd.depth_to_space(nd(x), block_size=b), d2s)
    y = np.random.rand(2, 3, 4, 6).astype("float64")
    s2d = y.reshape(2, 3, 2, b, 3, b).transpose(0, 3, 5, 1, 2, 4).reshape(2, 12, 2, 3)
    check(mx.nd.space_to_depth(nd(y), block_size=b), s2d)
    check(mx.nd.space_to_depth(mx.nd.depth_to_space(nd(x), block_size=b), block_size=b), x)
    with pytest.raises(mx.base.MXNetError, match="depth_to_space"):
        mx.nd.depth_to_space(nd(x), block_size=3)
    v = arr((4,), "int64")
    for k in (0, 2, -1):
        check(mx.nd.diag(nd(v), k=k), np.diag(v, k))
    m = arr((3, 5, 4))
    for k in (0, 1, -2, 4):
        check(mx.nd.diag(nd(m), k=k, axis1=0, axis2=2), np.diagonal(m, k, 0, 2))
    # Past the matrix by more than one, stock's shape is unknown: an error, not NumPy's empty.
    with pytest.raises(mx.base.MXNetError, match="outside the matrix"):
        mx.nd.diag(nd(m), k=7, axis1=0, axis2=2).wait_to_read()
    check(mx.nd.diag(nd(m[0])), np.diag(m[0]))
    lhs = arr((3, 4))
    mhs = np.array([7, 8, 9], "float32")
    rhs = np.array([0, 3, 1], "int32")
    want = lhs.copy()
    want[np.arange(3), rhs] = mhs
    check(mx.nd.fill_element_0index(nd(lhs), nd(mhs), nd(rhs)), want)
