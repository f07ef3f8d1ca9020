"""Installed with mxnet_rt (not in editable installs): run at interpreter start-up by
``mxnet_rt.pth``, it points the stock ``mxnet`` frontend at the ``libmxnet.so`` bundled in the
``mxnet_rt`` package by setting ``MXNET_LIBRARY_PATH``, unless that is set already or
``MXNET_RT_ACTIVATE=0``. Reversible: ``pip uninstall mxnet_rt`` removes both files.
Kept tiny: every interpreter of the environment runs it.
"""
import os


def _activate():
    if os.environ.get("MXNET_RT_ACTIVATE", "1") == "0" or os.environ.get("MXNET_LIBRARY_PATH"):
        return
    lib = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mxnet_rt", "libmxnet.so")
    if os.path.isfile(lib):
        os.environ["MXNET_LIBRARY_PATH"] = lib


_activate()
