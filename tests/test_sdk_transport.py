"""Retries and error surfaces, with faults injected through httpx.MockTransport."""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import pytest

from minipic_client import (
    ConfigError,
    MiniPICError,
    RequestError,
    RetryPolicy,
    ServerError,
    SpanClient,
    StreamInterruptedError,
    TransportError,
)
from minipic_client.transport import Connection, _without_prompt_echo

pytest_plugins = ["sdk_fixtures"]  # fake_server, fake_client, client_tokenizer

FAST = RetryPolicy(attempts=3, total_s=5.0, initial_backoff_s=0.001, max_backoff_s=0.01)
DOCS = ["The mill stood by the river.\n", "The school had four rooms.\n"]


@pytest.fixture
async def warm_client(fake_client):
    """A connected client whose spans are prefilled: the next request is a final."""
    async with fake_client() as client:
        await client.rag(docs=DOCS, task="warm", max_tokens=1)
        yield client


@pytest.mark.parametrize("faults", [["503", "503"], ["drop"], ["429", "drop", "503"], ["shutdown"]])
async def test_transient_faults_are_retried_within_the_bound(fake_server, faults, fake_client):
    fake_server.faults.extend(faults)
    async with fake_client() as client:
        result = await client.rag(docs=DOCS, task="q", max_tokens=2)
    assert result.text == "t100 t101 "
    # One prefill request (the prefix and two spans) and a final, plus one more per fault.
    assert fake_server.http_requests == 2 + len(faults)


async def test_retries_stop_after_the_attempt_bound(fake_server, fake_client):
    fake_server.faults.extend(["503"] * 10)
    async with fake_client(retry=FAST) as client:
        with pytest.raises(ServerError) as caught:
            await client.rag(task="q")  # no documents: the prefix prefill is the only request
    assert caught.value.status_code == 503 and caught.value.message == "injected 503"
    assert len(fake_server.requests) == FAST.attempts


async def test_retries_stop_after_the_time_bound(fake_server, fake_client):
    fake_server.faults.extend(["drop"] * 1000)
    policy = RetryPolicy(attempts=1000, total_s=0.2, initial_backoff_s=0.01, max_backoff_s=0.02)
    async with fake_client(retry=policy) as client:
        with pytest.raises(TransportError, match="injected"):
            await client.rag(docs=DOCS, task="q")
    assert 2 < len(fake_server.requests) < 100


async def test_a_400_is_not_retried_and_carries_the_servers_message(fake_server, warm_client):
    client = warm_client
    fake_server.faults.append("400")
    with pytest.raises(RequestError) as caught:
        await client.rag(docs=DOCS, task="q")
    assert caught.value.status_code == 400 and caught.value.message == "injected 400"
    assert len(fake_server.of_kind("final")) == 2


@pytest.mark.parametrize("faults", [["drop", "503"], ["shutdown", "shutdown"]])
async def test_a_stream_is_retried_before_its_first_chunk(fake_server, warm_client, faults):
    """Before its first token a stream can simply be sent again: also one the server ended
    with finish reason ``abort`` (vLLM aborts what is in flight when it shuts down)."""
    client = warm_client
    fake_server.faults.extend(faults)
    deltas = [d async for d in client.rag_stream(docs=DOCS, task="q", max_tokens=2)]
    assert deltas == ["t100 ", "t101 "]
    assert len(fake_server.of_kind("final")) == 1 + 3


async def test_a_stream_is_not_retried_after_its_first_chunk(fake_server, warm_client):
    client = warm_client
    fake_server.faults.append("break")
    received = []
    with pytest.raises(StreamInterruptedError):
        async for delta in client.rag_stream(docs=DOCS, task="q", max_tokens=3):
            received.append(delta)
    assert received == ["t100 "]
    assert len(fake_server.of_kind("final")) == 1 + 1


def connection(handler) -> Connection:
    http = httpx.AsyncClient(base_url="http://fake", transport=httpx.MockTransport(handler))
    return Connection(http, FAST)


@pytest.mark.parametrize(
    ("status", "payload", "error", "message"),
    [
        (
            400,
            {"error": {"message": "bad prompt", "type": "BadRequestError", "code": 400}},
            RequestError,
            "bad prompt",
        ),
        (422, {"message": "flat message"}, RequestError, "flat message"),
        (404, {"detail": "Not Found"}, RequestError, "Not Found"),
        (500, {"error": {"message": "engine died"}}, ServerError, "engine died"),
    ],
)
async def test_error_bodies_surface_the_servers_message(status, payload, error, message):
    conn = connection(lambda request: httpx.Response(status, json=payload))
    with pytest.raises(error) as caught:
        await conn.post_json("/v1/completions", {})
    assert caught.value.status_code == status and caught.value.message == message


SSE = {"content-type": "text/event-stream"}


async def test_an_error_event_inside_a_stream_is_raised():
    body = b'data: {"error": {"message": "generation failed", "code": 400}}\n\ndata: [DONE]\n\n'
    conn = connection(lambda request: httpx.Response(200, headers=SSE, content=body))
    with pytest.raises(RequestError, match="generation failed"):
        async for _ in conn.stream("/v1/completions", {}):
            pass


