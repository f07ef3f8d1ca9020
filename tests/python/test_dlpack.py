"""DLPack (issue 38) through the stock 1.9.1 frontend, on this library against stock's.

One script runs on each library and records what it sees; both must see the same:

- `mx.nd.from_numpy(x, zero_copy=True)` for every dtype the frontend maps: values, that the
  array is NumPy's memory (a write through MXNet shows in NumPy), and NumPy's reference
  count, raised while the NDArray lives and back where it was once it is freed (the deleter
  ran exactly once);
- `to_dlpack_for_read` + `from_dlpack`: the same memory; the consumer keeps it alive after
  the producer is gone;
- `to_dlpack_for_write` + `from_dlpack`: writes through the consumer are seen by later
  operations on the producer (the engine waited for the producer's work first);
- a capsule never consumed frees its tensor when it is collected;
- errors: non-contiguous arrays, a capsule consumed twice, a dtype MXNet lacks (uint32).
"""
import os

import numpy as np
import pytest

from differential import assert_same_results, run_script

pytestmark = pytest.mark.skipif("MXNET_LIBRARY_PATH" not in os.environ,
                                reason="MXNET_LIBRARY_PATH is not set: this would compare stock with itself")

SCRIPT = r"""
import gc, pickle, sys, time
import numpy as np
import mxnet as mx

out = {}
for dt in ["float32", "float64", "float16", "int32", "int64", "uint8", "bool"]:
    x = (np.arange(12).reshape(3, 4) % 3).astype(dt)
    base = sys.getrefcount(x)
    y = mx.nd.from_numpy(x, zero_copy=True)
    held = sys.getrefcount(x) - base
    vals = y.asnumpy()
    if dt != "bool":
        y += 1
        y.wait_to_read()
    shared = x.copy()
    del y
    mx.nd.waitall()
    gc.collect()
    # The deleter runs when the library lets the memory go, which may be a moment after the
    # free (stock's engine and this one both release it from their own threads).
    for _ in range(200):
        if sys.getrefcount(x) == base:
            break
        time.sleep(0.01)
    out[dt] = (str(vals.dtype), vals, shared, held, sys.getrefcount(x) - base)

# Read: the consumer shares the producer's memory and keeps it alive.
a = mx.nd.array(np.arange(6).reshape(2, 3), dtype="float32")
a += 1
b = mx.nd.from_dlpack(a.to_dlpack_for_read())
out["read"] = b.asnumpy()
a[:] = 5
a.wait_to_read()
out["read after producer write"] = b.asnumpy()
del a
gc.collect()
out["read after producer freed"] = (b * 2).asnumpy()

# Write: the consumer's writes reach the producer.
p = mx.nd.zeros((2, 2))
p += 3  # pending work the capsule must wait for
c = mx.nd.from_dlpack(p.to_dlpack_for_write())
c[:] = c + 4
c.wait_to_read()
out["write"] = (p + 0).asnumpy()

# A capsule nobody consumes is freed with it; a consumed one cannot be consumed again.
q = mx.nd.ones((3,))
cap = q.to_dlpack_for_read()
del cap
gc.collect()
cap = q.to_dlpack_for_read()
r = mx.nd.from_dlpack(cap)
try:
    mx.nd.from_dlpack(cap)
    out["twice"] = "accepted"
except Exception as e:
    out["twice"] = type(e).__name__
try:
    mx.nd.from_numpy(np.zeros((4, 4), "float32")[:, ::2], zero_copy=True)
    out["strided"] = "accepted"
except ValueError:
    out["strided"] = "ValueError"
out["q after all"] = (q + r).asnumpy()
# A dtype the frontend maps to DLPack but MXNet has not.
try:
    mx.nd.from_numpy(np.zeros(3, "uint32"), zero_copy=True).wait_to_read()
    out["uint32"] = "accepted"
except Exception:  # stock: MXNetError; here TypeError, as for other unknown dtypes
    out["uint32"] = "refused"
pickle.dump(out, open(sys.argv[1], "wb"))
"""


def test_dlpack_matches_stock(tmp_path):
    ours, stock = run_script(SCRIPT, "ours", tmp_path), run_script(SCRIPT, "stock", tmp_path)
    assert_same_results(ours, stock)
    # What both must show, spelled out.
    for dt in ("float32", "int64", "uint8"):
        _, vals, shared, held, after = ours[dt]
        np.testing.assert_array_equal(shared, (np.arange(12).reshape(3, 4) % 3).astype(dt) + 1)
        assert held == 1 and after == 0, (dt, held, after)
    np.testing.assert_array_equal(ours["read after producer write"], np.full((2, 3), 5, "float32"))
    np.testing.assert_array_equal(ours["read after producer freed"], np.full((2, 3), 10, "float32"))
    np.testing.assert_array_equal(ours["write"], np.full((2, 2), 7, "float32"))
    assert ours["strided"] == "ValueError" and ours["uint32"] == "refused"
