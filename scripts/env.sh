# Sourced by scripts/demo.sh and scripts/test.sh: makes sure the tools exist, installing what
# is missing into .venv (a Python virtual environment inside the checkout).
#   MXRT_ENV=demo  cmake, pkg-config and the stock frontend: mxnet==1.9.1 with numpy<1.24
#   MXRT_ENV=test  the same and pytest
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"

command -v cargo >/dev/null || { echo "error: cargo not found; install Rust from rustup.rs" >&2; exit 1; }
command -v cc >/dev/null || { echo "error: a C compiler (cc) is required" >&2; exit 1; }
PY="$(command -v python3 || true)"
[ -n "$PY" ] || { echo "error: python3 is required" >&2; exit 1; }

if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV"
  "$PY" -m venv "$VENV"
fi
export PATH="$VENV/bin:$PATH"

want=(cmake pkgconf "mxnet==1.9.1" "numpy<1.24")
if [ "${MXRT_ENV:-test}" = test ]; then
  want+=(pytest setuptools wheel pillow)  # setuptools, wheel: bindings/python's wheel (test_wheel.py); pillow: test images
fi
# Install only what the venv lacks (a second run starts at once).
missing=()
for req in "${want[@]}"; do
  name="${req%%[=<>]*}"
  "$VENV/bin/python" -m pip show -q "$name" >/dev/null 2>&1 || missing+=("$req")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing into .venv: ${missing[*]}"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${missing[@]}"
fi
# pkgconf from PyPI installs `pkgconf`; offer it under the usual name too.
if ! command -v pkg-config >/dev/null && [ -x "$VENV/bin/pkgconf" ]; then
  ln -sf pkgconf "$VENV/bin/pkg-config"
fi
