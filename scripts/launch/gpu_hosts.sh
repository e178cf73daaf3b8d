#!/usr/bin/env bash
# One training run over GPU hosts without a scheduler: starts one process
# per host over ssh, each seeing all of its GPUs, the first host
# coordinating:
#
#   HOSTS="gpu-0 gpu-1" bash scripts/launch/gpu_hosts.sh --config lm_1_3b \
#       --workdir /shared/runs/lm_1_3b --config.data.data_dir=/shared/tfds
#
# Every host needs the repository at REPO_DIR (default: this one's path)
# with the project installed (`pip install -e '.[cuda]'`) and the data and
# workdir on shared storage (or gs://). Each process runs under
# scripts/launch/train_until_done.sh, logging to ~/train.log on its host;
# PORT (default 4321) is the coordinator's port on the first host.
# `STOP=1 HOSTS=... bash scripts/launch/gpu_hosts.sh` stops every process
# (they save and exit 75).
set -euo pipefail
: "${HOSTS:?set HOSTS, e.g. HOSTS='gpu-0 gpu-1'}"
read -r -a hosts <<< "$HOSTS"
repo_dir="${REPO_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
port="${PORT:-4321}"
if [ -n "${STOP:-}" ]; then
  for host in "${hosts[@]}"; do
    ssh "$host" "pkill -TERM -f 'train_until_done.sh|train.py' || true"
  done
  exit 0
fi
args=$(printf ' %q' "$@")
for i in "${!hosts[@]}"; do
  ssh "${hosts[$i]}" "cd $(printf '%q' "$repo_dir") &&
    nohup bash scripts/launch/train_until_done.sh$args \
      --coordinator_address=${hosts[0]}:$port \
      --num_processes=${#hosts[@]} --process_id=$i > ~/train.log 2>&1 &"
done
echo "gpu_hosts: started ${#hosts[@]} processes; logs in ~/train.log on each host." >&2
