"""An independent reference for PIC outputs: Hugging Face transformers with an explicit mask.

No vLLM or MiniPIC code computes anything here. A prompt is a list of segments;
each segment's tokens attend causally either from position 0 (``span=False``:
text before any marker, PDep tails, generated tokens) or from the segment's own
start (``span=True``: an SSep/HSep span sees only itself). The first block of a
``hidden_head`` segment (an HSep span) is seen by that segment's tokens only. Positions
are positions in the final prompt. Under a server's span bias, a key of a span segment
read by a token of any other kind of segment gets the bias on its logit. The mask is checked
against MiniPIC's marker rule (the one definition the server applies), so the fixtures and
the rule cannot drift apart.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from minipic_client import RagRequest, SpanClient
from minipic_client.prompt import Technique
from minipic_kernels.block_kinds import visible, weighed_by_span_bias
from minipic_protocol.blocks import hidden_of_prompt, window_starts_of_prompt
from minipic_protocol.compact import compact_positions_of_prompt, unread_of_prompt
from minipic_protocol.markers import MarkerIds

from server_api import Completion, complete, max_logprob_diff
from servers import RunningServer

BLOCK_SIZE = 16


@dataclass(frozen=True)
class Segment:
    tokens: tuple[int, ...]
    span: bool = False
    hidden_head: bool = False  # its first block is hidden from every other segment


@dataclass(frozen=True)
class Vocabulary:
    """The ids a test prompt is built from: BOS (None: the model has none), markers, ordinary text."""

    bos: int | None
    ssep: int
    pdep: int
    pad: int
    text_ids: range
    hsep: int | None = None

    @property
    def markers(self) -> list[int]:
        return [m for m in (self.ssep, self.pdep, self.pad, self.hsep) if m is not None]

    @property
    def roles(self) -> MarkerIds:
        """The markers by role, as the protocol's functions take them."""
        return MarkerIds(self.ssep, self.pdep, self.pad, self.hsep)

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

    def hidden_span(self, tokens: list[int]) -> Segment:
        """An HSep span padded to a block boundary: its first block is seen only by itself."""
        assert self.hsep is not None
        return Segment(tuple(self.padded([self.hsep, *tokens])), span=True, hidden_head=True)

    def refreshed(self, tokens: list[int]) -> list[Segment]:
        """Faithful EPIC: the first block recomputed in context, then the document as an HSep span."""
        return [Segment((self.pdep, *tokens[: BLOCK_SIZE - 1])), self.hidden_span(tokens)]


TINY = Vocabulary(bos=0, ssep=5, pdep=6, pad=7, text_ids=range(8, 2048), hsep=2048)  # the tiny model's ids
padded, random_tokens, system, span, dependent = TINY.padded, TINY.random_tokens, TINY.system, TINY.span, TINY.dependent


