"""Every function stock MXNet 1.9.1's libmxnet.so exports (MX*, NN*) against this library.

`tests/data/stock_exports.txt` lists stock's exports; `tests/data/stock_exports_missing.txt`
those not here yet. Both directions are checked, so the second list stays exact: each stock
name not in it must resolve in this library, and each name in it must not (when one is added,
the list shrinks with it).
"""
import ctypes
import os
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent.parent / "data"

pytestmark = pytest.mark.skipif("MXNET_LIBRARY_PATH" not in os.environ,
                                reason="MXNET_LIBRARY_PATH is not set: no library of ours to inspect")


def names(file):
    return [line.strip() for line in (DATA / file).read_text().splitlines() if line.strip() and not line.startswith("#")]


def test_stock_exports_are_present_or_listed_as_missing():
    lib = ctypes.CDLL(os.environ["MXNET_LIBRARY_PATH"])
    stock, missing = names("stock_exports.txt"), set(names("stock_exports_missing.txt"))
    assert len(stock) == 294 and missing <= set(stock)
    absent = [n for n in stock if n not in missing and not hasattr(lib, n)]
    assert not absent, f"stock exports missing here (and not listed as missing): {absent}"
    present = sorted(n for n in missing if hasattr(lib, n))
    assert not present, f"listed as missing but exported now (remove them from the list): {present}"
