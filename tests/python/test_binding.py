"""Tests of the mxnet_rt Python binding (bindings/python) against the built libmxnet.so.

The library is MXNET_LIBRARY_PATH if set, else <repo>/target/release/libmxnet.so, else
<repo>/target/debug/libmxnet.so. Scenarios that change process-wide state (MXSetEnv, read-once
variables, the environment at start-up, the loader) run in a fresh interpreter each.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINDINGS = os.path.join(REPO, "bindings", "python")
sys.path.insert(0, BINDINGS)

import mxnet_rt  # noqa: E402


def _library():
    env = os.environ.get("MXNET_LIBRARY_PATH")
    if env:
        return env
    for profile in ("release", "debug"):
        path = os.path.join(REPO, "target", profile, "libmxnet.so")
        if os.path.isfile(path):
            return path
    raise RuntimeError("no libmxnet.so: build it (cargo build) or set MXNET_LIBRARY_PATH")


LIB = _library()
mxnet_rt.load_library(LIB)

CONFIG_KEYS = {
    "name", "value", "default", "type", "accepted", "doc", "category", "read_once",
    "already_read", "fixed_by", "source", "env", "fallback", "status", "valid", "error",
}


# Defined in every child: catch(f, *a) -> [exception class name, text] or None.
CATCH = """
def catch(f, *a):
    try:
        f(*a)
    except Exception as e:
        return [type(e).__name__, str(e)]
    return None
"""


def run_py(code, env=None, lib_env=True, pythonpath=BINDINGS):
    """Run `code` in a fresh interpreter with `mxnet_rt` imported as `m` and `catch` defined,
    a clean MXNET_* environment plus `env`, and MXNET_LIBRARY_PATH=LIB unless `lib_env` is
    False."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("MXNET_", "NNVM_"))}
    child_env["RUST_BACKTRACE"] = "0"
    if lib_env:
        child_env["MXNET_LIBRARY_PATH"] = LIB
    child_env.update(env or {})
    prelude = "import sys, json, os\nsys.path.insert(0, %r)\nimport mxnet_rt as m\n" % pythonpath
    return subprocess.run(
        [sys.executable, "-c", prelude + CATCH + textwrap.dedent(code)],
        env=child_env, capture_output=True, text=True, timeout=120,
    )


def run_json(code, **kw):
    """As run_py; the code must succeed and print one JSON document as its last line."""
    p = run_py(code, **kw)
    assert p.returncode == 0, "child failed:\n" + p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


# --- loader ------------------------------------------------------------------------------


def test_loader_uses_env_path():
    got = run_json("print(json.dumps([m.find_library(), m.lib()._name, m.version()]))")
    assert got == [os.path.abspath(LIB), os.path.abspath(LIB), 10901]


LOAD_ERROR = """
e = catch(m.lib)
print(json.dumps([e[0], e[1], isinstance(m.MXNetRtLoadError(), OSError)] if e else None))
"""


def _load_error(path):
    got = run_json(LOAD_ERROR, env={"MXNET_LIBRARY_PATH": path})
    assert got is not None, "loading %r should fail" % path
    assert got[0] == "MXNetRtLoadError" and got[2] is True
    assert "MXNET_LIBRARY_PATH=" + path in got[1], got[1]
    return got[1]


def test_loader_missing_path_is_an_error(tmp_path):
    msg = _load_error(str(tmp_path / "nowhere" / "libmxnet.so"))
    assert "no such file" in msg


def test_loader_relative_path_is_an_error():
    # Relative even though the file exists relative to the child's working directory.
    msg = _load_error(os.path.relpath(LIB))
    assert "not an absolute path" in msg


def test_loader_text_file_is_an_error(tmp_path):
    fake = tmp_path / "libmxnet.so"
    fake.write_text("not a shared library\n")
    msg = _load_error(str(fake))
    assert "cannot load" in msg


def test_loader_foreign_library_is_an_error():
    import _ctypes  # a real shared object without the MXNet entry points

    msg = _load_error(os.path.abspath(_ctypes.__file__))
    assert "no symbol MXGetLastError" in msg


