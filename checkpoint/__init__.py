"""Durable checkpoints in a directory or a cloud object store (S3, GCS, Azure Blob).

    store = open_store("s3://bucket/jobs/run-7")          # checks the URI, no network
    with JobLock(store, job_id="run-7", owner=default_owner()):
        checkpoints = Checkpoints(store, job_id="run-7", keep=3)
        checkpoints.write(step, payload, {"epoch": 3})
        found = checkpoints.load_latest()                 # (info, payload) or None

Imports only ``spotring.core`` and itself: the workers and the driver both use it.
"""

from spotring.checkpoint.checkpoints import Checkpoints
from spotring.checkpoint.errors import (
    CheckpointError,
    CheckpointLockError,
    ObjectCorruptError,
    ObjectNotFoundError,
)
from spotring.checkpoint.lock import LOCK_KEY, JobLock, default_owner
from spotring.checkpoint.manifest import CheckpointInfo
from spotring.checkpoint.store import ObjectStore
from spotring.checkpoint.uri import open_store

__all__ = [
    "LOCK_KEY",
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointLockError",
    "Checkpoints",
    "JobLock",
    "ObjectCorruptError",
    "ObjectNotFoundError",
    "ObjectStore",
    "default_owner",
    "open_store",
]
