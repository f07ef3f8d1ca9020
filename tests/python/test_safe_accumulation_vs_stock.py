"""`MXNET_SAFE_ACCUMULATION=1` (seed 001): float32 reductions, norms and the softmax family
accumulate in float64 on both libraries, so their results agree to float32 rounding where a
float32 accumulation would drift (a long sum of values whose float32 sum loses digits).
Compared with stock 1.9.1 in the same test; the variable is read at each call."""
import os

import numpy as np
import pytest

from differential import assert_close_results, run_script

pytestmark = pytest.mark.skipif("MXNET_LIBRARY_PATH" not in os.environ,
                                reason="MXNET_LIBRARY_PATH is not set: no library of ours to compare")

SCRIPT = r"""
import os, pickle, sys
os.environ["MXNET_SAFE_ACCUMULATION"] = sys.argv[1]
import numpy as np
import mxnet as mx

rs = np.random.RandomState(11)
# 4M values near 1000.1: a float32 running sum loses the low digits long before the end.
big = mx.nd.array(1000.1 + rs.uniform(-1e-3, 1e-3, (4, 1 << 20)), dtype="float32")
wide = mx.nd.array(rs.uniform(-30, 30, (3, 5000)), dtype="float32")
res = {
    "sum": mx.nd.sum(big).asnumpy(),
    "sum-axis": mx.nd.sum(big, axis=1).asnumpy(),
    "mean": mx.nd.mean(big, axis=1).asnumpy(),
    "nansum": mx.nd.nansum(big, axis=0, exclude=True).asnumpy(),
    "norm": mx.nd.norm(big, axis=1).asnumpy(),
    "norm1": mx.nd.norm(big, ord=1).asnumpy(),
    "softmax": mx.nd.softmax(wide, axis=1).asnumpy(),
    "log_softmax": mx.nd.log_softmax(wide, axis=1).asnumpy(),
    "softmin": mx.nd.softmin(wide, axis=1).asnumpy(),
}
with open(sys.argv[-1], "wb") as f:
    pickle.dump(res, f)
"""


def test_safe_accumulation_matches_stock(tmp_path):
    ours = run_script(SCRIPT, "ours", tmp_path, "1")
    stock = run_script(SCRIPT, "stock", tmp_path, "1")
    # Reductions accumulated in float64 and rounded once: within float32 rounding of each
    # other. The softmax family here computes each exponential in float64 too, stock's in
    # float32 (only its sum in float64): within float32 rounding of exponents up to 60.
    soft = ["softmax", "log_softmax", "softmin"]
    assert_close_results(ours, stock, lambda dtype: (2e-7, 1e-12), skip=soft)
    assert_close_results({k: ours[k] for k in soft}, {k: stock[k] for k in soft}, lambda dtype: (1e-5, 1e-12))
    # The exact float64 sum, rounded to float32.
    x = 1000.1 + np.random.RandomState(11).uniform(-1e-3, 1e-3, (4, 1 << 20))
    exact = x.astype(np.float32).astype(np.float64).sum()
    assert abs(float(ours["sum"][0]) - exact) <= abs(exact) * 1.2e-7


def test_the_variable_changes_float32_results(tmp_path):
    # Without it this library still sums float32 accurately (blocked partial sums), but in
    # float32: the norm of a long vector differs in its last bits from the float64 one.
    off = run_script(SCRIPT, "ours", tmp_path, "0")
    on = run_script(SCRIPT, "ours", tmp_path, "1")
    assert any(not np.array_equal(off[k], on[k]) for k in on)
