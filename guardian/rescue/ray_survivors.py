"""What a stopped Ray job left alive (actors not DEAD, found by the Ray job id) and whether the relaunch may go ahead.

``verdict`` is pure: a survivor holding anything besides CPU and memory blocks the relaunch; CPU-only ones are
reported. Ray is imported only by ``StateApi``, whose reads are bounded by ``ray.request_timeout_s``."""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from guardian.config import RAY_REQUEST_TIMEOUT_S

# resources a survivor may hold without blocking a relaunch (a few CPUs are not what a trainer waits on)
NOT_BLOCKING = frozenset({"CPU", "memory", "object_store_memory"})


@dataclass(frozen=True, slots=True)
class Survivor:
    """One actor of the job still alive."""

    actor_id: str
    class_name: str
    state: str
    detached: bool
    name: str | None = None
    namespace: str | None = None
    node_id: str | None = None
    node_ip: str | None = None
    pid: int | None = None
    resources: Mapping[str, float] = field(default_factory=dict)

    def held(self) -> dict[str, float]:
        """Its resources by base name (an actor in a placement group holds ``GPU_group_<pg>``, ``GPU_group_0_<pg>``:
        one GPU, counted once)."""
        held: dict[str, float] = {}
        for key, amount in self.resources.items():
            base = key.split("_group_", 1)[0]
            held[base] = max(held.get(base, 0.0), float(amount))
        return held

    def blocking(self) -> dict[str, float]:
        """What it holds that a relaunched trainer may wait for."""
        return {k: v for k, v in self.held().items() if k not in NOT_BLOCKING and v > 0}

    def label(self) -> str:
        who = f"{self.class_name} {self.name!r}" if self.name else self.class_name
        where = f" pid {self.pid}" if self.pid else ""
        where += f" on {self.node_ip or self.node_id}" if self.node_ip or self.node_id else ""
        kind = "detached" if self.detached else "owned"
        return f"{who} ({kind} actor {self.actor_id[:12]}{where}, holds {_amounts(self.held())})"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the survivors mean for the relaunch."""

    survivors: tuple[Survivor, ...]
    blocking: tuple[Survivor, ...]

    @property
    def relaunch(self) -> bool:
        return not self.blocking


def verdict(survivors: Iterable[Survivor]) -> Verdict:
    alive = tuple(survivors)
    return Verdict(alive, tuple(s for s in alive if s.blocking()))


def still_settling(survivors: Sequence[Survivor]) -> bool:
    """Whether some survivor is an owned (non-detached) actor: those die with their driver, a moment after the job
    is terminal, so the survivors are read again before they count."""
    return any(not s.detached for s in survivors)


def per_node(survivors: Iterable[Survivor]) -> dict[str, dict[str, float]]:
    """The resources the survivors hold, summed per node."""
    nodes: dict[str, dict[str, float]] = {}
    for s in survivors:
        node = nodes.setdefault(s.node_ip or s.node_id or "unknown node", {})
        for key, amount in s.held().items():
            node[key] = node.get(key, 0.0) + amount
    return nodes


def kill_command(s: Survivor, address: str) -> str:
    """How a person stops one survivor: a named actor through a one-line Ray job (``ray.kill`` from inside the
    cluster; works from wherever the dashboard answers), an unnamed one by its pid on its node."""
    if s.name:
        namespace = json.dumps(s.namespace) if s.namespace is not None else "None"
        code = f"import ray; ray.init(); ray.kill(ray.get_actor({json.dumps(s.name)}, namespace={namespace}))"
        return f"ray job submit --address {address} -- python -c {shlex.quote(code)}"
    if s.pid:
        return f"kill -9 {s.pid} on {s.node_ip or s.node_id or 'its node'}"
    return f"ray list actors --address {address} --filter actor_id={s.actor_id} --detail (no pid yet: look again)"


def fields_of(v: Verdict, totals: Mapping[str, Mapping[str, float]]) -> dict[str, object]:
    """The ``event=job_survivors`` fields: the actors, what each node has held of its total."""
    nodes = per_node(v.survivors)
    held = "; ".join(f"{node}: {_amounts(use, totals.get(node, {}))}" for node, use in nodes.items())
    return {
        "actors": ",".join(s.actor_id[:12] for s in v.survivors),
        "names": ",".join(s.name or s.class_name for s in v.survivors),
        "detached": sum(s.detached for s in v.survivors),
        "held": held or "nothing",
        "blocking": len(v.blocking),
    }


def _amounts(use: Mapping[str, float], total: Mapping[str, float] | None = None) -> str:
    shown = {k: v for k, v in use.items() if k not in ("memory", "object_store_memory") and v > 0}
    if not shown:
        return "no CPU or GPU"
    of = total or {}
    return " ".join(f"{k}={v:g}" + (f"/{of[k]:g}" if k in of else "") for k, v in sorted(shown.items()))


class ClusterState(Protocol):
    """What the guardian reads of the cluster besides its jobs."""

    @property
    def address(self) -> str:
        """The dashboard's address (for the commands a line names)."""
        ...

    def survivors(self, job_id: str) -> list[Survivor]:
        """The actors of the Ray job ``job_id`` not DEAD. Raises ``RuntimeError`` when the cluster cannot say."""
        ...

    def node_totals(self) -> dict[str, dict[str, float]]:
        """Each live node's resources, by its IP."""
        ...


@dataclass(frozen=True, slots=True)
class StateApi:
    """``ClusterState`` through Ray's State API on the dashboard at ``address``, each read bounded by ``timeout_s``."""

    address: str
    timeout_s: float = RAY_REQUEST_TIMEOUT_S  # ray.request_timeout_s (Ray's own default is 30)

    def _timeout(self) -> int:
        """The State API takes whole seconds."""
        return max(1, math.ceil(self.timeout_s))

    def survivors(self, job_id: str) -> list[Survivor]:
        from ray.util.state import list_actors, list_nodes

        try:
            actors = list_actors(
                address=self.address,
                filters=[("job_id", "=", job_id), ("state", "!=", "DEAD")],
                detail=True,
                timeout=self._timeout(),
                raise_on_missing_output=False,
            )
            ips = {n.node_id: n.node_ip for n in list_nodes(address=self.address, timeout=self._timeout())}
        except Exception as exc:  # the State API raises its own exception types and aiohttp/requests ones
            raise self._unanswered(exc) from exc
        return [
            Survivor(
                actor_id=a.actor_id,
                class_name=a.class_name,
                state=str(a.state),
                detached=bool(a.is_detached),
                name=a.name or None,
                namespace=a.ray_namespace,
                node_id=a.node_id,
                node_ip=ips.get(a.node_id or ""),
                pid=a.pid or None,
                resources={str(k): float(v) for k, v in (a.required_resources or {}).items()},
            )
            for a in actors
        ]

    def node_totals(self) -> dict[str, dict[str, float]]:
        from ray.util.state import list_nodes

        try:
            nodes = list_nodes(address=self.address, detail=True, timeout=self._timeout())
        except Exception as exc:
            raise self._unanswered(exc) from exc
        return {
            n.node_ip: {str(k): float(v) for k, v in (n.resources_total or {}).items()}
            for n in nodes
            if str(n.state) == "ALIVE"
        }

    def _unanswered(self, exc: Exception) -> RuntimeError:
        return RuntimeError(
            f"Ray's State API at {self.address} did not answer within ray.request_timeout_s ({self.timeout_s:g}s) or "
            f"failed: {exc}"
        )
