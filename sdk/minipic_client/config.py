"""`ServerInfo`: what ``GET /minipic/info`` tells the client about a server."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from minipic_client.errors import ConfigError


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """Layout parameters and limits of one server process.

    `instance_id` changes on every server start: spans prefilled before a
    restart are gone from its cache.
    """

    block_size: int
    ssep_token_id: int
    pdep_token_id: int
    pad_token_id: int
    max_num_seqs: int
    max_model_len: int
    model: str
    tokenizer: str
    vllm_version: str
    minipic_version: str
    instance_id: str
    hsep_token_id: int | None = None  # None: no hidden heads (an older server, or no fourth marker)
    pic: bool = True  # False: a stock vLLM server (plain prompts only)

    @classmethod
    def stock(cls, *, model: str, max_model_len: int, tokenizer: str, max_num_seqs: int) -> ServerInfo:
        """A stock vLLM server: no markers, no span reuse; only plain prompts make sense."""
        return cls(
            block_size=1,
            ssep_token_id=-1,
            pdep_token_id=-2,
            pad_token_id=-3,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            model=model,
            tokenizer=tokenizer,
            vllm_version="unknown",
            minipic_version="none",
            instance_id="stock",
            pic=False,
        )

    @classmethod
    def from_json(cls, data: Any) -> ServerInfo:
        """Parse the endpoint's JSON; unknown keys are ignored so servers can add some, and
        ``hsep_token_id`` may be missing or null (servers before hidden heads)."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"/minipic/info returned {type(data).__name__}, not an object")
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            if field.name == "pic":
                continue
            value = data.get(field.name)
            if field.type == "int | None" and value is None:
                continue
            if field.type.startswith("int"):
                # bool is an int subclass; a JSON true is never a valid size or id.
                ok = isinstance(value, int) and not isinstance(value, bool)
            else:
                ok = isinstance(value, str)
            if not ok:
                raise ConfigError(
                    f"/minipic/info: {field.name!r} is {value!r}, expected {field.type}"
                )
            values[field.name] = value
        if values["block_size"] < 1:
            raise ConfigError(f"/minipic/info: block_size is {values['block_size']}")
        return cls(**values)

    @property
    def layout_key(self) -> tuple[object, ...]:
        """What the client's prompts depend on; a restart that changes it needs a new client."""
        return (
            self.model,
            self.tokenizer,
            self.block_size,
            self.ssep_token_id,
            self.pdep_token_id,
            self.pad_token_id,
            self.hsep_token_id,
        )

    @property
    def marker_ids(self) -> frozenset[int]:
        """Ids that user text must never produce (none on a stock server)."""
        if not self.pic:
            return frozenset()
        ids = (self.ssep_token_id, self.pdep_token_id, self.pad_token_id, self.hsep_token_id)
        return frozenset(i for i in ids if i is not None)
