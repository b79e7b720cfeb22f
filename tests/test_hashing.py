"""Marker-aware block hashing against vLLM's own Request and hash primitives (no server)."""

from __future__ import annotations

import pytest
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.request import Request

from minipic_server.config import MiniPICConfigError, PicConfig
from minipic_server.engine_hooks import ban_markers
from minipic_server.hashing import make_pic_block_hasher

BS = 4
PIC = PicConfig(ssep_token_id=1, pdep_token_id=2, pad_token_id=3, compact=False)  # the plain reading
SSEP, PDEP, PAD = PIC.marker_ids
SYS = [10, 11, 12, 13]
DOC_A = [SSEP, 20, 21, 22]
DOC_B = [SSEP, 30, 31, 32]
DOC_C = [SSEP, 40, 41, 42, 43, 44, 45, 46]  # two blocks: the second chains on the first
TASK = [PDEP, 50, 51, 52]


@pytest.fixture(scope="module", autouse=True)
def _none_hash() -> None:
    init_none_hash(sha256)


def hashes(tokens: list[int], salt: str | None = None, hasher=None) -> list:
    request = Request(
        "r",
        tokens,
        SamplingParams(max_tokens=4),
        None,
        cache_salt=salt,
        block_hasher=hasher or make_pic_block_hasher(BS, sha256, PIC),
    )
    return request.block_hashes


def test_ssep_block_hashes_independently_of_prefix() -> None:
    first = hashes(SYS + DOC_A + DOC_B)
    second = hashes(SYS + DOC_B + DOC_A)
    alone = hashes(DOC_A)
    assert first[1] == second[2] == alone[0]
    assert first[2] == second[1] == hashes(DOC_B)[0]


def test_later_blocks_of_a_span_chain_on_the_span() -> None:
    after_a = hashes(SYS + DOC_A + DOC_C)
    after_b = hashes(SYS + DOC_B + DOC_C)
    alone = hashes(DOC_C)
    assert after_a[2:4] == after_b[2:4] == alone
    # The second block of C starts with an ordinary token: it must not stand alone.
    assert alone[1] != hashes(DOC_C[4:])[0]


def test_pdep_block_depends_on_every_earlier_token() -> None:
    with_a = hashes(SYS + DOC_A + DOC_C + TASK)
    with_b = hashes(SYS + DOC_B + DOC_C + TASK)
    assert with_a[2:4] == with_b[2:4]  # C is shared...
    assert with_a[4] != with_b[4]  # ...but the task after it is not
    assert hashes(SYS + DOC_A + DOC_C + TASK)[4] == with_a[4]


def test_blocks_after_pdep_chain_on_the_full_prefix() -> None:
    tail = [60, 61, 62, 63]
    assert hashes(SYS + DOC_A + TASK + tail)[3] != hashes(SYS + DOC_B + TASK + tail)[3]


def test_without_markers_the_plain_reading_hashes_as_vllm() -> None:
    """On a ``--no-compact`` server; the default compact reading roots every chain apart (below)."""
    tokens = SYS + [20, 21, 22, 23] + [PAD] * 4 + [5, 6, 7, 8, 9]
    stock = get_request_block_hasher(BS, sha256)
    assert hashes(tokens) == hashes(tokens, hasher=stock)
    assert hashes(tokens, salt="s") == hashes(tokens, salt="s", hasher=stock)


def test_marker_not_at_block_start_is_an_ordinary_token() -> None:
    tokens = SYS + [20, SSEP, 21, 22]
    stock = get_request_block_hasher(BS, sha256)
    assert hashes(tokens) == hashes(tokens, hasher=stock)
    assert hashes(SYS + [20, SSEP, 21, 22])[1] != hashes([99] * 4 + [20, SSEP, 21, 22])[1]


def test_salt_separates_ssep_blocks() -> None:
    assert hashes(SYS + DOC_A, salt="alice")[1] != hashes(SYS + DOC_A, salt="bob")[1]
    assert hashes(SYS + DOC_A, salt="alice")[1] != hashes(SYS + DOC_A)[1]
    assert hashes(SYS + DOC_A, salt="alice")[1] == hashes([7] * 4 + DOC_A, salt="alice")[1]
    # The salt reaches a span root at token 0 through vLLM's own extra keys, once.
    assert hashes(DOC_A, salt="alice")[0] == hashes(SYS + DOC_A, salt="alice")[1]


