"""Differential testing: run operator cases through our libmxnet.so and through stock 1.9.1's.

Not a test file itself; tests/python/test_ops_differential.py uses it. A `Case` names an
operator by its dotted path under `mx` ("nd.take", "nd.contrib.arange_like"), gives its
positional inputs as NumPy arrays (they become NDArrays of the same dtype) and its parameters
(NumPy arrays among them become NDArrays passed by keyword). `run_case` runs one case and
returns plain NumPy results; the same function runs on both sides:

* `run_ours(cases)` calls it in this process (the library MXNET_LIBRARY_PATH names);
* `run_stock(cases)` pickles the cases, starts ONE Python subprocess without
  MXNET_LIBRARY_PATH (so the wheel loads its own libmxnet.so), which imports this file by
  path, calls `run_case` for each case and pickles the results back.

`compare(case, ours, stock)` then returns a list of differences (empty when they agree): the
same outcome (both raise, or both succeed), the same number of outputs with the same shapes,
dtypes and values (within rtol/atol, NaN equal to NaN), and likewise the input gradients.
"""

import dataclasses
import os
import pickle
import subprocess
import sys
import tempfile
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

FLOAT_DTYPES = ("float16", "float32", "float64")
# Default (rtol, atol) by the least precise float dtype among a case's arrays.
DEFAULT_TOL = {"float16": (1e-2, 1e-2), "float32": (1e-5, 1e-6), "float64": (1e-10, 1e-12)}


@dataclasses.dataclass
class Case:
    """One operator call. `grad`: False; True (every float input); or the input positions to
    differentiate. With gradients the call is recorded under autograd and back-propagated
    with a seeded random head gradient per output. `expect_error`: stock must raise for it
    (bad input); either way ours must do what stock does."""

    name: str
    call: str
    inputs: List[np.ndarray] = dataclasses.field(default_factory=list)
    kwargs: Dict[str, Any] = dataclasses.field(default_factory=dict)
    grad: Union[bool, Sequence[int]] = False
    rtol: Optional[float] = None
    atol: Optional[float] = None
    expect_error: bool = False

    def grad_positions(self) -> List[int]:
        if not self.grad:
            return []
        if self.grad is True:
            return [i for i, x in enumerate(self.inputs) if np.dtype(x.dtype).name in FLOAT_DTYPES]
        return list(self.grad)

    def tolerance(self) -> Tuple[float, float]:
        arrays = list(self.inputs) + [v for v in self.kwargs.values() if isinstance(v, np.ndarray)]
        floats = [np.dtype(a.dtype).name for a in arrays if np.dtype(a.dtype).name in FLOAT_DTYPES]
        dtype = min(floats, key=FLOAT_DTYPES.index) if floats else "float64"
        if isinstance(self.kwargs.get("dtype"), str) and self.kwargs["dtype"] in FLOAT_DTYPES:
            dtype = min(dtype, self.kwargs["dtype"], key=FLOAT_DTYPES.index)
        rtol, atol = DEFAULT_TOL[dtype]
        return (rtol if self.rtol is None else self.rtol, atol if self.atol is None else self.atol)


def head_gradient(shape, dtype, seed: int) -> np.ndarray:
    """The head gradient for one output: the same seeded values on both sides."""
    rng = np.random.RandomState(seed)
    return rng.uniform(-1.0, 1.0, size=shape).astype(dtype)


def run_case(mx, case: Case) -> Dict[str, Any]:
    """Run `case` with the `mx` module given; returns {"outputs", "grads"} or {"error"}.

    "grads" holds one entry per input: its gradient, or None where it was not asked for.
    "error" is (exception type name, is an MXNetError, the message's line that names the error
    (else its last line), the message)."""
    try:
        fn = mx
        for part in case.call.split("."):
            fn = getattr(fn, part)
        inputs = [mx.nd.array(x, dtype=x.dtype) for x in case.inputs]
        kwargs = {k: mx.nd.array(v, dtype=v.dtype) if isinstance(v, np.ndarray) else v for k, v in case.kwargs.items()}
        positions = case.grad_positions()
        if positions:
            for i in positions:
                inputs[i].attach_grad()
            with mx.autograd.record():
                out = fn(*inputs, **kwargs)
            outs = list(out) if isinstance(out, (list, tuple)) else [out]
            heads = [mx.nd.array(head_gradient(o.shape, o.dtype, seed=k), dtype=o.dtype) for k, o in enumerate(outs)]
            mx.autograd.backward(outs, head_grads=heads)
        else:
            out = fn(*inputs, **kwargs)
            outs = list(out) if isinstance(out, (list, tuple)) else [out]
        outputs = [o.asnumpy() for o in outs]
        grads = [inputs[i].grad.asnumpy() if i in positions else None for i in range(len(inputs))]
        mx.nd.waitall()
        return {"outputs": outputs, "grads": grads}
    except Exception as e:  # noqa: BLE001 - every failure is a result to compare
        msg = str(e).strip()
        lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
        lines = [ln for ln in lines if "Error:" in ln][-1:] or lines[-1:] or [""]  # the line saying what failed
        return {"error": (type(e).__name__, isinstance(e, mx.base.MXNetError), lines[0], msg[:2000])}


