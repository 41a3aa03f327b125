#!/usr/bin/env bash
# Every test on a fresh machine: install, build with warnings as errors and run ctest, build again
# under ASan/UBSan and run ctest, install the C++ package and build the example consumer against
# it, build the Python package and run pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
jobs=$(nproc)
bash scripts/install_deps.sh

echo "== C++ build (Release, -Werror) and ctest"
cmake -S . -B build/ci -G Ninja -DCMAKE_BUILD_TYPE=Release -DWEFT_WERROR=ON \
  -DCMAKE_INSTALL_PREFIX="$root/build/ci-install" >/dev/null
cmake --build build/ci -j "$jobs"
ctest --test-dir build/ci --output-on-failure -j "$jobs"

echo "== C++ example consumer against the installed package"
cmake --install build/ci >/dev/null
cmake -S examples/cpp -B build/ci-consumer -G Ninja -DCMAKE_PREFIX_PATH="$root/build/ci-install" >/dev/null
cmake --build build/ci-consumer -j "$jobs"
./build/ci-consumer/weft_example

echo "== C++ build under ASan/UBSan and ctest"
cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DWEFT_SANITIZE=ON -DWEFT_WERROR=ON \
  -DWEFT_BUILD_BENCHMARKS=OFF -DCMAKE_CXX_FLAGS="-O1" >/dev/null
cmake --build build/asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 WEFT_SANITIZED=1 \
  ctest --test-dir build/asan --output-on-failure -j "$jobs"

echo "== Python package and pytest"
python3 -m pip install -q --disable-pip-version-check .
cd "$root/tests/python" && python3 -m pytest -q "$root/tests/python"
