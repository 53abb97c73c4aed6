"""Ray's ``JobSubmissionClient`` with every request bounded by ``ray.request_timeout_s``.

Ray 2.60's client sends every call (``submit_job``, ``stop_job``, ``get_job_info``, ``get_job_logs``, and the
version checks of its constructor) through ``SubmissionClient._do_request``, which calls ``requests.request()``
without a timeout and forwards any other keyword argument to it; the public methods pass none. So a dashboard whose
packets are dropped, or one that accepted the connection and hangs, holds the call until the kernel gives up on
the TCP connection (minutes). ``BoundedJobsClient`` adds ``timeout`` there, the one place every call goes through,
and turns requests' ``Timeout`` into ``JobsApiTimeout`` naming the address, the call and the setting.

requests bounds the connect and each wait for the next bytes of the answer, not the whole transfer: a long job
log that keeps arriving is read to its end, and a host name is resolved within the resolver's own limits.

This module imports ray: only ``ray_jobs.connect`` imports it, so guardian runs without ray.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import requests
from ray.job_submission import JobSubmissionClient

from guardian.rescue.ray_timeouts import Unanswered


class BoundedJobsClient(JobSubmissionClient):  # type: ignore[misc, unused-ignore]  # typed only with ray installed
    """A ``JobSubmissionClient`` whose every request is bounded by ``timeout_s`` (see the module docstring)."""

    def __init__(self, address: str, *, timeout_s: float, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._unanswered = Unanswered(address, timeout_s, monotonic)  # before the constructor's version checks
        super().__init__(address)

    def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> requests.Response:
        call = f"{method} {endpoint}"
        self._unanswered.before(call)
        kwargs.setdefault("timeout", self._unanswered.timeout_s)
        try:
            response: requests.Response = super()._do_request(method, endpoint, **kwargs)
        except requests.exceptions.Timeout as exc:  # ConnectTimeout (packets dropped) or ReadTimeout (no answer)
            raise self._unanswered.timed_out(call) from exc
        self._unanswered.answered()
        return response
