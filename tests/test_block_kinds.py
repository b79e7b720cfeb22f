"""The SSep/PDep rule: its tensor form equals its scalar form, and what the metrics count with it."""

from __future__ import annotations

import random

import pytest
import torch

from minipic_kernels.block_kinds import (
    block_kind_of,
    block_kinds_of_tokens,
    window_starts_of_prompt,
    window_starts_per_block,
)
from minipic_server.config import PicConfig
from minipic_server.metrics import PromptAccount, account

PIC = PicConfig(ssep_token_id=1, pdep_token_id=2, pad_token_id=3)
B = 4


def test_tensor_rule_equals_scalar_rule() -> None:
    rng = random.Random(0)
    tokens = torch.tensor([rng.choice([1, 2, 3, 7, 8, 9]) for _ in range(4096)])
    kinds = block_kinds_of_tokens(tokens, PIC.ssep_token_id, PIC.pdep_token_id)
    assert kinds.tolist() == [block_kind_of(t, PIC.ssep_token_id, PIC.pdep_token_id) for t in tokens.tolist()]
    for _ in range(200):
        num_blocks = rng.randrange(1, 24)
        first_tokens = [rng.choice([PIC.ssep_token_id, PIC.pdep_token_id, 9]) for _ in range(64)]
        record = block_kinds_of_tokens(torch.tensor(first_tokens), PIC.ssep_token_id, PIC.pdep_token_id)
        table = torch.tensor([rng.sample(range(64), num_blocks) for _ in range(3)])
        windows = window_starts_per_block(table, record, B)
        for row, blocks in zip(windows.tolist(), table.tolist()):
            # A prompt whose blocks start with those tokens (the rest plain), read by the scalar rule.
            prompt = [t for b in blocks for t in (first_tokens[b], 9, 9, 9)]
            per_token = window_starts_of_prompt(prompt, B, PIC.ssep_token_id, PIC.pdep_token_id)
            assert row == per_token[::B]


PROMPT = [10, 11, 12, 13, 1, 20, 21, 22, 23, 24, 3, 3, 2, 50, 51]  # plain | SSep span, 2 blocks | PDep tail


@pytest.mark.parametrize(("cached", "expected"), [
    (0, PromptAccount(span_blocks_reused=0, ssep_blocks_computed=1, pdep_blocks_computed=1, windowed_tokens=8)),
    (8, PromptAccount(span_blocks_reused=1, ssep_blocks_computed=0, pdep_blocks_computed=1, windowed_tokens=4)),
    (12, PromptAccount(span_blocks_reused=2, ssep_blocks_computed=0, pdep_blocks_computed=1, windowed_tokens=0)),
])
def test_prompt_account(cached: int, expected: PromptAccount) -> None:
    assert account(PROMPT, cached, B, PIC) == expected


def test_markers_off_block_starts_count_nothing() -> None:
    prompt = [10, 1, 11, 2, 12, 13, 14, 15, 16]
    assert not account(prompt, 0, B, PIC).has_markers
