"""Block records decided on the scheduler side and set on the worker (the server tests run them end to end)."""

from __future__ import annotations

import random
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from minipic_protocol.blocks import BlockKind, kinds_of_prompt, span_openers
from minipic_server.backends.common import PicAttentionMetadata
from minipic_server.block_plan import BlockPlanner, StepRecords, records_of_request
from minipic_server.block_records import BlockRecords, derive_step
from minipic_server.config import MiniPICConfigError, PicConfig

PIC = PicConfig(ssep_token_id=1, pdep_token_id=2, pad_token_id=3, hsep_token_id=4, compact=False)  # the plain reading
BS = 4


def request(prompt: list[int], generated: int = 0) -> SimpleNamespace:
    return SimpleNamespace(all_token_ids=prompt + [9] * generated, num_prompt_tokens=len(prompt))


@pytest.mark.parametrize("seed", range(20))
def test_origins_are_offsets_in_the_span_or_the_block_itself(seed: int) -> None:
    """The origin of each block against the protocol's span openers: a span block is stored as if its
    span opened the prompt, any other block where it sits; generated blocks continue the last one."""
    rng = random.Random(seed)
    prompt = [rng.choice([1, 2, 4, 7, 8, 9]) if i % BS == 0 else 9 for i in range(rng.randrange(1, 60))]
    req = request(prompt, generated=rng.randrange(0, 12))
    num_blocks = -(-len(req.all_token_ids) // BS)
    kinds = kinds_of_prompt(prompt, BS, *PIC.kind_marker_ids)
    kinds += [BlockKind.PLAIN] * (num_blocks - len(kinds))
    expected = [b if opener is None else b - opener for b, opener in enumerate(span_openers(kinds))]
    split = rng.randrange(0, num_blocks + 1)  # records are extended as the table grows
    records_of_request(req, split, BS, PIC)
    records = records_of_request(req, num_blocks, BS, PIC)
    assert records.kinds == kinds
    assert records.origins == expected


def test_the_compact_reading_records_unread_heads_and_tails_through_to_the_device() -> None:
    """[sys 5 9 pad pad][PDep 9 9 9][SSep 9 pad pad][9 9] + generated: heads and tails from the
    tokens (the protocol's per-block form), shipped with the step and set on the device."""
    compact = replace(PIC, compact=True)
    prompt = [5, 9, 3, 3, 2, 9, 9, 9, 1, 9, 3, 3, 9, 9]
    req = request(prompt, generated=5)
    records_of_request(req, 2, BS, compact)  # extended as the table grows
    state = records_of_request(req, 5, BS, compact)
    assert (state.unread_heads, state.unread_tails) == ([0, 1, 0, 0, 0], [2, 0, 2, 0, 0])
    assert records_of_request(request(prompt), 4, BS, PIC).unread_heads == []  # outside the compact reading
    plan = planner({"r": [6, 2, 7, 1, 3]}, {"r": req}, compact)
    output = SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id="r", block_ids=([6, 2, 7, 1, 3],), num_computed_tokens=0)],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[], new_block_ids=[], num_computed_tokens=[]),
    )
    records = BlockRecords(torch.device("cpu"), compact=True)
    records.apply(plan.records(output))
    assert records.unread_head[[6, 2, 7, 1, 3]].tolist() == [0, 1, 0, 0, 0]
    assert records.unread_tail[[6, 2, 7, 1, 3]].tolist() == [2, 0, 2, 0, 0]


def planner(tables: dict[str, list[int]], requests: dict[str, SimpleNamespace], pic: PicConfig = PIC) -> BlockPlanner:
    blocks = {rid: [SimpleNamespace(block_id=b) for b in ids] for rid, ids in tables.items()}
    manager = SimpleNamespace(
        coordinator=SimpleNamespace(single_type_managers=[SimpleNamespace(req_to_blocks=blocks)]),
        block_pool=SimpleNamespace(num_gpu_blocks=64),
    )
    return BlockPlanner(SimpleNamespace(kv_cache_manager=manager, requests=requests, block_size=BS), pic)


