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
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
EVAL_PY="$ROOT/model_zoo/resnet/eval.py"
USAGE="Usage: bash scripts/$SCRIPT [--dry-run] DATA_PATH CHECKPOINT CONFIG_PATH [-- EVAL_ARGS...]"

die() { echo "$SCRIPT: error: $*" >&2; exit 2; }
usage_error() { echo "$USAGE" >&2; [[ $# -gt 0 ]] && echo "$SCRIPT: error: $*" >&2; exit 2; }
abs_file() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }

dry_run=0
positional=()
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    -h|--help) echo "$USAGE"; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    -*) usage_error "unknown option '$1' (eval.py options go after --)" ;;
    *) positional+=("$1") ;;
  esac
  shift
done
[[ ${#positional[@]} -eq 3 ]] || usage_error "expected DATA_PATH CHECKPOINT CONFIG_PATH, got ${#positional[@]} arguments"
[[ -e "${positional[0]}" ]] || die "DATA_PATH does not exist: ${positional[0]}"
[[ -f "${positional[1]}" ]] || die "CHECKPOINT is not a file: ${positional[1]}"
[[ -f "${positional[2]}" ]] || die "CONFIG_PATH is not a file: ${positional[2]}"
DATA_PATH="$(cd "${positional[0]}" && pwd)"
CHECKPOINT="$(abs_file "${positional[1]}")"
CONFIG_PATH="$(abs_file "${positional[2]}")"

if [[ -z "${DEVICE_TARGET:-}" ]]; then
  if command -v npu-smi >/dev/null 2>&1; then DEVICE_TARGET=Ascend
  elif command -v nvidia-smi >/dev/null 2>&1; then DEVICE_TARGET=GPU
  else DEVICE_TARGET=CPU; fi
fi
case "$DEVICE_TARGET" in Ascend|GPU|CPU) ;; *) die "DEVICE_TARGET must be Ascend, GPU or CPU, got '$DEVICE_TARGET'" ;; esac
DEVICE_ID="${DEVICE_ID:-0}"
PYTHON="${PYTHON:-python3}"
RUN_DIR="${RUN_DIR:-$PWD/runs/eval_$(date +%Y%m%d_%H%M%S)_$$}"
cmd=("$PYTHON" "$EVAL_PY" --config_path "$CONFIG_PATH" --data_path "$DATA_PATH" --checkpoint_path "$CHECKPOINT"
     --device_target "$DEVICE_TARGET" --output_json "$RUN_DIR/result.json" ${extra[@]+"${extra[@]}"})

if [[ $dry_run -eq 1 ]]; then
  echo "rank 0: env DEVICE_ID=$DEVICE_ID DEVICE_TARGET=$DEVICE_TARGET"
  echo "rank 0: cwd $PWD log $RUN_DIR/eval.log"
  echo "rank 0: cmd ${cmd[*]}"
  exit 0
fi
mkdir -p "$RUN_DIR"
set +e
DEVICE_ID="$DEVICE_ID" "${cmd[@]}" 2>&1 | tee "$RUN_DIR/eval.log"
status=${PIPESTATUS[0]}
set -e
echo "[$SCRIPT] exit status $status; log: $RUN_DIR/eval.log"
exit "$status"
