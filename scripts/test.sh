#!/usr/bin/env bash
# Install ms_optim with its test extras into .venv, run the linter (ruff, zero findings) and the whole
# test suite (unit, NumPy-reference, slow and distributed tests; benchmarks are excluded).
# Usage: bash scripts/test.sh [extra pytest args]
# Two pytest workers (pytest-xdist; MS_OPTIM_TEST_WORKERS sets another number, 0 runs in this process),
# each taking whole test files (--dist loadfile: a file's module fixtures, such as the msrun runs of the
# distributed tests, run once). Most tests are bound by MindSpore's single-threaded graph compilation,
# so two workers on two cores take about 0.6 of the serial time.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=_venv.sh source-path=SCRIPTDIR
source "$ROOT/scripts/_venv.sh" "test,examples"
cd "$ROOT"
echo "[ms_optim] ruff check (configuration: ruff.toml, ms_optim/ruff.toml)"
ruff check .
python -m pytest -ra --durations=15 -n "${MS_OPTIM_TEST_WORKERS:-2}" --dist loadfile "$@"
