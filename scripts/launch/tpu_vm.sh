#!/usr/bin/env bash
# TPU slices for one training run, through gcloud's queued resources:
#
#   export TPU_NAME=lm-run ZONE=us-east5-a TYPE=v5p-128 BUCKET=gs://my-bucket
#   bash scripts/launch/tpu_vm.sh create            # queue the slice
#   bash scripts/launch/tpu_vm.sh install           # this working tree, on every worker
#   bash scripts/launch/tpu_vm.sh mount             # $BUCKET at /mnt/data
#   bash scripts/launch/tpu_vm.sh prepare --config lm_1_3b \
#        --config.data.data_dir=/mnt/data/tfds      # once, on worker 0
#   bash scripts/launch/tpu_vm.sh train --config lm_1_3b \
#        --workdir "$BUCKET/runs/lm_1_3b" --config.data.data_dir=/mnt/data/tfds
#   bash scripts/launch/tpu_vm.sh status            # per worker; the last metrics row
#   bash scripts/launch/tpu_vm.sh logs              # every ~/train.log to logs/$TPU_NAME/
#   bash scripts/launch/tpu_vm.sh stop              # SIGTERM once: save, exit 75
#   bash scripts/launch/tpu_vm.sh delete
#   bash scripts/launch/tpu_vm.sh babysit --config lm_1_3b ...   # the train flags
#
# Settings (environment):
#   TPU_NAME, ZONE   the queued resource and its zone (always)
#   TYPE             accelerator type, e.g. v5p-128 (create, babysit)
#   RUNTIME          TPU software version; default by TYPE's generation:
#                    v6e v2-alpha-tpuv6e, v5p v2-alpha-tpuv5, v5e
#                    (v5litepod) v2-alpha-tpuv5-lite, v4 and older
#                    tpu-ubuntu2204-base
#   NODE_COUNT       slices (default: what `create --node-count N` recorded
#                    for TPU_NAME, else 1). Above 1 they are one queued
#                    resource of NODE_COUNT nodes named TPU_NAME-0, TPU_NAME-1,
#                    ...; every command reaches all of them through
#                    `gcloud compute tpus queued-resources ssh --node=all`.
#                    `create --node-count N` records N in
#                    ~/.config/jax_transformer/tpu_vm/TPU_NAME for the others.
#   CREATE_FLAGS     more flags for `queued-resources create` (e.g. --spot),
#                    also used when babysit recreates the slice
#   BUCKET           gs://bucket to mount at /mnt/data (mount, babysit)
#   RENAME_DIR_LIMIT gcsfuse's --rename-dir-limit (default 200000): renaming
#                    a directory in a bucket copies each object below it
#   PYTHON           the Python to install on the workers (default python3.11)
#   LOGS_DIR         where `logs` puts the logs (default logs/$TPU_NAME)
#   WORKERS          workers per slice, for `logs` (default: asked of gcloud)
#   MAX_RECREATES    how often babysit recreates the slice (default 3)
#   POLL_S           babysit's seconds between looks (default 300)
#
# `train` starts scripts/launch/train_until_done.sh on all workers at once
# (each process finds the others through the TPU VM's metadata server), in
# the background under a small wrapper that records its pid in ~/train.pid
# and, when the loop ends, its exit status in ~/train.exit; the output goes
# to ~/train.log. Before starting it ends what still holds the TPU devices
# (a run killed without its loop) and removes /tmp/libtpu_lockfile. `stop`
# sends one SIGTERM to the loop and one to the train.py it runs (a retried
# stop sends none again). `babysit` looks at the queued resource every
# POLL_S seconds: when it is ACTIVE and worker 0 has no run and no exit
# status (a new or recreated slice), it installs, mounts (with BUCKET) and
# starts the run; when it is SUSPENDED (preempted) or FAILED it deletes and
# creates it again, at most MAX_RECREATES times; it ends with the run's
# exit status. The run resumes from the last checkpoint in --workdir.
# Commands on several workers need the key in ssh-agent
# (`ssh-add ~/.ssh/google_compute_engine`). docs/launch.md walks through it.
set -euo pipefail
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}"
node_count_file="$HOME/.config/jax_transformer/tpu_vm/$TPU_NAME"
NODE_COUNT="${NODE_COUNT:-$(cat "$node_count_file" 2>/dev/null || echo 1)}"
PYTHON="${PYTHON:-python3.11}"
repo_dir="$(cd "$(dirname "$0")/../.." && pwd)"
usage='create|install|mount|prepare|train|status|logs|stop|delete|babysit'

