"""``POST /v1/completions`` without per-token Python work for token-id prompts.

FastAPI parses vLLM's completion body with the standard library and validates every prompt
token as a pydantic field: 3.5 ms for a prompt of 35,000 token ids on the 2-core VM
(`benchmarks/request_overhead.py`), paid on the way to the first token of every question
over cached documents, however much of it is cached. This route shadows vLLM's (an endpoint
plugin may, by vLLM's plugin contract) and, for the shape the SDK sends, a JSON object whose
``prompt`` is a non-empty list of token ids (or of such lists), decodes the body with
msgspec, checks the ids in one pass, validates every other field with vLLM's own model and
hands the request to vLLM's own handler. Every other body goes to vLLM's route unchanged
(its parsing, its errors), and so does every request while MiniPIC is not active on the
server.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import msgspec
from fastapi import FastAPI, Request, Response
from fastapi.routing import APIRoute

from minipic_server import boundary

COMPLETIONS_ROUTE = "/v1/completions"
TokenId = Annotated[int, msgspec.Meta(ge=0)]
TokenIds = Annotated[list[TokenId], msgspec.Meta(min_length=1)]
_DECODE = msgspec.json.Decoder(dict[str, Any])
_Handler = Callable[[Request], Awaitable[Response]]


def attach(app: FastAPI, active: Callable[[Request], bool]) -> None:
    """Put the fast route right before vLLM's ``POST /v1/completions``, which it falls back
    to; `active` says whether MiniPIC serves the request's app."""
    routes = app.router.routes
    stock = next(
        (r for r in routes if isinstance(r, APIRoute) and r.path == COMPLETIONS_ROUTE and "POST" in r.methods), None
    )
    if stock is None:
        return  # a server without completions (a pooling model): nothing to speed up
    stock_handler: _Handler = stock.get_route_handler()
    create_completion, request_model = boundary.create_completion, boundary.CompletionRequest

    async def completions(raw_request: Request) -> Response:
        if active(raw_request) and _is_json(raw_request):
            request = token_prompt_request(await raw_request.body(), request_model)
            if request is not None:
                return await create_completion(request, raw_request)
        return await stock_handler(raw_request)  # the body read above is cached on the request

    fast = APIRoute(COMPLETIONS_ROUTE, completions, methods=["POST"], include_in_schema=False)
    routes.insert(routes.index(stock), fast)


def token_prompt_request(body: bytes, request_model: Any) -> Any | None:
    """`request_model` (vLLM's ``CompletionRequest``) for a body whose prompt is token ids,
    equal to what vLLM's route would build; None for any other body, or one vLLM would refuse."""
    try:
        fields = _DECODE.decode(body)
    except msgspec.DecodeError:
        return None
    prompt = fields.get("prompt")
    if not isinstance(prompt, list) or not prompt:
        return None
    nested = isinstance(prompt[0], list)
    try:
        msgspec.convert(prompt, list[TokenIds] if nested else TokenIds)
    except msgspec.ValidationError:
        return None
    # A stand-in of the prompt's shape, so vLLM's prompt validators decide as they would on it.
    stand_in = [[0]] * len(prompt) if nested else [0]
    try:
        request = request_model.model_validate({**fields, "prompt": stand_in})
    except Exception:  # pydantic's or vLLM's validation error: vLLM's route answers it in its words
        return None
    request.prompt = prompt
    return request


def _is_json(raw_request: Request) -> bool:
    """vLLM's own media-type rule for its completion route."""
    return raw_request.headers.get("content-type", "").lower().split(";", 1)[0] == "application/json"
