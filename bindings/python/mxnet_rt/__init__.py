"""mxnet_rt: a small ctypes binding to mxnet-rt's ``libmxnet.so``.

Owns: finding and loading the library (:func:`find_library`, :func:`load_library`,
:func:`lib`), turning the C ABI's ``-1`` + ``MXGetLastError`` convention into Python
exceptions, and a Pythonic view of the process-level calls: version, features, thread
count, GPU count, shutdown, and the configuration registry (``MXGetConfig``, ``MXGetEnv``,
``MXSetEnv``, :class:`Config`). It does not own tensors, operators or the stock ``mxnet``
frontend (which loads the same library through ``MXNET_LIBRARY_PATH``).

Library discovery, first match wins:

1. ``MXNET_LIBRARY_PATH``: an absolute path to the library. When it is set (non-empty) it is
   authoritative: a relative, missing or unloadable path raises :class:`MXNetRtLoadError`.
2. ``libmxnet.so`` beside this package (installed wheels).
3. The build tree: the first directory above this package that holds ``Cargo.toml``, then its
   ``target/release/libmxnet.so`` and ``target/debug/libmxnet.so``.

Errors: the first line of ``MXGetLastError`` reads ``ErrorType: message``. ``ValueError``,
``TypeError``, ``IndexError``, ``NotImplementedError`` and ``AttributeError`` become the Python
builtins; anything else (``MXNetError``, ``InternalError``, ...) becomes :class:`MXNetRtError`.
The exception carries the library's full text.

Note: ``MXSetEnv`` changes the environment of the whole process, and a read-once variable is
fixed for the life of the process by its first use.
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
from collections.abc import Mapping
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

__all__ = [
    "MXNetRtError", "MXNetRtLoadError", "Config",
    "find_library", "load_library", "lib",
    "version", "features", "get_config", "get_env", "set_env",
    "num_omp_threads", "set_num_omp_threads", "gpu_count", "gpu_memory_info",
    "notify_shutdown",
]

LIBRARY_NAME = "libmxnet.so"
ENV_VAR = "MXNET_LIBRARY_PATH"


class MXNetRtError(RuntimeError):
    """An error of the library that is not one of the mapped Python builtins."""


class MXNetRtLoadError(OSError):
    """The library could not be found or loaded."""


# ---------------------------------------------------------------------------------------------
# Discovery and loading


def _build_tree_candidates() -> List[str]:
    d = os.path.dirname(os.path.abspath(__file__))
    while True:
        if os.path.isfile(os.path.join(d, "Cargo.toml")):
            return [os.path.join(d, "target", p, LIBRARY_NAME) for p in ("release", "debug")]
        parent = os.path.dirname(d)
        if parent == d:
            return []
        d = parent


def _locate() -> Tuple[str, Optional[str]]:
    """The library's path and, when it came from the environment, the ``VAR=path`` label."""
    env = os.environ.get(ENV_VAR)
    if env:  # an empty value counts as unset, as in the stock frontend
        label = "%s=%s" % (ENV_VAR, env)
        if not os.path.isabs(env):
            raise MXNetRtLoadError("%s: not an absolute path" % label)
        if not os.path.exists(env):
            raise MXNetRtLoadError("%s: no such file" % label)
        if not os.path.isfile(env):
            raise MXNetRtLoadError("%s: not a regular file" % label)
        return env, label
    pkg = os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME)
    tried = [pkg] + _build_tree_candidates()
    for path in tried:
        if os.path.isfile(path):
            return path, None
    raise MXNetRtLoadError(
        "cannot find %s (%s is not set); tried: %s" % (LIBRARY_NAME, ENV_VAR, ", ".join(tried))
    )


def find_library() -> str:
    """Absolute path of the library to load (see the module docstring for the order)."""
    return os.path.abspath(_locate()[0])


class _LibFeature(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("enabled", ctypes.c_bool)]


_c_int_p = ctypes.POINTER(ctypes.c_int)
_c_char_pp = ctypes.POINTER(ctypes.c_char_p)
_c_u64_p = ctypes.POINTER(ctypes.c_uint64)

