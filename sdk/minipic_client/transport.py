"""HTTP to the server: JSON and server-sent events over httpx, retried with tenacity.

`_httpx_errors` is the one place that knows httpx's exception tree: every httpx
error leaves this module as a `MiniPICError`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import httpx
from httpx_sse import EventSource, SSEError
from tenacity import (
    AsyncRetrying,
    before_sleep_log,
    retry_if_exception_type,
    stop_after_attempt,
    stop_before_delay,
    stop_never,
    wait_random_exponential,
)

from minipic_client.errors import (
    APIError,
    ConfigError,
    MiniPICError,
    RequestError,
    ServerError,
    StreamInterruptedError,
    TransportError,
)

logger = logging.getLogger("minipic_client")

# Status reported for answers that arrived but cannot be read (no HTTP status says it).
BAD_ANSWER_STATUS = 502


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with full jitter, bounded in time (and in attempts if given).

    Retried: connection errors, 429 and 5xx. Once connected, a request keeps
    trying for `total_s` (five minutes: a server restart, model loading
    included); the first contact gives up after `connect_s`, since an address
    nothing answers at is more likely a mistake than a restart. A stream is
    retried only until its first chunk arrives.
    """

    attempts: int | None = None
    total_s: float = 300.0
    connect_s: float = 30.0
    initial_backoff_s: float = 0.25
    max_backoff_s: float = 4.0

    def capped(self, seconds: float) -> RetryPolicy:
        """This policy, giving up after `seconds` at most."""
        return replace(self, total_s=min(self.total_s, seconds), connect_s=min(self.connect_s, seconds))

    def retrying(
        self,
        retried: tuple[type[MiniPICError], ...] = (ServerError, TransportError),
        *,
        quick: bool = False,
    ) -> AsyncRetrying:
        """A tenacity loop that retries `retried` errors within this policy's bounds."""
        attempts = stop_never if self.attempts is None else stop_after_attempt(self.attempts)
        total_s = min(self.connect_s, self.total_s) if quick else self.total_s
        return AsyncRetrying(
            stop=attempts | stop_before_delay(total_s),
            wait=wait_random_exponential(multiplier=self.initial_backoff_s, max=self.max_backoff_s),
            retry=retry_if_exception_type(retried),
            before_sleep=before_sleep_log(logger, logging.WARNING),
            reraise=True,
        )