def run_ours(cases: Sequence[Case]) -> Dict[str, Dict[str, Any]]:
    import mxnet as mx

    return {c.name: run_case(mx, c) for c in cases}


_STOCK_MAIN = """
import importlib.util, os, pickle, sys
spec = importlib.util.spec_from_file_location("differential", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
sys.modules["differential"] = mod
spec.loader.exec_module(mod)
import mxnet as mx
assert "MXNET_LIBRARY_PATH" not in os.environ
with open(sys.argv[2], "rb") as f:
    cases = [mod.Case(**c) for c in pickle.load(f)]
with open(sys.argv[3], "ab") as out:
    for c in cases:  # one pickle per case, written at once: a crash loses only its own case
        pickle.dump((c.name, mod.run_case(mx, c)), out)
        out.flush()
"""


# Stock 1.9.1 sometimes crashes while its engine shuts down at exit (a worker thread faults in
# malloc_consolidate), and its SIGSEGV handler then deadlocks inside malloc while printing the
# stack trace: the process hangs forever after doing all its work. Seen about once in 400
# runs of the C predict example under load, and in CI. A stock run is therefore retried when
# it hangs or dies of a signal; a run of ours never is.
STOCK_ATTEMPTS = 3


def run_stock_process(args: Sequence[str], timeout: float, retry_signals: bool = True,
                      **kwargs: Any) -> subprocess.CompletedProcess:
    """`subprocess.run(args, timeout=timeout, **kwargs)` for a process that uses stock's
    library: retried (up to STOCK_ATTEMPTS runs, a warning each time) when it times out or,
    with `retry_signals`, is killed by a signal. The last attempt's outcome is returned or
    raised."""
    for attempt in range(1, STOCK_ATTEMPTS + 1):
        try:
            r = subprocess.run(args, timeout=timeout, **kwargs)
        except subprocess.TimeoutExpired:
            if attempt == STOCK_ATTEMPTS:
                raise
            warnings.warn(f"stock's process hung (attempt {attempt} of {STOCK_ATTEMPTS}): {args[0]}")
            continue
        if r.returncode >= 0 or not retry_signals or attempt == STOCK_ATTEMPTS:
            return r
        warnings.warn(f"stock's process died of signal {-r.returncode} (attempt {attempt} of {STOCK_ATTEMPTS})")
    raise AssertionError("unreachable")


def run_stock(cases: Sequence[Case], timeout: float = 300) -> Dict[str, Dict[str, Any]]:
    """All `cases` through stock 1.9.1, in one subprocess. Where stock crashes on a case, that
    case's result is a "StockCrash" error and a new subprocess goes on with the rest."""
    env = {k: v for k, v in os.environ.items() if k != "MXNET_LIBRARY_PATH"}
    results: Dict[str, Dict[str, Any]] = {}
    todo = list(cases)
    with tempfile.TemporaryDirectory() as tmp:
        while todo:
            cases_path, results_path = os.path.join(tmp, "cases.pkl"), os.path.join(tmp, "results.pkl")
            with open(cases_path, "wb") as f:
                pickle.dump([dataclasses.asdict(c) for c in todo], f)
            open(results_path, "wb").close()
            res = run_stock_process([sys.executable, "-W", "ignore", "-c", _STOCK_MAIN, os.path.abspath(__file__), cases_path, results_path],
                                    env=env, capture_output=True, text=True, timeout=timeout, retry_signals=False)
            with open(results_path, "rb") as f:
                while True:
                    try:
                        name, result = pickle.load(f)
                    except EOFError:
                        break
                    results[name] = result
            todo = [c for c in todo if c.name not in results]
            if res.returncode != 0:
                if not todo:  # every result is in: stock failed while exiting
                    warnings.warn(f"stock's process failed after its last case (rc {res.returncode})")
                    break
                tail = res.stderr.strip().splitlines()[-1:] or [""]
                results[todo[0].name] = {"error": ("StockCrash", False, f"stock crashed (rc {res.returncode}): {tail[0]}", res.stderr[-2000:])}
                todo = todo[1:]
    return results


def is_not_implemented(result: Dict[str, Any]) -> bool:
    """Whether a result is our library's "operator not implemented yet" error."""
    if "error" not in result:
        return False
    kind, _, _, msg = result["error"]
    return kind == "NotImplementedError" or "NotImplementedError" in msg or "not supported yet" in msg


