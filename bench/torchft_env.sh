#!/usr/bin/env bash
# The scratch venv bench/torchft_anchor.py runs torchft from (torchft is no project
# dependency: it pins its own OpenTelemetry stack and a Rust lighthouse). Idempotent:
# a venv that already imports the pinned versions is left as it is.
#
#   bench/torchft_env.sh [VENV]      # default: $TORCHFT_VENV or /tmp/torchft-venv
set -euo pipefail

venv="${1:-${TORCHFT_VENV:-/tmp/torchft-venv}}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
# The project's interpreter (Python 3.11: torchft 0.2.0 ships a cp311 wheel only).
python="${PYTHON:-$repo/.venv/bin/python}"
torch_version=2.13.0
torchft_version=0.2.0

check='import importlib.metadata as m, sys
want = {"torch": sys.argv[1], "torchft": sys.argv[2]}
have = {n: m.version(n).split("+")[0] for n in want}
sys.exit(have != want)'

if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" "$torch_version" "$torchft_version" 2>/dev/null; then
    echo "torchft venv ready: $venv"
    exit 0
fi
"$python" -m venv "$venv"
# torchft's requirements (opentelemetry-api, -sdk, -exporter-otlp-proto-http >= 1.39)
# come with it.
"$venv/bin/pip" install --quiet "torch==$torch_version" "torchft==$torchft_version"
"$venv/bin/python" -c "$check" "$torch_version" "$torchft_version"
"$venv/bin/pip" freeze | grep -iE '^(torch|torchft|opentelemetry-(api|sdk|exporter-otlp-proto-http))=='
echo "torchft venv ready: $venv"
