"""Shared pieces of the benchmarks, and the runner behind ``bench/run``.

Every benchmark module has ``measure(quick: bool) -> list[Row]``. A row is a plain dict
(JSON as is) holding one figure of spotring next to its anchor, measured side by side
in the same run:

    {"benchmark", "metric", "value", "anchor_name", "anchor_value", "ratio",
     "target", "extra"}

``ratio`` is ``value / anchor_value``. ``target`` is free text; when it reads like
``"< 20 ms"`` or ``"<= 1.2x"`` it is checked by machine (:func:`target_met`): a number
followed by ``x`` bounds the ratio, any other number bounds the value (in the metric's
unit).

    bench/run [--quick] [--only NAME,...]
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.metadata
import importlib.util
import json
import logging
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypedDict

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
LATEST = RESULTS / "latest.json"

BENCHMARKS: tuple[str, ...] = (
    "discovery",
    "gcp_discovery",
    "azure_discovery",
    "driver_overhead",
    "commit",
    "durable",
    "recovery",
    "kills",
    "torch_inplace",
    "notice",
    "capacity",
    "deadline_sim",
    "scale",
    "driver_resources",
)
"""Benchmark modules under ``bench/``, in the order ``bench/run`` runs them."""

REGION = "us-east-1"
AMI = "ami-12c6146b"  # an image moto knows in us-east-1
FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
"""moto accepts any keys; fixed fake ones so no real credential is ever sent to it."""


# ------------------------------------------------------------------------ rows


class Row(TypedDict):
    """One figure next to its anchor."""

    benchmark: str
    metric: str
    value: float
    anchor_name: str
    anchor_value: float
    ratio: float
    target: str
    extra: dict[str, Any]


def row(
    benchmark: str,
    metric: str,
    value: float,
    anchor_name: str,
    anchor_value: float,
    target: str = "",
    extra: dict[str, Any] | None = None,
    digits: int = 4,
) -> Row:
    """A :class:`Row`, with the ratio computed (NaN when the anchor is 0 or missing)."""
    ratio = value / anchor_value if anchor_value else math.nan
    return Row(
        benchmark=benchmark,
        metric=metric,
        value=_round(value, digits),
        anchor_name=anchor_name,
        anchor_value=_round(anchor_value, digits),
        ratio=_round(ratio, 3),
        target=target,
        extra=extra or {},
    )


def _round(value: float, digits: int) -> float:
    """Round to ``digits`` significant digits (figures span microseconds to hours)."""
    if not math.isfinite(value) or value == 0:
        return value
    return round(value, max(0, digits - 1 - math.floor(math.log10(abs(value)))))


_TARGET = re.compile(r"^\s*(<=|<|>=|>|==)\s*([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(x\b)?")


def target_met(r: Row | dict[str, Any]) -> bool | None:
    """Whether the row meets its target; None when the target is not machine-checkable.

    ``"< 20 ms"`` bounds ``value``; ``"<= 1.2x"`` bounds ``ratio``.
    """
    match = _TARGET.match(r.get("target") or "")
    if match is None:
        return None
    op, number, on_ratio = match.group(1), float(match.group(2)), match.group(3)
    actual = r.get("ratio") if on_ratio else r.get("value")
    if not _finite(actual):
        return None
    return {
        "<": actual < number,
        "<=": actual <= number,
        ">": actual > number,
        ">=": actual >= number,
        "==": actual == number,
    }[op]


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _json_safe(value: Any) -> Any:
    """NaN/inf -> None, recursively: strict JSON has no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


# ----------------------------------------------------------------------- table

COLUMNS = ("benchmark", "metric", "spotring", "anchor", "anchor value", "ratio", "target", "met")


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "-"
        if value == 0:
            return "0"
        if abs(value) >= 1e5 or abs(value) < 1e-3:
            return f"{value:.3g}"
        return f"{value:.4g}"
    return str(value)


