"""Where a job goes when a client has several replicas: endpoints and placement policies.

A replica's cache only serves prompts sent to it, and no router in front of the
replicas can tell which spans a prompt holds: span blocks hash on their own, not
chained from the prompt start as routers' prefix keys are. The client knows every
span it sends and where, so it places them itself. Policies are small frozen
objects that read a typed view of the replicas (`Holder`) and return a `Route`;
`SpanAffinity` is the default, `RoundRobin` is what a span-blind balancer would do.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from minipic_client.errors import ConfigError
from minipic_client.prompt import Prefill
from minipic_client.transport import root_url

DP_RANK_HEADER = "X-data-parallel-rank"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One place requests go: a server's base URL and, for one ``vllm serve
    --data-parallel-size N`` server, the engine rank vLLM's ``X-data-parallel-rank``
    header pins a request to (each rank has its own KV cache). `kv_events`: the ZMQ
    address its KV events are published on (``tcp://host:5557``), to follow what it
    really caches (`minipic_client.kv_events`)."""

    url: str
    dp_rank: int | None = None
    kv_events: str | None = None

    def __post_init__(self) -> None:
        root_url(self.url)  # a bad URL fails here, with its one line
        rank = self.dp_rank
        if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 0):
            raise ConfigError(f"dp_rank of {self.url} must be a non-negative int or None, got {rank!r}")
        if self.kv_events is not None and not str(self.kv_events).startswith(("tcp://", "ipc://")):
            raise ConfigError(f"kv_events of {self.url} must be a ZMQ address such as tcp://host:5557, "
                              f"got {self.kv_events!r}")

    @classmethod
    def ranks(cls, url: str, size: int) -> tuple[Endpoint, ...]:
        """The `size` data-parallel ranks of one server."""
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(f"data-parallel size must be at least 1, got {size!r}")
        return tuple(cls(url, rank) for rank in range(size))

    @property
    def name(self) -> str:
        """Stable across restarts, so a replica that returns gets its spans' hashes back."""
        base = str(root_url(self.url)).rstrip("/")
        return base if self.dp_rank is None else f"{base}#dp={self.dp_rank}"

    @property
    def headers(self) -> dict[str, str]:
        return {} if self.dp_rank is None else {DP_RANK_HEADER: str(self.dp_rank)}


def endpoints_of(servers: str | Endpoint | Sequence[str | Endpoint]) -> tuple[Endpoint, ...]:
    """A URL, an `Endpoint` or a list of them, as endpoints; none, or one twice, is refused."""
    items = [servers] if isinstance(servers, (str, Endpoint)) else list(servers)
    endpoints = tuple(e if isinstance(e, Endpoint) else Endpoint(e) for e in items)
    if not endpoints:
        raise ConfigError("no server given: pass a base URL or a list of them")
    names = [e.name for e in endpoints]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"endpoint given twice: {', '.join(twice)}")
    return endpoints


class Holder(Protocol):
    """What a policy reads of a replica."""

    @property
    def name(self) -> str: ...

    @property
    def load(self) -> int:
        """Tokens of the prefills it holds or is sending."""
        ...

    @property
    def busy(self) -> int:
        """Requests in flight there."""
        ...

    def holds(self, key: bytes) -> bool: ...


H = TypeVar("H", bound=Holder)


@dataclass(frozen=True, slots=True)
class Route(Generic[H]):
    """Where a job's missing prefills go, and where its final prompt goes."""

    prefill: H
    final: H


class Placement(Protocol):
    def route(self, prefills: Sequence[Prefill], replicas: Sequence[H]) -> Route[H]:
        """Choose among `replicas` (the live ones, never empty) for a job with `prefills`."""
        ...


def affinity_key(prefills: Sequence[Prefill]) -> str | None:
    """A job's key for a router's consistent hashing: its largest span's digest, so a
    job's requests stay together and prompts about the same main document meet."""
    spans = [p for p in prefills if p.kind == "span"]
    return max(spans, key=lambda p: len(p.token_ids)).key.hex() if spans else None


def weight(key: bytes, name: str) -> int:
    """Rendezvous weight of a span on a replica: every client computes the same one."""
    return int.from_bytes(hashlib.blake2b(key + name.encode(), digest_size=8).digest(), "big")


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """A span's home: the replica of highest `weight` whose load, with the span, stays
    within `load_factor` times the mean (else the least loaded). Highest-random-weight
    moves only the spans of a replica that leaves, and gives them back when it returns;
    the bound keeps a few large spans from piling onto one replica."""

    load_factor: float = 1.25

    def __post_init__(self) -> None:
        if not self.load_factor >= 1.0:
            raise ConfigError(f"load_factor must be at least 1.0, got {self.load_factor!r}")

    def home(self, prefill: Prefill, replicas: Sequence[H]) -> H:
        size = len(prefill.token_ids)
        ranked = sorted(replicas, key=lambda r: weight(prefill.key, r.name), reverse=True)
        bound = self.load_factor * (sum(r.load for r in replicas) + size) / len(replicas)
        for replica in ranked:
            if replica.load + size <= bound:
                return replica
        return min(ranked, key=lambda r: r.load)


@dataclass(frozen=True, slots=True)
class SpanAffinity:
    """The job goes where most of its span tokens are: held there, or (held nowhere
    yet) homed there by `homes`; its missing prefills are sent there first. Ties go
    to the less busy, then the less loaded replica. A prefix prefill (the system
    prompt every job shares) does not count: it would pull every job to one replica."""

    homes: Rendezvous = Rendezvous()

    def route(self, prefills: Sequence[Prefill], replicas: Sequence[H]) -> Route[H]:
        scores = [0] * len(replicas)
        for prefill in (p for p in prefills if p.kind == "span"):
            holders = [i for i, r in enumerate(replicas) if r.holds(prefill.key)]
            for i in holders or [replicas.index(self.homes.home(prefill, replicas))]:
                scores[i] += len(prefill.token_ids)
        best = max(range(len(replicas)), key=lambda i: (scores[i], -replicas[i].busy, -replicas[i].load))
        return Route(replicas[best], replicas[best])


@dataclass(frozen=True, slots=True)
class RoundRobin:
    """Span-blind placement, for comparison. By default a load balancer's: every request
    (prefill or final) to the next replica. ``per_job=True``: a client that spreads its
    calls, every job (its prefills and its final together) to the next replica, so a
    final finds what its own prefills sent, and each replica ends up prefilling every
    document it is ever asked about."""

    per_job: bool = False
    _turns: itertools.count[int] = field(default_factory=itertools.count, repr=False, compare=False)

    def route(self, prefills: Sequence[Prefill], replicas: Sequence[H]) -> Route[H]:
        prefill = replicas[next(self._turns) % len(replicas)]
        return Route(prefill, prefill if self.per_job else replicas[next(self._turns) % len(replicas)])
