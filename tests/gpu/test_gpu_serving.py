"""The CUDA path against stock vLLM and against itself with nothing cached.

What only a GPU runs: FlashAttention-3 over the cache and over moved keys, the bf16
Triton kernels, decode in full CUDA graphs, vLLM 0.26's V2 model runner (gapped hits
move its device-side computed count) and the warm-up that keeps kernels from compiling
while serving. Oracles: stock `vllm serve` with the same arguments for plain prompts;
the same PIC prompt with nothing cached (a fresh `cache_salt`) for spans reused at new
offsets and after gaps. bf16 kernels round differently, so answers are compared step by
step: logprobs within `LOGPROB_TOL`, and greedy tokens equal until a near-tie.
"""

from __future__ import annotations

import asyncio
import random
import re

import httpx
import pytest

from pic_reference import TINY, Segment, dependent, flatten, random_tokens, span, system
from server_api import Completion, acomplete, prefill
from servers import RunningServer, ServerPool, ServerSpec

pytestmark = pytest.mark.server

LOGPROB_TOL = 0.06  # bf16 attention outputs; the tiny model's logprobs move by ~1e-2 between kernels
GPU_ARGS = (
    "--dtype", "bfloat16",
    "--block-size", "16",
    "--max-model-len", "4096",
    "--max-num-batched-tokens", "512",
    "--max-num-seqs", "32",
    "--kv-cache-memory-bytes", str(64 << 20),
    "--seed", "0",
)  # fmt: skip
PIC_BF16 = ServerSpec(base_args=GPU_ARGS)
STOCK_BF16 = ServerSpec(pic=False, load_plugins=False, base_args=GPU_ARGS)
JIT_LINE = re.compile(r"JIT compilation during inference: (\w+)")


def minipic_kernel_names() -> set[str]:
    """The names of MiniPIC's Triton kernels, as vLLM's JIT monitor reports them."""
    import triton

    from minipic_kernels import kv_write, rotary_pages, triton_attention

    modules = (kv_write, rotary_pages, triton_attention)
    return {name for module in modules for name, value in vars(module).items() if isinstance(value, triton.JITFunction)}


def assert_same_answer(expected: Completion, actual: Completion) -> None:
    """Step by step: logprobs within tolerance; tokens equal, or parting at a near-tie (then stop)."""
    for e_token, a_token, e_top, a_top in zip(
        expected.token_ids, actual.token_ids, expected.top_logprobs, actual.top_logprobs, strict=True
    ):
        shared = e_top.keys() & a_top.keys()
        assert len(shared) >= len(e_top) - 2, "top-k token sets differ beyond ties at the cut-off"
        assert max(abs(e_top[t] - a_top[t]) for t in shared) < LOGPROB_TOL
        if e_token != a_token:
            gap = e_top[e_token] - e_top.get(a_token, float("-inf"))
            assert gap < 2 * LOGPROB_TOL, f"greedy tokens part at a non-tie ({gap:.3f} apart)"
            return


def answer_all(server: RunningServer, prompts: list[list[int]], salt: str | None = None, **extra) -> list[Completion]:
    """All prompts at once; with `salt`, each under its own salt, so none hits another's blocks."""

    async def run() -> list[Completion]:
        async with httpx.AsyncClient() as client:
            return await asyncio.gather(
                *(
                    acomplete(
                        client, server, p, max_tokens=8, **({"cache_salt": f"{salt}-{i}"} if salt else {}), **extra
                    )
                    for i, p in enumerate(prompts)
                )
            )

    return asyncio.run(run())


def in_context(tokens: list[int]) -> Segment:
    return Segment(tuple(TINY.padded([TINY.pdep, *tokens])))


def plain_prompts() -> list[list[int]]:
    rng = random.Random(31)
    return [[0, *random_tokens(rng, rng.randrange(20, 900))] for _ in range(24)]


def pic_prompts(
    seed: int = 32, count: int = 16, *, gaps: bool = True
) -> tuple[list[Segment], list[list[int]], list[int]]:
    """Spans to prefill; prompts placing them at new offsets (with ``gaps``, every other one after
    a computed gap); and the tokens each prompt should find cached (the prefilled segments)."""
    rng = random.Random(seed)
    sys_ = system(random_tokens(rng, 25))
    docs = [span(random_tokens(rng, rng.randrange(30, 400))) for _ in range(6)]
    prompts, cached = [], []
    for i in range(count):
        chosen = rng.sample(docs, 3)
        gapped = gaps and i % 2
        parts = [sys_, chosen[0], in_context(random_tokens(rng, 20)), *chosen[1:]] if gapped else [sys_, *chosen]
        prompts.append(flatten([*parts, dependent(random_tokens(rng, 12))]))
        cached.append(len(flatten([sys_, *chosen])))
    return [sys_, *docs], prompts, cached


