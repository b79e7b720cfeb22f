"""Marker tokens (SSep, PDep, pad, HSep): one rule for what may be one, used to pick them and to check them.

A marker changes how the server hashes and attends, so only a token-id prompt that means it
may contain it. A token id may be a marker when

- it is an added *special* token: ordinary vocabulary tokens (``}``) come out of text;
- encoding text never produces it: it is not a token the tokenizer inserts by itself (BOS,
  EOS), nor BOS at all, nor the unknown token, and its own characters, encoded as text, give
  other ids;
- the chat template never emits it: its text is not in the template, nor in a rendered
  conversation;
- it is not the end-of-sequence token (markers are banned from generation, EOS must not be).

The reference fork used ``+`` and ``@``, which any user text produces.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import astuple, fields, replace
from typing import Any

from minipic_protocol import MarkerIds
from minipic_server.config import MiniPICConfigError

# Dedicated tokens of the embedded tiny model (and of any tokenizer that adds them).
SSEP_TOKEN = "<|minipic_ssep|>"
PDEP_TOKEN = "<|minipic_pdep|>"
PAD_TOKEN = "<|minipic_pad|>"
HSEP_TOKEN = "<|minipic_hsep|>"

# Preferred names, tried in order before the general choice, so that ids stay what
# deployments already use: MiniPIC's own tokens, then three of Llama 3's 250 reserved ones.
PREFERRED_NAMES = (
    (SSEP_TOKEN, PDEP_TOKEN, PAD_TOKEN),
    ("<|reserved_special_token_10|>", "<|reserved_special_token_11|>", "<|reserved_special_token_12|>"),
)
# HSep came later; it is picked after the other three, which it never changes: the name
# that goes with the set picked, else the last unused special token they left.
PREFERRED_HSEP_NAMES = (HSEP_TOKEN, "<|reserved_special_token_13|>")

_SAMPLE_CONVERSATIONS = (
    [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
     {"role": "user", "content": "u"}],
    [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "u"}],
)


@functools.lru_cache(maxsize=4)
def load_tokenizer(name: str, revision: str | None = None, trust_remote_code: bool = False) -> Any:
    """The served tokenizer, loaded once per process (marker choice and guards share it)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name, revision=revision, trust_remote_code=trust_remote_code)


