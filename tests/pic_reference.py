"""An independent reference for PIC outputs: Hugging Face transformers with an explicit mask.

No vLLM or MiniPIC code computes anything here. A prompt is a list of segments;
each segment's tokens attend causally either from position 0 (``span=False``:
text before any marker, PDep tails, generated tokens) or from the segment's own
start (``span=True``: an SSep span sees only itself). Positions are positions in
the final prompt. The mask is checked against MiniPIC's SSep/PDep rule (the one
definition the server applies), so the fixtures and the rule cannot drift apart.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from minipic_kernels.block_kinds import window_starts_of_prompt

BLOCK_SIZE = 16


@dataclass(frozen=True)
class Segment:
    tokens: tuple[int, ...]
    span: bool = False


@dataclass(frozen=True)
class Vocabulary:
    """The ids a test prompt is built from: BOS (None: the model has none), markers, ordinary text."""

    bos: int | None
    ssep: int
    pdep: int
    pad: int
    text_ids: range

    @property
    def markers(self) -> list[int]:
        return [self.ssep, self.pdep, self.pad]

    def padded(self, tokens: list[int]) -> list[int]:
        return tokens + [self.pad] * (-len(tokens) % BLOCK_SIZE)

    def random_tokens(self, rng: random.Random, n: int) -> list[int]:
        return [rng.randrange(self.text_ids.start, self.text_ids.stop) for _ in range(n)]

    def system(self, tokens: list[int]) -> Segment:
        """The prompt's start, padded to a block boundary."""
        head = [] if self.bos is None else [self.bos]
        return Segment(tuple(self.padded([*head, *tokens])))

    def span(self, tokens: list[int]) -> Segment:
        """An SSep span padded to a block boundary."""
        return Segment(tuple(self.padded([self.ssep, *tokens])), span=True)

    def dependent(self, tokens: list[int]) -> Segment:
        """A PDep tail: sees the whole prompt before it."""
        return Segment((self.pdep, *tokens))


TINY = Vocabulary(bos=0, ssep=5, pdep=6, pad=7, text_ids=range(8, 2048))  # the tiny model's ids
padded, random_tokens, system, span, dependent = TINY.padded, TINY.random_tokens, TINY.system, TINY.span, TINY.dependent


def flatten(segments: list[Segment]) -> list[int]:
    return [t for s in segments for t in s.tokens]


def window_starts(segments: list[Segment], vocabulary: Vocabulary) -> list[int]:
    starts, position = [], 0
    for segment in segments:
        starts += [position if segment.span else 0] * len(segment.tokens)
        position += len(segment.tokens)
    by_rule = window_starts_of_prompt(flatten(segments), BLOCK_SIZE, vocabulary.ssep, vocabulary.pdep)
    assert starts == by_rule, "the segments and MiniPIC's SSep/PDep rule disagree"
    return starts


class HFReference:
    def __init__(self, model_dir: Path, vocabulary: Vocabulary = TINY) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        self.vocabulary = vocabulary

    @torch.no_grad()
    def greedy_top_logprobs(
        self, segments: list[Segment], num_tokens: int = 4, top: int = 20
    ) -> tuple[list[int], list[dict[int, float]]]:
        """Greedy tokens and, per step, the top ``top`` logprobs as {token_id: logprob}."""
        ids, starts = flatten(segments), window_starts(segments, self.vocabulary)
        generated, tops = [], []
        for _ in range(num_tokens):
            length = len(ids)
            mask = torch.full((1, 1, length, length), float("-inf"))
            for q, start in enumerate(starts):
                mask[0, 0, q, start : q + 1] = 0.0
            logits = self.model(
                input_ids=torch.tensor([ids]),
                attention_mask=mask,
                position_ids=torch.arange(length)[None],
            ).logits[0, -1]
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            best = torch.topk(logprobs, top)  # vLLM reports logprobs before any banning
            tops.append({int(i): float(v) for v, i in zip(best.values, best.indices)})
            logprobs[self.vocabulary.markers] = float("-inf")  # the server never samples markers
            token = int(torch.argmax(logprobs))
            generated.append(token)
            ids.append(token)
            starts.append(0)
        return generated, tops
