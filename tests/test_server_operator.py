"""What an operator sees of a real `minipic serve`: the start-up log block and the metrics on /metrics."""

from __future__ import annotations

import random
import time

import httpx
import pytest
import vllm
from prometheus_client.parser import text_string_to_metric_families

from minipic_server.markers import HSEP_TOKEN, PAD_TOKEN, PDEP_TOKEN, SSEP_TOKEN

from pic_reference import BLOCK_SIZE, TINY, dependent, flatten, random_tokens, span, system
from server_api import complete
from servers import RunningServer

pytestmark = pytest.mark.server

COUNTERS = (
    "minipic:span_blocks_reused_total",
    'minipic:marker_blocks_computed_total{kind="ssep"}',
    'minipic:marker_blocks_computed_total{kind="pdep"}',
    "minipic:windowed_tokens_total",
    "minipic:requests_with_markers_total",
)


def test_startup_log_block(pic_server: RunningServer) -> None:
    log = pic_server.log_path.read_text(errors="replace")
    assert log.count("position-independent caching ACTIVE") == 1
    block = log[log.index("position-independent caching ACTIVE"):].splitlines()[:5]
    assert f"vLLM {vllm.__version__}" in block[1]
    assert block[2].endswith(
        f"SSep {TINY.ssep} {SSEP_TOKEN!r}, PDep {TINY.pdep} {PDEP_TOKEN!r}, pad {TINY.pad} {PAD_TOKEN!r}, "
        f"HSep {TINY.hsep} {HSEP_TOKEN!r}"
    )
    assert f"block size {BLOCK_SIZE} tokens" in block[3]
    assert block[4].endswith("attention backend minipic_server.backends.cpu.PicCpuAttentionBackend")


def counters(server: RunningServer) -> dict[str, float]:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            values[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return {name: values.get(name, 0.0) for name in COUNTERS}


def counted_after(server: RunningServer, before: dict[str, float], requests: int) -> dict[str, float]:
    """Counter increases once `requests` more requests with markers have been counted."""
    deadline = time.monotonic() + 20
    while True:
        now = counters(server)
        done = now[COUNTERS[-1]] - before[COUNTERS[-1]] >= requests
        if done or time.monotonic() > deadline:
            return {name: now[name] - before[name] for name in COUNTERS}
        time.sleep(0.2)


def test_metrics_count_span_reuse(pic_server: RunningServer) -> None:
    rng = random.Random(12)
    segments = [system(random_tokens(rng, 20)), span(random_tokens(rng, 20)), dependent(random_tokens(rng, 8))]
    prompt = flatten(segments)
    span_blocks = len(segments[1].tokens) // BLOCK_SIZE
    assert span_blocks == 2

    before = counters(pic_server)
    assert complete(pic_server, prompt, logprobs=None).cached_tokens == 0
    cold = counted_after(pic_server, before, requests=1)
    assert list(cold.values()) == [0, 1, 1, span_blocks * BLOCK_SIZE, 1]

    before = counters(pic_server)
    warm_hit = complete(pic_server, prompt, logprobs=None).cached_tokens
    assert warm_hit == len(prompt) - len(segments[2].tokens)  # all but the PDep tail
    warm = counted_after(pic_server, before, requests=1)
    assert list(warm.values()) == [span_blocks, 0, 1, 0, 1]

    before = counters(pic_server)
    complete(pic_server, random_tokens(rng, 40), logprobs=None)  # no markers: counts nothing
    complete(pic_server, [*prompt[:-1], TINY.pad], logprobs=None)  # a marker request after it, to wait on
    assert counted_after(pic_server, before, requests=1)[COUNTERS[-1]] == 1
