#!/usr/bin/env bash
# Sourced by the set-up scripts: create (or reuse) the project's virtual environment and install
# ms_optim with the given extras. Usage: source scripts/_venv.sh EXTRAS
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MS_OPTIM_VENV:-$ROOT/.venv}"
PYTHON_BIN="${PYTHON:-python3}"
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "[ms_optim] creating virtual environment in $VENV"
  "$PYTHON_BIN" -m venv "$VENV"
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
echo "[ms_optim] installing ms_optim[$1] (mindspore==2.10.0 on first run: about a minute)"
python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
python -m pip install -q --disable-pip-version-check -e "${ROOT}[$1]"
