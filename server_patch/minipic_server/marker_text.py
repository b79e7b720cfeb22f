"""Text the server tokenizes never yields a marker id (API-server process).

Markers count only in token-id prompts. vLLM tokenizes text prompts and rendered
chat messages with special tokens matched, so a user who types
``<|minipic_ssep|>`` (on Llama 3 ``<|reserved_special_token_10|>``) would place
an SSep and detach the rest of the prompt from the system prompt. The renderer
therefore gets a tokenizer that re-encodes every marker it produces as the
ordinary text of the marker's string; the chat template's own special tokens
(``<|eot_id|>``, ...) stay special. Both ``__call__`` (completions, and chat
templates, which call it) and ``encode`` are covered.

A tokenizer splits text at special tokens before anything else, so a marker's
string re-encoded on its own gives the tokens that string would get were it not
special, up to merges across its edges.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Sequence
from typing import Any

from minipic_server.config import MiniPICConfigError, pic_config_of

TokenIds = list[int]


class _MarkerText:
    """The ordinary-text token ids (and character offsets) of each marker's string."""

    def __init__(self, tokenizer: Any, marker_ids: Collection[int]) -> None:
        self.marker_ids = frozenset(marker_ids)
        self.ids: dict[int, TokenIds] = {}
        self.offsets: dict[int, list[tuple[int, int]]] = {}
        for marker in sorted(self.marker_ids):
            text = tokenizer.convert_ids_to_tokens(marker)
            encoding = tokenizer(
                text,
                add_special_tokens=False,
                split_special_tokens=True,
                return_offsets_mapping=bool(getattr(tokenizer, "is_fast", False)),
            )
            ids = list(encoding["input_ids"])
            if not self.marker_ids.isdisjoint(ids):
                raise MiniPICConfigError(
                    f"marker id {marker} ({text!r}) is produced by ordinary text: "
                    "markers must be dedicated special tokens"
                )
            self.ids[marker] = ids
            self.offsets[marker] = list(encoding.get("offset_mapping") or [(0, 0)] * len(ids))

    def replaced(self, ids: Sequence[int]) -> TokenIds | None:
        """`ids` with every marker re-encoded as text, or None when there is none."""
        if self.marker_ids.isdisjoint(ids):
            return None
        out: TokenIds = []
        for token in ids:
            out.extend(self.ids.get(token, (token,)))
        return out

    def splice(self, encoding: Any) -> None:
        """Re-encode the markers of a `BatchEncoding` (one sequence or a batch) in place,
        keeping its per-token fields (attention mask, offsets, ...) aligned."""
        ids = encoding["input_ids"]
        batched = bool(ids) and isinstance(ids[0], (list, tuple))
        for row in range(len(ids)) if batched else [None]:
            sequence = ids if row is None else ids[row]
            if self.marker_ids.isdisjoint(sequence):
                continue
            spots = [(i, token) for i, token in enumerate(sequence) if token in self.marker_ids]
            for key in _PER_TOKEN_FIELDS & encoding.keys():
                values = encoding[key] if row is None else encoding[key][row]
                new = self._spliced(key, values, spots)
                if row is None:
                    encoding[key] = new
                else:
                    encoding[key][row] = new
            if "length" in encoding:
                if row is None:
                    encoding["length"] = len(encoding["input_ids"])
                else:
                    encoding["length"][row] = len(encoding["input_ids"][row])

    def _spliced(self, key: str, values: Sequence[Any], spots: list[tuple[int, int]]) -> list[Any]:
        out: list[Any] = []
        last = 0
        for i, marker in spots:
            out.extend(values[last:i])
            out.extend(self._field(key, values[i], marker))
            last = i + 1
        out.extend(values[last:])
        return out

    def _field(self, key: str, value: Any, marker: int) -> list[Any]:
        """The values of `key` for a marker's replacement tokens, from the marker's own value."""
        if key == "input_ids":
            return list(self.ids[marker])
        if key == "offset_mapping":
            start = value[0]
            return [(start + a, start + b) for a, b in self.offsets[marker]]
        if key == "special_tokens_mask":
            return [0] * len(self.ids[marker])
        return [value] * len(self.ids[marker])  # attention_mask, token_type_ids


_PER_TOKEN_FIELDS = frozenset(
    {"input_ids", "attention_mask", "token_type_ids", "special_tokens_mask", "offset_mapping"}
)


def marker_safe(tokenizer: Any, marker_ids: Collection[int]) -> Any:
    """A copy of `tokenizer` whose ``__call__`` and ``encode`` never return a marker id."""
    from transformers import BatchEncoding

    text = _MarkerText(tokenizer, marker_ids)
    base = type(tokenizer)

    class MarkerSafeTokenizer(base):  # type: ignore[misc, valid-type]
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return_tensors = kwargs.pop("return_tensors", None)
            encoding = super().__call__(*args, **kwargs)
            text.splice(encoding)
            if return_tensors is not None:
                encoding.convert_to_tensors(return_tensors)
            return encoding

        def encode(self, *args: Any, **kwargs: Any) -> Any:
            return_tensors = kwargs.pop("return_tensors", None)
            ids = super().encode(*args, **kwargs)
            ids = text.replaced(ids) or ids
            if return_tensors is None:
                return ids
            return BatchEncoding({"input_ids": ids}, tensor_type=return_tensors, prepend_batch_axis=True)["input_ids"]

        def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
            return marker_safe, (original, tuple(text.marker_ids))

    MarkerSafeTokenizer.__name__ = f"MarkerSafe{base.__name__}"
    original = tokenizer
    safe = copy.copy(tokenizer)
    safe.__class__ = MarkerSafeTokenizer
    return safe


def wrap_load_renderer(original: Callable[..., Any]) -> Callable[..., Any]:
    """Hand every renderer of a PIC engine a marker-safe tokenizer (API-server process; the
    hook is installed by `minipic_server.boundary`)."""

    def load_renderer(self: Any, renderer_mode: str, config: Any, tokenizer: Any) -> Any:
        pic = pic_config_of(config)
        if pic is not None and tokenizer is not None:
            tokenizer = marker_safe(tokenizer, pic.marker_ids)
        return original(self, renderer_mode, config, tokenizer)

    return load_renderer
