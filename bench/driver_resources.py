"""The driver's resources with many workers: RSS, threads, fds and idle CPU.

A driver process (a subprocess of this one, measured from outside with psutil) starts
N workers through :class:`~spotring.driver.launcher.ProcessLauncher`, each on a thread
of its own that waits in the launcher's ``__call__`` as Horovod's elastic driver calls
it (one thread per slot: that one is Horovod's). The worker is a stub, not Python: a
bash script that reads its JSON line, then prints a line a second until its stdin
closes (so 1,024 of them fit a 2-core machine). Layout: 8 slots per host, N / 8 hosts.

- ``local``: the supervisor's command replaced by the stub (``python=`` the stub).
- ``ssh``: a fake ``ssh`` on PATH (:data:`FAKE_SSH`) that runs the remote command on
  this machine and logs each connection it opens and each session it multiplexes over
  a host's master; its log gives "ssh connections".

Each is measured with spotring's launcher and, side by side, with the launcher as it
was before the shared pump and ssh multiplexing (``driver/launcher.py`` of
:data:`BASELINE`, loaded from git): RSS, threads and fds once every worker has printed
its first line, then the driver's CPU over a window while the workers print ("idle":
nothing but their output to relay).

    python -m bench.driver_resources [--quick] [--sizes 256,1024] [--window 10]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import REPO, Row, format_table, row

BENCHMARK = "driver resources"
BASELINE = "65d83e0"
"""The commit whose ``driver/launcher.py`` is the anchor: a reader thread per worker, a
watch loop per worker polling its exit every 50 ms, an ssh connection per worker."""
SIZES = (256, 1024)
SLOTS_PER_HOST = 8
WINDOW_S = 10.0
TARGET_RSS_MIB = "<= 1024"
TARGET_CPU = "< 5"

FAKE_SSH = r"""#!/bin/sh
# A stand-in for OpenSSH's client (spotring bench/driver_resources.py): runs the remote
# command on this machine in a session of its own, as sshd would, fed through a pipe
# that closes when this client ends. It logs to $FAKE_SSH_LOG a line per connection it
# opens ("connect HOST"), per session carried by a host's master ("mux HOST") and per
# master closed ("exit HOST"). A master is a background process whose pid the file at
# ControlPath (the control socket's stand-in) holds. With FAKE_SSH_EXEC set, it becomes
# the remote command itself (one process per worker, for the bench).
path= master=no persist= op= none=
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
    case $1 in
        -o) shift
            case $1 in
                ControlPath=*) path=${1#ControlPath=} ;;
                ControlMaster=*) master=${1#ControlMaster=} ;;
                ControlPersist=*) persist=${1#ControlPersist=} ;;
            esac ;;
        -O) shift; op=$1 ;;
        -N) none=1 ;;
        -p|-i) shift ;;
    esac
    shift
done
shift; host=$1; shift
log=${FAKE_SSH_LOG:-/dev/null}
if [ "$op" = exit ]; then
    [ -f "$path" ] || exit 255
    kill "$(cat "$path")" 2>/dev/null; rm -f "$path"
    echo "exit $host" >> "$log"
    exit 0
fi
if [ -n "$path" ] && [ "$master" != yes ] && [ "$master" != no ] && [ -f "$path" ]; then
    echo "mux $host" >> "$log"
else
    echo "connect $host" >> "$log"
    if [ -n "$path" ] && [ "$master" != no ] && [ -n "$persist" ]; then
        setsid sleep 3600 </dev/null >/dev/null 2>&1 &
        echo $! > "$path"
    fi
fi
[ -n "$none" ] && exit 0
[ -n "$FAKE_SSH_EXEC" ] && exec sh -c "$1"
cat | setsid sh -c "$1"
"""

STUB = r"""#!/bin/bash
# A stub worker (spotring bench/driver_resources.py): takes its JSON line, then prints a
# line a second until its stdin closes (read -t: no process forked per line).
read -r spec
n=0
while :; do
    echo "step $n"
    n=$((n + 1))
    read -r -t 1 line
    [ $? -gt 128 ] || exit 0
done
"""


def install_fake_ssh(directory: Path) -> Path:
    """Write :data:`FAKE_SSH` as ``directory/ssh``; put ``directory`` first on PATH to use it."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "ssh"
    script.write_text(FAKE_SSH)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


# -------------------------------------------------------------- the driver process


class _CountingOutput:
    """The launcher's output: counts the lines instead of printing them."""

    def __init__(self) -> None:
        self.lines = 0

    def write(self, text: str) -> int:
        self.lines += text.count("\n")
        return len(text)

    def flush(self) -> None:
        pass


