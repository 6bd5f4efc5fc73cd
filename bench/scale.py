"""Ring formation at scale: the driver's CPU and wall time to form one ring of N ranks.

The real rendezvous servers, each in a subprocess of its own (so that only the server's
CPU is counted: ``getrusage`` of that process, all its threads), driven by simulated
ranks in this process (asyncio, one coroutine per rank) that send the exact HTTP
requests of Horovod's Gloo store, one TCP connection per request as Horovod's client
opens them, for every Gloo context a ring forms, in Horovod's order, each context
ending with its barrier (all ranks connected: simulated here by waiting for every
rank's exchange) and each rank's ``DELETE`` (``HTTPStore::Finalize``):

- spotring: ``RingTracker`` (driver/rendezvous/) with spotring's Horovod build
  (worker_image/horovod-rendezvous.patch): each rank reads the ring's generation
  (``GET /spotring/ring``), then per context of size k > 1 sends one
  ``PUT <scope>/spotring-mesh-<rank>`` (its host name and its k - 1 addresses of 136
  bytes), answered once every rank has sent its own, then ``DELETE``, each write
  signed under the job key (worker_image/wire.py) as the build signs it; a
  context of one rank sends nothing. The global process set uses the global contexts: three
  contexts per ring (global, local, cross).
- anchor: Horovod 0.28.1's own ``RendezvousServer`` with stock Horovod's pattern
  (third_party/gloo/gloo/rendezvous/context.cc ``connectFullMesh`` and
  horovod/common/gloo/http_store.cc): ``PUT rank_<r>``; ``GET rank_<i>`` for each
  i < r; ``PUT <r>`` ((k - 1) x 136 bytes); for each other rank i, ``GET <i>`` every
  10 ms until it is there, then ``GET <i>`` again; ``DELETE <r>``; six contexts per ring
  (global, local, cross and the global process set's three). A request whose
  connection fails is tried again after 500 ms, three tries in all, as
  ``HTTPStore::PerformHTTP`` does ("retried connections" counts them). Each anchor
  formation is given at most ``--cap`` seconds (60): past it, its partial counts are
  reported and larger rings are not tried.

The ring's layout: N hosts of one slot each (the global and the cross context both
span every rank; each local context is one rank). Bytes served are the bytes of the
answers (status line, headers, body) the ranks received.

Model check: a real ``spotring run --provider local -np 8`` job (8 workers on this
machine, warm start, the digits-free workload of bench/workloads/steps.py), whose
driver logs what its rendezvous server served for each ring; the Gloo requests of
the first ring are compared with the model's count for that ring's scopes.

    python -m bench.scale [--quick] [--sizes 16,64,256,1024] [--cap 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import REPO, Row, format_table, row
from spotring.worker_image import wire

BENCHMARK = "scale"
ENTRY = 136  # Gloo's TCP pair address: a sockaddr_storage and a sequence number
POLL_S = 0.010  # HTTPStore::wait
RETRY_S = 0.5  # HTTPStore::PerformHTTP
TRIES = 3
BENCH_KEY = bytes(range(32))
"""The job key the simulated ranks sign their writes with (spotring's server only)."""
SIZES = (16, 64, 256, 1024)
QUICK_SIZES = (16, 64, 256, 1024)
CAP_S = 60.0
TARGET_CPU = "<= 2"
TARGET_WALL = "<= 5"
BIN = Path(sys.executable).parent


# ------------------------------------------------------------------ the server process


def _raise_fd_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _plan(size: int) -> list[Any]:
    from horovod.runner.common.util.hosts import SlotInfo

    # hostname, rank, local_rank, cross_rank, size, local_size, cross_size
    return [SlotInfo(f"h{r}", r, 0, r, size, 1, size) for r in range(size)]


def serve(kind: str) -> None:
    """The server subprocess: ``init N`` plans a ring of N, ``usage`` prints the
    process's CPU seconds so far (and spotring's request counts)."""
    _raise_fd_limit()
    if kind == "spotring":
        from spotring.driver.rendezvous import RingTracker, rendezvous_handler

        class _Driver:  # the ranks ask nothing of it
            def record_ready(self, host: str, slot: int) -> None: ...

            def get_slot_info(self, host: str, slot: int) -> Any: ...

            def register_worker_server(self, *args: Any) -> None: ...

        tracker = RingTracker()
        port = tracker.start(rendezvous_handler(_Driver()), "127.0.0.1", job_key=BENCH_KEY)
        init = tracker.init
    else:
        from horovod.runner.http.http_server import RendezvousServer

        server = RendezvousServer()
        port = server.start()
        init = server.init
    print(port, flush=True)
    for line in sys.stdin:
        command, *args = line.split()
        if command == "init":
            init(_plan(int(args[0])))
            print("ok", flush=True)
        elif command == "usage":
            usage = resource.getrusage(resource.RUSAGE_SELF)
            cpu = {"user": usage.ru_utime, "sys": usage.ru_stime, "switches": usage.ru_nvcsw}
            print(json.dumps({"cpu": usage.ru_utime + usage.ru_stime, **cpu}), flush=True)


class ServerProcess:
    def __init__(self, kind: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.scale", "--serve", kind],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        assert self.process.stdout is not None
        self.port = int(self.process.stdout.readline())

    def ask(self, command: str) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().strip()

    def cpu(self) -> float:
        return float(json.loads(self.ask("usage"))["cpu"])

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


# ------------------------------------------------------------------ the simulated ranks


@dataclass
class Counts:
    requests: int = 0
    retried: int = 0
    bytes_served: int = 0
    failed: list[str] = field(default_factory=list)


class RankFailed(Exception):
    pass


async def _request(
    port: int, method: str, path: str, body: bytes, counts: Counts, ring: int | None = None
) -> tuple[int, bytes]:
    """One request on a connection of its own, tried three times 500 ms apart; signed
    for ``ring`` (as spotring's Horovod build signs its writes), each try afresh."""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {len(body)}\r\n"
    ).encode()
    for attempt in range(TRIES):
        counts.requests += 1
        signed = b""
        if ring is not None:
            signature = wire.sign(BENCH_KEY, method, path, ring, body)
            signed = f"{wire.AUTH_HEADER}: {signature.header()}\r\n".encode()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(head + signed + b"\r\n" + body)
                status_line = await reader.readline()
                length = 0
                received = len(status_line)
                while True:
                    line = await reader.readline()
                    received += len(line)
                    if line in (b"\r\n", b"\n", b""):
                        break
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                payload = await reader.readexactly(length) if length else b""
                counts.bytes_served += received + length
                return int(status_line.split()[1]), payload
            finally:
                writer.close()
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            counts.retried += 1
            if attempt == TRIES - 1:
                raise RankFailed(f"{method} {path} failed {TRIES} times") from None
            await asyncio.sleep(RETRY_S)
    raise AssertionError


def _addresses(rank: int, size: int) -> bytes:
    return bytes([rank % 251]) * (ENTRY * (size - 1))


def _contexts(size: int, stock: bool) -> list[tuple[str, int, int]]:
    """``(scope, ranks, rank of rank r's scope)`` per context, in Horovod's order; the
    scope name takes ``{r}`` for the host."""
    base = [("global", size), ("local_h{r}", 1), ("cross_0", size)]
    if stock:
        suffix = "_process_set_hash_5f"
        base += [(scope + suffix, k) for scope, k in base]
    return [(scope, k, 0) for scope, k in base]


class Barrier:
    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.arrived = 0
        self.event = asyncio.Event()

    async def wait(self) -> None:
        self.arrived += 1
        if self.arrived >= self.parties:
            self.event.set()
        await self.event.wait()


async def _rank_patched(
    port: int, rank: int, size: int, barriers: dict[str, Barrier], counts: Counts
) -> None:
    import struct

    # The worker learns the ring it forms, which its writes are signed for.
    status, answer = await _request(port, "GET", "/spotring/ring", b"", counts)
    if status != 200:
        raise RankFailed(f"/spotring/ring: {status}")
    ring = int(answer)
    for scope_t, k, _ in _contexts(size, stock=False):
        scope = scope_t.format(r=rank)
        me = rank if k > 1 else 0
        if k > 1:
            host = f"h{rank}".encode()
            body = struct.pack(">III", k, 30000, len(host)) + host + _addresses(me, k)
            while True:
                status, answer = await _request(
                    port, "PUT", f"/{scope}/spotring-mesh-{me}", body, counts, ring
                )
                if status == 200 and answer[:4] == b"SRM1":
                    if len(answer) != 16 + ENTRY * (k - 1):
                        raise RankFailed(f"{scope}: an answer of {len(answer)} bytes")
                    break
                if status != 404:
                    raise RankFailed(f"{scope}: {status}")
            await barriers[scope].wait()
            await _request(port, "DELETE", f"/{scope}/{me}", b"", counts, ring)


async def _rank_stock(
    port: int, rank: int, size: int, barriers: dict[str, Barrier], counts: Counts
) -> None:
    for scope_t, k, _ in _contexts(size, stock=True):
        scope = scope_t.format(r=rank)
        me = rank if k > 1 else 0
        await _request(port, "PUT", f"/{scope}/rank_{me}", f"h{rank}".encode(), counts)
        for i in range(me):
            await _request(port, "GET", f"/{scope}/rank_{i}", b"", counts)
        await _request(port, "PUT", f"/{scope}/{me}", _addresses(me, k) if k > 1 else b"", counts)
        for i in range(k):
            if i == me:
                continue
            while (await _request(port, "GET", f"/{scope}/{i}", b"", counts))[0] != 200:
                await asyncio.sleep(POLL_S)
            await _request(port, "GET", f"/{scope}/{i}", b"", counts)
        if k > 1:
            await barriers[scope].wait()
        await _request(port, "DELETE", f"/{scope}/{me}", b"", counts)


async def _form(port: int, size: int, stock: bool, cap: float, counts: Counts) -> bool:
    barriers = {scope: Barrier(k) for scope, k, _ in _contexts(size, stock) if "{r}" not in scope}
    rank_fn = _rank_stock if stock else _rank_patched

    async def one(rank: int) -> None:
        try:
            await rank_fn(port, rank, size, barriers, counts)
        except RankFailed as error:
            counts.failed.append(f"rank {rank}: {error}")
            for barrier in barriers.values():  # the ring will not form: release the others
                barrier.event.set()

    tasks = [asyncio.ensure_future(one(r)) for r in range(size)]
    _, pending = await asyncio.wait(tasks, timeout=cap)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return not pending and not counts.failed


def form_ring(kind: str, size: int, cap: float) -> dict[str, Any]:
    """One ring formation of ``size`` ranks against a fresh ``kind`` server."""
    server = ServerProcess(kind)
    try:
        server.ask(f"init {size}")
        counts = Counts()
        cpu0 = server.cpu()
        start = time.perf_counter()
        formed = asyncio.run(_form(server.port, size, kind == "stock", cap, counts))
        wall = time.perf_counter() - start
        cpu = server.cpu() - cpu0
    finally:
        server.stop()
    return {
        "kind": kind,
        "size": size,
        "formed": formed,
        "cpu_s": cpu,
        "wall_s": wall,
        "requests": counts.requests,
        "retried": counts.retried,
        "bytes": counts.bytes_served,
        "failed": counts.failed[:3],
    }


def stock_floor(size: int) -> dict[str, int]:
    """Requests and answer bytes of the stock pattern for a ring of ``size`` hosts of
    one slot, without a single poll that finds a key missing (a floor): per context
    of k ranks, each rank sets 2 keys, reads ``rank_<i>`` for i below it and each
    other rank's whole key twice ((k - 1) x 136 bytes), and deletes 1."""
    requests = answers = 0
    for k in (size, 1, size) * 2:  # global, local, cross; the process set's three
        requests += k * 3 + k * (k - 1) // 2 + 2 * k * (k - 1)
        answers += 2 * k * (k - 1) * (k - 1) * ENTRY
    return {"requests": requests, "body_bytes": answers}


def model_requests(scope_size: dict[str, int]) -> int:
    """The Gloo requests of one ring formation, spotring's Horovod build, with these
    plan scopes: per scope of k > 1 ranks, one exchange and one ``DELETE`` per rank
    (each exchange answered at its first ask); a scope of one rank, nothing, but the
    global scope of a ring of one: Horovod's two ``PUT`` s and its ``DELETE``."""
    return sum(2 * k if k > 1 else 3 if scope == "global" else 0 for scope, k in scope_size.items())


# ------------------------------------------------------------------ the model, with real workers


def check_model(workers: int = 8, timeout: float = 240.0) -> dict[str, Any]:
    """A real 8-worker job: the Gloo requests its driver's server counted for its first
    ring against :func:`model_requests` for that ring's scopes."""
    work = Path(tempfile.mkdtemp(prefix="spotring-scale-"))
    log = work / "steps.jsonl"
    argv = [
        str(BIN / "spotring"),
        "--log-level",
        "debug",
        "run",
        "--provider",
        "local",
        "-np",
        str(workers),
        "--min-np",
        str(workers),
        "--max-np",
        str(workers),
        "--hosts",
        str(workers),
        "--refresh-interval",
        "1",
        "--boot-seconds",
        "1",
        "--",
        sys.executable,
        str(REPO / "bench" / "workloads" / "steps.py"),
        "--step-log",
        str(log),
    ]
    found: list[tuple[dict[str, int], dict[str, int]]] = []
    pattern = re.compile(r"rendezvous: ring (\d+) \(scopes (\{.*?\})\) served (\{.*\})")
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=work,
        start_new_session=True,
    )
    lines: list[str] = []
    try:
        output = process.stdout
        assert output is not None
        reader = threading.Thread(target=lambda: lines.extend(output), daemon=True)
        reader.start()
        deadline = time.monotonic() + timeout
        # training: the first ring formed (its counts are logged when the driver stops)
        while time.monotonic() < deadline and process.poll() is None:
            if log.exists() and log.read_text().count('"step"') >= 5:
                break
            time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)
        reader.join(10)
        for line in lines:
            match = pattern.search(line)
            if match:
                found.append((json.loads(match[2]), json.loads(match[3])))
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    if not found:
        tail = "".join(lines[-15:])
        raise RuntimeError(f"the job logged no ring's requests; its output ended:\n{tail}")
    scopes, served = found[0]
    counted = sum(v for k, v in served.items() if k.endswith(" gloo"))
    return {
        "rings": len(found),
        "scopes": scopes,
        "served": served,
        "counted": counted,
        "model": model_requests(scopes),
        "exit": process.returncode,
    }


