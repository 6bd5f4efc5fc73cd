"""The ``spotring`` command line: ``run``, ``discover`` and ``providers``.

Parsing happens in two passes: the first finds ``--provider``, the second builds the
full parser with that provider's options (added through the
``spotring_add_provider_options`` hook), so ``spotring run --provider NAME --help``
lists them. Bad input exits 2 with one line on stderr; no traceback.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import signal
import sys
import warnings
from collections.abc import Sequence
from typing import NoReturn

import pluggy

from spotring.autoscaler.capacity import (
    DEFAULT_FALLBACK_AFTER,
    DEFAULT_ON_DEMAND_BASE,
    DEFAULT_PROBE_AFTER,
    DEFAULT_RETURN_AFTER,
    CapacityOptions,
)
from spotring.autoscaler.groups import job_groups, list_members
from spotring.autoscaler.job import EXIT_FAILURE, EXIT_USAGE, JobConfig, run_job
from spotring.autoscaler.plugins import get_plugin_manager, provider_registry
from spotring.autoscaler.progress import ProgressReporter
from spotring.core import ConfigurationError, CoreOptions, ProviderError
from spotring.core.inventory import Inventory
from spotring.core.job import JobShape
from spotring.driver.compat import HorovodSetupError
from spotring.driver.launcher import SshOptions
from spotring.driver.options import DurableOptions, ElasticOptions
from spotring.driver.worker_env import parse_forwarded
from spotring.providers.base import Provider
from spotring.providers.options import (
    non_negative_int,
    non_negative_seconds,
    port_number,
    positive_int,
    positive_seconds,
)

PROG = "spotring"
DEFAULT_REFRESH_INTERVAL = 10.0
"""Seconds between refreshes: one cloud call each for a steady group, 0.1 calls/s."""


class UsageError(Exception):
    """Bad command-line input: reported as one line, exit status 2."""


def _error(message: object) -> None:
    """Print ``message`` to stderr as one line: control characters from the user's
    input (a newline in an argument or a group name) are shown escaped."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(message))
    print(text, file=sys.stderr)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: error: {message}")


# ----------------------------------------------------------------- parser


def build_parser(
    pm: pluggy.PluginManager | None = None,
    provider: type[Provider] | None = None,
    command_after_dashes: bool = False,
) -> argparse.ArgumentParser:
    """The full parser, with ``provider``'s options when one is given.

    ``command_after_dashes``: the training command was split off at ``--``, so ``run``
    takes no positional command; otherwise argparse's catch-all positional would
    swallow a mistyped option and everything after it (``--hostz 2 -np 1`` read as a
    command, then "-np is required").
    """
    parser = _Parser(prog=PROG, description="Elastic Horovod training on spot capacity.")
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning", "error"],
        help="controller log level (default: warning)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    run = commands.add_parser(
        "run",
        help="run an elastic Horovod job on a provider's hosts",
        description="Run COMMAND as an elastic Horovod job on the hosts of a spot group. "
        "Use --provider NAME --help to see that provider's options.",
        usage="%(prog)s --provider NAME [options] -- COMMAND...",
    )
    _add_provider_options(run, pm, provider)
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

    discover = commands.add_parser(
        "discover",
        help="print host:slots lines for horovodrun --host-discovery-script",
        description="Print the group's READY hosts as host:slots lines, the format "
        "horovodrun's --host-discovery-script expects.",
    )
    _add_provider_options(discover, pm, provider)
    discover.add_argument(
        "--slots-per-host",
        "--slots",
        dest="slots_per_host",
        type=positive_int,
        metavar="N",
        help="slots per host (default: from the provider)",
    )

    commands.add_parser("providers", help="list the installed providers")

    report = commands.add_parser(
        "report",
        help="draw a run's --events file: sizes over time, notices, failures, stalls, cost",
        description="Render the events file of a spotring run as a self-contained HTML "
        "report, or as a PNG chart when OUT ends in .png.",
    )
    report.add_argument("events", metavar="FILE", help="the events file of a run")
    report.add_argument(
        "-o", "--output", default="report.html", metavar="OUT", help="default: report.html"
    )
    report.add_argument(
        "--price-spot",
        type=non_negative_seconds,
        metavar="USD",
        help="price of a spot instance-hour, for the cost line",
    )
    report.add_argument(
        "--price",
        dest="prices",
        type=_price,
        action="append",
        default=[],
        metavar="GROUP_OR_LIFECYCLE=USD_PER_HOUR",
        help="price of an instance-hour of a group (by name) or a lifecycle (spot, "
        "on-demand), for the cost by group (repeatable; a group's price wins)",
    )
    report.add_argument(
        "--price-on-demand",
        type=non_negative_seconds,
        metavar="USD",
        help="price of an on-demand instance-hour, for the cost line and the savings",
    )

    check = commands.add_parser(
        "check",
        help="report what this installation can run (torch, Horovod, provider SDKs)",
        description="Report torch, the Horovod build, and each provider's SDK and whether "
        "credentials are found (never printed; no cloud API is called). Exits 1 when "
        "something required is missing: torch and Horovod, and with --provider that "
        "provider's SDK and credentials.",
    )
    check.add_argument("--provider", metavar="NAME", help="check only this provider, strictly")
    return parser


