"""The emulation's visibility changes do what their names say (benchmarks/accuracy_emulation.py)."""

from __future__ import annotations

import pytest
import torch
from accuracy_blend import Blend, blended_answer
from accuracy_emulation import (
    answer,
    attention_bias,
    logit_factor,
    model_input,
    parse_variant,
    positions_of,
    visibility,
)
from transformers import AutoModelForCausalLM

from minipic_protocol.info import ServerInfo

SSEP, PDEP, PAD, HSEP, TEXT = 5, 6, 7, 8, 100
BLOCK = 4


def _info() -> ServerInfo:
    return ServerInfo(block_size=BLOCK, ssep_token_id=SSEP, pdep_token_id=PDEP, pad_token_id=PAD, hsep_token_id=HSEP,
                      max_num_seqs=1, max_model_len=64, model="m", tokenizer="t", vllm_version="v",
                      minipic_version="v", instance_id="i")  # fmt: skip


# [text x4][SSep text text pad][PDep text text text]
PROMPT = [TEXT] * 4 + [SSEP, TEXT, TEXT, PAD] + [PDEP, TEXT, TEXT, TEXT]


def test_no_change_is_minipic_rule() -> None:
    seen = visibility(PROMPT, _info(), [])
    assert seen[6, 4] and not seen[6, 3]  # a span token sees its span's marker, not the text before it
    assert seen[9, 4] and seen[9, 7] and seen[9, 8]  # after the PDep: everything before, pad and markers included


def test_hiding_changes() -> None:
    seen = visibility(PROMPT, _info(), ["hide-pdep", "hide-spans", "hide-pads"])
    assert seen[8, 8] and not seen[9, 8]  # the PDep marker: itself only
    assert seen[6, 4] and not seen[9, 4]  # the SSep marker: its own span only
    assert seen[7, 7] and not seen[9, 7]  # the pad: itself only
    assert seen[9, 5] and seen[9, 0]  # ordinary tokens stay visible


def test_variants_are_checked() -> None:
    assert parse_variant("refreshed+pad=198+hide-pads") == ("refreshed", ["pad=198", "hide-pads"])
    with pytest.raises(SystemExit, match="changes"):
        parse_variant("refreshed+hide-everything")
    named = "lead-text-repeat-hidden-refreshed4-heads+span-bias=-0.5"  # a --layout name
    assert parse_variant(named) == ("lead-text-repeat-hidden-refreshed4-heads", ["span-bias=-0.5"])
    with pytest.raises(SystemExit, match="a --layout name"):
        parse_variant("no-such-layout")


def test_markers_embedded_as_another_token_keep_the_rule() -> None:
    embedded = [TEXT] * 4 + [198, TEXT, TEXT, PAD] + [198, TEXT, TEXT, TEXT]
    assert model_input(PROMPT, _info(), ["markers=198"]) == embedded
    assert model_input(PROMPT, _info(), []) == PROMPT
    assert parse_variant("refreshed+markers=198") == ("refreshed", ["markers=198"])


def test_span_bias_weighs_span_keys_for_rows_outside_the_span_only() -> None:
    seen = visibility(PROMPT, _info(), [])
    bias = attention_bias(PROMPT, _info(), ["span-bias=0.5"], seen)
    assert bias[9, 5] == 0.5 and bias[9, 4] == 0.5  # the span's tokens and marker, from after the PDep
    assert bias[6, 5] == 0.0 and bias[9, 0] == 0.0 and bias[9, 9] == 0.0  # inside the span; text outside spans
    assert bias[6, 3] == float("-inf")  # what the rule hides stays hidden
    assert attention_bias(PROMPT, _info(), [], seen)[9, 5] == 0.0
    assert parse_variant("refreshed+span-bias=-0.5") == ("refreshed", ["span-bias=-0.5"])


def test_first_span_bias_weighs_the_first_span_only() -> None:
    two_spans = PROMPT[:8] + [SSEP, TEXT, TEXT, PAD] + [PDEP, TEXT, TEXT, TEXT]
    seen = visibility(two_spans, _info(), [])
    bias = attention_bias(two_spans, _info(), ["first-span-bias=0.3"], seen)
    assert bias[13, 5] == 0.3 and bias[13, 9] == 0.0  # the first span's keys, not the second's
    assert bias[9, 9] == 0.0 and bias[13, 0] == 0.0


def test_spans_see_the_prefix_before_the_first_marker_block() -> None:
    seen = visibility(PROMPT, _info(), ["span-sees-prefix"])
    assert seen[6, 0] and seen[6, 3] and not visibility(PROMPT, _info(), [])[6, 0]  # a span row: the prefix too
    assert seen[6, 4] and not seen[6, 7]  # still causal within its span
    assert seen[9, 0] and seen[2, 0] and not seen[2, 3]  # rows outside spans as before
    assert parse_variant("refreshed+span-sees-prefix") == ("refreshed", ["span-sees-prefix"])


def test_span_temperature_divides_span_logits_for_rows_outside_the_span_only() -> None:
    factor = logit_factor(PROMPT, _info(), ["span-temp=0.5"])
    assert factor[9, 5] == 2.0 and factor[9, 4] == 2.0  # the span's tokens and marker, from after the PDep
    assert factor[6, 5] == 1.0 and factor[9, 0] == 1.0 and factor[9, 9] == 1.0  # inside the span; outside spans
    assert logit_factor(PROMPT, _info(), []) is None
    assert parse_variant("refreshed+span-temp=0.9") == ("refreshed", ["span-temp=0.9"])
    with pytest.raises(SystemExit, match="blend"):
        parse_variant("block+blend=0.1+span-temp=0.9")


