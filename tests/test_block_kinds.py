"""The block rule: its tensor form (`minipic_kernels.block_kinds`) equals its scalar form
(`minipic_protocol.blocks`), hidden heads, and what the metrics count with it."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch

from minipic_kernels import block_kinds
from minipic_kernels.block_kinds import (
    block_kinds_of_tokens,
    compactable_requests,
    hidden_per_block,
    requests_weighing_span_keys,
    requests_with_masks,
    window_starts_per_block,
)
from minipic_protocol.blocks import (
    OUTSIDE_SPANS,
    BlockKind,
    block_kind_of,
    hidden_of_prompt,
    in_span,
    visible,
    weighed_by_span_bias,
    window_starts_of_prompt,
)
from minipic_server.config import PicConfig
from minipic_server.metrics import PromptAccount, account

PIC = PicConfig(ssep_token_id=1, pdep_token_id=2, pad_token_id=3, hsep_token_id=4, compact=False)  # the plain reading
MARKERS = PIC.kind_marker_ids
SSEP, PDEP, PAD, HSEP = 1, 2, 3, 4
B = 4


def test_tensor_rule_equals_scalar_rule() -> None:
    rng = random.Random(0)
    tokens = torch.tensor([rng.choice([1, 2, 3, 4, 7, 8, 9]) for _ in range(4096)])
    kinds = block_kinds_of_tokens(tokens, *MARKERS)
    assert kinds.tolist() == [block_kind_of(t, *MARKERS) for t in tokens.tolist()]
    for _ in range(200):
        num_blocks = rng.randrange(1, 24)
        first_tokens = [rng.choice([SSEP, PDEP, HSEP, 9, 9]) for _ in range(64)]
        record = block_kinds_of_tokens(torch.tensor(first_tokens), *MARKERS)
        table = torch.tensor([rng.sample(range(64), num_blocks) for _ in range(3)])
        windows = window_starts_per_block(table, record, B)
        hidden = hidden_per_block(table, record)
        for row, hidden_row, blocks in zip(windows.tolist(), hidden.tolist(), table.tolist()):
            # A prompt whose blocks start with those tokens (the rest plain), read by the scalar rule.
            prompt = [t for b in blocks for t in (first_tokens[b], 9, 9, 9)]
            assert row == window_starts_of_prompt(prompt, B, *MARKERS)[::B]
            assert hidden_row == hidden_of_prompt(prompt, B, *MARKERS)[::B]


def test_a_server_without_hsep_reads_it_as_an_ordinary_token() -> None:
    assert block_kind_of(HSEP, SSEP, PDEP, None) == 0
    assert block_kinds_of_tokens(torch.tensor([HSEP, SSEP]), SSEP, PDEP, None).tolist() == [0, 1]


def scalar_mask(prompt: list[int]) -> list[list[bool]]:
    starts, hidden = window_starts_of_prompt(prompt, B, *MARKERS), hidden_of_prompt(prompt, B, *MARKERS)
    n = len(prompt)
    return [[bool(visible(q, starts[q], k, hidden[k], B)) for k in range(n)] for q in range(n)]


def test_a_hidden_head_is_seen_by_its_own_span_only() -> None:
    # HSep span at block 0 (2 blocks) | PDep block | HSep span (1 block) | SSep span | PDep tail
    prompt = [HSEP, 10, 11, 12, 13, 14, 15, 16, PDEP, 20, 21, 22, HSEP, 30, 31, 32, SSEP, 40, 41, 42, PDEP, 50]
    mask = scalar_mask(prompt)
    head0, tail0, pdep, head1, span2, last = range(0, 4), range(4, 8), range(8, 12), range(12, 16), range(16, 20), 21
    for q in tail0:
        assert all(mask[q][k] == (k <= q) for k in range(q + 1))  # its own head, at block 0, included
    for q in [*pdep, last]:
        assert not any(mask[q][k] for k in head0)  # the corner case: a span head at block 0 stays hidden
        assert all(mask[q][k] for k in tail0)
    assert not any(mask[last][k] for k in head1)
    assert all(mask[last][k] for k in [*pdep, *span2, last])
    for q in head1:
        assert [k for k in range(len(prompt)) if mask[q][k]] == list(range(12, q + 1))
    assert window_starts_of_prompt(prompt, B, *MARKERS)[8] == OUTSIDE_SPANS


def test_tensor_visibility_equals_scalar_visibility() -> None:
    rng = random.Random(1)
    for _ in range(100):
        prompt = [rng.choice([SSEP, PDEP, HSEP, 9, 9, 9]) for _ in range(rng.randrange(1, 40))]
        starts = torch.tensor(window_starts_of_prompt(prompt, B, *MARKERS))
        hidden = torch.tensor(hidden_of_prompt(prompt, B, *MARKERS))
        pos = torch.arange(len(prompt))
        dense = block_kinds.visible(pos[:, None], starts[:, None], pos[None, :], hidden[None, :], B)
        assert dense.tolist() == scalar_mask(prompt)


@dataclass(frozen=True)
class _RandomStep:
    """Four requests over 16 physical blocks whose first tokens are random markers or text."""

    first_tokens: list[int]
    record: torch.Tensor
    table: torch.Tensor
    seq_lens: torch.Tensor
    q_lens: torch.Tensor
    qsl: torch.Tensor

    def prompts(self) -> Iterator[tuple[list[int], int]]:
        """Each request's prompt (a block's first token, then text) and query length."""
        for r, (seq_len, q_len) in enumerate(zip(self.seq_lens.tolist(), self.q_lens.tolist())):
            yield [t for b in self.table[r].tolist() for t in (self.first_tokens[b], 9, 9, 9)][:seq_len], q_len


def _random_steps(rng: random.Random, count: int) -> Iterator[_RandomStep]:
    for _ in range(count):
        first_tokens = [rng.choice([SSEP, PDEP, HSEP, 9, 9, 9]) for _ in range(16)]
        record = block_kinds_of_tokens(torch.tensor(first_tokens), *MARKERS)
        table = torch.tensor([rng.sample(range(16), 8) for _ in range(4)])
        seq_lens = torch.tensor([rng.randrange(1, 8 * B + 1) for _ in range(4)])
        q_lens = torch.tensor([rng.randrange(1, int(s) + 1) for s in seq_lens])
        qsl = torch.cat((torch.zeros(1, dtype=torch.long), torch.cumsum(q_lens, 0)))
        yield _RandomStep(first_tokens, record, table, seq_lens, q_lens, qsl)


def test_tensor_span_bias_rule_equals_scalar_rule() -> None:
    rng = random.Random(3)
    for _ in range(100):
        prompt = [rng.choice([SSEP, PDEP, HSEP, 9, 9, 9]) for _ in range(rng.randrange(1, 40))]
        starts = window_starts_of_prompt(prompt, B, *MARKERS)
        dense = block_kinds.weighed_by_span_bias(torch.tensor(starts)[:, None], torch.tensor(starts)[None, :])
        assert dense.tolist() == [[weighed_by_span_bias(q, k) for k in starts] for q in starts]


def test_requests_weighing_span_keys_are_those_with_a_row_outside_spans_after_a_span() -> None:
    """Under a span bias: a final prompt's rows after its spans weigh them, a span prefill's rows
    (in its span, or before it) weigh nothing, and neither do junk table entries past a request."""
    for step in _random_steps(random.Random(4), 300):
        windows = window_starts_per_block(step.table, step.record, B)
        flags = requests_weighing_span_keys(windows, step.qsl, step.seq_lens, B).tolist()
        for r, (prompt, q_len) in enumerate(step.prompts()):
            seq_len = len(prompt)
            starts = window_starts_of_prompt(prompt, B, *MARKERS)
            weighing = [any(weighed_by_span_bias(starts[q], starts[k]) for k in range(q))
                        for q in range(seq_len - q_len, seq_len)]  # fmt: skip
            assert flags[r] == any(weighing)


def test_requests_with_masks_are_those_a_causal_kernel_gets_wrong() -> None:
    for step in _random_steps(random.Random(2), 300):
        windows, hidden = window_starts_per_block(step.table, step.record, B), hidden_per_block(step.table, step.record)
        flags = requests_with_masks(windows, hidden, step.qsl, step.seq_lens, B).tolist()
        for r, (prompt, q_len) in enumerate(step.prompts()):
            seq_len = len(prompt)
            rows = scalar_mask(prompt)[seq_len - q_len :]
            causal = [[k <= q for k in range(seq_len)] for q in range(seq_len - q_len, seq_len)]
            assert flags[r] == (rows != causal)


def test_compactable_requests_are_causal_over_their_keys_less_the_hidden_blocks_before_them() -> None:
    """A compactable request is one a stock causal kernel computes exactly once its hidden
    blocks are left out of its keys: every row sees causal less the hidden keys, which all
    precede the first row (so the kernel may place the rows at the end of what remains)."""
    rng = random.Random(3)
    seen = 0
    for _ in range(300):
        first_tokens = [rng.choice([SSEP, PDEP, HSEP, HSEP, 9, 9]) for _ in range(16)]
        record = block_kinds_of_tokens(torch.tensor(first_tokens), *MARKERS)
        table = torch.tensor([rng.sample(range(16), 8) for _ in range(4)])
        seq_lens = torch.tensor([rng.randrange(1, 8 * B + 1) for _ in range(4)])
        q_lens = torch.tensor([rng.randrange(1, int(s) + 1) for s in seq_lens])
        qsl = torch.cat((torch.zeros(1, dtype=torch.long), torch.cumsum(q_lens, 0)))
        args = (window_starts_per_block(table, record, B), hidden_per_block(table, record), qsl, seq_lens, B)
        masked, flags = requests_with_masks(*args).tolist(), compactable_requests(*args).tolist()
        for r, (seq_len, q_len) in enumerate(zip(seq_lens.tolist(), q_lens.tolist())):
            prompt = [t for b in table[r].tolist() for t in (first_tokens[b], 9, 9, 9)][:seq_len]
            first_row = seq_len - q_len
            outside = all(w == OUTSIDE_SPANS for w in window_starts_of_prompt(prompt, B, *MARKERS)[first_row:])
            assert flags[r] == (masked[r] and outside)
            if flags[r]:
                seen += 1
                hidden = hidden_of_prompt(prompt, B, *MARKERS)
                rows = scalar_mask(prompt)[first_row:]
                kept = [[k <= q and not hidden[k] for k in range(seq_len)] for q in range(first_row, seq_len)]
                assert rows == kept
                assert not any(hidden[first_row:])
    assert seen > 20


PROMPT = [10, 11, 12, 13, 1, 20, 21, 22, 23, 24, 3, 3, 2, 50, 51]  # plain | SSep span, 2 blocks | PDep tail


@pytest.mark.parametrize(("cached", "expected"), [
    (0, PromptAccount(span_blocks_reused=0, ssep_blocks_computed=1, pdep_blocks_computed=1, windowed_tokens=8)),
    (8, PromptAccount(span_blocks_reused=1, ssep_blocks_computed=0, pdep_blocks_computed=1, windowed_tokens=4)),
    (12, PromptAccount(span_blocks_reused=2, ssep_blocks_computed=0, pdep_blocks_computed=1, windowed_tokens=0)),
])
def test_prompt_account(cached: int, expected: PromptAccount) -> None:
    assert account(PROMPT, cached, B, PIC) == expected


def test_hidden_head_spans_are_counted_as_spans() -> None:
    prompt = [2, 10, 11, 12, 4, 20, 21, 22, 23, 3, 3, 3, 2, 50]  # PDep head | HSep span, 2 blocks | PDep tail
    expected = PromptAccount(span_blocks_reused=1, pdep_blocks_computed=1, windowed_tokens=4, hsep_blocks_computed=0)
    assert account(prompt, 8, B, PIC) == expected
    assert account(prompt, 0, B, PIC).hsep_blocks_computed == 1


def test_markers_off_block_starts_count_nothing() -> None:
    prompt = [10, 1, 11, 2, 12, 13, 14, 15, 16]
    assert not account(prompt, 0, B, PIC).has_markers


def account_block_by_block(token_ids: list[int], cached: int, block_size: int) -> PromptAccount:
    """The account's definition walked one block at a time (the metrics count per marker run)."""
    reused = windowed = 0
    computed = {kind: 0 for kind in BlockKind}
    spanning = False
    for start in range(0, len(token_ids), block_size):
        kind = block_kind_of(token_ids[start], *MARKERS)
        spanning = in_span(kind, spanning)
        end = min(start + block_size, len(token_ids))
        reused += spanning and end <= cached
        windowed += max(0, end - max(start, cached)) if spanning else 0
        computed[kind] += start >= cached
    return PromptAccount(reused, computed[BlockKind.SSEP], computed[BlockKind.PDEP], windowed, computed[BlockKind.HSEP])


def test_the_account_counts_as_a_walk_over_every_block() -> None:
    rng = random.Random(5)
    for _ in range(3000):
        block_size = rng.randint(1, 6)
        prompt = [rng.choice([1, 2, 3, 4, 10, 11, 12]) for _ in range(rng.randint(0, 40))]
        cached = rng.randint(0, len(prompt))
        assert account(prompt, cached, block_size, PIC) == account_block_by_block(prompt, cached, block_size)
