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
# Writes RUN_DIR/train.log (also shown on the terminal) and RUN_DIR/output (config + checkpoints).
set -euo pipefail

SCRIPT="$(basename "${BASH_SOURCE[0]}")"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TRAIN_PY="$ROOT/model_zoo/resnet/train.py"
USAGE="Usage: bash scripts/$SCRIPT [--dry-run] DATA_PATH CONFIG_PATH [DEVICE_ID] [-- TRAIN_ARGS...]"

die() { echo "$SCRIPT: error: $*" >&2; exit 2; }
usage_error() { echo "$USAGE" >&2; [[ $# -gt 0 ]] && echo "$SCRIPT: error: $*" >&2; exit 2; }

dry_run=0
positional=()
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    -h|--help) echo "$USAGE"; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    -*) usage_error "unknown option '$1' (train.py options go after --)" ;;
    *) positional+=("$1") ;;
  esac
  shift
done
if [[ ${#positional[@]} -lt 2 || ${#positional[@]} -gt 3 ]]; then
  usage_error "expected DATA_PATH CONFIG_PATH [DEVICE_ID], got ${#positional[@]} arguments"
fi

[[ -e "${positional[0]}" ]] || die "DATA_PATH does not exist: ${positional[0]}"
[[ -f "${positional[1]}" ]] || die "CONFIG_PATH is not a file: ${positional[1]}"
DATA_PATH="$(cd "${positional[0]}" && pwd)"
CONFIG_PATH="$(cd "$(dirname "${positional[1]}")" && pwd)/$(basename "${positional[1]}")"
DEVICE_ID="${positional[2]:-0}"
[[ "$DEVICE_ID" =~ ^[0-9]+$ ]] || usage_error "DEVICE_ID must be a non-negative integer, got '$DEVICE_ID'"

if [[ -z "${DEVICE_TARGET:-}" ]]; then
  if command -v npu-smi >/dev/null 2>&1; then DEVICE_TARGET=Ascend
  elif command -v nvidia-smi >/dev/null 2>&1; then DEVICE_TARGET=GPU
  else DEVICE_TARGET=CPU; fi
fi
case "$DEVICE_TARGET" in Ascend|GPU|CPU) ;; *) die "DEVICE_TARGET must be Ascend, GPU or CPU, got '$DEVICE_TARGET'" ;; esac

PYTHON="${PYTHON:-python3}"
RUN_DIR="${RUN_DIR:-$PWD/runs/standalone_$(date +%Y%m%d_%H%M%S)_$$}"
cmd=("$PYTHON" "$TRAIN_PY" --config_path "$CONFIG_PATH" --data_path "$DATA_PATH"
     --device_target "$DEVICE_TARGET" --output_dir "$RUN_DIR/output" ${extra[@]+"${extra[@]}"})

if [[ $dry_run -eq 1 ]]; then
  echo "rank 0: env DEVICE_ID=$DEVICE_ID RANK_ID=0 RANK_SIZE=1 DEVICE_TARGET=$DEVICE_TARGET"
  echo "rank 0: cwd $PWD log $RUN_DIR/train.log"
  echo "rank 0: cmd ${cmd[*]}"
  exit 0
fi

mkdir -p "$RUN_DIR"
echo "[$SCRIPT] $DEVICE_TARGET device $DEVICE_ID; log: $RUN_DIR/train.log"
set +e
DEVICE_ID="$DEVICE_ID" RANK_ID=0 RANK_SIZE=1 "${cmd[@]}" 2>&1 | tee "$RUN_DIR/train.log"
status=${PIPESTATUS[0]}
set -e
echo "[$SCRIPT] exit status $status; log: $RUN_DIR/train.log"
exit "$status"