def test_compact_gives_pads_markers_and_hidden_heads_no_position() -> None:
    # [text x3 pad][PDep text x3][HSep text x3][text text pad pad][PDep text x3]: a refreshed head
    prompt = [TEXT] * 3 + [PAD, PDEP] + [TEXT] * 3 + [HSEP] + [TEXT] * 5 + [PAD, PAD, PDEP] + [TEXT] * 3
    positions = positions_of(prompt, _info(), ["compact"]).tolist()
    assert positions == [0, 1, 2, 3, 3, 3, 4, 5, 2, 3, 4, 5, 6, 7, 8, 9, 8, 8, 9, 10]
    seen = visibility(prompt, _info(), ["compact"])[-1]
    read = [positions[k] for k in range(len(prompt)) if seen[k] and k != len(prompt) - 1]
    assert read == list(range(10))  # the last row reads one token at every position before its own
    assert positions_of(prompt, _info(), []).tolist() == list(range(len(prompt)))
    with pytest.raises(SystemExit, match="blend"):
        parse_variant("refreshed+compact+blend=0.1")


def test_compact_dependents_answer_as_the_plain_prompt(tiny_model_dir) -> None:
    """Passages after PDep markers, padded, answer with ``compact`` exactly as the plain text does:
    what the change removes is the markers' and pads' reading and their positions, nothing else."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="eager")
    a, b, c = list(range(10, 17)), list(range(20, 25)), list(range(30, 36))
    plain = a + b + c
    laid_out = a + [PAD] + [PDEP, *b, PAD, PAD] + [PDEP, *c]  # blocks of 4, each PDep opening one
    info, compact = _info(), ["compact"]
    bias = attention_bias(laid_out, info, compact, visibility(laid_out, info, compact))
    positions = positions_of(laid_out, info, compact)
    with torch.no_grad():
        logits = [model(input_ids=torch.tensor([laid_out]), attention_mask=bias[None, None],
                        position_ids=where[None]).logits[0, -1] for where in (positions, torch.arange(len(laid_out)))]
        reference = model(input_ids=torch.tensor([plain])).logits[0, -1]  # fmt: skip
    assert torch.allclose(logits[0], reference, atol=1e-5)
    assert not torch.allclose(logits[1], reference, atol=1e-3)  # hidden, but still spaced out: not the plain prompt
    generated = answer(model.eval(), laid_out, bias, set(), 5, positions=positions)
    expected = model.generate(torch.tensor([plain]), max_new_tokens=5, do_sample=False)[0, len(plain) :]
    assert generated == expected.tolist()


def test_span_temperature_of_one_changes_nothing(tiny_model_dir) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="eager")
    ids = [TEXT + i for i in range(4)] + [SSEP, 20, 21, 22] + [PDEP, 30, 31, 32]
    bias = attention_bias(ids, _info(), [], visibility(ids, _info(), []))
    plain = answer(model.eval(), ids, bias, set(), 4)
    assert answer(model, ids, bias, set(), 4, logit_factor(ids, _info(), ["span-temp=1"])) == plain
    hot = answer(model, ids, bias, set(), 4, logit_factor(ids, _info(), ["span-temp=0.05"]))
    assert hot != plain


def _tiny_prompt_masks(length: int, span: range) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Span tokens, the rule's additive mask (a span sees only itself) and full causal attention's."""
    pos = torch.arange(length)
    in_span = (pos >= span.start) & (pos < span.stop)
    causal = pos[None, :] <= pos[:, None]
    rule = causal & ~(in_span[:, None] & ~in_span[None, :])
    return in_span, *(torch.zeros(length, length).masked_fill(~m, float("-inf")) for m in (rule, causal))


def _last_logits(model, ids: list[int], bias: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), attention_mask=bias[None, None]).logits[0, -1]


def test_blend_spans_between_the_cache_and_full_attention(tiny_model_dir) -> None:
    """Recomputing no span token answers as the cached layout does, recomputing all of them as
    full attention does, and decode after the blend continues from the blended cache."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="eager")
    ids = list(range(10, 34))
    in_span, rule, causal = _tiny_prompt_masks(len(ids), range(4, 16))
    for ratio, expected in ((0.0, rule), (1.0, causal)):
        blend = Blend(ratio, candidates=in_span)
        first = blended_answer(model.eval(), ids, rule, causal, blend, stop=set(), max_tokens=1)
        assert first == [int(_last_logits(model, ids, expected).argmax())]
    assert _last_logits(model, ids, rule).argmax() != _last_logits(model, ids, causal).argmax()  # they differ
    full = model.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False)[0, len(ids):].tolist()
    assert blended_answer(model, ids, rule, causal, Blend(1.0, candidates=in_span), set(), 6) == full


def test_blend_recomputes_the_tokens_that_moved_most() -> None:
    candidates = torch.tensor([False, True, True, True, True, False])
    cached = torch.zeros(1, 1, 6, 2)
    fresh = cached.clone()
    fresh[0, 0, :, 0] = torch.tensor([9.0, 0.1, 3.0, 0.2, 2.0, 0.0])
    blend = Blend(0.5, candidates=candidates)
    assert blend._choose(fresh, cached).tolist() == [True, False, True, False, True, True]
    drawn = Blend(0.5, candidates=candidates, random_choice=True)._choose(fresh, cached)
    assert int(drawn[candidates].sum()) == 2 and bool(drawn[~candidates].all())
