"""What a job is made of, composed from typed options without a command line
(spotring.autoscaler.composition): its groups, its durable checkpoints, the rules that
span them."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from spotring.autoscaler.capacity import CapacityOptions
from spotring.autoscaler.composition import (
    check_capacity,
    compose_groups,
    durable_options,
    job_id,
)
from spotring.core import ConfigurationError, CoreOptions
from spotring.providers.base import Provider
from tests.fakes.scripted import ScriptedProvider


class Named(ScriptedProvider):
    """A group named by the options, as ``--group`` names them."""

    def __init__(self, group: str) -> None:
        super().__init__()
        self.group = group

    def group_name(self) -> str:
        return self.group

    @classmethod
    def groups_from_options(cls, options: argparse.Namespace, core: CoreOptions) -> list[Provider]:
        return [cls(name) for name in options.group]


def test_the_groups_are_made_from_the_providers_own_options_in_their_order() -> None:
    groups = compose_groups(Named, argparse.Namespace(group=["spot", "od"]), CoreOptions())
    assert [group.group_name() for group in groups] == ["spot", "od"]
    with pytest.raises(ConfigurationError, match="must differ"):
        compose_groups(Named, argparse.Namespace(group=["a", "a"]), CoreOptions())
    with pytest.raises(ConfigurationError, match="at least one group"):
        compose_groups(Named, argparse.Namespace(group=[]), CoreOptions())


def test_an_on_demand_base_needs_several_groups() -> None:
    one, two = [Named("spot")], [Named("spot"), Named("od")]
    with pytest.raises(ConfigurationError, match="--on-demand-base needs a job of several"):
        check_capacity(CapacityOptions(on_demand_base=1), one)
    check_capacity(CapacityOptions(on_demand_base=1), two)
    check_capacity(CapacityOptions(), one)


def test_durable_options_name_a_store_before_anything_starts(tmp_path: Path) -> None:
    assert durable_options(None, 60.0, 3, ["train"]) is None
    made = durable_options(str(tmp_path / "ckpt"), 30.0, 2, ["python", "train.py"])
    assert made is not None and (made.every, made.keep) == (30.0, 2)
    assert made.job_id == job_id(["python", "train.py"]) != job_id(["python", "other.py"])
    with pytest.raises(ConfigurationError, match=r"^--checkpoint: ") as refused:
        durable_options("ftp://x/y", 60.0, 3, ["train"])
    assert "\n" not in str(refused.value)
