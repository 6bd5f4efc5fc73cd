#!/usr/bin/env bash
# Creates (or refreshes) the project's virtual environment at .venv.
#
#   scripts/setup.sh [EXTRA,...]     e.g. scripts/setup.sh dev,aws,gcp,azure
#
# Idempotent: a second run reuses the venv and the cached Horovod wheel, so it takes
# seconds. Horovod 0.28.1 ships only as an sdist that does not compile against
# torch >= 2.1 (it asks for C++14; torch's headers need C++17). We build it once with
# CMAKE_CXX_STANDARD 17 (the fix upstream merged after the release) for CPU with Gloo
# and PyTorch, with worker_image/horovod-failure-paths.patch (where a dying peer made
# every other worker std::terminate, Horovod now raises an error it recovers from) and
# then worker_image/horovod-rendezvous.patch (each Gloo context forms with one request
# per rank to the driver's rendezvous server instead of about 2N, and the global
# process set reuses the global contexts) and worker_image/horovod-waits.patch (a
# worker waiting for a collective sleeps instead of keeping a core busy; Gloo's event
# loop is woken instead of polled when a pair connects), and cache the wheel under
# $SPOTRING_CACHE (default ~/.cache/spotring), keyed on the patches.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
extras=${1:-}
venv="$root/.venv"
cache=${SPOTRING_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spotring}
torch_version=2.13.0
horovod_version=0.28.1
python=${PYTHON:-python3}

log() { printf '[setup] %s\n' "$*" >&2; }
# pip, minus the warnings some machines' pip.conf causes for index folders they lack.
quiet_pip() {
  "$venv/bin/python" -m pip "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
}

if [ ! -x "$venv/bin/python" ]; then
  log "creating virtual environment at .venv"
  "$python" -m venv "$venv"
  quiet_pip install -q --upgrade pip wheel setuptools
fi
pip=(quiet_pip install -q)

# torch first and pinned: an unpinned torch (pulled in by another package) is a
# multi-GB CUDA build; 2.13.0 is a CPU build from local disk.
if ! "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
  log "installing torch==$torch_version (CPU)"
  "${pip[@]}" "torch==$torch_version" numpy cloudpickle psutil pyyaml packaging
fi

# Applied in this order (worker_image/bootstrap.sh.tftpl applies the same list).
horovod_patches=("$root/worker_image/horovod-failure-paths.patch"
  "$root/worker_image/horovod-rendezvous.patch"
  "$root/worker_image/horovod-waits.patch")
# Wheels are cached per set of patches: changing one builds (and installs) a new one.
horovod_build=$(cat "${horovod_patches[@]}" | sha1sum | cut -c1-12)
wheels="$cache/wheels/horovod-$horovod_version-$horovod_build"

HOROVOD_CXX_INCLUDES="-include cstdint -include string -include stdexcept -include memory \
-include limits -include functional -include algorithm"

build_horovod_wheel() {
  local work
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  log "building horovod $horovod_version from source (about 5 minutes, once)"
  quiet_pip download -q --no-deps --no-binary=:all: \
    "horovod==$horovod_version" -d "$work"
  tar -xzf "$work/horovod-$horovod_version.tar.gz" -C "$work"
  local src="$work/horovod-$horovod_version"
  sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' \
    "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
  grep -q 'CMAKE_CXX_STANDARD 17' "$src/horovod/torch/CMakeLists.txt" \
    || { log "C++17 patch did not apply"; return 1; }
  local horovod_patch
  for horovod_patch in "${horovod_patches[@]}"; do
    patch -s -p1 -d "$src" <"$horovod_patch" || { log "$horovod_patch did not apply"; return 1; }
  done
  # Newer toolchains: CMake >= 4 refuses the bundled gloo's cmake_minimum_required,
  # and GCC >= 13 no longer pulls <string>, <stdexcept>, ... in transitively.
  CMAKE_POLICY_VERSION_MINIMUM=3.5 CXXFLAGS="${CXXFLAGS:-} $HOROVOD_CXX_INCLUDES" \
  HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
    HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
    MAKEFLAGS="-j$(nproc)" HOROVOD_BUILD_PARALLEL="$(nproc)" \
    quiet_pip wheel -q --no-deps --no-build-isolation \
    -w "$wheels" "$src"
}

horovod_stamp="$venv/.horovod-build"
if [ "$(cat "$horovod_stamp" 2>/dev/null || true)" != "$horovod_build" ] \
  || ! "$venv/bin/python" -c "import horovod.torch" 2>/dev/null; then
  mkdir -p "$wheels"
  wheel=$(ls "$wheels"/horovod-"$horovod_version"-*.whl 2>/dev/null | head -n 1 || true)
  if [ -z "$wheel" ]; then
    build_horovod_wheel
    wheel=$(ls "$wheels"/horovod-"$horovod_version"-*.whl | head -n 1)
  fi
  log "installing $(basename "$wheel") (build $horovod_build)"
  "${pip[@]}" --no-deps --force-reinstall "$wheel"
  printf '%s' "$horovod_build" >"$horovod_stamp"
fi

# The project itself, editable; pip skips what is already satisfied.
stamp="$venv/.spotring-installed-${extras:-base}"
want=$(sha1sum <"$root/pyproject.toml")
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  log "installing spotring${extras:+[$extras]}"
  # setuptools' editable-install warnings are noise here; show them only on failure.
  if ! "${pip[@]}" -e "$root${extras:+[$extras]}" >"$venv/install.log" 2>&1; then
    cat "$venv/install.log" >&2
    exit 1
  fi
  printf '%s' "$want" >"$stamp"
fi

# Azurite, the Azure Blob emulator the checkpoint tests start (tests/fakes/storage_emulators.py
# finds it here), from npm, pinned. Installed into a fresh folder and moved into place, so
# an interrupted install is never taken for a finished one.
azurite_version=3.35.0
azurite_dir="$cache/azurite-$azurite_version"
if [[ ",$extras," == *,dev,* ]] && [ ! -x "$azurite_dir/node_modules/.bin/azurite-blob" ]; then
  if command -v npm >/dev/null; then
    log "installing azurite $azurite_version (npm) into $azurite_dir"
    mkdir -p "$cache"
    work=$(mktemp -d "$cache/.azurite-XXXXXX")
    if npm install --prefix "$work" --no-audit --no-fund --loglevel=error \
      "azurite@$azurite_version" >"$venv/azurite-install.log" 2>&1; then
      rm -rf "$azurite_dir"
      mv "$work" "$azurite_dir"
    else
      rm -rf "$work"
      cat "$venv/azurite-install.log" >&2
      exit 1
    fi
  else
    log "npm not found: the Azure Blob checkpoint tests will be skipped (they need Azurite)"
  fi
fi

# checkov (tests/terraform/test_checkov.py) pins older boto3, botocore, packaging and networkx
# than the dev tools, so it gets a venv of its own.
checkov_version=3.3.30
checkov_venv="$venv/tools/checkov"
if [[ ",$extras," == *,dev,* ]] \
  && [ "$("$checkov_venv/bin/python" -c "import importlib.metadata as m; print(m.version('checkov'))" 2>/dev/null || true)" != "$checkov_version" ]; then
  log "installing checkov $checkov_version into .venv/tools/checkov"
  "$python" -m venv "$checkov_venv"
  "$checkov_venv/bin/python" -m pip install -q "checkov==$checkov_version" \
    2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
fi
