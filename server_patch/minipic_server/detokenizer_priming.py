"""A request's first generated token detokenized after the prompt's tail, not the whole prompt.

vLLM primes each request's incremental detokenizer (tokenizers' ``DecodeStream``) with
the entire prompt, and the stream decodes all of it when the first token arrives: over
10 ms for a 35,000-token prompt on a 2-core VM (`benchmarks/request_overhead.py`), in the
API-server process, on the way to every first token. A request over cached documents
computes a few tokens, so this becomes the largest cost that grows with its prompt.

A new token's text depends only on the few tokens before it (a character split over byte
tokens, a word piece joining the one before), so MiniPIC primes the stream with the
prompt's last `TAIL_TOKENS` tokens when they decode to text with no broken character;
otherwise vLLM's own priming stays. vLLM's constructor runs unchanged on the real request
(its stream is replaced after, at the cost of handing the prompt to tokenizers once), so
nothing else it reads from the request can drift. Active only in servers whose engine runs
PIC (`activate`, from the start-up hook), like the rest of the plugin.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tokenizers

TAIL_TOKENS = 32  # far more than a character's bytes or a word's pieces
REPLACEMENT = "\ufffd"  # what a decoder makes of a character cut at the tail's start or end

_active = False


def activate() -> None:
    """Prime from the tail in this process (the engine configuration just activated PIC)."""
    global _active
    _active = True


def prompt_tail(tokenizer: Any, prompt_token_ids: Sequence[int], skip_special_tokens: bool) -> list[int] | None:
    """The prompt's last tokens, if they stand for the whole prompt as a new token's context;
    None when the prompt is short or its tail decodes to nothing or to a broken character."""
    if len(prompt_token_ids) <= TAIL_TOKENS:
        return None
    tail = list(prompt_token_ids[-TAIL_TOKENS:])
    text = tokenizer.decode(tail, skip_special_tokens=skip_special_tokens)
    if not text.strip() or REPLACEMENT in text:
        return None
    return tail


def wrap_fast_detokenizer_init(original: Callable[..., None]) -> Callable[..., None]:
    def __init__(self: Any, tokenizer: Any, request: Any) -> None:
        original(self, tokenizer, request)
        if not _active or request.prompt_token_ids is None:
            return
        tail = prompt_tail(self.tokenizer, request.prompt_token_ids, self.skip_special_tokens)
        if tail is not None:
            # Looked up on the module at call time, as vLLM does, so shims that replace it apply.
            self.stream = tokenizers.decoders.DecodeStream(ids=tail, skip_special_tokens=self.skip_special_tokens)

    return __init__
