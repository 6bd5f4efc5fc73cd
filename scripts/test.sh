#!/usr/bin/env bash
# Sets up .venv with every extra (once) and runs the checks: ruff, mypy, the docs
# build, then pytest.
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
# mypy checks the product as the spotring package: each folder is linked under the name
# pyproject.toml's package-dir gives it (mypy cannot follow setuptools' mapping).
mkdir -p build/mypy/spotring
sed -n 's/^"spotring\.\([a-z_]*\)" = "\([a-z_]*\)"$/\1 \2/p' pyproject.toml \
  | while read -r name folder; do ln -sfn "../../../$folder" "build/mypy/spotring/$name"; done
.venv/bin/python -m mypy
# The docs site into build/site, strictly (a broken link or anchor fails), with its
# reference pages generated from the code (docs/gen_reference.py).
NO_MKDOCS_2_WARNING=1 .venv/bin/python -m mkdocs build --strict
# pytest as two processes side by side: the end-to-end tests (marked e2e: real jobs with
# real workers, whose timing is part of what they check) one at a time, as alone, and
# the rest of the suite beside them, its output shown once it is done.
# SPOTRING_TEST_SERIAL=1 runs everything in one process. Arguments go to both.
if [ "${SPOTRING_TEST_SERIAL:-0}" = 1 ]; then
  exec .venv/bin/python -m pytest "$@"
fi
rest_log=$(mktemp)
trap 'rm -f "$rest_log"' EXIT
.venv/bin/python -m pytest -m "not e2e" "$@" >"$rest_log" 2>&1 &
rest=$!
set +e
.venv/bin/python -m pytest -m e2e "$@"
e2e_status=$?
wait "$rest"
rest_status=$?
set -e
echo "--- the rest of the suite (not e2e), run beside the end-to-end tests:"
cat "$rest_log"
# 5: that half selected no test (arguments that name only the other kind).
for status in "$e2e_status" "$rest_status"; do
  if [ "$status" != 0 ] && [ "$status" != 5 ]; then
    exit "$status"
  fi
done