# ------------------------------------------------------------------ rows


def measure(
    quick: bool = False,
    sizes: tuple[int, ...] | None = None,
    cap: float = CAP_S,
    model: bool = True,
) -> list[Row]:
    _raise_fd_limit()
    sizes = sizes or (QUICK_SIZES if quick else SIZES)
    rows: list[Row] = []
    stock_stopped: str | None = None
    for size in sizes:
        ours = form_ring("spotring", size, cap)
        print(f"   spotring N={size}: {json.dumps(ours)}", flush=True)
        if stock_stopped is None:
            stock = form_ring("stock", size, cap)
            print(f"   stock    N={size}: {json.dumps(stock)}", flush=True)
            if not stock["formed"]:
                stock_stopped = f"stock server did not finish N={size} in {cap:.0f} s"
        else:
            stock = {"cpu_s": float("nan"), "wall_s": float("nan"), "requests": 0,
                     "retried": float("nan"), "bytes": float("nan"), "formed": False,
                     "not_run": stock_stopped}  # fmt: skip
        if stock["formed"]:
            anchor = "Horovod's server, stock pattern"
        elif "not_run" in stock:
            anchor = "Horovod's server: not run, a smaller ring did not finish"
        else:
            anchor = f"Horovod's server: did not finish in {cap:.0f} s (counts so far)"
        extra = {
            "spotring": ours,
            "stock": stock,
            "stock pattern floor (computed)": stock_floor(size),
            "layout": f"{size} hosts x 1 slot; spotring 3 contexts, stock 6",
        }
        name = f"ring formation, {size} ranks"
        big = size >= 1024
        rows += [
            row(name, "driver CPU s", ours["cpu_s"], anchor, stock["cpu_s"],
                TARGET_CPU if big else "", extra),
            row(name, "wall s", ours["wall_s"], anchor, stock["wall_s"],
                TARGET_WALL if big else "", {}),
            row(name, "requests", ours["requests"], anchor, stock["requests"], "", {}),
            row(name, "retried connections", ours["retried"], anchor, stock["retried"],
                "== 0" if big else "", {}),
            row(name, "bytes served", ours["bytes"], anchor, stock["bytes"], "", {}),
        ]  # fmt: skip
        if not ours["formed"]:
            rows[-1]["extra"]["spotring_failed"] = ours["failed"]
    if model:
        checked = check_model()
        print(f"   model check: {json.dumps(checked)}", flush=True)
        rows.append(
            row("ring formation, 8 real workers", "Gloo requests counted", checked["counted"],
                "model", checked["model"], "== 1x", checked)
        )  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", choices=("spotring", "stock"), help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sizes", default=None)
    parser.add_argument("--cap", type=float, default=CAP_S)
    parser.add_argument("--no-model", action="store_true")
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else None
    print(format_table(measure(args.quick, sizes, args.cap, model=not args.no_model)))


if __name__ == "__main__":
    main()
