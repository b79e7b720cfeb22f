"""With no markers in the prompt, PIC changes nothing: same greedy tokens and logprobs as stock vLLM."""

from __future__ import annotations

import random

import pytest

from minipic_client import ConfigError, RagRequest, SpanClient, Strategy

from pic_reference import random_tokens
from server_api import Completion, complete, max_logprob_diff
from servers import ServerPool, ServerSpec

pytestmark = pytest.mark.server

BLOCK_32 = ("--block-size", "32")  # vLLM's own CPU kernels need multiples of 32
STOCK = ServerSpec(pic=False, load_plugins=False, extra_args=BLOCK_32)  # vLLM alone
PLUGIN_INACTIVE = ServerSpec(pic=False, load_plugins=True, extra_args=BLOCK_32)  # no minipic section
PIC_ACTIVE = ServerSpec(extra_args=BLOCK_32)


def prompts() -> list[list[int]]:
    rng = random.Random(11)
    # Lengths cross block boundaries and the 256-token step budget (chunked prefill).
    return [[0, *random_tokens(rng, n)] for n in (5, 31, 64, 140, 300)]


def run_all(pool: ServerPool, spec: ServerSpec) -> list[Completion]:
    server = pool.get(spec)
    # Twice: the second pass reads prompts back from the prefix cache.
    return [complete(server, p, max_tokens=8) for p in prompts() for _ in range(2)]


@pytest.fixture(scope="module")
def stock_results(server_pool: ServerPool) -> list[Completion]:
    return run_all(server_pool, STOCK)


async def test_sdk_sends_plain_prompts_to_a_stock_server(
    server_pool: ServerPool, stock_results, tiny_model_dir
) -> None:
    """The SDK's baseline runs against stock vLLM (comparisons); span strategies are refused."""
    server = server_pool.get(STOCK)
    docs = ["The mill stood by the river.\n", "The school had four rooms.\n"]
    client = SpanClient(server.url, tokenizer=tiny_model_dir, max_in_flight=4, allow_stock_server=True)
    async with client:
        assert not client.info.pic
        result = await client.rag(docs=docs, task="Which mill?", max_tokens=6, strategy=Strategy.BASELINE)
        layout = client.rag_layout(RagRequest("Which mill?", docs), strategy=Strategy.BASELINE)
        with pytest.raises(ConfigError, match="stock vLLM server"):
            await client.rag(docs=docs, task="Which mill?", strategy=Strategy.ISPS)
    by_hand = complete(server, layout.token_ids, max_tokens=6)
    assert result.token_ids == by_hand.token_ids
    assert result.prompt_tokens == len(layout.token_ids)
    with pytest.raises(ConfigError, match="not a MiniPIC server"):
        async with SpanClient(server.url, tokenizer=tiny_model_dir):
            pass


@pytest.mark.parametrize("spec", [PLUGIN_INACTIVE, PIC_ACTIVE], ids=["plugin-inactive", "pic-active"])
def test_matches_stock_vllm(server_pool: ServerPool, stock_results, spec: ServerSpec) -> None:
    results = run_all(server_pool, spec)
    for ours, stock in zip(results, stock_results, strict=True):
        assert ours.token_ids == stock.token_ids
        assert max_logprob_diff(ours.top_logprobs, stock.top_logprobs) < 1e-4
