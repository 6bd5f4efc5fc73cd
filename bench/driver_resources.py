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

import stat
from pathlib import Path

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
