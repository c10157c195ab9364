#!/usr/bin/env bash
# Install ms_optim with its test extras into .venv, run the linter (ruff, zero findings) and the whole
# test suite (unit, NumPy-reference, slow and distributed tests; benchmarks are excluded).
# Usage: bash scripts/test.sh [extra pytest args]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=_venv.sh source-path=SCRIPTDIR
source "$ROOT/scripts/_venv.sh" "test,examples"
cd "$ROOT"
echo "[ms_optim] ruff check (configuration: ruff.toml)"
ruff check .
python -m pytest -ra --durations=15 "$@"
