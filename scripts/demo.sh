#!/usr/bin/env bash
# The demo: builds libmxnet.so (cmake, which runs cargo), trains seed 004's CNN with the
# unmodified stock Python frontend (mxnet==1.9.1 from .venv) on this library, printing the loss
# and the profiler's aggregate table and writing a Chrome trace (build/demo/profile.json, for
# https://ui.perfetto.dev or chrome://tracing); then installs the library with its CMake package
# into build/demo-prefix, builds the C and C++ examples against it with find_package(MXNet),
# and runs them. Fails if the loss does not fall.
set -euo pipefail
MXRT_ENV=demo source "$(dirname "$0")/env.sh"
cd "$ROOT"

echo "== build libmxnet.so (cmake -> cargo build --release)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMXNET_RT_BUILD_TESTS=OFF >/dev/null
cmake --build build -j 2
LIB="$ROOT/target/release/libmxnet.so"

echo
echo "== examples/python/train_cnn.py: the stock mxnet==1.9.1 frontend on $LIB"
MXNET_LIBRARY_PATH="$LIB" "$VENV/bin/python" examples/python/train_cnn.py \
  --trace "$ROOT/build/demo/profile.json"

echo
echo "== install into build/demo-prefix; build the C/C++ examples with find_package(MXNet)"
cmake --install build --prefix build/demo-prefix >/dev/null
cmake -S examples/c -B build/demo-examples -DCMAKE_PREFIX_PATH="$ROOT/build/demo-prefix" >/dev/null
cmake --build build/demo-examples -j 2 >/dev/null
echo "== examples/c/demo.c"
build/demo-examples/demo_c
echo "== examples/c/demo.cpp"
build/demo-examples/demo_cpp
echo
echo "== done; the training profile is $ROOT/build/demo/profile.json (open it at https://ui.perfetto.dev)"
