"""The server's tokenizer without transformers: `tokenizers` for ids, jinja2 for the chat template.

A Hugging Face tokenizer directory holds everything the client needs:
``tokenizer.json`` (read by the `tokenizers` library, the engine under
transformers' fast tokenizers, so the ids are the same) and the chat template
with its special tokens (``chat_template.jinja`` or ``tokenizer_config.json``),
rendered with the jinja2 settings of Hugging Face chat templates.
"""

from __future__ import annotations

import ctypes
import json
import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from jinja2.ext import Extension
from tokenizers import Tokenizer as FastTokenizer

from minipic_client.errors import ConfigError

_TOKENIZER_FILE = "tokenizer.json"
_CONFIG_FILE = "tokenizer_config.json"
_TEMPLATE_FILE = "chat_template.jinja"
_FILES = (_TOKENIZER_FILE, _CONFIG_FILE, _TEMPLATE_FILE)


class Tokenizer:
    """Token ids and chat-template text, as the server's Hugging Face tokenizer gives them.

    Use `from_pretrained` with a local directory or a Hugging Face model name.
    """

    def __init__(
        self,
        backend: FastTokenizer,
        *,
        chat_template: str | None = None,
        special_tokens: Mapping[str, str] | None = None,
    ) -> None:
        self._backend = backend
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})  # bos_token, eos_token, ...: what templates may use

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike[str], *, revision: str | None = None) -> Tokenizer:
        """Load from a tokenizer directory, or download its files from the Hugging Face Hub."""
        directory = _tokenizer_dir(os.fspath(name_or_path), revision)
        if not (directory / _TOKENIZER_FILE).is_file():
            raise ConfigError(
                f"cannot load tokenizer {os.fspath(name_or_path)!r}: it has no {_TOKENIZER_FILE} (MiniPIC's "
                "client reads fast tokenizers); pass tokenizer= a local copy of the server's tokenizer directory"
            )
        config = json.loads(_read(directory, _CONFIG_FILE) or "{}")
        template = _read(directory, _TEMPLATE_FILE) or _template_from_config(config.get("chat_template"))
        special = {key: _content(value) for key, value in config.items() if key.endswith("_token")}
        backend = FastTokenizer.from_file(str(directory / _TOKENIZER_FILE))
        _return_freed_heap()
        return cls(backend, chat_template=template, special_tokens={k: v for k, v in special.items() if v})

    def __len__(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self._backend.get_vocab(with_added_tokens=True)

    def encode(self, text: str, *, special_tokens_as_text: bool = True) -> list[int]:
        """Ids of `text` with nothing added (no BOS/EOS). ``special_tokens_as_text``: a special
        token's string in `text` is encoded as plain text, never as the special token."""
        self._backend.encode_special_tokens = special_tokens_as_text
        return self._backend.encode(text, add_special_tokens=False).ids

    @cached_property
    def leading_ids(self) -> tuple[int, ...]:
        """Ids the tokenizer puts before text by default (Llama's BOS), as vLLM does for text prompts."""
        self._backend.encode_special_tokens = True
        bare = self._backend.encode("a", add_special_tokens=False).ids
        full = self._backend.encode("a", add_special_tokens=True).ids
        for start in range(len(full) - len(bare) + 1):
            if full[start : start + len(bare)] == bare:
                return tuple(full[:start])
        return ()

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> str:
        """The chat template's text for `messages` (raises jinja2's TemplateError on a template error)."""
        if self.chat_template is None:
            raise ConfigError("this tokenizer has no chat template")
        return self._template.render(
            messages=list(messages),
            tools=None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **self.special_tokens,
        )

    @cached_property
    def _template(self) -> Any:
        from jinja2 import TemplateSyntaxError
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        # The dialect of Hugging Face chat templates: block trimming, loop controls, these helpers.
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _GenerationTag]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            return env.from_string(self.chat_template)
        except TemplateSyntaxError as exc:
            raise ConfigError(f"the tokenizer's chat template does not compile ({exc}); pass raw=True") from None


def _tokenizer_dir(name_or_path: str, revision: str | None) -> Path:
    """A local tokenizer directory, or the Hub snapshot of the tokenizer's files (downloaded once, cached)."""
    if Path(name_or_path).is_dir():
        return Path(name_or_path)
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(name_or_path, revision=revision, allow_patterns=list(_FILES)))
    except (OSError, ValueError) as exc:  # offline and not cached, unknown or gated repository, bad name
        raise ConfigError(
            f"cannot load tokenizer {name_or_path!r} ({type(exc).__name__}: {exc}); "
            "pass tokenizer= a local copy of the server's"
        ) from None


def _return_freed_heap() -> None:
    """Parsing tokenizer.json takes several times the memory the tokenizer keeps, and glibc holds on
    to what was freed (Llama 3: 137 MB resident after loading, 46 MB once returned). Return it."""
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to do
        return
    malloc_trim(0)


def _read(directory: Path, filename: str) -> str | None:
    path = directory / filename
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _template_from_config(value: Any) -> str | None:
    """``chat_template`` of tokenizer_config.json: a string, or named templates (the default one)."""
    if value is None or isinstance(value, str):
        return value
    named = {item.get("name"): item.get("template") for item in value if isinstance(item, Mapping)}
    if "default" not in named:
        raise ConfigError(f"the tokenizer has named chat templates {sorted(named)} but no 'default' one")
    return named["default"]


def _content(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or ``{"content": ...}``."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _GenerationTag(Extension):
    """``{% generation %}...{% endgeneration %}`` marks assistant text for training masks; it renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> list[Any]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)
