"""Checks of worker_image/bootstrap.sh.tftpl, the user data of the workers and the driver.

The script installs torch and builds Horovod on a cloud host; that cannot run here. What
can: render the template the way Terraform's templatefile() does, check the result with
`bash -n`, and source it (its `main` only runs when executed) to drive single steps with
stand-ins for pip, curl, sudo and getent: the C++17 patch on a fake Horovod tree, the
build flags, the order of the steps, the lifecycle-hook answer on success and on failure.
Where a `terraform` binary is on PATH, its templatefile() output is compared with the
renderer here (no provider or network needed).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "worker_image" / "bootstrap.sh.tftpl"
LOCK = REPO / "worker_image" / "requirements-worker-aws.txt"  # the AWS module's
HOROVOD_PATCHES = [
    REPO / "worker_image" / "horovod-failure-paths.patch",
    REPO / "worker_image" / "horovod-rendezvous.patch",
    REPO / "worker_image" / "horovod-waits.patch",
]
"""spotring's Horovod patches, in the order scripts/setup.sh and the bootstrap apply them."""

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

WORKER_VARS = {
    "role": "worker",
    "ssh_user": "ubuntu",
    "ssh_authorized_keys": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample driver\n"
    "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQExample admin@laptop",
    "torch_version": "2.13.0",
    "torch_index_url": "https://download.pytorch.org/whl/cpu",
    "horovod_version": "0.28.1",
    "horovod_wheel_url": "",
    "horovod_gpu_operations": "",
    "spotring_package": "spotring[aws] @ https://example.com/spotring-0.1.0-py3-none-any.whl#sha256="
    + "b" * 64,
    "region": "us-east-1",
    "group_name": "spot-train",
    "lifecycle_hook_name": "spot-train-bootstrap",
    "job_setup_commands": 'mkdir -p "$HOME/job"\necho "${HOME}" >"$HOME/job/where"',
    # What terraform/aws passes: chomp(file(".../requirements-worker-aws.txt")).
    "requirements_lock": LOCK.read_text(encoding="utf-8").rstrip("\r\n"),
}
DRIVER_VARS = {**WORKER_VARS, "role": "driver", "lifecycle_hook_name": ""}


def render(variables: dict[str, str]) -> str:
    """templatefile() for the subset the template uses: ${name}, $${ and %%{ escapes."""
    text = TEMPLATE.read_text(encoding="utf-8")
    escaped = "\0ESCAPED_DOLLAR_BRACE\0"
    text = text.replace("$${", escaped).replace("%%{", "%\0{")
    assert "%{" not in text, "template directives are not supported by this renderer"

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        assert name in variables, f"template variable {name} has no value"
        return variables[name]

    placeholder = re.compile(r"\$\{\s*([A-Za-z_]\w*)\s*\}")
    assert "${" not in placeholder.sub("", text), "an interpolation this renderer cannot fill"
    # One pass, like Terraform: a value's own "${" is not interpolated again.
    text = placeholder.sub(substitute, text)
    return text.replace(escaped, "${").replace("%\0{", "%{")


def template_variables() -> set[str]:
    text = TEMPLATE.read_text(encoding="utf-8").replace("$${", "")
    return set(re.findall(r"\$\{\s*([A-Za-z_]\w*)\s*\}", text))


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "bootstrap.sh"
    path.write_text(render(WORKER_VARS), encoding="utf-8")
    return path


