"""The checks every cloud's module shares (terraform/aws, terraform/gcp, terraform/azure),
each parametrised over the clouds; what only one module has stays in its own file
(test_terraform.py for AWS and the checks of every .tf file, test_terraform_gcp.py,
test_terraform_azure.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.terraform.support import (
    VALID_INPUTS,
    assert_formatted,
    assert_software_versions_match_the_setup_script,
    assert_unit_runs_spotring_command,
    needs_terraform,
    plan_variables,
    run_module_tests,
    variables_only_copy,
)
from tests.terraform.test_terraform import (
    TERRAFORM,
    Module,
    _tf_files,
    assert_https_only_validations,
    assert_plan_outcome,
    https_url_cases,
    job_input_cases,
)


@dataclass(frozen=True)
class Cloud:
    """A cloud's module: ``name`` is its folder under terraform/ and spotring's provider,
    ``provider`` the hashicorp/<provider> `terraform test` mocks, ``named_by`` the
    resources spotring_command names, each with the variable or local its name is."""

    name: str
    provider: str
    named_by: dict[str, str]

    @property
    def directory(self) -> Path:
        return TERRAFORM / self.name

    @property
    def inputs(self) -> dict[str, Any]:
        return VALID_INPUTS[self.name]


CLOUDS = [
    Cloud("aws", "aws", {"aws_autoscaling_group.workers.name": "var.name"}),
    Cloud(
        "gcp", "google", {"google_compute_region_instance_group_manager.workers.name": "var.name"}
    ),
    Cloud(
        "azure",
        "azurerm",
        {
            "azurerm_orchestrated_virtual_machine_scale_set.workers.name": "var.name",
            "azurerm_resource_group.cluster.name": "local.resource_group_name",
        },
    ),
]
every_cloud = pytest.mark.parametrize("cloud", CLOUDS, ids=lambda cloud: cloud.name)


def cases(make: Callable[[Cloud], list[tuple[dict[str, Any], str | None]]]) -> list[Any]:
    """(cloud, overrides, refused) for each cloud and each of its cases, named
    CLOUD-N-REFUSED (REFUSED None where the inputs pass)."""
    return [
        pytest.param(cloud, overrides, refused, id=f"{cloud.name}-{n}-{refused}")
        for cloud in CLOUDS
        for n, (overrides, refused) in enumerate(make(cloud))
    ]


@pytest.fixture(scope="module")
def modules() -> dict[str, Module]:
    return {cloud.name: Module(cloud.directory) for cloud in CLOUDS}


@pytest.fixture(scope="module")
def variables_only(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Cloud], Path]:
    """A cloud's variables.tf alone, copied once: `terraform plan` there checks the
    validations (skips without a terraform binary)."""
    copies: dict[str, Path] = {}

    def copy(cloud: Cloud) -> Path:
        if cloud.name not in copies:
            copies[cloud.name] = variables_only_copy(tmp_path_factory, cloud.directory)
        return copies[cloud.name]

    return copy


# ------------------------------------------------------------------ the module as a whole


@every_cloud
def test_module_is_covered_by_the_generic_checks(cloud: Cloud) -> None:
    files = {p.name for p in _tf_files(cloud.directory)}
    assert {"versions.tf", "variables.tf", "outputs.tf"} <= files, files
    # test_terraform.py parametrizes its parse/reference/documentation checks over every
    # directory with .tf files under terraform/; this module must be one of them.
    assert cloud.directory in {p.parent for p in _tf_files()}


@every_cloud
def test_software_versions_match_the_setup_script(cloud: Cloud, modules: dict[str, Module]) -> None:
    """The hosts get the torch and Horovod that scripts/setup.sh tests against."""
    assert_software_versions_match_the_setup_script(modules[cloud.name])


@every_cloud
def test_only_https_urls_for_wheels_and_indexes(cloud: Cloud, modules: dict[str, Module]) -> None:
    assert_https_only_validations(modules[cloud.name])


# ------------------------------------------------------------------ the validations, by Terraform


@pytest.mark.parametrize(
    ("cloud", "overrides", "refused"), cases(lambda c: https_url_cases(c.name))
)
def test_url_validations(
    variables_only: Callable[[Cloud], Path],
    cloud: Cloud,
    overrides: dict[str, Any],
    refused: str | None,
) -> None:
    """http:// indexes and wheels, and a wheel without #sha256=, are refused at plan
    time (the bootstrap checks them again at boot)."""
    done = plan_variables(variables_only(cloud), {**cloud.inputs, **overrides})
    assert_plan_outcome(done, refused)


@pytest.mark.parametrize(("cloud", "overrides", "refused"), cases(lambda c: job_input_cases()))
def test_job_input_validations(
    variables_only: Callable[[Cloud], Path],
    cloud: Cloud,
    overrides: dict[str, Any],
    refused: str | None,
) -> None:
    done = plan_variables(variables_only(cloud), {**cloud.inputs, **overrides})
    assert_plan_outcome(done, refused)


# ------------------------------------------------------------------ the job under systemd


@needs_terraform
@every_cloud
def test_unit_runs_the_spotring_command(
    cloud: Cloud, modules: dict[str, Module], tmp_path: Path
) -> None:
    assert_unit_runs_spotring_command(modules[cloud.name], tmp_path, cloud.inputs, cloud.named_by)


# ------------------------------------------------------------------ terraform itself


@needs_terraform
@every_cloud
def test_terraform_fmt(cloud: Cloud) -> None:
    assert_formatted(cloud.directory)


@every_cloud
def test_terraform_cli(cloud: Cloud, tmp_path: Path) -> None:
    """`terraform test` of the module (its tests/plan.tftest.hcl, the provider mocked)."""
    run_module_tests(cloud.directory, cloud.provider, tmp_path)
