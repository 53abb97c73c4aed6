#!/usr/bin/env bash
# One command on the 8-GPU node: the search-agent recipe from data to a guarded verl 0.9.1 GRPO run.
#
#   recipe/run.sh [--config grpo_qwen7b|grpo_collapse_demo] [--no-guardian] [--guardian-args "ARGS"]
#                 [--corpus FILE] [--ray-address ADDR] [--dry-run] [--] [hydra overrides, e.g. trainer.total_training_steps=10]
#
# Steps (each logs "run.sh: step N/7 <name>: ..."):
#   1 check GPUs          nvidia-smi sees at least the config's trainer.n_gpus_per_node GPUs (first: fail fast)
#   2 prepare data        python -m recipe.prepare_data, unless $RECIPE_DATA/{train,val}.parquet exist
#   3 build index         python -m recipe.search.index over the wiki-18 corpus, unless $RECIPE_INDEX has files
#   4 start retrieval server   python -m recipe.search.server in the background (stopped on exit), unless one
#                              already answers /health at the same address
#   5 wait for retrieval server  GET /health until it answers ($RECIPE_HEALTH_TIMEOUT seconds)
#   6 start Ray           ray start --head, unless --ray-address / $RAY_ADDRESS is given or a local cluster runs
#   7 launch training     guardian run -- python -m verl.trainer.main_ppo --config-path ... --config-name ...
set -euo pipefail

PROG=run.sh
STEPS=7

usage() {
  cat <<'EOF'
usage: recipe/run.sh [options] [--] [hydra overrides...]
       python -m recipe [options] [--] [hydra overrides...]    (the recipe installed: verl-guardian[recipe])

Prepare the data, build the retrieval index, start the retrieval server and Ray, then train the search agent with
verl 0.9.1 under the guardian. Missing data and index are built; existing ones are reused.

options:
  --config NAME       grpo_qwen7b (default) or grpo_collapse_demo (the deliberately broken demo)
  --no-guardian       run plain verl, without `guardian run --`
  --guardian-args ARGS  options for `guardian run`, split on spaces (e.g. "--mode observe --export 9400")
  --corpus FILE       wiki-18 corpus JSONL for the index (default $RECIPE_CORPUS, else data/wiki-18/wiki-18.jsonl)
  --ray-address ADDR  use this Ray cluster instead of starting one (default $RAY_ADDRESS)
  --dry-run           print every step's exact command and run nothing (no GPU, data or guardian needed)
  -h, --help          this help

Arguments of the form key=value, +key=value, ++key=value or ~key (and everything after --) are passed to
verl's main_ppo as Hydra overrides, after the script's own.

environment (defaults in brackets; <work> is the checkout when this script sits in one, else the current folder):
  RECIPE_DATA            train/val parquet folder [<work>/data/search]
  RECIPE_OUT             checkpoints, rollout dumps, logs [<work>/outputs]
  RECIPE_INDEX           retrieval index folder [<work>/data/wiki-18-index]
  RECIPE_CORPUS          wiki-18 corpus JSONL [<work>/data/wiki-18/wiki-18.jsonl]
  RECIPE_HOTPOTQA        prepare_data --hotpotqa source [hf:hotpotqa/hotpot_qa:distractor@train]
  RECIPE_2WIKI           prepare_data --2wiki source [none]
  RECIPE_RETRIEVAL_HOST  retrieval server host [127.0.0.1]
  RECIPE_RETRIEVAL_PORT  retrieval server port [8000]
  RECIPE_HEALTH_TIMEOUT  seconds to wait for the server's /health [900]
  RECIPE_TOPK            passages per search of the agent loop [3]
  RECIPE_MAX_RESULT_CHARS  characters of one search's result block [3000]
  PYTHON                 the Python that has verl and the recipe's dependencies [python; python -m recipe: that one]
EOF
}

