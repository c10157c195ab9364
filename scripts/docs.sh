#!/usr/bin/env bash
# Build the documentation: install ms_optim with its docs extras (Sphinx, its theme, MathJax for offline
# pages) into the virtual environment, build the HTML site into docs/_build/html with warnings as errors,
# then check it against the package (scripts/check_docs.py: every public name with its real signature,
# every listed member, figures with their source, benchmarks/results holding what the pages cite).
# Needs no network beyond the install: no inventory or image is fetched during the build.
# Usage: bash scripts/docs.sh [extra sphinx-build arguments]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=_venv.sh source-path=SCRIPTDIR
source "$ROOT/scripts/_venv.sh" docs
cd "$ROOT"
export GLOG_v="${GLOG_v:-3}"   # MindSpore: errors only (autodoc imports it)
# -E: read every page again, so that a warning of an unchanged page is not skipped
sphinx-build -W --keep-going -E -b html docs docs/_build/html "$@"
python scripts/check_docs.py docs/_build/html
echo "[ms_optim] documentation: $ROOT/docs/_build/html/index.html"
