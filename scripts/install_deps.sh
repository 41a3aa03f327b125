#!/usr/bin/env bash
# Installs what weft needs on a fresh Debian machine (run as root): the C++ libraries from Debian,
# the Python build and test tools from PyPI. Safe to run twice.
# Quiet by default: one line per phase, apt's and pip's output in $WEFT_LOG (default
# /tmp/weft-setup.log; on failure its last lines are shown); -v or WEFT_VERBOSE=1 shows it all.
set -euo pipefail
[ "${1:-}" = "-v" ] && export WEFT_VERBOSE=1
source "$(dirname "$0")/quiet.sh"
pip_install() { python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore "$@"; }
# clang + libclang-rt (libFuzzer): the fuzz targets (scripts/fuzz.sh)
pkgs=(build-essential cmake pkg-config libeigen3-dev coinor-libcbc-dev libfmt-dev doctest-dev nlohmann-json3-dev
      clang libclang-rt-14-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  phase "apt: package lists" apt-get update -qq
  phase "apt: ${#missing[@]} package(s) (${missing[*]})" \
    env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
else
  echo "apt: the C++ dependencies are installed"
fi
phase "pip: build tools, numpy, pytest, matplotlib, tqdm" \
  pip_install "scikit-build-core>=0.10" "pybind11>=2.12" numpy pytest pytest-xdist matplotlib tqdm
# Type stubs (scripts/gen_stubs.py: pybind11-stubgen) and their check (mypy on examples/), and the
# example notebooks' execution (nbclient + ipykernel); the tests that need them skip, saying why, without them.
phase "pip: mypy, pybind11-stubgen, nbclient, ipykernel" pip_install mypy pybind11-stubgen nbclient nbformat ipykernel
# Property tests of the public API (tests/python/test_properties.py)
phase "pip: hypothesis" pip_install hypothesis
# PyTorch for the runtime (weft.run, torchrun) and calibration; optional for planning. Pinned: this
# version installs a CPU build (an unpinned torch would pull the CUDA wheels).
phase "pip: torch 2.13.0 (CPU)" pip_install "torch==2.13.0"
# Hugging Face models for the importer's tests (built from small configs, no weights downloaded);
# optional: the tests that need it skip, saying why, when it does not install.
phase "pip: transformers 4.46.1 (optional)" pip_install "transformers==4.46.1" ||
  echo "transformers did not install: the importer's Hugging Face tests will skip"
