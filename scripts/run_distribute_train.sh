#!/usr/bin/env bash
# Data-parallel training on Ascend with a rank table (the MindSpore model-zoo convention).
#
# Usage: bash scripts/run_distribute_train.sh [--dry-run] [--taskset] RANK_TABLE_FILE DATA_PATH CONFIG_PATH
#            [DEVICE_NUM] [-- TRAIN_ARGS...]
#   RANK_TABLE_FILE  hccl rank table (JSON, e.g. from hccl_tools.py)
#   DATA_PATH        training data (ImageFolder tree, e.g. /data/imagenet/train)
#   CONFIG_PATH      e.g. model_zoo/resnet/configs/resnet50_imagenet2012_thor_ascend.yaml
#   DEVICE_NUM       processes/devices on this server (default 8; at most the devices in the table)
#   --taskset        pin process i to cores [i*C, (i+1)*C-1], C = cores / DEVICE_NUM
#   TRAIN_ARGS       forwarded to train.py
# Exports RANK_TABLE_FILE, RANK_SIZE, DEVICE_NUM and, per process, DEVICE_ID = DEVICE_START + i and
# RANK_ID = RANK_START + i (DEVICE_START, RANK_START default 0). Each rank runs in RUN_DIR/train_parallel<i>
# with its log there (train.log); checkpoints go to RUN_DIR/output/ckpt_<rank>.
# Environment: RUN_DIR (default ./runs/ascend_<time>), PYTHON (default python3). Waits for all ranks;
# exit status is non-zero if any rank fails.
set -euo pipefail

SCRIPT="$(basename "${BASH_SOURCE[0]}")"
USAGE="Usage: bash scripts/$SCRIPT [--dry-run] [--taskset] RANK_TABLE_FILE DATA_PATH CONFIG_PATH [DEVICE_NUM] [-- TRAIN_ARGS...]"
# shellcheck source=_launch_common.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/_launch_common.sh"

parse_launch_args train.py --taskset -- "$@"
pin=0
has_flag --taskset && pin=1
require_count 3 4 "RANK_TABLE_FILE DATA_PATH CONFIG_PATH [DEVICE_NUM]"
require_file RANK_TABLE_FILE "${positional[0]}"
require_exists DATA_PATH "${positional[1]}"
require_file CONFIG_PATH "${positional[2]}"
DEVICE_NUM="${positional[3]:-8}"
require_positive DEVICE_NUM "$DEVICE_NUM"
RANK_TABLE_FILE="$(abs_file "${positional[0]}")"
DATA_PATH="$(abs_dir "${positional[1]}")"
CONFIG_PATH="$(abs_file "${positional[2]}")"
PYTHON="${PYTHON:-python3}"

# The table must be JSON and list at least DEVICE_NUM devices.
table_devices="$("$PYTHON" - "$RANK_TABLE_FILE" <<'PY' 2>/dev/null || true
import json, sys
table = json.load(open(sys.argv[1]))
print(sum(len(server.get("device", [])) for server in table["server_list"]))
PY
)"
[[ "$table_devices" =~ ^[0-9]+$ ]] || die "RANK_TABLE_FILE is not a rank table (JSON with server_list[].device[]): $RANK_TABLE_FILE"
(( table_devices >= DEVICE_NUM )) || die "RANK_TABLE_FILE lists $table_devices devices, fewer than DEVICE_NUM=$DEVICE_NUM"

DEVICE_START="${DEVICE_START:-0}"
RANK_START="${RANK_START:-0}"
RUN_DIR="${RUN_DIR:-$(default_run_dir ascend)}"
cores="$(nproc 2>/dev/null || echo 1)"
per_proc=$(( cores / DEVICE_NUM ))
(( per_proc >= 1 )) || per_proc=1
export RANK_TABLE_FILE DEVICE_NUM
export RANK_SIZE="$DEVICE_NUM"

pids=()
for (( i = 0; i < DEVICE_NUM; i++ )); do
  device_id=$(( DEVICE_START + i ))
  rank_id=$(( RANK_START + i ))
  work="$RUN_DIR/train_parallel$i"
  cmd=()
  if [[ $pin -eq 1 ]]; then
    cmd+=(taskset -c "$(( i * per_proc ))-$(( (i + 1) * per_proc - 1 ))")
  fi
  cmd+=("$PYTHON" "$TRAIN_PY" --run_distribute --device_target Ascend --config_path "$CONFIG_PATH"
        --data_path "$DATA_PATH" --output_dir "$RUN_DIR/output" ${extra[@]+"${extra[@]}"})
  if [[ $dry_run -eq 1 ]]; then
    print_rank "$rank_id" \
      "RANK_TABLE_FILE=$(shq "$RANK_TABLE_FILE") RANK_SIZE=$RANK_SIZE DEVICE_NUM=$DEVICE_NUM DEVICE_ID=$device_id RANK_ID=$rank_id" \
      "cwd $(shq "$work") log $(shq "$work/train.log")" "${cmd[@]}"
    continue
  fi
  mkdir -p "$work"
  echo "[$SCRIPT] rank $rank_id on device $device_id: log $work/train.log"
  (cd "$work" && DEVICE_ID="$device_id" RANK_ID="$rank_id" exec "${cmd[@]}" >"$work/train.log" 2>&1) &
  pids+=("$!")
done
[[ $dry_run -eq 1 ]] && exit 0

status=0
for (( i = 0; i < ${#pids[@]}; i++ )); do
  if ! wait "${pids[$i]}"; then
    echo "[$SCRIPT] rank $(( RANK_START + i )) failed: see $RUN_DIR/train_parallel$i/train.log" >&2
    status=1
  fi
done
echo "[$SCRIPT] done (status $status); logs in $RUN_DIR/train_parallel*/train.log"
exit "$status"
