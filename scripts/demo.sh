#!/usr/bin/env bash
# Sets up .venv (once) and runs the main job: elastic Horovod training of a small
# classifier on scikit-learn's digits, on the embedded local provider. The group starts
# with 2 hosts, grows to 3 at 20 s; at 35 s its newest host announces a spot
# interruption 10 s ahead and leaves at the next commit (nothing rolled back); at 60 s
# the newest host is preempted without notice (SIGKILL); replacements boot and join
# after each. The run's events go to demo-events.jsonl; the script ends by printing the
# command that draws them. Extra arguments go to `spotring run` before the `--`.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
scripts/setup.sh examples
events=demo-events.jsonl
rm -f "$events"
status=0
.venv/bin/spotring run --provider local \
  -np 2 --min-np 1 --max-np 4 \
  --refresh-interval 1 --boot-seconds 5 \
  --scale-up-at 20 --scale-up-to 3 --notice-at 35 --preempt-at 60 \
  --events "$events" \
  "$@" \
  -- .venv/bin/python examples/train_digits.py --epochs 24 --step-seconds 0.05 || status=$?
echo
echo "Draw the run (sizes over time, the notice, the preemption, stalls, cost):"
echo "  .venv/bin/spotring report $events -o report.html --price-spot 0.30 --price-on-demand 1.00"
exit "$status"
