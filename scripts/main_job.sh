#!/usr/bin/env bash
# The main job on a fresh machine: install, build the Python package, plan a real model.
# Setup is quiet (one line per phase, the output in $WEFT_LOG; WEFT_VERBOSE=1 shows it).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/quiet.sh
bash scripts/install_deps.sh
phase "build and install the weft package (C++ and Python)" \
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore .
python3 examples/main_job.py "$@"
