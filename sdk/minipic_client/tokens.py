"""Tokenize each text once, and never let user text turn into marker tokens."""

from __future__ import annotations

from collections.abc import Collection
from functools import lru_cache
from typing import TYPE_CHECKING

from minipic_client.errors import ConfigError, PromptError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TokenIds = tuple[int, ...]


class TokenCache:
    """Content-keyed token ids of user text and of chat-template text.

    User text is encoded with ``split_special_tokens=True``: a document that
    quotes ``<|minipic_ssep|>`` (or ``<|eot_id|>``) gets the plain-text tokens of
    those characters, never the special token, so it cannot open a span or end a
    turn. Template text comes from the tokenizer's own chat template, whose
    special tokens are meant. Both are checked for marker ids anyway, since a
    tokenizer that ignores ``split_special_tokens`` would silently break spans.

    The caches are LRU-bounded (`maxsize` distinct texts) so long batch runs do
    not grow without limit; a text evicted and seen again is tokenized again.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        marker_ids: Collection[int],
        *,
        maxsize: int = 65536,
    ) -> None:
        self.tokenizer = tokenizer
        self._markers = frozenset(marker_ids)
        self._user = lru_cache(maxsize=maxsize)(self._encode_user)
        self._template = lru_cache(maxsize=1024)(self._encode_template)
        self.leading_ids = leading_special_ids(tokenizer)

    def encode(self, text: str, *, template: bool = False) -> TokenIds:
        """Token ids of `text` (no BOS/EOS added); cached."""
        return self._template(text) if template else self._user(text)

    def _encode_user(self, text: str) -> TokenIds:
        return self._checked(text, split_special_tokens=True)

    def _encode_template(self, text: str) -> TokenIds:
        return self._checked(text, split_special_tokens=False)

    def _checked(self, text: str, *, split_special_tokens: bool) -> TokenIds:
        problem = unicode_problem(text)
        if problem is not None:
            raise PromptError(f"text {text[:40]!r} {problem}")
        ids = tuple(
            self.tokenizer(
                text, add_special_tokens=False, split_special_tokens=split_special_tokens
            )["input_ids"]
        )
        if not self._markers.isdisjoint(ids):
            raise ConfigError(
                f"tokenizing {text[:60]!r} produced MiniPIC marker ids "
                f"{sorted(self._markers.intersection(ids))}; this tokenizer does not honour "
                "split_special_tokens, so documents could open spans"
            )
        return ids


def unicode_problem(text: str) -> str | None:
    """What makes `text` unusable for a tokenizer, if anything: a lone surrogate (from
    a JSON ``"\\udcff"`` escape, or bytes decoded with ``surrogateescape``)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"has a lone surrogate {text[exc.start]!r} at character {exc.start}: not valid Unicode"
    return None


def leading_special_ids(tokenizer: PreTrainedTokenizerBase) -> TokenIds:
    """Ids the tokenizer puts before text by default (Llama's BOS), as vLLM does for text prompts."""
    bare = tokenizer.encode("a", add_special_tokens=False)
    full = tokenizer.encode("a", add_special_tokens=True)
    for start in range(len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return tuple(full[:start])
    return ()
