"""Builds the mxnet_rt wheel: the ctypes package, the library beside it (from
``MXNET_RT_LIB``, else the checkout's ``target/release/libmxnet.so``, built with cargo when
absent; copied without its debug information) and the start-up hook (``mxnet_rt.pth`` and
``_mxnet_rt_activate.py``) that makes the stock ``mxnet`` frontend load it. The metadata is in
pyproject.toml.
"""
import os
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def library() -> Path:
    given = os.environ.get("MXNET_RT_LIB")
    if given:
        return Path(given)
    lib = ROOT / "target" / "release" / "libmxnet.so"
    if not lib.is_file() and (ROOT / "Cargo.toml").is_file():
        subprocess.run(["cargo", "build", "--release", "--lib"], cwd=ROOT, check=True)
    return lib


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        lib = library()
        if not lib.is_file():
            raise SystemExit(f"mxnet_rt: {lib} not found (build it with cargo build --release, or set MXNET_RT_LIB)")
        out = Path(self.build_lib)
        dest = out / "mxnet_rt" / "libmxnet.so"
        dest.parent.mkdir(parents=True, exist_ok=True)
        strip = shutil.which("strip")
        if strip is None or subprocess.run([strip, "--strip-debug", "-o", str(dest), str(lib)]).returncode != 0:
            shutil.copy2(lib, dest)
        shutil.copy2(HERE / "mxnet_rt.pth", out / "mxnet_rt.pth")


class BinaryDistribution(Distribution):
    """The wheel holds a shared library: tag it for this platform."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithLibrary}, distclass=BinaryDistribution)
