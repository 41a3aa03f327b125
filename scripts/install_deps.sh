#!/usr/bin/env bash
# Installs what weft needs on a fresh Debian machine (run as root): the C++ libraries from Debian,
# the Python build and test tools from PyPI. Safe to run twice.
set -euo pipefail
# clang + libclang-rt (libFuzzer): the fuzz targets (scripts/fuzz.sh)
pkgs=(build-essential cmake pkg-config libeigen3-dev coinor-libcbc-dev libfmt-dev doctest-dev nlohmann-json3-dev
      clang libclang-rt-14-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
python3 -m pip install -q --disable-pip-version-check "scikit-build-core>=0.10" "pybind11>=2.12" numpy pytest pytest-xdist matplotlib tqdm
# Type stubs (scripts/gen_stubs.py: pybind11-stubgen) and their check (mypy on examples/), and the
# example notebooks' execution (nbclient + ipykernel); the tests that need them skip, saying why, without them.
python3 -m pip install -q --disable-pip-version-check mypy pybind11-stubgen nbclient nbformat ipykernel
# Property tests of the public API (tests/python/test_properties.py)
python3 -m pip install -q --disable-pip-version-check hypothesis
# PyTorch for the runtime (weft.run, torchrun) and calibration; optional for planning. Pinned: this
# version installs a CPU build (an unpinned torch would pull the CUDA wheels).
python3 -m pip install -q --disable-pip-version-check "torch==2.13.0"
# Hugging Face models for the importer's tests (built from small configs, no weights downloaded);
# optional: the tests that need it skip, saying why, when it does not install.
python3 -m pip install -q --disable-pip-version-check "transformers==4.46.1" ||
  echo "transformers did not install: the importer's Hugging Face tests will skip"
