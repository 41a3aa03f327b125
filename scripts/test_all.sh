#!/usr/bin/env bash
# Every test on a fresh machine: install; build the Python package (Release, -Werror) with the C++
# tests in the same build tree and run ctest there; install the C++ package and build the example
# consumer against it; run pytest; build again with clang under ASan/UBSan (without the optional
# CUDA/NCCL executor, whose tests need a GPU), the libFuzzer targets in the same tree, and run ctest
# there; fuzz every JSON reader and the spec parser for a bounded time.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
jobs=$(nproc)
# Setup and builds are quiet (one line per phase, their output in $WEFT_LOG, its tail on failure;
# WEFT_VERBOSE=1 shows it all); the tests print their own results.
source scripts/quiet.sh
stage() { echo "== [$(date +%T), ${SECONDS}s] $*"; }
stage "install dependencies"
bash scripts/install_deps.sh

stage "build the Python package and the C++ tests (Release, -Werror) in build/ci"
phase "pip install . (build/ci)" python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore . \
  -C build-dir=build/ci -C cmake.define.WEFT_BUILD_TESTS=ON -C cmake.define.WEFT_WERROR=ON
stage "ctest (Release)"
ctest --test-dir build/ci --output-on-failure -j "$jobs"

stage "C++ example consumer against the installed package"
cmake --install build/ci --prefix "$root/build/ci-install" >/dev/null
cmake -S examples/cpp -B build/ci-consumer -G Ninja -DCMAKE_PREFIX_PATH="$root/build/ci-install" >/dev/null
phase "build the example consumer" cmake --build build/ci-consumer -j "$jobs"
./build/ci-consumer/weft_example

stage "pytest (two workers; then the tests that assert wall-clock bounds, alone)"
(cd "$root/tests/python" && python3 -m pytest -q -n 2 -m "not serial" "$root/tests/python" &&
  python3 -m pytest -q -m serial "$root/tests/python")

stage "C++ build under ASan/UBSan (clang, with the libFuzzer targets in the same tree) and ctest"
# One sanitizer tree serves both: the modules carry libFuzzer's edge counters (no comparison
# tracing), which costs the doctests about 10% over a plain ASan build and saves a second build.
cmake -S . -B build/asan -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
  -DCMAKE_BUILD_TYPE=Debug -DWEFT_SANITIZE=ON -DWEFT_WERROR=ON -DWEFT_BUILD_FUZZERS=ON \
  -DWEFT_BUILD_BENCHMARKS=OFF -DWEFT_ENABLE_NCCL=OFF -DCMAKE_CXX_FLAGS="-O1" \
  -DCMAKE_CXX_FLAGS_DEBUG="-gline-tables-only" >/dev/null  # line tables for the sanitizers' stacks
phase "build under ASan/UBSan (build/asan)" cmake --build build/asan -j "$jobs"
# lsan.supp: a leak inside CoinUtils' presolve (third-party; see the file), nothing of weft's.
ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS="suppressions=$root/scripts/lsan.supp" UBSAN_OPTIONS=print_stacktrace=1 \
  WEFT_SANITIZED=1 ctest --test-dir build/asan --output-on-failure -j "$jobs"

stage "fuzz targets (libFuzzer, ASan/UBSan), 10 s each, one per core at a time"
FUZZ_BUILD_DIR=build/asan SECONDS_PER_TARGET=10 bash scripts/fuzz.sh
stage "all tests passed"
