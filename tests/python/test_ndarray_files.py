"""NDArray files move both ways between mxnet-rt and stock MXNet 1.9.1.

Stock side: the mxnet==1.9.1 wheel in this venv, run in a subprocess (it loads the stock
library). Our side: our libmxnet.so through ctypes, and the stock frontend itself running on
our library (test_frontend_files_both_ways).
"""

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from differential import run_stock_process

ROOT = Path(__file__).resolve().parents[2]
LIB_PATH = os.environ.get("MXNET_LIBRARY_PATH") or str(ROOT / "target" / "release" / "libmxnet.so")
lib = ctypes.CDLL(LIB_PATH, ctypes.RTLD_LOCAL)
lib.MXGetLastError.restype = ctypes.c_char_p
DTYPES = {0: np.float32, 1: np.float64, 2: np.float16, 3: np.uint8, 4: np.int32, 5: np.int8, 6: np.int64, 7: np.bool_}
CODES = {np.dtype(v): k for k, v in DTYPES.items()}


def check(rc):
    if rc != 0:
        raise RuntimeError(lib.MXGetLastError().decode())


def ours_from_numpy(a):
    shape = (ctypes.c_uint32 * a.ndim)(*a.shape)
    h = ctypes.c_void_p()
    check(lib.MXNDArrayCreateEx(shape, a.ndim, 1, 0, 0, CODES[a.dtype], ctypes.byref(h)))
    a = np.ascontiguousarray(a)
    check(lib.MXNDArraySyncCopyFromCPU(h, a.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(a.size)))
    return h


def ours_to_numpy(h):
    ndim = ctypes.c_int()
    dims = ctypes.POINTER(ctypes.c_int)()
    check(lib.MXNDArrayGetShapeEx(h, ctypes.byref(ndim), ctypes.byref(dims)))
    shape = tuple(dims[i] for i in range(ndim.value))
    code = ctypes.c_int()
    check(lib.MXNDArrayGetDType(h, ctypes.byref(code)))
    out = np.empty(shape, dtype=DTYPES[code.value])
    check(lib.MXNDArraySyncCopyToCPU(h, out.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(out.size)))
    return out


def ours_load(path):
    n, names_n = ctypes.c_uint32(), ctypes.c_uint32()
    arr = ctypes.POINTER(ctypes.c_void_p)()
    names = ctypes.POINTER(ctypes.c_char_p)()
    check(lib.MXNDArrayLoad(str(path).encode(), ctypes.byref(n), ctypes.byref(arr), ctypes.byref(names_n), ctypes.byref(names)))
    handles = [arr[i] for i in range(n.value)]
    keys = [names[i].decode() for i in range(names_n.value)]
    values = [ours_to_numpy(ctypes.c_void_p(h)) for h in handles]
    for h in handles:
        check(lib.MXNDArrayFree(ctypes.c_void_p(h)))
    return dict(zip(keys, values)) if keys else values


