"""The compact reading in tensor form: one position shift per logical block, from block records.

In the compact reading (`minipic_protocol.compact`) pads and the PDep marker opening a block
are *unread* and take no position. Pads only run to a block's end and the marker only opens
one, so each block's unread tokens are a head (``unread_head``: 1 for a PDep block) and a
tail (``unread_tail``: its trailing pads), both per physical block, decided by the
scheduler from the block's tokens (`minipic_server.block_plan`). A read token's compact
position is then its index less one *shift* per logical block of the request:

- outside spans: the block's start plus its unread head, less the read tokens of the
  blocks before it (a hidden block's tokens are not counted: nothing outside its span reads
  them);
- in a span: the shift of the span's first read token, so the span keeps its own spacing
  (a hidden head then overlaps the positions of the in-context copy before it).

Attention rotates each query by minus its block's shift and each key by its block's move
less its shift (`step_tensors.StepTensors.key_shift`), and masks unread keys from read rows
(`read_keys`; what unread rows compute is unspecified but finite).
"""

from __future__ import annotations

import torch

from minipic_protocol.blocks import BlockKind


def compact_shifts_per_block(
    block_table: torch.Tensor,
    block_kind: torch.Tensor,
    unread_head: torch.Tensor,
    unread_tail: torch.Tensor,
    window_starts: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
) -> torch.Tensor:
    """``(num_reqs, max_blocks)`` int32: each logical block's shift (index minus compact
    position of its read tokens). ``window_starts``: `block_kinds.window_starts_per_block`.
    Entries past a request's length are meaningless."""
    bt = block_table.long()
    num_blocks = bt.shape[1]
    logical = torch.arange(num_blocks, device=bt.device, dtype=torch.int32)[None, :]
    head, tail = unread_head[bt].to(torch.int32), unread_tail[bt].to(torch.int32)
    present = (seq_lens[:, None].to(torch.int32) - logical * block_size).clamp(0, block_size)
    read = (torch.minimum(present, block_size - tail) - head).clamp(min=0)
    read = torch.where(block_kind[bt] == BlockKind.HSEP, 0, read)
    read_before = torch.cumsum(read, dim=1, dtype=torch.int32) - read
    own = logical * block_size + head - read_before
    # A span's blocks take the shift of its first block holding a read token (its start if none).
    candidate = torch.where(read > 0, logical, num_blocks).expand_as(read)
    next_read = torch.flip(torch.cummin(torch.flip(candidate, [1]), dim=1).values, [1])
    span_start = (window_starts.clamp(min=0) // block_size).long()
    anchor = torch.gather(next_read, 1, span_start)
    same_span = torch.gather(window_starts, 1, anchor.clamp(max=num_blocks - 1).long()) == window_starts
    anchor = torch.where((anchor < num_blocks) & same_span, anchor, span_start).long()
    return torch.where(window_starts >= 0, torch.gather(own, 1, anchor), own).to(torch.int32)


def read_keys(
    key_slots: torch.Tensor, key_head: torch.Tensor, key_tail: torch.Tensor, block_size: int
) -> torch.Tensor:
    """Whether the token at slot ``key_slots`` of a block with these unread head and tail is
    read (broadcast tensors). A read row sees only read keys. What an unread row (a pad or a PDep
    marker) computes no read token ever sees, so the reading leaves it unspecified but finite (a
    NaN would poison other rows where a kernel multiplies masked values by 0). The reference reads
    it causally, one valid choice, which makes a request whose unread keys all come after its read
    rows plain causal attention (`step_tensors`: FlashAttention-3 may compute it over the cache);
    the stock kernel over compacted scratch pages gives it a prefix of the kept keys
    (`attention.Scratch`)."""
    return (key_slots >= key_head) & (key_slots < block_size - key_tail)