class MarkerRule:
    """Which ids of one tokenizer may be markers, and why the others may not."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._special = {
            token_id: added.content
            for token_id, added in tokenizer.added_tokens_decoder.items()
            if added.special
        }
        with_specials = tokenizer.encode("a", add_special_tokens=True)
        self._inserted = set(with_specials) - set(tokenizer.encode("a", add_special_tokens=False))
        self._template_sources, self._template_ids = _chat_template_output(tokenizer)

    def problem(self, token_id: int) -> str | None:
        """Why `token_id` cannot be a marker, or None when it can."""
        tokenizer = self._tokenizer
        if not 0 <= token_id < len(tokenizer):
            return f"it is outside the tokenizer's vocabulary (size {len(tokenizer)})"
        content = self._special.get(token_id)
        if content is None:
            text = tokenizer.convert_ids_to_tokens(token_id)
            return f"{text!r} is an ordinary token, which text produces (a marker must be an unused special token)"
        if token_id in self._inserted or token_id == tokenizer.bos_token_id:
            return f"{content!r} is inserted into prompts by the tokenizer (BOS/EOS)"
        if token_id == tokenizer.unk_token_id:
            return f"{content!r} is the unknown token, which text produces"
        if token_id == tokenizer.eos_token_id:
            return f"{content!r} ends generation, and markers are banned from generation"
        if token_id in self._template_ids or any(content in source for source in self._template_sources):
            return f"the chat template emits {content!r}"
        if token_id in tokenizer(content, add_special_tokens=False, split_special_tokens=True)["input_ids"]:
            return f"encoding the text {content!r} produces it"
        return None

    def valid_ids(self) -> list[int]:
        return [token_id for token_id in sorted(self._special) if self.problem(token_id) is None]

    def pick(self) -> MarkerIds:
        """The first preferred name set that is valid, else the last three valid ids; then
        HSep (`pick_hsep`).

        Tokenizers list their working special tokens first and unused ones last.
        """
        vocab = self._tokenizer.get_vocab()
        for names in PREFERRED_NAMES:
            ids = [vocab.get(name) for name in names]
            if all(token_id is not None and self.problem(token_id) is None for token_id in ids):
                return self.with_hsep(MarkerIds(*ids))
        valid = self.valid_ids()
        if len(valid) < 3:
            raise MiniPICConfigError(
                f"cannot pick MiniPIC markers: this tokenizer has {len(valid)} unused special tokens "
                f"({_ids(valid)}), 3 are needed; add special tokens to the tokenizer and pass "
                "--ssep-token-id, --pdep-token-id and --pad-token-id"
            )
        return self.with_hsep(MarkerIds(*valid[-3:]))

    def with_hsep(self, markers: MarkerIds) -> MarkerIds:
        """`markers` with an HSep id picked when they have none: the first valid preferred
        name, else the last valid id the other markers do not use, else none (the server
        then serves no hidden heads)."""
        if markers.hsep_token_id is not None:
            return markers
        taken = set(astuple(markers))
        vocab = self._tokenizer.get_vocab()
        preferred = [vocab.get(name) for name in PREFERRED_HSEP_NAMES]
        free = [i for i in self.valid_ids() if i not in taken]
        candidates = [i for i in preferred if i in free] + free[::-1]
        return replace(markers, hsep_token_id=candidates[0] if candidates else None)

    def stand_in(self, spec: str) -> int:
        """The ordinary token ``--embed-markers-as`` names: ``newline`` or a token id."""
        if spec == "newline":
            ids = self._tokenizer.encode("\n", add_special_tokens=False)
            if len(ids) != 1:
                raise MiniPICConfigError(f"--embed-markers-as newline: this tokenizer encodes a newline as {ids}")
            return ids[0]
        if not spec.isdigit():
            raise MiniPICConfigError(f"--embed-markers-as takes 'newline' or a token id, got {spec!r}")
        token_id = int(spec)
        if not 0 <= token_id < len(self._tokenizer) or token_id in self._special:
            raise MiniPICConfigError(f"--embed-markers-as {token_id}: not an ordinary token of this tokenizer")
        return token_id

    def check(self, markers: MarkerIds) -> None:
        """Refuse, in one line, the first marker id that breaks the rule."""
        for field, token_id in zip(fields(markers), astuple(markers)):
            if token_id is None:
                continue
            problem = self.problem(token_id)
            if problem is not None:
                raise MiniPICConfigError(
                    f"{field.name}={token_id} cannot be a MiniPIC marker: {problem}; "
                    f"unused special tokens of this tokenizer: {_ids(self.valid_ids())}"
                )


def pick_marker_ids(tokenizer: Any) -> MarkerIds:
    return MarkerRule(tokenizer).pick()


def check_marker_ids(tokenizer: Any, markers: MarkerIds) -> None:
    MarkerRule(tokenizer).check(markers)


def _chat_template_output(tokenizer: Any) -> tuple[list[str], set[int]]:
    """The template's source texts, and the ids of sample conversations rendered through it."""
    from jinja2 import TemplateError

    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return [], set()
    sources = list(template.values()) if isinstance(template, dict) else [template]
    ids: set[int] = set()
    for conversation in _SAMPLE_CONVERSATIONS:
        try:
            rendered = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        except (TemplateError, ValueError):  # a template may refuse a role order; the other sample covers it
            continue
        ids.update(tokenizer.encode(rendered, add_special_tokens=False))
    return sources, ids


def _ids(ids: Sequence[int]) -> str:
    """A short list of ids, e.g. ``3, 4, 5, ..., 16 (14 ids)``."""
    if len(ids) <= 6:
        return ", ".join(map(str, ids)) or "none"
    return f"{', '.join(map(str, ids[:3]))}, ..., {', '.join(map(str, ids[-3:]))} ({len(ids)} ids)"
