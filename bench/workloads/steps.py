"""A training loop for the recovery benchmark: one JSON line per completed step.

Rank 0 appends ``{"t", "step", "size", "event"}`` to ``--log`` after every optimizer
step ("step"), after every commit ("commit", every ``--commit-every`` steps) and when
training (re)starts ("resume"). At each (re)start every rank appends a "member" line
with its rank and pid: which processes form the ring (a worker started ahead and
waiting for its slot is not one).
``--state spotring`` uses spotring's TorchState; ``--state horovod`` uses
``hvd.elastic.TorchState`` (the anchor's, and a spotring row of its own: the fast
abort does not depend on the state class). ``--tensor-mb`` adds a large allreduce to
every step. Runs until the benchmark stops the job.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import horovod.torch as hvd
import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--step-log", required=True)
    parser.add_argument("--state", choices=["spotring", "horovod"], default="spotring")
    parser.add_argument("--step-seconds", type=float, default=0.05)
    parser.add_argument("--commit-every", type=int, default=1, help="steps between commits")
    parser.add_argument(
        "--tensor-mb", type=float, default=0.0,
        help="also allreduce a tensor of this many MiB every step (a kill then often "
        "lands mid-message)",
    )  # fmt: skip
    args = parser.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    )
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
        named_parameters=model.named_parameters(),
    )
    if args.state == "spotring":
        from spotring.driver.state import TorchState
    else:
        TorchState = hvd.elastic.TorchState
    state = TorchState(model, optimizer, step=0)
    big = torch.ones(int(args.tensor_mb * 2**20) // 4) if args.tensor_mb > 0 else None

    def log(event: str) -> None:
        if hvd.rank() == 0:
            record = {"t": time.time(), "event": event, "step": state.step, "size": hvd.size()}
            with open(args.step_log, "a") as stream:
                stream.write(json.dumps(record) + "\n")

    def log_member() -> None:
        record = {"t": time.time(), "event": "member", "step": state.step, "size": hvd.size(),
                  "rank": hvd.rank(), "pid": os.getpid()}  # fmt: skip
        with open(args.step_log, "a") as stream:  # one short append: never interleaved
            stream.write(json.dumps(record) + "\n")

    @hvd.elastic.run
    def train(state) -> None:  # type: ignore[no-untyped-def]
        log("resume")
        log_member()
        while True:  # the benchmark ends the job from outside
            optimizer.zero_grad()
            model(torch.randn(32, 512)).square().mean().backward()
            optimizer.step()
            if big is not None:
                hvd.allreduce(big, name="big")
            state.step += 1
            log("step")
            time.sleep(args.step_seconds)
            if state.step % args.commit_every == 0:
                state.commit()
                log("commit")

    train(state)


if __name__ == "__main__":
    main()
