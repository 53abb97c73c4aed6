"""Ray's ``JobSubmissionClient`` with every request bounded by ``ray.request_timeout_s``.

``BoundedJobsClient`` adds ``timeout`` in ``SubmissionClient._do_request`` (Ray 2.60 passes none) and raises
``JobsApiTimeout`` naming the address, call and setting. Bounds the connect and each read, not a whole transfer.
Imports ray; only ``ray_jobs.connect`` imports this module. Why: docs/decisions/0053-bounded-ray-client.md."""

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