def sse(*events: dict) -> bytes:
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


USAGE = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 0}}
TOKEN = {"choices": [{"index": 0, "text": "a", "token_ids": [7], "finish_reason": None}]}
FINISHED = {"choices": [{"index": 0, "text": "a", "token_ids": [7], "finish_reason": "length"}]}


async def test_a_stream_stopped_before_its_first_token_is_sent_again():
    """vLLM drops the ``abort`` of a request stopped before its first token: what comes is only
    the usage and ``[DONE]``. That is no answer, so it is sent again like a dropped connection."""
    bodies = [sse(USAGE), sse(FINISHED, USAGE)]
    conn = connection(lambda request: httpx.Response(200, headers=SSE, content=bodies.pop(0)))
    assert [e async for e in conn.stream("/v1/completions", {})] == [FINISHED, USAGE] and not bodies


async def test_a_stream_whose_answer_never_finished_is_interrupted_not_short():
    conn = connection(lambda request: httpx.Response(200, headers=SSE, content=sse(TOKEN, USAGE)))
    with pytest.raises(StreamInterruptedError, match="ended before its answer finished"):
        async for _ in conn.stream("/v1/completions", {}):
            pass


async def test_a_stream_that_only_ever_stops_fails_with_one_line():
    conn = connection(lambda request: httpx.Response(200, headers=SSE, content=sse(USAGE)))
    with pytest.raises(TransportError, match="ended before its answer finished") as failed:
        async for _ in conn.stream("/v1/completions", {}):
            pass
    assert "\n" not in str(failed.value)


@pytest.mark.parametrize(
    ("headers", "body", "message"),
    [
        ({"content-type": "text/html"}, b"<html>proxy</html>", "Content-Type to contain 'text/event-stream'"),
        (SSE, b"data: {not json\n\n", "malformed stream event"),
        (SSE | {"content-encoding": "gzip"}, b"not gzip", "unreadable answer"),
    ],
)
async def test_an_unreadable_stream_is_a_server_error(headers, body, message):
    conn = connection(lambda request: httpx.Response(200, headers=headers, content=body))
    with pytest.raises(ServerError, match=message) as caught:
        async for _ in conn.stream("/v1/completions", {}):
            pass
    assert caught.value.status_code == 502


async def test_an_unreachable_server_raises_a_transport_error():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    with pytest.raises(TransportError, match="connection refused"):
        await connection(refuse).get_json("/minipic/info")


@pytest.mark.parametrize("fault", ["break", "cut", "shutdown-midway"])
async def test_a_stream_that_breaks_midway_is_asked_again_by_rag(fake_server, warm_client, fault):
    """rag hands nothing out before the end, so a broken stream (a restart) is simply re-sent;
    one closed cleanly before ``[DONE]`` (a killed server) or ended with finish reason ``abort``
    (a server shutting down) is broken too, not a shorter answer."""
    client = warm_client
    fake_server.faults.extend([fault, "drop"])
    result = await client.rag(docs=DOCS, task="q", max_tokens=3)
    assert result.token_ids == [100, 101, 102] and result.text == "t100 t101 t102 "
    assert len(fake_server.of_kind("final")) == 1 + 3


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("127.0.0.1:8000", "must start with http:// or https://"),
        ("localhost:8000", "must start with http:// or https://"),
        ("ftp://host", "must start with http:// or https://"),
        ("http://", "name a host"),
    ],
)
def test_a_url_that_is_not_a_server_url_is_named(url, message):
    with pytest.raises(ConfigError, match=message):
        SpanClient(url)


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
async def test_an_openai_style_url_is_accepted(fake_server, client_tokenizer, suffix):
    seen: list[str] = []

    async def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return await fake_server.handle(request)

    transport = httpx.MockTransport(handle)
    async with SpanClient(f"http://fake{suffix}", transport=transport, tokenizer=client_tokenizer) as client:
        await client.rag(task="q", max_tokens=1)
    assert seen[0] == "/minipic/info" and set(seen[1:]) == {"/v1/completions"}


async def test_a_stock_vllm_server_is_named_as_not_a_minipic_server():
    transport = httpx.MockTransport(lambda request: httpx.Response(404, json={"detail": "Not Found"}))
    with pytest.raises(ConfigError, match=r"http://stock:8000/ is not a MiniPIC server: .*404 \(Not Found\)"):
        async with SpanClient("http://stock:8000", transport=transport, retry=FAST):
            pass


def test_every_error_the_sdk_raises_is_a_minipic_error():
    """One exception tree: `except MiniPICError` catches everything the SDK raises."""
    import minipic_client

    public = [getattr(minipic_client, name) for name in minipic_client.__all__]
    errors = [obj for obj in public if isinstance(obj, type) and issubclass(obj, BaseException)]
    assert len(errors) >= 10 and all(issubclass(e, MiniPICError) for e in errors)


