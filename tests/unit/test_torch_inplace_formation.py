"""The in-place mode's group formation in one process: a formation that failed (a member
lost while the group formed) leaves nothing behind that sets the next one apart.

Run in a child process: a formation sets the default process group and the Gloo
environment of the process it runs in.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]

FORM_THREE_TIMES = """
import json, threading
import torch.distributed as dist
from spotring.torch import inplace
from spotring.torch.coordinator import Membership


class RecordingStore(dist.Store):
    \"\"\"A real HashStore that records the keys set, or fails each set (the member's
    store answered 410: someone was lost while the group formed).\"\"\"

    def __init__(self, fail):
        super().__init__()
        self.inner, self.keys, self.fail = dist.HashStore(), [], fail

    def set(self, key, value):
        if self.fail:
            raise RuntimeError("generation given up while forming")
        self.keys.append(key)
        self.inner.set(key, value)

    def get(self, key):
        return self.inner.get(key)

    def wait(self, keys, timeout=None):
        self.inner.wait(keys)

    def check(self, keys):
        return self.inner.check(keys)

    def add(self, key, value):
        return self.inner.add(key, value)

    def has_extended_api(self):
        return True

    def multi_get(self, keys):
        return self.inner.multi_get(keys)

    def multi_set(self, keys, values):
        self.inner.multi_set(keys, values)


class Watch:
    def __init__(self):
        self.closed = threading.Event()

    def wait(self):
        self.closed.wait()
        return False

    def close(self):
        self.closed.set()


class OneStoreCoordinator:
    def __init__(self, store):
        self.store = store

    def watch(self, generation):
        return Watch()

    def group_store(self, membership):
        return self.store


formed = []
alone = Membership(0, 0, 1, "127.0.0.1", 1)
for fail in (False, True, False):
    store = RecordingStore(fail)
    try:
        group = inplace.ProcessGroup(alone, OneStoreCoordinator(store))
    except RuntimeError:
        continue
    formed.append(store.keys)
    group.close()
print(json.dumps(formed))
"""


def test_a_failed_formation_leaves_the_next_groups_keys_named_as_a_fresh_members() -> None:
    out = subprocess.run(
        [sys.executable, "-c", FORM_THREE_TIMES],
        capture_output=True, text=True, cwd=REPO, check=True, timeout=120,
    )  # fmt: skip
    fresh, after_a_failure = json.loads(out.stdout.splitlines()[-1])
    # A joiner that never failed names its keys as ``fresh``: a survivor whose last
    # formation failed must too, or each waits for keys the other never writes.
    assert fresh and after_a_failure == fresh
