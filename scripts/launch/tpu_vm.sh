#!/usr/bin/env bash
# A TPU slice for one training run, through gcloud's queued resources:
#
#   export TPU_NAME=lm-run ZONE=us-east5-a TYPE=v5p-128 \
#          RUNTIME=v2-alpha-tpuv5 BUCKET=gs://my-bucket
#   bash scripts/launch/tpu_vm.sh create            # queue the slice
#   bash scripts/launch/tpu_vm.sh install           # on every worker
#   bash scripts/launch/tpu_vm.sh mount             # $BUCKET at /mnt/data
#   bash scripts/launch/tpu_vm.sh prepare --config lm_1_3b \
#        --config.data.data_dir=/mnt/data/tfds      # once, on worker 0
#   bash scripts/launch/tpu_vm.sh train --config lm_1_3b \
#        --workdir "$BUCKET/runs/lm_1_3b" --config.data.data_dir=/mnt/data/tfds
#   bash scripts/launch/tpu_vm.sh status            # the slice; the log's tail
#   bash scripts/launch/tpu_vm.sh stop              # SIGTERM: save, exit 75
#   bash scripts/launch/tpu_vm.sh delete
#
# `train` starts scripts/launch/train_until_done.sh on all workers at once
# (each process finds the others through the TPU VM's metadata server), in
# the background, logging to ~/train.log on each worker. After a
# preemption the queued resource is recreated by `create` again; `install`
# and `train` with the same --workdir then resume from the last checkpoint
# in the bucket. docs/launch.md walks through it.
set -euo pipefail
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}"
REPO_URL="${REPO_URL:-https://github.com/jax-transformer/jax_transformer.git}"
PYTHON="${PYTHON:-python3.11}"

on_all_workers() {
  gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --worker=all \
    --command "$1"
}

on_worker_0() {
  gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --worker=0 \
    --command "$1"
}

usage='create|install|mount|prepare|train|status|stop|delete'
command="${1:?usage: tpu_vm.sh $usage}"
shift
case "$command" in
  create)
    : "${TYPE:?set TYPE, e.g. v5p-128}" "${RUNTIME:?set RUNTIME, e.g. v2-alpha-tpuv5}"
    gcloud compute tpus queued-resources create "$TPU_NAME" \
      --node-id "$TPU_NAME" --zone "$ZONE" --accelerator-type "$TYPE" \
      --runtime-version "$RUNTIME" "$@" ;;
  install)
    # The TPU VM images ship Python 3.10; the project needs 3.11.
    on_all_workers "set -e
      sudo add-apt-repository -y ppa:deadsnakes/ppa >/dev/null
      sudo apt-get update -qq && sudo apt-get install -y -qq $PYTHON $PYTHON-venv
      [ -d jax_transformer ] || git clone -q $REPO_URL jax_transformer
      cd jax_transformer && git pull -q
      [ -d .venv ] || $PYTHON -m venv .venv
      .venv/bin/pip install -q -e '.[tpu]'" ;;
  mount)
    # The data dir must be a file system on every worker (the ArrayRecord
    # reader and the token store's memory map): the bucket through gcsfuse.
    : "${BUCKET:?set BUCKET, e.g. gs://my-bucket}"
    on_all_workers "set -e
      if ! command -v gcsfuse >/dev/null; then
        echo 'deb [signed-by=/usr/share/keyrings/cloud.google.asc] https://packages.cloud.google.com/apt gcsfuse-'\$(lsb_release -cs)' main' | sudo tee /etc/apt/sources.list.d/gcsfuse.list >/dev/null
        curl -s https://packages.cloud.google.com/apt/doc/apt-key.gpg | sudo tee /usr/share/keyrings/cloud.google.asc >/dev/null
        sudo apt-get update -qq && sudo apt-get install -y -qq gcsfuse
      fi
      sudo mkdir -p /mnt/data && sudo chown \$USER /mnt/data
      mountpoint -q /mnt/data || gcsfuse --implicit-dirs ${BUCKET#gs://} /mnt/data" ;;
  prepare)
    args=$(printf ' %q' "$@")
    on_worker_0 "cd jax_transformer && source .venv/bin/activate &&
      python scripts/prepare_data.py$args" ;;
  train)
    args=$(printf ' %q' "$@")
    on_all_workers "cd jax_transformer && source .venv/bin/activate &&
      nohup bash scripts/launch/train_until_done.sh$args > ~/train.log 2>&1 &" ;;
  status)
    gcloud compute tpus queued-resources describe "$TPU_NAME" --zone "$ZONE" \
      --format='value(state.state)'
    on_all_workers 'tail -n 3 ~/train.log' ;;
  stop)
    # The loop and train.py both: train.py saves, the loop does not restart.
    on_all_workers "pkill -TERM -f 'train_until_done.sh|train.py' || true" ;;
  delete)
    gcloud compute tpus queued-resources delete "$TPU_NAME" --zone "$ZONE" \
      --force --quiet ;;
  *)
    echo "tpu_vm.sh: unknown command '$command'; use one of $usage." >&2
    exit 2 ;;
esac