def _baseline_module(directory: Path) -> Any:
    """``driver/launcher.py`` as it was at :data:`BASELINE`, imported under a name of its
    own (it imports the rest of spotring as it is now; those parts it uses are the same)."""
    import importlib.util

    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{BASELINE}:driver/launcher.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = directory / "launcher_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("spotring.driver.launcher_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def drive(version: str, kind: str, workers: int, window: float) -> dict[str, Any]:
    """In the driver process: start ``workers`` stub workers through ``version``'s
    launcher (``spotring`` or ``baseline``) of ``kind`` (``local`` or ``ssh``), measure,
    stop them. Returns the figures."""
    import psutil

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    scratch = Path(tempfile.mkdtemp(prefix="spotring-bench-driver-"))
    stub = scratch / "stub"
    stub.write_text(STUB)
    stub.chmod(0o755)
    log = scratch / "ssh.log"
    if kind == "ssh":
        install_fake_ssh(scratch / "bin")
        os.environ["PATH"] = f"{scratch / 'bin'}{os.pathsep}{os.environ['PATH']}"
        os.environ.update(FAKE_SSH_LOG=str(log), FAKE_SSH_EXEC="1")
    if version == "baseline":
        module = _baseline_module(scratch)
    else:
        from spotring.driver import launcher as module

    output = _CountingOutput()
    launcher = module.ProcessLauncher(
        remote=kind == "ssh",
        ssh=module.SshOptions(host_key_checking="no"),
        python=str(stub),
        output=output,
    )
    shutdown = threading.Event()  # Horovod's: one for the job, one per host
    hosts = [f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}" for i in range(1, workers + 1)]
    hosts = hosts[: max(1, workers // SLOTS_PER_HOST)]
    host_events = {host: threading.Event() for host in hosts}
    env = {"PATH": os.environ["PATH"]}
    codes: list[int] = []

    def run(rank: int) -> None:
        host = hosts[rank // SLOTS_PER_HOST]
        spec = module.WorkerSpec(host, rank % SLOTS_PER_HOST, rank, ("stub",), env)
        codes.append(launcher(spec, [shutdown, host_events[host]])[0])

    me = psutil.Process()
    began = time.monotonic()
    threads = [threading.Thread(target=run, args=(rank,), daemon=True) for rank in range(workers)]
    for thread in threads:
        thread.start()
    deadline = began + 600
    while output.lines < workers and time.monotonic() < deadline:
        time.sleep(0.1)
    if output.lines < workers:
        raise RuntimeError(f"only {output.lines} of {workers} workers printed in 600 s")
    started_s = time.monotonic() - began
    time.sleep(2.0)  # every worker past its start
    rss = me.memory_info().rss
    figures: dict[str, Any] = {
        "started_s": started_s,
        "rss_mib": rss / (1 << 20),
        "threads": me.num_threads(),
        "fds": me.num_fds(),
        "children": len(me.children(recursive=True)),
    }
    cpu0, wall0, lines0 = sum(me.cpu_times()[:2]), time.monotonic(), output.lines
    time.sleep(window)
    cpu1, wall1, lines1 = sum(me.cpu_times()[:2]), time.monotonic(), output.lines
    figures["cpu_percent"] = 100.0 * (cpu1 - cpu0) / (wall1 - wall0)
    figures["lines_per_s"] = (lines1 - lines0) / (wall1 - wall0)
    stopping = time.monotonic()
    shutdown.set()
    for thread in threads:
        thread.join(timeout=120)
    figures["stopped_s"] = time.monotonic() - stopping
    figures["stopped"] = len(codes)
    launcher.close()
    if kind == "ssh":
        said = log.read_text().split() if log.exists() else []
        figures["ssh_connections"] = said[0::2].count("connect")
        figures["ssh_sessions_multiplexed"] = said[0::2].count("mux")
    shutil.rmtree(scratch, ignore_errors=True)
    return figures


# ------------------------------------------------------------------- the benchmark


def _run_driver(version: str, kind: str, workers: int, window: float) -> dict[str, Any]:
    command = [
        sys.executable, "-m", "bench.driver_resources", "--driver", version,
        "--launcher", kind, "--workers", str(workers), "--window", str(window),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1200)
    if result.returncode != 0:
        raise RuntimeError(f"{version} {kind} x{workers}: {result.stderr.strip()[-2000:]}")
    figures: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return figures


def measure(quick: bool, sizes: tuple[int, ...] = SIZES, window: float | None = None) -> list[Row]:
    """Both launchers at each size, spotring's beside the baseline's."""
    window = window if window is not None else (5.0 if quick else WINDOW_S)
    rows: list[Row] = []
    anchor = f"launcher at {BASELINE}"
    for kind in ("local", "ssh"):
        for workers in sizes:
            ours = _run_driver("spotring", kind, workers, window)
            print(f"   {kind} x{workers}: spotring {ours}", flush=True)
            theirs = _run_driver("baseline", kind, workers, window)
            print(f"   {kind} x{workers}: baseline {theirs}", flush=True)
            name = f"driver, {kind} launcher, {workers} workers"
            big = workers >= 1024
            extra = {"spotring": ours, "baseline": theirs, "window_s": window}
            rows += [
                row(name, "RSS MiB", ours["rss_mib"], anchor, theirs["rss_mib"],
                    TARGET_RSS_MIB if big else "", extra),
                row(name, "CPU % of a core, workers printing", ours["cpu_percent"], anchor,
                    theirs["cpu_percent"], TARGET_CPU if big else "", {}),
                row(name, "threads", ours["threads"], anchor, theirs["threads"], "", {}),
                row(name, "fds", ours["fds"], anchor, theirs["fds"], "", {}),
                row(name, "s until every worker printed", ours["started_s"], anchor,
                    theirs["started_s"], "", {}),
                row(name, "lines relayed per s", ours["lines_per_s"], anchor,
                    theirs["lines_per_s"], f">= {0.95 * workers:g}", {}),
            ]  # fmt: skip
            if kind == "ssh":
                rows.append(
                    row(name, "ssh connections", ours["ssh_connections"], anchor,
                        theirs["ssh_connections"], "", {})
                )  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.driver_resources")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--window", type=float, default=None)
    parser.add_argument("--driver", choices=("spotring", "baseline"), help=argparse.SUPPRESS)
    parser.add_argument("--launcher", choices=("local", "ssh"), default="local")
    parser.add_argument("--workers", type=int, default=256)
    args = parser.parse_args()
    if args.driver:  # the driver process itself
        figures = drive(args.driver, args.launcher, args.workers, args.window or WINDOW_S)
        print(json.dumps(figures), flush=True)
        os._exit(0)  # its threads are daemons; nothing else to wait for
    sizes = tuple(int(s) for s in args.sizes.split(","))
    print(format_table(measure(args.quick, sizes, args.window)))


if __name__ == "__main__":
    main()