def _executable(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/usr/bin/env bash\n" + body, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def run_sourced(
    script: Path, commands: str, tmp_path: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Source the rendered script (defines functions only) and run ``commands``."""
    full_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "SPOTRING_VENV": str(tmp_path / "venv"),
        "SPOTRING_BOOTSTRAP_LOG": str(tmp_path / "bootstrap.log"),
        "SPOTRING_STATE_DIR": str(tmp_path / "state"),
        "SPOTRING_ENV_FILE": str(tmp_path / "environment"),
        "CALLS": str(tmp_path / "calls.log"),
        "SPOTRING_HOROVOD_PATCH_DIR": str(REPO / "worker_image"),
        **(env or {}),
    }
    return subprocess.run(
        ["bash", "-c", f"source {shlex.quote(str(script))}\n{commands}"],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=tmp_path,
    )


def calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls.log"
    return log.read_text(encoding="utf-8").splitlines() if log.exists() else []


# ------------------------------------------------------------------ static


def test_template_variables_are_the_ones_terraform_passes() -> None:
    # tests/terraform/test_terraform.py checks the templatefile() calls against the template;
    # this keeps the sample values here complete.
    assert template_variables() == set(WORKER_VARS)


@pytest.mark.parametrize("variables", [WORKER_VARS, DRIVER_VARS], ids=["worker", "driver"])
def test_rendered_script_is_valid_bash(variables: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "bootstrap.sh"
    path.write_text(render(variables), encoding="utf-8")
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


USER_DATA_LIMIT = 16 * 1024  # EC2's limit on user data, before base64


def test_rendered_script_fits_in_user_data() -> None:
    """terraform/aws sends the script gzipped (base64gzip; cloud-init unpacks it): EC2's
    limit applies to the gzip, with room left for ssh keys and job_setup_commands."""
    for variables in (WORKER_VARS, DRIVER_VARS):
        assert (
            len(gzip.compress(render(variables).encode(), compresslevel=6)) < USER_DATA_LIMIT // 2
        )
    # Uncompressible input (random-looking keys and commands) adds its own size; 8 KiB of
    # it still fits.
    noise = os.urandom(3 * 1024).hex()  # 6 KiB of hex digits
    heavy = {
        **WORKER_VARS,
        "ssh_authorized_keys": "\n".join(
            f"ssh-ed25519 {noise[i : i + 68]} k{i}" for i in range(0, 2048, 68)
        ),
        "job_setup_commands": f"echo {noise[2048:]}",
    }
    assert len(gzip.compress(render(heavy).encode(), compresslevel=6)) < USER_DATA_LIMIT


def test_rendered_script_carries_the_cxx17_fix_and_build_flags() -> None:
    text = render(WORKER_VARS)
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text
    assert "s/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/" in text
    assert '"$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"' in text
    for flag in (
        "HOROVOD_WITH_PYTORCH=1",
        "HOROVOD_WITH_GLOO=1",
        "HOROVOD_WITHOUT_MPI=1",
        "HOROVOD_WITHOUT_TENSORFLOW=1",
        "HOROVOD_WITHOUT_MXNET=1",
    ):
        assert flag in text, flag
    assert "--no-build-isolation" in text
    assert "TORCH_VERSION='2.13.0'" in text and "HOROVOD_VERSION='0.28.1'" in text
    assert "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQExample admin@laptop" in text


@pytest.mark.skipif(shutil.which("terraform") is None, reason="no terraform binary on PATH")
@pytest.mark.parametrize("variables", [WORKER_VARS, DRIVER_VARS], ids=["worker", "driver"])
def test_terraform_renders_the_same_script(variables: dict[str, str], tmp_path: Path) -> None:
    """This file's renderer against Terraform's own templatefile() (no provider needed)."""
    (tmp_path / "main.tf").write_text(
        'variable "vars" {\n  type = map(string)\n}\n'
        f'locals {{\n  rendered = templatefile("{TEMPLATE.as_posix()}", var.vars)\n}}\n'
        'output "rendered" {\n  value = local.rendered\n}\n'
        # What terraform/aws sends EC2 (base64gzip), in base64 characters.
        'output "user_data_length" {\n  value = length(base64gzip(local.rendered))\n}\n'
    )
    (tmp_path / "terraform.tfvars.json").write_text(json.dumps({"vars": variables}))
    env = {**os.environ, "TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1"}
    for args in (["init", "-input=false"], ["apply", "-auto-approve", "-input=false"]):
        done = subprocess.run(
            ["terraform", *args, "-no-color"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    done = subprocess.run(
        ["terraform", "output", "-raw", "rendered"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout == render(variables)
    done = subprocess.run(
        ["terraform", "output", "-raw", "user_data_length"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    # Half of EC2's 16 KiB at most (4 base64 characters carry 3 bytes): the rest is
    # room for ssh keys and job_setup_commands.
    assert int(done.stdout) * 3 // 4 < USER_DATA_LIMIT // 2


def test_lock_is_a_template_variable_not_a_copy() -> None:
    """The lock reaches the hosts through requirements_lock (file() in each module):
    the template keeps no copy of it."""
    text = TEMPLATE.read_text(encoding="utf-8")
    assert "--hash=sha256:" not in text
    assert "cat <<'SPOTRING_REQUIREMENTS'\n${requirements_lock}\nSPOTRING_REQUIREMENTS\n" in text
    rendered = render(WORKER_VARS)
    assert (
        f"<<'SPOTRING_REQUIREMENTS'\n{LOCK.read_text(encoding='utf-8')}SPOTRING_REQUIREMENTS\n"
        in (rendered)
    )


def test_embedded_python_compiles() -> None:
    blocks = re.findall(r"<<'PY'\n(.*?)\nPY\n", render(WORKER_VARS), re.DOTALL)
    assert len(blocks) == 2, "expected the verify and complete_lifecycle snippets"
    for number, block in enumerate(blocks):
        compile(block, f"bootstrap-snippet-{number}", "exec")


# ------------------------------------------------------------------ behaviour


def _fake_horovod_tree(root: Path, standard: int = 14) -> Path:
    src = root / "horovod-0.28.1"
    (src / "horovod" / "torch").mkdir(parents=True)
    (src / "CMakeLists.txt").write_text(
        f"cmake_minimum_required(VERSION 3.13)\nset(CMAKE_CXX_STANDARD {standard})\n"
    )
    (src / "horovod" / "torch" / "CMakeLists.txt").write_text(
        f"if(NOT DEFINED CMAKE_CXX_STANDARD)\n  set(CMAKE_CXX_STANDARD {standard})\nendif()\n"
    )
    for path, text in _patched_sources_before().items():
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        (src / path).write_text(text)
    return src


def _patched_sources_before() -> dict[str, str]:
    """For each file spotring's Horovod patches change, the lines they expect (their
    context and removed lines), with filler between the hunks, as ``patch`` finds them
    in the real source. (No two patches change the same file.)"""
    files: dict[str, list[str]] = {}
    lines: list[str] = []
    patch_lines = [line for path in HOROVOD_PATCHES for line in path.read_text().splitlines()]
    for line in patch_lines:
        if line.startswith("--- a/"):
            lines = files.setdefault(line[len("--- a/") :], [])
        elif line.startswith("+++ "):
            continue
        elif line.startswith("@@"):
            lines.append("// other code\n")
        elif line[:1] in (" ", "-"):
            lines.append(line[1:] + "\n")
    return {path: "".join(text) for path, text in files.items()}


def test_patch_switches_both_cmake_files_to_cxx17(script: Path, tmp_path: Path) -> None:
    src = _fake_horovod_tree(tmp_path / "tree")
    done = run_sourced(script, f"patch_horovod_source {shlex.quote(str(src))}", tmp_path)
    assert done.returncode == 0, done.stderr
    top = (src / "CMakeLists.txt").read_text()
    torch = (src / "horovod" / "torch" / "CMakeLists.txt").read_text()
    assert "set(CMAKE_CXX_STANDARD 17)" in top and "14" not in top
    assert "set(CMAKE_CXX_STANDARD 17)" in torch and "14" not in torch
    assert "cmake_minimum_required(VERSION 3.13)" in top
    operations = (src / "horovod" / "common" / "operations.cc").read_text()
    assert "Horovod could not form its Gloo context" in operations
    assert "horovod_global.initialization_failed = false;" in operations
    pair = (src / "third_party" / "gloo" / "gloo" / "transport" / "tcp" / "pair.cc").read_text()
    assert "catch (const ::gloo::EnforceNotMet& ex)" in pair
    # and the second patch, after the first
    store = (src / "horovod" / "common" / "gloo" / "http_store.cc").read_text()
    assert '"spotring-mesh-"' in store
    mesh = (src / "third_party" / "gloo" / "gloo" / "rendezvous" / "context.cc").read_text()
    assert "store.exchangeFullMesh(" in mesh
    # and the third
    wait = (src / "horovod" / "torch" / "mpi_ops_v2.cc").read_text()
    assert "handle_manager.WaitForHandle(handle);" in wait
    assert "if (handle_manager.PollHandle(handle)) break;" not in wait
    loop = (src / "third_party" / "gloo" / "gloo" / "transport" / "tcp" / "loop.cc").read_text()
    assert "deferrables_.defer([] {});" in loop


def test_bootstrap_finds_the_horovod_patch_in_the_installed_package(
    tmp_path: Path, python: str
) -> None:
    path = tmp_path / "bootstrap.sh"
    path.write_text(render(WORKER_VARS))
    _executable(tmp_path / "venv" / "bin" / "python", f'exec {shlex.quote(python)} "$@"\n')
    src = _fake_horovod_tree(tmp_path / "tree")
    done = run_sourced(
        path, f"patch_horovod_source {shlex.quote(str(src))}", tmp_path,
        {"SPOTRING_HOROVOD_PATCH_DIR": ""},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "could not form its Gloo context" in (src / "horovod/common/operations.cc").read_text()
    assert "spotring-mesh-" in (src / "horovod/common/gloo/http_store.cc").read_text()
    assert "WaitForHandle" in (src / "horovod/torch/handle_manager.cc").read_text()


def test_patch_fails_loudly_when_it_does_not_apply(script: Path, tmp_path: Path) -> None:
    src = _fake_horovod_tree(tmp_path / "tree", standard=11)
    done = run_sourced(script, f"patch_horovod_source {shlex.quote(str(src))}", tmp_path)
    assert done.returncode != 0
    assert "did not apply" in done.stderr


# A Python the lock covers, for the bootstrap's version check (python -c ...).
LOCKED_PYTHON = re.search(r"^# python: (\S+)", LOCK.read_text(), re.MULTILINE).group(1)
FAKE_PYTHON = r"""
if [ "$1" = -c ]; then echo "$FAKE_PYTHON_VERSION"; exit 0; fi
printf 'python %s\n' "$*" >>"$CALLS"
prev=
for arg in "$@"; do  # keep each -r file: the bootstrap deletes it
  if [ "$prev" = -r ]; then cp "$arg" "$CALLS.$(basename "$arg")"; fi
  prev=$arg
