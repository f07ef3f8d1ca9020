"""Our generated include/mxnet/c_api.h against the stock MXNet 1.9.1 headers.

For every function both headers declare, our prototype is re-declared in a C translation unit
that includes the stock c_api.h and c_api_test.h: a C compiler rejects a redeclaration whose
type differs ("conflicting types"), so any mismatch fails here. The same is done for the
shared typedefs (C11 allows an identical typedef to be repeated, and only an identical one).
A negative control proves the check can fail. The stock headers come from the mxnet==1.9.1
wheel that scripts/test.sh installs; it is located without importing it (importing would load
a libmxnet.so).
"""

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OUR_HEADER = ROOT / "include" / "mxnet" / "c_api.h"
# Our additions to the ABI: names the stock header does not have. A misspelt stock name would
# show up here as an unexpected addition.
ADDITIONS = {
    "MXGetConfig", "MXGetNumOMPThreads",
    "MXEngineNewVar", "MXEngineDeleteVar", "MXEngineWaitForVar", "MXEngineCompleteAsync",
    "MXStorageGetStats", "MXSetProfilerScope",
}
# Stock headers whose declarations we share: MXNet's C API, its test API, the Predict API,
# nnvm's C API (NNGetOpHandle, ...) and the PackedFunc runtime API (MXNetFuncGetGlobal, ...).
STOCK_HEADERS = ("mxnet/c_api.h", "mxnet/c_api_test.h", "mxnet/c_predict_api.h", "nnvm/c_api.h",
                 "mxnet/runtime/c_runtime_api.h")
# Functions that must be checked (the foundation's share of the stock ABI).
REQUIRED_SHARED = {
    "MXGetLastError", "MXGetVersion", "MXLibInfoFeatures", "MXNotifyShutdown",
    "MXSetNumOMPThreads", "MXGetGPUCount", "MXGetGPUMemoryInformation",
    "MXGetGPUMemoryInformation64", "MXGetEnv", "MXSetEnv",
    "MXEnginePushAsync", "MXEnginePushSync", "MXEngineSetBulkSize", "MXNDArrayWaitAll",
    "MXEnginePushAsyncND", "MXEnginePushSyncND", "MXNDArrayCreateEx", "MXNDArrayFree",
    "MXNDArraySave", "MXNDArrayLoad", "MXNDArrayLoadFromBuffer", "MXNDArraySaveRawBytes",
    "MXNDArrayLoadFromRawBytes", "MXNDArrayReshape64", "MXNDArraySlice", "MXNDArrayAt",
    "MXStorageEmptyCache", "MXSetIsNumpyShape", "MXIsNumpyShape",
    "MXListAllOpNames", "NNListAllOpNames", "NNGetOpHandle", "NNGetOpInfo",
    "MXSymbolListAtomicSymbolCreators", "MXSymbolGetAtomicSymbolName", "MXSymbolGetAtomicSymbolInfo",
    "MXImperativeInvokeEx", "MXImperativeInvoke", "MXRandomSeed", "MXRandomSeedContext",
    "MXKVStoreIsWorkerNode", "MXListDataIters", "MXDataIterGetIterInfo", "MXDataIterCreateIter",
    "MXListFunctions", "MXFuncGetInfo", "MXFuncDescribe", "MXNetFuncListGlobalNames",
    "MXNetFuncGetGlobal", "MXCustomOpRegister",
    "MXPredCreate", "MXPredCreateEx", "MXPredCreatePartialOut", "MXPredCreateMultiThread", "MXPredReshape",
    "MXPredGetOutputShape", "MXPredGetOutputType", "MXPredSetInput", "MXPredForward", "MXPredPartialForward",
    "MXPredGetOutput", "MXPredFree", "MXPredSetMonitorCallback", "MXNDListCreate", "MXNDListGet", "MXNDListFree",
}


