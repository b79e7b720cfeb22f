"""`SpanRAG`'s LangChain side: its chain run, and its model call reported to callbacks
as a chat model's (``on_chat_model_start``, a token per ``on_llm_new_token``,
``on_llm_end`` with usage), so tracing and ``astream_events`` show the call and
its tokens as they do for LangChain's own chat models. Imported only with
langchain-core installed.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForChainRun
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, SystemMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, LLMResult
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import patch_config

from minipic_client.client import RagRequest, RagResult

MODEL_NAME = "SpanClient"


@dataclass(frozen=True, slots=True)
class ChainRun:
    """The run LangChain opened for one `SpanRAG` call, and its config."""

    manager: AsyncCallbackManagerForChainRun
    config: RunnableConfig


Chunks = Callable[[str, ChainRun], AsyncGenerator[RagResult, None]]


def chain_run(
    runnable: Runnable[str, RagResult], question: str, config: Any, chunks: Chunks, **kwargs: Any
) -> AsyncIterator[RagResult]:
    """`chunks` of `question` inside a chain run of `runnable` (callbacks, tags, run name)."""

    async def transform(
        inputs: AsyncIterator[str], run_manager: AsyncCallbackManagerForChainRun, config: RunnableConfig
    ) -> AsyncIterator[RagResult]:
        question = "".join([part async for part in inputs])
        async for chunk in chunks(question, ChainRun(run_manager, config)):
            yield chunk

    async def single() -> AsyncIterator[str]:
        yield question

    return runnable._atransform_stream_with_config(single(), transform, config, **kwargs)


def child_config(run: ChainRun, retriever: Any) -> tuple[RunnableConfig, ...]:
    """The config to hand a retriever (its run nested under ours): only LangChain ones take it."""
    if not isinstance(retriever, Runnable):
        return ()
    return (patch_config(run.config, callbacks=run.manager.get_child()),)


async def model_run(
    run: ChainRun, request: RagRequest, chunks: AsyncGenerator[RagResult, None]
) -> AsyncGenerator[RagResult, None]:
    """`chunks` passed through, reported as a chat-model run nested under `run`."""
    (llm,) = await run.manager.get_child().on_chat_model_start(
        {"name": MODEL_NAME}, [_messages(request)], name=MODEL_NAME,
        invocation_params={"max_tokens": request.max_tokens, "temperature": request.temperature},
    )
    result: RagResult | None = None
    try:
        async for chunk in chunks:
            if chunk.text:
                message = AIMessageChunk(content=chunk.text)
                await llm.on_llm_new_token(chunk.text, chunk=ChatGenerationChunk(message=message))
            result = chunk if result is None else result + chunk
            yield chunk
    except Exception as exc:
        await llm.on_llm_error(exc)
        raise
    assert result is not None, "a stream always ends with its usage chunk"
    await llm.on_llm_end(LLMResult(generations=[[ChatGeneration(message=_message(result))]]))


def _messages(request: RagRequest) -> list[BaseMessage]:
    """What the model is asked, as messages (for traces: the prompt itself is token ids)."""
    system = [SystemMessage(request.system)] if request.system else []
    return [*system, HumanMessage("\n\n".join([*request.docs, request.task]))]


def _message(result: RagResult) -> AIMessage:
    usage: dict[str, Any] = {
        "input_tokens": result.prompt_tokens,
        "output_tokens": len(result.token_ids),
        "total_tokens": result.prompt_tokens + len(result.token_ids),
    }
    if result.reused_tokens is not None:
        usage["input_token_details"] = {"cache_read": result.reused_tokens}
    metadata = {
        "finish_reason": result.finish_reason,
        "cached_tokens": result.cached_tokens,
        "computed_tokens": result.computed_tokens,
        "ttft_s": result.ttft_s,
    }
    return AIMessage(content=result.text, usage_metadata=usage, response_metadata=metadata)