def test_loader_env_is_authoritative(tmp_path):
    # A bad MXNET_LIBRARY_PATH does not fall back to the build tree.
    msg = _load_error(str(tmp_path / "missing.so"))
    assert "target" not in msg


def test_loader_falls_back_to_build_tree():
    expected = [p for p in (os.path.join(REPO, "target", d, "libmxnet.so")
                            for d in ("release", "debug")) if os.path.isfile(p)]
    if not expected:
        pytest.skip("no library in the build tree (MXNET_LIBRARY_PATH points elsewhere)")
    got = run_json("print(json.dumps([m.find_library(), m.version()]))", lib_env=False)
    assert got == [expected[0], 10901]


def _package_copy(root):
    pkg = root / "mxnet_rt"
    pkg.mkdir(parents=True)
    shutil.copy(os.path.join(BINDINGS, "mxnet_rt", "__init__.py"), pkg / "__init__.py")
    return pkg


def test_loader_prefers_library_beside_package(tmp_path):
    pkg = _package_copy(tmp_path)
    os.symlink(os.path.abspath(LIB), pkg / "libmxnet.so")
    got = run_json("print(json.dumps([m.find_library(), m.version()]))",
                   lib_env=False, pythonpath=str(tmp_path))
    assert got == [str(pkg / "libmxnet.so"), 10901]


def test_loader_lists_every_path_tried(tmp_path):
    pkg = _package_copy(tmp_path)  # no library beside it, no Cargo.toml above it
    got = run_json("print(json.dumps(catch(m.find_library)))",
                   lib_env=False, pythonpath=str(tmp_path))
    assert got[0] == "MXNetRtLoadError"
    assert str(pkg / "libmxnet.so") in got[1] and "MXNET_LIBRARY_PATH" in got[1]


def test_load_library_is_a_singleton():
    assert mxnet_rt.lib() is mxnet_rt.load_library() is mxnet_rt.load_library(LIB)
    assert os.path.samefile(mxnet_rt.lib()._name, LIB)


# --- library information -------------------------------------------------------------------


def test_version():
    assert mxnet_rt.version() == 10901


def test_features():
    f = mxnet_rt.features()
    assert len(f) >= 32
    assert f["TVM_OP"] is False and f["INT64_TENSOR_SIZE"] is False and f["CUDA"] is False
    assert all(isinstance(k, str) and isinstance(v, bool) for k, v in f.items())


def test_gpu_count_and_memory_info():
    assert mxnet_rt.gpu_count() == 0
    with pytest.raises(mxnet_rt.MXNetRtError) as e:
        mxnet_rt.gpu_memory_info(0)
    assert str(e.value).startswith("MXNetError: gpu(0) is not available")


def test_omp_threads():
    with pytest.raises(ValueError, match="must be >= 1"):
        mxnet_rt.set_num_omp_threads(0)
    assert mxnet_rt.num_omp_threads() >= 1
    mxnet_rt.set_num_omp_threads(3)
    assert mxnet_rt.num_omp_threads() == 3


def test_notify_shutdown_is_idempotent():
    got = run_json("""
        m.notify_shutdown(); m.notify_shutdown()
        print(json.dumps(m.version()))  # calls after shutdown still work
    """)
    assert got == 10901


# --- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("how", [0, 1, 2])
def test_panic_is_contained(how):
    with pytest.raises(mxnet_rt.MXNetRtError) as e:
        mxnet_rt._test_panic(how)
    assert str(e.value).startswith("InternalError: panic in MXRtTestPanic")
    assert not isinstance(e.value, ValueError)
    assert mxnet_rt.version() == 10901  # the library still works


def test_ordinary_error_maps_to_mxnet_rt_error():
    with pytest.raises(mxnet_rt.MXNetRtError) as e:
        mxnet_rt._test_panic(7)
    assert str(e.value) == "MXNetError: deliberate test error"
    assert isinstance(e.value, RuntimeError)


# --- configuration (read-only, in this process) --------------------------------------------


def test_get_config_all():
    all_ = mxnet_rt.get_config()
    assert isinstance(all_, list) and len(all_) > 40
    for d in all_:
        assert set(d) == CONFIG_KEYS, d["name"]
    names = [d["name"] for d in all_]
    assert len(set(names)) == len(names) and "MXNET_ENGINE_TYPE" in names


