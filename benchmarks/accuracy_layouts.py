"""Prompt layouts of the accuracy harness, by name, and one pass of a layout over a question set.

A layout is how the same passages and question become a prompt: plain (full attention) or
one of the SDK's techniques. Adding a technique from `minipic_client` is one line::

    register("refreshed_heads", "...", technique=lambda ctx: RefreshedHeads())

`register_sdk` below does exactly that for techniques the installed SDK may not have yet.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

import minipic_client
from minipic_client import BlockAttention, Epic, RagRequest, RequestEvent, SpanClient, Strategy, Tokenizer
from minipic_client.prompt import TECHNIQUES, Dependent, Part, Span, Technique, Text

from accuracy_stats import TokenLedger

SYSTEM = "Answer the question with a short phrase, using only the passages."


@dataclass(frozen=True)
class LayoutContext:
    """What a technique may depend on: the server's block size, the longest passage of the run,
    the client's tokenizer (None where no technique of the run needs it)."""

    block_size: int
    longest_passage_tokens: int
    tokenizer: Tokenizer | None = None


@dataclass(frozen=True)
class Layout:
    """`technique` None: the plain prompt (full attention, no markers); `passages` False: the
    question alone; `drop_pdep`: the technique's prompt without the question's PDep;
    `task_first`: the question also before the passages (`TaskFirst`)."""

    description: str
    technique: Callable[[LayoutContext], Technique] | None = None
    passages: bool = True
    drop_pdep: bool = False
    task_first: bool = False


LAYOUTS: dict[str, Layout] = {}
# The first passage as text, the header, then every passage (the first again) as refreshed heads:
# not an SDK layout, so `accuracy_layout_shares.py` takes it from here.
HEADER_REPEAT = minipic_client.LeadInContext(as_text=True, header="Passages:\n", repeat=True)


def register(name: str, description: str, **options: Any) -> None:
    LAYOUTS[name] = Layout(description, **options)


def register_sdk(name: str, class_name: str, description: str) -> None:
    """Register ``minipic_client.<class_name>()`` if the installed SDK has it."""
    technique = getattr(minipic_client, class_name, None)
    if technique is not None:
        register(name, description, technique=lambda ctx: technique())


