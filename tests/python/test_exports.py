"""Every function stock MXNet 1.9.1's libmxnet.so exports (MX*, NN*) against this library.

`tests/data/stock_exports.txt` lists stock's exports: every one must resolve here.
`tests/data/stock_exports_refused.txt` lists those this library has but does not implement
yet: each must answer -1 with a NotImplementedError naming itself, and the list must equal the
functions of `crates/c-api/src/unsupported.rs` (so it shrinks when one is implemented).
"""
import ctypes
import os
import re
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent.parent / "data"

pytestmark = pytest.mark.skipif("MXNET_LIBRARY_PATH" not in os.environ,
                                reason="MXNET_LIBRARY_PATH is not set: no library of ours to inspect")


def names(file):
    return [line.strip() for line in (DATA / file).read_text().splitlines() if line.strip() and not line.startswith("#")]


def test_every_stock_export_is_present():
    lib = ctypes.CDLL(os.environ["MXNET_LIBRARY_PATH"])
    stock = names("stock_exports.txt")
    assert len(stock) == 294
    absent = [n for n in stock if not hasattr(lib, n)]
    assert not absent, f"stock exports missing here: {absent}"


def test_refused_exports_say_so():
    refused = names("stock_exports_refused.txt")
    source = (DATA.parent.parent / "crates" / "c-api" / "src" / "unsupported.rs").read_text()
    assert sorted(refused) == sorted(re.findall(r'pub extern "C" fn (\w+)\(', source))
    assert set(refused) <= set(names("stock_exports.txt"))
    lib = ctypes.CDLL(os.environ["MXNET_LIBRARY_PATH"])
    lib.MXGetLastError.restype = ctypes.c_char_p
    for n in refused:
        # The stubs read none of their arguments, so a call without any is safe.
        assert getattr(lib, n)() == -1, n
        first = lib.MXGetLastError().decode().splitlines()[0]
        assert first.startswith("NotImplementedError: ") and f"({n})" in first, first
        assert first.endswith("is not supported yet"), first


LOAD_AFTER = r"""
import ctypes, sys
first = sys.argv[1]
if first == "stock":
    import mxnet as mx  # stock's own libmxnet.so (MXNET_LIBRARY_PATH unset)
    assert "mxnet_rt" not in mx.base._LIB._name and float(mx.nd.ones((2, 3)).sum().asscalar()) == 6.0
lib = ctypes.CDLL(sys.argv[2], mode=ctypes.RTLD_LOCAL)
v = ctypes.c_int()
assert lib.MXGetVersion(ctypes.byref(v)) == 0
print(v.value)
"""


@pytest.mark.parametrize("first", ["stock", "none"])
def test_loads_after_another_library_took_the_static_tls_room(first, tmp_path):
    # A library with initial-exec TLS (the allocator's, once) must fit its whole TLS block in
    # glibc's small spare static TLS room, and failed to dlopen after stock's libmxnet.so with
    # "cannot allocate memory in static TLS block". A copy, so that the path is a new one.
    import shutil
    import subprocess
    import sys
    copy = tmp_path / "libmxnet.so"
    shutil.copy(os.environ["MXNET_LIBRARY_PATH"], copy)
    env = {k: v for k, v in os.environ.items() if k != "MXNET_LIBRARY_PATH"}
    env["MXNET_RT_ACTIVATE"] = "0"
    r = subprocess.run([sys.executable, "-c", LOAD_AFTER, first, str(copy)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["10901"]
