"""The per-step block-kind record (the server tests exercise it end to end)."""

from __future__ import annotations

import pytest
import torch

from minipic_kernels.block_kinds import BlockKind
from minipic_server.backends.common import PicAttentionMetadata
from minipic_server.block_recorder import BlockKindRecorder
from minipic_server.config import MiniPICConfigError, PicConfig

PIC = PicConfig(ssep_token_id=1, pdep_token_id=2, pad_token_id=3)


def test_a_step_records_the_first_token_of_every_block_it_starts() -> None:
    recorder = BlockKindRecorder(PIC)
    record = recorder._record_for(num_blocks=6, device=torch.device("cpu"))
    record[3] = BlockKind.SSEP  # written by an earlier step; this one does not touch block 3's first slot
    ids = torch.tensor([1, 9, 2, 9, 1, 1, 9])
    slots = torch.tensor([8, 9, 4, 5, 13, 0, -1])  # 8, 4, 0 start blocks 2, 1, 0; 9, 5, 13 do not; -1 pads
    recorder._write(record, ids, slots, block_size=4)
    assert record[:6].tolist() == [BlockKind.SSEP, BlockKind.PDEP, BlockKind.SSEP, BlockKind.SSEP, 0, 0]


def test_attention_without_the_steps_record_fails_clearly() -> None:
    metadata = PicAttentionMetadata(1, 1, 1, 4, *(torch.zeros(1),) * 4)
    with pytest.raises(MiniPICConfigError, match="without this step's block-kind record"):
        metadata.recorded_windows()
    metadata.block_kind, metadata.window_starts = torch.zeros(2), torch.zeros(1, 1)
    assert metadata.recorded_windows() == (metadata.block_kind, metadata.window_starts)
