#!/usr/bin/env bash
# Quickstart: create (or reuse) the virtual environment, install ms_optim, then train LeNet5 on
# scikit-learn's handwritten digits (32x32, 20% held out) with THOR, Momentum, Lamb, LARS(Momentum)
# and ASGD on CPU, 5 epochs each, every learning rate from model_zoo/lenet/tuned_lr.json (one grid
# search for all, model_zoo/lenet/tune.py), and with THOR adaptive: the same THOR call with
# learning_rate and damping "adaptive" (no learning rate from any grid). Shows progress while training
# (a bar on a terminal, a line per epoch in logs), then a comparison table (final loss, test accuracy,
# training time, time to 85%, and why a row is below 90%, read from its accuracy history) and saves a
# plot of test accuracy against training seconds.
# About 4 minutes on an idle 2-core machine after the first install.
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
  --optimizers thor thor_adaptive momentum lamb lars asgd \
  --epochs 5 --max-seconds 120 --eval-every 11 \
  --plot "$OUT/lenet_digits_accuracy.png" --json "$OUT/lenet_digits.json" "$@"
