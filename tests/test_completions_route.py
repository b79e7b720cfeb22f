"""The completions route (`minipic_server.completions_route`): a body it parses itself gives the
request vLLM's route would have built, and every other body goes to vLLM's route.

The property test compares with what vLLM's route does, FastAPI's way: the standard library's
JSON, then vLLM's ``CompletionRequest`` (the installed release). The routing test serves a
FastAPI app in process, with vLLM's handler replaced by a recorder: which of the two answers."""

from __future__ import annotations

import json
import os
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm.entrypoints.openai.completion.protocol import CompletionRequest

from minipic_server import boundary, completions_route
from minipic_server.completions_route import token_prompt_request

from servers import RunningServer

EXAMPLES = int(os.environ.get("MINIPIC_PROPERTY_EXAMPLES", "2000"))

token = st.integers(min_value=0, max_value=200_000)
odd_id = st.one_of(st.integers(min_value=-5, max_value=-1), st.booleans(), st.floats(0, 5), st.text(max_size=2),
                   st.integers(min_value=2**63, max_value=2**70), st.none())  # fmt: skip
token_list = st.lists(token, min_size=1, max_size=6)
prompts = st.one_of(
    token_list,
    st.lists(token_list, min_size=1, max_size=4),
    st.lists(st.one_of(token, odd_id), min_size=0, max_size=6),  # ids vLLM may refuse, or coerce
    st.lists(st.lists(token, max_size=3), min_size=1, max_size=3),  # an empty inner prompt
    st.text(max_size=5),
    st.lists(st.text(max_size=3), max_size=3),
    st.none(),
)
values = st.one_of(st.none(), st.booleans(), st.integers(-3, 40), st.floats(-1, 3), st.text(max_size=3))
other_fields = st.dictionaries(
    st.sampled_from(["model", "max_tokens", "temperature", "stream", "n", "logprobs", "echo", "seed",
                     "return_token_ids", "cache_salt", "prompt_logprobs", "unknown_field"]),
    values,
    max_size=5,
)  # fmt: skip
stream_options = st.one_of(st.none(), st.just({"include_usage": True}), st.just({"include_usage": "x"}))


def stock(body: bytes) -> CompletionRequest | None:
    """What vLLM's route builds from `body` (None: it refuses it)."""
    try:
        return CompletionRequest.model_validate(json.loads(body))
    except Exception:
        return None


def same(a: CompletionRequest, b: CompletionRequest) -> bool:
    """Equal but for the request id each draws at random."""
    return a.model_dump(exclude={"request_id"}) == b.model_dump(exclude={"request_id"})


@settings(max_examples=EXAMPLES, deadline=None)
@given(prompt=prompts, fields=other_fields, options=stream_options, has_prompt=st.booleans())
def test_a_parsed_body_is_the_request_vllms_route_builds(
    prompt: Any, fields: dict[str, Any], options: Any, has_prompt: bool
) -> None:
    body = {**fields, **({"prompt": prompt} if has_prompt else {}), **({"stream_options": options} if options else {})}
    raw = json.dumps(body).encode()
    fast, expected = token_prompt_request(raw, CompletionRequest), stock(raw)
    if fast is not None:
        assert expected is not None and same(fast, expected)
    if expected is not None and has_prompt and sdk_shaped(prompt):
        assert fast is not None  # what the SDK sends never takes the slow path


def sdk_shaped(prompt: Any) -> bool:
    """Token ids, or lists of them, as the SDK sends its prompts."""
    def ids(p: Any) -> bool:
        return isinstance(p, list) and bool(p) and all(type(t) is int and t >= 0 for t in p)

    return ids(prompt) or isinstance(prompt, list) and bool(prompt) and all(ids(p) for p in prompt)


@pytest.mark.parametrize("body", [b"", b"[1, 2]", b'{"prompt": [1, 2', b'{"prompt": [NaN]}', b'\xff{"prompt": [1]}'])
def test_a_body_that_is_not_a_json_object_goes_to_vllm(body: bytes) -> None:
    assert token_prompt_request(body, CompletionRequest) is None


