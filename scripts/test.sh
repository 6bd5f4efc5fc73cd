#!/usr/bin/env bash
# Sets up .venv with every extra (once) and runs the checks: ruff, then pytest.
# Extra arguments go to pytest.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
scripts/setup.sh dev,aws,gcp,azure
# The example provider plugin, installed as a user would (tests check that it works).
plugin=examples/provider-plugin
stamp=.venv/.spotring-plugin-installed
want=$(cat "$plugin/pyproject.toml" "$plugin"/src/spotring_hostfile/*.py | sha1sum)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  if ! .venv/bin/python -m pip install -q --no-deps "./$plugin" >.venv/plugin-install.log 2>&1; then
    cat .venv/plugin-install.log >&2
    exit 1
  fi
  printf '%s' "$want" >"$stamp"
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest "$@"
