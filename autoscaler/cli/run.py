"""``spotring run``: its options, their checks, and the job made of them.

The options become a typed :class:`~spotring.autoscaler.job.JobConfig`; what the job is
made of (groups, durable checkpoints) is composed in
:mod:`spotring.autoscaler.composition`, and :func:`~spotring.autoscaler.job.run_job`
runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from collections.abc import Sequence

import pluggy

from spotring.autoscaler.capacity import (
    DEFAULT_FALLBACK_AFTER,
    DEFAULT_ON_DEMAND_BASE,
    DEFAULT_PROBE_AFTER,
    DEFAULT_RETURN_AFTER,
    CapacityOptions,
)
from spotring.autoscaler.cli.options import add_provider_options
from spotring.autoscaler.cli.report import price_override
from spotring.autoscaler.cli.usage import PROG, AddCommand, UsageError, print_error
from spotring.autoscaler.composition import (
    check_capacity,
    check_prices,
    deadline_policy,
    durable_options,
)
from spotring.autoscaler.deadline import DEFAULT_RESTART_COST, deadline_plugin, parse_deadline
from spotring.autoscaler.job import JobConfig, run_job
from spotring.autoscaler.observers.progress import ProgressReporter
from spotring.autoscaler.plugins.policy import PriceOrder, before_defaults
from spotring.core import ConfigurationError
from spotring.core.job import JobShape
from spotring.driver.launcher import SshOptions
from spotring.driver.options import BACKENDS, DEFAULT_MAX_RESTARTS, ElasticOptions
from spotring.driver.worker_env import parse_forwarded
from spotring.providers.base import Provider
from spotring.providers.options import (
    non_negative_int,
    non_negative_seconds,
    port_number,
    positive_int,
    positive_seconds,
)

DEFAULT_REFRESH_INTERVAL = 10.0
"""Seconds between refreshes: one cloud call each for a steady group, 0.1 calls/s."""


def add_parser(
    add_command: AddCommand,
    pm: pluggy.PluginManager | None,
    provider: type[Provider] | None,
    command_after_dashes: bool,
) -> None:
    """The ``run`` command's parser; ``command_after_dashes``: see
    :func:`~spotring.autoscaler.cli.parser.build_parser`."""
    run = add_command(
        "run",
        help="run an elastic Horovod job on a provider's hosts",
        description="Run COMMAND as an elastic Horovod job on the hosts of a spot group. "
        "Use --provider NAME --help to see that provider's options.",
        usage="%(prog)s --provider NAME [options] -- COMMAND...",
    )
    add_provider_options(run, pm, provider)
    _add_elastic_options(run)
    observe = run.add_argument_group("what the job did")
    observe.add_argument(
        "--events",
        metavar="FILE",
        help="append one JSON object per line for every membership change, instance state "
        "change, notice, host failure, ring, refresh and the job's end (spotring report "
        "FILE draws it)",
    )
    observe.add_argument(
        "--metrics-port",
        type=port_number,
        metavar="PORT",
        help="serve Prometheus metrics on this port while the job runs",
    )
    observe.add_argument(
        "--metrics-addr",
        default="127.0.0.1",
        metavar="ADDR",
        help="address the metrics listen on (default: 127.0.0.1; 0.0.0.0 for every interface)",
    )
    run.add_argument(
        "job",
        nargs="*" if command_after_dashes else argparse.REMAINDER,
        metavar="COMMAND",
        help="the training command",
    )


def _add_elastic_options(run: argparse.ArgumentParser) -> None:
    elastic = run.add_argument_group("elastic options (as in horovodrun)")
    elastic.add_argument(
        "-np",
        "--num-proc",
        dest="num_proc",
        type=positive_int,
        required=True,
        metavar="N",
        help="worker processes to start with",
    )
    elastic.add_argument(
        "--min-np",
        "--min-num-proc",
        dest="min_num_proc",
        type=positive_int,
        metavar="N",
        help="fewest workers to keep training (default: -np)",
    )
    elastic.add_argument(
        "--max-np",
        "--max-num-proc",
        dest="max_num_proc",
        type=positive_int,
        metavar="N",
        help="most workers to scale up to (default: -np)",
    )
    elastic.add_argument(
        "--slots-per-host",
        "--slots",
        dest="slots_per_host",
        type=positive_int,
        metavar="N",
        help="workers per host (default: from the provider)",
    )
    elastic.add_argument(
        "--reset-limit",
        type=non_negative_int,
        metavar="N",
        help="end the job after N resets (default: no limit)",
    )
    elastic.add_argument(
        "--blacklist-cooldown-range",
        type=non_negative_int,
        nargs=2,
        metavar=("MIN", "MAX"),
        help="seconds a failed host stays blacklisted, growing from MIN to MAX",
    )
    elastic.add_argument(
        "--elastic-timeout",
        type=positive_int,
        default=600,
        metavar="SECONDS",
        help="how long to wait for enough hosts after a reset (default: 600)",
    )
    elastic.add_argument(
        "--start-timeout",
        type=positive_int,
        default=120,
        metavar="SECONDS",
        help="how long to wait for the group's first inventory and network checks (default: 120)",
    )
    elastic.add_argument(
        "--network-interface",
        "--network-interfaces",
        dest="nics",
        metavar="NICS",
        help="comma-separated interfaces for Gloo/NCCL (default: detect; 'lo' for local workers)",
    )
    elastic.add_argument("--verbose", "-v", action="count", default=0, help="Horovod verbosity")
    elastic.add_argument(
        "--backend",
        choices=BACKENDS,
        default="horovod",
        help="horovod (default): an hvd.elastic script; torch: an unchanged torchrun script, "
        "every worker restarted on a membership change (docs/torch.md)",
    )
    elastic.add_argument(
        "--in-place",
        action="store_true",
        help="--backend torch: a script built on spotring.torch.inplace; the surviving "
        "workers keep running across membership changes (docs/torch.md)",
    )
    elastic.add_argument(
        "--max-restarts",
        type=non_negative_int,
        metavar="N",
        help="--backend torch: fail the job at the N+1-th worker failure; membership "
        f"changes do not count (default: {DEFAULT_MAX_RESTARTS}; torchrun's is 0)",
    )

    control = run.add_argument_group("spotring options")
    control.add_argument(
        "--refresh-interval",
        type=positive_seconds,
        default=DEFAULT_REFRESH_INTERVAL,
        metavar="SECONDS",
        help="seconds between inventory refreshes (default: 10; a worker failure is "
        "acted on at once, whatever the interval)",
    )
    control.add_argument(
        "--target-hosts",
        type=non_negative_int,
        metavar="N",
        help="hosts to ask the group for at start (default: enough for -np)",
    )
    control.add_argument("--no-resize", action="store_true", help="never change the group's size")
    control.add_argument(
        "--cold-start",
        action="store_true",
        help="start a host's workers when Horovod places it in a ring, as horovodrun "
        "does (default: start them as soon as the host is READY and offer the host "
        "once they wait in hvd.init, so a join stalls the ring for the join only)",
    )
    control.add_argument(
        "--hang-timeout",
        type=positive_seconds,
        metavar="SECONDS",
        help="a ring that made no progress (no commit) for this long, since its last "
        "commit or its planning, has the member that holds it up (stopped beating, never "
        "joined the ring's reset, fewer commits) stopped and its host replaced (default: "
        "off; set it above the longest gap between commits, and a ring's formation and "
        "first step)",
    )
    capacity = run.add_argument_group(
        "when spot runs out (a job of several groups: --group given more than once)"
    )
    capacity.add_argument(
        "--fallback-after",
        type=non_negative_seconds,
        default=DEFAULT_FALLBACK_AFTER,
        metavar="SECONDS",
        help="a group below its target this long with no error from its cloud counts as "
        "short, and the next group is asked for its shortfall (default: %(default).0f; a "
        "capacity or quota error from the cloud counts at once)",
    )
    capacity.add_argument(
        "--probe-after",
        type=positive_seconds,
        default=DEFAULT_PROBE_AFTER,
        metavar="SECONDS",
        help="a short group is asked again this long after its shortage, 1.6 times longer "
        "for each shortage in a row, at most five times this, +-40%% jitter (default: "
        "%(default).0f; a quota shortage: 5 to 30 minutes)",
    )
    capacity.add_argument(
        "--on-demand-base",
        type=non_negative_int,
        default=DEFAULT_ON_DEMAND_BASE,
        metavar="N",
        help="keep N hosts in the last group (the on-demand one) always (default: 0)",
    )
    capacity.add_argument(
        "--order",
        choices=["preference", "price"],
        default="preference",
        help="preference (default): try the groups in the order given; price: try the "
        "groups before the last cheapest per slot-hour first (--price or the clouds' "
        "prices; unknown prices after known, a demoted group after the others), the "
        "last group (the on-demand one) still last",
    )
    capacity.add_argument(
        "--price",
        dest="prices",
        type=price_override,
        action="append",
        default=[],
        metavar="GROUP_OR_LIFECYCLE=USD_PER_HOUR",
        help="price of an instance-hour of a group (by name) or a lifecycle (spot, "
        "on-demand), over what the group's cloud says (repeatable; a group's price wins; "
        "the local provider's groups have no other price)",
    )
    capacity.add_argument(
        "--return-after",
        type=non_negative_seconds,
        default=DEFAULT_RETURN_AFTER,
        metavar="SECONDS",
        help="a host that fell back to a later group is handed back (at a commit, one at "
        "a time) once a preferred group has capacity again, not before it has been there "
        "this long (default: %(default).0f)",
    )
    deadline = run.add_argument_group(
        "deadline mode (a job of several groups, the last on-demand: docs/cost.md)"
    )
    deadline.add_argument(
        "--deadline",
        metavar="WHEN",
        help="finish by WHEN (a duration: 90s, 45m, 2h; or an ISO 8601 time), buying "
        "on-demand hosts only when the job falls behind uniform progress towards it; "
        "needs --total-steps or --total-epochs",
    )
    deadline.add_argument(
        "--total-steps",
        type=positive_int,
        metavar="N",
        help="the commits the job makes in all (its progress is what the rings commit)",
    )
    deadline.add_argument(
        "--total-epochs",
        type=positive_int,
        metavar="N",
        help="instead of --total-steps: the epochs the job trains in all (its progress is "
        "the epoch and elastic sampler position its workers commit: hvd.elastic.ElasticSampler "
        "in the state)",
    )
    deadline.add_argument(
        "--restart-cost",
        type=non_negative_seconds,
        default=DEFAULT_RESTART_COST,
        metavar="SECONDS",
        help="what a change of hosts costs the job (a VM's boot, a ring's formation): "
        "on-demand hosts stay until the job is twice this ahead, and with no more than "
        "twice this of slack left the job goes on-demand for good (default: %(default).0f)",
    )
    durable = run.add_argument_group("durable checkpoints")
    durable.add_argument(
        "--checkpoint",
        metavar="URI",
        help="write durable copies of the committed state, in the background, to URI: a "
        "directory, s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or "
        "https://ACCOUNT.blob.core.windows.net/CONTAINER/PREFIX; a ring that lost every "
        "worker, or the same command run again, resumes from the newest",
    )
    durable.add_argument(
        "--checkpoint-every",
        type=positive_seconds,
        default=60.0,
        metavar="SECONDS",
        help="at most one durable copy per SECONDS, of the first commit after them (default: 60)",
    )
    durable.add_argument(
        "--checkpoint-keep",
        type=positive_int,
        default=3,
        metavar="K",
        help="complete checkpoints kept; older ones are deleted (default: 3)",
    )
    control.add_argument(
        "--no-replace",
        action="store_true",
        help="do not ask the provider to replace hosts whose workers failed",
    )
    control.add_argument(
        "--drain-on-rebalance",
        action="store_true",
        help="leave a host at a rebalance recommendation already, not only at a notice",
    )
    control.add_argument(
        "--launcher",
        choices=["auto", "local", "ssh"],
        default="auto",
        help="how workers start: local processes or ssh (default: local for "
        "providers that simulate hosts, ssh otherwise)",
    )
    control.add_argument(
        "--ssh-port", type=positive_int, metavar="PORT", help="ssh port on the hosts"
    )
    control.add_argument("--ssh-identity-file", metavar="FILE", help="ssh private key")
    control.add_argument(
        "--ssh-host-key-checking",
        choices=["accept-new", "yes", "no"],
        default="accept-new",
        help="accept-new (default): trust a host's key on first use, in a known_hosts "
        "file of the job's own, and refuse a changed one; yes: only keys already known; "
        "no: check nothing",
    )
    control.add_argument(
        "--ssh-known-hosts",
        metavar="FILE",
        help="known_hosts file to check host keys against (default: the job's own for "
        "accept-new, ssh's usual files for yes)",
    )
    control.add_argument(
        "--worker-python",
        default=sys.executable,
        metavar="PATH",
        help="the Python on the hosts that has spotring installed (default: this one, %(default)s)",
    )
    control.add_argument(
        "-x",
        "--env",
        dest="forward_env",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="forward the driver's NAME to the workers, or set NAME=VALUE (repeatable). "
        "Workers get only HOROVOD_*, PYTHON*, locale, PATH/HOME/USER, CUDA/NCCL/GLOO/OMP/"
        "TORCH settings and these; cloud credentials stay on the driver. A VALUE given "
        "here shows on spotring's own command line: prefer exporting NAME",
    )


def finish_options(options: argparse.Namespace, after_dashes: list[str] | None) -> None:
    """What argparse cannot check of ``run``'s options: the training command (given
    after ``--``, or positionally), -np within its bounds, the cooldown range, and
    ``--checkpoint`` naming a store. Fills in the defaults that depend on others."""
    options.job = _job_command(options.job, after_dashes)
    _check_elastic(options)
    options.deadline_at = _deadline(options)
    try:
        options.durable = durable_options(
            options.checkpoint, options.checkpoint_every, options.checkpoint_keep, options.job
        )
    except ConfigurationError as error:
        raise UsageError(f"{PROG} run: error: {error}") from None


def _deadline(options: argparse.Namespace) -> float | None:
    """``--deadline WHEN`` as epoch seconds, with the ``--total-steps`` or
    ``--total-epochs`` it needs (one of them)."""
    totals = [
        f"--total-{unit}"
        for unit, value in (("steps", options.total_steps), ("epochs", options.total_epochs))
        if value is not None
    ]
    if options.deadline is None:
        if totals:
            raise UsageError(f"{PROG} run: error: {totals[0]} is for --deadline WHEN")
        return None
    if not totals:
        raise UsageError(f"{PROG} run: error: --deadline needs --total-steps N or --total-epochs N")
    if len(totals) == 2:
        raise UsageError(f"{PROG} run: error: give --total-steps or --total-epochs, not both")
    try:
        return parse_deadline(options.deadline, time.time())
    except ValueError as error:
        raise UsageError(f"{PROG} run: error: {error}") from None


def _job_command(positional: list[str], after_dashes: list[str] | None) -> list[str]:
    command = after_dashes if after_dashes is not None else positional
    if after_dashes is not None and positional:
        raise UsageError(
            f"{PROG} run: error: unexpected arguments before '--': {' '.join(positional)}"
        )
    if not command:
        raise UsageError(f"{PROG} run: error: missing the training command after '--'")
    return command


def _check_elastic(options: argparse.Namespace) -> None:
    options.min_num_proc = options.min_num_proc or options.num_proc
    options.max_num_proc = options.max_num_proc or options.num_proc
    if not options.min_num_proc <= options.num_proc <= options.max_num_proc:
        raise UsageError(
            f"{PROG} run: error: need --min-np <= -np <= --max-np, got "
            f"{options.min_num_proc} <= {options.num_proc} <= {options.max_num_proc}"
        )
    cooldown = options.blacklist_cooldown_range
    if cooldown is not None and cooldown[0] > cooldown[1]:
        raise UsageError(f"{PROG} run: error: --blacklist-cooldown-range needs MIN <= MAX")
    options.nics = tuple(n for n in (options.nics or "").split(",") if n)
    _check_backend(options)


def _check_backend(options: argparse.Namespace) -> None:
    """The options each backend takes; fills in ``--max-restarts``' default."""
    if options.backend == "horovod":
        for name, given in (("--max-restarts", options.max_restarts is not None),
                            ("--in-place", options.in_place)):  # fmt: skip
            if given:
                raise UsageError(f"{PROG} run: error: {name} is for --backend torch")
        return
    mode = "--backend torch --in-place" if options.in_place else "--backend torch"
    unsupported = {
        "--checkpoint": None if options.in_place else options.checkpoint,
        "--reset-limit": options.reset_limit,
        # The restart mode sees no commits; the in-place mode restarts nothing.
        "--hang-timeout": None if options.in_place else options.hang_timeout,
        "--max-restarts": options.max_restarts if options.in_place else None,
    }
    for name, value in unsupported.items():
        if value is not None:
            raise UsageError(f"{PROG} run: error: {name} is not supported with {mode}")
    if options.max_restarts is None:
        options.max_restarts = DEFAULT_MAX_RESTARTS


