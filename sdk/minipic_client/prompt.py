"""PIC prompts built from parts, laid out on the server's block grid.

A prompt is a list of parts:

- `Text`: continues the current segment (initially the prefix).
- `Span`: an independent segment ``[SSep text pad..]``. Its blocks hash without
  the tokens before it, so one prefill serves every prompt that contains it, at
  any position. A span is closed: text after it must open a `Dependent`.
- `Dependent`: a segment ``[PDep text ...]`` whose blocks hash (and attend) over
  the whole prompt before it: the question after detached documents.

Markers act only at block starts, so every segment followed by another is padded
with the pad token to a block boundary; spans are always padded (their cached
form must not depend on what follows); the last segment is not.

EPIC/LegoLink (``Span(text, recompute_blocks=k)``): the first ``k*block_size - 1``
document tokens go after a PDep, so ``[PDep head]`` fills exactly ``k`` blocks
that are recomputed in context; the rest is an ordinary span ``[SSep tail pad..]``.
A document no longer than the head is entirely dependent (padded).

Hidden heads (``Span(text, head="hidden")``): the span opens with HSep instead of SSep,
so its first block is attended only by the span's own tokens and hidden from
everything after it (sink hiding). ``head="refreshed"`` (faithful EPIC from cached
blocks) puts the document's first block in context first, ``[PDep head]`` with the
first ``block_size - 1`` tokens, then the whole document as a hidden-head span
``[HSep document pad..]``: the span's tokens attend to their own context-free head,
everything after sees the refreshed head instead. A document that fits in one block
is laid out as a plain span (``hidden``: hiding its only block would hide all of it)
or entirely dependent (``refreshed``, as EPIC). ``head="joined"`` is ``refreshed`` whose
head, when the span directly follows the prompt's prefix, continues the prefix segment
instead of opening a ``[PDep head]`` of its own (the prefix's padding moves before its
last template text), so nothing stands between the prefix and the document.
``head="prefix-sink"``: the span's hidden first block holds the last ``block_size - 1``
tokens of the prompt's prefix (a chat template's end of the system turn and start of the
user turn) instead of the document's own first tokens, ``[HSep prefix-tail][document pad..]``:
each document is computed as if it opened the user turn, and what follows sees all of it
but none of the copies of the prefix's tail.

A technique turns a call's documents into parts (`documents`): one span each, or
(`LeadInContext`) the first ones as dependent segments and the rest as another technique
lays them out.
"""

from __future__ import annotations

import hashlib
import re
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from minipic_client.errors import ConfigError, InvalidDocumentError, PromptError
from minipic_client.tokenizer import Tokenizer
from minipic_client.tokens import TokenCache, TokenIds, unicode_problem


@dataclass(frozen=True, slots=True)
class Text:
    """Text continuing the current segment. ``template=True``: chat-template text whose
    special tokens are meant (user text never gets special tokens). ``shared=False``: text
    that differs from prompt to prompt (a document continuing the prefix): the prefix is
    prefilled, once for every prompt, only up to it, and each final prompt computes it."""

    text: str
    template: bool = False
    shared: bool = True


Head = Literal["shown", "hidden", "refreshed", "joined", "prefix-sink"]


@dataclass(frozen=True, slots=True)
class Span:
    """An independent, reusable segment; ``recompute_blocks`` > 0 selects EPIC for it,
    ``head`` hides its first block from what follows (``refreshed``: recomputed in context)."""

    text: str
    recompute_blocks: int = 0
    head: Head = "shown"
    sink: tuple[int, ...] = ()  # the hidden first block's tokens instead of the text's own (see the module)

    def __post_init__(self) -> None:
        if self.head not in ("shown", "hidden", "refreshed", "joined", "prefix-sink"):
            raise PromptError(
                f"Span(head={self.head!r}): head is 'shown', 'hidden', 'refreshed', 'joined' or 'prefix-sink'"
            )
        if self.recompute_blocks and self.head != "shown":
            raise PromptError(
                f"Span(recompute_blocks={self.recompute_blocks}, head={self.head!r}): EPIC's split heads "
                "and hidden heads do not combine (head='refreshed' is EPIC with one hidden block)"
            )