# name: (restype, argtypes). Every function the binding calls is declared here.
_SIGNATURES = {
    "MXGetLastError": (ctypes.c_char_p, []),
    "MXGetVersion": (ctypes.c_int, [_c_int_p]),
    "MXLibInfoFeatures": (ctypes.c_int, [ctypes.POINTER(ctypes.POINTER(_LibFeature)),
                                         ctypes.POINTER(ctypes.c_size_t)]),
    "MXNotifyShutdown": (ctypes.c_int, []),
    "MXSetNumOMPThreads": (ctypes.c_int, [ctypes.c_int]),
    "MXGetNumOMPThreads": (ctypes.c_int, [_c_int_p]),
    "MXGetGPUCount": (ctypes.c_int, [_c_int_p]),
    "MXGetGPUMemoryInformation64": (ctypes.c_int, [ctypes.c_int, _c_u64_p, _c_u64_p]),
    "MXGetEnv": (ctypes.c_int, [ctypes.c_char_p, _c_char_pp]),
    "MXSetEnv": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p]),
    "MXGetConfig": (ctypes.c_int, [ctypes.c_char_p, _c_char_pp]),
}
# Internal test hooks: exported by mxnet-rt but not in its header; bound when present.
_TEST_SIGNATURES = {
    "MXRtTestPanic": (ctypes.c_int, [ctypes.c_int]),
    "MXRtTestUseConfig": (ctypes.c_int, [ctypes.c_char_p, _c_char_pp]),
}

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None


def load_library(path: Optional[str] = None) -> ctypes.CDLL:
    """Load the library (``path``, else :func:`find_library`) and make it the module's
    singleton. Loading again returns the singleton; a different path raises."""
    global _lib
    with _lock:
        label = None
        if path is None:
            path, label = _locate()
        path = os.path.abspath(path)
        label = label or path
        if _lib is not None:
            if os.path.realpath(_lib._name) != os.path.realpath(path):
                raise MXNetRtLoadError(
                    "%s: another library is already loaded from %s" % (label, _lib._name))
            return _lib
        try:
            handle = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
        except OSError as e:
            raise MXNetRtLoadError("%s: cannot load: %s" % (label, e)) from e
        for name, (restype, argtypes) in _SIGNATURES.items():
            try:
                fn = getattr(handle, name)
            except AttributeError:
                raise MXNetRtLoadError(
                    "%s: not an mxnet-rt library (no symbol %s)" % (label, name)) from None
            fn.restype, fn.argtypes = restype, argtypes
        for name, (restype, argtypes) in _TEST_SIGNATURES.items():
            fn = getattr(handle, name, None)
            if fn is not None:
                fn.restype, fn.argtypes = restype, argtypes
        _lib = handle
        return _lib


def lib() -> ctypes.CDLL:
    """The loaded library, loading it on first use."""
    return _lib if _lib is not None else load_library()


# ---------------------------------------------------------------------------------------------
# Errors

_BUILTIN_ERRORS = {
    "ValueError": ValueError,
    "TypeError": TypeError,
    "IndexError": IndexError,
    "NotImplementedError": NotImplementedError,
    "AttributeError": AttributeError,
}


def _last_error() -> Exception:
    raw = lib().MXGetLastError()
    text = raw.decode("utf-8", "replace") if raw else "MXNetError: unknown error"
    kind = text.split("\n", 1)[0].split(":", 1)[0].strip()
    return _BUILTIN_ERRORS.get(kind, MXNetRtError)(text)


def _check(rc: int) -> None:
    if rc != 0:
        raise _last_error()


def _enc(s: Optional[str]) -> Optional[bytes]:
    return None if s is None else s.encode("utf-8")


def _dec(b: Optional[bytes]) -> Optional[str]:
    return None if b is None else b.decode("utf-8")


def _string_call(fn_name: str, name: Optional[str]) -> Optional[str]:
    """Call ``int fn(const char* name, const char** out)`` and copy the string out."""
    out = ctypes.c_char_p()
    _check(getattr(lib(), fn_name)(_enc(name), ctypes.byref(out)))
    return _dec(out.value)


def _int_call(fn_name: str) -> int:
    out = ctypes.c_int()
    _check(getattr(lib(), fn_name)(ctypes.byref(out)))
    return out.value


# ---------------------------------------------------------------------------------------------
# Process-level API


def version() -> int:
    """The MXNet C ABI version the library implements (10901 for 1.9.1)."""
    return _int_call("MXGetVersion")


