"""How the engine is fed through a served run: vLLM's Prometheus metrics, sampled while it runs.

A GPU profile says how long the engine's steps take; it cannot say whether the engine had work
between them. Sampling ``GET /metrics`` (the same names in vLLM 0.26 and 0.32) every fraction of
a second gives, through the run, how many requests the engine ran and how many waited, and the
counters of prompt tokens (all, and those read from the prefix cache) and generated tokens it
finished: a run that starts slowly, drains slowly, or leaves the engine without waiting work
shows in them, for stock and MiniPIC alike. The sums of vLLM's request-time histograms over the
run say where its requests spent their time on the server (queued in the engine, scheduled, the
rest in the API server); set beside the seconds the client held each prompt, they show how long
prompts spent outside the server altogether.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families

# vLLM's metric -> (the sample's field, the sample read): gauges as they are, counters' `_total`,
# histograms' `_sum` (seconds summed over the requests that finished), each summed over its labels.
METRICS = {
    "vllm:num_requests_running": ("running", ""),
    "vllm:num_requests_waiting": ("waiting", ""),
    "vllm:prompt_tokens": ("prompt_tokens", "_total"),
    "vllm:prompt_tokens_cached": ("cached_prompt_tokens", "_total"),
    "vllm:generation_tokens": ("generated_tokens", "_total"),
    # Where a request's time went: from the API server's arrival to its last token, in the
    # engine's queue, and from being scheduled to its last token.
    "vllm:e2e_request_latency_seconds": ("server_s", "_sum"),
    "vllm:request_queue_time_seconds": ("queued_s", "_sum"),
    "vllm:request_inference_time_seconds": ("inference_s", "_sum"),
    # To the first token: from the API server's arrival, and from being scheduled.
    "vllm:time_to_first_token_seconds": ("first_token_s", "_sum"),
    "vllm:request_prefill_time_seconds": ("prefill_s", "_sum"),
}
COUNTERS = tuple(field for field, sample in METRICS.values() if sample)  # counted from the run's first sample


def read_metrics(text: str) -> dict[str, float]:
    """The fields of `METRICS` from one ``/metrics`` page."""
    values = {field: 0.0 for field, _ in METRICS.values()}
    for family in text_string_to_metric_families(text):
        if family.name not in METRICS:
            continue
        field, sample = METRICS[family.name]
        values[field] += sum(s.value for s in family.samples if s.name == family.name + sample)
    return values


async def fetch_metrics(http: httpx.AsyncClient) -> dict[str, float]:
    """The fields of `METRICS` from the server ``http`` is bound to, now."""
    response = await http.get("/metrics")
    response.raise_for_status()
    return read_metrics(response.text)


T = TypeVar("T")
# The request-time histograms a stage breakdown of single requests reads.
STAGES = ("first_token_s", "queued_s", "prefill_s")


async def stage_means(http: httpx.AsyncClient, requests: Awaitable[T], count: int = 1) -> tuple[T, dict[str, float]]:
    """What ``requests`` (``count`` requests sent one at a time) returns, and the server's mean
    `STAGES` per request over them: the histograms read before and once the last one's are in."""
    before = await fetch_metrics(http)
    result = await requests
    await asyncio.sleep(0.5)  # the last request's histograms
    after = await fetch_metrics(http)
    return result, {f"server_{field}": (after[field] - before[field]) / count for field in STAGES}


class Sampler:
    """Samples a server's metrics every `interval_s` in the background, between `start` and `stop`."""

    def __init__(self, url: str, interval_s: float = 0.25) -> None:
        self._http = httpx.AsyncClient(base_url=url, timeout=30)
        self._interval_s = interval_s
        self._task: asyncio.Task | None = None
        self._samples: list[dict[str, float]] = []

    async def _sample(self) -> None:
        self._samples.append({"t_s": time.perf_counter(), **await fetch_metrics(self._http)})

    async def _run(self) -> None:
        while True:
            await asyncio.gather(self._sample(), asyncio.sleep(self._interval_s))

    async def start(self) -> None:
        await self._sample()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> list[dict[str, float]]:
        """Stop after one last sample: the samples, time and each counter counted from the first sample."""
        if self._task is None:
            raise RuntimeError("Sampler.stop() before start()")
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        await self._sample()
        await self._http.aclose()
        first = self._samples[0]
        return [{**s, **{c: s[c] - first[c] for c in ("t_s", *COUNTERS)}} for s in self._samples]


def _last_at(samples: list[dict[str, float]], t_s: float) -> dict[str, float]:
    return [s for s in samples if s["t_s"] <= t_s][-1]


def summarise(samples: list[dict[str, float]], parts: int = 10) -> dict:
    """Per tenth of the run (by time, from `Sampler.stop`'s samples): computed prompt tokens/s,
    generated tokens/s and the mean running and waiting requests; and the share of samples in
    which no request waited (the engine ran all it had); `first_busy_s`: when the engine first held
    a request or had counted a prompt token (the client's start-up before that is dead time)."""
    end = samples[-1]["t_s"]
    rows = []
    for part in range(parts):
        lo, hi = end * part / parts, end * (part + 1) / parts
        before, after = _last_at(samples, lo), _last_at(samples, hi)
        inside = [s for s in samples if lo < s["t_s"] <= hi] or [after]
        span = hi - lo  # tokens counted by the last sample at or before each bound
        computed = [s["prompt_tokens"] - s["cached_prompt_tokens"] for s in (before, after)]
        rows.append({"computed_prompt_tokens_per_s": (computed[1] - computed[0]) / span,
                     "generated_tokens_per_s": (after["generated_tokens"] - before["generated_tokens"]) / span,
                     "running": sum(s["running"] for s in inside) / len(inside),
                     "waiting": sum(s["waiting"] for s in inside) / len(inside)})  # fmt: skip
    last = samples[-1]
    busy = next((s["t_s"] for s in samples if s["running"] or s["waiting"] or s["prompt_tokens"]), end)
    return {"seconds": end, "parts": rows, "nothing_waiting": sum(s["waiting"] == 0 for s in samples) / len(samples),
            "first_busy_s": busy,
            "request_seconds": {field: last[field] for field in ("server_s", "queued_s", "inference_s")}}
