"""HTTP to the server: JSON and SSE over httpx, errors mapped and retried with tenacity."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import httpx
from tenacity import (
    AsyncRetrying,
    before_sleep_log,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from minipic_client.errors import (
    APIError,
    RequestError,
    ServerError,
    StreamInterruptedError,
    TransportError,
)

logger = logging.getLogger("minipic_client")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with full jitter, bounded in attempts and in total time.

    Retried: connection errors, 429 and 5xx. A stream is retried only until its
    first chunk arrives.
    """

    attempts: int = 6
    total_s: float = 120.0
    initial_backoff_s: float = 0.25
    max_backoff_s: float = 8.0

    def retrying(self) -> AsyncRetrying:
        return AsyncRetrying(
            stop=stop_after_attempt(self.attempts) | stop_after_delay(self.total_s),
            wait=wait_random_exponential(multiplier=self.initial_backoff_s, max=self.max_backoff_s),
            retry=retry_if_exception_type((ServerError, TransportError)),
            before_sleep=before_sleep_log(logger, logging.WARNING),
            reraise=True,
        )


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
        self._retry = retry

    async def get_json(self, path: str) -> Any:
        return await self._retry.retrying()(self._send_json, "GET", path, None)

    async def post_json(self, path: str, body: dict[str, Any]) -> Any:
        return await self._retry.retrying()(self._send_json, "POST", path, body)

    async def stream(self, path: str, body: dict[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
        """SSE data events of a streaming POST. Retried until the first event arrives;
        a connection lost after it raises `StreamInterruptedError`."""
        opened: _Opened = await self._retry.retrying()(self._open_stream, path, body)
        response, events, first = opened
        try:
            yield first
            async for event in events:
                yield event
        except httpx.TransportError as exc:
            raise StreamInterruptedError(
                f"stream from {path} broke after its first chunk: {exc!r}"
            ) from exc
        finally:
            await events.aclose()
            await response.aclose()

    async def _send_json(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        try:
            response = await self._http.request(method, path, json=body)
        except httpx.TransportError as exc:
            raise TransportError(f"{method} {path}: {exc!r}") from exc
        _raise_for_status(response)
        try:
            return response.json()
        except ValueError as exc:
            raise ServerError(response.status_code, f"invalid JSON from {path}: {exc}") from exc

    async def _open_stream(self, path: str, body: dict[str, Any]) -> _Opened:
        request = self._http.build_request("POST", path, json=body)
        try:
            response = await self._http.send(request, stream=True)
        except httpx.TransportError as exc:
            raise TransportError(f"POST {path}: {exc!r}") from exc
        events = _sse_events(response)
        try:
            try:
                if not response.is_success:
                    await response.aread()
                    _raise_for_status(response)
                first = await anext(events)
            except httpx.TransportError as exc:
                raise TransportError(f"POST {path}: {exc!r}") from exc
            except StopAsyncIteration:
                raise TransportError(f"POST {path}: stream ended before its first chunk") from None
        except BaseException:
            await events.aclose()
            await response.aclose()
            raise
        return response, events, first


async def _sse_events(response: httpx.Response) -> AsyncGenerator[dict[str, Any], None]:
    """vLLM's server-sent events: ``data: {json}`` lines up to ``data: [DONE]``."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            event = json.loads(data)
        except ValueError as exc:
            raise ServerError(
                response.status_code, f"malformed stream event {data[:80]!r}"
            ) from exc
        error = event.get("error")
        if error is not None:
            raise _api_error(error.get("code") or 500, _message(event))
        yield event


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
