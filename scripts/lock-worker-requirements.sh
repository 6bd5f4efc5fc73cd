#!/usr/bin/env bash
# Regenerates worker_image/requirements-worker-CLOUD.txt (aws, gcp, azure): the
# hash-pinned list of everything the hosts' bootstrap (worker_image/bootstrap.sh.tftpl)
# installs from an index, one file per cloud because each carries its cloud's spotring
# extra (boto3; google-cloud-*; azure-*) with its whole dependency tree. terraform/CLOUD
# reads its file with file() and passes it to the template as requirements_lock (the
# boot script is the only thing a host gets from Terraform), so the next
# `terraform apply` carries it: nothing else to update. The bootstrap installs it with
# `pip install --require-hashes`, and spotring itself from a wheel URL whose #sha256=
# pip checks, with --no-deps: a host installs exactly these files or nothing.
#
# What goes in: pip and the build tools for Horovod's source build, spotring's
# dependencies and the cloud's extra (read from pyproject.toml), Horovod's runtime
# dependencies (among spotring's), torch with its own dependencies, and Horovod's sdist.
# Resolved by uv (pip's resolver backtracks for hours over the Google packages) for the
# hosts' platform and Python, not this machine's; each file then fetched by
# `pip download` for that platform and hashed with `pip hash`. PyPI is the only index,
# plus TORCH_INDEX_URL for torch; this machine's pip and uv configuration is ignored.
#
#   scripts/lock-worker-requirements.sh                  # Python 3.12 (Ubuntu 24.04), CPU torch
#   PYTHON_VERSIONS="3.10 3.12" scripts/lock-worker-requirements.sh
#   CLOUDS=gcp scripts/lock-worker-requirements.sh       # one cloud's file only
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 scripts/lock-worker-requirements.sh
#   TORCH_INDEX_URL= scripts/lock-worker-requirements.sh # torch from PyPI (its CUDA build and
#                                                        # its nvidia-*/triton tree, all hashed)
#   SPOTRING_LOCK_WITHOUT_TORCH=1 ...                    # when the torch index is unreachable:
#                                                        # torch's own dependencies only
#
# The torch and Horovod versions are scripts/setup.sh's (tests/terraform/test_terraform.py keeps
# the modules' defaults equal to them). The hosts' AWS user data must stay under 16 KiB
# gzipped (terraform/aws checks it at plan time): hashes do not compress, and each extra
# Python version adds one per compiled package.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
clouds=${CLOUDS:-aws gcp azure}
python_versions=${PYTHON_VERSIONS:-3.12}
platform=${PLATFORM:-manylinux_2_28_x86_64}
[[ "$platform" =~ ^manylinux_2_([0-9]+)_([a-z0-9_]+)$ ]] || {
  echo "PLATFORM must be manylinux_2_GLIBC_ARCH, such as manylinux_2_28_x86_64" >&2
  exit 2
}
glibc=${BASH_REMATCH[1]} arch=${BASH_REMATCH[2]}
uv_platform=$arch-manylinux_2_$glibc
# pip takes --platform literally: name every tag a glibc-2.GLIBC host accepts.
platforms=()
for ((minor = glibc; minor >= 5; minor--)); do platforms+=(--platform "manylinux_2_${minor}_$arch"); done
platforms+=(--platform "manylinux2014_$arch" --platform "manylinux2010_$arch" --platform "manylinux1_$arch")
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
for cloud in $clouds; do
  case "$cloud" in
    aws | gcp | azure) ;;
    *) echo "CLOUDS: $cloud is not one of aws, gcp, azure" >&2; exit 2 ;;
  esac
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Only PyPI (and the torch index): no pip.conf or uv.toml, no mirrors or wheel folders.
for name in $(env | sed -n 's/^\(\(PIP\|UV\)_[A-Z_]*\)=.*/\1/p'); do
  [ "$name" = PIP_CERT ] || unset "$name"
done
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 UV_NO_CONFIG=1

"$python" -m venv "$work/venv"
pip=("$work/venv/bin/python" -m pip)
"${pip[@]}" install -q --index-url https://pypi.org/simple --upgrade pip uv
uv=$work/venv/bin/uv

