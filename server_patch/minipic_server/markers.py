"""Choosing the marker token ids (SSep, PDep, pad) for a tokenizer.

Markers must be dedicated special tokens: a user's text can then never produce
them by accident (the reference fork's '+' and '@' could).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Protocol

# Dedicated tokens of the embedded tiny model (and of any tokenizer that adds them).
SSEP_TOKEN = "<|minipic_ssep|>"
PDEP_TOKEN = "<|minipic_pdep|>"
PAD_TOKEN = "<|minipic_pad|>"

# Llama 3 ships 250 unused special tokens; these three are never emitted by its
# instruct models and are not part of its chat template.
LLAMA3_SSEP_TOKEN = "<|reserved_special_token_10|>"
LLAMA3_PDEP_TOKEN = "<|reserved_special_token_11|>"
LLAMA3_PAD_TOKEN = "<|reserved_special_token_12|>"

_CANDIDATES = (
    (SSEP_TOKEN, PDEP_TOKEN, PAD_TOKEN),
    (LLAMA3_SSEP_TOKEN, LLAMA3_PDEP_TOKEN, LLAMA3_PAD_TOKEN),
)


class _Vocab(Protocol):
    def get_vocab(self) -> dict[str, int]: ...


@dataclass(frozen=True)
class MarkerIds:
    ssep_token_id: int
    pdep_token_id: int
    pad_token_id: int


@functools.lru_cache(maxsize=4)
def load_tokenizer(name: str, revision: str | None = None, trust_remote_code: bool = False) -> Any:
    """The served tokenizer, loaded once per process (marker choice and guards share it)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name, revision=revision, trust_remote_code=trust_remote_code)


def pick_marker_ids(tokenizer: _Vocab) -> MarkerIds:
    """Marker ids from the first candidate set the tokenizer fully contains."""
    vocab = tokenizer.get_vocab()
    for names in _CANDIDATES:
        if all(name in vocab for name in names):
            return MarkerIds(*(vocab[name] for name in names))
    raise ValueError(
        "cannot pick MiniPIC marker tokens for this tokenizer: it has neither "
        f"{SSEP_TOKEN}/{PDEP_TOKEN}/{PAD_TOKEN} nor Llama 3's reserved special tokens; "
        "pass --ssep-token-id, --pdep-token-id and --pad-token-id (ids of unused special tokens)"
    )