@dataclass(frozen=True, slots=True)
class Dependent:
    """A segment that depends on everything before it."""

    text: str


Part = Text | Span | Dependent


class _SpanEach:
    """A technique that lays every document out alike, as the span `span` makes of it."""

    __slots__ = ()

    def span(self, text: str) -> Span:
        raise NotImplementedError

    def documents(self, docs: Sequence[str]) -> list[Span | Dependent]:
        """The documents' parts, in order."""
        return [self.span(doc) for doc in docs]


@dataclass(frozen=True, slots=True)
class BlockAttention(_SpanEach):
    """Each document is one span, reused whole."""

    def span(self, text: str) -> Span:
        return Span(text)


@dataclass(frozen=True, slots=True)
class Epic(_SpanEach):
    """EPIC/LegoLink: the first `k` blocks of each document are recomputed in context."""

    k: int = 1

    def __post_init__(self) -> None:
        if self.k < 1:
            raise PromptError(f"Epic(k={self.k}): k must be at least 1 (k=0 is BlockAttention)")

    def span(self, text: str) -> Span:
        return Span(text, recompute_blocks=self.k)


@dataclass(frozen=True, slots=True)
class HiddenSink(_SpanEach):
    """Block-Attention with each document's first block hidden from everything after its span."""

    def span(self, text: str) -> Span:
        return Span(text, head="hidden")


@dataclass(frozen=True, slots=True)
class RefreshedHeads(_SpanEach):
    """Faithful EPIC from cached blocks: each document's first block recomputed in context,
    its cached context-free copy hidden from everything outside the document.
    ``join_prefix``: the first document's head continues the prompt's prefix (``head="joined"``),
    so no pad or marker stands between the start of the user turn and the first document.
    ``first``: only the first `first` documents' heads are refreshed, the others' only hidden
    (`HiddenSink`, the same cached spans): fewer tokens computed per prompt, the highest-ranked
    documents still read in context."""

    join_prefix: bool = False
    first: int | None = None

    def __post_init__(self) -> None:
        if self.first is not None and self.first < 1:
            raise PromptError(f"RefreshedHeads(first={self.first}): first must be at least 1 (None: every document)")

    def span(self, text: str) -> Span:
        return Span(text, head="refreshed")

    def documents(self, docs: Sequence[str]) -> list[Span | Dependent]:
        refreshed = len(docs) if self.first is None else self.first
        spans = [self.span(doc) if i < refreshed else HiddenSink().span(doc) for i, doc in enumerate(docs)]
        if self.join_prefix and spans:
            spans[0] = Span(docs[0], head="joined")
        return spans


@dataclass(frozen=True, slots=True)
class PrefixSink(_SpanEach):
    """Block-Attention whose spans each open with a hidden copy of the end of the prompt's
    prefix: every document computed as if it came first, nothing recomputed per prompt."""

    def span(self, text: str) -> Span:
        return Span(text, head="prefix-sink")


SpanTechnique = BlockAttention | Epic | HiddenSink | RefreshedHeads | PrefixSink


