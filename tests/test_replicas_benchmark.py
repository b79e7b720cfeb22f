"""benchmarks/replicas.py's arithmetic: span hits of a final prompt, and the eviction replicas' KV size."""

from __future__ import annotations

from replicas import eviction_blocks, server_flag, span_hits

from minipic_client.prompt import Prefill, PromptLayout


def layout(prefix: int, spans: list[int], tail: int = 20) -> PromptLayout:
    prefills = [Prefill.of("prefix", list(range(prefix)))] if prefix else []
    prefills += [Prefill.of("span", [1000 + i] * n) for i, n in enumerate(spans)]
    total = prefix + sum(spans) + tail
    return PromptLayout(list(range(total)), tuple(prefills), prefix + sum(spans))


def test_cached_tokens_past_the_prefix_are_span_hits() -> None:
    final = layout(32, [48, 64])
    assert span_hits(final, 32 + 112) == (112, 112)  # everything promised
    assert span_hits(final, 32 + 48) == (48, 112)  # one span missed
    assert span_hits(final, 32 + 112 + 16) == (112, 112)  # more than promised: capped
    assert span_hits(final, 16) == (0, 112)  # part of the prefix only
    assert span_hits(final, None) == (0, 112)  # no usage reported


def test_a_layout_without_prefix_or_spans() -> None:
    assert span_hits(layout(0, [48]), 48) == (48, 48)
    assert span_hits(layout(0, []), 0) == (0, 0)  # a plain prompt (stock): nothing promised


def test_eviction_replicas_hold_a_share_of_the_spans_and_one_longest_prompt() -> None:
    # 733k span tokens / 4 / 16 rounded up, and 32 prompts of 1,300 tokens (82 blocks each)
    assert eviction_blocks(733_000, 16, 0.25, 32, 1300, 40960) == 11_454 + 32 * 82
    assert eviction_blocks(10_000, 16, 0.25, 1, 100, 4096) == 257  # a max-model-len prompt must still fit
    assert eviction_blocks(10_000, 16, 0.25, 1, 100, None) == 157 + 7
    assert server_flag(["--dtype=bfloat16", "--max-model-len=40960"], "--max-model-len") == 40960
    assert server_flag(["--max-model-len", "2048", "--seed=0"], "--max-model-len") == 2048
    assert server_flag(["--block-size=16", "--block-size=32"], "--block-size") == 32  # the last one counts
    assert server_flag(["--seed=0"], "--max-model-len") is None