def features() -> Dict[str, bool]:
    """The build's features, ``{name: enabled}``, under stock MXNet's names."""
    arr = ctypes.POINTER(_LibFeature)()
    n = ctypes.c_size_t()
    _check(lib().MXLibInfoFeatures(ctypes.byref(arr), ctypes.byref(n)))
    return {arr[i].name.decode("utf-8"): bool(arr[i].enabled) for i in range(n.value)}


def num_omp_threads() -> int:
    """Threads data-parallel kernels use (the set value, else the number of cores)."""
    return _int_call("MXGetNumOMPThreads")


def set_num_omp_threads(n: int) -> None:
    """Set the number of kernel threads (``n >= 1``; otherwise ValueError)."""
    _check(lib().MXSetNumOMPThreads(int(n)))


def gpu_count() -> int:
    """Number of GPUs visible to the library (0 on a machine without a CUDA driver or GPU)."""
    return _int_call("MXGetGPUCount")


def gpu_memory_info(dev: int = 0) -> Tuple[int, int]:
    """``(free, total)`` bytes of GPU ``dev``; raises when there is no such GPU."""
    free, total = ctypes.c_uint64(), ctypes.c_uint64()
    _check(lib().MXGetGPUMemoryInformation64(int(dev), ctypes.byref(free), ctypes.byref(total)))
    return free.value, total.value


def notify_shutdown() -> None:
    """Tell the library the process is shutting down (idempotent)."""
    _check(lib().MXNotifyShutdown())


# ---------------------------------------------------------------------------------------------
# Configuration


def get_config(name: Optional[str] = None) -> Union[Dict[str, Any], List[Dict[str, Any]]]:
    """One variable's description (a dict), or every variable's (a list) when ``name`` is None.

    Keys: name, value (effective), default, type, accepted, doc, category, read_once,
    already_read, fixed_by, source, env, fallback, status, valid, error. Reading the
    configuration does not count as a use. An unknown name raises ValueError."""
    return json.loads(_string_call("MXGetConfig", name))


def get_env(name: str) -> Optional[str]:
    """The variable's text in the live process environment, or None when unset."""
    return _string_call("MXGetEnv", name)


def set_env(name: str, value: Optional[str]) -> None:
    """Set (or, with None, unset) a variable in the process environment through the library,
    which validates registry variables first (ValueError for a bad value or for changing a
    read-once variable already fixed; the environment is then left unchanged)."""
    _check(lib().MXSetEnv(_enc(name), _enc(value)))


class Config(Mapping):
    """Read-only mapping view of the configuration registry: ``Config()[name]`` is the
    variable's effective value (None when unset without default); iteration yields the names
    in the registry's order. Unknown names raise KeyError (with the library's suggestion).
    Values are read live; change them with :func:`set_env`."""

    def __getitem__(self, name: str) -> Any:
        return self.describe(name)["value"]

    def describe(self, name: str) -> Dict[str, Any]:
        """The full description of one variable, as :func:`get_config` returns it."""
        if not isinstance(name, str):
            raise KeyError(name)
        try:
            return get_config(name)
        except ValueError as e:
            raise KeyError(str(e)) from None

    def __iter__(self) -> Iterator[str]:
        return iter([d["name"] for d in get_config()])

    def __len__(self) -> int:
        return len(get_config())

    def __repr__(self) -> str:
        return "Config(%d variables)" % len(self)


# ---------------------------------------------------------------------------------------------
# Internal test hooks (not part of the public API)


def _test_hook(name: str) -> Any:
    fn = getattr(lib(), name, None)
    if fn is None:
        raise NotImplementedError("%s: this library has no test hook %s" % (lib()._name, name))
    return fn


def _test_panic(how: int) -> None:
    """``MXRtTestPanic``: 0/1/2 panic inside the library, others fail normally. Always raises."""
    _check(_test_hook("MXRtTestPanic")(int(how)))
    raise AssertionError("MXRtTestPanic returned 0")


def _test_use_config(name: str) -> Dict[str, Any]:
    """``MXRtTestUseConfig``: use a variable as the runtime would (fixing a read-once one);
    returns ``{"value": ..., "source": ...}``."""
    _test_hook("MXRtTestUseConfig")
    return json.loads(_string_call("MXRtTestUseConfig", name))
