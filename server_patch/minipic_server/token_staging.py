"""A new request's token ids reach the GPU through numpy, and only those the device reads.

vLLM 0.26's V2 model runner stages every new request's token ids for the device through
`async_tensor_h2d`, which builds its host tensor from the Python list with ``torch.tensor``:
about 100 ns a token, 3.5 ms of a cached 35k-token prompt's 38.6 ms TTFT on the H100
(py-spy, `benchmarks/results/cached-ttft-h100-67d6def.json`), though none of those tokens
is computed. numpy builds the same array about four times faster; vLLM then pins and copies
it as before. Even so, staging 35,559 tokens of which 7 are computed still took 2.9 ms on the
H100 (`benchmarks/results/cached-ttft-h100-a3ce8b9-profile-cut-short.json`): where nothing
on the device reads a request's cached prompt tokens, they are not staged at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from minipic_server import boundary
from minipic_server.config import pic_enabled

_NUMPY_DTYPES = {torch.int32: np.int32, torch.int64: np.int64, torch.float32: np.float32}


def wrap_async_tensor_h2d(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``original`` given a numpy array where it was given a list of a dtype numpy shares."""

    def async_tensor_h2d(data: Any, device: Any, dtype: torch.dtype | None = None, **kwargs: Any) -> torch.Tensor:
        if isinstance(data, list) and dtype in _NUMPY_DTYPES:
            data = np.array(data, dtype=_NUMPY_DTYPES[dtype])
        return original(data, device, dtype, **kwargs)

    return async_tensor_h2d


def cached_head(new_request: Any, use_penalty: Callable[[Any], bool]) -> int:
    """How many leading tokens of a new request (vLLM's ``NewRequestData``) nothing on the device
    will read: its cached prompt tokens. The forward reads only the tokens it computes, from the
    computed count on (gapped hits only move that count forward); penalties (a prompt bincount),
    prompt logprobs and multimodal pruning read the whole prompt, so their requests stage it all.
    Output tokens of a resumed request stay staged: bad-word matching reads them."""
    params = new_request.sampling_params
    if params is None or new_request.mm_features or params.prompt_logprobs is not None or use_penalty(params):
        return 0
    return min(new_request.num_computed_tokens, len(new_request.prompt_token_ids))


def wrap_add_requests(original: Callable[..., None]) -> Callable[..., None]:
    """vLLM 0.26's ``GPUModelRunner.add_requests`` (V2), staging each new request's token ids from
    its `cached_head` on while PIC is active: the request's row of the device's token table then
    holds stale ids before that point, which nothing reads."""
    use_penalty = boundary.use_penalty  # the V2 runner's own rule for penalties

    def add_requests(self: Any, scheduler_output: Any) -> None:
        heads: dict[int, int] = {}
        if pic_enabled(self.vllm_config):
            for new_request in scheduler_output.scheduled_new_reqs:
                if head := cached_head(new_request, use_penalty):
                    heads[id(new_request.prefill_token_ids)] = head
        if not heads:
            original(self, scheduler_output)
            return
        writer = self.req_states.all_token_ids
        stage_write = writer.stage_write

        def stage_past_cached_head(index: int, start: int, tokens: Any) -> None:
            head = heads.get(id(tokens), 0) if start == 0 else 0
            if head:
                stage_write(index, head, tokens[head:])
            else:
                stage_write(index, start, tokens)

        writer.stage_write = stage_past_cached_head  # this call's requests only: removed below
        try:
            original(self, scheduler_output)
        finally:
            del writer.stage_write

    return add_requests
