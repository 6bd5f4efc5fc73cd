#!/usr/bin/env bash
# Sets up .venv (once) and runs the main job: elastic Horovod training of a small
# classifier on scikit-learn's digits, on the embedded local provider. The group starts
# with 2 hosts, grows to 3 at 20 s; at 35 s its newest host announces a spot
# interruption 10 s ahead and leaves at the next commit (nothing rolled back); at 60 s
# the newest host is preempted without notice (SIGKILL); replacements boot and join
# after each. Rank 0 writes a durable checkpoint to demo-ckpt/ at most every 5 s; 5 s
# after the preempted host's replacement has joined the ring, every host is hard-killed
# at once (a reclaimed spot pool: the local provider's `preempt all`), and a new ring
# on fresh hosts resumes from the newest checkpoint. The run's events go to
# demo-events.jsonl; the script ends by printing the command that draws them. Extra
# arguments go to `spotring run` before the `--`.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
scripts/setup.sh examples
events=demo-events.jsonl
checkpoints=demo-ckpt
rm -f "$events"
rm -rf "$checkpoints" # a fresh start: the job would resume from an old run's checkpoint
control=$(mktemp "${TMPDIR:-/tmp}/spotring-demo-control.XXXXXX")
reclaimer=
cleanup() {
  [[ -z $reclaimer ]] || kill "$reclaimer" 2>/dev/null || true
  rm -f "$control"
}
trap cleanup EXIT

# The whole-ring hard kill, on the job's progress rather than the clock: once a ring of
# 3 has formed after the host failure (the preempted host's replacement joined), wait
# 5 s, then preempt every host.
reclaim() {
  until [[ -f $events ]] && awk '/"event":"host_failed"/ { failed = 1 }
      failed && /"event":"ring_formed","size":3,/ { joined = 1 }
      END { exit !joined }' "$events"; do
    sleep 1
  done
  for _ in 1 2 3 4 5; do sleep 1; done
  echo "preempt all" >>"$control"
}
reclaim &
reclaimer=$!

status=0
.venv/bin/spotring run --provider local \
  -np 2 --min-np 1 --max-np 4 \
  --refresh-interval 1 --boot-seconds 5 \
  --scale-up-at 20 --scale-up-to 3 --notice-at 35 --preempt-at 60 --control "$control" \
  --checkpoint "$checkpoints" --checkpoint-every 5 \
  --events "$events" \
  "$@" \
  -- .venv/bin/python examples/train_digits.py --epochs 24 --step-seconds 0.05 || status=$?
echo
echo "Draw the run (sizes over time, the notice, the preemptions, the resume, stalls, cost):"
echo "  .venv/bin/spotring report $events -o report.html --price-spot 0.30 --price-on-demand 1.00"
exit "$status"
