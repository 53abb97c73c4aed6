"""A Jobs API call that gets no answer: ``JobsApiTimeout`` (an outage) and ``Unanswered``, which fails the next
calls at once for ``ray.request_timeout_s``. Kept apart from ``ray_client`` so it imports without ray."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


class JobsApiTimeout(TimeoutError):
    """A call to the Jobs API got no answer within ``ray.request_timeout_s``: an outage (``faults.is_outage``)."""


@dataclass
class Unanswered:
    """When the dashboard at ``address`` last left a call unanswered: for ``timeout_s`` after that, calls fail at once
    (``JobsApiTimeout``) instead of waiting out the timeout again."""

    address: str
    timeout_s: float
    monotonic: Callable[[], float] = time.monotonic
    since: float | None = None  # the last timeout; None once a call was answered

    def before(self, call: str) -> None:
        """Raise ``JobsApiTimeout`` when the dashboard timed out less than ``timeout_s`` ago: ``call`` is not sent."""
        if self.since is None:
            return
        ago = self.monotonic() - self.since
        if ago < self.timeout_s:
            raise JobsApiTimeout(
                f"the Ray Jobs API at {self.address} left a call unanswered {ago:.1f}s ago (ray.request_timeout_s "
                f"{self.timeout_s:g}s): {call} not sent, the dashboard is asked again in {self.timeout_s - ago:.1f}s"
            )

    def timed_out(self, call: str) -> JobsApiTimeout:
        """The error for ``call``, unanswered within ``timeout_s``; the calls of the next ``timeout_s`` fail fast."""
        self.since = self.monotonic()
        return JobsApiTimeout(
            f"the Ray Jobs API at {self.address} did not answer {call} within {self.timeout_s:g}s "
            "(ray.request_timeout_s): its dashboard is down, overloaded or unreachable from here. Check the head "
            f"(ray status there; curl {self.address}/api/version from here), or raise ray.request_timeout_s if the "
            "dashboard is only slow"
        )

    def answered(self) -> None:
        self.since = None
