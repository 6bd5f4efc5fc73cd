#!/usr/bin/env bash
# Sets up .venv (once) and runs the demo (examples/demo.py): elastic Horovod training of
# a small classifier on scikit-learn's digits, on the embedded local provider, while
# the demo plays a spot market on it, each step on the training's progress: the group
# grows from 2 hosts to 3; its newest host announces its interruption and leaves at
# the next commit (nothing rolled back); the newest host is preempted without notice
# (SIGKILL); every host is hard-killed at once and a new ring resumes from the newest
# durable checkpoint (demo-ckpt/); then training finishes. Replacements boot and join
# after each loss. The run's events go to demo-events.jsonl; the script ends by
# printing the command that draws them. Extra arguments go to `spotring run`.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
scripts/setup.sh examples
status=0
.venv/bin/python examples/demo.py "$@" || status=$?
echo
echo "Draw the run (sizes over time, the notice, the preemptions, the resume, stalls, cost):"
echo "  .venv/bin/spotring report demo-events.jsonl -o report.html --price-spot 0.30 --price-on-demand 1.00"
exit "$status"