indexes=(--index-url https://pypi.org/simple)
[ -n "$without_torch" ] || [ -z "$torch_index_url" ] \
  || indexes+=(--extra-index-url "$torch_index_url")

# spotring's dependencies and CLOUD's extra, as pyproject.toml declares them.
requirements_of() {
  "$work/venv/bin/python" - "$root/pyproject.toml" "$1" <<'PY'
import sys

try:
    import tomllib
except ImportError:  # Python < 3.11
    from pip._vendor import tomli as tomllib

with open(sys.argv[1], "rb") as handle:
    project = tomllib.load(handle)["project"]
print("\n".join(project["dependencies"] + project["optional-dependencies"][sys.argv[2]]))
PY
}

# "FILENAME SHA256" per file.
hash_files() {
  local file
  for file in "$@"; do
    printf '%s %s\n' "$(basename "$file")" \
      "$("${pip[@]}" hash -a sha256 "$file" | sed -n 's/^--hash=sha256://p')"
  done
}

echo "fetching horovod $horovod_version (sdist)" >&2
"${pip[@]}" download -q --index-url https://pypi.org/simple --no-deps --no-binary=:all: \
  -d "$work/sdist" "horovod==$horovod_version"

for cloud in $clouds; do
  {
    requirements_of "$cloud"
    # The build tools of Horovod's source build, then torch (or, without it, its own
    # dependencies, so that the torch the bootstrap installs unchecked needs nothing more).
    printf '%s\n' pip setuptools wheel
    if [ -n "$without_torch" ]; then
      printf '%s\n' filelock typing-extensions sympy networkx jinja2 fsspec
    else
      echo "torch==$torch_version"
    fi
  } >"$work/$cloud.in"
  hash_files "$work"/sdist/* >"$work/$cloud.hashes"
  for version in $python_versions; do
    abi=cp${version/./}
    echo "resolving $cloud for CPython $version on $platform" >&2
    # Best match over both indexes, as pip does: torch==V is on PyPI (its CUDA build)
    # and on torch's index (V+cpu, a higher version, which wins).
    "$uv" pip compile -q "$work/$cloud.in" -o "$work/$cloud-$version.txt" "${indexes[@]}" \
      --index-strategy unsafe-best-match --python-version "$version" \
      --python-platform "$uv_platform" --only-binary :all: --no-header --no-annotate
    "${pip[@]}" download -q "${indexes[@]}" --no-deps --only-binary=:all: \
      "${platforms[@]}" --python-version "$version" --implementation cp --abi "$abi" \
      -d "$work/$cloud-py$version" -r "$work/$cloud-$version.txt"
    hash_files "$work/$cloud-py$version"/* >>"$work/$cloud.hashes"
  done

  # One line per package, "name==version --hash=sha256:..." (a hash per file: one per
  # Python version for compiled wheels); a package resolved to different versions for
  # different Pythons is an error (the bootstrap installs one list everywhere).
  CLOUD=$cloud PYTHON_VERSIONS=$python_versions PLATFORM=$platform \
    TORCH_INDEX_URL=$torch_index_url WITHOUT_TORCH=$without_torch \
    "$work/venv/bin/python" - "$work/$cloud.hashes" \
    "$root/worker_image/requirements-worker-$cloud.txt" <<'PY'
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
    f"# extra: {os.environ['CLOUD']}",
    f"# python: {os.environ['PYTHON_VERSIONS']}",
    f"# platform: {os.environ['PLATFORM']}",
    f"# torch-index-url: {os.environ['TORCH_INDEX_URL']}",
]
if os.environ["WITHOUT_TORCH"]:
    header.append("# torch: not locked (SPOTRING_LOCK_WITHOUT_TORCH: its index was unreachable)")
with open(out, "w", encoding="utf-8") as handle:
    handle.write("\n".join(header + lines) + "\n")
PY
  echo "wrote $root/worker_image/requirements-worker-$cloud.txt" \
    "($(grep -vc '^#' "$root/worker_image/requirements-worker-$cloud.txt") packages)" >&2
done