def test_a_step_ships_the_records_of_the_blocks_that_entered_tables() -> None:
    # "new": [sys][SSep a a][PDep q] on blocks 10-13, its first block a prefix hit; "running":
    # its last two blocks are new this step.
    new = request([5, 9, 9, 9, 1, 9, 9, 9, 9, 9, 9, 9, 2, 9])
    running = request([1, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9], generated=5)
    plan = planner({"new": [10, 11, 12, 13], "running": [20, 21, 22, 23, 24]}, {"new": new, "running": running})
    output = SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id="new", block_ids=([10, 11, 12, 13],), num_computed_tokens=4)],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=["running", "idle"], new_block_ids=[([23, 24],), None], num_computed_tokens=[15, 3]
        ),
    )
    step = plan.records(output)
    assert step == StepRecords(
        num_blocks=64,
        block_ids=[10, 11, 12, 13, 23, 24],
        kinds=[BlockKind.PLAIN, BlockKind.SSEP, BlockKind.PLAIN, BlockKind.PDEP, BlockKind.PLAIN, BlockKind.PLAIN],
        origins=[0, 0, 1, 3, 3, 4],
        written_ids=[11, 12, 13, 23, 24],
        write_shifts=[1, 1, 0, 0, 0],
    )


@pytest.mark.parametrize("writer_first", [True, False])
def test_a_block_computed_and_found_in_one_step_keeps_the_computing_requests_shift(writer_first: bool) -> None:
    """A span computed by one request ([sys][span]) and found in the prefix cache by another
    scheduled after it in the same step ([span] at the prompt's start): both list its blocks,
    only the computing request's write shift (one block) is set, whichever is listed last (the
    reader's own last block, 6, is its to write)."""
    writer, reader = request([5, 9, 9, 9, 1, 9, 9, 9, 9, 9]), request([1, 9, 9, 9, 9, 9, 9])
    plan = planner({"writer": [3, 4, 5], "reader": [4, 6]}, {"writer": writer, "reader": reader})
    new = [SimpleNamespace(req_id="writer", block_ids=([3, 4, 5],), num_computed_tokens=0),
           SimpleNamespace(req_id="reader", block_ids=([4, 6],), num_computed_tokens=4)]  # fmt: skip
    output = SimpleNamespace(
        scheduled_new_reqs=new if writer_first else new[::-1],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[], new_block_ids=[], num_computed_tokens=[]),
    )
    records = BlockRecords(torch.device("cpu"))
    records.apply(plan.records(output))
    assert records.write_shift[3:7].tolist() == [0, 1, 1, 0]
    assert records.origin[3:7].tolist() == [0, 0, 1, 1]
    assert records.kind[3:7].tolist() == [BlockKind.PLAIN, BlockKind.SSEP, BlockKind.PLAIN, BlockKind.PLAIN]


def test_the_worker_sets_shipped_records_and_derives_the_step_from_them() -> None:
    records = BlockRecords(torch.device("cpu"))
    records.apply(
        StepRecords(8, [3, 5, 6], [BlockKind.SSEP, BlockKind.PLAIN, BlockKind.PDEP], [0, 1, 3], [3, 5, 6], [1, 1, 0])
    )
    assert records.kind.tolist() == [0, 0, 0, 1, 0, 0, 2, 0]
    assert records.origin.tolist() == [0, 0, 0, 0, 0, 1, 3, 0]
    assert records.write_shift.tolist() == [0, 0, 0, 1, 0, 1, 0, 0]
    # Request 0 reads [sys 7][span 3 5][PDep 6] (the span moved by one block); request 1 reads block 7 at origin.
    table = torch.tensor([[7, 3, 5, 6], [7, 0, 0, 0]], dtype=torch.int32)
    metadata = PicAttentionMetadata(
        5, 4, 16, 4, torch.tensor([0, 4, 5]), torch.tensor([16, 3]), table, torch.zeros(5, dtype=torch.long)
    )
    derive_step(metadata, records, first_layer=True)
    assert metadata.step.window_starts.tolist() == [[-1, 4, 4, -1], [-1, -1, -1, -1]]
    assert metadata.step.moved.tolist() == [1, 0]
    with pytest.raises(MiniPICConfigError, match="made for 8"):
        records.ensure(9)


