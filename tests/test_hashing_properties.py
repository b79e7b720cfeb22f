"""Property tests of the marker-aware block hasher against stock vLLM hashing (hypothesis).

Random prompts with SSep, HSep, PDep and pad tokens anywhere, random block sizes, with
and without a cache salt and generated tokens. The rule, stated with vLLM's own
hasher as the reference:

- a block in a span (from an SSep or HSep block start up to the next marker block
  start) hashes as stock vLLM hashes the prompt that starts at that block:
  independent of everything before the span (hiding an HSep head changes no hash);
- every other block (before any marker block, or from a PDep block start on)
  depends on every earlier token: before the first span it hashes as stock vLLM
  hashes the whole prompt; after one, two prompts' blocks hash alike exactly when
  everything up to the block's end (and the salt) is alike;
- only prompt tokens at block starts are markers: anywhere else, and in
  generated tokens, SSep/HSep/PDep/pad are ordinary tokens.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.request import Request

from minipic_protocol.blocks import BlockKind, block_kind_of, marker_kinds, span_openers
from minipic_server.config import PicConfig
from minipic_server.hashing import make_pic_block_hasher

PIC = PicConfig(ssep_token_id=1, pdep_token_id=2, pad_token_id=3, hsep_token_id=4, compact=False)  # the plain reading
SSEP, PDEP, PAD, HSEP = PIC.marker_ids
KIND_MARKERS = marker_kinds(*PIC.kind_marker_ids)  # SSep, PDep, HSep: the ids that give a block a kind
# Few distinct ordinary tokens, so that equal blocks (and would-be false hits) are common.
TOKENS = st.one_of(st.integers(10, 13), st.sampled_from(PIC.marker_ids))
SALTS = st.one_of(st.none(), st.sampled_from(["alice", "bob"]))
# `make reliability` runs 20,000 per property.
EXAMPLES = int(os.environ.get("MINIPIC_PROPERTY_EXAMPLES", "2000"))


@pytest.fixture(scope="module", autouse=True)
def _none_hash() -> None:
    init_none_hash(sha256)


def request(prompt: list[int], block_size: int, salt: str | None, *, pic: bool, generated: list[int] = (),
            hasher=None) -> Request:  # fmt: skip
    if hasher is None:
        hasher = make_pic_block_hasher(block_size, sha256, PIC) if pic else get_request_block_hasher(block_size, sha256)
    r = Request("r", prompt, SamplingParams(max_tokens=len(generated) + 1), None, cache_salt=salt,
                block_hasher=hasher)
    for token in generated:
        r.append_output_token_ids([token])
    return r


def stock(tokens: list[int], block_size: int, salt: str | None) -> list:
    return request(tokens, block_size, salt, pic=False).block_hashes


def openers(prompt: list[int], generated: list[int], block_size: int) -> list[int | None]:
    """Per full block: the block that opened its span, None outside spans (generated tokens are never markers)."""
    tokens = prompt + generated
    kinds = [
        block_kind_of(tokens[start], *PIC.kind_marker_ids) if start < len(prompt) else BlockKind.PLAIN
        for start in range(0, len(tokens) // block_size * block_size, block_size)
    ]
    return list(span_openers(kinds))


def expected(prompt: list[int], generated: list[int], block_size: int, salt: str | None) -> list:
    """The rule above, block by block, from stock hashes of the prompt or of a span's suffix;
    None for a block outside spans after a span (its hash is checked by what it tells apart)."""
    tokens = prompt + generated
    whole = stock(tokens, block_size, salt)
    block_openers = openers(prompt, generated, block_size)
    first_span = next((i for i, opener in enumerate(block_openers) if opener is not None), len(block_openers))
    return [
        (whole[i] if i < first_span else None) if opener is None
        else stock(tokens[opener * block_size :], block_size, salt)[i - opener]
        for i, opener in enumerate(block_openers)
    ]


def checked(hashes: list, reference: list) -> list:
    return [None if want is None else got for got, want in zip(hashes, reference, strict=True)]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompt=st.lists(TOKENS, max_size=64), block_size=st.integers(1, 8), salt=SALTS)
def test_every_block_hashes_by_the_rule(prompt, block_size, salt):
    want = expected(prompt, [], block_size, salt)
    assert checked(request(prompt, block_size, salt, pic=True).block_hashes, want) == want


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    common=st.lists(TOKENS, max_size=40), tails=st.tuples(st.lists(TOKENS, max_size=24), st.lists(TOKENS, max_size=24)),
    block_size=st.integers(1, 8), salts=st.tuples(SALTS, SALTS),
)
def test_a_block_outside_spans_hits_exactly_when_everything_before_it_matches(common, tails, block_size, salts):
    prompts = [common + tail for tail in tails]
    hashes = [request(p, block_size, salt, pic=True).block_hashes for p, salt in zip(prompts, salts, strict=True)]
    for i, opener in enumerate(openers(prompts[0], [], block_size)[: min(map(len, hashes))]):
        if opener is None:
            end = (i + 1) * block_size
            alike = prompts[0][:end] == prompts[1][:end] and salts[0] == salts[1]
            assert (hashes[0][i] == hashes[1][i]) == alike


@settings(max_examples=EXAMPLES, deadline=None)
@given(prompt=st.lists(TOKENS, max_size=64), block_size=st.integers(1, 8), salt=SALTS)
def test_prompts_without_marker_block_starts_hash_as_stock_vllm(prompt, block_size, salt):
    plain = [10 if i % block_size == 0 and t in KIND_MARKERS else t for i, t in enumerate(prompt)]
    assert request(plain, block_size, salt, pic=True).block_hashes == stock(plain, block_size, salt)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    before=st.lists(TOKENS, max_size=40), other=st.lists(TOKENS, max_size=40),
    span=st.lists(TOKENS, min_size=1, max_size=32), block_size=st.integers(1, 8), salt=SALTS,
    opener=st.sampled_from([SSEP, HSEP]),
)
def test_a_span_hashes_the_same_after_any_prefix(before, other, span, block_size, salt, opener):
    pad = lambda ids: ids + [PAD] * (-len(ids) % block_size)  # noqa: E731
    span = [opener, *(10 if i % block_size == 0 and t in KIND_MARKERS else t for i, t in enumerate(span, 1))]
    a, b = pad(before), pad(other)
    first = request(a + span, block_size, salt, pic=True).block_hashes[len(a) // block_size :]
    second = request(b + span, block_size, salt, pic=True).block_hashes[len(b) // block_size :]
    assert first == second == request(span, block_size, salt, pic=True).block_hashes


@settings(max_examples=EXAMPLES // 2, deadline=None)
@given(
    prompt=st.lists(TOKENS, min_size=1, max_size=48), generated=st.lists(TOKENS, max_size=24),
    block_size=st.integers(1, 8), salt=SALTS,
)
def test_generated_markers_are_ordinary_tokens(prompt, generated, block_size, salt):
    hashes = request(prompt, block_size, salt, pic=True, generated=generated).block_hashes
    want = expected(prompt, generated, block_size, salt)
    assert checked(hashes, want) == want


@settings(max_examples=EXAMPLES // 2, deadline=None)
@given(prompt=st.lists(TOKENS, min_size=2, max_size=48), block_size=st.integers(1, 8), data=st.data())
def test_a_pdep_block_depends_on_every_earlier_token(prompt, block_size, data):
    blocks = len(prompt) // block_size
    assume(blocks >= 2)
    target = data.draw(st.integers(1, blocks - 1))
    prompt = prompt[:]
    prompt[target * block_size] = PDEP
    changed = data.draw(st.integers(0, target * block_size - 1))
    other = prompt[:]
    other[changed] = 99  # an ordinary token no prompt holds
    assert (request(prompt, block_size, None, pic=True).block_hashes[target]
            != request(other, block_size, None, pic=True).block_hashes[target])


@settings(max_examples=EXAMPLES // 2, deadline=None)
@given(
    prompts=st.lists(st.tuples(st.lists(TOKENS, max_size=48), SALTS, st.lists(TOKENS, max_size=12)), min_size=2,
                     max_size=6),
    block_size=st.integers(1, 4), kept=st.integers(1, 12),
)
def test_spans_hashed_before_hash_as_when_first_seen(prompts, block_size, kept):
    """One hasher over many requests (its spans kept from earlier ones, the oldest dropped
    past ``kept`` blocks) gives every request the hashes a fresh hasher gives it."""
    shared = make_pic_block_hasher(block_size, sha256, PIC, span_blocks_kept=kept)
    for prompt, salt, generated in prompts * 2:
        again = request(prompt, block_size, salt, pic=True, generated=generated, hasher=shared).block_hashes
        assert again == request(prompt, block_size, salt, pic=True, generated=generated).block_hashes