def stock_include() -> Path:
    spec = importlib.util.find_spec("mxnet")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("stock mxnet 1.9.1 is not installed; scripts/test.sh installs it into .venv")
    inc = Path(list(spec.submodule_search_locations)[0]) / "include"
    assert (inc / "mxnet" / "c_api.h").is_file(), inc
    return inc


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def our_declarations():
    """(function name -> prototype text, typedef name -> typedef text) from our header."""
    text = strip_comments(OUR_HEADER.read_text())
    protos = {}
    for m in re.finditer(r"^([A-Za-z_][\w \*]*?[\s\*])((?:MX|NN)\w+)\(([^;]*?)\);", text, re.M | re.S):
        protos[m.group(2)] = " ".join(m.group(0).split())
    typedefs = {}
    for m in re.finditer(r"^typedef [^;]*?\b(\w+);", text, re.M):
        typedefs[m.group(1)] = m.group(0)
    return protos, typedefs


def stock_names(inc: Path):
    text = ""
    for h in STOCK_HEADERS:
        text += strip_comments((inc / h).read_text())
    functions = set(re.findall(r"(?:MXNET_DLL|NNVM_DLL)\s+[\w\s\*]+?\b(\w+)\s*\(", text))
    typedefs = set(re.findall(r"typedef\s+[^;(]*?\b(\w+)\s*;", text))
    return functions, typedefs


def compile_c(tmp_path: Path, name: str, body: str, inc: Path, run: bool = False):
    src = tmp_path / (name + ".c")
    src.write_text(body)
    exe = tmp_path / name
    args = ["cc", "-std=c11", "-pedantic-errors", "-Wall", "-Werror", "-I", str(inc), str(src)]
    args += ["-o", str(exe)] if run else ["-fsyntax-only"]
    res = subprocess.run(args, capture_output=True, text=True)
    if res.returncode == 0 and run:
        res = subprocess.run([str(exe)], capture_output=True, text=True)
    return res


def check_unit(protos, typedefs, shared_fns, shared_types) -> str:
    lines = [f"#include <{h}>" for h in STOCK_HEADERS]
    lines += [typedefs[t] for t in sorted(shared_types)]
    lines += [protos[f] for f in sorted(shared_fns)]
    return "\n".join(lines) + "\n"


def test_names_are_stock_or_documented_additions():
    protos, _ = our_declarations()
    functions, _ = stock_names(stock_include())
    assert REQUIRED_SHARED <= set(protos), REQUIRED_SHARED - set(protos)
    assert set(protos) - functions == ADDITIONS


def test_prototypes_match_stock(tmp_path):
    inc = stock_include()
    protos, typedefs = our_declarations()
    functions, stock_typedefs = stock_names(inc)
    shared_fns = set(protos) & functions
    shared_types = set(typedefs) & stock_typedefs
    assert REQUIRED_SHARED <= shared_fns
    assert {"NDArrayHandle", "ContextHandle", "EngineVarHandle", "ProfileHandle", "mx_uint"} <= shared_types
    res = compile_c(tmp_path, "protos", check_unit(protos, typedefs, shared_fns, shared_types), inc)
    assert res.returncode == 0, res.stderr


def test_mismatch_is_detected(tmp_path):
    """Negative control: a changed parameter type or typedef must fail to compile."""
    inc = stock_include()
    protos, typedefs = our_declarations()
    bad = dict(protos)
    bad["MXGetVersion"] = "int MXGetVersion(long *out);"
    res = compile_c(tmp_path, "bad_proto", check_unit(bad, typedefs, {"MXGetVersion"}, set()), inc)
    assert res.returncode != 0 and "MXGetVersion" in res.stderr
    bad_types = dict(typedefs)
    bad_types["mx_uint"] = "typedef uint64_t mx_uint;"
    res = compile_c(tmp_path, "bad_type", check_unit(protos, bad_types, set(), {"mx_uint"}), inc)
    assert res.returncode != 0 and "mx_uint" in res.stderr


def test_libfeature_layout_matches_stock(tmp_path):
    prog = """#include <stddef.h>
#include <stdio.h>
#include <mxnet/c_api.h>
int main(void) {
  printf("%zu %zu %zu", sizeof(struct LibFeature), offsetof(struct LibFeature, name),
         offsetof(struct LibFeature, enabled));
  return 0;
}
"""
    stock = compile_c(tmp_path, "stock_layout", prog, stock_include(), run=True)
    ours = compile_c(tmp_path, "our_layout", prog, ROOT / "include", run=True)
    assert stock.returncode == 0 and ours.returncode == 0, stock.stderr + ours.stderr
    assert ours.stdout == stock.stdout == "16 0 8"