def test_only_changed_records_reach_the_device() -> None:
    """Blocks listed again with the records they have (a cached prompt's hits) are not written
    again: a value planted on the device survives; a changed record replaces it."""
    records = BlockRecords(torch.device("cpu"))
    step = StepRecords(8, [3, 5], [BlockKind.SSEP, BlockKind.PLAIN], [0, 1], [3, 5], [2, 2])
    records.apply(step)
    records.origin[5] = 99
    records.apply(StepRecords(8, [], [], []))  # a decode step lists nothing
    records.apply(StepRecords(8, [3, 5], [BlockKind.SSEP, BlockKind.PLAIN], [0, 1]))
    assert records.origin[5].item() == 99
    records.apply(StepRecords(8, [5], [BlockKind.PLAIN], [2]))
    assert records.origin.tolist() == [0, 0, 0, 0, 0, 2, 0, 0]
    assert records.write_shift.tolist() == [0, 0, 0, 2, 0, 2, 0, 0]  # hits keep the computing request's shift


@pytest.mark.parametrize("seed", range(10))
def test_the_device_holds_the_last_record_listed_and_the_last_shift_written(seed: int) -> None:
    rng = random.Random(seed)
    records, expected = BlockRecords(torch.device("cpu")), [[0] * 16 for _ in range(3)]
    for _ in range(12):
        ids = [rng.randrange(16) for _ in range(rng.randrange(0, 8))]
        kinds = [expected[0][b] if rng.random() < 0.5 else rng.randrange(4) for b in ids]
        origins = [expected[1][b] if rng.random() < 0.5 else rng.randrange(9) for b in ids]
        written = sorted(set(rng.sample(ids, rng.randrange(0, len(ids) + 1))))
        shifts = [rng.randrange(-2, 3) for _ in written]
        records.apply(StepRecords(16, ids, kinds, origins, written, shifts))
        for b, kind, origin in zip(ids, kinds, origins):
            expected[0][b], expected[1][b] = kind, origin
        for b, shift in zip(written, shifts):
            expected[2][b] = shift
        assert [records.kind.tolist(), records.origin.tolist(), records.write_shift.tolist()] == expected
        assert records.any_write_shift == any(expected[2])


def test_the_host_knows_whether_any_block_is_stored_away_from_where_it_is_computed() -> None:
    """Eager steps write with vLLM's kernel only while no block has a write shift: the host copy
    follows every shift shipped, without reading the device."""
    records = BlockRecords(torch.device("cpu"))
    records.apply(StepRecords(8, [3, 5], [BlockKind.PLAIN, BlockKind.PLAIN], [0, 1], [3, 5], [0, 0]))
    assert not records.any_write_shift
    records.apply(StepRecords(8, [6, 7], [BlockKind.SSEP, BlockKind.PLAIN], [0, 1], [6, 7], [2, 2]))
    assert records.any_write_shift
    records.apply(StepRecords(8, [6], [BlockKind.PLAIN], [4], [6], [0]))  # block 6 reallocated at its origin
    assert records.any_write_shift  # block 7 still shifted
    records.apply(StepRecords(8, [7, 7], [BlockKind.PLAIN, BlockKind.PLAIN], [5, 5], [7], [0]))
    assert not records.any_write_shift
    assert records.write_shift.tolist() == [0] * 8
