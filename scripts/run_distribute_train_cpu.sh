#!/usr/bin/env bash
# Data-parallel training on CPU: msrun starts WORKER_NUM processes on 127.0.0.1 (mccl backend).
#
# Usage: bash scripts/run_distribute_train_cpu.sh [--dry-run] WORKER_NUM DATA_PATH CONFIG_PATH [-- TRAIN_ARGS...]
# Everything else (logs in RUN_DIR/log/worker_<rank>.log, checkpoints in RUN_DIR/output/ckpt_<rank>,
# MASTER_PORT, RUN_DIR, PYTHON) as in run_distribute_train_msrun.sh.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export DEVICE_TARGET=CPU MASTER_ADDR=127.0.0.1
ZOO_SCRIPT_NAME="$(basename "${BASH_SOURCE[0]}")"
export ZOO_SCRIPT_NAME ZOO_NUM_NAME=WORKER_NUM
export RUN_DIR="${RUN_DIR:-$PWD/runs/cpu_$(date +%Y%m%d_%H%M%S)_$$}"
exec bash "$HERE/run_distribute_train_msrun.sh" "$@"
