#!/usr/bin/env bash
# Install into ./.venv and run the main job: `python -m rope_kernels.bench --mode quick`
# (on a GPU: measure and rewrite figures/; without one: check the kernels in Triton's
# interpreter and print the recorded GPU run). Set PIP_CONSTRAINT to pin versions, e.g.
# PIP_CONSTRAINT=.ci/constraints-cpu.txt for a CPU-only torch (what CI uses).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[test,notebooks]"
.venv/bin/python -m rope_kernels.bench --mode quick
