# shellcheck shell=bash
# shellcheck disable=SC2034  # sets variables (dry_run, positional, extra, flags, status, ...) for the launcher
# Helpers shared by the ResNet model-zoo launchers (scripts/run_*.sh); sourced, never run.
# The launcher sets SCRIPT (name shown in messages) and USAGE (its usage line) before sourcing.
# Defines ROOT (repository root), HERE (scripts/), TRAIN_PY and EVAL_PY.

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
TRAIN_PY="$ROOT/model_zoo/resnet/train.py"
EVAL_PY="$ROOT/model_zoo/resnet/eval.py"

die() { echo "$SCRIPT: error: $*" >&2; exit 2; }
usage_error() { echo "$USAGE" >&2; [[ $# -gt 0 ]] && echo "$SCRIPT: error: $*" >&2; exit 2; }
abs_file() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }
abs_dir() { (cd "$1" && pwd); }

# parse_launch_args PY_NAME [FLAG...] -- ARGS...
# Splits ARGS into dry_run (0/1), positional, extra (everything after --, forwarded to PY_NAME) and
# flags (the launcher's own FLAGs that were given); -h/--help prints USAGE; any other option is an error.
parse_launch_args() {
  local py_name="$1" allowed=" " arg
  shift
  while [[ $# -gt 0 && "$1" != "--" ]]; do allowed+="$1 "; shift; done
  shift
  dry_run=0
  positional=()
  extra=()
  flags=()
  while [[ $# -gt 0 ]]; do
    arg="$1"
    case "$arg" in
      --dry-run) dry_run=1 ;;
      -h|--help) echo "$USAGE"; exit 0 ;;
      --) shift; extra=("$@"); break ;;
      -*)
        [[ "$allowed" == *" $arg "* ]] || usage_error "unknown option '$arg' ($py_name options go after --)"
        flags+=("$arg") ;;
      *) positional+=("$arg") ;;
    esac
    shift
  done
}

# has_flag FLAG: was the launcher's own FLAG given (see parse_launch_args)?
has_flag() {
  local f
  for f in ${flags[@]+"${flags[@]}"}; do [[ "$f" == "$1" ]] && return 0; done
  return 1
}

# require_count MIN MAX EXPECTED: MIN..MAX positional arguments, else a usage error naming EXPECTED.
require_count() {
  if [[ ${#positional[@]} -lt $1 || ${#positional[@]} -gt $2 ]]; then
    usage_error "expected $3, got ${#positional[@]} arguments"
  fi
}

require_exists() { [[ -e "$2" ]] || die "$1 does not exist: $2"; }
require_file() { [[ -f "$2" ]] || die "$1 is not a file: $2"; }
require_positive() { [[ "$2" =~ ^[1-9][0-9]*$ ]] || usage_error "$1 must be a positive integer, got '$2'"; }

# check_device_target: DEVICE_TARGET, auto-detected when unset (Ascend if npu-smi exists, else GPU if
# nvidia-smi exists, else CPU), must be Ascend, GPU or CPU.
check_device_target() {
  if [[ -z "${DEVICE_TARGET:-}" ]]; then
    if command -v npu-smi >/dev/null 2>&1; then DEVICE_TARGET=Ascend
    elif command -v nvidia-smi >/dev/null 2>&1; then DEVICE_TARGET=GPU
    else DEVICE_TARGET=CPU; fi
  fi
  case "$DEVICE_TARGET" in Ascend|GPU|CPU) ;; *) die "DEVICE_TARGET must be Ascend, GPU or CPU, got '$DEVICE_TARGET'" ;; esac
}

# default_run_dir KIND: ./runs/KIND_<time>_<pid>
default_run_dir() { echo "$PWD/runs/${1}_$(date +%Y%m%d_%H%M%S)_$$"; }

# shq WORD...: the words quoted as a shell needs them (printf %q), space-separated, e.g. for paths with spaces.
shq() {
  local out
  printf -v out '%q ' "$@"
  printf '%s' "${out% }"
}

# print_rank RANK ENV WHERE CMD...: the three dry-run lines of one rank (ENV and WHERE quote their own
# values with shq; CMD is quoted here), so each line can be pasted into a shell.
print_rank() {
  local rank="$1" env="$2" where="$3"
  shift 3
  echo "rank $rank: env $env"
  echo "rank $rank: $where"
  echo "rank $rank: cmd $(shq "$@")"
}

# make_run_dir DIR: mkdir -p DIR, remembering in created_dirs the directories it created (deepest first).
make_run_dir() {
  local dir="$1"
  created_dirs=()
  while [[ ! -e "$dir" ]]; do
    created_dirs+=("$dir")
    dir="$(dirname "$dir")"
  done
  mkdir -p "$1"
}

# discard_refused_run LOG: after the Python script refused its input (exit status 2, nothing written),
# remove LOG and the directories make_run_dir created, if nothing else is in them.
discard_refused_run() {
  local dir
  rm -f "$1"
  for dir in ${created_dirs[@]+"${created_dirs[@]}"}; do
    rmdir "$dir" 2>/dev/null || return 0
  done
}

# run_tee LOG CMD...: run CMD, its stdout to the terminal's stdout, its stderr to the terminal's stderr,
# and both to LOG; sets status to CMD's exit status.
run_tee() {
  local log="$1"
  shift
  : >"$log"
  set +e
  # stdout goes to fd 4 (the outer tee), stderr into the inner tee, which writes it back to stderr;
  # with pipefail the group's status is CMD's.
  { "$@" 2>&1 1>&4 4>&- | tee -a "$log" >&2; } 4>&1 | tee -a "$log"
  status=${PIPESTATUS[0]}
  set -e
}

# run_logged LOG DIR CMD...: run CMD in DIR, its output to LOG only; sets status to CMD's exit status.
run_logged() {
  local log="$1" dir="$2"
  shift 2
  set +e
  (cd "$dir" && "$@") >"$log" 2>&1
  status=$?
  set -e
}