register("full", "plain prompt, no markers: full causal attention (vLLM prefix caching)")
register("closed_book", "the question alone, without passages: what the model answers from memory", passages=False)
register("pdep_passages", "every passage after a PDep and padded: full attention, with PIC's marker and pad tokens",
         technique=lambda ctx: Epic(k=ctx.longest_passage_tokens // ctx.block_size + 1))  # fmt: skip
register("block", "Block-Attention: each passage an SSep span (sees only itself); the question after a PDep sees all",
         technique=lambda ctx: BlockAttention())  # fmt: skip
register("block_no_pdep", "Block-Attention without PDep: the question joins the last span and sees only it",
         technique=lambda ctx: BlockAttention(), drop_pdep=True)  # fmt: skip
register("epic1", "EPIC/LegoLink, k=1: each passage's first block recomputed in context, the rest an SSep span",
         technique=lambda ctx: Epic(k=1))  # fmt: skip
register("epic2", "EPIC/LegoLink, k=2: each passage's first two blocks recomputed in context",
         technique=lambda ctx: Epic(k=2))  # fmt: skip
register_sdk("refreshed_heads", "RefreshedHeads",
             "faithful EPIC from cached blocks: each passage's first block recomputed in context, "
             "its cached copy hidden outside the passage")  # fmt: skip
register_sdk("lead_refreshed_heads", "LeadInContext",
             "the first passage computed in context after the system prompt (a PDep segment), "
             "the others as refreshed heads")  # fmt: skip
register("refreshed_heads_joined", "refreshed heads, the first passage's head continuing the prefix: no pad or "
         "marker between the start of the user turn and the first passage",
         technique=lambda ctx: minipic_client.RefreshedHeads(join_prefix=True))  # fmt: skip
register("lead_text_refreshed_heads", "the first passage continuing the prefix as plain text (no marker or pad "
         "before it), the others as refreshed heads",
         technique=lambda ctx: minipic_client.LeadInContext(as_text=True))  # fmt: skip
register("lead2_text_refreshed_heads", "the first two passages continuing the prefix as plain text, the others as "
         "refreshed heads", technique=lambda ctx: minipic_client.LeadInContext(lead=2, as_text=True))  # fmt: skip
register("leadin_refreshed_heads", "refreshed heads after a fixed lead-in `Dependent` ('Passages:'), so the "
         "prompt's first marker opens the lead-in, not the first passage",
         technique=lambda ctx: MarkerLeadIn(minipic_client.RefreshedHeads()))  # fmt: skip
register("lead_text_leadin_refreshed_heads", "the first passage as plain text, then the fixed header `Dependent` "
         "('Passages:'), the others as refreshed heads",
         technique=lambda ctx: TECHNIQUES["lead-text-header-refreshed-heads"])  # fmt: skip
register("lead2_text_leadin_refreshed_heads", "the first two passages as plain text, then the fixed header `Dependent` "
         "('Passages:'), the others as refreshed heads",
         technique=lambda ctx: minipic_client.LeadInContext(lead=2, as_text=True, header="Passages:\n"))  # fmt: skip
register("lead_text_repeat_refreshed_heads", "the first passage as plain text, then every passage, the first again, "
         "as refreshed heads: the slot after in-context text holds a passage the prompt has in context",
         technique=lambda ctx: TECHNIQUES["lead-text-repeat-refreshed-heads"])  # fmt: skip
register("lead_text_leadin_repeat_refreshed_heads", "the first passage as plain text, the fixed header `Dependent`, "
         "then every passage, the first again, as refreshed heads: the repeat wins the first place back, the header "
         "the second", technique=lambda ctx: HEADER_REPEAT)  # fmt: skip
# The first passage as text, the others (or all, the first again) as Block-Attention spans or
# hidden sinks: no head recomputed, so a final prompt computes the first passage and the question
# only (docs/accuracy.md, "The first passage as text, the others without recomputed heads").
register("lead_text_block", "the first passage as plain text, the others as Block-Attention spans",
         technique=lambda ctx: minipic_client.LeadInContext(BlockAttention(), as_text=True))  # fmt: skip
register("lead_text_repeat_block", "the first passage as plain text, then every passage, the first again, as "
         "Block-Attention spans", technique=lambda ctx: minipic_client.LeadInContext(BlockAttention(), as_text=True,
                                                                                       repeat=True))  # fmt: skip
register("lead_text_hidden_sink", "the first passage as plain text, the others as spans whose first block is hidden "
         "from what follows", technique=lambda ctx: minipic_client.LeadInContext(minipic_client.HiddenSink(),
                                                                                 as_text=True))  # fmt: skip
register("lead_text_repeat_hidden_sink", "the first passage as plain text, then every passage, the first again, as "
         "spans whose first block is hidden from what follows",
         technique=lambda ctx: TECHNIQUES["lead-text-repeat-hidden-sink"])  # fmt: skip
# Between the two: the first `k` passages (the lead's span among them) with refreshed heads, the
# others hidden sinks (the same cached spans), so a prompt recomputes k heads instead of every one.
for count, word in ((2, "two"), (3, "three"), (4, "four"), (5, "five")):
    register(f"lead_text_repeat_refreshed{count}_heads", "the first passage as plain text, then every passage, the "
             f"first again, the first {word} with refreshed heads, the others as hidden sinks",
             technique=lambda ctx, count=count: TECHNIQUES[f"lead-text-repeat-refreshed{count}-heads"])  # fmt: skip
register("lead_text_repeat_hidden_refreshed4_heads", "the first passage as plain text, then every passage, the first "
         "again as a hidden sink (it is read in context already), the next four with refreshed heads, the others as "
         "hidden sinks", technique=lambda ctx: TECHNIQUES["lead-text-repeat-hidden-refreshed4-heads"])  # fmt: skip
register("lead_text_refreshed_heads_first_last", "the first passage as plain text, then the others and the first "
         "again as refreshed heads: the first passage's span right before the question",
         technique=lambda ctx: LeadTextThenSpans(minipic_client.RefreshedHeads()))  # fmt: skip
register("lead_text_refreshed_heads_reversed", "the first passage as plain text, then every passage as refreshed "
         "heads in reverse order: the first passage's span right before the question",
         technique=lambda ctx: LeadTextThenSpans(minipic_client.RefreshedHeads(), reverse=True))  # fmt: skip
register("refreshed_heads_then_lead_text", "every passage as refreshed heads, then the first passage again as text "
         "computed in context (a `Dependent`) right before the question: a ranked prompt's best passage read in "
         "context where the question reads it",
         technique=lambda ctx: SpansThenLeadText(minipic_client.RefreshedHeads()))  # fmt: skip
register("full_task_first", "plain prompt with the question also before the passages: full attention",
         task_first=True)  # fmt: skip
register("refreshed_heads_task_first", "the question also before the passages, as text continuing the prefix, so "
         "every refreshed head is computed after it", technique=lambda ctx: minipic_client.RefreshedHeads(),
         task_first=True)  # fmt: skip
register("lead_text_leadin_refreshed_heads_task_first", "the question, then the first passage as text, the header "
         "and the others as refreshed heads", technique=lambda ctx: TECHNIQUES["lead-text-header-refreshed-heads"],
         task_first=True)  # fmt: skip
register("trailing_heads", "each passage a span whose first block is hidden from what follows, and every "
         "passage's first block-1 tokens recomputed after all passages, before the question: the new tokens of a "
         "final prompt contiguous", technique=lambda ctx: TrailingHeads(ctx.block_size - 1, ctx.tokenizer))  # fmt: skip
register_sdk("hidden_sink", "HiddenSink",
             "Block-Attention with each passage's first block hidden from everything after its span")
register_sdk("prefix_sink", "PrefixSink",
             "Block-Attention whose spans open with a hidden copy of the prefix's last block-1 tokens: each passage "
             "computed as if it came first")  # fmt: skip


@dataclass(frozen=True)
class MarkerLeadIn:
    """`rest`'s parts with a fixed `text` as a `Dependent` before the first document it lays out
    as a segment, so the prompt's first marker opens that text, not a document: the SDK's
    ``LeadInContext(header=...)`` for any technique, to try it where the SDK does not offer it."""

    rest: Technique
    text: str = "Passages:\n"

    def documents(self, docs: Sequence[str]) -> list[Part]:
        parts = list(self.rest.documents(docs))
        first = next((i for i, part in enumerate(parts) if not isinstance(part, Text)), len(parts))
        return [*parts[:first], Dependent(self.text), *parts[first:]]


@dataclass(frozen=True)
class LeadTextThenSpans:
    """The first passage as text continuing the prefix, then every passage as `rest`, arranged
    so the first passage's span sits right before the question: after the others in their
    order (`reverse` False) or with all of them reversed (True). A ranked prompt's best
    passage then sits both where full attention reads it best and where spans answer best."""

    rest: Technique
    reverse: bool = False

    def documents(self, docs: Sequence[str]) -> list[Part]:
        spans = list(docs[::-1]) if self.reverse else [*docs[1:], *docs[:1]]
        return [Text(docs[0], shared=False), *self.rest.documents(spans)] if docs else []


@dataclass(frozen=True)
class SpansThenLeadText:
    """Every passage as `rest`, then the first passage again computed in context (a `Dependent`)
    right before the question: where the default puts it first, as full attention does, this
    puts it last, next to the question, having read the spans before it."""

    rest: Technique

    def documents(self, docs: Sequence[str]) -> list[Part]:
        return [*self.rest.documents(docs), Dependent(docs[0])] if docs else []


@dataclass(frozen=True)
class TaskFirst:
    """`rest`'s parts after the task as text continuing the prompt's prefix (a query-aware
    prompt): the passages' in-context tokens, refreshed heads among them, are computed
    knowing the question; spans stay context-free, so their cache share is unchanged."""

    rest: Technique
    task: str

    def documents(self, docs: Sequence[str]) -> list[Part]:
        return [Text(f"{self.task}\n\n"), *self.rest.documents(docs)]


@dataclass(frozen=True)
class TrailingHeads:
    """Refreshed heads moved to the end: every document a hidden-head span, then each document's
    first `head_tokens` tokens as a `Dependent` of its own, in order, before the task. The
    recomputed tokens of a final prompt are then one contiguous run that one engine step
    computes, where refreshed heads interleave them with cached spans."""

    head_tokens: int
    tokenizer: Tokenizer | None

    def documents(self, docs: Sequence[str]) -> list[Part]:
        if self.tokenizer is None:
            raise ValueError("TrailingHeads needs the run's tokenizer (LayoutContext.tokenizer)")
        heads = [Dependent(leading_text(self.tokenizer, doc, self.head_tokens)) for doc in docs]
        return [*(Span(doc, head="hidden") for doc in docs), *heads]


def leading_text(tokenizer: Tokenizer, text: str, tokens: int) -> str:
    """The shortest start of `text` whose ids begin with the first `tokens` ids of `text` (a few
    more where the last of them is part of a character that spans several byte tokens)."""
    target = tokenizer.encode(text)[:tokens]
    return next((text[:end] for end in range(1, len(text) + 1) if tokenizer.encode(text[:end])[:tokens] == target),
                text)  # fmt: skip


@dataclass(frozen=True)
class Prompt:
    """One question as sent: its task and passage texts."""

    task: str
    docs: tuple[str, ...]


@dataclass
class PassResult:
    """A pass's answers, its token ledger, its seconds; `server_computed`: the same computed
    tokens from the server's own counters (None where it exports none)."""

    texts: list[str]
    ledger: TokenLedger
    seconds: float
    server_computed: int | None = None


async def run_pass(
    url: str,
    layout: Layout,
    prompts: Sequence[Prompt],
    *,
    tokenizer: Tokenizer,
    context: LayoutContext,
    cache_salt: str,
    max_tokens: int,
    **client_options: Any,
) -> PassResult:
    """Answer every prompt with `layout`, all in flight through one client (up to the server's
    ``max_num_seqs``), under `cache_salt`: nothing an earlier pass cached can be hit."""
    ledger = TokenLedger()

    def record(event: RequestEvent) -> None:
        ledger.add(event.kind, event.prompt_tokens, event.cached_tokens)

    technique = layout.technique(context) if layout.technique else BlockAttention()  # plain prompts keep only its text
    requests = [RagRequest(p.task, p.docs if layout.passages else (), SYSTEM,
                           technique=TaskFirst(technique, p.task) if layout.task_first else technique,
                           max_tokens=max_tokens) for p in prompts]  # fmt: skip
    strategy = Strategy.ISPS if layout.technique else Strategy.BASELINE
    started = time.perf_counter()
    async with SpanClient(url, tokenizer=tokenizer, cache_salt=cache_salt, on_request=record,
                          **client_options) as client:  # fmt: skip
        if layout.drop_pdep:
            texts = await _without_pdep(client, url, requests, cache_salt, ledger)
        else:
            texts = [""] * len(requests)
            async for i, outcome in client.rag_many(requests, strategy=strategy):
                if isinstance(outcome, Exception):
                    raise outcome
                texts[i] = outcome.text
    return PassResult(texts, ledger, time.perf_counter() - started)


async def _without_pdep(
    client: SpanClient, url: str, requests: Sequence[RagRequest], cache_salt: str, ledger: TokenLedger
) -> list[str]:
    """The SDK's prompts minus the question's PDep (the SDK never builds these): each span
    prefilled once, then the final prompt, with the client's in-flight cap."""
    slots = asyncio.Semaphore(client.info.max_num_seqs)
    prefilled: dict[bytes, asyncio.Task[str]] = {}

    async with httpx.AsyncClient(base_url=url, timeout=600) as http:

        async def complete(kind: str, ids: Sequence[int], max_tokens: int) -> str:
            body = {"model": client.info.model, "prompt": list(ids), "max_tokens": max_tokens,
                    "temperature": 0.0, "cache_salt": cache_salt}  # fmt: skip
            async with slots:
                response = await http.post("/v1/completions", json=body)
            response.raise_for_status()
            payload = response.json()
            usage = payload["usage"]
            ledger.add(kind, usage["prompt_tokens"], (usage.get("prompt_tokens_details") or {}).get("cached_tokens"))
            return payload["choices"][0]["text"]

        async def answer(request: RagRequest) -> str:
            layout = client.rag_layout(request)
            for p in layout.prefills:
                if p.key not in prefilled:
                    prefilled[p.key] = asyncio.create_task(complete(p.kind, p.token_ids, 1))
            await asyncio.gather(*(prefilled[p.key] for p in layout.prefills))
            ids = list(layout.token_ids)
            ids.remove(client.info.pdep_token_id)  # the first PDep: the question's
            return await complete("final", ids, request.max_tokens)

        return list(await asyncio.gather(*map(answer, requests)))


async def server_counters(url: str) -> tuple[float, float] | None:
    """(prompt tokens, of them cached) the server counted so far (vLLM's Prometheus counters),
    or None when it exports none."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        response = await http.get("/metrics")
    if response.status_code != 200:
        return None
    return parse_counters(response.text)


def parse_counters(text: str) -> tuple[float, float] | None:
    """Sum ``vllm:prompt_tokens_total`` and ``vllm:prompt_tokens_cached_total`` over their labels."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        metric, _, value = line.rpartition(" ")
        name = metric.split("{", 1)[0]
        if name in ("vllm:prompt_tokens_total", "vllm:prompt_tokens_cached_total"):
            totals[name] = totals.get(name, 0.0) + float(value)
    if len(totals) < 2:
        return None
    return (totals["vllm:prompt_tokens_total"], totals["vllm:prompt_tokens_cached_total"])
