#!/usr/bin/env bash
# Regenerates worker_image/requirements-worker.txt, the hash-pinned list of what the
# hosts' bootstrap (worker_image/bootstrap.sh.tftpl) installs. terraform/aws, gcp and
# azure read it with file() and pass it to the template as requirements_lock (the boot
# script is the only thing a host gets from Terraform), so the next `terraform apply`
# carries it: nothing else to update. The bootstrap installs it with
# `pip install --require-hashes`, so a host installs exactly these files or nothing.
#
# Resolved with pip's own tools in a scratch venv: `pip download` for the hosts'
# platform and Python (not this machine's), `pip hash` for each file. PyPI is the only
# index, plus TORCH_INDEX_URL for torch; this machine's pip configuration is ignored.
#
#   scripts/lock-worker-requirements.sh                  # Python 3.12 (Ubuntu 24.04), CPU torch
#   PYTHON_VERSIONS="3.10 3.12" scripts/lock-worker-requirements.sh
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 scripts/lock-worker-requirements.sh
#   TORCH_INDEX_URL= scripts/lock-worker-requirements.sh # torch from PyPI (its CUDA build)
#   SPOTRING_LOCK_WITHOUT_TORCH=1 ...                    # when the torch index is unreachable
#
# The torch and Horovod versions are scripts/setup.sh's (tests/test_terraform.py keeps
# the modules' defaults equal to them). The hosts' AWS user data must stay under 16 KiB
# gzipped (terraform/aws checks it at plan time): hashes do not compress, and each extra
# Python version adds one per compiled package.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/worker_image/requirements-worker.txt
python_versions=${PYTHON_VERSIONS:-3.12}
platform=${PLATFORM:-manylinux_2_28_x86_64}
torch_index_url=${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}
without_torch=${SPOTRING_LOCK_WITHOUT_TORCH:-}
python=${PYTHON:-python3}

torch_version=$(sed -n 's/^torch_version=//p' "$root/scripts/setup.sh")
horovod_version=$(sed -n 's/^horovod_version=//p' "$root/scripts/setup.sh")
[ -n "$torch_version" ] && [ -n "$horovod_version" ] || {
  echo "scripts/setup.sh sets no torch_version or horovod_version" >&2
  exit 1
}
case "$torch_index_url" in
  "" | https://*) ;;
  *) echo "TORCH_INDEX_URL must be empty (PyPI) or an https:// URL" >&2; exit 1 ;;
esac

# What the hosts need besides Horovod: pip and the build tools for Horovod's source
# build, torch's own dependencies, Horovod's runtime dependencies, spotring's
# dependencies with the aws extra (boto3, which the lifecycle hook answer uses too).
top_level=(
  pip setuptools wheel
  filelock typing-extensions sympy networkx jinja2 fsspec
  numpy cloudpickle psutil pyyaml packaging
  pluggy prometheus_client boto3
)
[ -n "$without_torch" ] || top_level+=("torch==$torch_version")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Only PyPI (and the torch index): no pip.conf, no local mirrors or wheel folders.
for name in $(env | sed -n 's/^\(PIP_[A-Z_]*\)=.*/\1/p'); do
  [ "$name" = PIP_CERT ] || unset "$name"
done
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

"$python" -m venv "$work/venv"
pip=("$work/venv/bin/python" -m pip)
"${pip[@]}" install -q --index-url https://pypi.org/simple --upgrade pip

indexes=(--index-url https://pypi.org/simple)
[ -n "$without_torch" ] || [ -z "$torch_index_url" ] \
  || indexes+=(--extra-index-url "$torch_index_url")

for version in $python_versions; do
  abi=cp${version/./}
  echo "resolving for CPython $version on $platform" >&2
  "${pip[@]}" download -q "${indexes[@]}" --only-binary=:all: \
    --platform "$platform" --python-version "$version" --implementation cp --abi "$abi" \
    -d "$work/py$version" "${top_level[@]}"
done
echo "fetching horovod $horovod_version (sdist)" >&2
"${pip[@]}" download -q --index-url https://pypi.org/simple --no-deps --no-binary=:all: \
  -d "$work/sdist" "horovod==$horovod_version"

for file in "$work"/py*/* "$work"/sdist/*; do
  printf '%s %s\n' "$(basename "$file")" \
    "$("${pip[@]}" hash -a sha256 "$file" | sed -n 's/^--hash=sha256://p')"
done >"$work/hashes"

# One line per package, "name==version --hash=sha256:..." (a hash per file: one per
# Python version for compiled wheels); a package resolved to different versions for
# different Pythons is an error (the bootstrap installs one list everywhere).
PYTHON_VERSIONS=$python_versions PLATFORM=$platform TORCH_INDEX_URL=$torch_index_url \
  "$work/venv/bin/python" - "$work/hashes" "$out" <<'PY'
import os
import re
import sys
from collections import defaultdict

from pip._vendor.packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename

hashes_file, out = sys.argv[1:]
found = defaultdict(lambda: defaultdict(set))
for line in open(hashes_file, encoding="utf-8"):
    filename, digest = line.split()
    assert re.fullmatch(r"[0-9a-f]{64}", digest), line
    if filename.endswith(".whl"):
        name, version, _, _ = parse_wheel_filename(filename)
    else:
        name, version = parse_sdist_filename(filename)
    found[canonicalize_name(name)][str(version)].add(digest)

lines = []
for name in sorted(found):
    versions = found[name]
    if len(versions) != 1:
        sys.exit(f"{name} resolves to different versions per Python: {sorted(versions)}")
    ((version, digests),) = versions.items()
    lines.append(f"{name}=={version} " + " ".join(f"--hash=sha256:{d}" for d in sorted(digests)))

header = [
    "# Generated by scripts/lock-worker-requirements.sh; do not edit.",
    f"# python: {os.environ['PYTHON_VERSIONS']}",
    f"# platform: {os.environ['PLATFORM']}",
    f"# torch-index-url: {os.environ['TORCH_INDEX_URL']}",
]
with open(out, "w", encoding="utf-8") as handle:
    handle.write("\n".join(header + lines) + "\n")
PY

echo "wrote $out ($(grep -vc '^#' "$out") packages)" >&2
