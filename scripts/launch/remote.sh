# Sourced by tpu_vm.sh and gpu_hosts.sh: how a command is sent to a worker
# or host, and the scripts both run there to start, find and stop a run.
# shellcheck shell=bash disable=SC2034  # the scripts that source this use them

quote() {  # $1 in single quotes, for any shell
  local s=$1 q="'" escaped="'\\''"
  printf "'%s'" "${s//$q/$escaped}"
}

# The command line that runs SCRIPT ($1) under bash with the other
# arguments as its "$@", whatever the login shell of the other side.
remote() {
  local line name=${0##*/}
  line="bash -c $(quote "$1") ${name%.sh}"
  shift
  for arg in "$@"; do
    line+=" $(quote "$arg")"
  done
  printf '%s' "$line"
}

# `running`: the pid of this machine's run wrapper (the process that runs
# the restart loop and writes ~/train.exit), if it is alive.
read -r -d '' RUN_ALIVE <<'EOF' || true
running() {
  local p
  p=$(cat ~/train.pid 2>/dev/null) && [ -n "$p" ] &&
    ps -ww -o args= -p "$p" 2>/dev/null | grep -q train_until_done && echo "$p"
}
EOF

# Starts the restart loop in the background, from the repository, with
# train.py's flags as "$@" and `python` the run's (both set by the script
# before it): its pid in ~/train.pid, its output in
# ~/train.log, its exit status in ~/train.exit when it ends.
read -r -d '' START_LOOP <<'EOF' || true
rm -f ~/train.exit ~/train.signalled
nohup bash -c 'echo $$ > ~/train.pid
  bash scripts/launch/train_until_done.sh "$@"
  echo $? > ~/train.exit' train_until_done "$@" \
  > ~/train.log 2>&1 < /dev/null &
echo "$(hostname): started (pid $!) with $(command -v python); output in ~/train.log."
EOF

# One SIGTERM to the loop and one to what it runs (train.py, or the sleep
# before a restart), never to this shell (a `pkill -f` would match it); a
# retried stop (ssh retries a dropped connection) sends none a second time.
read -r -d '' STOP_RUN <<'EOF' || true
if ! w=$(running); then
  echo "$(hostname): no run to stop."
  exit 0
fi
procs=
for loop in $(pgrep -P "$w"); do
  procs="$procs $loop $(pgrep -P "$loop" | tr '\n' ' ')"
done
touch ~/train.signalled
sent=
for p in $procs; do
  grep -qx "$p" ~/train.signalled && continue
  echo "$p" >> ~/train.signalled
  kill -TERM "$p" 2>/dev/null && sent="$sent $p"
done
echo "$(hostname): SIGTERM to${sent:- none again (sent before)}; the run saves and exits 75."
EOF
