"""Which of a new request's token ids the V2 runner stages for the device (`token_staging`).

The V2 runner (vLLM 0.26 on CUDA) cannot be built on the CPU VM: a stand-in runner here stages
token ids as vLLM's ``add_requests`` does and records what is staged. The GPU suite runs the
real one, against a cold cache (`make test-gpu`).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from vllm import SamplingParams
from vllm.v1.worker.gpu.sample.penalties import use_penalty

from minipic_server.token_staging import cached_head, wrap_add_requests

PIC_ON = SimpleNamespace(additional_config={"minipic": {"ssep_token_id": 5, "pdep_token_id": 6, "pad_token_id": 7}})
PIC_OFF = SimpleNamespace(additional_config={})


def new_request(req_id: str, prompt: int, computed: int, outputs: int = 0, **params: Any) -> SimpleNamespace:
    """The fields of vLLM's ``NewRequestData`` the staging reads."""
    prompt_ids = list(range(100, 100 + prompt))
    return SimpleNamespace(
        req_id=req_id,
        prompt_token_ids=prompt_ids,
        prefill_token_ids=prompt_ids + list(range(900, 900 + outputs)),
        num_computed_tokens=computed,
        sampling_params=SamplingParams(**params),
        mm_features=[],
    )


class TokenTable:
    """Records staged writes as vLLM's ``StagedWriteTensor.stage_write`` receives them."""

    def __init__(self) -> None:
        self.writes: list[tuple[int, int, list[int]]] = []

    def stage_write(self, index: int, start: int, x: list[int]) -> None:
        self.writes.append((index, start, list(x)))


class Runner:
    """What ``GPUModelRunner.add_requests`` does with token ids: each new request's
    ``prefill_token_ids`` staged from 0 into its row (``RequestState.add_request``)."""

    def __init__(self, vllm_config: Any) -> None:
        self.vllm_config = vllm_config
        self.req_states = SimpleNamespace(all_token_ids=TokenTable())

    def add_requests(self, scheduler_output: Any) -> None:
        for index, new in enumerate(scheduler_output.scheduled_new_reqs):
            self.req_states.all_token_ids.stage_write(index, 0, new.prefill_token_ids)
        if scheduler_output.fail:
            raise RuntimeError("vLLM failed")


def run(vllm_config: Any, *requests: SimpleNamespace, fail: bool = False) -> Runner:
    runner = Runner(vllm_config)
    add_requests = wrap_add_requests(Runner.add_requests)
    add_requests(runner, SimpleNamespace(scheduled_new_reqs=list(requests), fail=fail))
    return runner


def test_only_the_tokens_past_the_cached_head_are_staged() -> None:
    cached, fresh = new_request("a", prompt=40, computed=32), new_request("b", prompt=10, computed=0)
    writes = run(PIC_ON, cached, fresh).req_states.all_token_ids.writes
    assert writes == [(0, 32, cached.prompt_token_ids[32:]), (1, 0, fresh.prompt_token_ids)]


@pytest.mark.parametrize(
    "params",
    [{"repetition_penalty": 1.2}, {"frequency_penalty": 0.5}, {"presence_penalty": 0.5}, {"prompt_logprobs": 0}],
    ids=["repetition", "frequency", "presence", "prompt_logprobs"],
)
def test_a_request_that_reads_its_prompt_on_the_device_stages_it_all(params: dict[str, Any]) -> None:
    request = new_request("a", prompt=40, computed=32, **params)
    assert run(PIC_ON, request).req_states.all_token_ids.writes == [(0, 0, request.prefill_token_ids)]


def test_multimodal_and_pooling_requests_stage_it_all() -> None:
    with_image = new_request("a", prompt=40, computed=32)
    with_image.mm_features = [object()]
    pooling = new_request("b", prompt=40, computed=32)
    pooling.sampling_params = None
    assert cached_head(with_image, use_penalty) == cached_head(pooling, use_penalty) == 0


def test_a_resumed_requests_output_tokens_stay_staged() -> None:
    """Bad-word matching reads output tokens from the table: only prompt tokens are left out."""
    resumed = new_request("a", prompt=40, computed=48, outputs=10)
    assert cached_head(resumed, use_penalty) == 40
    assert run(PIC_ON, resumed).req_states.all_token_ids.writes == [(0, 40, resumed.prefill_token_ids[40:])]


def test_without_pic_and_after_a_failure_vllms_staging_is_untouched() -> None:
    request = new_request("a", prompt=40, computed=32)
    assert run(PIC_OFF, request).req_states.all_token_ids.writes == [(0, 0, request.prefill_token_ids)]
    runner = Runner(PIC_ON)
    with pytest.raises(RuntimeError, match="vLLM failed"):
        wrap_add_requests(Runner.add_requests)(runner, SimpleNamespace(scheduled_new_reqs=[request], fail=True))
    assert "stage_write" not in vars(runner.req_states.all_token_ids)  # the class's method again
