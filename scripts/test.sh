#!/usr/bin/env bash
# Runs every test: Rust unit tests (incl. the freshness of the header and of the table in
# docs/configuration.md), the Rust and Node.js bindings' tests and examples, the C/C++ tests
# and examples through CTest, and the Python tests.
# Installs what it needs into .venv first.
set -euo pipefail
MXRT_ENV=test source "$(dirname "$0")/env.sh"
cd "$ROOT"

echo "== formatting and lints (cargo fmt --check, cargo clippy -D warnings)"
cargo fmt --check
cargo clippy --all-targets -- -D warnings
echo "== Rust unit tests"
cargo test --release --all-targets
echo "== build libmxnet.so"
cargo build --release --lib
echo "== Rust binding (bindings/rust, linked against the library just built): lints, tests, example"
(cd bindings/rust && cargo fmt --check && cargo clippy --release --all-targets -- -D warnings \
  && cargo test --release && mkdir -p "$ROOT/build" \
  && cargo run --release --example demo "$ROOT/build/rust_demo_profile.json")
echo "== Node.js binding (bindings/node, koffi from npm): tests, example"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "== installing nodejs and npm"
  if [ "$(id -u)" = 0 ]; then apt-get install -y -q nodejs npm >/dev/null; else sudo -n apt-get install -y -q nodejs npm >/dev/null; fi
fi
(cd bindings/node && npm ci --no-audit --no-fund --loglevel=error \
  && MXNET_LIBRARY_PATH="$ROOT/target/release/libmxnet.so" node --test test/ \
  && MXNET_LIBRARY_PATH="$ROOT/target/release/libmxnet.so" node example.js "$ROOT/build/node_demo_profile.json")
echo "== C/C++ tests (CTest, with the memcheck tests under valgrind)"
if ! command -v valgrind >/dev/null; then
  echo "== installing valgrind"
  if [ "$(id -u)" = 0 ]; then apt-get install -y -q valgrind >/dev/null; else sudo -n apt-get install -y -q valgrind >/dev/null; fi
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMXNET_RT_BUILD_TESTS=ON -DMXNET_RT_REQUIRE_VALGRIND=ON >/dev/null
cmake --build build -j 2
ctest --test-dir build --output-on-failure
echo "== Python tests"
if ! command -v mpirun >/dev/null; then
  # Open MPI: the distributed KVStore's tests run two ranks under mpirun (the library loads
  # libmpi at run time; nothing is built against it).
  echo "== installing openmpi-bin"
  if [ "$(id -u)" = 0 ]; then apt-get install -y -q openmpi-bin >/dev/null; else sudo -n apt-get install -y -q openmpi-bin >/dev/null; fi
fi
MXNET_LIBRARY_PATH="$ROOT/target/release/libmxnet.so" python -m pytest -q tests/python
