"""The per-step block records (the server tests exercise them end to end)."""

from __future__ import annotations

import pytest
import torch

from minipic_kernels.block_kinds import BlockKind
from minipic_server.backends.common import PicAttentionMetadata
from minipic_server.block_recorder import BlockRecorder
from minipic_server.config import MiniPICConfigError, PicConfig

PIC = PicConfig(ssep_token_id=1, pdep_token_id=2, pad_token_id=3)


def test_a_step_records_the_first_token_and_origin_of_every_block_it_starts() -> None:
    recorder = BlockRecorder(PIC)
    kinds, origins = recorder._records_for(num_blocks=6, device=torch.device("cpu"))
    kinds[3], origins[3] = BlockKind.SSEP, 7  # written by an earlier step; this one does not touch block 3's first slot
    ids = torch.tensor([1, 9, 2, 9, 1, 1, 9])
    positions = torch.tensor([20, 21, 8, 9, 33, 4, 5])
    slots = torch.tensor([8, 9, 4, 5, 13, 0, -1])  # 8, 4, 0 start blocks 2, 1, 0; 9, 5, 13 do not; -1 pads
    recorder._write(kinds, origins, ids, positions, slots, block_size=4)
    assert kinds[:6].tolist() == [BlockKind.SSEP, BlockKind.PDEP, BlockKind.SSEP, BlockKind.SSEP, 0, 0]
    assert origins[:6].tolist() == [1, 2, 5, 7, 0, 0]


def test_attention_without_the_steps_records_fails_clearly() -> None:
    metadata = PicAttentionMetadata(1, 1, 1, 4, *(torch.zeros(1),) * 4)
    with pytest.raises(MiniPICConfigError, match="without this step's block records"):
        metadata.recorded_blocks()
    metadata.block_kind, metadata.block_origin = torch.zeros(2), torch.zeros(2)
    metadata.window_starts = torch.zeros(1, 1)
    assert metadata.recorded_blocks() == (metadata.block_kind, metadata.block_origin, metadata.window_starts)
