"""SpanRAG with a LangChain retriever and with duck-typed ones."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
from langchain_core.callbacks import CallbackManagerForRetrieverRun
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


async def test_span_rag_refuses_what_is_not_a_retriever(fake_server, fake_client):
    async with fake_client() as client:
        with pytest.raises(ConfigError, match="not a retriever"):
            SpanRAG(object(), client)
        with pytest.raises(NotImplementedError, match="ainvoke"):
            SpanRAG(SyncRetriever(), client).invoke("q")


def test_span_rag_stands_alone_without_langchain():
    code = (
        "import sys\n"
        "sys.modules['langchain_core'] = None  # makes `import langchain_core...` fail\n"
        "from minipic_client import SpanRAG\n"
        "assert SpanRAG.__mro__[1:] == (object,), SpanRAG.__mro__\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=os.environ)
