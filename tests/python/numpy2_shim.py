"""Restore the NumPy names the stock MXNet 1.9.1 Python frontend still uses, for NumPy 2.x.

Why this exists: the GPU test machine has only Python 3.12, for which no numpy<1.24 wheel
exists, so it runs NumPy 2.x.  The stock 1.9.1 frontend (which we run unchanged on our
libmxnet.so through MXNET_LIBRARY_PATH) predates NumPy 2 and looks up names NumPy 2 removed
while `import mxnet` runs, so the import fails without them:

  mxnet/numpy/utils.py                   PZERO NZERO PINF NINF NAN NaN
  mxnet/numpy/fallback.py                alltrue in1d msort trapz mirr npv pmt ppmt pv rate
  mxnet/numpy_dispatch_protocol.py       sometrue round_ product
  mxnet/gluon/contrib/estimator/...      Inf (a default argument)

It also imports `distutils.version` (LooseVersion in mxnet/numpy_dispatch_protocol.py,
StrictVersion in mxnet/numpy_op_fallback.py, both at import time).  Python 3.12 removed
distutils; where neither it nor setuptools' copy is importable, a minimal stand-in that
compares the leading numeric release components is registered in its place.

Import this module before `import mxnet`.  It only adds what is missing, so it does nothing
on NumPy 1.x with Python <= 3.11.  Only names the frontend actually uses are restored.
"""
import functools as _functools
import re as _re
import sys as _sys
import types as _types

import numpy as _np

_CONSTANTS = {
    "PZERO": 0.0,
    "NZERO": -0.0,
    "PINF": float("inf"),
    "NINF": float("-inf"),
    "NAN": float("nan"),
    "NaN": float("nan"),
    "Inf": float("inf"),
}


def _forward(name, call):
    # A distinct function object per removed name: numpy_dispatch_protocol.py keys its
    # __array_function__ table by the NumPy function, so a bare alias (np.sometrue = np.any)
    # would overwrite the entry registered for the current name.
    def wrapper(*args, **kwargs):
        return call(*args, **kwargs)
    wrapper.__name__ = wrapper.__qualname__ = name
    wrapper.__doc__ = "np.%s, removed from NumPy 2; restored for the MXNet 1.9.1 frontend." % name
    return wrapper


def _in1d(ar1, ar2, assume_unique=False, invert=False, **kwargs):
    return _np.isin(_np.ravel(ar1), ar2, assume_unique=assume_unique, invert=invert, **kwargs)


def _msort(a):
    return _np.sort(a, axis=0)


# Looked up only when missing (np.trapezoid exists only from NumPy 2.0 on).
_FUNCTIONS = {
    "alltrue": lambda: _np.all,
    "sometrue": lambda: _np.any,
    "product": lambda: _np.prod,
    "round_": lambda: _np.round,
    "trapz": lambda: _np.trapezoid,
    "msort": lambda: _msort,
    "in1d": lambda: _in1d,
}


def _financial_stub(name):
    # NumPy 1.20-1.24 kept these as stubs that raise when called (NEP 32); fallback.py only
    # needs the names to exist.
    def stub(*args, **kwargs):
        raise RuntimeError("np.%s was removed from NumPy in 1.20 (NEP 32); "
                           "use numpy_financial" % name)
    stub.__name__ = stub.__qualname__ = name
    return stub


def _missing(name):
    try:
        getattr(_np, name)
    except AttributeError:
        return True
    return False


for _name, _value in _CONSTANTS.items():
    if _missing(_name):
        setattr(_np, _name, _value)
for _name, _target in _FUNCTIONS.items():
    if _missing(_name):
        setattr(_np, _name, _forward(_name, _target()))
for _name in ("mirr", "npv", "pmt", "ppmt", "pv", "rate"):
    if _missing(_name):
        setattr(_np, _name, _financial_stub(_name))


@_functools.total_ordering
class _Version:
    """Enough of distutils' LooseVersion/StrictVersion for the frontend's version checks."""

    def __init__(self, vstring):
        self.vstring = str(vstring)
        self.version = tuple(int(p) for p in _re.match(r"[\d.]*", self.vstring).group()
                             .split(".") if p)

    @staticmethod
    def _key(other):
        return (other if isinstance(other, _Version) else _Version(other)).version

    def __eq__(self, other):
        return self.version == self._key(other)

    def __lt__(self, other):
        return self.version < self._key(other)


try:
    import distutils.version  # noqa: F401  (Python <= 3.11, or setuptools' copy)
except ImportError:
    _distutils = _types.ModuleType("distutils")
    _distutils_version = _types.ModuleType("distutils.version")
    _distutils_version.LooseVersion = type("LooseVersion", (_Version,), {})
    _distutils_version.StrictVersion = type("StrictVersion", (_Version,), {})
    _distutils.version = _distutils_version
    _sys.modules["distutils"] = _distutils
    _sys.modules["distutils.version"] = _distutils_version