log() { printf '%s: %s\n' "$PROG" "$*"; }
die() {
  printf '%s: error: %s\n' "$PROG" "$*" >&2
  exit 1
}
usage_error() {
  printf '%s: error: %s\n' "$PROG" "$*" >&2
  printf 'run %s --help for the options\n' "$PROG" >&2
  exit 2
}
step() {
  local number=$1
  shift
  log "step $number/$STEPS $*"
}
# the exact command, shell-quoted, then run it unless --dry-run
run() {
  local quoted
  quoted=$(printf '%q ' "$@")
  log "+ ${quoted% }"
  ((dry_run)) || "$@"
}

# ------------------------------------------------------------------------------------------------ arguments

config=grpo_qwen7b
dry_run=0
use_guardian=1
guardian_args=()
corpus=${RECIPE_CORPUS:-}
ray_address=${RAY_ADDRESS:-}
overrides=()

need_value() {
  [[ $# -ge 2 && -n $2 ]] || usage_error "$1 needs a value"
}

while (($#)); do
  case $1 in
    -h | --help)
      usage
      exit 0
      ;;
    --dry-run) dry_run=1 ;;
    --no-guardian) use_guardian=0 ;;
    --guardian-args)
      need_value "$@"
      read -ra guardian_args <<<"$2"
      shift
      ;;
    --guardian-args=*) read -ra guardian_args <<<"${1#*=}" ;;
    --config)
      need_value "$@"
      config=$2
      shift
      ;;
    --config=*) config=${1#*=} ;;
    --corpus)
      need_value "$@"
      corpus=$2
      shift
      ;;
    --corpus=*) corpus=${1#*=} ;;
    --ray-address)
      need_value "$@"
      ray_address=$2
      shift
      ;;
    --ray-address=*) ray_address=${1#*=} ;;
    --)
      shift
      overrides+=("$@")
      break
      ;;
    -*) usage_error "unknown option: $1" ;;
    *=* | '~'*) overrides+=("$1") ;;
    *) usage_error "unexpected argument: $1 (Hydra overrides look like key=value)" ;;
  esac
  shift
done

case $config in
  grpo_qwen7b | grpo_collapse_demo) ;;
  *) usage_error "--config must be grpo_qwen7b or grpo_collapse_demo, not '$config'" ;;
esac

# ------------------------------------------------------------------------------------------------ settings

# the folder that holds the recipe package: a checkout, or site-packages when installed from the wheel
RECIPE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# where the data, index and outputs go by default and where the steps run: the checkout, else the current folder
# (never site-packages)
if [[ -f $RECIPE_ROOT/pyproject.toml ]]; then
  WORK_DIR=$RECIPE_ROOT
else
  WORK_DIR=$PWD
fi
CONFIG_DIR=$RECIPE_ROOT/recipe/configs
CONFIG_FILE=$CONFIG_DIR/$config.yaml
[[ -f $CONFIG_FILE ]] || die "config file $CONFIG_FILE not found"

export RECIPE_ROOT
export RECIPE_DATA=${RECIPE_DATA:-$WORK_DIR/data/search}
export RECIPE_OUT=${RECIPE_OUT:-$WORK_DIR/outputs}
RECIPE_INDEX=${RECIPE_INDEX:-$WORK_DIR/data/wiki-18-index}
RECIPE_CORPUS=${corpus:-$WORK_DIR/data/wiki-18/wiki-18.jsonl}
RECIPE_HOTPOTQA=${RECIPE_HOTPOTQA:-hf:hotpotqa/hotpot_qa:distractor@train}
RECIPE_2WIKI=${RECIPE_2WIKI:-}
RETRIEVAL_HOST=${RECIPE_RETRIEVAL_HOST:-127.0.0.1}
RETRIEVAL_PORT=${RECIPE_RETRIEVAL_PORT:-8000}
export RECIPE_RETRIEVAL_URL=http://$RETRIEVAL_HOST:$RETRIEVAL_PORT/retrieve
HEALTH_URL=http://$RETRIEVAL_HOST:$RETRIEVAL_PORT/health
HEALTH_TIMEOUT=${RECIPE_HEALTH_TIMEOUT:-900}
PYTHON=${PYTHON:-python}
# the agent loop and the tool are imported from this checkout inside Ray workers (an installed recipe is on the
# Python's own path: site-packages is not put in front of the standard library)
if [[ $WORK_DIR == "$RECIPE_ROOT" ]]; then
  export PYTHONPATH=$RECIPE_ROOT${PYTHONPATH:+:$PYTHONPATH}
