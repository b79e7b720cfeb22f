"""``GET /minipic/info``: what a server tells clients, written by the server and read by the client.

`PROTOCOL_VERSION` names this schema together with the block rule (`minipic_protocol.blocks`)
and the marker roles: a client and a server that disagree on it would lay out prompts the
server hashes differently, so the client refuses such a server in one line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from minipic_protocol.markers import MarkerIds

# Bump on any change a client of the previous version would misread.
PROTOCOL_VERSION = 1


class InfoError(ValueError):
    """The info a server published cannot be used by this client."""


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
    hsep_token_id: int | None = None  # None: no hidden heads (no fourth unused special token)
    compact: bool = False  # the compact reading (`minipic_protocol.compact`); absent from older servers
    span_bias: float = 0.0  # added to span keys' logits read from outside spans (`weighed_by_span_bias`)
    protocol_version: int = PROTOCOL_VERSION
    pic: bool = True  # False: a stock vLLM server (plain prompts only); never published

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

    def to_json(self) -> dict[str, Any]:
        """The endpoint's JSON object (``hsep_token_id`` null: this server has no HSep marker)."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self) if field.name != "pic"}

    @classmethod
    def from_json(cls, data: Any) -> ServerInfo:
        """Parse the endpoint's JSON, refusing another protocol version first; unknown keys are
        ignored so servers can add some."""
        if not isinstance(data, Mapping):
            raise InfoError(f"/minipic/info returned {type(data).__name__}, not an object")
        theirs = data.get("protocol_version")
        if theirs != PROTOCOL_VERSION:
            raise InfoError(
                f"the server speaks MiniPIC protocol {theirs or 'before 1'} (MiniPIC "
                f"{data.get('minipic_version', 'unknown')}), this client speaks {PROTOCOL_VERSION}: "
                "install the same MiniPIC release on the client and the server"
            )
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            if field.name == "pic":
                continue
            value = data.get(field.name)
            if field.type == "bool":
                value = data.get(field.name, False)
                if not isinstance(value, bool):
                    raise InfoError(f"/minipic/info: {field.name!r} is {value!r}, expected bool")
                values[field.name] = value
                continue
            if field.type == "float":  # absent from older servers: the field's default
                value = data.get(field.name, field.default)
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise InfoError(f"/minipic/info: {field.name!r} is {value!r}, expected a number")
                values[field.name] = float(value)
                continue
            if field.type == "int | None":
                ok = value is None or _is_int(value)
            else:
                ok = _is_int(value) if field.type == "int" else isinstance(value, str)
            if not ok or field.name not in data:
                raise InfoError(f"/minipic/info: {field.name!r} is {value!r}, expected {field.type}")
            values[field.name] = value
        if values["block_size"] < 1:
            raise InfoError(f"/minipic/info: block_size is {values['block_size']}")
        return cls(**values)

    @property
    def markers(self) -> MarkerIds:
        return MarkerIds(self.ssep_token_id, self.pdep_token_id, self.pad_token_id, self.hsep_token_id)

    @property
    def layout_key(self) -> tuple[object, ...]:
        """What the client's prompts depend on; a restart that changes it needs a new client."""
        return (self.model, self.tokenizer, self.block_size, *dataclasses.astuple(self.markers))

    @property
    def marker_ids(self) -> frozenset[int]:
        """Ids that user text must never produce (none on a stock server)."""
        return frozenset(self.markers.ids) if self.pic else frozenset()


def _is_int(value: Any) -> bool:
    """bool is an int subclass; a JSON true is never a valid size or id."""
    return isinstance(value, int) and not isinstance(value, bool)
