#!/usr/bin/env bash
# Runs `python train.py ARGS...` until the run is finished, restarting it
# after a stop it can resume from, and giving up on one it cannot.
#
#   bash scripts/launch/train_until_done.sh --config lm_1_3b --workdir gs://b/run
#
# Exit statuses of train.py (docs/reliability.md):
#   0    finished                      -> stop, 0
#   75   stopped by SIGTERM/SIGINT, saved (preemption, maintenance)
#   69   another process of the run was lost
#   128+N, or a signal (SIGKILL: 137)  killed from outside
#                                      -> restart (resumes bit for bit)
#   1    a failure (a bug, a non-finite loss, a failed save)
#   2    refused: bad config or input (rerunning changes nothing)
#   124  stuck: nothing progressed for config.step_timeout_s
#   126, 127  python or train.py cannot run (not found, not executable:
#        a shell without the project's environment)
#                                      -> stop with that status
# MAX_RESTARTS (default 100) bounds the restarts; RESTART_DELAY_S (default
# 10) spaces them, so a machine that is coming back has time to.
#
# SIGTERM or SIGINT to this script as well as to train.py (Ctrl-C, `scancel`,
# the launchers' `stop`) stops for good: train.py saves and exits 75, and
# the loop ends with it instead of restarting; one that arrives while the
# loop waits to restart ends the loop there.
set -u
stopping=0
trap 'stopping=1' TERM INT
max_restarts="${MAX_RESTARTS:-100}"
delay="${RESTART_DELAY_S:-10}"
train_py="$(cd "$(dirname "$0")/../.." && pwd)/train.py"
restarts=0
while true; do
  python "$train_py" "$@"
  status=$?
  if [ "$stopping" = 1 ]; then
    echo "train_until_done: stopped by a signal (train.py's status" \
      "$status); not restarting." >&2
    exit "$status"
  fi
  case "$status" in
    0)
      echo "train_until_done: finished." >&2
      exit 0 ;;
    126|127)
      echo "train_until_done: python could not run train.py (status" \
        "$status: not found or not executable; is the project's environment" \
        "active in this shell?); stopping." >&2
      exit "$status" ;;
    1|2|124)
      echo "train_until_done: train.py exited with status $status, which a" \
        "restart would not mend (docs/reliability.md); stopping." >&2
      exit "$status" ;;
  esac
  restarts=$((restarts + 1))
  if [ "$restarts" -gt "$max_restarts" ]; then
    echo "train_until_done: $max_restarts restarts and still not finished" \
      "(last status $status); stopping." >&2
    exit "$status"
  fi
  echo "train_until_done: train.py exited with status $status; restart" \
    "$restarts of $max_restarts in $delay s." >&2
  # A second at a time, so that a stop arriving at any moment of the wait
  # (a signal interrupts `wait`) ends it within a second.
  for ((waited = 0; waited < delay && ! stopping; waited++)); do
    sleep 1 &
    wait $! || kill $! 2>/dev/null
  done
  if [ "$stopping" = 1 ]; then
    echo "train_until_done: stopped by a signal while waiting to restart;" \
      "not restarting." >&2
    exit "$status"
  fi
done
