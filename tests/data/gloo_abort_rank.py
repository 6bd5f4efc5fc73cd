"""One rank of the two-rank Horovod ring of tests/e2e/test_gloo_abort.py.

Both ranks form the ring and allreduce once. Rank 1 then stops itself (SIGSTOP): alive,
its sockets open, it never answers, so rank 0's background loop waits in a Gloo receive
that no failing socket will end. Rank 0, told to go on its stdin, allreduces and, half a
second later on another thread, calls spotring's Gloo abort (unless ``--no-abort``;
``--abort-after S`` waits S seconds instead); it prints how its allreduce ended and
the CPU time its main thread spent meanwhile.
"""

import os
import signal
import sys
import threading
import time

import horovod.torch as hvd
import torch

from spotring.worker_image import horovod_internals
from spotring.worker_image.peer_abort import sign_store_writes, take_job_key

sign_store_writes(take_job_key())  # as spotring's sitecustomize does in its workers
hvd.init()
hvd.allreduce(torch.ones(1), name="formed")
print("ready", flush=True)
if hvd.rank() == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(600)
    sys.exit(0)

sys.stdin.readline()
abort_after = 0.5
if "--abort-after" in sys.argv:
    abort_after = float(sys.argv[sys.argv.index("--abort-after") + 1])
if "--no-abort" not in sys.argv:
    threading.Timer(abort_after, horovod_internals.abort_collectives).start()
start = time.monotonic()
start_cpu = time.thread_time()
try:
    hvd.allreduce(torch.ones(1), name="stuck")
    print("completed", flush=True)
except hvd.HorovodInternalError:
    cpu = time.thread_time() - start_cpu
    print(f"failed after {time.monotonic() - start:.2f} s, {cpu:.3f} s of CPU", flush=True)
os._exit(0)  # not hvd.shutdown: its background loop has already ended