fail() {
  echo "tpu_vm.sh: $*" >&2
  exit 2
}

case "$NODE_COUNT" in
  ''|*[!0-9]*|0) fail "NODE_COUNT must be a number of slices, 1 or more." ;;
esac

say() {
  echo "tpu_vm.sh: $*" >&2
}

# --- Commands run on the workers -----------------------------------------
# Each is a bash script sent as `bash -c '<script>' tpu_vm ARGS...`, so it
# runs the same under any login shell and takes its arguments as "$@".

# shellcheck source=scripts/launch/remote.sh
source "$(dirname "$0")/remote.sh"

# The pid of this worker's run wrapper (the process that runs the restart
# loop and writes ~/train.exit), if it is alive.

# apt on a freshly booted VM: unattended-upgrades holds the lock first.
read -r -d '' APT_WAIT <<'EOF' || true
apt_wait() {
  local waited=0
  while sudo fuser /var/lib/dpkg/lock-frontend /var/lib/dpkg/lock \
      /var/lib/apt/lists/lock >/dev/null 2>&1; do
    if [ "$waited" -ge 900 ]; then
      echo "$(hostname): apt is still locked after 900 s." >&2
      return 1
    fi
    sleep 5
    waited=$((waited + 5))
  done
}
apt_get() {
  apt_wait && sudo DEBIAN_FRONTEND=noninteractive apt-get \
    -o DPkg::Lock::Timeout=600 -y -qq "$@"
}
EOF

# install: the tarball ~/jax_transformer.tgz unpacked over ~/jax_transformer
# (what else is there stays: its .venv, a run's files); $1 is the Python
# to make the venv with.
read -r -d '' INSTALL <<'EOF' || true
set -e
if p=$(running); then
  echo "$(hostname): a run is going (pid $p); stop it before installing." >&2
  exit 1
fi
if ! command -v "$1" >/dev/null; then
  apt_wait
  sudo add-apt-repository -y ppa:deadsnakes/ppa >/dev/null
  apt_get update
  apt_get install "$1" "$1-venv" >/dev/null
fi
mkdir -p ~/jax_transformer
cd ~/jax_transformer
tar -xzf ~/jax_transformer.tgz
rm -f ~/jax_transformer.tgz
[ -x .venv/bin/python ] || "$1" -m venv .venv
.venv/bin/pip install -q -e '.[tpu]'
echo "$(hostname): installed."
EOF

# mount: $1 the bucket (no gs://), $2 gcsfuse's --rename-dir-limit.
read -r -d '' MOUNT <<'EOF' || true
set -e
if ! command -v gcsfuse >/dev/null; then
  echo "deb [signed-by=/usr/share/keyrings/cloud.google.asc] https://packages.cloud.google.com/apt gcsfuse-$(lsb_release -cs) main" |
    sudo tee /etc/apt/sources.list.d/gcsfuse.list >/dev/null
  curl -fsS https://packages.cloud.google.com/apt/doc/apt-key.gpg |
    sudo tee /usr/share/keyrings/cloud.google.asc >/dev/null
  apt_get update
  apt_get install gcsfuse >/dev/null
fi
sudo mkdir -p /mnt/data
sudo chown "$(id -un)" /mnt/data
# Preparing data renames directories, which a bucket without folders
# allows only below --rename-dir-limit objects.
mountpoint -q /mnt/data ||
  gcsfuse --implicit-dirs --rename-dir-limit="$2" "$1" /mnt/data
echo "$(hostname): $1 at /mnt/data."
EOF

# prepare, on worker 0: "$@" are prepare_data.py's flags.
read -r -d '' PREPARE <<'EOF' || true
cd ~/jax_transformer && .venv/bin/python scripts/prepare_data.py "$@"
EOF

# train: $1 the workdir (recorded for status), then train.py's flags.
read -r -d '' TRAIN <<'EOF' || true
if p=$(running); then
  echo "$(hostname): a run is going (pid $p); stop it first." >&2
  exit 1
