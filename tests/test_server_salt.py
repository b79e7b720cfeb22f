"""`minipic serve --require-cache-salt` on a real server: unsalted requests get a 400, salted ones run."""

from __future__ import annotations

import httpx
import pytest

from minipic_client import RequestError, SpanClient
from minipic_server.salt_policy import MISSING_SALT

from servers import RunningServer, ServerPool, ServerSpec

pytestmark = pytest.mark.server

SALTED = ServerSpec(extra_args=("--require-cache-salt",))


@pytest.fixture(scope="module")
def salted_server(server_pool: ServerPool) -> RunningServer:
    return server_pool.get(SALTED)


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/v1/completions", {"prompt": [1, 2, 3, 4], "max_tokens": 1}),
        ("/v1/completions", {"prompt": "Hello", "max_tokens": 1, "stream": True}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}),
        ("/v1/responses", {"input": "Hi", "max_output_tokens": 1}),
    ],
)
def test_an_unsalted_request_is_refused_and_a_salted_one_answered(salted_server, route, body):
    body = {"model": salted_server.model, **body}
    refused = httpx.post(salted_server.url + route, json=body, timeout=120)
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == MISSING_SALT
    answered = httpx.post(salted_server.url + route, json={**body, "cache_salt": "tenant-a"}, timeout=120)
    assert answered.status_code == 200, answered.text


async def test_the_sdk_names_the_requirement_and_works_with_a_salt(salted_server):
    async with SpanClient(salted_server.url) as client:
        with pytest.raises(RequestError, match=r"HTTP 400: this server requires a 'cache_salt'"):
            await client.rag(docs=["The mill is old.\n"], task="How old?", max_tokens=1)
    async with SpanClient(salted_server.url, cache_salt="tenant-a") as client:
        result = await client.rag(docs=["The mill is old.\n"], task="How old?", max_tokens=1)
    assert result.prompt_tokens > 0
