"""The operator registry as the stock 1.9.1 frontend sees it: every name resolves, the
documentation strings parse, and the generated `mx.nd.*` functions exist where the frontend's
routing rules (base.py `_init_op_module`) put them."""
import ctypes
import json
import os
import subprocess
import sys

import mxnet as mx
import pytest
from mxnet.base import _LIB, c_str, check_call, py_str
from differential import run_stock_process


def all_names():
    n = ctypes.c_uint()
    arr = ctypes.POINTER(ctypes.c_char_p)()
    check_call(_LIB.MXListAllOpNames(ctypes.byref(n), ctypes.byref(arr)))
    return [py_str(arr[i]) for i in range(n.value)]


def info(name):
    h = ctypes.c_void_p()
    check_call(_LIB.NNGetOpHandle(c_str(name), ctypes.byref(h)))
    real, desc, key, ret = (ctypes.c_char_p() for _ in range(4))
    n = ctypes.c_uint()
    names, types, descs = (ctypes.POINTER(ctypes.c_char_p)() for _ in range(3))
    check_call(_LIB.MXSymbolGetAtomicSymbolInfo(h, ctypes.byref(real), ctypes.byref(desc), ctypes.byref(n),
                                                ctypes.byref(names), ctypes.byref(types), ctypes.byref(descs),
                                                ctypes.byref(key), ctypes.byref(ret)))
    args = [(py_str(names[i]), py_str(types[i]), py_str(descs[i])) for i in range(n.value)]
    return h.value, py_str(real.value), py_str(desc.value), args, py_str(key.value)


def test_every_name_resolves_and_documents():
    names = all_names()
    assert len(names) == len(set(names)) and len(names) > 50
    handles = {}
    for name in names:
        h, real, desc, args, key = info(name)
        assert h and desc
        handles.setdefault(real, set()).add(h)
        if desc.endswith("not supported by mxnet-rt yet."):
            continue  # a stub lists stock's arguments (test_stubs_have_stock_signatures)
        # A control-flow operator's graph arguments (type Symbol) come first, as stock lists
        # them; then tensor inputs; at most one variadic input; the count key is declared.
        while args and args[0][1] == "Symbol":
            args = args[1:]
        kinds = [t.startswith("NDArray") for _, t, _ in args]
        assert kinds == sorted(kinds, reverse=True), (name, args)
        assert sum(t.endswith("[]") for _, t, _ in args) <= 1
        if key:
            assert key in [a for a, _, _ in args], (name, key)
    # An alias resolves to the same handle as its canonical name.
    assert all(len(hs) == 1 for hs in handles.values())


def test_unknown_name_is_an_error():
    h = ctypes.c_void_p()
    assert _LIB.NNGetOpHandle(c_str("definitely_not_an_op"), ctypes.byref(h)) == -1


@pytest.mark.parametrize("name", ["elemwise_add", "_plus", "_zeros", "_full"])
def test_frontend_generated_functions(name):
    if name.startswith("_"):
        assert hasattr(mx.nd._internal, name)
        assert hasattr(mx.sym._internal, name)
    else:
        assert callable(getattr(mx.nd, name))
        assert callable(getattr(mx.sym, name))


def test_generated_functions_for_all_public_ops():
    """Names without a leading underscore and without a routed prefix land in mx.nd."""
    for name in all_names():
        if name.startswith("_"):
            continue
        assert hasattr(mx.nd, name), name


def test_error_class_from_bad_parameter():
    with pytest.raises(mx.base.MXNetError, match="parameter 'value'"):
        mx.nd._internal._full(shape=(2,), value="abc")
    with pytest.raises(mx.base.MXNetError, match="no parameter"):
        mx.nd.zeros((2,), bogus=1)


def test_unsupported_is_not_implemented():
    import ctypes
    from mxnet.ndarray._internal import _imperative_invoke
    handle = ctypes.c_void_p()
    mx.base.check_call(mx.base._LIB.NNGetOpHandle(mx.base.c_str("_np_copy"), ctypes.byref(handle)))
    with pytest.raises(NotImplementedError, match="not supported yet"):
        _imperative_invoke(handle.value, [mx.nd.ones((2,))], [], [], None, False, False)


STOCK_SCHEMAS = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "stock_op_schemas.py")


@pytest.mark.skipif("MXNET_LIBRARY_PATH" not in os.environ, reason="compares this library with stock")
def test_stubs_have_stock_signatures():
    """An operator this library lacks lists stock's arguments and count parameter, so the
    frontend's generated function takes stock's arguments and the call reaches the library,
    which answers NotImplementedError (compared with the stock wheel in a subprocess)."""
    stubs = [n for n in all_names() if info(n)[2] == f"{n}: not supported by mxnet-rt yet."]
    assert len(stubs) > 10
    env = {k: v for k, v in os.environ.items() if k != "MXNET_LIBRARY_PATH"}
    res = run_stock_process([sys.executable, "-W", "ignore", STOCK_SCHEMAS, "--json", *stubs], env=env,
                            capture_output=True, text=True, timeout=300, check=True)
    stock = json.loads(res.stdout.strip().splitlines()[-1])
    for name in stubs:
        _, _, _, args, key = info(name)
        assert ([[a, t] for a, t, _ in args], key) == tuple(stock[name]), name


@pytest.mark.skipif("MXNET_LIBRARY_PATH" not in os.environ, reason="compares this library with stock")
def test_control_flow_signatures_match_stock():
    """The control-flow operators list stock's arguments (their graphs first, typed Symbol)
    and count parameter: the frontend's `mx.sym.contrib.foreach` passes its graph
    positionally and counts it in num_args."""
    names = ["_foreach", "_while_loop", "_cond"]
    env = {k: v for k, v in os.environ.items() if k != "MXNET_LIBRARY_PATH"}
    res = run_stock_process([sys.executable, "-W", "ignore", STOCK_SCHEMAS, "--json", *names], env=env,
                            capture_output=True, text=True, timeout=300, check=True)
    stock = json.loads(res.stdout.strip().splitlines()[-1])
    for name in names:
        _, _, _, args, key = info(name)
        ours = [a for a, _, _ in args]
        assert (ours, key) == ([a for a, _ in stock[name][0]], stock[name][1]), name
        graphs = [a for a, t, _ in args if t == "Symbol"]
        assert graphs == [a for a, t in stock[name][0] if t == "Symbol"] and graphs, name


@pytest.mark.skipif("MXNET_LIBRARY_PATH" not in os.environ, reason="needs an operator this library lacks")
def test_a_stub_called_with_stock_arguments_is_not_implemented():
    stubs = {n for n in all_names() if info(n)[2] == f"{n}: not supported by mxnet-rt yet."}
    # count_sketch is GPU-only in stock too.
    assert "_contrib_count_sketch" in stubs, "implemented now: pick another stub"
    # Stock's signature: data, h and s, then the parameters.
    x = mx.nd.ones((2, 3))
    with pytest.raises(NotImplementedError, match="operator _contrib_count_sketch is not supported yet"):
        mx.nd.contrib.count_sketch(x, mx.nd.ones((1, 3)), mx.nd.ones((1, 3)), out_dim=4)
    with pytest.raises(NotImplementedError, match="is not supported yet"):
        mx.sym.contrib.count_sketch(mx.sym.var("x"), mx.sym.var("h"), mx.sym.var("s"), out_dim=4)


def test_sparse_cast_storage_is_not_implemented():
    with pytest.raises(NotImplementedError, match="sparse storage"):
        mx.nd.cast_storage(mx.nd.ones((2, 2)), stype="csr")