fi
cd ~/jax_transformer || exit 1
# What still holds the TPU (a train.py whose loop was killed) would keep
# the new run from opening it.
# (fuser names the pids of the devices that exist, and complains about
# the patterns that matched none.)
held=$(sudo fuser /dev/accel* /dev/vfio/[0-9]* 2>/dev/null |
  tr -cs '0-9' '\n' | grep . | sort -u)
# shellcheck disable=SC2086  # $held and $left: pids, one word each
if [ -n "$held" ]; then
  echo "$(hostname): ending what holds the TPU:" $held
  sudo kill -TERM $held 2>/dev/null
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    left=
    for p in $held; do
      case "$(ps -o stat= -p "$p")" in
        ''|Z*) ;;  # gone, or gone but for its parent's wait
        *) left="$left $p" ;;
      esac
    done
    [ -z "$left" ] && break
    sleep 1
  done
  [ -n "$left" ] && sudo kill -KILL $left 2>/dev/null
fi
sudo rm -f /tmp/libtpu_lockfile
workdir=$1
shift
case "$workdir" in
  ''|/*|*://*) ;;
  *) workdir="$PWD/$workdir" ;;
esac
printf '%s\n' "$workdir" > ~/train.workdir
export PATH="$PWD/.venv/bin:$PATH"
EOF

# status, per worker: whether train.py runs, the last exit status, the
# log's last line.
read -r -d '' STATUS <<'EOF' || true
if w=$(running); then
  what="restart loop between runs"
  for loop in $(pgrep -P "$w"); do
    for p in $(pgrep -P "$loop"); do
      ps -ww -o args= -p "$p" | grep -q 'train\.py' && what="train.py running (pid $p)"
    done
  done
else
  what="no run"
fi
if [ -f ~/train.exit ]; then
  ended="last exit status $(cat ~/train.exit)"
else
  ended="no exit status yet"
fi
line=$(tail -c 8192 ~/train.log 2>/dev/null | tr '\r' '\n' |
  grep -v '^[[:space:]]*$' | tail -n 1)
echo "$(hostname): $what; $ended; log: ${line:-(none)}"
EOF

# metrics, on worker 0: the last row of the run's metrics.jsonl.
read -r -d '' METRICS <<'EOF' || true
workdir=$(cat ~/train.workdir 2>/dev/null) || workdir=
case "$workdir" in
  '') row= ;;
  gs://*) row=$(gcloud storage cat "$workdir/metrics.jsonl" 2>/dev/null | tail -n 1) ;;
  *) row=$(tail -n 1 "$workdir/metrics.jsonl" 2>/dev/null) ;;
esac
echo "last metrics row (${workdir:-no workdir recorded}): ${row:-none yet}"
EOF

# probe, on worker 0, for babysit: run=running, run=exit=N or run=idle.
read -r -d '' PROBE <<'EOF' || true
if running >/dev/null; then
  echo run=running
elif [ -f ~/train.exit ]; then
  echo "run=exit=$(cat ~/train.exit)"
else
  echo run=idle
fi
EOF

# --- gcloud ---------------------------------------------------------------

on_all_workers() {
  if [ "$NODE_COUNT" -gt 1 ]; then
    gcloud compute tpus queued-resources ssh "$TPU_NAME" --zone "$ZONE" \
      --node=all --worker=all --command "$1"
  else
    gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --worker=all \
      --command "$1"
  fi
}

on_worker_0() {
  if [ "$NODE_COUNT" -gt 1 ]; then
    gcloud compute tpus queued-resources ssh "$TPU_NAME" --zone "$ZONE" \
      --node=0 --worker=0 --command "$1"
  else
    gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --worker=0 \
      --command "$1"
  fi
}

copy_to_all_workers() {  # LOCAL_FILE REMOTE_PATH (relative to home)
  if [ "$NODE_COUNT" -gt 1 ]; then
    gcloud compute tpus queued-resources scp "$1" "$TPU_NAME:$2" \
      --zone "$ZONE" --node=all --worker=all
  else
    gcloud compute tpus tpu-vm scp "$1" "$TPU_NAME:$2" --zone "$ZONE" \
      --worker=all
  fi
}

node_names() {
  if [ "$NODE_COUNT" -gt 1 ]; then
    for ((n = 0; n < NODE_COUNT; n++)); do
      echo "$TPU_NAME-$n"
    done
  else
    echo "$TPU_NAME"
  fi
}

qr_state() {
  gcloud compute tpus queued-resources describe "$TPU_NAME" --zone "$ZONE" \
    --format='value(state.state)'
}

default_runtime() {
  case "$1" in
    v6e-*) echo v2-alpha-tpuv6e ;;
    v5p-*) echo v2-alpha-tpuv5 ;;
    v5litepod-*|v5e-*) echo v2-alpha-tpuv5-lite ;;
    v2-*|v3-*|v4-*) echo tpu-ubuntu2204-base ;;
    *) return 1 ;;
  esac
}

create_flags=()
if [ -n "${CREATE_FLAGS:-}" ]; then
  read -r -a create_flags <<< "$CREATE_FLAGS"
fi

do_create() {
  : "${TYPE:?set TYPE, e.g. v5p-128}"
  local runtime="${RUNTIME:-}" arg
  if [ -z "$runtime" ]; then
    runtime=$(default_runtime "$TYPE") ||
      fail "no default RUNTIME for TYPE=$TYPE; set RUNTIME (docs: cloud.google.com/tpu/docs/runtimes)."
  fi
  local rest=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --node-count=*) NODE_COUNT="${1#*=}" ;;
      --node-count) NODE_COUNT="${2:-}"; shift ;;
      --node-prefix*|--node-id*)
        fail "$1 is set by tpu_vm.sh (the slices are $TPU_NAME, or $TPU_NAME-0, $TPU_NAME-1, ... with --node-count N)." ;;
      *) rest+=("$1") ;;
    esac
    shift
  done
  set -- ${rest[@]+"${rest[@]}"}
  case "$NODE_COUNT" in
    ''|*[!0-9]*|0) fail "--node-count must be a number of slices, 1 or more." ;;
  esac
  mkdir -p "$(dirname "$node_count_file")"
  echo "$NODE_COUNT" > "$node_count_file"
  local nodes=(--node-id "$TPU_NAME")
  if [ "$NODE_COUNT" -gt 1 ]; then
    nodes=(--node-count "$NODE_COUNT" --node-prefix "$TPU_NAME")
  fi
  gcloud compute tpus queued-resources create "$TPU_NAME" "${nodes[@]}" \
    --zone "$ZONE" --accelerator-type "$TYPE" --runtime-version "$runtime" \
    ${create_flags[@]+"${create_flags[@]}"} "$@"
}

do_delete() {
  gcloud compute tpus queued-resources delete "$TPU_NAME" --zone "$ZONE" \
    --force --quiet
}

# This working tree (tracked files as they are now, and untracked ones git
# does not ignore), as a tarball in a new temporary folder.
make_tarball() {
  if [ -z "${tmp_dir:-}" ]; then
    tmp_dir=$(mktemp -d)
    trap 'rm -rf "$tmp_dir"' EXIT
  fi
  tarball="$tmp_dir/jax_transformer.tgz"
  if git -C "$repo_dir" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    (cd "$repo_dir" && git ls-files -z --cached --others --exclude-standard |
      while IFS= read -r -d '' f; do
        if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\0' "$f"; fi
      done | tar --null -T - -czf "$tarball")
  else
    tar -C "$repo_dir" --exclude=.git --exclude=.venv -czf "$tarball" .
  fi
}

do_install() {
  make_tarball || return
  say "shipping $(du -h "$tarball" | cut -f1) of $repo_dir to every worker."
  copy_to_all_workers "$tarball" jax_transformer.tgz &&
    on_all_workers "$(remote "$RUN_ALIVE
$APT_WAIT
$INSTALL" "$PYTHON")"
}

do_mount() {
  : "${BUCKET:?set BUCKET, e.g. gs://my-bucket}"
  on_all_workers "$(remote "$APT_WAIT
$MOUNT" "${BUCKET#gs://}" "${RENAME_DIR_LIMIT:-200000}")"
}

do_train() {
  local workdir='' arg prev=''
  for arg in "$@"; do
    case "$prev" in --workdir) workdir=$arg ;; esac
    case "$arg" in --workdir=*) workdir=${arg#--workdir=} ;; esac
    prev=$arg
  done
  on_all_workers "$(remote "$RUN_ALIVE
$TRAIN
$START_LOOP" "$workdir" "$@")"
}

do_logs() {
  local dir="${LOGS_DIR:-logs/$TPU_NAME}" workers="${WORKERS:-}" first
  first=$(node_names | head -n 1)
  if [ -z "$workers" ]; then
    workers=$(gcloud compute tpus tpu-vm describe "$first" --zone "$ZONE" \
      --format='value(networkEndpoints.len())')
  fi
  case "$workers" in
    ''|*[!0-9]*|0) fail "could not tell how many workers $first has (got '$workers'); set WORKERS." ;;
  esac
  mkdir -p "$dir"
  local n=0 node w name pids=() failed=0
  # gcloud copies from one worker at a time; 8 copies at once.
  while read -r node; do
    for ((w = 0; w < workers; w++)); do
      name="worker-$w"
      [ "$NODE_COUNT" -gt 1 ] && name="slice-$n-worker-$w"
      gcloud compute tpus tpu-vm scp "$node:train.log" "$dir/$name.log" \
        --zone "$ZONE" --worker="$w" &
      pids+=($!)
      if [ "${#pids[@]}" -ge 8 ]; then
        wait "${pids[0]}" || failed=$((failed + 1))
        pids=("${pids[@]:1}")
      fi
    done
    n=$((n + 1))
  done < <(node_names)
  for p in ${pids[@]+"${pids[@]}"}; do
    wait "$p" || failed=$((failed + 1))
  done
  if [ "$failed" -gt 0 ]; then
    say "$failed of $((NODE_COUNT * workers)) logs not copied; the rest are in $dir/."
    return 1
  fi
  say "$((NODE_COUNT * workers)) logs in $dir/."
}

do_babysit() {
  [ "$#" -gt 0 ] || fail "babysit takes train's flags, e.g. babysit --config lm_1_3b --workdir gs://b/run."
  local max="${MAX_RECREATES:-3}" poll="${POLL_S:-300}"
  local recreates=0 starts=0 state probe
  while true; do
    state=$(qr_state) || state=
    case "$state" in
      ACTIVE)
        probe=$(on_worker_0 "$(remote "$RUN_ALIVE
$PROBE")" | grep -o 'run=[a-z]*=*[0-9]*' | tail -n 1) || probe=
        case "$probe" in
          run=running) ;;
          run=exit=*)
            say "the run ended with status ${probe#run=exit=}."
            return "${probe#run=exit=}" ;;
          run=idle)
            starts=$((starts + 1))
            if [ "$starts" -gt $((max + 1)) ]; then
              say "started the run $((starts - 1)) times and still no run; giving up."
              return 1
            fi
            say "no run on worker 0: installing and starting it."
            { do_install && { [ -z "${BUCKET:-}" ] || do_mount; } &&
              do_train "$@"; } || say "starting failed; trying again at the next look." ;;
          *) say "worker 0 did not answer; looking again in $poll s." ;;
        esac ;;
      SUSPENDED|FAILED)
        recreates=$((recreates + 1))
        if [ "$recreates" -gt "$max" ]; then
          say "the slice is $state again after $max recreations; giving up."
          return 1
        fi
        say "the slice is $state: recreating it ($recreates of $max)."
        do_delete || say "delete failed."
        do_create || say "create failed; looking again in $poll s." ;;
      '') say "could not read the queued resource's state; looking again in $poll s." ;;
      *) say "the queued resource is $state; looking again in $poll s." ;;
    esac
    sleep "$poll"
  done
}

command="${1:?usage: tpu_vm.sh $usage}"
shift
case "$command" in
  create) do_create "$@" ;;
  install) do_install ;;
  mount) do_mount ;;
  prepare) on_worker_0 "$(remote "$PREPARE" "$@")" ;;
  train) do_train "$@" ;;
  status)  # as much as answers
    failed=0
    qr_state || failed=1
    on_all_workers "$(remote "$RUN_ALIVE
$STATUS")" || failed=1
    on_worker_0 "$(remote "$METRICS")" || failed=1
    exit "$failed" ;;
  logs) do_logs ;;
  stop) on_all_workers "$(remote "$RUN_ALIVE
$STOP_RUN")" ;;
  delete) do_delete ;;
  babysit) do_babysit "$@" ;;
  *) fail "unknown command '$command'; use one of $usage." ;;
esac
