#!/usr/bin/env bash
# Builds libmxnet.so, installs it with its CMake package into build/demo-prefix, builds the C
# and C++ examples against it with find_package(MXNet), and runs them.
set -euo pipefail
MXRT_ENV=demo source "$(dirname "$0")/env.sh"
cd "$ROOT"

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMXNET_RT_BUILD_TESTS=OFF >/dev/null
cmake --build build -j 2
cmake --install build --prefix build/demo-prefix >/dev/null
cmake -S examples/c -B build/demo-examples -DCMAKE_PREFIX_PATH="$ROOT/build/demo-prefix" >/dev/null
cmake --build build/demo-examples -j 2 >/dev/null
echo "== examples/c/demo.c"
build/demo-examples/demo_c
echo "== examples/c/demo.cpp"
build/demo-examples/demo_cpp