async def test_the_first_contact_gives_up_sooner_than_a_running_client(fake_server, client_tokenizer):
    """An address nothing answers at fails after connect_s; a server that goes away once
    connected (a restart) is waited for up to total_s."""
    policy = RetryPolicy(total_s=10.0, connect_s=0.3, initial_backoff_s=0.01, max_backoff_s=0.05)
    down_until = float("inf")

    async def handle(request: httpx.Request) -> httpx.Response:
        if time.monotonic() < down_until:
            raise httpx.ConnectError("connection refused (injected)")
        return await fake_server.handle(request)

    client = SpanClient("http://fake", transport=httpx.MockTransport(handle), retry=policy, tokenizer=client_tokenizer)
    started = time.monotonic()
    with pytest.raises(TransportError, match="connection refused"):
        await client.connect()
    assert time.monotonic() - started < 2

    down_until = time.monotonic() - 1
    async with client:
        down_until = time.monotonic() + 1.0  # three times connect_s
        result = await client.rag(docs=DOCS, task="q", max_tokens=2)
    assert result.token_ids == [100, 101]


@pytest.mark.parametrize("raised", [ConnectionResetError("reset by peer"), asyncio.TimeoutError()])
async def test_socket_errors_a_transport_leaves_unmapped_are_transport_errors(raised):
    def fail(request: httpx.Request) -> httpx.Response:
        raise raised

    with pytest.raises(TransportError):
        await connection(fail).get_json("/minipic/info")


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_a_refused_connection_is_named_once_in_words(client_tokenizer, caplog):
    """Through the real (aiohttp) transport and a real socket: before, this surfaced as
    ``ConnectTimeout("Cannot connect to host ... ssl:default ...")`` with a line per attempt."""
    url = f"http://127.0.0.1:{closed_port()}"
    policy = RetryPolicy(connect_s=0.5, initial_backoff_s=0.01, max_backoff_s=0.05)
    client = SpanClient(url, retry=policy, tokenizer=client_tokenizer)
    try:
        with caplog.at_level("WARNING", logger="minipic_client"), pytest.raises(TransportError) as caught:
            await client.connect()
    finally:
        await client.aclose()  # an unclosed session would be reported in a later test's log
    assert str(caught.value) == f"cannot connect to {url} (connection refused)"
    assert [r.getMessage() for r in caplog.records if r.name.startswith("minipic_client")] == [
        f"cannot connect to {url} (connection refused); retrying for up to 0.5 s"
    ]


async def test_an_outage_under_load_is_summarised_not_logged_per_retry(fake_server, client_tokenizer, caplog):
    """Many requests retrying through one outage (a restart) log its cause once and one
    line when the server answers again; before, a line per attempt (217 in one run)."""
    down = True

    async def handle(request: httpx.Request) -> httpx.Response:
        if down and request.url.path == "/v1/completions":
            raise httpx.ConnectError("[Errno 111] Connect call failed") from ConnectionRefusedError(111, "refused")
        return await fake_server.handle(request)

    policy = RetryPolicy(total_s=30.0, initial_backoff_s=0.005, max_backoff_s=0.02)
    client = SpanClient("http://fake", transport=httpx.MockTransport(handle), retry=policy, tokenizer=client_tokenizer)
    async with client:

        async def come_back() -> None:
            nonlocal down
            await asyncio.sleep(0.3)
            down = False

        with caplog.at_level("WARNING", logger="minipic_client"):
            results = await asyncio.gather(
                come_back(), *(client.rag(docs=DOCS, task=f"q{i}", max_tokens=1) for i in range(8))
            )
    assert all(r.text for r in results[1:])
    # The client's own lines only (an event loop's "Unclosed client session" may land here too).
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("minipic_client")]
    assert messages[0] == "cannot connect to http://fake (connection refused); retrying for up to 30 s"
    assert len(messages) == 2, messages
    assert re.fullmatch(r"the server answers again after 0\.\d s \(\d+ requests retried\)", messages[1])
    retried = int(re.search(r"\((\d+) requests", messages[1])[1])
    assert retried > 8  # every request retried, most of them more than once


@pytest.mark.parametrize(
    "event",
    [
        {"choices": [{"index": 0, "text": 'say "prompt_token_ids":[1] ]', "prompt_token_ids": [7, 8, 9],
                      "token_ids": [5]}], "usage": None},
        {"choices": [{"index": 0, "text": "a", "prompt_token_ids": [], "token_ids": []}]},
        {"choices": [{"index": 0, "text": "b", "prompt_token_ids": None, "token_ids": [3]}]},
        {"choices": [{"index": 0, "text": "c", "token_ids": [3]}]},
    ],
)
def test_a_streamed_event_reads_the_same_without_the_echoed_prompt(event: dict) -> None:
    """The first event's echoed prompt token ids (which the client never reads) are cut before
    parsing; every other field, and text that quotes the key, reads as before."""
    for data in (json.dumps(event, separators=(",", ":")), json.dumps(event)):
        parsed = json.loads(_without_prompt_echo(data))
        expected = json.loads(data)
        if "prompt_token_ids" in expected["choices"][0] and data.find('"prompt_token_ids":[') >= 0:
            expected["choices"][0]["prompt_token_ids"] = None
        assert parsed == expected
