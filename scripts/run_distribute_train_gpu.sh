#!/usr/bin/env bash
# Data-parallel training on GPUs of one server: msrun by default, OpenMPI's mpirun with --mpirun.
#
# Usage: bash scripts/run_distribute_train_gpu.sh [--dry-run] [--mpirun] DEVICE_NUM DATA_PATH CONFIG_PATH [-- TRAIN_ARGS...]
#   DEVICE_NUM   GPUs (one process each)
#   --mpirun     launch with `mpirun -n DEVICE_NUM` (NCCL through OpenMPI) instead of msrun
#   TRAIN_ARGS   forwarded to train.py
# Environment: RUN_DIR (default ./runs/gpu_<time>), PYTHON (default python3), MPIRUN (default mpirun);
#   msrun mode: MASTER_ADDR, MASTER_PORT as in run_distribute_train_msrun.sh.
# Logs: msrun: RUN_DIR/log/worker_<rank>.log; mpirun: RUN_DIR/log/mpi/1/rank.<rank>/stdout.
set -euo pipefail

SCRIPT="$(basename "${BASH_SOURCE[0]}")"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
TRAIN_PY="$ROOT/model_zoo/resnet/train.py"
USAGE="Usage: bash scripts/$SCRIPT [--dry-run] [--mpirun] DEVICE_NUM DATA_PATH CONFIG_PATH [-- TRAIN_ARGS...]"
export RUN_DIR="${RUN_DIR:-$PWD/runs/gpu_$(date +%Y%m%d_%H%M%S)_$$}"

die() { echo "$SCRIPT: error: $*" >&2; exit 2; }
usage_error() { echo "$USAGE" >&2; [[ $# -gt 0 ]] && echo "$SCRIPT: error: $*" >&2; exit 2; }

use_mpirun=0
for arg in "$@"; do
  [[ "$arg" == "--" ]] && break
  [[ "$arg" == "--mpirun" ]] && use_mpirun=1
done
if [[ $use_mpirun -eq 0 ]]; then
  export DEVICE_TARGET=GPU ZOO_SCRIPT_NAME="$SCRIPT"
  exec bash "$HERE/run_distribute_train_msrun.sh" "$@"
fi

dry_run=0
positional=()
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --mpirun) ;;
    -h|--help) echo "$USAGE"; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    -*) usage_error "unknown option '$1' (train.py options go after --)" ;;
    *) positional+=("$1") ;;
  esac
  shift
done
[[ ${#positional[@]} -eq 3 ]] || usage_error "expected DEVICE_NUM DATA_PATH CONFIG_PATH, got ${#positional[@]} arguments"
DEVICE_NUM="${positional[0]}"
[[ "$DEVICE_NUM" =~ ^[1-9][0-9]*$ ]] || usage_error "DEVICE_NUM must be a positive integer, got '$DEVICE_NUM'"
[[ -e "${positional[1]}" ]] || die "DATA_PATH does not exist: ${positional[1]}"
[[ -f "${positional[2]}" ]] || die "CONFIG_PATH is not a file: ${positional[2]}"
DATA_PATH="$(cd "${positional[1]}" && pwd)"
CONFIG_PATH="$(cd "$(dirname "${positional[2]}")" && pwd)/$(basename "${positional[2]}")"
PYTHON="${PYTHON:-python3}"
MPIRUN="${MPIRUN:-mpirun}"
LOG_DIR="$RUN_DIR/log"

train_cmd=("$PYTHON" "$TRAIN_PY" --run_distribute --device_target GPU --config_path "$CONFIG_PATH"
           --data_path "$DATA_PATH" --output_dir "$RUN_DIR/output" ${extra[@]+"${extra[@]}"})
cmd=("$MPIRUN" -n "$DEVICE_NUM" --output-filename "$LOG_DIR/mpi" --merge-stderr-to-stdout "${train_cmd[@]}")

if [[ $dry_run -eq 1 ]]; then
  for (( i = 0; i < DEVICE_NUM; i++ )); do
    echo "rank $i: env OMPI_COMM_WORLD_RANK=$i OMPI_COMM_WORLD_SIZE=$DEVICE_NUM DEVICE_TARGET=GPU (set by mpirun)"
    echo "rank $i: log $LOG_DIR/mpi/1/rank.$i/stdout"
    echo "rank $i: cmd ${train_cmd[*]}"
  done
  echo "launcher: ${cmd[*]}"
  exit 0
fi
command -v "$MPIRUN" >/dev/null 2>&1 || die "'$MPIRUN' not found: install OpenMPI or use the default msrun launch"
mkdir -p "$LOG_DIR"
echo "[$SCRIPT] $DEVICE_NUM GPU processes via mpirun; logs: $LOG_DIR/mpi"
set +e
"${cmd[@]}" >"$LOG_DIR/mpirun.log" 2>&1
status=$?
set -e
echo "[$SCRIPT] exit status $status; logs: $LOG_DIR"
exit "$status"