def _compare_arrays(what: str, ours: np.ndarray, stock: np.ndarray, rtol: float, atol: float) -> List[str]:
    if ours.shape != stock.shape:
        return [f"{what}: shape {ours.shape} (ours) != {stock.shape} (stock)"]
    if ours.dtype != stock.dtype:
        return [f"{what}: dtype {ours.dtype} (ours) != {stock.dtype} (stock)"]
    if ours.dtype.kind in "fc":
        a, b = ours.astype(np.float64), stock.astype(np.float64)
        ok = np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
    else:
        ok = ours == stock
    if ok.all():
        return []
    bad = np.argwhere(~ok)
    first = tuple(bad[0])
    return [f"{what}: {len(bad)} of {ours.size} values differ (rtol={rtol}, atol={atol}); first at {first}: "
            f"ours {ours[first]!r}, stock {stock[first]!r}" + (f"\n  ours:  {ours!r}\n  stock: {stock!r}" if ours.size <= 24 else "")]


def compare(case: Case, ours: Dict[str, Any], stock: Dict[str, Any]) -> List[str]:
    """The differences between our result and stock's for `case`; empty when they agree."""
    if "error" in stock or "error" in ours:
        if "error" in stock and "error" in ours:
            if stock["error"][1] and not ours["error"][1]:
                return [f"stock raised MXNetError but ours raised {ours['error'][0]}: {ours['error'][2]}"]
            return []
        if "error" in stock:
            return [f"stock raised {stock['error'][0]}: {stock['error'][2]}\n  but ours succeeded"]
        return [f"ours raised {ours['error'][0]}: {ours['error'][2]}\n  but stock succeeded"]
    rtol, atol = case.tolerance()
    diffs = []
    if len(ours["outputs"]) != len(stock["outputs"]):
        return [f"{len(ours['outputs'])} outputs (ours) != {len(stock['outputs'])} (stock)"]
    for k, (a, b) in enumerate(zip(ours["outputs"], stock["outputs"])):
        diffs += _compare_arrays(f"output {k}", a, b, rtol, atol)
    for k, (a, b) in enumerate(zip(ours["grads"], stock["grads"])):
        if a is not None and b is not None:
            diffs += _compare_arrays(f"gradient of input {k}", a, b, rtol, atol)
    return diffs


def run_script(script: str, which: str, tmp_path, *args: str, timeout: float = 300) -> Any:
    """Run `script` (Python source whose last argument is the path to pickle its results to)
    on one library, `which` being "ours" (the library MXNET_LIBRARY_PATH names) or "stock"
    (the wheel's own), in a fresh process; returns what it pickled."""
    env = dict(os.environ)
    if which == "stock":
        env.pop("MXNET_LIBRARY_PATH", None)
    path = tmp_path / f"{which}.pkl"
    run = run_stock_process if which == "stock" else subprocess.run
    r = run([sys.executable, "-c", script, *args, str(path)], env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{which}: {r.stderr[-3000:]}"
    with open(path, "rb") as f:
        return pickle.load(f)


def assert_same_results(ours: Dict[str, Any], stock: Dict[str, Any], skip: Sequence[str] = ()) -> None:
    """Both libraries' results (as `run_script` returns them) are equal, key by key: arrays in
    dtype and value (bit for bit), tuples, lists and dicts element by element, anything else
    by `==`."""
    assert ours.keys() == stock.keys()
    for k in ours:
        if k not in skip:
            _assert_same(ours[k], stock[k], k)


def assert_close_results(ours: Dict[str, Any], stock: Dict[str, Any], tol, skip: Sequence[Any] = ()) -> None:
    """As `assert_same_results`, arrays equal in dtype and shape and close in value:
    `tol(dtype)` gives the (rtol, atol) for arrays of that dtype."""
    assert ours.keys() == stock.keys()
    for k in ours:
        if k not in skip:
            _assert_same(ours[k], stock[k], str(k), tol)


def assert_both_refuse(ours: Dict[str, Optional[str]], stock: Dict[str, Optional[str]],
                       stock_accepts: Sequence[str] = ()) -> None:
    """Bad-input cases (name -> the first line of the error, None if the call worked, as the
    scripts record them) fail here with MXNetError, and with stock too unless listed in
    `stock_accepts` (cases stock does not check)."""
    assert ours.keys() == stock.keys()
    for k, msg in ours.items():
        assert msg is not None and msg.startswith("MXNetError: "), (k, msg)
        assert stock[k] is not None or k in stock_accepts, (k, "stock accepts it")


def _assert_same(a: Any, b: Any, what: str, tol=None) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), what
        for k in a:
            _assert_same(a[k], b[k], f"{what}[{k!r}]", tol)
    elif isinstance(a, (tuple, list)):
        assert isinstance(b, (tuple, list)) and len(a) == len(b), what
        for u, v in zip(a, b):
            _assert_same(u, v, what, tol)
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, what
        if tol is None:
            np.testing.assert_array_equal(a, b, err_msg=what)
        else:
            rtol, atol = tol(a.dtype)
            np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol, err_msg=what)
    else:
        assert a == b, what