def stock(code):
    """Run `code` with the stock frontend and library; returns its stdout."""
    env = {k: v for k, v in os.environ.items() if k != "MXNET_LIBRARY_PATH"}
    res = run_stock_process([sys.executable, "-c", "import mxnet as mx, numpy as np\n" + code],
                            capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    return res.stdout


SAMPLES = {
    "w": np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
    "b": np.array([1e300, -2.5], dtype=np.float64),
    "idx": np.array([[1, -2, 3]], dtype=np.int64),
    "mask": np.array([0, 255, 7], dtype=np.uint8),
    "h": np.array([0.5, -1.25, 3.0], dtype=np.float16),
}


def test_stock_files_load_here(tmp_path):
    stock(f"""
d = {{k: mx.nd.array(v, dtype=v.dtype) for k, v in {{
    'w': np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
    'b': np.array([1e300, -2.5], dtype=np.float64),
    'idx': np.array([[1, -2, 3]], dtype=np.int64),
    'mask': np.array([0, 255, 7], dtype=np.uint8),
    'h': np.array([0.5, -1.25, 3.0], dtype=np.float16)}}.items()}}
mx.nd.save({str(tmp_path / 'dict.nd')!r}, d)
mx.nd.save({str(tmp_path / 'list.nd')!r}, [d['w'], d['idx']])
""")
    loaded = ours_load(tmp_path / "dict.nd")
    assert sorted(loaded) == sorted(SAMPLES)
    for k, v in SAMPLES.items():
        assert loaded[k].dtype == v.dtype and np.array_equal(loaded[k], v), k
    lst = ours_load(tmp_path / "list.nd")
    assert len(lst) == 2 and np.array_equal(lst[0], SAMPLES["w"]) and np.array_equal(lst[1], SAMPLES["idx"])


def test_our_files_load_in_stock(tmp_path):
    handles = [ours_from_numpy(v) for v in SAMPLES.values()]
    keys = (ctypes.c_char_p * len(SAMPLES))(*[k.encode() for k in SAMPLES])
    arr = (ctypes.c_void_p * len(handles))(*[h.value for h in handles])
    check(lib.MXNDArraySave(str(tmp_path / "ours.nd").encode(), len(handles), arr, keys))
    check(lib.MXNDArraySave(str(tmp_path / "ours_list.nd").encode(), 2, arr, None))
    for h in handles:
        check(lib.MXNDArrayFree(h))
    out = stock(f"""
d = mx.nd.load({str(tmp_path / 'ours.nd')!r})
for k in sorted(d):
    print(k, d[k].dtype.__name__, d[k].shape, d[k].asnumpy().astype('float64').tolist())
l = mx.nd.load({str(tmp_path / 'ours_list.nd')!r})
print(type(l).__name__, len(l))
""")
    lines = out.strip().splitlines()
    assert lines[-1] == "list 2"
    got = {line.split(" ", 1)[0]: line for line in lines[:-1]}
    for k, v in SAMPLES.items():
        assert got[k].startswith(f"{k} {v.dtype.name} {v.shape}"), got[k]
        assert str(v.astype("float64").tolist()) in got[k], (got[k], v)


def test_pickled_bytes_round_trip_both_ways(tmp_path):
    raw = stock("import pickle, sys\nsys.stdout.write(pickle.dumps(mx.nd.array([[1.5, 2.5]])).hex())")
    import pickle, re
    # The pickled state holds the raw bytes MXNDArraySaveRawBytes produced in stock.
    blob = bytes.fromhex(raw)
    start = blob.index(bytes.fromhex("c9fa93f9"))
    data = blob[start:start + 4 + 4 + 4 + 16 + 12 + 8]
    h = ctypes.c_void_p()
    check(lib.MXNDArrayLoadFromRawBytes(data, ctypes.c_size_t(len(data)), ctypes.byref(h)))
    assert np.array_equal(ours_to_numpy(h), np.array([[1.5, 2.5]], dtype=np.float32))
    size, buf = ctypes.c_size_t(), ctypes.c_char_p()
    check(lib.MXNDArraySaveRawBytes(h, ctypes.byref(size), ctypes.byref(buf)))
    assert ctypes.string_at(buf, size.value) == data
    check(lib.MXNDArrayFree(h))


def test_bad_files_fail_cleanly(tmp_path):
    good = tmp_path / "g.nd"
    handles = [ours_from_numpy(SAMPLES["w"])]
    arr = (ctypes.c_void_p * 1)(handles[0].value)
    check(lib.MXNDArraySave(str(good).encode(), 1, arr, None))
    data = good.read_bytes()
    n, nn = ctypes.c_uint32(), ctypes.c_uint32()
    out = ctypes.POINTER(ctypes.c_void_p)()
    names = ctypes.POINTER(ctypes.c_char_p)()
    for cut in (0, 7, 30, len(data) - 1):
        rc = lib.MXNDArrayLoadFromBuffer(data[:cut], ctypes.c_size_t(cut), ctypes.byref(n), ctypes.byref(out), ctypes.byref(nn), ctypes.byref(names))
        assert rc == -1 and lib.MXGetLastError().startswith(b"MXNetError: invalid NDArray file")
    assert lib.MXNDArrayLoad(str(tmp_path / "missing.nd").encode(), ctypes.byref(n), ctypes.byref(out), ctypes.byref(nn), ctypes.byref(names)) == -1
    assert b"cannot read" in lib.MXGetLastError()
    check(lib.MXNDArrayFree(handles[0]))


FRONTEND_SAMPLES = dict(SAMPLES, k=np.arange(24, dtype=np.int32).reshape(2, 3, 4), s=np.array([-128, 5], dtype=np.int8),
                        z=np.array([[True, False]], dtype=np.bool_))


def test_frontend_files_both_ways(tmp_path):
    """mx.nd.save/load of the stock frontend on both libraries, each reading the other's files."""
    import mxnet as mx
    spec = {k: (v.tolist(), v.dtype.name) for k, v in FRONTEND_SAMPLES.items()}
    stock(f"""
d = {{k: mx.nd.array(np.array(v, dtype=t), dtype=t) for k, (v, t) in {spec!r}.items()}}
mx.nd.save({str(tmp_path / 'sd.nd')!r}, d)
mx.nd.save({str(tmp_path / 'sl.nd')!r}, [d[k] for k in sorted(d)])
""")
    d = mx.nd.load(str(tmp_path / "sd.nd"))
    lst = mx.nd.load(str(tmp_path / "sl.nd"))
    assert sorted(d) == sorted(FRONTEND_SAMPLES) and len(lst) == len(FRONTEND_SAMPLES)
    for i, k in enumerate(sorted(FRONTEND_SAMPLES)):
        v = FRONTEND_SAMPLES[k]
        for got in (d[k].asnumpy(), lst[i].asnumpy()):
            assert got.dtype == v.dtype and np.array_equal(got, v), k
    mx.nd.save(str(tmp_path / "od.nd"), {k: mx.nd.array(v, dtype=v.dtype) for k, v in FRONTEND_SAMPLES.items()})
    mx.nd.save(str(tmp_path / "ol.nd"), [mx.nd.array(FRONTEND_SAMPLES[k], dtype=FRONTEND_SAMPLES[k].dtype) for k in sorted(FRONTEND_SAMPLES)])
    out = stock(f"""
import json
d = mx.nd.load({str(tmp_path / 'od.nd')!r})
l = mx.nd.load({str(tmp_path / 'ol.nd')!r})
print(json.dumps({{k: [d[k].asnumpy().tolist(), d[k].dtype.__name__, l[i].asnumpy().tolist()] for i, k in enumerate(sorted(d))}}))
""")
    import json
    got = json.loads(out.strip().splitlines()[-1])
    assert sorted(got) == sorted(FRONTEND_SAMPLES)
    for k, v in FRONTEND_SAMPLES.items():
        assert np.dtype(got[k][1]) == v.dtype and got[k][0] == v.tolist() and got[k][2] == v.tolist(), k