def routed_app(monkeypatch: pytest.MonkeyPatch, active: bool) -> tuple[FastAPI, list[str]]:
    """An app with a stand-in of vLLM's completion route, and the fast route in front of it."""
    answered: list[str] = []
    app = FastAPI()

    @app.post("/v1/completions")
    async def stock_route(request: CompletionRequest) -> JSONResponse:
        answered.append("vllm")
        return JSONResponse({"prompt": request.prompt})

    async def handler(request: CompletionRequest, raw_request: Request) -> JSONResponse:
        answered.append("fast")
        return JSONResponse({"prompt": request.prompt})

    monkeypatch.setattr(boundary, "create_completion", handler, raising=False)
    completions_route.attach(app, active=lambda request: active)
    return app, answered


@pytest.mark.parametrize(
    ("active", "body", "headers", "route"),
    [
        (True, {"prompt": [5, 6, 7]}, {}, "fast"),
        (True, {"prompt": [[5, 6], [7]]}, {}, "fast"),
        (True, {"prompt": [[5, 6], []]}, {}, "vllm"),  # an empty prompt among them: vLLM decides
        (True, {"prompt": "some text"}, {}, "vllm"),
        (True, {"prompt": [5, 6.0]}, {}, "vllm"),  # pydantic takes 6.0 as 6; the fast route does not
        (True, {"prompt": [5, 6]}, {"content-type": "application/json; charset=utf-8"}, "fast"),
        (False, {"prompt": [5, 6, 7]}, {}, "vllm"),
    ],
)
async def test_the_fast_route_answers_token_prompts_and_hands_the_rest_to_vllm(
    monkeypatch: pytest.MonkeyPatch, active: bool, body: dict[str, Any], headers: dict[str, str], route: str
) -> None:
    app, answered = routed_app(monkeypatch, active)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client:
        response = await client.post("/v1/completions", json=body, headers=headers)
    assert response.status_code == 200 and response.json() == {"prompt": body["prompt"]}
    assert answered == [route]


async def test_a_body_vllm_refuses_gets_vllms_own_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    app, answered = routed_app(monkeypatch, active=True)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client:
        refused = await client.post("/v1/completions", json={"prompt": [-1]})
        mixed = await client.post("/v1/completions", json={"prompt": [[5, 6], 7]})
        plain = {"content-type": "text/plain"}
        not_json = await client.post("/v1/completions", content=b'{"prompt": [1]}', headers=plain)
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"][:2] == ["body", "prompt"]
    assert mixed.status_code == 422 and mixed.json()["detail"][0]["loc"][:2] == ["body", "prompt"]
    assert not_json.status_code == 422 and answered == []


@pytest.mark.server
def test_a_served_token_prompt_answers_as_its_text_does(pic_server: RunningServer) -> None:
    """Through a real `minipic serve`: the prompt as text takes vLLM's route, as token ids (one
    prompt, and a list of two) the fast one; the answers agree, and an id vLLM's model refuses
    gets vLLM's own 400."""
    text = "Report: the river runs past the old mill and the school, then under the bridge"
    ids = httpx.post(pic_server.url + "/tokenize", json={"model": pic_server.model, "prompt": text}).json()["tokens"]
    body = {"model": pic_server.model, "max_tokens": 6, "temperature": 0.0, "return_token_ids": True}

    def answer(prompt: Any) -> list[list[int]]:
        response = httpx.post(pic_server.url + "/v1/completions", json={**body, "prompt": prompt}, timeout=120)
        response.raise_for_status()
        return [choice["token_ids"] for choice in response.json()["choices"]]

    by_text = answer(text)
    assert answer(ids) == by_text and answer([ids, ids]) == by_text * 2
    refused = httpx.post(pic_server.url + "/v1/completions", json={**body, "prompt": [ids[0], -1]}, timeout=120)
    assert refused.status_code == 400 and "prompt" in refused.json()["error"]["message"]
