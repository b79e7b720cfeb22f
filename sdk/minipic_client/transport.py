"""HTTP to the server: JSON and server-sent events over httpx, retried with tenacity.

`_httpx_errors` is the one place that knows httpx's exception tree: every httpx
error leaves this module as a `MiniPICError`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import AsyncGenerator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import httpx
import msgspec
from httpx_sse import EventSource, SSEError
from tenacity import (
    AsyncRetrying,
    RetryCallState,
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
_JSON = msgspec.json.Encoder()

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
        log: RetryLog,
        retried: tuple[type[MiniPICError], ...] = (ServerError, TransportError),
        *,
        quick: bool = False,
    ) -> AsyncRetrying:
        """A tenacity loop that retries `retried` errors within this policy's bounds,
        reporting them to `log`."""
        attempts = stop_never if self.attempts is None else stop_after_attempt(self.attempts)
        total_s = min(self.connect_s, self.total_s) if quick else self.total_s
        return AsyncRetrying(
            stop=attempts | stop_before_delay(total_s),
            wait=wait_random_exponential(multiplier=self.initial_backoff_s, max=self.max_backoff_s),
            retry=retry_if_exception_type(retried),
            before_sleep=lambda state: log.retrying(state, total_s),
            reraise=True,
        )


class RetryLog:
    """Retries summarised for the ``minipic_client`` logger: one warning per distinct
    problem while requests fail, one line once the server answers again, with how
    long that took and how many retries it cost; not a line per attempt (a server
    restart under load cost hundreds)."""

    def __init__(self) -> None:
        self._since: float | None = None
        self._problems: set[str] = set()
        self._retries = 0

    def retrying(self, state: RetryCallState, budget_s: float) -> None:
        problem = str(state.outcome.exception()) if state.outcome else "unknown error"
        if self._since is None:
            self._since = time.monotonic()
        self._retries += 1
        if problem not in self._problems:
            self._problems.add(problem)
            logger.warning("%s; retrying for up to %g s", problem, budget_s)

    def answered(self) -> None:
        """A request got through: close the current outage, if any, with its summary."""
        if self._since is None:
            return
        logger.warning(
            "the server answers again after %.1f s (%d %s retried)",
            time.monotonic() - self._since, self._retries, "request" if self._retries == 1 else "requests",
        )
        self._since, self._problems, self._retries = None, set(), 0


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
        self.log = RetryLog()
        url = http.base_url
        self._origin = f"{url.scheme}://{url.netloc.decode('ascii')}"

    async def get_json(self, path: str, *, quick: bool = False) -> Any:
        """GET `path`; `quick`: retried for `connect_s` only (the first contact, restart checks)."""
        return await self._retried(self._send_json, "GET", path, None, None, quick=quick)

    async def post_json(self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
        return await self._retried(self._send_json, "POST", path, body, headers)

    async def stream(
        self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Data events of a streaming POST. Retried until the first event arrives; a
        connection lost after it raises `StreamInterruptedError`."""
        opened: _Opened = await self._retried(self._open_stream, path, body, headers)
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

    async def _retried(self, send: Any, *args: Any, quick: bool = False) -> Any:
        result = await self.retry.retrying(self.log, quick=quick)(send, *args)
        self.log.answered()
        return result

    async def _send_json(
        self, method: str, path: str, body: dict[str, Any] | None, headers: dict[str, str] | None
    ) -> Any:
        with _httpx_errors(f"{method} {path}", self._origin):
            response = await self._http.request(method, path, **_json_request(body, headers))
        _raise_for_status(response)
        try:
            payload = response.json()
        except ValueError as exc:
            raise ServerError(response.status_code, f"invalid JSON from {path}: {exc}") from exc
        _raise_if_aborted(payload, f"{method} {path}")
        return payload

    async def _open_stream(self, path: str, body: dict[str, Any], headers: dict[str, str] | None) -> _Opened:
        request = self._http.build_request("POST", path, **_json_request(body, headers))
        with _httpx_errors(f"POST {path}", self._origin):
            response = await self._http.send(request, stream=True)
        events = _events(response, f"POST {path}", self._origin)
        try:
            if not response.is_success:
                with _httpx_errors(f"POST {path}", self._origin):
                    await response.aread()
                _raise_for_status(response)
            first = await anext(events)
        except BaseException:
            await events.aclose()
            await response.aclose()
            raise
        return response, events, first


@contextmanager
def _httpx_errors(what: str, origin: str) -> Iterator[None]:
    """httpx's errors as MiniPIC's: connection trouble is a `TransportError` (retried),
    a URL httpx cannot use a `ConfigError`, an unreadable answer a `ServerError`.
    A connection that cannot be opened says so, naming `origin` (the server) and the
    reason in words (httpx-aiohttp reports a refused connection as a ConnectTimeout
    whose text names TLS settings)."""
    try:
        yield
    except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
        raise ConfigError(f"{what}: {exc}") from exc
    except (httpx.DecodingError, httpx.TooManyRedirects, SSEError) as exc:  # SSEError is an httpx.TransportError
        raise ServerError(BAD_ANSWER_STATUS, f"{what}: unreadable answer: {exc}") from exc
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        reason = _os_reason(exc) or ("timed out" if isinstance(exc, httpx.ConnectTimeout) else str(exc))
        raise TransportError(f"cannot connect to {origin} ({reason})") from exc
    except (httpx.TransportError, OSError, asyncio.TimeoutError) as exc:  # OSError: what aiohttp leaves unmapped
        raise TransportError(f"{what}: connection to {origin} lost ({_os_reason(exc) or repr(exc)})") from exc