def test_get_config_unknown_name_suggests():
    with pytest.raises(ValueError) as e:
        mxnet_rt.get_config("MXNET_ENGINE_TYP")
    assert "did you mean MXNET_ENGINE_TYPE" in str(e.value)
    assert str(e.value).startswith("ValueError: unknown configuration variable")


def test_config_mapping_view():
    config = mxnet_rt.Config()
    names = list(config)
    assert names == [d["name"] for d in mxnet_rt.get_config()] and len(config) == len(names)
    assert "MXNET_ENGINE_TYPE" in config and "MXNET_NO_SUCH_THING" not in config
    assert config["MXNET_ENGINE_TYPE"] == config.describe("MXNET_ENGINE_TYPE")["value"]
    assert config.describe("MXNET_ENGINE_TYPE")["read_once"] is True
    with pytest.raises(KeyError, match="did you mean"):
        config["MXNET_ENGINE_TYP"]


# --- configuration scenarios (fresh process each) ------------------------------------------


def _config_in_child(name, env):
    d = run_json("print(json.dumps(m.get_config(%r)))" % name, env=env)
    return d["value"], d["source"]


def test_engine_type_default_and_source():
    d = run_json("print(json.dumps(m.get_config('MXNET_ENGINE_TYPE')))")
    assert d["value"] == d["default"] == "ThreadedEnginePerDevice"
    assert d["source"] == "default" and d["env"] is None
    assert d["read_once"] is True and d["already_read"] is False and d["valid"] is True
    env = {"MXNET_ENGINE_TYPE": "NaiveEngine"}
    assert _config_in_child("MXNET_ENGINE_TYPE", env) == ("NaiveEngine", "environment")


def test_set_env_round_trip_and_unset():
    got = run_json("""
        import subprocess
        out = [m.get_env('MXNET_EXEC_NUM_TEMP')]
        m.set_env('MXNET_EXEC_NUM_TEMP', '4')
        out.append(m.get_env('MXNET_EXEC_NUM_TEMP'))
        # A child process inherits the environment the library changed.
        child = subprocess.run([sys.executable, '-c',
            'import os; print(os.environ.get("MXNET_EXEC_NUM_TEMP"))'],
            capture_output=True, text=True)
        out.append(child.stdout.strip())
        m.set_env('MXNET_EXEC_NUM_TEMP', None)
        out.append(m.get_env('MXNET_EXEC_NUM_TEMP'))
        m.set_env('MXRT_BINDING_TEST_OTHER', 'x')  # names outside the registry are set too
        out.append(m.get_env('MXRT_BINDING_TEST_OTHER'))
        print(json.dumps(out))
    """)
    assert got == [None, "4", "4", None, "x"]


def test_set_env_bad_value_keeps_old_value():
    got = run_json("""
        e = catch(m.set_env, 'MXNET_CPU_WORKER_NTHREADS', '-1')
        print(json.dumps([e, m.get_env('MXNET_CPU_WORKER_NTHREADS'),
                          m.get_config('MXNET_CPU_WORKER_NTHREADS')['value']]))
    """, env={"MXNET_CPU_WORKER_NTHREADS": "2"})
    (kind, msg), env_value, value = got
    assert kind == "ValueError" and "MXNET_CPU_WORKER_NTHREADS" in msg and '"-1"' in msg
    assert env_value == "2" and value == 2


def test_read_once_variable_is_fixed_by_first_use():
    got = run_json("""
        m.set_env('MXNET_ENGINE_TYPE', 'NaiveEngine')
        used = m._test_use_config('MXNET_ENGINE_TYPE')
        e = catch(m.set_env, 'MXNET_ENGINE_TYPE', 'ThreadedEngine')
        again = catch(m.set_env, 'MXNET_ENGINE_TYPE', 'NaiveEngine')  # same value: allowed
        d = m.get_config('MXNET_ENGINE_TYPE')
        print(json.dumps([used, e, again, m.get_env('MXNET_ENGINE_TYPE'),
                          d['already_read'], d['fixed_by']]))
    """)
    used, (kind, msg), again, env_value, already_read, fixed_by = got
    assert used == {"value": "NaiveEngine", "source": "MXSetEnv"}
    assert kind == "ValueError" and "read once" in msg and "NaiveEngine" in msg
    assert again is None and env_value == "NaiveEngine"
    assert already_read is True and fixed_by == "MXRtTestUseConfig"