def job_config(options: argparse.Namespace) -> JobConfig:
    """The typed configuration of the job ``options`` describe (parsed by
    :func:`~spotring.autoscaler.cli.parsing.parse`)."""
    try:
        forwarded = parse_forwarded(options.forward_env, os.environ)
    except ValueError as error:
        raise UsageError(f"{PROG} run: error: {error}") from None
    return JobConfig(
        command=tuple(options.job),
        backend=options.backend,
        in_place=options.in_place,
        max_restarts=options.max_restarts or 0,
        shape=JobShape(
            num_proc=options.num_proc,
            min_num_proc=options.min_num_proc,
            max_num_proc=options.max_num_proc,
            slots_per_host=options.slots_per_host,
            target_hosts=options.target_hosts,
            resize=not options.no_resize,
            replace_failed=not options.no_replace,
            drain_on_rebalance=options.drain_on_rebalance,
        ),
        elastic=ElasticOptions(
            reset_limit=options.reset_limit,
            cooldown_range=tuple(options.blacklist_cooldown_range)
            if options.blacklist_cooldown_range
            else None,
            elastic_timeout=options.elastic_timeout,
            start_timeout=options.start_timeout,
            nics=options.nics,
            verbose=options.verbose,
            warm_start=not options.cold_start,
            hang_timeout=options.hang_timeout,
            durable=options.durable,
        ),
        refresh_interval=options.refresh_interval,
        launcher=options.launcher,
        ssh=SshOptions(
            port=options.ssh_port,
            identity_file=options.ssh_identity_file,
            host_key_checking=options.ssh_host_key_checking,
            known_hosts=options.ssh_known_hosts,
        ),
        worker_python=options.worker_python,
        forwarded_env=forwarded,
        events_path=options.events,
        metrics_port=options.metrics_port,
        metrics_addr=options.metrics_addr,
        prices=dict(options.prices),
        capacity=CapacityOptions.probing_after(
            options.probe_after,
            fallback_after=options.fallback_after,
            on_demand_base=options.on_demand_base,
            return_after=options.return_after,
        ),
    )


def run_command(
    options: argparse.Namespace, groups: Sequence[Provider], pm: pluggy.PluginManager
) -> int:
    """Run the job on ``groups`` until it ends; its exit status."""
    config = job_config(options)
    check_capacity(config.capacity, groups)
    check_prices(config.prices, groups)
    policy = deadline_policy(
        options.deadline_at,
        (options.total_steps, options.total_epochs),
        options.restart_cost,
        config.shape,
        groups,
    )
    # SIGTERM (a scheduler, `kill`) stops the job like Ctrl-C: workers first.
    signal.signal(signal.SIGTERM, _interrupt)
    with contextlib.ExitStack() as policies:
        # The deadline's answers first (its safety net orders the groups too).
        policies.enter_context(deadline_plugin(pm, policy))
        if options.order == "price":
            policies.enter_context(before_defaults(pm, PriceOrder(), PriceOrder.NAME))
        outcome = run_job(config, groups, pm, ProgressReporter())
    if outcome.exit_code:
        print_error(f"{PROG} run: job failed: {outcome.message}")
    return outcome.exit_code


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)
