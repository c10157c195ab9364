#!/usr/bin/env bash
# Evaluate a checkpoint of the ResNet model zoo: top-1 and top-5 accuracy.
#
# Usage: bash scripts/run_eval.sh [--dry-run] DATA_PATH CHECKPOINT CONFIG_PATH [-- EVAL_ARGS...]
#   DATA_PATH    eval data (ImageFolder tree, e.g. /data/imagenet/val, or CIFAR-10 folder with test_batch.bin)
#   CHECKPOINT   .ckpt written by train.py
#   CONFIG_PATH  YAML config the checkpoint was trained with
#   EVAL_ARGS    forwarded to eval.py (e.g. -- --eval_batch_size=64)
# Environment: DEVICE_TARGET (default: Ascend if npu-smi exists, else GPU if nvidia-smi exists, else CPU),
#   DEVICE_ID (default 0), RUN_DIR (default ./runs/eval_<time>), PYTHON (default python3).
# Writes RUN_DIR/eval.log and RUN_DIR/result.json.
set -euo pipefail

SCRIPT="$(basename "${BASH_SOURCE[0]}")"
USAGE="Usage: bash scripts/$SCRIPT [--dry-run] DATA_PATH CHECKPOINT CONFIG_PATH [-- EVAL_ARGS...]"
# shellcheck source=_launch_common.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/_launch_common.sh"

parse_launch_args eval.py -- "$@"
require_count 3 3 "DATA_PATH CHECKPOINT CONFIG_PATH"
require_exists DATA_PATH "${positional[0]}"
require_file CHECKPOINT "${positional[1]}"
require_file CONFIG_PATH "${positional[2]}"
DATA_PATH="$(abs_dir "${positional[0]}")"
CHECKPOINT="$(abs_file "${positional[1]}")"
CONFIG_PATH="$(abs_file "${positional[2]}")"
check_device_target

DEVICE_ID="${DEVICE_ID:-0}"
PYTHON="${PYTHON:-python3}"
RUN_DIR="${RUN_DIR:-$(default_run_dir eval)}"
cmd=("$PYTHON" "$EVAL_PY" --config_path "$CONFIG_PATH" --data_path "$DATA_PATH" --checkpoint_path "$CHECKPOINT"
     --device_target "$DEVICE_TARGET" --output_json "$RUN_DIR/result.json" ${extra[@]+"${extra[@]}"})

if [[ $dry_run -eq 1 ]]; then
  print_rank 0 "DEVICE_ID=$DEVICE_ID DEVICE_TARGET=$DEVICE_TARGET" "cwd $(shq "$PWD") log $(shq "$RUN_DIR/eval.log")" \
    "${cmd[@]}"
  exit 0
fi
make_run_dir "$RUN_DIR"
DEVICE_ID="$DEVICE_ID" run_tee "$RUN_DIR/eval.log" "${cmd[@]}"
if [[ $status -eq 2 && ! -e "$RUN_DIR/result.json" ]]; then
  discard_refused_run "$RUN_DIR/eval.log"  # eval.py refused its input (its one line is on stderr)
  exit 2
fi
echo "[$SCRIPT] exit status $status; log: $RUN_DIR/eval.log"
exit "$status"