@dataclass(frozen=True, slots=True)
class LeadInContext:
    """The first `lead` documents computed in context, as full attention computes them (each a
    `Dependent` after the system prompt: vLLM's prefix cache still reuses it wherever the same
    documents open a prompt), the others laid out by `rest`. Full attention answers best from
    the first passage; a span layout loses that (docs/accuracy.md), at the price of computing it."""

    rest: SpanTechnique = RefreshedHeads()
    lead: int = 1
    as_text: bool = False  # the leading documents continue the prefix: no marker or pad before them
    # Fixed text laid out as a `Dependent` between the leading documents and the rest, so the
    # first marker after the leading text opens it rather than a document (docs/accuracy.md).
    header: str | None = None
    # The leading documents laid out by `rest` too, right after them (and the header): the
    # segment after in-context text answers worst, whatever it holds (docs/accuracy.md), so it
    # holds a document the prompt already has; once spans are cached it costs no computed token.
    repeat: bool = False
    # The repeated leading documents laid out as hidden sinks rather than by `rest`: the prompt
    # reads them in context already, so `rest`'s refreshed heads go to the documents after them.
    hide_repeat: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.rest, _SpanEach):
            raise PromptError(f"LeadInContext(rest={self.rest!r}): rest is a per-document technique")
        if self.hide_repeat and not self.repeat:
            raise PromptError("LeadInContext(hide_repeat=True): only a repeat can be hidden (repeat=True)")
        if self.lead < 1:
            raise PromptError(f"LeadInContext(lead={self.lead}): lead must be at least 1 (lead=0 is `rest` itself)")
        if self.header is not None and not self.header.strip():
            raise PromptError(f"LeadInContext(header={self.header!r}): a header needs text (None: no header)")

    def documents(self, docs: Sequence[str]) -> list[Part]:
        leading = [Text(doc, shared=False) if self.as_text else Dependent(doc) for doc in docs[: self.lead]]
        repeated = docs[: self.lead] if self.repeat else []
        hidden, shown = (repeated, []) if self.hide_repeat else ([], repeated)
        spans = [*HiddenSink().documents(hidden), *self.rest.documents([*shown, *docs[self.lead :]])]
        header = [Dependent(self.header)] if self.header is not None and spans else []
        return [*leading, *header, *spans]


Technique = SpanTechnique | LeadInContext


# The layouts by name (the command line's ``--layout``), fastest first; docs/accuracy.md
# measures where each stands. None of them: the client's default (`SpanClient.default_technique`).
TECHNIQUES: dict[str, Technique] = {
    "block": BlockAttention(),
    "hidden-sink": HiddenSink(),
    "prefix-sink": PrefixSink(),
    "epic1": Epic(1),
    "epic2": Epic(2),
    "lead-text-repeat-hidden-sink": LeadInContext(HiddenSink(), as_text=True, repeat=True),
    **{f"lead-text-repeat-refreshed{k}-heads": LeadInContext(RefreshedHeads(first=k), as_text=True, repeat=True)
       for k in (2, 3, 4, 5)},
    "lead-text-repeat-hidden-refreshed4-heads": LeadInContext(RefreshedHeads(first=4), as_text=True, repeat=True,
                                                              hide_repeat=True),
    "refreshed-heads": RefreshedHeads(),
    "lead-refreshed-heads": LeadInContext(RefreshedHeads()),
    "lead-text-refreshed-heads": LeadInContext(RefreshedHeads(), as_text=True),
    "lead-text-repeat-refreshed-heads": LeadInContext(RefreshedHeads(), as_text=True, repeat=True),
    "lead-text-header-refreshed-heads": LeadInContext(RefreshedHeads(), as_text=True, header="Passages:\n"),
    "lead2-text-refreshed-heads": LeadInContext(RefreshedHeads(), lead=2, as_text=True),
}


@dataclass(frozen=True, slots=True, eq=False)
class Prefill:
    """A standalone request that caches blocks of a final prompt.

    `key` is a digest of the token ids: cheap to hash and to remember, so the
    client can deduplicate prefills across calls without keeping the tokens.
    """

    kind: Literal["prefix", "span"]
    token_ids: TokenIds
    key: bytes
    cache_salt: str | None = None

    @classmethod
    def of(cls, kind: Literal["prefix", "span"], token_ids: TokenIds) -> Prefill:
        digest = hashlib.blake2b(array("q", token_ids).tobytes(), digest_size=16).digest()
        return cls(kind, token_ids, digest)

    def salted(self, cache_salt: str) -> Prefill:
        """The same tokens under `cache_salt`: cached apart from the unsalted ones, so keyed apart."""
        key = hashlib.blake2b(self.key + cache_salt.encode(), digest_size=16).digest()
        return Prefill(self.kind, self.token_ids, key, cache_salt)


@dataclass(frozen=True, slots=True)
class PromptLayout:
    """A final prompt, the prefills that make its reusable blocks resident, and how
    many of its tokens the server should then report as cached at least: every
    prefilled segment, wherever it sits (a MiniPIC server reuses cached blocks after
    a miss), but never the block holding the last token."""

    token_ids: list[int]
    prefills: tuple[Prefill, ...]
    cacheable_tokens: int


