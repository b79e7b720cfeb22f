"""`wrap_attribute`: every vLLM hook goes through it, on instance methods, inherited classmethods
and module-level functions; and the hooks that must not change what vLLM computes."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from vllm.utils.torch_utils import async_tensor_h2d

from minipic_server.boundary import table
from minipic_server.patching import wrap_attribute
from minipic_server.token_staging import wrap_async_tensor_h2d


class Base:
    @classmethod
    def pick(cls, name: str) -> str:
        return f"{cls.__name__}:{name}"

    def run(self, value: int) -> int:
        return value + 1


class Platform(Base):  # inherits both, like vLLM's CudaPlatform and its classmethods
    pass


def tag(original):
    def wrapped(*args, **kwargs):
        return ("wrapped", original(*args, **kwargs))

    return wrapped


def test_inherited_classmethod_stays_callable_on_class_and_instance() -> None:
    wrap_attribute(Platform, "pick", tag)
    assert Platform.pick("a") == ("wrapped", "Platform:a")
    assert Platform().pick("b") == ("wrapped", "Platform:b")
    assert Base.pick("c") == "Base:c"  # the base class is left alone


def test_instance_method_keeps_self_and_is_wrapped_once() -> None:
    wrap_attribute(Platform, "run", tag)
    wrap_attribute(Platform, "run", tag)  # register() runs several times per process
    assert Platform().run(1) == ("wrapped", 2)
    assert Platform.run.__name__ == "run"


def test_a_module_level_function_is_wrapped_where_callers_look_it_up() -> None:
    module = types.ModuleType("helpers")
    module.stage = lambda value: value * 2
    wrap_attribute(module, "stage", tag)
    wrap_attribute(module, "stage", tag)
    assert module.stage(3) == ("wrapped", 6)
    entry = next(e for e in table.TABLE if e.target == "vllm.v1.worker.gpu.buffer_utils:async_tensor_h2d")
    assert table._owner(entry).__name__ == "vllm.v1.worker.gpu.buffer_utils"


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32])
def test_token_ids_staged_through_numpy_equal_vllms_own_staging(dtype: torch.dtype) -> None:
    staged = wrap_async_tensor_h2d(async_tensor_h2d)
    ids = [0, 5, 128_255, 2**24, 7] * 1000
    ours, theirs = staged(ids, device="cpu", dtype=dtype), async_tensor_h2d(ids, device="cpu", dtype=dtype)
    assert ours.dtype == theirs.dtype == dtype
    assert torch.equal(ours, theirs)
    assert torch.equal(staged(np.array(ids), "cpu", dtype), theirs)  # arrays and tensors pass through
    with pytest.raises((OverflowError, RuntimeError)):
        staged([2**63], device="cpu", dtype=torch.int64)  # out of range fails as vLLM's own does