def test_generated_tokens_never_act_as_markers() -> None:
    hasher = make_pic_block_hasher(BS, sha256, PIC)
    request = Request("r", SYS + [20, 21], SamplingParams(max_tokens=8), None, block_hasher=hasher)
    request.append_output_token_ids([22, 23])  # completes block 1
    request.append_output_token_ids([SSEP, 24, 25, 26])  # a generated SSep at a block start
    stock = Request(
        "s", SYS + [20, 21], SamplingParams(max_tokens=8), None,
        block_hasher=get_request_block_hasher(BS, sha256),
    )
    stock.append_output_token_ids([22, 23])
    stock.append_output_token_ids([SSEP, 24, 25, 26])
    assert request.block_hashes == stock.block_hashes
    assert len(request.block_hashes) == 3


def test_marker_ids_are_banned_from_sampling() -> None:
    params = SamplingParams(max_tokens=4)
    params._bad_words_token_ids = [[99, 100]]
    with_hsep = PicConfig(SSEP, PDEP, PAD, hsep_token_id=4)
    ban_markers(params, with_hsep)
    ban_markers(params, with_hsep)  # idempotent
    assert params.bad_words_token_ids == [[99, 100], [SSEP], [PDEP], [PAD], [4]]


def test_multimodal_requests_are_refused() -> None:
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

    image = MultiModalFeatureSpec(None, "image", "img-0", PlaceholderRange(offset=4, length=4), mm_hash="h")
    with pytest.raises(MiniPICConfigError, match="multimodal inputs"):
        Request("r", SYS + DOC_A, SamplingParams(max_tokens=4), None, mm_features=[image],
                block_hasher=make_pic_block_hasher(BS, sha256, PIC))


def test_an_hsep_block_opens_a_span_that_hashes_apart_from_an_ssep_one() -> None:
    with_hsep = make_pic_block_hasher(BS, sha256, PicConfig(1, 2, 3, hsep_token_id=4))
    span = [4, 20, 21, 22, 23, 24, 25, 26]
    after_a = hashes([*SYS, *span], hasher=with_hsep)
    after_b = hashes([30, 31, 32, 33, *span], hasher=with_hsep)
    assert after_a[1:] == after_b[1:] == hashes(span, hasher=with_hsep)  # independent of the prefix
    as_ssep = hashes([*SYS, SSEP, *span[1:]], hasher=with_hsep)
    assert as_ssep[1] != after_a[1] and as_ssep[2] != after_a[2]
    assert hashes([*SYS, *span], salt="alice", hasher=with_hsep)[1] != after_a[1]  # the salt, as for SSep
    # A server without an HSep marker reads the token as ordinary text: the block chains on the prefix.
    assert hashes([*SYS, *span])[1:] != after_a[1:]



READINGS = [{"compact": False}, {}, {"compact": False, "embed_markers_as": 9}, {"embed_markers_as": 9},
            {"span_bias": -0.5}, {"span_bias": -1.0}, {"compact": False, "span_bias": -0.5}]


def test_each_reading_hashes_apart_and_reuses_spans_within_itself() -> None:
    """A reading other than the plain one computes other KV for the same tokens: a store shared
    with a server of another reading must never return it."""
    hashers = [make_pic_block_hasher(BS, sha256, PicConfig(SSEP, PDEP, PAD, **reading)) for reading in READINGS]
    for tokens in (SYS + DOC_A + DOC_C + TASK, DOC_A + SYS, SYS + [20, 21, 22, 23]):
        every = [hashes(tokens, hasher=hasher) for hasher in hashers]
        assert len({h for block_hashes in every for h in block_hashes}) == sum(map(len, every))
    for hasher in hashers:
        assert hashes(SYS + DOC_A + DOC_C, hasher=hasher)[1:] == hashes([7] * 4 + DOC_A + DOC_C, hasher=hasher)[1:]
        assert hashes(SYS + DOC_A, salt="alice", hasher=hasher)[1] != hashes(SYS + DOC_A, hasher=hasher)[1]
    unweighed = make_pic_block_hasher(BS, sha256, PicConfig(SSEP, PDEP, PAD, span_bias=0.0))
    assert hashes(SYS + DOC_A + TASK, hasher=unweighed) == hashes(SYS + DOC_A + TASK, hasher=hashers[1])