fi
# verl's file logger without the guardian: $VERL_FILE_LOGGER_ROOT/{project}/{experiment}.jsonl (the guardian sets
# VERL_FILE_LOGGER_PATH per attempt, which verl prefers)
export VERL_FILE_LOGGER_ROOT=$RECIPE_OUT/logs
LOG_DIR=$RECIPE_OUT/logs

for dir_var in RECIPE_DATA RECIPE_OUT RECIPE_INDEX RECIPE_CORPUS; do
  [[ ${!dir_var} == /* ]] || die "$dir_var must be an absolute path, got '${!dir_var}'"
done

# the last value the command line gives KEY (as key=, +key= or ++key=), else the config file's top-level
# `section:`/`  name:` entry (the file is written in that two-level layout for the few keys read here)
setting() {
  local key=$1 value="" arg
  for arg in ${overrides[@]+"${overrides[@]}"}; do
    arg=${arg#++}
    arg=${arg#+}
    [[ $arg == "$key="* ]] && value=${arg#"$key="}
  done
  if [[ -z $value ]]; then
    value=$(awk -v section="${key%%.*}" -v name="${key#*.}" '
      /^[^ #]/ { in_section = ($0 ~ "^" section ":") }
      in_section && $0 ~ "^  " name ":" { sub("^  " name ": *", ""); sub(" +#.*$", ""); print; exit }
    ' "$CONFIG_FILE")
  fi
  printf '%s' "$value"
}

N_GPUS=$(setting trainer.n_gpus_per_node)
PROJECT=$(setting trainer.project_name)
EXPERIMENT=$(setting trainer.experiment_name)
[[ $N_GPUS =~ ^[0-9]+$ ]] || die "cannot read trainer.n_gpus_per_node from $CONFIG_FILE (got '$N_GPUS')"
[[ -n $PROJECT && -n $EXPERIMENT ]] || die "cannot read trainer.project_name/experiment_name from $CONFIG_FILE"
# The same paths the config's ${oc.env:RECIPE_OUT,...} interpolations give (tests/integration/test_recipe_configs.py
# compares them), passed explicitly because the guardian cannot resolve ${oc.env:...}: it needs an absolute checkpoint dir
# on the command line, and reads the rollout dumps for the effective group ratio.
CKPT_DIR=$(setting trainer.default_local_dir)
[[ -z $CKPT_DIR || $CKPT_DIR == *"\${"* ]] && CKPT_DIR=$RECIPE_OUT/checkpoints/$PROJECT/$EXPERIMENT
ROLLOUT_DIR=$(setting trainer.rollout_data_dir)
[[ -z $ROLLOUT_DIR || $ROLLOUT_DIR == *"\${"* ]] && ROLLOUT_DIR=$RECIPE_OUT/rollouts/$PROJECT/$EXPERIMENT

log "config $CONFIG_FILE (experiment $PROJECT/$EXPERIMENT, $N_GPUS GPUs)$( ((dry_run)) && printf ' [dry run]')"

# ------------------------------------------------------------------------------------------------ cleanup

server_pid=""
started_ray=0
# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
  local rc=$?
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
    log "stopping the retrieval server (pid $server_pid)"
    kill "$server_pid" 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      kill -0 "$server_pid" 2>/dev/null || break
      sleep 1
    done
    kill -9 "$server_pid" 2>/dev/null || true
  fi
  if ((started_ray)); then
    log "stopping the Ray cluster this script started"
    ray stop >/dev/null 2>&1 || true
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ------------------------------------------------------------------------------------------------ 1 GPUs

step 1 "check GPUs: need $N_GPUS (trainer.n_gpus_per_node)"
log "+ nvidia-smi -L"
if ((dry_run)); then
  log "dry run: GPUs not counted"
else
  command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi not found: this needs a node with $N_GPUS NVIDIA GPUs"
  gpus=$(nvidia-smi -L | grep -c '^GPU ' || true)
  ((gpus >= N_GPUS)) || die "nvidia-smi lists $gpus GPU(s); the config needs $N_GPUS (trainer.n_gpus_per_node)"
  log "found $gpus GPU(s)"
fi
# the Python of every step has the recipe's dependencies and verl (a fresh node fails here, not hours later)
preflight=("$PYTHON" -m recipe.preflight)
quoted=$(printf '%q ' "${preflight[@]}")
log "+ ${quoted% }"
problem=""
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  problem="PYTHON=$PYTHON is not a command here: set PYTHON to the Python that has verl (python -m recipe sets it)"
elif found=$(cd "$WORK_DIR" && "${preflight[@]}" 2>&1); then
  log "$found"
else
  problem=${found:-"$PYTHON -m recipe.preflight failed with no output"}
fi
if [[ -n $problem ]]; then
  if ((dry_run)); then
    log "dry run: a real run would stop here: $problem"
  else
    die "$problem"
  fi
fi

# ------------------------------------------------------------------------------------------------ 2 data

prepare=("$PYTHON" -m recipe.prepare_data --out "$RECIPE_DATA" --hotpotqa "$RECIPE_HOTPOTQA")
[[ -n $RECIPE_2WIKI ]] && prepare+=(--2wiki "$RECIPE_2WIKI")
if [[ -f $RECIPE_DATA/train.parquet && -f $RECIPE_DATA/val.parquet ]]; then
  step 2 "prepare data: $RECIPE_DATA/{train,val}.parquet exist, reused"
else
  step 2 "prepare data: writing $RECIPE_DATA/{train,val}.parquet"
  (cd "$WORK_DIR" && run "${prepare[@]}")
fi

# ------------------------------------------------------------------------------------------------ 3 index

index_cmd=("$PYTHON" -m recipe.search.index --corpus "$RECIPE_CORPUS" --out "$RECIPE_INDEX")
corpus_hint="get wiki-18 (~14 GB; Search-R1's corpus, the HF dataset PeterJinGo/wiki-18-corpus):
  huggingface-cli download PeterJinGo/wiki-18-corpus wiki-18.jsonl.gz --repo-type dataset --local-dir $(dirname "$RECIPE_CORPUS")
  gzip -d $(dirname "$RECIPE_CORPUS")/wiki-18.jsonl.gz
then run again, or pass --corpus FILE / RECIPE_CORPUS=FILE (one {\"id\",\"contents\"} JSON object a line)"
if [[ -d $RECIPE_INDEX ]] && [[ -n $(ls -A "$RECIPE_INDEX") ]]; then
  step 3 "build index: $RECIPE_INDEX exists, reused"
else
  step 3 "build index: $RECIPE_INDEX from $RECIPE_CORPUS"
  if [[ ! -f $RECIPE_CORPUS ]]; then
    if ((dry_run)); then
      log "dry run: the corpus $RECIPE_CORPUS is missing; a real run would stop here. To $corpus_hint"
    else
      die "corpus $RECIPE_CORPUS not found. To $corpus_hint"
    fi
  fi
  (cd "$WORK_DIR" && run "${index_cmd[@]}")
fi

# ------------------------------------------------------------------------------------------------ 4-5 retrieval

healthy() {
  "$PYTHON" - "$HEALTH_URL" <<'EOF' >/dev/null 2>&1
import sys
import urllib.request

with urllib.request.urlopen(sys.argv[1], timeout=3) as response:
    sys.exit(0 if response.status == 200 else 1)
EOF
}

server=("$PYTHON" -m recipe.search.server --index "$RECIPE_INDEX" --host "$RETRIEVAL_HOST" --port "$RETRIEVAL_PORT")
server_log=$LOG_DIR/retrieval_server.log
if ! ((dry_run)) && healthy; then
  step 4 "start retrieval server: one already answers $HEALTH_URL, reused (not stopped on exit)"
else
  step 4 "start retrieval server: $RECIPE_RETRIEVAL_URL, log $server_log"
  log "+ $(printf '%q ' "${server[@]}")> $(printf '%q' "$server_log") 2>&1 &"
  if ! ((dry_run)); then
    mkdir -p "$LOG_DIR"
    (cd "$WORK_DIR" && exec "${server[@]}") >"$server_log" 2>&1 &
    server_pid=$!
    log "retrieval server pid $server_pid"
  fi
fi

step 5 "wait for retrieval server: GET $HEALTH_URL (timeout ${HEALTH_TIMEOUT}s)"
log "+ GET $HEALTH_URL every 5s until it answers 200"
if ! ((dry_run)); then
  waited=0
  until healthy; do
    if [[ -n $server_pid ]] && ! kill -0 "$server_pid" 2>/dev/null; then
      tail -n 20 "$server_log" >&2 || true
      die "the retrieval server exited before answering $HEALTH_URL (log: $server_log)"
    fi
    ((waited < HEALTH_TIMEOUT)) || die "no answer from $HEALTH_URL after ${HEALTH_TIMEOUT}s (log: $server_log; raise RECIPE_HEALTH_TIMEOUT for a large index)"
    sleep 5
    waited=$((waited + 5))
  done
  log "retrieval server healthy after ${waited}s"
fi

# ------------------------------------------------------------------------------------------------ 6 Ray

if [[ -n $ray_address ]]; then
  step 6 "start Ray: using the cluster at $ray_address"
  export RAY_ADDRESS=$ray_address
elif ! ((dry_run)) && ray status >/dev/null 2>&1; then
  step 6 "start Ray: a local cluster is already running, reused (not stopped on exit)"
else
  step 6 "start Ray: a head node on this machine (stopped on exit)"
  if ((dry_run)); then
    run ray start --head
  else
    command -v ray >/dev/null 2>&1 || die "ray not found (install verl's dependencies, or pass --ray-address)"
    run ray start --head
    started_ray=1
  fi
fi

# ------------------------------------------------------------------------------------------------ 7 train

# Ray workers do not inherit this shell's environment on an existing cluster (facts §6), and verl resolves the
# config's ${oc.env:...} inside them: pass the variables through the job's runtime_env, as literal values.
# Each value is a quoted Hydra string: Ray accepts only strings there, and Hydra would read 1 as an integer.
env_overrides=()
env_var_override() {
  local name=$1 value=${!1}
  [[ $value != *"'"* && $value != *\\* ]] || die "$name contains a quote or a backslash, which Hydra cannot pass on: '$value'"
  env_overrides+=("++ray_kwargs.ray_init.runtime_env.env_vars.$name='$value'")
}
for name in RECIPE_ROOT RECIPE_DATA RECIPE_OUT RECIPE_RETRIEVAL_URL VERL_FILE_LOGGER_ROOT; do
  env_var_override "$name"
done
if [[ -n ${PYTHONPATH:-} ]]; then
  env_var_override PYTHONPATH
fi
# the agent loop's retrieval settings (recipe/configs/agent_loops.yaml), when set
for name in RECIPE_TOPK RECIPE_MAX_RESULT_CHARS; do
  if [[ -n ${!name:-} ]]; then
    env_var_override "$name"
  fi
done
trainer=("$PYTHON" -m verl.trainer.main_ppo --config-path "$CONFIG_DIR" --config-name "$config"
  "trainer.default_local_dir=$CKPT_DIR" "trainer.rollout_data_dir=$ROLLOUT_DIR"
  "${env_overrides[@]}" ${overrides[@]+"${overrides[@]}"})
if ((use_guardian)); then
  trainer=(guardian run ${guardian_args[@]+"${guardian_args[@]}"} -- "${trainer[@]}")
  if ! ((dry_run)); then
    command -v guardian >/dev/null 2>&1 || die "guardian not found on PATH: pip install 'verl-guardian[recipe]' (from a checkout: pip install -e '.[recipe]'), or pass --no-guardian"
  fi
fi
step 7 "launch training: $config$( ((use_guardian)) || printf ' (no guardian)')"
cd "$WORK_DIR"
run "${trainer[@]}"
((dry_run)) && log "dry run: nothing was run"
exit 0