@dataclass(frozen=True, slots=True)
class _Piece:
    token_ids: TokenIds
    prefill: Prefill | None


_Opener = Span | Dependent | None  # None: the prefix segment


class PromptBuilder:
    """Turns parts into token layouts; segments are cached by content, so a warm
    call only concatenates cached tuples."""

    def __init__(
        self,
        tokens: TokenCache,
        *,
        block_size: int,
        ssep_token_id: int,
        pdep_token_id: int,
        pad_token_id: int,
        hsep_token_id: int | None = None,
        cache_size: int = 65536,
    ) -> None:
        self._tokens = tokens
        self._block = block_size
        self._ssep = ssep_token_id
        self._pdep = pdep_token_id
        self._pad_id = pad_token_id
        self._hsep = hsep_token_id
        self._segment = lru_cache(maxsize=cache_size)(self._build_segment)
        self._prefix_and_head = lru_cache(maxsize=cache_size)(self._build_prefix_and_head)

    def build(
        self, parts: Sequence[Part], *, pic: bool = True, add_special_tokens: bool = True
    ) -> PromptLayout:
        """Lay `parts` out. ``pic=False``: the same text with no markers or padding
        (the baseline). `add_special_tokens` prepends what the tokenizer puts before
        text (BOS), like vLLM does for text prompts; chat templates include it."""
        if not pic:
            return self._plain(parts, add_special_tokens)
        groups = self._with_prefix_sinks(_segments(parts), add_special_tokens)
        ids: list[int] = []
        prefills: list[Prefill] = []
        prefilled: list[tuple[int, int]] = []  # where each prefilled piece sits
        last = len(groups) - 1
        joined = self._joined_body(groups)
        for i, (opener, texts) in enumerate(groups):
            if joined is not None and i < 2:
                pieces = self._prefix_and_head(texts, add_special_tokens, joined) if i == 0 else ()
            else:
                pieces = self._segment(opener, texts, add_special_tokens and i == 0, i < last)
            for piece in pieces:
                if piece.prefill is not None:
                    prefills.append(piece.prefill)
                    prefilled.append((len(ids), len(ids) + len(piece.token_ids)))
                ids += piece.token_ids
        # The server always computes the last token, so a fully cached prompt recomputes a block.
        limit = max(len(ids) - 1, 0) // self._block * self._block
        cacheable = sum(max(0, min(end, limit) - start) for start, end in prefilled)
        return PromptLayout(ids, tuple(prefills), cacheable)

    def _with_prefix_sinks(
        self, groups: list[tuple[_Opener, tuple[Text, ...]]], leading: bool
    ) -> list[tuple[_Opener, tuple[Text, ...]]]:
        """Each ``head="prefix-sink"`` span as a hidden-head span whose sink is the prefix's tail."""
        if not any(isinstance(o, Span) and o.head == "prefix-sink" for o, _ in groups):
            return groups
        prefix = (self._tokens.leading_ids if leading else ()) + self._text_ids(groups[0][1])
        tail = tuple(prefix[-(self._block - 1) :])
        return [
            (Span(o.text, head="hidden", sink=tail) if isinstance(o, Span) and o.head == "prefix-sink" else o, texts)
            for o, texts in groups
        ]

    def _joined_body(self, groups: list[tuple[_Opener, tuple[Text, ...]]]) -> TokenIds | None:
        """The tokens of a ``head="joined"`` span right after the prefix whose head can join it:
        one longer than the head, on a server with HSep (else it is laid out as 'refreshed')."""
        if len(groups) < 3 or not isinstance(opener := groups[1][0], Span) or opener.head != "joined":
            return None
        body = self._tokens.encode(opener.text)
        return body if self._hsep is not None and len(body) > self._block - 1 else None

    def _build_prefix_and_head(self, texts: tuple[Text, ...], leading: bool, body: TokenIds) -> tuple[_Piece, ...]:
        """``[prefix head][HSep body pad..]``: the prefix continued by the document's first
        ``block_size - 1`` tokens, its padding moved before its last template text (a chat
        template's end of the system turn and start of the user turn), else before the head.
        The prefix's whole blocks before the padding are the same in every prompt: prefilled;
        the rest, which holds the document's head, is computed in the final prompt."""
        split = len(texts) - 1 if texts and texts[-1].template else len(texts)
        before = (self._tokens.leading_ids if leading else ()) + self._text_ids(texts[:split])
        after = self._text_ids(texts[split:]) + body[: self._block - 1]
        shared = len(before) // self._block * self._block
        rest = (*before[shared:], *(self._pad_id,) * (-(len(before) + len(after)) % self._block), *after)
        pieces = (_Piece(before[:shared], Prefill.of("prefix", before[:shared])),) if shared else ()
        return (*pieces, _Piece(rest, None), self._span_piece(self._hsep, body))

    def _plain(self, parts: Sequence[Part], add_special_tokens: bool) -> PromptLayout:
        ids = list(self._tokens.leading_ids) if add_special_tokens else []
        for part in parts:
            ids += self._tokens.encode(part.text, template=isinstance(part, Text) and part.template)
        return PromptLayout(ids, (), 0)

    def _build_segment(
        self, opener: _Opener, texts: tuple[Text, ...], leading: bool, followed: bool
    ) -> tuple[_Piece, ...]:
        trailing = self._text_ids(texts)
        if opener is None:
            ids = (self._tokens.leading_ids if leading else ()) + trailing
            if not ids:
                return ()
            if not followed:
                return (_Piece(ids, None),)
            ids = self._pad(ids)
            own = next((i for i, text in enumerate(texts) if not text.shared), None)
            if own is None:
                return (_Piece(ids, Prefill.of("prefix", ids)),)
            # Prefilled: the whole blocks before the first text of this prompt's own.
            before = (self._tokens.leading_ids if leading else ()) + self._text_ids(texts[:own])
            shared = len(before) // self._block * self._block
            rest = _Piece(ids[shared:], None)
            return (_Piece(ids[:shared], Prefill.of("prefix", ids[:shared])), rest) if shared else (rest,)
        body = self._tokens.encode(opener.text)
        if isinstance(opener, Dependent):
            ids = (self._pdep, *body, *trailing)
            return (_Piece(self._pad(ids) if followed else ids, None),)
        if opener.head != "shown":
            return self._hidden_head_span(opener, body)
        if not opener.recompute_blocks:
            return (self._span_piece(self._ssep, body),)
        head_len = opener.recompute_blocks * self._block - 1
        if head_len >= len(body):
            return (self._head_piece(body, head_len),)
        return (self._head_piece(body, head_len), self._span_piece(self._ssep, body[head_len:]))

    def _text_ids(self, texts: Sequence[Text]) -> TokenIds:
        return tuple(t for text in texts for t in self._tokens.encode(text.text, template=text.template))

    def _hidden_head_span(self, opener: Span, body: TokenIds) -> tuple[_Piece, ...]:
        """``[HSep body pad..]``, after ``[PDep head]`` for a refreshed head (see the module)."""
        if self._hsep is None:
            raise ConfigError(
                f"Span(head={opener.head!r}) needs the server's HSep marker, and /minipic/info publishes "
                "no hsep_token_id (an older MiniPIC server, or a tokenizer without a fourth unused special token)"
            )
        head_len = self._block - 1
        if opener.sink:  # [HSep sink pad..][document pad..]
            sink = opener.sink + (self._pad_id,) * (head_len - len(opener.sink))
            return (self._span_piece(self._hsep, sink + body),)
        if len(body) <= head_len:  # the document fits in the head block
            if opener.head in ("refreshed", "joined"):
                return (self._head_piece(body, head_len),)
            return (self._span_piece(self._ssep, body),)
        span = self._span_piece(self._hsep, body)
        if opener.head in ("refreshed", "joined"):
            return (self._head_piece(body, head_len), span)
        return (span,)

    def _head_piece(self, body: TokenIds, head_len: int) -> _Piece:
        """``[PDep head]`` recomputed in context: exactly the blocks ``head_len + 1`` tokens
        fill (the whole body, padded, when it fits)."""
        return _Piece(self._pad((self._pdep, *body[:head_len])), None)

    def _span_piece(self, opener_id: int, body: TokenIds) -> _Piece:
        ids = self._pad((opener_id, *body))
        return _Piece(ids, Prefill.of("span", ids))

    def _pad(self, ids: TokenIds) -> TokenIds:
        return ids + (self._pad_id,) * (-len(ids) % self._block)