# The socket errors behind a failed request, in words.
_OS_REASONS: tuple[tuple[type[BaseException], str], ...] = (
    (ConnectionRefusedError, "connection refused"),
    (ConnectionResetError, "connection reset"),
    (socket.gaierror, "host not found"),
    (TimeoutError, "timed out"),
)


def _os_reason(exc: BaseException) -> str | None:
    """The first socket error in `exc`'s chain (aiohttp keeps it in ``os_error``), in words."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for kind, reason in _OS_REASONS:
            if isinstance(current, kind):
                return reason
        current = getattr(current, "os_error", None) or current.__cause__ or current.__context__
    return None


# Asked for token ids (`return_token_ids`: the generated ones are `RagResult.token_ids`), vLLM
# also echoes the whole prompt's in a stream's first event, which the client never reads: parsing
# them took 1.9 ms of a 35k-token prompt's time to first token on the 2-core VM.
_PROMPT_ECHO = '"prompt_token_ids":['


def _without_prompt_echo(data: str) -> str:
    """An event's JSON with its echoed prompt token ids as null. JSON escapes the quotes inside
    strings, so the quoted key can only be a key, and the list holds only integers, so its
    first ``]`` closes it; JSON laid out otherwise is parsed whole, as before."""
    start = data.find(_PROMPT_ECHO)
    if start < 0:
        return data
    end = data.find("]", start + len(_PROMPT_ECHO))
    return data[:start] + '"prompt_token_ids":null' + data[end + 1 :]


async def _events(response: httpx.Response, what: str, origin: str) -> AsyncGenerator[dict[str, Any], None]:
    """vLLM's server-sent events as JSON objects, up to ``data: [DONE]``; an error
    event is raised as the error it reports. A stream that ends without ``[DONE]`` (a
    server killed mid-answer can close it cleanly) or before every choice finished is a
    `TransportError`, never a shorter answer: vLLM drops the ``abort`` of a request stopped
    before its first token, leaving only the usage event and ``[DONE]``. Events without
    choices (the usage) are held until ``[DONE]`` shows the answer complete, so such a
    stream fails before its first event and is simply sent again."""
    seen: set[int] = set()
    finished: set[int] = set()
    held: list[dict[str, Any]] = []
    with _httpx_errors(what, origin):
        async for sse in EventSource(response).aiter_sse():
            if sse.data == "[DONE]":
                if not seen or seen - finished:
                    raise TransportError(f"{what}: the stream ended before its answer finished (request stopped?)")
                for event in held:
                    yield event
                return
            try:
                event = json.loads(_without_prompt_echo(sse.data))
            except ValueError:
                raise ServerError(BAD_ANSWER_STATUS, f"{what}: malformed stream event {sse.data[:80]!r}") from None
            error = event.get("error")
            if error is not None:
                raise _api_error(error.get("code") or 500, _message(event))
            _raise_if_aborted(event, what)
            choices = [c for c in event.get("choices") or () if isinstance(c, dict)]
            if not choices:
                held.append(event)
                continue
            for choice in choices:
                seen.add(choice.get("index", 0))
                if choice.get("finish_reason"):
                    finished.add(choice.get("index", 0))
            yield event
    raise TransportError(f"{what}: stream ended without [DONE]")


def _raise_if_aborted(payload: Any, what: str) -> None:
    """A choice vLLM ended with finish reason ``abort`` (it aborts every request in flight when
    it shuts down) has no complete answer: a `TransportError`, retried or failed over, never an
    answer cut short or empty."""
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if any(isinstance(c, dict) and c.get("finish_reason") == "abort" for c in choices or ()):
        raise TransportError(f"{what}: the server aborted the request (finish_reason 'abort'; it was shutting down?)")


def _raise_for_status(response: httpx.Response) -> None:
    if response.is_success:
        return
    try:
        message = _message(response.json())
    except ValueError:
        message = response.text.strip()
    raise _api_error(response.status_code, message or response.reason_phrase)


def _json_request(body: dict[str, Any] | None, headers: dict[str, str] | None) -> dict[str, Any]:
    """A request's JSON body and headers, encoded by msgspec: about ten times faster than the
    standard library (httpx's ``json=``) for a prompt of thousands of token ids, on the way to
    every first token (`benchmarks/request_overhead.py`)."""
    if body is None:
        return {"headers": headers}
    return {"content": _JSON.encode(body), "headers": {"content-type": "application/json", **(headers or {})}}


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