done
if [ "$1 $2 $3" = "-m pip download" ]; then
  dest=${@: -1}
  tar -czf "$dest/horovod-0.28.1.tar.gz" -C "$FAKE_TREE" horovod-0.28.1
elif [[ " $* " == *" --no-build-isolation "* ]]; then
  src=${@: -1}
  env | grep -E '^(HOROVOD_|MAKEFLAGS=)' | sort | sed 's/^/env /' >>"$CALLS"
  sed 's/^/cmake /' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt" >>"$CALLS"
fi
"""


def _fake_venv(tmp_path: Path, python: str = LOCKED_PYTHON) -> dict[str, str]:
    _fake_horovod_tree(tmp_path / "fake_tree")
    _executable(tmp_path / "venv" / "bin" / "python", FAKE_PYTHON)
    return {"FAKE_TREE": str(tmp_path / "fake_tree"), "FAKE_PYTHON_VERSION": python}


def _lock_lines() -> list[str]:
    return LOCK.read_text(encoding="utf-8").splitlines()


def test_source_build_is_patched_flagged_and_without_build_isolation(
    script: Path, tmp_path: Path
) -> None:
    env = _fake_venv(tmp_path)
    done = run_sourced(script, "install_horovod", tmp_path, env)
    assert done.returncode == 0, done.stderr
    log = calls(tmp_path)
    (download,) = [c for c in log if " pip download " in c]
    # Horovod's sdist, hash-checked: only the lock's horovod line, and --require-hashes.
    assert "--no-binary=:all:" in download and "--no-deps" in download
    assert re.search(r" --require-hashes -r \S+/horovod\.txt ", download), download
    assert "horovod==" not in download, "the sdist must come through the hashed -r file"
    pinned = (tmp_path / "calls.log.horovod.txt").read_text().splitlines()
    assert pinned == [line for line in _lock_lines() if line.startswith("horovod==0.28.1 ")]
    assert re.fullmatch(r"horovod==0\.28\.1( --hash=sha256:[0-9a-f]{64})+", pinned[0])
    (install,) = [c for c in log if " pip install " in c and "--no-build-isolation" in c]
    assert "--no-deps" in install
    envs = {c[4:] for c in log if c.startswith("env ")}
    assert {
        "HOROVOD_WITH_PYTORCH=1",
        "HOROVOD_WITH_GLOO=1",
        "HOROVOD_WITHOUT_MPI=1",
        "HOROVOD_WITHOUT_TENSORFLOW=1",
        "HOROVOD_WITHOUT_MXNET=1",
    } <= envs
    assert not any(e.startswith("HOROVOD_GPU_OPERATIONS=") for e in envs)
    cmake = [c for c in log if c.startswith("cmake ")]
    assert cmake.count("cmake set(CMAKE_CXX_STANDARD 17)") == 1
    assert "cmake   set(CMAKE_CXX_STANDARD 17)" in cmake
    assert not any("14" in c for c in cmake)


def test_nccl_build_sets_gpu_operations(tmp_path: Path) -> None:
    path = tmp_path / "bootstrap.sh"
    path.write_text(render({**WORKER_VARS, "horovod_gpu_operations": "NCCL"}))
    done = run_sourced(path, "install_horovod", tmp_path, _fake_venv(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "env HOROVOD_GPU_OPERATIONS=NCCL" in calls(tmp_path)


def test_prebuilt_wheel_skips_the_build(tmp_path: Path) -> None:
    url = "https://example.com/horovod-0.28.1-cp312-cp312-linux_x86_64.whl#sha256=" + "a" * 64
    path = tmp_path / "bootstrap.sh"
    path.write_text(render({**WORKER_VARS, "horovod_wheel_url": url}))
    done = run_sourced(path, "install_horovod", tmp_path, _fake_venv(tmp_path))
    assert done.returncode == 0, done.stderr
    log = calls(tmp_path)
    # pip checks the wheel against the URL's #sha256= fragment.
    assert len(log) == 1 and log[0].endswith(f"--require-hashes --no-deps {url}"), log


def test_torch_is_pinned_and_comes_from_the_index(script: Path, tmp_path: Path) -> None:
    done = run_sourced(script, "install_torch", tmp_path, _fake_venv(tmp_path))
    assert done.returncode == 0, done.stderr
    log = calls(tmp_path)
    # First the whole lock but Horovod, every file hash-checked, binaries only, torch's
    # index next to PyPI.
    first = shlex.split(log[0])
    assert first[:4] == ["python", "-m", "pip", "install"], log[0]
    assert "--require-hashes" in first and "--only-binary=:all:" in first, log[0]
    assert first[first.index("--extra-index-url") + 1] == "https://download.pytorch.org/whl/cpu"
    assert Path(first[first.index("-r") + 1]).name == "requirements.txt", log[0]
    installed = (tmp_path / "calls.log.requirements.txt").read_text().splitlines()
    assert installed == [line for line in _lock_lines() if not line.startswith("horovod==")]
    assert any(line.startswith("numpy==") for line in installed)
    locked_torch = [line for line in installed if line.startswith("torch==")]
    if locked_torch:  # torch's own hashes: nothing else installs it
        assert locked_torch[0].startswith("torch==2.13.0")
        assert len(log) == 1, log
    else:  # a lock made without the torch index: the pinned version from it, said so
        assert log[1:] == [
            "python -m pip install --no-input --progress-bar off --no-deps "
            "--index-url https://download.pytorch.org/whl/cpu torch==2.13.0"
        ]
        assert "WARNING: the lock has no torch" in done.stderr


def test_torch_from_pypi_brings_its_cuda_libraries_when_the_lock_has_none(
    tmp_path: Path,
) -> None:
    """PyPI's torch is the CUDA build: unlike the CPU index's, it needs its nvidia-*
    and triton packages, which a lock without torch does not hold either."""
    if any(line.startswith("torch==") for line in _lock_lines()):
        pytest.skip("the lock pins torch: nothing is installed unchecked")
    path = tmp_path / "bootstrap.sh"
    path.write_text(render({**WORKER_VARS, "torch_index_url": ""}))
    done = run_sourced(path, "install_torch", tmp_path, _fake_venv(tmp_path))
    assert done.returncode == 0, done.stderr
    assert calls(tmp_path)[1:] == [
        "python -m pip install --no-input --progress-bar off torch==2.13.0"
    ]
    assert "torch 2.13.0 and its CUDA libraries from PyPI, not hash-checked" in done.stderr


def test_spotring_is_its_hash_checked_wheel_without_dependencies(
    script: Path, tmp_path: Path
) -> None:
    done = run_sourced(script, "install_spotring", tmp_path, _fake_venv(tmp_path))
    assert done.returncode == 0, done.stderr
    (install,) = calls(tmp_path)
    assert install.endswith(f"--require-hashes --no-deps {WORKER_VARS['spotring_package']}"), (
        install
    )


def test_install_stops_on_a_python_the_lock_does_not_cover(script: Path, tmp_path: Path) -> None:
    done = run_sourced(script, "install_torch", tmp_path, _fake_venv(tmp_path, "3.9"))
    assert done.returncode != 0 and "not 3.9" in done.stderr, done.stderr
    assert calls(tmp_path) == []


STEPS = [
    "authorize_keys",
    "install_system_packages",
    "create_venv",
    "install_torch",
    "install_spotring",  # first: Horovod's source build applies a patch it ships
    "install_horovod",
    "expose_venv",
    "verify",
    "run_job_setup",
]


def _stub_steps(fail: str | None = None) -> str:
    lines = [f'{step}() {{ echo {step} >>"$CALLS"; }}' for step in STEPS]
    if fail:
        lines.append(f'{fail}() {{ echo {fail} >>"$CALLS"; return 3; }}')
    lines.append('complete_lifecycle() { echo "complete_lifecycle $1" >>"$CALLS"; }')
    return "\n".join(lines)


def test_main_runs_the_steps_in_order_and_continues_the_hook(script: Path, tmp_path: Path) -> None:
    done = run_sourced(script, _stub_steps() + "\nmain", tmp_path)
    assert done.returncode == 0, done.stderr
    assert calls(tmp_path) == [*STEPS, "complete_lifecycle CONTINUE"]
    assert (tmp_path / "state" / "bootstrap-done").exists()
    assert "done" in (tmp_path / "bootstrap.log").read_text()


def test_failed_step_abandons_the_hook_and_exits_non_zero(script: Path, tmp_path: Path) -> None:
    done = run_sourced(script, _stub_steps(fail="install_horovod") + "\nmain", tmp_path)
    assert done.returncode == 3
    log = calls(tmp_path)
    assert log == [*STEPS[: STEPS.index("install_horovod") + 1], "complete_lifecycle ABANDON"]
    assert not (tmp_path / "state" / "bootstrap-done").exists()


FAKE_CURL = r"""
printf 'curl %s\n' "$*" >>"$CALLS"
case "$*" in
  *"-X PUT"*/latest/api/token*) printf 'TOKEN123' ;;
  *"X-aws-ec2-metadata-token: TOKEN123"*/latest/meta-data/instance-id*) printf 'i-0abc' ;;
  *) exit 22 ;;