def format_table(rows: Sequence[Row | dict[str, Any]]) -> str:
    """A plain-text table: each figure, its anchor, the ratio, the target and whether met."""
    cells = [
        (
            r["benchmark"],
            r["metric"],
            _fmt(r["value"]),
            r["anchor_name"],
            _fmt(r["anchor_value"]),
            _fmt(r["ratio"]) + "x" if _finite(r["ratio"]) else "-",
            r.get("target") or "-",
            {True: "yes", False: "NO", None: "-"}[target_met(r)],
        )
        for r in rows
    ]
    widths = [max(len(c[i]) for c in [COLUMNS, *cells]) for i in range(len(COLUMNS))]
    right = {2, 4, 5}  # numbers
    lines = []
    for n, line in enumerate([COLUMNS, *cells]):
        lines.append(
            "  ".join(
                c.rjust(w) if i in right else c.ljust(w)
                for i, (c, w) in enumerate(zip(line, widths, strict=True))
            ).rstrip()
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_extras(rows: Sequence[Row | dict[str, Any]]) -> str:
    """Each row's extra figures under its name, for a module run on its own."""
    return "\n".join(
        f"\n{r['benchmark']} ({r['metric']}):\n"
        + "\n".join(f"  {key}: {value}" for key, value in r["extra"].items())
        for r in rows
        if r["extra"]
    )


def format_changes(rows: Sequence[Row | dict[str, Any]], previous: dict[str, Any]) -> str:
    """Each row's value against the same (benchmark, metric, anchor) of a previous run."""
    before = {(r["benchmark"], r["metric"], r["anchor_name"]): r for r in previous.get("rows", [])}
    lines = [f"change vs previous run ({previous.get('machine', {}).get('date', '?')}):"]
    for r in rows:
        old = before.get((r["benchmark"], r["metric"], r["anchor_name"]))
        if old is None:
            lines.append(f"  {r['benchmark']} / {r['metric']} vs {r['anchor_name']}: new")
            continue
        both = _finite(r["value"]) and _finite(old["value"]) and old["value"]
        change = (r["value"] / old["value"] - 1) * 100 if both else math.nan
        lines.append(
            f"  {r['benchmark']} / {r['metric']} vs {r['anchor_name']}: "
            f"{_fmt(old['value'])} -> {_fmt(r['value'])}"
            + (f" ({change:+.0f}%)" if math.isfinite(change) else "")
            + f"; ratio {_fmt(old['ratio'])}x -> {_fmt(r['ratio'])}x"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------ JSON


def machine_info() -> dict[str, Any]:
    """Where the figures were taken: cores, python, torch/horovod versions, date."""
    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
    }
    with suppress(OSError):  # not every platform has a load average
        info["load_avg_1m"] = round(os.getloadavg()[0], 2)
    for name in ("torch", "horovod", "boto3", "moto"):
        try:  # from the installed metadata: importing torch would take seconds
            info[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            info[name] = None
    return info


def write_json(
    rows: Sequence[Row | dict[str, Any]],
    path: Path = LATEST,
    notes: Sequence[str] = (),
    quick: bool | None = None,
) -> dict[str, Any]:
    """Write the rows with machine info to ``path``; returns the document written."""
    document = {
        "machine": machine_info(),
        "quick": quick,
        "notes": list(notes),
        "rows": [_json_safe(dict(r, met=target_met(r))) for r in rows],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(document, indent=2, default=str, allow_nan=False) + "\n")
    tmp.replace(path)
    return document


# ------------------------------------------------------------------ moto server


def fake_session() -> Any:
    """A boto3 session with fake credentials (never the user's), for a moto server."""
    import boto3

    return boto3.session.Session(
        aws_access_key_id=FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=REGION,
    )


class _RequestCounter(logging.Handler):
    """Counts the requests werkzeug logs, i.e. every API call that reaches moto."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        # Handler.handle holds self.lock here, so the server's threads count safely.
        if " HTTP/" in record.getMessage():
            self.count += 1


class MotoServer:
    """moto on loopback in a thread of this process, counting the requests it serves.

    moto's CPU is this process's CPU: measure a client with ``time.thread_time`` on its
    own thread (or in another process), never ``process_time``.
    """

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self._counter = _RequestCounter()
        werkzeug = logging.getLogger("werkzeug")
        werkzeug.setLevel(logging.INFO)
        werkzeug.propagate = False  # no request lines on the terminal
        werkzeug.addHandler(self._counter)
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.url = f"http://{host}:{port}"

    @property
    def requests(self) -> int:
        """Requests served so far (API calls, retries included)."""
        return self._counter.count

    def session(self) -> Any:
        """A boto3 session with fake credentials (never the user's) for this server."""
        return fake_session()

    def client(self, service: str) -> Any:
        """A boto3 client for ``service`` pointed at this server."""
        import botocore.config

        config = botocore.config.Config(read_timeout=600, retries={"max_attempts": 0})
        return self.session().client(service, endpoint_url=self.url, config=config)

    def create_group(
        self,
        name: str,
        size: int,
        instance_type: str = "t3.micro",
        step: int | None = None,
        budget_s: float | None = None,
    ) -> tuple[int, float]:
        """An Auto Scaling group (launch template) of ``size`` members; moto launches them.

        With ``step``, the group grows by ``step`` members per SetDesiredCapacity and
        stops growing once ``budget_s`` has passed. Returns (members, seconds taken).
        """
        start = time.perf_counter()
        ec2, autoscaling = self.client("ec2"), self.client("autoscaling")
        template = f"{name}-template"
        ec2.create_launch_template(
            LaunchTemplateName=template,
            LaunchTemplateData={"ImageId": AMI, "InstanceType": instance_type},
        )
        first = size if step is None else min(step, size)
        autoscaling.create_auto_scaling_group(
            AutoScalingGroupName=name,
            MinSize=0,
            MaxSize=size,
            DesiredCapacity=first,
            LaunchTemplate={"LaunchTemplateName": template},
            AvailabilityZones=[f"{REGION}a"],
        )
        members = first
        while members < size and step is not None:
            if budget_s is not None and time.perf_counter() - start > budget_s:
                break
            members = min(size, members + step)
            autoscaling.set_desired_capacity(
                AutoScalingGroupName=name, DesiredCapacity=members, HonorCooldown=False
            )
        return members, time.perf_counter() - start

    def stop(self) -> None:
        """Drop moto's state (its backends are global to the process) and shut down."""
        import urllib.request

        with (
            suppress(OSError),
            urllib.request.urlopen(  # stopping anyway if it fails
                urllib.request.Request(f"{self.url}/moto-api/reset", b""), timeout=30
            ),
        ):
            pass
        self._server.stop()
        logging.getLogger("werkzeug").removeHandler(self._counter)


@contextmanager
def moto_server() -> Iterator[MotoServer]:
    """A :class:`MotoServer`, stopped on exit."""
    server = MotoServer()
    try:
        yield server
    finally:
        server.stop()


# -------------------------------------------------------------------- aws cli


def find_awscli() -> list[str] | None:
    """The command that runs the AWS CLI, or None when none is installed.

    ``SPOTRING_BENCH_AWS`` overrides. A pyenv shim is resolved to the real script,
    so the anchor is not charged for pyenv's bash wrapper on every call.
    """
    override = os.environ.get("SPOTRING_BENCH_AWS")
    if override:
        return override.split()
    found = shutil.which("aws")
    if found and "/shims/" in found and shutil.which("pyenv"):
        resolved = subprocess.run(
            ["pyenv", "which", "aws"], capture_output=True, text=True, check=False
        ).stdout.strip()
        found = resolved or found
    if found:
        return [found]
    # awscli 1.x importable by the system python3 (not the venv's).
    for python in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if Path(python).exists():
            probe = subprocess.run([python, "-c", "import awscli"], capture_output=True)
            if probe.returncode == 0:
                return [python, "-m", "awscli"]
    return None


def awscli_env(endpoint_url: str) -> dict[str, str]:
    """Environment for AWS CLI calls against a test server: fake keys, no user config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= FAKE_CREDENTIALS
    env |= {
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_ENDPOINT_URL": endpoint_url,
        "AWS_PAGER": "",
    }
    return env


def classic_discovery_script(aws: Sequence[str], group: str, endpoint_url: str) -> str:
    """The discovery script a horovodrun user writes for an ASG: two AWS CLI calls.

    In-service, healthy members of the group, then their private addresses, one
    ``address:1`` line each (the format of ``--host-discovery-script``).
    """
    cli = " ".join(aws) + f" --endpoint-url {endpoint_url} --region {REGION}"
    query = (
        "AutoScalingGroups[0].Instances[?LifecycleState=='InService'"
        " && HealthStatus=='Healthy'].InstanceId"
    )
    return (
        "#!/bin/sh\nset -e\n"
        f"ids=$({cli} autoscaling describe-auto-scaling-groups"
        f' --auto-scaling-group-names {group} --query "{query}" --output text)\n'
        '[ -n "$ids" ] || exit 0\n'
        f"{cli} ec2 describe-instances --instance-ids $ids"
        " --filters Name=instance-state-name,Values=running"
        " --query 'Reservations[].Instances[].PrivateIpAddress' --output text"
        " | tr '\\t' '\\n' | sed 's/$/:1/'\n"
    )


# --------------------------------------------------------------------- runner


def _load(name: str) -> Any | None:
    """``bench.NAME``, or None when the module does not exist (yet)."""
    if importlib.util.find_spec(f"bench.{name}") is None:
        return None
    return importlib.import_module(f"bench.{name}")


def main(argv: Sequence[str] | None = None) -> int:
    """``bench/run``: run the benchmarks, print one table, write ``latest.json``."""
    parser = argparse.ArgumentParser(prog="bench/run", description="spotring vs its anchors")
    parser.add_argument("--quick", action="store_true", help="fewer rounds, smaller groups")
    parser.add_argument(
        "--only",
        metavar="NAME,...",
        help=f"run only these benchmarks (of {', '.join(BENCHMARKS)})",
    )
    parser.add_argument("--output", type=Path, default=LATEST, help="JSON results file")
    args = parser.parse_args(argv)
    names = list(BENCHMARKS)
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in BENCHMARKS]
        if unknown:
            parser.error(f"unknown benchmark(s): {', '.join(unknown)}")

    previous: dict[str, Any] | None = None
    if args.output.exists():
        try:
            previous = json.loads(args.output.read_text())
        except (OSError, ValueError):
            previous = None

    rows: list[Row] = []
    notes: list[str] = []
    for name in names:
        module = _load(name)
        if module is None:
            note = f"{name}: skipped, bench/{name}.py does not exist yet"
            print(note, flush=True)
            notes.append(note)
            continue
        print(f"== {name} ({'quick' if args.quick else 'full'})", flush=True)
        start = time.perf_counter()
        try:
            produced = module.measure(args.quick)
        except Exception as error:  # one broken benchmark must not lose the others
            traceback.print_exc()
            note = f"{name}: failed: {type(error).__name__}: {error}"
            print(note, flush=True)
            notes.append(note)
            continue
        took = time.perf_counter() - start
        print(f"   {len(produced)} row(s) in {took:.1f} s", flush=True)
        notes.append(f"{name}: {took:.1f} s")
        rows.extend(produced)

    print()
    print(format_table(rows))
    document = write_json(rows, args.output, notes, quick=args.quick)
    print(f"\nwrote {args.output} ({document['machine']['cpu_count']} cores)")
    if previous is not None and rows:
        print(format_changes(rows, previous))
    return 0 if not any("failed" in n for n in notes) else 1


if __name__ == "__main__":
    sys.exit(main())
