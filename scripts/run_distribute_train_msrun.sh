#!/usr/bin/env bash
# Data-parallel training launched by msrun (MindSpore's launcher since rank tables were deprecated in 2.4),
# on Ascend, GPU or CPU, one server.
#
# Usage: bash scripts/run_distribute_train_msrun.sh [--dry-run] DEVICE_NUM DATA_PATH CONFIG_PATH [-- TRAIN_ARGS...]
#   DEVICE_NUM   worker processes (one per device)
#   DATA_PATH    training data (ImageFolder tree, or CIFAR-10 binary folder)
#   CONFIG_PATH  YAML config
#   TRAIN_ARGS   forwarded to train.py
# Environment: DEVICE_TARGET (Ascend|GPU|CPU, default Ascend), MASTER_ADDR (default 127.0.0.1),
#   MASTER_PORT (default: a free port), RUN_DIR (default ./runs/msrun_<time>), PYTHON (default python3),
#   MSRUN (default msrun).
# msrun starts DEVICE_NUM workers, each with MS_ROLE=MS_WORKER, MS_WORKER_NUM, MS_SCHED_HOST/PORT and its
# rank; their logs are RUN_DIR/log/worker_<rank>.log (and scheduler.log); checkpoints RUN_DIR/output/ckpt_<rank>.
set -euo pipefail

SCRIPT="${ZOO_SCRIPT_NAME:-$(basename "${BASH_SOURCE[0]}")}"
num_name="${ZOO_NUM_NAME:-DEVICE_NUM}"
USAGE="Usage: bash scripts/$SCRIPT [--dry-run] $num_name DATA_PATH CONFIG_PATH [-- TRAIN_ARGS...]"
# shellcheck source=_launch_common.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/_launch_common.sh"

parse_launch_args train.py -- "$@"
require_count 3 3 "$num_name DATA_PATH CONFIG_PATH"
NUM="${positional[0]}"
require_positive "$num_name" "$NUM"
require_exists DATA_PATH "${positional[1]}"
require_file CONFIG_PATH "${positional[2]}"
DATA_PATH="$(abs_dir "${positional[1]}")"
CONFIG_PATH="$(abs_file "${positional[2]}")"

DEVICE_TARGET="${DEVICE_TARGET:-Ascend}"
check_device_target
PYTHON="${PYTHON:-python3}"
MSRUN="${MSRUN:-msrun}"
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
if [[ -z "${MASTER_PORT:-}" ]]; then
  MASTER_PORT="$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
fi
[[ "$MASTER_PORT" =~ ^[0-9]+$ ]] || die "MASTER_PORT must be a port number, got '$MASTER_PORT'"
RUN_DIR="${RUN_DIR:-$(default_run_dir msrun)}"
LOG_DIR="$RUN_DIR/log"

train_cmd=("$TRAIN_PY" --run_distribute --device_target "$DEVICE_TARGET" --config_path "$CONFIG_PATH"
           --data_path "$DATA_PATH" --output_dir "$RUN_DIR/output" ${extra[@]+"${extra[@]}"})
cmd=("$MSRUN" "--worker_num=$NUM" "--local_worker_num=$NUM" "--master_addr=$MASTER_ADDR"
     "--master_port=$MASTER_PORT" "--log_dir=$LOG_DIR" "--join=True" "${train_cmd[@]}")

if [[ $dry_run -eq 1 ]]; then
  for (( i = 0; i < NUM; i++ )); do
    print_rank "$i" \
      "MS_ROLE=MS_WORKER MS_WORKER_NUM=$NUM MS_SCHED_HOST=$MASTER_ADDR MS_SCHED_PORT=$MASTER_PORT RANK_ID=$i DEVICE_TARGET=$DEVICE_TARGET (set by msrun)" \
      "log $(shq "$LOG_DIR/worker_$i.log")" "$PYTHON" "${train_cmd[@]}"
  done
  echo "launcher: $(shq "${cmd[@]}")"
  exit 0
fi
command -v "$MSRUN" >/dev/null 2>&1 || die "'$MSRUN' not found: install MindSpore (it provides msrun) or set MSRUN"

mkdir -p "$LOG_DIR"
echo "[$SCRIPT] $NUM $DEVICE_TARGET workers via msrun on $MASTER_ADDR:$MASTER_PORT; logs: $LOG_DIR/worker_<rank>.log"
run_logged "$LOG_DIR/msrun.log" "$RUN_DIR" "${cmd[@]}"
if [[ $status -ne 0 ]]; then
  echo "[$SCRIPT] msrun failed with status $status: see $LOG_DIR/msrun.log and $LOG_DIR/worker_*.log" >&2
  tail -n 5 "$LOG_DIR"/worker_*.log >&2 2>/dev/null || true
else
  echo "[$SCRIPT] done; logs: $LOG_DIR"
fi
exit "$status"
