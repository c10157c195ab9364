#!/usr/bin/env bash
# Sourced by the set-up scripts: create (or reuse) the project's virtual environment and install
# ms_optim with the given extras. Usage: source scripts/_venv.sh EXTRAS
# NumPy: MindSpore's compiled NumPy bridge is built against NumPy 1.x (2.7 requires numpy<2; 2.10
# accepts NumPy 2 but prints NumPy's "compiled using NumPy 1.x" traceback on a user's first eager op),
# so the set-up installs numpy<2 by default. ms_optim itself works with both (CI also tests NumPy 2).
# Environment: MS_OPTIM_VENV (default .venv), PYTHON (default python3),
#   MS_OPTIM_MINDSPORE (pip requirement, default: the newest allowed by setup.py),
#   MS_OPTIM_NUMPY (pip requirement, default "numpy<2").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MS_OPTIM_VENV:-$ROOT/.venv}"
PYTHON_BIN="${PYTHON:-python3}"
NUMPY_REQ="${MS_OPTIM_NUMPY:-numpy<2}"
MINDSPORE_REQ="${MS_OPTIM_MINDSPORE:-}"
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "[ms_optim] creating virtual environment in $VENV"
  "$PYTHON_BIN" -m venv "$VENV"
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
echo "[ms_optim] installing ms_optim[$1] with ${MINDSPORE_REQ:-mindspore} and $NUMPY_REQ" \
  "(MindSpore on first run: about a minute)"
python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
python -m pip install -q --disable-pip-version-check -e "${ROOT}[$1]" "$NUMPY_REQ" ${MINDSPORE_REQ:+"$MINDSPORE_REQ"}
python - <<'PY'
import mindspore
import numpy

print(f"[ms_optim] MindSpore {mindspore.__version__}, NumPy {numpy.__version__}")
PY
