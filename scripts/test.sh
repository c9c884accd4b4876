#!/usr/bin/env bash
# Run the whole test suite (slow tests included) with the settings CI uses.
set -euo pipefail
cd "$(dirname "$0")/.."
# Two busy torch threads next to another process collapse on 2 cores (ENVIRONMENT.md).
export OMP_WAIT_POLICY=PASSIVE
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export RAY_USAGE_STATS_ENABLED=0
exec .venv/bin/python -m pytest "$@"