def _segments(parts: Sequence[Part]) -> list[tuple[_Opener, tuple[Text, ...]]]:
    """Group parts into segments: an opener (None for the prefix) and the texts after it."""
    groups: list[tuple[_Opener, list[Text]]] = [(None, [])]
    for part in parts:
        if isinstance(part, Text):
            if isinstance(groups[-1][0], Span):
                raise PromptError(
                    f"Text({part.text[:40]!r}) follows a Span: spans are closed, "
                    "so text after one must start with a Dependent"
                )
            groups[-1][1].append(part)
        elif isinstance(part, (Span, Dependent)):
            groups.append((part, []))
        else:
            raise PromptError(f"not a prompt part (Text, Span or Dependent): {part!r}")
    return [(opener, tuple(texts)) for opener, texts in groups]


def check_documents(docs: Sequence[object]) -> None:
    """Reject what cannot be a span before any request is sent."""
    if isinstance(docs, (str, bytes)):
        raise InvalidDocumentError(0, "list expected: docs is a single string, not a list of them")
    for i, doc in enumerate(docs):
        if not isinstance(doc, str):
            raise InvalidDocumentError(i, f"is {type(doc).__name__}, not str")
        if not doc.strip():
            raise InvalidDocumentError(i, "is empty")
        problem = unicode_problem(doc)
        if problem is not None:
            raise InvalidDocumentError(i, problem)


