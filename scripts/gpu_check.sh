#!/usr/bin/env bash
# The GPU suite, for a machine with an NVIDIA GPU (the device machine; CI has none):
#   1. what the machine is (GPU, driver, CUDA);
#   2. the C test through the public header (tests/c/test_gpu.c), with its small benchmark;
#   3. the Python GPU tests through the stock 1.9.1 frontend (tests/python/test_gpu.py);
#   4. the MLP benchmark against PyTorch on the same GPU (bench/gpu_bench.py).
#
# Inputs, prepared on the build machine (see docs/design/cuda.md, "Running the GPU suite"):
#   .gpu/libmxnet.so.gz   the release library, stripped and compressed (the device transfer
#                         is size-limited);
#   .gpu/core_tests.gz    mxnet-core's unit-test binary, likewise (its CUDA tests run here);
#   .gpu/pymx/mxnet       the stock frontend's Python package without its libraries.
# The device's Python is 3.12 with NumPy 2: tests/python/numpy2_shim.py is loaded first
# (through a .pth file, so that child processes get it too).
# Everything goes to $OUT/gpu_check.log as well (OUT defaults to /tmp/gpu_check).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
status=0
for f in .gpu/*.gz; do gunzip -kf "$f"; done
chmod +x .gpu/libmxnet.so
[ -f .gpu/core_tests ] && chmod +x .gpu/core_tests

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
nvcc --version 2>/dev/null | tail -1 || true
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null || true

# Where the CUDA libraries are (the driver's libcuda is on the loader path already).
libdirs=""
# PyTorch's wheels first: the benchmark loads PyTorch and mxnet-rt in one process, and both
# must load the same cuDNN (two versions in one process fail with SUBLIBRARY_VERSION_MISMATCH).
for f in $(python3 - <<'EOF' 2>/dev/null
import glob, os, site
for s in site.getsitepackages():
    for lib in ("libnvrtc", "libcublas", "libcudnn"):
      for pat in ("nvidia/*/lib/%s.so*" % lib, "nvidia/*/*/lib/%s.so*" % lib):
        print("\n".join(glob.glob(os.path.join(s, pat))))
EOF
) $(ls /usr/local/cuda/lib64/libnvrtc.so* /usr/local/cuda/lib64/libcublas.so* /usr/local/cuda/lib64/libcudnn.so* 2>/dev/null); do
  d=$(dirname "$f")
  case ":$libdirs:" in *":$d:"*) ;; *) libdirs="$libdirs:$d" ;; esac
done
export LD_LIBRARY_PATH="$PWD/.gpu${libdirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"

echo "== Rust unit tests of the CUDA layer, GPU operator forms and storage"
if [ -f .gpu/core_tests ]; then
  timeout 120 .gpu/core_tests cuda:: op::gpu --test-threads 4 || status=1
else
  echo "skipped: no unit-test binary was brought (.gpu/core_tests.gz)"
fi

echo "== C test (tests/c/test_gpu.c)"
gcc -std=c99 -O2 -Wall tests/c/test_gpu.c -Iinclude -L.gpu -lmxnet -lm -o "$OUT/test_gpu" \
  && timeout 300 "$OUT/test_gpu" bench || status=1

echo "== Python tests (tests/python/test_gpu.py)"
site=$(python3 -c 'import site; print(site.getsitepackages()[0])')
mkdir -p /tmp/mxshim
ln -sf "$PWD/.gpu/pymx/mxnet" /tmp/mxshim/mxnet
ln -sf "$PWD/tests/python/numpy2_shim.py" /tmp/mxshim/numpy2_shim.py
printf '/tmp/mxshim\nimport numpy2_shim\n' > "$site/mxnet_rt_shim.pth"
export MXNET_LIBRARY_PATH="$PWD/.gpu/libmxnet.so" PYTHONUNBUFFERED=1
timeout 300 python3 -m pytest -q -p no:cacheprovider --tb=short -W ignore::DeprecationWarning tests/python/test_gpu.py -rs || status=1

echo "== benchmark (bench/gpu_bench.py)"
timeout 300 python3 bench/gpu_bench.py 5 || status=1

echo "== gpu_check: status $status"
exit $status
