"""Thin HTTP helpers for tests that talk to a real server by hand (token ids in, logprobs out)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import httpx

from servers import RunningServer


@dataclass
class Completion:
    token_ids: list[int]
    top_logprobs: list[dict[int, float]]
    prompt_tokens: int
    cached_tokens: int


def _request(server: RunningServer, prompt: list[int], max_tokens: int, logprobs: int | None, **extra) -> dict:
    body = {
        "model": server.model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        **extra,
    }
    if logprobs is not None:
        body["logprobs"] = logprobs
    return body


def _parse(payload: dict) -> Completion:
    choice = payload["choices"][0]
    tops = []
    if choice.get("logprobs"):
        tops = [
            {int(key.split(":", 1)[1]): value for key, value in step.items()}
            for step in choice["logprobs"]["top_logprobs"]
        ]
    usage = payload["usage"]
    details = usage.get("prompt_tokens_details") or {}
    return Completion(choice["token_ids"], tops, usage["prompt_tokens"], details.get("cached_tokens") or 0)


def complete(
    server: RunningServer, prompt: list[int], max_tokens: int = 4, logprobs: int | None = 20, **extra
) -> Completion:
    response = httpx.post(
        server.url + "/v1/completions", json=_request(server, prompt, max_tokens, logprobs, **extra), timeout=300
    )
    response.raise_for_status()
    return _parse(response.json())


async def acomplete(
    client: httpx.AsyncClient, server: RunningServer, prompt: list[int], max_tokens: int = 4,
    logprobs: int | None = 20, **extra,
) -> Completion:
    response = await client.post(
        server.url + "/v1/completions", json=_request(server, prompt, max_tokens, logprobs, **extra), timeout=300
    )
    response.raise_for_status()
    return _parse(response.json())


def complete_together(server: RunningServer, prompts: list[list[int]], max_tokens: int = 4) -> list[Completion]:
    """``prompts`` in one request: vLLM adds them back to back, so a step that has room
    schedules them together. Each completion's usage counts all of them."""
    body = _request(server, prompts, max_tokens, 20)
    response = httpx.post(server.url + "/v1/completions", json=body, timeout=300)
    response.raise_for_status()
    payload = response.json()
    choices = payload["choices"]
    return [_parse({**payload, "choices": [c for c in choices if c["index"] == i]}) for i in range(len(prompts))]


def complete_after(server: RunningServer, first: list[int], prompt: list[int], max_tokens: int = 4) -> Completion:
    """`prompt` completed in one request right behind `first`, which vLLM schedules ahead of it:
    the chunks of `prompt` that share a step with `first` get what is left of the step's budget.
    Usage counts both prompts; `first` should be one nothing is cached for."""
    return complete_together(server, [first, prompt], max_tokens)[1]


def prefill(server: RunningServer, prompt: list[int]) -> Completion:
    return complete(server, prompt, max_tokens=1, logprobs=None)


def metric(server: RunningServer, name: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    match = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} ([0-9.eE+-]+)$", text, re.MULTILINE)
    assert match, f"metric {name} not exported"
    return float(match.group(1))


def max_logprob_diff(a: list[dict[int, float]], b: list[dict[int, float]]) -> float:
    """Largest difference over the shared token ids of each step; the id sets must mostly agree."""
    worst = 0.0
    for step_a, step_b in zip(a, b, strict=True):
        shared = step_a.keys() & step_b.keys()
        assert len(shared) >= len(step_a) - 2, "top-k token sets differ beyond ties at the cut-off"
        worst = max(worst, max(abs(step_a[t] - step_b[t]) for t in shared))
    return worst
