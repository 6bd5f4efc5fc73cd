"""Durable checkpoints in a directory or a cloud object store (S3, GCS, Azure Blob).

    store = open_store("s3://bucket/jobs/run-7")          # checks the URI, no network
    with JobLock(store, job_id="run-7") as lock:          # the driver
        checkpoints = Checkpoints(store, job_id="run-7", keep=3, fence=lock.fence)
        checkpoints.write(step, payload, {"epoch": 3})    # only while the lock says so
        found = checkpoints.load_latest()                 # (info, payload) or None

Imports only ``spotring.core`` and itself: the workers and the driver both use it.
"""

from spotring.checkpoint.checkpoints import Checkpoints
from spotring.checkpoint.errors import (
    CheckpointError,
    CheckpointLockError,
    CheckpointLockLost,
    ObjectCorruptError,
    ObjectNotFoundError,
    ObjectTooLargeError,
)
from spotring.checkpoint.lock import LOCK_KEY, Fence, JobLock, check_fence
from spotring.checkpoint.manifest import CheckpointInfo
from spotring.checkpoint.store import ObjectStore, Versioned
from spotring.checkpoint.uri import open_store

__all__ = [
    "LOCK_KEY",
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointLockError",
    "CheckpointLockLost",
    "Checkpoints",
    "Fence",
    "JobLock",
    "ObjectCorruptError",
    "ObjectNotFoundError",
    "ObjectStore",
    "ObjectTooLargeError",
    "Versioned",
    "check_fence",
    "open_store",
]
