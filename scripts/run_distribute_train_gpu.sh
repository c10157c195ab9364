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
USAGE="Usage: bash scripts/$SCRIPT [--dry-run] [--mpirun] DEVICE_NUM DATA_PATH CONFIG_PATH [-- TRAIN_ARGS...]"
# shellcheck source=_launch_common.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/_launch_common.sh"
export RUN_DIR="${RUN_DIR:-$(default_run_dir gpu)}"

use_mpirun=0
for arg in "$@"; do
  [[ "$arg" == "--" ]] && break
  [[ "$arg" == "--mpirun" ]] && use_mpirun=1
done
if [[ $use_mpirun -eq 0 ]]; then
  export DEVICE_TARGET=GPU ZOO_SCRIPT_NAME="$SCRIPT"
  exec bash "$HERE/run_distribute_train_msrun.sh" "$@"
fi

parse_launch_args train.py --mpirun -- "$@"
require_count 3 3 "DEVICE_NUM DATA_PATH CONFIG_PATH"
DEVICE_NUM="${positional[0]}"
require_positive DEVICE_NUM "$DEVICE_NUM"
require_exists DATA_PATH "${positional[1]}"
require_file CONFIG_PATH "${positional[2]}"
DATA_PATH="$(abs_dir "${positional[1]}")"
CONFIG_PATH="$(abs_file "${positional[2]}")"
PYTHON="${PYTHON:-python3}"
MPIRUN="${MPIRUN:-mpirun}"
LOG_DIR="$RUN_DIR/log"

train_cmd=("$PYTHON" "$TRAIN_PY" --run_distribute --device_target GPU --config_path "$CONFIG_PATH"
           --data_path "$DATA_PATH" --output_dir "$RUN_DIR/output" ${extra[@]+"${extra[@]}"})
cmd=("$MPIRUN" -n "$DEVICE_NUM" --output-filename "$LOG_DIR/mpi" --merge-stderr-to-stdout "${train_cmd[@]}")

if [[ $dry_run -eq 1 ]]; then
  for (( i = 0; i < DEVICE_NUM; i++ )); do
    print_rank "$i" "OMPI_COMM_WORLD_RANK=$i OMPI_COMM_WORLD_SIZE=$DEVICE_NUM DEVICE_TARGET=GPU (set by mpirun)" \
      "log $(shq "$LOG_DIR/mpi/1/rank.$i/stdout")" "${train_cmd[@]}"
  done
  echo "launcher: $(shq "${cmd[@]}")"
  exit 0
fi
command -v "$MPIRUN" >/dev/null 2>&1 || die "'$MPIRUN' not found: install OpenMPI or use the default msrun launch"
mkdir -p "$LOG_DIR"
echo "[$SCRIPT] $DEVICE_NUM GPU processes via mpirun; logs: $LOG_DIR/mpi"
run_logged "$LOG_DIR/mpirun.log" "$PWD" "${cmd[@]}"
echo "[$SCRIPT] exit status $status; logs: $LOG_DIR"
exit "$status"