def segments_of(token_ids: list[int]) -> list[Segment]:
    """A client layout cut where a block starts with a marker (SSep/HSep spans, PDep tails)."""
    cuts = [i for i in range(0, len(token_ids), BLOCK_SIZE) if token_ids[i] in (TINY.ssep, TINY.hsep, TINY.pdep)]
    bounds = [0, *cuts, len(token_ids)] if cuts[:1] != [0] else [*cuts, len(token_ids)]
    pieces = [tuple(token_ids[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a]
    return [Segment(p, span=p[0] in (TINY.ssep, TINY.hsep), hidden_head=p[0] == TINY.hsep) for p in pieces]


def flatten(segments: list[Segment]) -> list[int]:
    return [t for s in segments for t in s.tokens]


@dataclass(frozen=True)
class _Token:
    segment: int
    first_key: int  # the first position this token may attend to
    hidden: bool  # a key in a hidden head block
    span: bool  # in a span segment


def _tokens(segments: list[Segment]) -> list[_Token]:
    tokens, position = [], 0
    for i, segment in enumerate(segments):
        for j in range(len(segment.tokens)):
            hidden = segment.hidden_head and j < BLOCK_SIZE
            tokens.append(_Token(i, position if segment.span else 0, hidden, segment.span))
        position += len(segment.tokens)
    return tokens


def allowed(tokens: list[_Token]) -> torch.Tensor:
    """``[q, k]``: token q attends token k (causal, from its first key, no other segment's hidden head)."""
    segment = torch.tensor([t.segment for t in tokens])
    first_key = torch.tensor([t.first_key for t in tokens])
    hidden = torch.tensor([t.hidden for t in tokens])
    pos = torch.arange(len(tokens))
    causal = (pos[None, :] <= pos[:, None]) & (pos[None, :] >= first_key[:, None])
    return causal & ~(hidden[None, :] & (segment[None, :] != segment[:, None]))


def weighed(tokens: list[_Token]) -> torch.Tensor:
    """``[q, k]``: a span bias weighs key k as token q reads it (k in a span segment, q in none)."""
    span = torch.tensor([t.span for t in tokens])
    return span[None, :] & ~span[:, None]


def check_against_rule(segments: list[Segment], vocabulary: Vocabulary) -> None:
    ids = flatten(segments)
    markers = vocabulary.roles.kind_ids
    starts = torch.tensor(window_starts_of_prompt(ids, BLOCK_SIZE, *markers))
    hidden = torch.tensor(hidden_of_prompt(ids, BLOCK_SIZE, *markers))
    pos = torch.arange(len(ids))
    by_rule = visible(pos[:, None], starts[:, None], pos[None, :], hidden[None, :], BLOCK_SIZE)
    assert torch.equal(by_rule, allowed(_tokens(segments))), "the segments and MiniPIC's rule disagree"
    weighed_by_rule = weighed_by_span_bias(starts[:, None], starts[None, :])
    assert torch.equal(weighed_by_rule, weighed(_tokens(segments))), "the segments and the span bias disagree"


class HFReference:
    """`embedded_as`: token ids the model reads through another token's embedding (the
    server's ``--embed-markers-as``); the mask and the output head still see the ids.
    `compact`: the compact reading (``--compact``): unread tokens seen by no read token (they
    read causally) and the positions `minipic_protocol.compact` gives (per token, the
    protocol's scalar rule). `span_bias`: the server's ``--span-bias`` (`weighed`)."""

    def __init__(
        self,
        model_dir: Path,
        vocabulary: Vocabulary = TINY,
        embedded_as: dict[int, int] | None = None,
        *,
        compact: bool = False,
        span_bias: float = 0.0,
    ) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        self.vocabulary = vocabulary
        self.embedded_as = embedded_as or {}
        self.compact = compact
        self.span_bias = span_bias

    def _mask_and_positions(self, ids: list[int], tokens: list[_Token]) -> tuple[torch.Tensor, torch.Tensor]:
        seen = allowed(tokens)
        if not self.compact:
            return seen, torch.arange(len(ids))
        markers = self.vocabulary.roles
        unread = torch.tensor(unread_of_prompt(ids, BLOCK_SIZE, markers))
        seen &= ~unread[None, :] | unread[:, None]
        return seen, torch.tensor(compact_positions_of_prompt(ids, BLOCK_SIZE, markers))

    @torch.no_grad()
    def greedy_top_logprobs(
        self, segments: list[Segment], num_tokens: int = 4, top: int = 20
    ) -> tuple[list[int], list[dict[int, float]]]:
        """Greedy tokens and, per step, the top ``top`` logprobs as {token_id: logprob}."""
        check_against_rule(segments, self.vocabulary)
        ids, tokens = flatten(segments), _tokens(segments)
        generated, tops = [], []
        for _ in range(num_tokens):
            seen, positions = self._mask_and_positions(ids, tokens)
            bias = self.span_bias * weighed(tokens).float()
            mask = bias.masked_fill(~seen, float("-inf"))[None, None]
            logits = self.model(
                input_ids=torch.tensor([[self.embedded_as.get(t, t) for t in ids]]),
                attention_mask=mask,
                position_ids=positions[None],
            ).logits[0, -1]
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            best = torch.topk(logprobs, top)  # vLLM reports logprobs before any banning
            tops.append({int(i): float(v) for v, i in zip(best.values, best.indices)})
            logprobs[self.vocabulary.markers] = float("-inf")  # the server never samples markers
            token = int(torch.argmax(logprobs))
            generated.append(token)
            ids.append(token)
            last = tokens[-1]
            tokens.append(_Token(last.segment, last.first_key, False, last.span))  # continues the last segment
        return generated, tops


LOGPROB_TOL = 1e-3  # served fp32 logprobs against the reference's


def matches_reference(server: RunningServer, reference: HFReference, segments: list[Segment], **extra) -> Completion:
    """The server's greedy completion of ``segments`` (``extra``: request fields) equals the
    reference's, tokens and top logprobs; returns it for the caller's cache checks."""
    result = complete(server, flatten(segments), **extra)
    expected_ids, expected_tops = reference.greedy_top_logprobs(segments)
    assert result.token_ids == expected_ids
    assert max_logprob_diff(result.top_logprobs, expected_tops) < LOGPROB_TOL
    return result


async def client_layout_matches_reference(server: RunningServer, reference: HFReference,
                                          technique: Technique | None) -> None:  # fmt: skip
    """`SpanClient.rag` over three fresh notes laid out by ``technique`` (None: the default): it
    reads every cacheable token the layout promises from the cache (its spans were prefilled
    first) and answers as the reference does."""
    tag = uuid.uuid4().hex[:8]
    docs = [f"Note {i} of batch {tag}: the ferry leaves pier {i} at dawn, stops at the island "
            f"and returns before the evening tide.\n" for i in range(3)]  # fmt: skip
    request = RagRequest("Which pier?", docs, "Answer from the notes.", technique=technique, raw=True, max_tokens=4)
    async with SpanClient(server.url) as client:
        layout = client.rag_layout(request)
        result = await client.rag(task=request.task, docs=docs, system=request.system, technique=technique,
                                  raw=True, max_tokens=4)  # fmt: skip
    assert result.cached_tokens == layout.cacheable_tokens
    expected_ids, _ = reference.greedy_top_logprobs(segments_of(layout.token_ids), num_tokens=4)
    assert result.token_ids == expected_ids
