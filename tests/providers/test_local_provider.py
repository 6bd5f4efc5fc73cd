"""The embedded local provider: contract, desired size, chaos."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from spotring.providers.base import ConfigurationError, InstanceState, Provider, ProviderError
from spotring.providers.conformance import ProviderContract
from spotring.providers.local import LocalProvider
from tests.fakes.scripted import ScriptedProvider, instance


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FailingLocalProvider(LocalProvider):
    """The local group behind an API that always fails."""

    def list_instances(self):  # type: ignore[no-untyped-def]
        raise ProviderError("simulated API outage")

    def set_target_size(self, size: int) -> None:
        raise ProviderError("simulated API outage")

    def replace_instance(self, instance_id: str) -> None:
        raise ProviderError("simulated API outage")


class TestLocalContract(ProviderContract):
    @pytest.fixture
    def provider(self) -> Provider:
        return LocalProvider(3, boot_seconds=0)

    @pytest.fixture
    def failing_provider(self) -> Provider:
        return FailingLocalProvider(2)


def states(provider: LocalProvider) -> dict[str, InstanceState]:
    return {i.id: i.state for i in provider.list_instances()}


def test_initial_hosts_are_ready_and_new_ones_boot() -> None:
    clock = Clock()
    provider = LocalProvider(2, boot_seconds=5, clock=clock)
    assert states(provider) == {"host-0": InstanceState.READY, "host-1": InstanceState.READY}
    provider.set_target_size(3)
    assert states(provider)["host-2"] is InstanceState.PENDING
    clock.now += 5
    assert states(provider)["host-2"] is InstanceState.READY


def test_shrinking_terminates_the_newest_hosts() -> None:
    provider = LocalProvider(3, boot_seconds=0)
    provider.set_target_size(1)
    assert states(provider) == {
        "host-0": InstanceState.READY,
        "host-1": InstanceState.GONE,
        "host-2": InstanceState.GONE,
    }
    # GONE is reported once, then the host is forgotten.
    assert states(provider) == {"host-0": InstanceState.READY}


def test_replace_keeps_the_desired_size() -> None:
    provider = LocalProvider(2, boot_seconds=0)
    provider.replace_instance("host-1")
    provider.replace_instance("host-1")  # idempotent
    assert states(provider) == {
        "host-0": InstanceState.READY,
        "host-1": InstanceState.GONE,
        "host-2": InstanceState.READY,
    }
    provider.replace_instance("host-9")  # unknown: nothing to do
    assert set(states(provider)) == {"host-0", "host-2"}


def test_scheduled_scale_up() -> None:
    clock = Clock()
    provider = LocalProvider(2, boot_seconds=1, scale_up_at=10, scale_up_to=4, clock=clock)
    clock.now += 9
    assert len(states(provider)) == 2
    clock.now += 1
    assert list(states(provider).values()).count(InstanceState.PENDING) == 2
    assert any("scaled up to 4" in what for _, what in provider.events)


def test_preemption_kills_the_hosts_workers_and_reports_it_gone() -> None:
    provider = LocalProvider(2, boot_seconds=60)
    worker = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        provider.worker_started("host-1", worker.pid)
        assert provider.preempt() == "host-1"
        assert worker.wait(timeout=5) == -signal.SIGKILL
        listed = states(provider)
        assert listed["host-1"] is InstanceState.GONE
        assert listed["host-2"] is InstanceState.PENDING, "the group launches a replacement"
    finally:
        if worker.poll() is None:
            worker.kill()


def test_timed_preemption() -> None:
    provider = LocalProvider(2, preempt_at=[0.05], preempt_host="host-0")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not provider.events:
        time.sleep(0.01)
    provider.close()
    assert states(provider)["host-0"] is InstanceState.GONE


def test_worker_on_a_host_that_is_going_is_killed() -> None:
    provider = LocalProvider(1)
    provider.set_target_size(0)
    worker = subprocess.Popen(["sleep", "60"], start_new_session=True)
    provider.worker_started("host-0", worker.pid)
    assert worker.wait(timeout=5) == -signal.SIGKILL


def test_bad_sizes_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError):
        LocalProvider(5, max_hosts=4)
    with pytest.raises(ConfigurationError, match="go together"):
        LocalProvider(1, scale_up_at=3)
    with pytest.raises(ConfigurationError):
        LocalProvider(1).set_target_size(-1)


def test_control_file_runs_chaos_on_demand(tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    control = tmp_path / "control"
    provider = LocalProvider(2, boot_seconds=0, control=str(control))
    assert len(states(provider)) == 2  # no file yet: nothing happens
    control.write_text("scale 3\n")
    assert len(states(provider)) == 3
    assert len(states(provider)) == 3, "a line runs once"
    with control.open("a") as stream:
        stream.write("preempt host-1\nbogus line\npreempt")  # the last line is incomplete
    listed = states(provider)
    assert listed["host-1"] is InstanceState.GONE
    assert "ignoring control line 'bogus line'" in caplog.text
    assert not any("host-0" in what and "preempted" in what for _, what in provider.events)
    with control.open("a") as stream:
        stream.write(" host-0\n")
    assert states(provider)["host-0"] is InstanceState.GONE
    assert [what for _, what in provider.events if what.startswith("chaos")] == [
        "chaos: group scaled to 3 hosts",
        "chaos: preempted host-1 (SIGKILL to its workers)",
        "chaos: preempted host-0 (SIGKILL to its workers)",
    ]


def test_control_lines_notice_and_preempt_every_host_at_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    control = tmp_path / "control"
    provider = LocalProvider(3, boot_seconds=0, notice_lead=60, control=str(control))
    try:
        assert set(states(provider).values()) == {InstanceState.READY}
        control.write_text("notice all\n")
        states(provider)
        noticed = [what for _, what in provider.events if "interruption notice" in what]
        assert len(noticed) == 3, noticed
        with control.open("a") as stream:
            stream.write("preempt all\n")
        listed = states(provider)
        gone = [name for name, state in listed.items() if state is InstanceState.GONE]
        assert sorted(gone) == ["host-0", "host-1", "host-2"]
    finally:
        provider.job_finished()


def test_the_metadata_service_says_nothing_when_a_client_hangs_up(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A worker that goes away mid-answer (it was killed) is no error: no traceback on
    stderr, which the driver relays as the job's output."""
    import http.client

    from spotring.providers.loopback_http import LoopbackHandler, LoopbackHTTPServer

    class Hangup(LoopbackHandler):
        def do_GET(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

    class Service(LoopbackHTTPServer):
        handler_class = Hangup

    with Service() as service:
        connection = http.client.HTTPConnection("127.0.0.1", service.port, timeout=5)
        connection.request("GET", "/")
        with pytest.raises((http.client.HTTPException, OSError)):
            connection.getresponse()
        connection.close()
        time.sleep(0.2)  # the handler thread runs on
    assert "Traceback" not in capfd.readouterr().err


# ------------------------------------------ declared capability: worker processes


class _Watching(ScriptedProvider):
    """Hears which worker process groups run where, when it declares it wants to."""

    def __init__(self) -> None:
        super().__init__([instance("host-0")])
        self.heard: list[tuple[str, str, int]] = []

    def worker_started(self, address: str, process_group: int) -> None:
        self.heard.append(("started", address, process_group))

    def worker_exited(self, address: str, process_group: int) -> None:
        self.heard.append(("exited", address, process_group))


class _Declares(_Watching):
    tracks_worker_processes = True


@pytest.mark.parametrize("provider_class", [_Watching, _Declares])
def test_the_launcher_tells_only_a_provider_that_declares_it_tracks_workers(
    provider_class: type[_Watching], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("horovod")

    import spotring.driver.elastic
    from spotring.autoscaler.job import JobConfig, run_job
    from spotring.autoscaler.observers.progress import ProgressReporter
    from spotring.autoscaler.plugins import get_plugin_manager
    from spotring.core import JobShape
    from spotring.driver.options import ElasticOptions

    def run_elastic(command, controller, launcher, *rest, **kwargs) -> None:  # type: ignore[no-untyped-def]
        # as when a worker starts and ends
        launcher._tell(lambda listener: listener.process_started("host-0", 4242))
        launcher._tell(lambda listener: listener.process_exited("host-0", 4242))

    monkeypatch.setattr(spotring.driver.elastic, "run_elastic", run_elastic)
    provider = provider_class()
    config = JobConfig(
        command=("true",),
        shape=JobShape(num_proc=1, min_num_proc=1, max_num_proc=1, resize=False),
        elastic=ElasticOptions(start_timeout=10),
        refresh_interval=0.05,
        launcher="local",
    )
    pm = get_plugin_manager(load_entry_points=False)

    outcome = run_job(config, provider, pm, ProgressReporter())

    assert outcome.exit_code == 0
    wanted = [("started", "host-0", 4242), ("exited", "host-0", 4242)]
    assert provider.heard == (wanted if provider_class.tracks_worker_processes else [])


def test_the_control_file_is_read_a_bounded_amount_at_a_time(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from spotring.providers.local.control import MAX_READ_BYTES, ControlFile

    path = tmp_path / "control"
    path.write_bytes(b"x" * (MAX_READ_BYTES + 10) + b"\nscale 3\n")
    control = ControlFile(path)
    assert control.new_lines() == []  # the overlong line is skipped, not held whole
    assert control.new_lines() == []  # ... up to its newline
    assert control.new_lines() == ["scale 3"]
    path.write_bytes(path.read_bytes() + b"preempt host-1\n")
    assert control.new_lines() == ["preempt host-1"]
