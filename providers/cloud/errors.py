"""A cloud's failures in one line: API messages shaped for it, and the retryable error
of an answer broken as a whole."""

from __future__ import annotations

from spotring.providers.base import ProviderError


def one_line(text: object, limit: int = 200) -> str:
    """``text`` on one line, at most ``limit`` characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


class MalformedAnswer(ProviderError):
    """The cloud answered ``call_name``, but with an answer broken as a whole: the list
    of members (or a page of it) is missing, a member or VM comes without the id that
    says whose it is, or a value has the wrong type.

    A refresh built on such an answer would show members in the wrong state, or none,
    so the whole listing fails instead, and the controller keeps the last good inventory.
    (A member that lacks only its own fields, a state or a running VM's address, costs
    only itself: the provider lists it as not usable, warned once with
    :class:`~spotring.providers.cloud.episodes.EpisodeWarnings`.) Retryable: the next
    answer may be whole. Raised inside a call given to
    :meth:`~spotring.providers.cloud.group_provider.CloudGroupProvider.call_api` it is
    retried there like a network failure.
    """

    def __init__(self, call_name: str, problem: str) -> None:
        super().__init__(f"malformed answer to {call_name}: {one_line(problem, 160)}")
