#!/usr/bin/env bash
# Train the ResNet model zoo on one device (Ascend, GPU or CPU).
#
# Usage: bash scripts/run_standalone_train.sh [--dry-run] DATA_PATH CONFIG_PATH [DEVICE_ID] [-- TRAIN_ARGS...]
#   DATA_PATH    training data (ImageFolder tree, or CIFAR-10 binary folder)
#   CONFIG_PATH  YAML config, e.g. model_zoo/resnet/configs/resnet18_cifar10_thor.yaml
#   DEVICE_ID    device to use (default 0; exported as DEVICE_ID)
#   TRAIN_ARGS   forwarded to train.py, e.g. -- --epoch_size=2 --resume ckpt
# Environment: DEVICE_TARGET (Ascend|GPU|CPU; default: Ascend if npu-smi exists, else GPU if nvidia-smi
#   exists, else CPU), RUN_DIR (default ./runs/standalone_<time>), PYTHON (default python3).
# Writes RUN_DIR/train.log (also shown on the terminal: train.py's stdout on stdout, its stderr on stderr)
# and RUN_DIR/output (config + checkpoints). When train.py refuses its input (exit status 2, one line on
# stderr) nothing is left behind: no log, no RUN_DIR. --dry-run quotes paths as a shell needs them.
set -euo pipefail

SCRIPT="$(basename "${BASH_SOURCE[0]}")"
USAGE="Usage: bash scripts/$SCRIPT [--dry-run] DATA_PATH CONFIG_PATH [DEVICE_ID] [-- TRAIN_ARGS...]"
# shellcheck source=_launch_common.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/_launch_common.sh"

parse_launch_args train.py -- "$@"
require_count 2 3 "DATA_PATH CONFIG_PATH [DEVICE_ID]"

require_exists DATA_PATH "${positional[0]}"
require_file CONFIG_PATH "${positional[1]}"
DATA_PATH="$(abs_dir "${positional[0]}")"
CONFIG_PATH="$(abs_file "${positional[1]}")"
DEVICE_ID="${positional[2]:-0}"
[[ "$DEVICE_ID" =~ ^[0-9]+$ ]] || usage_error "DEVICE_ID must be a non-negative integer, got '$DEVICE_ID'"
check_device_target

PYTHON="${PYTHON:-python3}"
RUN_DIR="${RUN_DIR:-$(default_run_dir standalone)}"
cmd=("$PYTHON" "$TRAIN_PY" --config_path "$CONFIG_PATH" --data_path "$DATA_PATH"
     --device_target "$DEVICE_TARGET" --output_dir "$RUN_DIR/output" ${extra[@]+"${extra[@]}"})

if [[ $dry_run -eq 1 ]]; then
  print_rank 0 "DEVICE_ID=$DEVICE_ID RANK_ID=0 RANK_SIZE=1 DEVICE_TARGET=$DEVICE_TARGET" \
    "cwd $(shq "$PWD") log $(shq "$RUN_DIR/train.log")" "${cmd[@]}"
  exit 0
fi

make_run_dir "$RUN_DIR"
echo "[$SCRIPT] $DEVICE_TARGET device $DEVICE_ID; log: $RUN_DIR/train.log"
DEVICE_ID="$DEVICE_ID" RANK_ID=0 RANK_SIZE=1 run_tee "$RUN_DIR/train.log" "${cmd[@]}"
if [[ $status -eq 2 && ! -e "$RUN_DIR/output" ]]; then
  discard_refused_run "$RUN_DIR/train.log"  # train.py refused its input (its one line is on stderr)
  exit 2
fi
echo "[$SCRIPT] exit status $status; log: $RUN_DIR/train.log"
exit "$status"