def _price(text: str) -> tuple[str, float]:
    """``NAME=USD``: a group's or a lifecycle's price of an instance-hour."""
    name, equals, value = text.partition("=")
    if not equals or not name.strip():
        raise argparse.ArgumentTypeError(f"expected GROUP_OR_LIFECYCLE=USD_PER_HOUR, got {text!r}")
    return name.strip(), non_negative_seconds(value)


def _add_provider_options(
    parser: argparse.ArgumentParser,
    pm: pluggy.PluginManager | None,
    provider: type[Provider] | None,
) -> None:
    parser.add_argument("--provider", required=True, metavar="NAME", help="instance group provider")
    if provider is not None and pm is not None:
        group = parser.add_argument_group(f"{provider.name} provider options")
        pm.hook.spotring_add_provider_options(provider=provider, group=group)
        # What the provider gets of the parsed options: only these (provider_options).
        own = tuple(action.dest for action in group._group_actions)
        parser.set_defaults(**{_PROVIDER_DESTS: own})


_PROVIDER_DESTS = "_spotring_provider_dests"
"""Where the parsed options keep the names of the provider's own options."""


def provider_options(options: argparse.Namespace) -> argparse.Namespace:
    """The provider's own options of ``options``: what its option group added."""
    own = getattr(options, _PROVIDER_DESTS, ())
    return argparse.Namespace(**{dest: getattr(options, dest) for dest in own})


def core_options(options: argparse.Namespace) -> CoreOptions:
    """What a provider may read of spotring's own options (``run`` or ``discover``)."""
    return CoreOptions(
        slots_per_host=options.slots_per_host,
        num_proc=getattr(options, "num_proc", None),  # `discover` has no -np
        resize=not getattr(options, "no_resize", False),  # nor --no-resize
    )


def make_groups(provider: type[Provider], options: argparse.Namespace) -> tuple[Provider, ...]:
    """The job's groups, one provider each (``provider.groups_from_options``: one per
    ``--group``, in the user's order), made from the provider's own options and the
    typed core ones, never the whole command line."""
    return job_groups(
        provider.groups_from_options(provider_options(options), core_options(options))
    )


def make_provider(provider: type[Provider], options: argparse.Namespace) -> Provider:
    """The provider of a job of one group. Deprecated: :func:`make_groups` (a job may
    have several groups, which no one provider stands for); several are a
    :class:`ConfigurationError` here."""
    warnings.warn(
        "spotring.autoscaler.cli.make_provider is deprecated: use make_groups",
        DeprecationWarning,
        stacklevel=2,
    )
    groups = make_groups(provider, options)
    if len(groups) > 1:
        raise ConfigurationError("a job of several groups has no one provider: use make_groups")
    return groups[0]


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
        "--return-after",
        type=non_negative_seconds,
        default=DEFAULT_RETURN_AFTER,
        metavar="SECONDS",
        help="a host that fell back to a later group is handed back (at a commit, one at "
        "a time) once a preferred group has capacity again, not before it has been there "
        "this long (default: %(default).0f)",
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


# ------------------------------------------------------------------ parsing


def parse(
    argv: Sequence[str], pm: pluggy.PluginManager
) -> tuple[argparse.Namespace, type[Provider] | None]:
    """Parse ``argv`` in two passes; returns the options and the chosen provider class."""
    argv = list(argv)
    command_args, job = _split_job(argv)
    probe = _Parser(prog=PROG, add_help=False)
    probe.add_argument("--provider")
    known, _ = probe.parse_known_args(command_args)
    provider_cls: type[Provider] | None = None
    if known.provider is not None:
        try:
            provider_cls = provider_registry(pm).get(known.provider)
        except KeyError as error:
            raise UsageError(f"{PROG}: error: {error.args[0]}") from None
    options = build_parser(pm, provider_cls, job is not None).parse_args(command_args)
    if options.command == "run":
        options.job = _job_command(options.job, job)
        _check_elastic(options)
        options.durable = _durable_options(options)
    return options, provider_cls


def _split_job(argv: list[str]) -> tuple[list[str], list[str] | None]:
    if "--" in argv:
        index = argv.index("--")
        return argv[:index], argv[index + 1 :]
    return argv, None


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


