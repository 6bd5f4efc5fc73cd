"""The in-place driver at the end of the training: a worker that joins just as the last
member ends must not hold the job (or fail it) waiting for a group that never forms.

Real workers (the real :func:`spotring.torch.inplace.run` and coordinator client) on
this machine, behind a controller whose inventory the test grows.
"""

from __future__ import annotations

import io
import sys
import threading
import time
from pathlib import Path

import pytest

from spotring.core.job import JobShape
from spotring.driver.launcher import ProcessLauncher
from spotring.driver.options import ElasticOptions
from spotring.driver.ring_events import NoRingEvents
from spotring.driver.torch_inplace import TorchInplaceDriver
from spotring.worker_image import wire
from tests.unit.quiet_controller import QuietController

pytest.importorskip("torch")

# w0 trains alone; its training ends once the driver has published the next
# generation (the joiner w1's), before it moves over: as when the last step's commit
# comes just before the publication. w1 never trains: the group with w0 never forms.
LAST_STEP_AS_A_JOINER_COMES = f"""
import os, sys, time
from spotring.torch import inplace
from spotring.torch.driver_coordinator import coordinator_from_env

coordinator = coordinator_from_env()
state = inplace.TorchState(batch=0)

@inplace.run(coordinator)
def train(state):
    if os.environ[{wire.TORCH_WORKER_ENV!r}] != "w0":
        sys.exit(3)
    while coordinator.latest() <= state.group.membership.generation:
        time.sleep(0.02)

train(state)
"""


def test_a_joiner_published_as_the_training_ends_is_stopped_and_the_job_succeeds(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text(LAST_STEP_AS_A_JOINER_COMES)
    controller = QuietController({"host-0": 1})
    output = io.StringIO()
    launcher = ProcessLauncher(remote=False, output=output)
    driver = TorchInplaceDriver(
        [sys.executable, str(script)], controller, launcher, JobShape(1, 1, 2),
        ElasticOptions(), NoRingEvents(), local=True,
    )  # fmt: skip

    def add_a_host_once_w0_trains() -> None:
        deadline = time.monotonic() + 60
        while not driver.world_sizes and time.monotonic() < deadline:
            time.sleep(0.02)
        controller.inventory.hosts["host-1"] = 1

    threading.Thread(target=add_a_host_once_w0_trains, daemon=True).start()
    started = time.monotonic()
    try:
        driver.run()  # without the abandonment: w1 exits 1 "at the end" after minutes
    finally:
        launcher.close()
    assert driver.world_sizes == [1, 2]
    assert controller.failed == []
    # w1 was stopped once w0 ended: no wait for a store's timeout.
    assert time.monotonic() - started < 30, output.getvalue()[-2000:]
