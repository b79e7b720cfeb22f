"""SpanRAG with a LangChain retriever and with duck-typed ones."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
from langchain_core.callbacks import BaseCallbackHandler, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableLambda

from minipic_client import ConfigError, RagResult, SpanRAG

pytest_plugins = ["sdk_fixtures"]  # fake_server, fake_client, sdk_tokenizer

TEXTS = ["The mill was built in 1820.\n", "The school opened in 1901.\n"]


class KeywordRetriever(BaseRetriever):
    """Returns every document (a real LangChain retriever, minimal)."""

    texts: list[str]

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return [Document(page_content=text) for text in self.texts]


@dataclass
class Doc:
    page_content: str


class SyncRetriever:
    def invoke(self, query: str) -> list[Doc]:
        return [Doc(text) for text in TEXTS]


class AsyncRetriever:
    async def ainvoke(self, query: str) -> list[Doc]:
        return [Doc(text) for text in TEXTS]


def final_prompt_spans(server) -> int:
    (final,) = server.of_kind("final")
    return final.prompt.count(server.ssep)


async def test_span_rag_is_a_langchain_runnable(fake_server, sdk_tokenizer, fake_client):
    async with fake_client() as client:
        rag = SpanRAG(
            KeywordRetriever(texts=TEXTS),
            client,
            system="Be brief.",
            task_template="Question: {question}",
            max_tokens=2,
        )
        assert isinstance(rag, Runnable)
        answer = await (rag | RunnableLambda(lambda result: result.text)).ainvoke("When?")
    assert answer == "t100 t101 "
    assert final_prompt_spans(fake_server) == 2
    (final,) = fake_server.of_kind("final")
    tail = sdk_tokenizer.decode(final.prompt[final.prompt.index(fake_server.pdep) + 1 :])
    assert tail.startswith("Question: When?")


@pytest.mark.parametrize(
    "retriever", [SyncRetriever(), AsyncRetriever()], ids=["invoke", "ainvoke"]
)
async def test_span_rag_takes_duck_typed_retrievers(fake_server, retriever, fake_client):
    async with fake_client() as client:
        result = await SpanRAG(retriever, client, max_tokens=1).ainvoke("When?")
    assert isinstance(result, RagResult)
    assert final_prompt_spans(fake_server) == 2


async def test_span_rag_refuses_what_it_cannot_use(fake_server, fake_client):
    async with fake_client() as client:
        with pytest.raises(ConfigError, match="not a retriever"):
            SpanRAG(object(), client)
        with pytest.raises(ConfigError, match=r"unknown option\(s\) \['max_token'\]"):
            SpanRAG(SyncRetriever(), client, max_token=3)
        with pytest.raises(ConfigError, match="inside a running event loop would stall it; await"):
            SpanRAG(SyncRetriever(), client).invoke("q")  # before: NotImplementedError


class Recorder(BaseCallbackHandler):
    """What a LangChain callback handler sees."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.tokens: list[str] = []

    def on_chat_model_start(self, serialized, messages, **kwargs) -> None:
        self.seen.append(f"chat_model_start {kwargs['name']}: {messages[0][-1].content[-5:]}")

    def on_llm_new_token(self, token: str, **kwargs) -> None:
        self.tokens.append(token)

    def on_llm_end(self, response, **kwargs) -> None:
        self.seen.append(f"llm_end {response.generations[0][0].message.usage_metadata['output_tokens']}")

    def on_retriever_end(self, documents, **kwargs) -> None:
        self.seen.append(f"retriever_end {len(documents)}")


def test_span_rag_blocking_calls_stream_and_pipe(fake_server, fake_client):
    """invoke, batch, stream and `|` without an event loop (before: NotImplementedError)."""
    rag = SpanRAG(KeywordRetriever(texts=TEXTS), fake_client(), system="Be brief.", max_tokens=2)
    try:
        recorder = Recorder()
        result = rag.invoke("When?", {"callbacks": [recorder]})
        assert result.text == "t100 t101 " and result.computed_tokens == result.prompt_tokens
        assert recorder.seen == ["retriever_end 2", "chat_model_start SpanClient: When?", "llm_end 2"]
        assert recorder.tokens == ["t100 ", "t101 "]
        assert (rag | RunnableLambda(lambda r: r.text)).invoke("Again?") == "t100 t101 "
        assert [r.text for r in rag.batch(["a", "b"])] == ["t100 t101 "] * 2
        chunks = list(rag.stream("Streamed?"))
        assert [c.text for c in chunks] == ["t100 ", "t101 ", ""]  # as generated, then the usage
        whole = sum(chunks[1:], chunks[0])
        assert (whole.text, whole.token_ids) == (result.text, result.token_ids)
        assert whole.prompt_tokens == chunks[-1].prompt_tokens > 0 and whole.finish_reason == "length"
    finally:
        rag.close()


async def test_span_rag_streams_tokens_and_shows_its_model_call_in_events(fake_server, fake_client):
    async with fake_client() as client:
        rag = SpanRAG(KeywordRetriever(texts=TEXTS), client, system="Be brief.", max_tokens=2)
        chunks = [chunk.text async for chunk in rag.astream("When?")]
        events = [event async for event in rag.astream_events("When?", version="v2")]
    assert chunks == ["t100 ", "t101 ", ""]  # before: one final result
    names = [(e["event"], e["name"]) for e in events if not e["event"].endswith("_stream")]
    assert names == [
        ("on_chain_start", "SpanRAG"),
        ("on_retriever_start", "KeywordRetriever"),
        ("on_retriever_end", "KeywordRetriever"),
        ("on_chat_model_start", "SpanClient"),
        ("on_chat_model_end", "SpanClient"),
        ("on_chain_end", "SpanRAG"),
    ]
    streamed = [e["data"]["chunk"].content for e in events if e["event"] == "on_chat_model_stream"]
    assert streamed == ["t100 ", "t101 "]
    (end,) = [e for e in events if e["event"] == "on_chat_model_end"]
    usage = end["data"]["output"].usage_metadata
    assert usage["output_tokens"] == 2 and usage["input_token_details"]["cache_read"] > 0  # the second call


def test_span_rag_stands_alone_without_langchain():
    code = (
        "import sys\n"
        "sys.modules['langchain_core'] = None  # makes `import langchain_core...` fail\n"
        "from minipic_client import SpanRAG\n"
        "assert SpanRAG.__mro__[1:] == (object,), SpanRAG.__mro__\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=os.environ)
