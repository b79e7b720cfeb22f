"""One replica as the client sees it: its connection, what it said it is, its scheduler,
and whether it is sitting out after a failure.

A replica that fails (no connection, 5xx or 429 past its retries) sits out for a
while and its holdings are forgotten: it may come back empty. After that it is
tried again by the next job routed to it, so a replica that returns gets work
(and, by rendezvous hashing, its spans) back without anyone telling the client.
"""

from __future__ import annotations

import logging
import time

import httpx

from minipic_client.errors import ConfigError, MiniPICError
from minipic_client.placement import Endpoint
from minipic_client.scheduler import Scheduler
from minipic_client.transport import Connection, RetryPolicy, root_url
from minipic_protocol import ServerInfo

logger = logging.getLogger("minipic_client")


class Replica:
    """A `Holder` for placement policies, once `attach` has given it a scheduler."""

    def __init__(
        self,
        endpoint: Endpoint,
        transport: httpx.AsyncBaseTransport,
        retry: RetryPolicy,
        timeout: httpx.Timeout | float,
    ) -> None:
        self.endpoint = endpoint
        self.name = endpoint.name
        self.base_url = root_url(endpoint.url)
        self.http = httpx.AsyncClient(
            base_url=self.base_url, transport=transport, timeout=timeout, headers=endpoint.headers
        )
        self.conn = Connection(self.http, retry)
        self.info_checked_at = float("-inf")
        self.down_until = float("-inf")
        self._info: ServerInfo | None = None
        self._scheduler: Scheduler | None = None

    def attach(self, info: ServerInfo, scheduler: Scheduler) -> None:
        self._info, self._scheduler = info, scheduler

    @property
    def info(self) -> ServerInfo:
        if self._info is None:
            raise ConfigError("not connected: use `async with SpanClient(...)` or `await connect()`")
        return self._info

    @info.setter
    def info(self, info: ServerInfo) -> None:
        self._info = info

    @property
    def scheduler(self) -> Scheduler:
        if self._scheduler is None:
            raise ConfigError("not connected: use `async with SpanClient(...)` or `await connect()`")
        return self._scheduler

    @property
    def load(self) -> int:
        return self.scheduler.load

    @property
    def busy(self) -> int:
        return self.scheduler.busy

    def holds(self, key: bytes) -> bool:
        return self.scheduler.holds(key)

    def up(self, now: float) -> bool:
        return now >= self.down_until

    def sit_out(self, error: MiniPICError, seconds: float) -> None:
        """Take it out of placement for `seconds` and forget what it held."""
        if self.up(time.monotonic()):
            logger.warning("%s failed (%s): its work moves to the other replicas for %g s", self.name, error, seconds)
        self.down_until = time.monotonic() + seconds
        self.scheduler.forget()

    def __repr__(self) -> str:
        return f"Replica({self.name})"