_SYSTEM = "\x1eminipic:system\x1e"
_DOCS = "\x1eminipic:docs\x1e"
_TASK = "\x1eminipic:task\x1e"
_SENTINEL = re.compile("(" + "|".join(map(re.escape, (_SYSTEM, _DOCS, _TASK))) + ")")


class ChatTemplate:
    """The tokenizer's chat template cut where the system prompt, the documents and
    the task go: rendered once per shape with sentinel contents, then split."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._pieces: dict[bool, list[str]] = {}

    def parts(self, system: str | None, documents: Sequence[Part], task: str) -> list[Part]:
        """``[system turn][user turn: documents, PDep task][assistant header]``."""
        parts: list[Part] = []
        for piece in self._split(bool(system)):
            if piece == _SYSTEM:
                parts.append(Text(system or ""))
            elif piece == _DOCS:
                parts.extend(documents)
            elif piece == _TASK:
                parts.append(Dependent(task))
            elif piece:
                parts.append(Text(piece, template=True))
        return parts

    def _split(self, with_system: bool) -> list[str]:
        pieces = self._pieces.get(with_system)
        if pieces is None:
            pieces = self._pieces[with_system] = self._render(with_system)
        return pieces

    def _render(self, with_system: bool) -> list[str]:
        from jinja2 import TemplateError

        messages = [{"role": "user", "content": _DOCS + _TASK}]
        if with_system:
            messages.insert(0, {"role": "system", "content": _SYSTEM})
        try:
            rendered = self._tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        except TemplateError as exc:
            raise ConfigError(
                f"the chat template rejects {[m['role'] for m in messages]} turns ({exc}); "
                "pass system=None or raw=True"
            ) from exc
        pieces = _SENTINEL.split(rendered)
        expected = [_SYSTEM, _DOCS, _TASK] if with_system else [_DOCS, _TASK]
        if [p for p in pieces if _SENTINEL.fullmatch(p)] != expected:
            raise ConfigError(
                "the chat template drops, repeats or reorders message contents, so documents "
                "cannot be placed as spans in it; pass raw=True"
            )
        return pieces