# ----------------------------------------------------------------- commands


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``spotring`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        pm = get_plugin_manager()
        options, provider_cls = parse(argv, pm)
    except UsageError as error:
        _error(error)
        return EXIT_USAGE
    except Exception as error:  # a broken plugin: say which, without a traceback
        _error(f"{PROG}: error: could not load plugins: {error}")
        return EXIT_FAILURE
    logging.basicConfig(
        level=options.log_level.upper(), format="spotring: %(levelname)s %(name)s: %(message)s"
    )
    # urllib3 warns on every connection retry (the cloud SDKs' own retries, and
    # google-auth's background lookups); spotring reports the failures that matter.
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    if options.command == "providers":
        return _list_providers(pm)
    if options.command == "check":
        from spotring.autoscaler.check import run_check

        return run_check(provider_registry(pm), options.provider)
    if options.command == "report":
        from spotring.autoscaler.report import ReportError, write_report

        try:
            print(write_report(options.events, options.output, options.price_spot,
                               options.price_on_demand, dict(options.prices)))  # fmt: skip
        except ReportError as error:
            _error(f"{PROG} report: error: {error}")
            return EXIT_USAGE
        return 0
    assert provider_cls is not None
    try:
        groups = make_groups(provider_cls, options)
    except ConfigurationError as error:
        _error(f"{PROG} {options.command}: error: {error}")
        return EXIT_USAGE
    try:
        if options.command == "discover":
            return _discover(groups)
        return _run(options, groups, pm)
    except UsageError as error:
        _error(error)
        return EXIT_USAGE
    except ConfigurationError as error:
        _error(f"{PROG} {options.command}: error: {error}")
        return EXIT_USAGE
    except ProviderError as error:
        _error(f"{PROG} {options.command}: error: {error}")
        return EXIT_FAILURE
    except HorovodSetupError as error:
        _error(f"{PROG} {options.command}: error: {error}")
        return EXIT_FAILURE
    except KeyboardInterrupt:
        _error(f"{PROG}: interrupted")
        return 130
    finally:
        for group in groups:
            group.close()


def _list_providers(pm: pluggy.PluginManager) -> int:
    registry = provider_registry(pm)
    width = max((len(name) for name in registry.names()), default=0)
    for provider in registry:
        print(f"{provider.name:<{width}}  {provider.description}  ({provider.__module__})")
    return 0


def _discover(groups: Sequence[Provider]) -> int:
    """One listing, printed as horovodrun's discovery script format.

    A failed listing exits non-zero with nothing on stdout: horovodrun keeps its last
    host set when the script fails, instead of seeing "no hosts".
    """
    inventory = Inventory(tuple(list_members(groups, {})))
    sys.stdout.write(Inventory.format_hosts(inventory.hosts_and_slots()))
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _run(options: argparse.Namespace, groups: Sequence[Provider], pm: pluggy.PluginManager) -> int:
    try:
        forwarded = parse_forwarded(options.forward_env, os.environ)
    except ValueError as error:
        raise UsageError(f"{PROG} run: error: {error}") from None
    if options.on_demand_base and len(groups) == 1:
        raise UsageError(
            f"{PROG} run: error: --on-demand-base needs a job of several groups "
            "(the last one on-demand): give --group more than once"
        )
    config = JobConfig(
        command=tuple(options.job),
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
        capacity=CapacityOptions.probing_after(
            options.probe_after,
            fallback_after=options.fallback_after,
            on_demand_base=options.on_demand_base,
            return_after=options.return_after,
        ),
    )
    # SIGTERM (a scheduler, `kill`) stops the job like Ctrl-C: workers first.
    signal.signal(signal.SIGTERM, _interrupt)
    outcome = run_job(config, groups, pm, ProgressReporter())
    if outcome.exit_code:
        _error(f"{PROG} run: job failed: {outcome.message}")
    return outcome.exit_code


def _durable_options(options: argparse.Namespace) -> DurableOptions | None:
    """``--checkpoint`` and its settings; a URI that cannot name a store (a bad form, a
    missing SDK) is a usage error now, before anything starts."""
    if options.checkpoint is None:
        return None
    from spotring.checkpoint import CheckpointError, open_store

    try:
        store = open_store(options.checkpoint)
    except CheckpointError as error:
        raise UsageError(f"{PROG} run: error: --checkpoint: {error}") from None
    return DurableOptions(
        uri=store.uri,
        every=options.checkpoint_every,
        keep=options.checkpoint_keep,
        job_id=job_id(options.job),
    )


def job_id(command: Sequence[str]) -> str:
    """The job's name in its checkpoints: the same training command is the same job."""
    return hashlib.sha256("\0".join(command).encode()).hexdigest()[:16]


if __name__ == "__main__":
    sys.exit(main())
