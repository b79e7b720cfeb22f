"""The block rule, scalar form: which blocks are spans, and which keys each query sees.

A block's kind is set by its first prompt token: SSep (the block starts an independent
span), HSep (the same, and the block is *hidden*), PDep (the block depends on the whole
prompt before it) or neither (`block_kind_of`). A span runs from an SSep or HSep block up
to the next marker block (`in_span`). A block in a span hashes from the span's start and
its tokens attend from there; any other block hashes over, and attends to, everything
before it. A hidden block is attended only by the queries of its own span (`visible`).
Hiding only removes context, so a cached block never holds keys computed from context
its hash does not name. A server may also weigh the keys of spans, as read from outside
every span, by a logit bias (`weighed_by_span_bias`): a change to what the question reads,
never to what a span's blocks hold.

The client lays prompts out by it, the server's hasher and metrics apply it block by
block, the test fixtures simulate the cache with it; `minipic_kernels.block_kinds` holds
its tensor form (per-step records, attention masks), tested equal to this one.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping, Sequence


class BlockKind(enum.IntEnum):
    """A block's kind; also the value stored in the server's per-block record (int8)."""

    PLAIN = 0
    SSEP = 1
    PDEP = 2
    HSEP = 3


# The window start of a query outside every span: it attends from position 0, yet is
# told apart from a span opened at block 0, whose hidden head it must not see.
OUTSIDE_SPANS = -1


def marker_kinds(ssep_token_id: int, pdep_token_id: int, hsep_token_id: int | None) -> dict[int, BlockKind]:
    """The tokens that give a block a kind when they are its first (prompt) token
    (``hsep_token_id`` None: a server without hidden heads)."""
    kinds = {ssep_token_id: BlockKind.SSEP, pdep_token_id: BlockKind.PDEP}
    if hsep_token_id is not None:
        kinds[hsep_token_id] = BlockKind.HSEP
    return kinds


def block_kind_of(first_token: int, ssep_token_id: int, pdep_token_id: int, hsep_token_id: int | None) -> BlockKind:
    """The kind a block takes from its first token (`marker_kinds` spelled out: this runs for
    every block of every prompt, in the hasher and the metrics)."""
    if first_token == ssep_token_id:
        return BlockKind.SSEP
    if first_token == pdep_token_id:
        return BlockKind.PDEP
    if first_token == hsep_token_id:
        return BlockKind.HSEP
    return BlockKind.PLAIN


def opens_span(kind: BlockKind) -> bool:
    """SSep and HSep blocks start a span (they hash without a parent)."""
    return kind is BlockKind.SSEP or kind is BlockKind.HSEP


def in_span(kind: BlockKind, previous_in_span: bool) -> bool:
    """Whether a block of `kind` is in a span: SSep/HSep open one, PDep closes it, and a plain
    block continues what the block before it was."""
    return previous_in_span if kind is BlockKind.PLAIN else opens_span(kind)


def marker_runs(first_tokens: Sequence[int], kinds: Mapping[int, BlockKind]) -> list[tuple[int, BlockKind, int]]:
    """The blocks from each marker block up to the next, as ``(first block, its kind, end block)``,
    given the blocks' first (prompt) tokens and `marker_kinds`. Every block of a run has the
    run's spanning state (`in_span`), so a long prompt is walked per marker, not per block;
    blocks before the first marker continue whatever preceded them."""
    markers = [(block, kinds[token]) for block, token in enumerate(first_tokens) if token in kinds]
    ends = [block for block, _ in markers[1:]] + [len(first_tokens)]
    return [(block, kind, end) for (block, kind), end in zip(markers, ends)]


def span_openers(kinds: Iterable[BlockKind]) -> Iterator[int | None]:
    """For each block, by kind in prompt order, the index of the block that opened its span,
    or None outside every span (before any marker, or from a PDep block on)."""
    spanning, opener = False, 0
    for block, kind in enumerate(kinds):
        spanning = in_span(kind, spanning)
        opener = block if opens_span(kind) else opener
        yield opener if spanning else None


def visible(query_pos: int, window_start: int, key_pos: int, key_hidden: bool, block_size: int) -> bool:
    """Whether the query at ``query_pos`` (window start ``window_start``) attends the key at
    ``key_pos`` (in a hidden block or not): causal, inside the window, and not hidden unless
    the key's block opens the query's own span."""
    own_head = key_pos - key_pos % block_size == window_start
    return window_start <= key_pos <= query_pos and (not key_hidden or own_head)


def weighed_by_span_bias(query_window_start: int, key_window_start: int) -> bool:
    """Whether a server's span bias (``--span-bias``) applies to the logit of the key (in a
    block of window start ``key_window_start``) read by the query (window start
    ``query_window_start``): a key inside a span read from outside every span. Span rows read
    their own span as it was computed, so a span's cached keys and values never depend on the bias."""
    return query_window_start == OUTSIDE_SPANS and key_window_start != OUTSIDE_SPANS


def kinds_of_prompt(
    token_ids: Sequence[int], block_size: int, ssep_token_id: int, pdep_token_id: int, hsep_token_id: int | None
) -> list[BlockKind]:
    """The kind of each block of a prompt (the last may be partial)."""
    return [
        block_kind_of(token_ids[start], ssep_token_id, pdep_token_id, hsep_token_id)
        for start in range(0, len(token_ids), block_size)
    ]


def window_starts_of_prompt(
    token_ids: Sequence[int], block_size: int, ssep_token_id: int, pdep_token_id: int, hsep_token_id: int | None
) -> list[int]:
    """The window start of each token of a prompt (`OUTSIDE_SPANS` outside every span)."""
    kinds = kinds_of_prompt(token_ids, block_size, ssep_token_id, pdep_token_id, hsep_token_id)
    return [
        OUTSIDE_SPANS if opener is None else opener * block_size
        for block, opener in enumerate(span_openers(kinds))
        for _ in token_ids[block * block_size : (block + 1) * block_size]
    ]


def hidden_of_prompt(
    token_ids: Sequence[int], block_size: int, ssep_token_id: int, pdep_token_id: int, hsep_token_id: int | None
) -> list[bool]:
    """Whether each token of a prompt is a key of a hidden (HSep) block."""
    kinds = kinds_of_prompt(token_ids, block_size, ssep_token_id, pdep_token_id, hsep_token_id)
    return [kinds[i // block_size] is BlockKind.HSEP for i in range(len(token_ids))]