def test_dynamic_variable_takes_effect_at_next_use():
    got = run_json("""
        out = [m._test_use_config('MXNET_CPU_PARALLEL_COPY_SIZE')]
        m.set_env('MXNET_CPU_PARALLEL_COPY_SIZE', '1000')
        out.append(m._test_use_config('MXNET_CPU_PARALLEL_COPY_SIZE'))
        m.set_env('MXNET_CPU_PARALLEL_COPY_SIZE', '2000')
        out.append(m._test_use_config('MXNET_CPU_PARALLEL_COPY_SIZE'))
        out.append(m.get_config('MXNET_CPU_PARALLEL_COPY_SIZE')['already_read'])
        print(json.dumps(out))
    """)
    assert got == [
        {"value": 200000, "source": "default"},
        {"value": 1000, "source": "MXSetEnv"},
        {"value": 2000, "source": "MXSetEnv"},
        False,
    ]


def test_precedence_setenv_over_environment_over_default():
    got = run_json("""
        def s(n):
            d = m.get_config(n)
            return [d['value'], d['source'], d['env']]
        out = [s('MXNET_EXEC_NUM_TEMP'), s('NNVM_EXEC_MATCH_RANGE')]
        m.set_env('MXNET_EXEC_NUM_TEMP', '5')
        out.append(s('MXNET_EXEC_NUM_TEMP'))
        os.environ['MXNET_EXEC_NUM_TEMP'] = '7'  # a direct change after MXSetEnv loses
        out.append(s('MXNET_EXEC_NUM_TEMP'))
        m.set_env('MXNET_EXEC_NUM_TEMP', None)   # unset through MXSetEnv: the default
        out.append(s('MXNET_EXEC_NUM_TEMP'))
        print(json.dumps(out))
    """, env={"MXNET_EXEC_NUM_TEMP": "3"})
    assert got == [
        [3, "environment", "3"],
        [16, "default", None],
        [5, "MXSetEnv", "5"],
        [5, "MXSetEnv", "7"],
        [1, "default", None],
    ]


def test_bad_environment_value_fails_each_use():
    p = run_py("""
        a = catch(m._test_use_config, 'MXNET_ENGINE_TYPE')
        b = catch(m._test_use_config, 'MXNET_ENGINE_TYPE')  # never replaced by the default
        d = m.get_config('MXNET_ENGINE_TYPE')               # describing it does not fail
        print(json.dumps([a, b, d['valid'], d['source']]))
    """, env={"MXNET_ENGINE_TYPE": "NativeEngine"})
    assert p.returncode == 0, p.stderr
    a, b, valid, source = json.loads(p.stdout.strip().splitlines()[-1])
    assert a == b and a[0] == "ValueError"
    for part in ("MXNET_ENGINE_TYPE", "NativeEngine", "NaiveEngine"):
        assert part in a[1], a[1]
    assert valid is False and source == "environment"


def test_unknown_variable_in_environment_warns_once():
    p = run_py("m.get_config(); m.get_config('MXNET_HOME'); print('ok')",
               env={"MXNET_GPU_WORKER_NTHREAD": "3"})
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr
    lines = [ln for ln in p.stderr.splitlines() if "MXNET_GPU_WORKER_NTHREADS" in ln]
    assert len(lines) == 1, p.stderr
    assert "MXNET_GPU_WORKER_NTHREAD " in lines[0] and "did you mean" in lines[0]


def test_no_warning_without_unknown_variables():
    p = run_py("m.get_config(); print('ok')", env={"MXNET_HOME": "/tmp/mx"})
    assert p.returncode == 0 and p.stdout.strip() == "ok"
    assert "mxnet-rt warning" not in p.stderr, p.stderr
