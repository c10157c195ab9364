#!/usr/bin/env bash
# Quickstart: create (or reuse) the virtual environment, install ms_optim, then train LeNet5 on
# scikit-learn's handwritten digits (32x32, 20% held out) with THOR and with Momentum (plus Lamb,
# LARS(Momentum) and ASGD as extra rows), on CPU. Prints a comparison table (final loss, test
# accuracy, training time, time to 97% test accuracy) and saves a plot of test accuracy against
# training seconds. About 3 minutes on a 2-core machine after the first install.
# Usage: bash scripts/quickstart.sh [extra arguments for model_zoo/lenet/compare.py]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=_venv.sh source-path=SCRIPTDIR
source "$ROOT/scripts/_venv.sh" examples
cd "$ROOT"
OUT="${MS_OPTIM_OUT:-$ROOT/outputs/quickstart}"
mkdir -p "$OUT"
export GLOG_v="${GLOG_v:-3}"   # MindSpore: errors only
python model_zoo/lenet/compare.py \
  --optimizers thor momentum lamb lars asgd \
  --lr momentum=0.03 lars=0.03 \
  --epochs 6 --max-seconds 45 --eval-every 11 --quiet \
  --plot "$OUT/lenet_digits_accuracy.png" --json "$OUT/lenet_digits.json" "$@"
