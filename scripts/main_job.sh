#!/usr/bin/env bash
# The main job on a fresh machine: install, build the Python package, plan a real model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
python3 -m pip install -q --disable-pip-version-check .
python3 examples/main_job.py "$@"
