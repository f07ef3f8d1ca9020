"""The Python package (issue 38): `pip install bindings/python` ships libmxnet.so inside
`mxnet_rt` and a start-up hook (`mxnet_rt.pth`) that points the unmodified stock `mxnet`
frontend at it, without MXNET_LIBRARY_PATH set by hand; `MXNET_RT_ACTIVATE=0` (or an explicit
MXNET_LIBRARY_PATH) turns it off, and the ctypes module stays importable.

The package is installed into a temporary directory (`pip install --target`), which the
child interpreters add as a site directory, the way site-packages is read at start-up (.pth
files included). The wheel is built from the release library (MXNET_RT_LIB).
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif("MXNET_LIBRARY_PATH" not in os.environ,
                                reason="MXNET_LIBRARY_PATH is not set: no library of ours to package")

PROBE = r"""
import os, site, sys
site.addsitedir(sys.argv[1])
print(os.environ.get("MXNET_LIBRARY_PATH", "-"))
import mxnet as mx
print(mx.base._LIB._name)
print(float((mx.nd.ones((2, 3)) * 2).sum().asscalar()))
import mxnet_rt
print(mxnet_rt.find_library(), mxnet_rt.version())
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    target = tmp_path_factory.mktemp("site")
    env = dict(os.environ, MXNET_RT_LIB=os.environ["MXNET_LIBRARY_PATH"])
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "--no-build-isolation", "--no-deps", "--target", str(target), str(ROOT / "bindings" / "python")],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return target


def probe(target, **env):
    e = {k: v for k, v in os.environ.items() if k != "MXNET_LIBRARY_PATH"}
    e.update(env)
    r = subprocess.run([sys.executable, "-c", PROBE, str(target)], env=e, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.split("\n")


def test_wheel_holds_the_library_and_the_hook(installed):
    lib = installed / "mxnet_rt" / "libmxnet.so"
    assert lib.is_file() and (installed / "mxnet_rt.pth").is_file()
    assert (installed / "_mxnet_rt_activate.py").is_file()
    # The bundled copy is the release library without its debug information.
    assert 0 < lib.stat().st_size <= Path(os.environ["MXNET_LIBRARY_PATH"]).stat().st_size


def test_stock_frontend_uses_the_bundled_library(installed):
    bundled = str(installed / "mxnet_rt" / "libmxnet.so")
    env_seen, loaded, total, found = probe(installed)[:4]
    assert env_seen == bundled and loaded == bundled
    assert float(total) == 12.0
    assert found.split()[0] == bundled and found.split()[1] == "10901"


def test_the_hook_can_be_turned_off(installed):
    env_seen, loaded, total = probe(installed, MXNET_RT_ACTIVATE="0")[:3]
    assert env_seen == "-" and loaded.endswith(os.path.join("mxnet", "libmxnet.so"))
    assert "mxnet_rt" not in loaded and float(total) == 12.0
    # An explicit MXNET_LIBRARY_PATH wins over the hook.
    ours = os.environ["MXNET_LIBRARY_PATH"]
    env_seen, loaded = probe(installed, MXNET_LIBRARY_PATH=ours)[:2]
    assert env_seen == ours and loaded == ours
