"""Commit cost of the elastic training state: spotring vs horovod's TorchState vs memcpy.

A model of about 28 M float32 parameters (Linear + LayerNorm blocks and a BatchNorm
for buffers) with SGD momentum, its momentum buffers created by one step. Each round
times, back to back and in the same process:

- raw memcpy: ``dst.copy_(src)`` of one preallocated flat tensor of the same total
  bytes (the floor any commit has to pay);
- ``horovod.torch.elastic.TorchState.save()`` (deep copies of both state_dicts);
- ``spotring.driver.state.TorchState.save()`` (copies into preallocated flat buffers);
- per-tensor buffers: the same copies into separately allocated buffers, to show what
  flattening buys (or not) on this machine.

Rounds interleave the variants so background load hits them alike; figures are
medians. Threads: torch's default intra-op thread count (what a training worker runs
with; ``SPOTRING_BENCH_THREADS`` overrides it) for every variant of the headline, then
memcpy and spotring once more on one thread, since these memory-bound copies scale
with threads and the ratio moves with them.

    python bench/commit.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch

BENCHMARK = "commit 28M params + momentum"


def _model() -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(26):
        layers += [torch.nn.Linear(1024, 1024), torch.nn.LayerNorm(1024)]
    layers += [torch.nn.BatchNorm1d(1024), torch.nn.Linear(1024, 640)]
    return torch.nn.Sequential(*layers)


def _medians(
    variants: dict[str, Callable[[], object]], rounds: int, budget_s: float
) -> tuple[dict[str, float], int]:
    """Interleaved rounds (background load hits every variant alike); median ms each."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    start = time.perf_counter()
    for _ in range(2):  # warm-up: first touches, allocator caches
        for fn in variants.values():
            fn()
    for done in range(rounds):
        if done >= 3 and time.perf_counter() - start > budget_s:
            break  # bounded even on a loaded machine
        for name, fn in variants.items():
            begin = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - begin) * 1e3)
    return {name: statistics.median(v) for name, v in times.items()}, len(times["raw memcpy"])


def measure(quick: bool = False) -> list[dict]:
    """Median ms per commit for each variant; rows ready for a results table."""
    import horovod.torch.elastic as hvd_elastic

    from spotring.driver.state import TorchState

    default_threads = torch.get_num_threads()
    threads = int(os.environ.get("SPOTRING_BENCH_THREADS", default_threads))
    torch.manual_seed(0)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model(torch.randn(8, 1024)).square().mean().backward()
    optimizer.step()  # creates the momentum buffers

    tensors = list(model.state_dict().values()) + [
        s["momentum_buffer"] for s in optimizer.state.values()
    ]
    params = sum(p.numel() for p in model.parameters())
    total_bytes = sum(t.numel() * t.element_size() for t in tensors)

    src = torch.rand(total_bytes // 4)
    dst = torch.empty_like(src)
    separate = [torch.empty_like(t) for t in tensors]
    ours = TorchState(model, optimizer)
    theirs = hvd_elastic.TorchState(model, optimizer)

    variants: dict[str, Callable[[], object]] = {
        "raw memcpy": lambda: dst.copy_(src),
        "horovod TorchState": theirs.save,
        "spotring TorchState": ours.save,
        "per-tensor buffers": lambda: torch._foreach_copy_(separate, tensors),
    }
    rounds = 5 if quick else 15
    budget_s = 6.0 if quick else 14.0  # per pass, warm-up included; >= 3 rounds
    try:
        torch.set_num_threads(threads)
        ms, done = _medians(variants, rounds, budget_s)
        # The same copies on one thread: memory-bound, so the floor moves with threads.
        torch.set_num_threads(1)
        single, _ = _medians(
            {k: variants[k] for k in ("raw memcpy", "spotring TorchState")}, rounds, budget_s / 2
        )
    finally:
        torch.set_num_threads(default_threads)

    extra = {
        "params": params,
        "bytes per commit": total_bytes,
        "tensors": len(tensors),
        "horovod TorchState ms": round(ms["horovod TorchState"], 2),
        "raw memcpy ms": round(ms["raw memcpy"], 2),
        "per-tensor buffers ms": round(ms["per-tensor buffers"], 2),
        "memcpy GB/s": round(total_bytes / ms["raw memcpy"] / 1e6, 2),
        "1 thread: raw memcpy ms": round(single["raw memcpy"], 2),
        "1 thread: spotring ms": round(single["spotring TorchState"], 2),
        "1 thread: ratio": round(single["spotring TorchState"] / single["raw memcpy"], 3),
        "rounds": done,
        "torch threads": threads,
        "torch": torch.__version__,
    }
    spot = ms["spotring TorchState"]
    return [
        {
            "benchmark": BENCHMARK,
            "metric": "ms per commit",
            "value": round(spot, 2),
            "anchor_name": "raw memcpy",
            "anchor_value": round(ms["raw memcpy"], 2),
            "ratio": round(spot / ms["raw memcpy"], 3),
            "target": "<= 1.2x",
            "extra": extra,
        },
        {
            "benchmark": BENCHMARK,
            "metric": "ms per commit",
            "value": round(spot, 2),
            "anchor_name": "horovod TorchState",
            "anchor_value": round(ms["horovod TorchState"], 2),
            "ratio": round(spot / ms["horovod TorchState"], 3),
            "target": "< 1x",
            "extra": extra,
        },
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    rows = measure(quick=parser.parse_args().quick)
    extra = rows[0]["extra"]
    print(
        f"{extra['params'] / 1e6:.1f} M params, {extra['bytes per commit'] / 1e6:.0f} MB per "
        f"commit in {extra['tensors']} tensors, {extra['torch threads']} torch thread(s), "
        f"median of {extra['rounds']} rounds"
    )
    print(f"{'variant':<22}{'ms':>9}")
    for name, value in (
        ("raw memcpy", extra["raw memcpy ms"]),
        ("spotring TorchState", rows[0]["value"]),
        ("per-tensor buffers", extra["per-tensor buffers ms"]),
        ("horovod TorchState", extra["horovod TorchState ms"]),
    ):
        print(f"{name:<22}{value:>9.2f}")
    print(
        f"1 thread: raw memcpy {extra['1 thread: raw memcpy ms']:.2f} ms, spotring "
        f"{extra['1 thread: spotring ms']:.2f} ms ({extra['1 thread: ratio']:.2f}x)"
    )
    for row in rows:
        print(f"spotring / {row['anchor_name']}: {row['ratio']:.2f}x (target {row['target']})")


if __name__ == "__main__":
    main()