def root_url(url: str) -> httpx.URL:
    """The server's root URL; an OpenAI-style ``.../v1`` suffix is dropped, anything
    that is not an http(s) URL with a host is refused with one line."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ConfigError(f"server URL {url!r} is not a URL: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigError(
            f"server URL {url!r} must start with http:// or https:// and name a host, "
            "e.g. http://127.0.0.1:8000"
        )
    path = parsed.path.rstrip("/")
    path = path.removesuffix("/v1")
    return parsed.copy_with(path=path or "/", query=None, fragment=None)


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    cached_tokens: int | None


def usage_of(event: dict[str, Any]) -> Usage | None:
    """The usage a completion response (or a stream's last event) reports, if any."""
    usage = event.get("usage")
    if not usage:
        return None
    details = usage.get("prompt_tokens_details") or {}
    return Usage(usage["prompt_tokens"], details.get("cached_tokens"))


# A stream whose first event arrived: the response, its remaining events, that event.
_Opened = tuple[httpx.Response, AsyncGenerator[dict[str, Any], None], dict[str, Any]]


class Connection:
    """One server's HTTP API; every method raises only `MiniPICError` subclasses."""

    def __init__(self, http: httpx.AsyncClient, retry: RetryPolicy) -> None:
        self._http = http
        self.retry = retry

    async def get_json(self, path: str, *, quick: bool = False) -> Any:
        """GET `path`; `quick`: retried for `connect_s` only (the first contact, restart checks)."""
        return await self.retry.retrying(quick=quick)(self._send_json, "GET", path, None, None)

    async def post_json(self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
        return await self.retry.retrying()(self._send_json, "POST", path, body, headers)

    async def stream(
        self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Data events of a streaming POST. Retried until the first event arrives; a
        connection lost after it raises `StreamInterruptedError`."""
        opened: _Opened = await self.retry.retrying()(self._open_stream, path, body, headers)
        response, events, first = opened
        try:
            yield first
            try:
                async for event in events:
                    yield event
            except TransportError as exc:
                raise StreamInterruptedError(f"stream from {path} broke after its first chunk: {exc}") from exc
        finally:
            await events.aclose()
            await response.aclose()

    async def _send_json(
        self, method: str, path: str, body: dict[str, Any] | None, headers: dict[str, str] | None
    ) -> Any:
        with _httpx_errors(f"{method} {path}"):
            response = await self._http.request(method, path, json=body, headers=headers)
        _raise_for_status(response)
        try:
            return response.json()
        except ValueError as exc:
            raise ServerError(response.status_code, f"invalid JSON from {path}: {exc}") from exc

    async def _open_stream(self, path: str, body: dict[str, Any], headers: dict[str, str] | None) -> _Opened:
        request = self._http.build_request("POST", path, json=body, headers=headers)
        with _httpx_errors(f"POST {path}"):
            response = await self._http.send(request, stream=True)
        events = _events(response, f"POST {path}")
        try:
            if not response.is_success:
                with _httpx_errors(f"POST {path}"):
                    await response.aread()
                _raise_for_status(response)
            first = await anext(events)
        except BaseException:
            await events.aclose()
            await response.aclose()
            raise
        return response, events, first


@contextmanager
def _httpx_errors(what: str) -> Iterator[None]:
    """httpx's errors as MiniPIC's: connection trouble is a `TransportError` (retried),
    a URL httpx cannot use a `ConfigError`, an unreadable answer a `ServerError`."""
    try:
        yield
    except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
        raise ConfigError(f"{what}: {exc}") from exc
    except (httpx.DecodingError, httpx.TooManyRedirects, SSEError) as exc:  # SSEError is an httpx.TransportError
        raise ServerError(BAD_ANSWER_STATUS, f"{what}: unreadable answer: {exc}") from exc
    except httpx.TransportError as exc:
        raise TransportError(f"{what}: {exc!r}") from exc
    except (OSError, asyncio.TimeoutError) as exc:  # what a transport (aiohttp's) may leave unmapped
        raise TransportError(f"{what}: {exc!r}") from exc


async def _events(response: httpx.Response, what: str) -> AsyncGenerator[dict[str, Any], None]:
    """vLLM's server-sent events as JSON objects, up to ``data: [DONE]``; an error
    event is raised as the error it reports, and a stream that ends without ``[DONE]``
    (a server killed mid-answer can close it cleanly) as a `TransportError`, never as a
    shorter answer."""
    with _httpx_errors(what):
        async for sse in EventSource(response).aiter_sse():
            if sse.data == "[DONE]":
                return
            try:
                event = json.loads(sse.data)
            except ValueError:
                raise ServerError(BAD_ANSWER_STATUS, f"{what}: malformed stream event {sse.data[:80]!r}") from None
            error = event.get("error")
            if error is not None:
                raise _api_error(error.get("code") or 500, _message(event))
            yield event
    raise TransportError(f"{what}: stream ended without [DONE]")


def _raise_for_status(response: httpx.Response) -> None:
    if response.is_success:
        return
    try:
        message = _message(response.json())
    except ValueError:
        message = response.text.strip()
    raise _api_error(response.status_code, message or response.reason_phrase)


def _message(payload: Any) -> str:
    """The server's words: vLLM's ``{"error": {"message"}}``, ``{"message"}`` or FastAPI's ``{"detail"}``."""
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        for key in ("message", "detail", "error"):
            if payload.get(key):
                return str(payload[key])
    return json.dumps(payload)


def _api_error(status: int, message: str) -> APIError:
    if status == 429 or status >= 500:
        return ServerError(status, message)
    return RequestError(status, message)
