#!/usr/bin/env bash
# One training run over GPU hosts without a scheduler: starts one process
# per host over ssh, each seeing all of its GPUs, the first host
# coordinating:
#
#   HOSTS="gpu-0 gpu-1" bash scripts/launch/gpu_hosts.sh --config lm_1_3b \
#       --workdir /shared/runs/lm_1_3b --config.data.data_dir=/shared/tfds
#   STOP=1 HOSTS="gpu-0 gpu-1" bash scripts/launch/gpu_hosts.sh
#
# Every host needs the repository at REPO_DIR (default: this one's path)
# with the project installed (`pip install -e '.[cuda]'`) and the data and
# workdir on shared storage (or gs://). Each process runs under
# scripts/launch/train_until_done.sh with PYTHON (default REPO_DIR/.venv/
# bin/python where that exists, else python3) as its `python`, logging to
# ~/train.log on its host; ~/train.pid and, when the loop ends, its exit
# status ~/train.exit are beside it. PORT (default 4321) is the
# coordinator's port on the first host. A host that still runs one is
# refused. STOP=1 sends one SIGTERM to each host's loop and to the train.py
# it runs (they save and exit 75), host after host, whatever one answers.
set -euo pipefail
: "${HOSTS:?set HOSTS, e.g. HOSTS='gpu-0 gpu-1'}"
read -r -a hosts <<< "$HOSTS"
repo_dir="${REPO_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
port="${PORT:-4321}"

# shellcheck source=scripts/launch/remote.sh
source "$(dirname "$0")/remote.sh"


# $1 the repository, $2 PYTHON (may be empty), then train.py's flags.
read -r -d '' START_SCRIPT <<'EOF' || true
if p=$(running); then
  echo "$(hostname): a run is going (pid $p); stop it first." >&2
  exit 1
fi
cd "$1" || exit 1
python=$2
shift 2
if [ -z "$python" ]; then
  if [ -x .venv/bin/python ]; then python=$PWD/.venv/bin/python; else python=python3; fi
fi
if ! python=$(command -v "$python"); then
  echo "$(hostname): no Python $2 (set PYTHON)." >&2
  exit 127
fi
# train_until_done.sh runs `python`: this one.
bin=$(dirname "$python")
if [ ! "$bin/python" -ef "$python" ]; then
  bin=~/.cache/jax_transformer/bin
  mkdir -p "$bin"
  printf '#!/bin/sh\nexec %s "$@"\n' "'$python'" > "$bin/python"
  chmod +x "$bin/python"
fi
export PATH="$bin:$PATH"
EOF

if [ -n "${STOP:-}" ]; then
  failed=0
  for host in "${hosts[@]}"; do
    # shellcheck disable=SC2029  # the command is made here, on purpose
    ssh "$host" "$(remote "$RUN_ALIVE
$STOP_RUN")" || {
      echo "gpu_hosts: could not stop $host (ssh status $?)." >&2
      failed=1
    }
  done
  exit "$failed"
fi
for i in "${!hosts[@]}"; do
  # shellcheck disable=SC2029
  ssh "${hosts[$i]}" "$(remote "$RUN_ALIVE
$START_SCRIPT
$START_LOOP" "$repo_dir" "${PYTHON:-}" "$@" \
    "--coordinator_address=${hosts[0]}:$port" \
    "--num_processes=${#hosts[@]}" "--process_id=$i")"
done
echo "gpu_hosts: started ${#hosts[@]} processes; logs in ~/train.log on each host." >&2
