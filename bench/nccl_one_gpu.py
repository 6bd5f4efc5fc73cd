"""What one GPU can show of the in-place mode on NCCL (#34): the script for a lent GPU.

    python -m bench.nccl_one_gpu [--cycles 50] [--megabytes 512]   # CUDA and NCCL
    python -m bench.nccl_one_gpu --cpu [--cycles 5]                 # Gloo on the CPU

Two NCCL ranks cannot share one GPU, so a ring of several is not measured here. On one
GPU, in one process:

1. **abort and re-form**: a one-rank NCCL group is formed (``device_id``: its
   communicator made at once), used (an ``all_reduce``), aborted
   (``_abort_process_group``: ``ncclCommAbort``, what the in-place mode calls where
   Gloo's sockets are shut today) and formed again, ``--cycles`` times. Seconds per
   formation and per abort (medians), and the device's free memory
   (``torch.cuda.mem_get_info``, NCCL's own buffers included) after the first cycle
   and after the last: flat, or every re-formation leaks;
2. **commit**: ``inplace.TorchState.save()`` of a model and its SGD momentum on the GPU
   (committed to pinned host memory, ``offload="auto"``) against the floor, one raw
   device-to-host copy of as many bytes into pinned memory (medians);
3. **restore**: the live tensors changed after a commit, then restored: bit for bit
   the commit.

``--cpu`` runs the same on Gloo and the CPU (the memory figure is then the process's
resident set): the script's own check, run by the tests; its figures say nothing of
NCCL. Writes bench/results/nccl_one_gpu.json (or ``--output``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import psutil
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from bench.common import RESULTS, Row, format_extras, format_table, row, write_json
from spotring.torch import inplace

MIB = 1 << 20
LEAK_TARGET = "<= 64"
"""MiB of device memory a run of re-formations may leave taken (the caching
allocator's and NCCL's rounding): a leak of NCCL's buffers grows by tens of MiB a cycle."""


def measure(cycles: int, megabytes: int, cpu: bool) -> list[Row]:
    """The rows (see the module)."""
    device = torch.device("cpu" if cpu else "cuda:0")
    backend = "gloo" if cpu else "nccl"
    name = f"one-rank {backend} group, {device}"
    forms, aborts, free = _reform(cycles, backend, device)
    commit_s, copy_s, equal = _commit(megabytes, device)
    taken_mib = (free[0] - free[1]) / MIB
    setup = {
        "cycles": cycles,
        "torch": torch.__version__,
        "device": "cpu" if cpu else torch.cuda.get_device_name(device),
        "free MiB after the first cycle, the last": [round(f / MIB) for f in free],
    }
    return [
        row(name, "s per formation (median)", statistics.median(forms), "s per abort",
            statistics.median(aborts), "", setup),
        row(name, f"MiB taken over {cycles} re-formations", taken_mib, "", 0, LEAK_TARGET),
        row(f"commit {megabytes} MB on {device}", "s per TorchState.save() (median)", commit_s,
            "raw copy into pinned host memory", copy_s, ""),
        row(f"commit {megabytes} MB on {device}", "restored bit for bit (1 = yes)",
            float(equal), "", 0, "== 1"),
    ]  # fmt: skip


def _reform(
    cycles: int, backend: str, device: torch.device
) -> tuple[list[float], list[float], tuple[int, int]]:
    """Seconds per formation and per abort, and free memory after the first and the
    last cycle."""
    forms, aborts, free = [], [], []
    for _ in range(cycles):
        start = time.perf_counter()
        dist.init_process_group(
            backend, store=dist.HashStore(), rank=0, world_size=1,
            timeout=timedelta(seconds=60), device_id=device if device.type == "cuda" else None,
        )  # fmt: skip
        tensor = torch.ones(1024, device=device)
        dist.all_reduce(tensor)
        _synchronize(device)
        forms.append(time.perf_counter() - start)
        start = time.perf_counter()
        distributed_c10d._abort_process_group()  # ncclCommAbort on NCCL
        aborts.append(time.perf_counter() - start)
        free.append(_free_memory(device))
    return forms, aborts, (free[0], free[-1])


def _commit(megabytes: int, device: torch.device) -> tuple[float, float, bool]:
    """Median seconds of a commit and of the raw copy; whether a restore is exact."""
    width = 1024
    layers = max(1, megabytes * MIB // (2 * 4 * width * width))  # weights and momentum
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model(torch.randn(8, width, device=device)).sum().backward()
    optimizer.step()  # its momentum buffers exist
    state = inplace.TorchState(model, optimizer)
    tensors = list(model.parameters()) + [optimizer.state[p]["momentum_buffer"]
                                          for p in model.parameters()]  # fmt: skip
    total = sum(t.numel() for t in tensors)
    source = torch.empty(total, device=device)
    host = torch.empty(total, pin_memory=device.type == "cuda")
    commit = _median(lambda: state.save(), device)
    raw = _median(lambda: host.copy_(source, non_blocking=True), device)
    state.save()
    committed = [t.detach().clone() for t in tensors]
    with torch.no_grad():
        for t in tensors:
            t.add_(1.0)
    state.restore()
    equal = all(torch.equal(t, c) for t, c in zip(tensors, committed, strict=True))
    return commit, raw, equal


def _median(run: Callable[[], object], device: torch.device, rounds: int = 7) -> float:
    times = []
    for _ in range(rounds):
        _synchronize(device)
        start = time.perf_counter()
        run()
        _synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free_memory(device: torch.device) -> int:
    """Free bytes of ``device``; on the CPU, the negated resident set (a leak shows alike)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return -int(psutil.Process().memory_info().rss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--megabytes", type=int, default=512, help="model and momentum")
    parser.add_argument("--cpu", action="store_true", help="Gloo on the CPU: the script's check")
    parser.add_argument("--output", type=Path, default=RESULTS / "nccl_one_gpu.json")
    args = parser.parse_args()
    if args.cycles < 2 or args.megabytes < 1:
        parser.error("--cycles must be at least 2 and --megabytes at least 1")
    if not args.cpu and not torch.cuda.is_available():
        parser.error("no CUDA device here: run it where a GPU is lent, or with --cpu")
    rows = measure(args.cycles, args.megabytes, args.cpu)
    print(format_table(rows))
    print(format_extras(rows))
    write_json(rows, args.output, [f"nccl_one_gpu: cycles {args.cycles}"], quick=args.cpu)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