esac
"""


def test_complete_lifecycle_uses_imdsv2_and_names_group_and_hook(
    script: Path, tmp_path: Path
) -> None:
    _executable(tmp_path / "bin" / "curl", FAKE_CURL)
    _executable(
        tmp_path / "venv" / "bin" / "python",
        'echo "boto3 $RESULT $INSTANCE_ID $AWS_REGION $GROUP_NAME $HOOK_NAME" >>"$CALLS"\n'
        "cat >/dev/null\n",
    )
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    done = run_sourced(script, "complete_lifecycle CONTINUE", tmp_path, env)
    assert done.returncode == 0, done.stderr
    log = calls(tmp_path)
    assert log[-1] == "boto3 CONTINUE i-0abc us-east-1 spot-train spot-train-bootstrap"
    assert "-X PUT" in log[0]


def test_driver_has_no_hook_to_complete(tmp_path: Path) -> None:
    path = tmp_path / "bootstrap.sh"
    path.write_text(render(DRIVER_VARS))
    done = run_sourced(path, "complete_lifecycle CONTINUE", tmp_path)
    assert done.returncode == 0, done.stderr
    assert calls(tmp_path) == []


def test_authorize_keys_appends_each_key_once(script: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    (home / ".ssh").mkdir(mode=0o700)
    (home / ".ssh" / "authorized_keys").write_text("ssh-ed25519 AAAAexisting me@host\n")
    commands = (
        f"SSH_USER={shlex.quote(user)}\n"
        f"getent() {{ echo '{user}:x:0:0::{home}:/bin/bash'; }}\n"
        "authorize_keys\nauthorize_keys\n"
    )
    done = run_sourced(script, commands, tmp_path)
    assert done.returncode == 0, done.stderr
    keys = (home / ".ssh" / "authorized_keys").read_text().splitlines()
    assert keys == [
        "ssh-ed25519 AAAAexisting me@host",
        *WORKER_VARS["ssh_authorized_keys"].split("\n"),
    ]
    assert stat.S_IMODE((home / ".ssh" / "authorized_keys").stat().st_mode) == 0o600


def test_expose_venv_prepends_the_venv_to_path_once(script: Path, tmp_path: Path) -> None:
    env_file = tmp_path / "environment"
    env_file.write_text('PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"\n')
    done = run_sourced(script, "expose_venv\nexpose_venv", tmp_path)
    assert done.returncode == 0, done.stderr
    venv = tmp_path / "venv"
    assert env_file.read_text() == (
        f'PATH="{venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"\n'
    )


def test_job_setup_runs_as_the_user_with_the_venv_on_path(script: Path, tmp_path: Path) -> None:
    home = tmp_path / "userhome"
    home.mkdir()
    # sudo -u USER -H CMD...: the stand-in records the user and runs CMD with that HOME.
    commands = (
        f'sudo() {{ echo "sudo $1 $2 $3" >>"$CALLS"; shift 3; HOME={home} "$@"; }}\nrun_job_setup\n'
    )
    done = run_sourced(script, commands, tmp_path)
    assert done.returncode == 0, done.stderr
    assert calls(tmp_path) == ["sudo -u ubuntu -H"]
    # The commands reach bash verbatim (no Terraform or outer-shell expansion).
    assert (home / "job" / "where").read_text() == f"{home}\n"


def test_job_setup_output_stays_in_the_root_only_log(tmp_path: Path) -> None:
    """The bootstrap's own output is copied to the console, which the cloud keeps (EC2
    console output, GCP serial port, Azure boot diagnostics): what the job's setup
    commands print goes to the log file only."""
    path = tmp_path / "bootstrap.sh"
    setup = 'echo "token=S3CR3T"\necho "fetch failed: S3CR3T" >&2'
    path.write_text(render({**WORKER_VARS, "job_setup_commands": setup}))
    done = run_sourced(path, 'sudo() { shift 3; "$@"; }\nrun_job_setup', tmp_path)
    assert done.returncode == 0, done.stderr
    assert "S3CR3T" not in done.stdout + done.stderr
    log = (tmp_path / "bootstrap.log").read_text()
    assert "token=S3CR3T" in log and "fetch failed: S3CR3T" in log


def test_empty_job_setup_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "bootstrap.sh"
    path.write_text(render({**WORKER_VARS, "job_setup_commands": ""}))
    done = run_sourced(path, 'sudo() { shift 3; "$@"; }\nrun_job_setup', tmp_path)
    assert done.returncode == 0, done.stderr


def test_failing_job_setup_fails_the_bootstrap(tmp_path: Path) -> None:
    path = tmp_path / "bootstrap.sh"
    path.write_text(render({**WORKER_VARS, "job_setup_commands": "false\ntouch reached"}))
    done = run_sourced(path, 'sudo() { shift 3; "$@"; }\nrun_job_setup', tmp_path)
    assert done.returncode != 0
    assert not (tmp_path / "reached").exists()


def test_a_ring_that_failed_to_form_is_joined_again() -> None:
    from spotring.worker_image.ring_formation import retry_failed_formation

    calls: list[str] = []
    answers = iter([ValueError("Horovod initialization failed. Please check log messages"), 7])

    def init() -> int:
        calls.append("init")
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    init_until_formed = retry_failed_formation(init, lambda: calls.append("shutdown"))
    assert init_until_formed() == 7
    assert calls == ["init", "shutdown", "init"]


def test_other_init_errors_and_repeated_failures_are_raised() -> None:
    from spotring.worker_image.ring_formation import retry_failed_formation

    def misconfigured() -> None:
        raise ValueError("Horovod has not been built with Gloo support")

    with pytest.raises(ValueError, match="Gloo support"):
        retry_failed_formation(misconfigured, lambda: None)()

    shutdowns: list[int] = []

    def never_forms() -> None:
        raise ValueError("Horovod initialization failed.")

    with pytest.raises(ValueError, match="initialization failed"):
        retry_failed_formation(never_forms, lambda: shutdowns.append(1), attempts=3)()
    assert len(shutdowns) == 2
