"""The IAM action each AWS API call needs: the single list the provider, its errors, the
policy document and the docs' table (:mod:`spotring.providers.permissions`) read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

IAM_ACTION_BY_OPERATION: Mapping[str, str] = {
    "DescribeAutoScalingGroups": "autoscaling:DescribeAutoScalingGroups",
    "DescribeAutoScalingInstances": "autoscaling:DescribeAutoScalingInstances",
    "SetDesiredCapacity": "autoscaling:SetDesiredCapacity",
    "SetInstanceHealth": "autoscaling:SetInstanceHealth",
    "DetachInstances": "autoscaling:DetachInstances",
    "DescribeScalingActivities": "autoscaling:DescribeScalingActivities",
    "TerminateInstanceInAutoScalingGroup": "autoscaling:TerminateInstanceInAutoScalingGroup",
    "DescribeInstances": "ec2:DescribeInstances",
    "DescribeInstanceTypes": "ec2:DescribeInstanceTypes",
    "DescribeLaunchTemplateVersions": "ec2:DescribeLaunchTemplateVersions",
    "DescribeSpotPriceHistory": "ec2:DescribeSpotPriceHistory",
    "GetProducts": "pricing:GetProducts",
}
"""The IAM action each API operation the provider makes needs (the docs' table is
made from it: :mod:`spotring.providers.permissions`)."""

IAM_ACTIONS: tuple[str, ...] = tuple(IAM_ACTION_BY_OPERATION.values())
"""Every IAM action the provider calls; the policy of the role spotring runs as must
allow all of them (see :func:`iam_policy`)."""

IAM_STEERING_ACTIONS: tuple[str, ...] = (
    "autoscaling:SetDesiredCapacity",
    "autoscaling:SetInstanceHealth",
    "autoscaling:DetachInstances",
    "autoscaling:TerminateInstanceInAutoScalingGroup",
)
"""The actions that change the group; they accept the group's ARN as resource, while
the Describe* actions only accept ``"*"`` (Service Authorization Reference, "Actions
defined by Amazon EC2 Auto Scaling": the four name the ``autoScalingGroup`` resource
type; DescribeScalingActivities, DescribeAutoScalingGroups and EC2's Describe* name
none)."""


def iam_action(operation: str) -> str:
    """The IAM action ``operation`` needs, as errors name the failed call (the operation
    itself for one not in :data:`IAM_ACTION_BY_OPERATION`)."""
    return IAM_ACTION_BY_OPERATION.get(operation, operation)


def iam_policy(group_arn: str | Sequence[str] = "*") -> dict[str, Any]:
    """The least-privilege IAM policy document for :data:`IAM_ACTIONS`.

    :param group_arn: the group's ARN (or a list of them, for a job of several
        groups), to limit the steering actions to it; the Describe* actions only
        support ``"*"``.
    """
    describe = [a for a in IAM_ACTIONS if a not in IAM_STEERING_ACTIONS]
    resource = group_arn if isinstance(group_arn, str) else list(group_arn)
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "SpotringDescribe", "Effect": "Allow", "Action": describe, "Resource": "*"},
            {
                "Sid": "SpotringSteerGroup",
                "Effect": "Allow",
                "Action": list(IAM_STEERING_ACTIONS),
                "Resource": resource,
            },
        ],
    }
