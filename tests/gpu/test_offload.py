"""Spans reloaded from vLLM's CPU KV offloading answer like GPU-resident spans (H200).

`--kv-offloading-size N` turns on vLLM's OffloadingConnector: every full prompt block is
copied to CPU memory once computed, one CPU entry per GPU block keyed by the block's hash,
and a request whose next blocks miss the GPU prefix cache but are in CPU memory waits a
step while they are copied into newly allocated GPU blocks (counted as cached tokens and
as ``vllm:external_prefix_cache_hits``). A reloaded block lands in another physical block
than the one that computed it; its records (kind, origin) come from its hash
(`minipic_server.block_plan`), and its keys were stored at that origin.

Oracle: the same prompts on a PIC server without offloading, spans in GPU memory and moved
(`PIC_BF16`), in the same reading: the plain one and `minipic serve`'s default, the compact one,
whose unread heads and tails a reloaded block must also get right. The offloading server has a
GPU cache of 256 blocks; before each final prompt, unrelated traffic pushes everything out of
GPU memory, so every cached token comes back from CPU (the external-hit counter checks that it
did).
"""

from __future__ import annotations

import random
import time
from dataclasses import replace

import pytest
from test_gpu_serving import PIC_BF16, assert_same_answer, pic_prompts

from pic_reference import Segment, random_tokens
from server_api import Completion, complete, metric, prefill
from servers import RunningServer, ServerPool, ServerSpec

pytestmark = pytest.mark.server

BLOCK = 16
GPU_BLOCKS = 256  # 4096 tokens: room for one max-length request (2048) and little more
OFFLOAD_ARGS = (
    "--dtype", "bfloat16",
    "--block-size", str(BLOCK),
    "--max-model-len", "2048",
    "--max-num-batched-tokens", "512",
    "--max-num-seqs", "32",
    "--kv-cache-memory-bytes", str(64 << 20),
    "--num-gpu-blocks-override", str(GPU_BLOCKS),
    "--kv-offloading-size", "2",  # GiB of pinned CPU memory: ~131k blocks, nothing evicted from CPU here
    "--seed", "0",
)  # fmt: skip
PIC_OFFLOAD = ServerSpec(base_args=OFFLOAD_ARGS)
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"


def offload_prompts() -> tuple[list[Segment], list[list[int]], list[int]]:
    """`pic_prompts` without computed gaps: the connector's CPU lookup stops at the first miss,
    so a span after a gap would be recomputed once it left the GPU (gapped hits are GPU-only)."""
    return pic_prompts(seed=41, count=8, gaps=False)


def push_out_of_gpu(server: RunningServer, rng: random.Random) -> None:
    """Unrelated prompts with twice the GPU cache's tokens, one at a time: every block cached
    before them is reallocated (the free queue is LRU), so what they evict survives only in CPU."""
    for _ in range(2 * GPU_BLOCKS * BLOCK // 1000 + 1):
        prefill(server, [0, *random_tokens(rng, 999)])


def external_hits(server: RunningServer, at_least: float, timeout: float = 10.0) -> float:
    """The counter once it reaches `at_least` (stats reach /metrics a little after the response), or at timeout."""
    deadline = time.monotonic() + timeout
    while (value := metric(server, EXTERNAL_HITS)) < at_least and time.monotonic() < deadline:
        time.sleep(0.1)
    return value


@pytest.fixture(scope="module", params=[False, None], ids=["plain", "compact-default"])
def compact(request: pytest.FixtureRequest) -> bool | None:
    """The servers' reading (`ServerSpec.compact`)."""
    return request.param


@pytest.fixture(scope="module")
def resident(server_pool: ServerPool, compact: bool | None) -> list[Completion]:
    """The final prompts answered with every span in GPU memory and moved (no offloading)."""
    server = server_pool.get(replace(PIC_BF16, compact=compact))
    parts, prompts, cached = offload_prompts()
    for part in parts:
        prefill(server, list(part.tokens))
    answers = [complete(server, prompt, max_tokens=8) for prompt in prompts]
    assert [answer.cached_tokens for answer in answers] == cached
    return answers


def test_spans_reloaded_from_cpu_answer_like_resident_spans(server_pool: ServerPool, compact, resident) -> None:
    server = server_pool.get(replace(PIC_OFFLOAD, compact=compact))
    assert "OffloadingConnector" in server.log_path.read_text(errors="replace")  # "Creating v1 connector ..."
    parts, prompts, cached = offload_prompts()
    for part in parts:
        prefill(server, list(part.tokens))
    rng = random.Random(42)
    for expected, prompt, num_cached in zip(resident, prompts, cached, strict=True):
        push_out_of_gpu(server, rng)
        before = metric(server, EXTERNAL_HITS)
        actual = complete(server, prompt, max_tokens=8)
        assert actual.cached_tokens == num_cached
        # All of them came back from CPU; fewer means some were still in GPU memory (push harder).
        assert external_hits(server, before + num_cached) == before + num_cached
        assert_same_answer(expected, actual)
