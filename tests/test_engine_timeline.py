"""`benchmarks/engine_timeline.py`: vLLM's metrics sampled through a run, against what the server answered."""

from __future__ import annotations

import asyncio
import random
import time

import httpx
import pytest
from engine_timeline import Sampler, read_metrics, summarise
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from pic_reference import random_tokens
from servers import RunningServer


def test_metrics_are_read_summed_over_their_labels() -> None:
    """A page as prometheus_client writes it: counters with ``_total`` and ``_created`` samples, labels."""
    registry = CollectorRegistry()
    prompt = Counter("vllm:prompt_tokens", "prompt tokens", ["model_name", "engine"], registry=registry)
    prompt.labels("m", "0").inc(1200)
    prompt.labels("m", "1").inc(34)
    Gauge("vllm:num_requests_waiting", "waiting", ["model_name"], registry=registry).labels("m").set(7)
    Counter("vllm:request_success", "other", registry=registry).inc(3)
    latency = Histogram("vllm:e2e_request_latency_seconds", "e2e", ["model_name"], registry=registry)
    for seconds in (0.5, 1.25):
        latency.labels("m").observe(seconds)
    values = read_metrics(generate_latest(registry).decode())
    assert values == {"running": 0.0, "waiting": 7.0, "prompt_tokens": 1234.0, "cached_prompt_tokens": 0.0,
                      "generated_tokens": 0.0, "server_s": 1.75, "queued_s": 0.0, "inference_s": 0.0,
                      "first_token_s": 0.0, "prefill_s": 0.0}  # fmt: skip


@pytest.mark.server
async def test_the_sampled_counters_add_up_to_what_the_server_answered(pic_server: RunningServer) -> None:
    rng = random.Random(7)
    prompts = [random_tokens(rng, 48) for _ in range(4)]
    sampler = Sampler(pic_server.url, interval_s=0.05)
    await sampler.start()
    usages, held = [], 0.0
    async with httpx.AsyncClient(base_url=pic_server.url, timeout=120) as http:
        for prompt in [*prompts, prompts[0]]:  # the last one reads its blocks from the prefix cache
            body = {"model": pic_server.model, "prompt": prompt, "max_tokens": 3, "temperature": 0.0}
            sent = time.perf_counter()
            usages.append((await http.post("/v1/completions", json=body)).raise_for_status().json()["usage"])
            held += time.perf_counter() - sent
        expected = sum(u["completion_tokens"] for u in usages)
        for _ in range(100):  # the API server counts a request's tokens just after answering it
            if read_metrics((await http.get("/metrics")).text)["generated_tokens"] >= expected:
                break
            await asyncio.sleep(0.1)
    samples = await sampler.stop()
    last = samples[-1]
    cached = sum((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0 for u in usages)
    assert cached >= 32  # two blocks of the repeated prompt
    assert (last["prompt_tokens"], last["cached_prompt_tokens"], last["generated_tokens"]) == (
        sum(u["prompt_tokens"] for u in usages), cached, expected)  # fmt: skip
    assert [s["t_s"] for s in samples] == sorted(s["t_s"] for s in samples) and samples[0]["t_s"] == 0.0
    summary = summarise(samples, parts=4)
    tenth = summary["seconds"] / 4
    assert sum(p["computed_prompt_tokens_per_s"] * tenth for p in summary["parts"]) == pytest.approx(
        last["prompt_tokens"] - cached, abs=1e-6)  # fmt: skip
    assert 0.0 <= summary["nothing_waiting"] <= 1.0
    assert 0.0 < summary["first_busy_s"] < summary["seconds"]  # idle until the first request arrived
    spent = summary["request_seconds"]  # one request at a time: each one's server time lies inside the client's
    assert 0.0 <= spent["queued_s"] <= spent["server_s"] and 0.0 < spent["inference_s"] <= spent["server_s"] < held
