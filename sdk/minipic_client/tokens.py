"""Tokenize each text once, and never let user text turn into marker tokens."""

from __future__ import annotations

from collections.abc import Collection
from functools import lru_cache

from minipic_client.errors import ConfigError, PromptError
from minipic_client.tokenizer import Tokenizer

TokenIds = tuple[int, ...]


class TokenCache:
    """Content-keyed token ids of user text and of chat-template text.

    User text is encoded with special tokens as text: a document that quotes
    ``<|minipic_ssep|>`` (or ``<|eot_id|>``) gets the plain-text tokens of those
    characters, never the special token, so it cannot open a span or end a turn.
    Template text comes from the tokenizer's own chat template, whose special
    tokens are meant. Both are checked for marker ids anyway, since a marker that
    is not a special token of the tokenizer would silently break spans.

    The caches are LRU-bounded (`maxsize` distinct texts) so long batch runs do
    not grow without limit; a text evicted and seen again is tokenized again.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        marker_ids: Collection[int],
        *,
        maxsize: int = 65536,
    ) -> None:
        self.tokenizer = tokenizer
        self._markers = frozenset(marker_ids)
        self._user = lru_cache(maxsize=maxsize)(self._encode_user)
        self._template = lru_cache(maxsize=1024)(self._encode_template)
        self.leading_ids = tokenizer.leading_ids

    def encode(self, text: str, *, template: bool = False) -> TokenIds:
        """Token ids of `text` (no BOS/EOS added); cached."""
        return self._template(text) if template else self._user(text)

    def _encode_user(self, text: str) -> TokenIds:
        return self._checked(text, special_tokens_as_text=True)

    def _encode_template(self, text: str) -> TokenIds:
        return self._checked(text, special_tokens_as_text=False)

    def _checked(self, text: str, *, special_tokens_as_text: bool) -> TokenIds:
        problem = unicode_problem(text)
        if problem is not None:
            raise PromptError(f"text {text[:40]!r} {problem}")
        ids = tuple(self.tokenizer.encode(text, special_tokens_as_text=special_tokens_as_text))
        if not self._markers.isdisjoint(ids):
            raise ConfigError(
                f"tokenizing {text[:60]!r} produced MiniPIC marker ids "
                f"{sorted(self._markers.intersection(ids))}: the server's marker ids are not special "
                "tokens of this tokenizer, so documents could open spans"
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