def refreshed_head_prompts(seed: int = 33, count: int = 16) -> tuple[list[Segment], list[list[int]], list[int]]:
    """The default layout's final prompts (`RefreshedHeads`): each document's head computed in
    context after a PDep, then the document as a cached HSep span whose first block only the
    span sees; what each prompt should find cached at least (the system prompt and the spans:
    a head is found too where another prompt opened with the same document)."""
    rng = random.Random(seed)
    sys_ = system(random_tokens(rng, 25))
    texts = [random_tokens(rng, rng.randrange(30, 400)) for _ in range(6)]
    prompts, cached = [], []
    for _ in range(count):
        chosen = rng.sample(texts, 3)
        segments = [sys_, *(s for text in chosen for s in TINY.refreshed(text)), dependent(random_tokens(rng, 12))]
        prompts.append(flatten(segments))
        cached.append(sum(len(s.tokens) for s in segments if s.span or s is sys_))
    return [sys_, *(TINY.hidden_span(text) for text in texts)], prompts, cached


@pytest.fixture(scope="module")
def stock_plain(server_pool: ServerPool) -> list[Completion]:
    return answer_all(server_pool.get(STOCK_BF16), plain_prompts())


@pytest.fixture(scope="module")
def pic_bf16(server_pool: ServerPool) -> tuple[RunningServer, int]:
    """The PIC server and the size of its log when it said it was ready."""
    server = server_pool.get(PIC_BF16)
    return server, server.log_path.stat().st_size


def test_plain_prompts_answer_like_stock(stock_plain, pic_bf16) -> None:
    server, _ = pic_bf16
    for expected, actual in zip(stock_plain, answer_all(server, plain_prompts()), strict=True):
        assert actual.cached_tokens == 0
        assert_same_answer(expected, actual)


def cold_then_warm(
    server: RunningServer, parts: list[Segment], prompts: list[list[int]], salt: str, **extra
) -> list[Completion]:
    """Answer `prompts` with nothing cached (each under its own salt), prefill `parts`, answer
    them again: the warm answers, each checked against its cold one."""
    cold = answer_all(server, prompts, salt=salt, **extra)
    for part in parts:
        prefill(server, list(part.tokens))
    warm = answer_all(server, prompts, **extra)
    assert all(result.cached_tokens == 0 for result in cold)
    for expected, actual in zip(cold, warm, strict=True):
        assert_same_answer(expected, actual)
    return warm


def test_spans_moved_and_after_gaps_answer_like_a_cold_cache(pic_bf16) -> None:
    server, _ = pic_bf16
    parts, prompts, cached = pic_prompts()
    warm = cold_then_warm(server, parts, prompts, salt="gpu-cold")
    assert [result.cached_tokens for result in warm] == cached


def test_penalised_requests_over_cached_spans_answer_like_a_cold_cache(pic_bf16) -> None:
    """The V2 runner does not stage a request's cached prompt tokens for the device, unless
    something there reads them (`token_staging.cached_head`): a repetition penalty counts the
    whole prompt, so its answers over cached spans still match the cold ones."""
    server, _ = pic_bf16
    parts, prompts, cached = pic_prompts(seed=34, count=8, gaps=False)
    warm = cold_then_warm(server, parts, prompts, salt="gpu-cold-penalty", repetition_penalty=1.5)
    assert [result.cached_tokens for result in warm] == cached


def test_refreshed_heads_over_cached_spans_answer_like_a_cold_cache(pic_bf16) -> None:
    """Final prompts whose computed rows skip cached hidden heads (FlashAttention-3 over scratch
    pages without the hidden blocks) against the same prompts with every span computed in the
    prompt (the tile kernel, span windows and hidden heads masked)."""
    server, _ = pic_bf16
    parts, prompts, cached = refreshed_head_prompts()
    warm = cold_then_warm(server, parts, prompts, salt="gpu-cold-refreshed")
    assert all(result.cached_tokens >= least for result, least in zip(warm, cached, strict=True))


def test_no_minipic_kernel_compiles_after_ready(pic_bf16) -> None:
    """vLLM's own sampler compiles its logprobs kernel on the first request that asks for
    logprobs, as stock does; MiniPIC's kernels are all warmed up before ready."""
    server, ready_at = pic_bf16
    with server.log_path.open("rb") as log:
        log.seek(ready_at)
        compiled = set(JIT_LINE.findall(log.read().decode(errors="replace")))
    ours = minipic_kernel_names()
    assert {"_decode_kernel", "_prefill_kernel"} <= ours
    assert not compiled & ours
