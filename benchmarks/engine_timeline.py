"""How the engine is fed through a served run: vLLM's Prometheus metrics, sampled while it runs.

A GPU profile says how long the engine's steps take; it cannot say whether the engine had work
between them. Sampling ``GET /metrics`` (the same names in vLLM 0.26 and 0.32) every fraction of
a second gives, through the run, how many requests the engine ran and how many waited, and the
counters of prompt tokens (all, and those read from the prefix cache) and generated tokens it
finished: a run that starts slowly, drains slowly, or leaves the engine without waiting work
shows in them, for stock and MiniPIC alike.
"""

from __future__ import annotations

import asyncio
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

# vLLM's metric -> the sample's field. Gauges are read as they are; counters (exposed with the
# `_total` suffix, which the parser strips from the family name) are summed over their labels.
METRICS = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:prompt_tokens": "prompt_tokens",
    "vllm:prompt_tokens_cached": "cached_prompt_tokens",
    "vllm:generation_tokens": "generated_tokens",
}


def read_metrics(text: str) -> dict[str, float]:
    """The fields of `METRICS` from one ``/metrics`` page, each summed over its label sets."""
    values = dict.fromkeys(METRICS.values(), 0.0)
    for family in text_string_to_metric_families(text):
        field = METRICS.get(family.name)
        if field is None:
            continue
        values[field] += sum(s.value for s in family.samples if s.name in (family.name, f"{family.name}_total"))
    return values


class Sampler:
    """Samples a server's metrics every `interval_s` in the background, between `start` and `stop`."""

    COUNTERS = ("prompt_tokens", "cached_prompt_tokens", "generated_tokens")

    def __init__(self, url: str, interval_s: float = 0.25) -> None:
        self._http = httpx.AsyncClient(base_url=url, timeout=30)
        self._interval_s = interval_s
        self._started = 0.0
        self._task: asyncio.Task | None = None
        self._samples: list[dict[str, float]] = []

    async def _sample(self) -> None:
        response = await self._http.get("/metrics")
        response.raise_for_status()
        self._samples.append({"t_s": time.perf_counter() - self._started, **read_metrics(response.text)})

    async def _run(self) -> None:
        while True:
            await asyncio.gather(self._sample(), asyncio.sleep(self._interval_s))

    async def start(self) -> None:
        self._started = time.perf_counter()
        await self._sample()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> list[dict[str, float]]:
        """Stop after one last sample: the samples, each counter counted from the first sample."""
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
        return [{**s, **{c: s[c] - first[c] for c in ("t_s", *self.COUNTERS)}} for s in self._samples]


def _last_at(samples: list[dict[str, float]], t_s: float) -> dict[str, float]:
    return [s for s in samples if s["t_s"] <= t_s][-1]


def summarise(samples: list[dict[str, float]], parts: int = 10) -> dict:
    """Per tenth of the run (by time, from `Sampler.stop`'s samples): computed prompt tokens/s,
    generated tokens/s and the mean running and waiting requests; and the share of samples in
    which no request waited (the engine ran all it had)."""
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
    return {"seconds": end, "parts": rows, "nothing_waiting": sum(s["waiting"] == 0 for s in samples) / len(samples)}
