"""Prompt layout: block alignment, markers, EPIC, hidden heads, chat template, marker-safe tokenization."""

from __future__ import annotations

from typing import Any

import pytest

from minipic_client import (
    ConfigError,
    Dependent,
    HiddenSink,
    InvalidDocumentError,
    LeadInContext,
    PrefixSink,
    PromptError,
    RefreshedHeads,
    Span,
    Text,
)
from minipic_client.prompt import ChatTemplate, PromptBuilder, check_documents
from minipic_client.tokens import TokenCache
from minipic_server.markers import HSEP_TOKEN, PAD_TOKEN, PDEP_TOKEN, SSEP_TOKEN

# client_tokenizer builds the layouts; sdk_tokenizer (transformers) is the reference they are checked against.
pytest_plugins = ["sdk_fixtures"]

B = 16  # block size
DOC_A = "The river runs north past the old mill and the school.\n"
DOC_B = "Paper was made by hand in the town for a hundred years.\n"
LONG = " ".join(["water light house"] * 30) + "\n"


class CountingTokenizer:
    """Delegates to a tokenizer and counts the texts it encodes."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.calls: list[str] = []

    def encode(self, text: str, **kwargs: Any) -> Any:
        self.calls.append(text)
        return self._tokenizer.encode(text, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


@pytest.fixture
def ids(sdk_tokenizer: Any) -> dict[str, int]:
    vocab = sdk_tokenizer.get_vocab()
    return {"ssep": vocab[SSEP_TOKEN], "pdep": vocab[PDEP_TOKEN], "pad": vocab[PAD_TOKEN], "hsep": vocab[HSEP_TOKEN]}


def make_builder(tokenizer: Any, ids: dict[str, int]) -> PromptBuilder:
    tokens = TokenCache(tokenizer, ids.values())
    return PromptBuilder(
        tokens,
        block_size=B,
        ssep_token_id=ids["ssep"],
        pdep_token_id=ids["pdep"],
        pad_token_id=ids["pad"],
        hsep_token_id=ids.get("hsep"),
    )


@pytest.fixture
def builder(client_tokenizer: Any, ids: dict[str, int]) -> PromptBuilder:
    return make_builder(client_tokenizer, ids)


def positions(token_ids: list[int], token: int) -> list[int]:
    return [i for i, t in enumerate(token_ids) if t == token]


def test_spans_and_dependent_start_on_block_boundaries(builder, ids, sdk_tokenizer):
    task = "Where does the river run?"
    layout = builder.build([Text("You answer briefly."), Span(DOC_A), Span(DOC_B), Dependent(task)])
    tokens = layout.token_ids
    ssep, pdep = positions(tokens, ids["ssep"]), positions(tokens, ids["pdep"])
    assert len(ssep) == 2 and len(pdep) == 1
    assert all(p % B == 0 for p in ssep + pdep)
    assert tokens[0] == sdk_tokenizer.bos_token_id
    # The tail after PDep is the task itself, unpadded.
    assert tokens[pdep[0] + 1 :] == sdk_tokenizer.encode(task, add_special_tokens=False)
    # Prefills: the padded prefix, then each padded span, exactly as they sit in the prompt.
    prefix, span_a, span_b = layout.prefills
    assert (prefix.kind, span_a.kind, span_b.kind) == ("prefix", "span", "span")
    assert list(prefix.token_ids) == tokens[: ssep[0]]
    assert list(span_a.token_ids) == tokens[ssep[0] : ssep[1]]
    assert list(span_b.token_ids) == tokens[ssep[1] : pdep[0]]
    assert all(len(p.token_ids) % B == 0 for p in layout.prefills)
    assert span_a.token_ids[-1] == ids["pad"]
    assert layout.cacheable_tokens == pdep[0]


def test_a_span_is_the_same_prefill_wherever_it_is(builder):
    first = builder.build([Text("System one."), Span(DOC_A), Span(DOC_B), Dependent("q")])
    second = builder.build(
        [Text("Another, longer system prompt."), Span(DOC_B), Span(DOC_A), Dependent("r")]
    )
    spans_first = {p.key for p in first.prefills if p.kind == "span"}
    spans_second = {p.key for p in second.prefills if p.kind == "span"}
    assert spans_first == spans_second and len(spans_first) == 2


@pytest.mark.parametrize("k", [1, 2])
def test_epic_recomputes_the_first_k_blocks_in_context(builder, ids, sdk_tokenizer, k):
    doc_ids = sdk_tokenizer.encode(LONG, add_special_tokens=False)
    assert len(doc_ids) > k * B
    layout = builder.build([Text("sys"), Span(LONG, recompute_blocks=k), Dependent("q")])
    tokens = layout.token_ids
    head_start = positions(tokens, ids["pdep"])[0]
    tail_start = positions(tokens, ids["ssep"])[0]
    assert head_start % B == 0
    # [PDep head] fills exactly k blocks, then [SSep tail pad..] carries the rest.
    assert tail_start - head_start == k * B
    assert tokens[head_start + 1 : tail_start] == doc_ids[: k * B - 1]
    tail = layout.prefills[-1]
    assert (
        tail.kind == "span"
        and list(tail.token_ids[1 : 1 + len(doc_ids) - (k * B - 1)]) == doc_ids[k * B - 1 :]
    )
    assert [p.kind for p in layout.prefills] == ["prefix", "span"]
    # The head is computed in context; the prefix and the tail after it are reused (gapped hits).
    assert layout.cacheable_tokens == head_start + len(tail.token_ids)


def test_epic_document_shorter_than_the_head_is_all_dependent(builder, ids):
    layout = builder.build([Span("short", recompute_blocks=1), Dependent("q")])
    assert ids["ssep"] not in layout.token_ids
    assert [p.kind for p in layout.prefills] == ["prefix"]
    assert positions(layout.token_ids, ids["pdep"]) == [B, 2 * B]


def test_refreshed_heads_put_the_first_block_in_context_then_the_whole_document_hidden(builder, ids, sdk_tokenizer):
    doc_ids = sdk_tokenizer.encode(LONG, add_special_tokens=False)
    layout = builder.build([Text("sys"), RefreshedHeads().span(LONG), Dependent("q")])
    tokens = layout.token_ids
    (head,), (span,) = positions(tokens, ids["pdep"])[:1], positions(tokens, ids["hsep"])
    assert ids["ssep"] not in tokens and head % B == 0 and span == head + B
    # The in-context head and the hidden head hold the same document tokens after their marker.
    assert tokens[head + 1 : span] == tokens[span + 1 : span + B] == doc_ids[: B - 1]
    document = layout.prefills[-1]
    assert document.kind == "span" and list(document.token_ids) == tokens[span : positions(tokens, ids["pdep"])[1]]
    assert [t for t in document.token_ids[1:] if t != ids["pad"]] == doc_ids
    # The head is computed in context; the prefix and the document span after it are reused (gapped hits).
    assert layout.cacheable_tokens == head + len(document.token_ids)


def test_lead_in_context_computes_the_first_documents_after_the_prefix_and_lays_out_the_rest(builder, ids):
    technique = LeadInContext(RefreshedHeads(), lead=2)
    layout = builder.build([Text("sys"), *technique.documents([DOC_A, DOC_B, LONG]), Dependent("q")])
    tokens = layout.token_ids
    same_rest = builder.build([Text("sys"), Dependent(DOC_A), Dependent(DOC_B), RefreshedHeads().span(LONG),
                               Dependent("q")])
    assert tokens == same_rest.token_ids
    # No prefill for the leading documents: the prefix, then LONG's span, which follows them.
    assert [p.kind for p in layout.prefills] == ["prefix", "span"]
    first, second, head = positions(tokens, ids["pdep"])[:3]
    assert first == B and second % B == 0 and head > second and positions(tokens, ids["hsep"]) == [head + B]
    assert layout.cacheable_tokens == B + len(layout.prefills[-1].token_ids)


def test_a_header_opens_the_first_segment_after_the_leading_text(builder, ids):
    technique = LeadInContext(RefreshedHeads(), as_text=True, header="Passages:\n")
    layout = builder.build([Text("sys"), *technique.documents([DOC_A, LONG]), Dependent("q")])
    same = builder.build([Text("sys"), Text(DOC_A), Dependent("Passages:\n"), RefreshedHeads().span(LONG),
                          Dependent("q")])
    assert layout.token_ids == same.token_ids
    # The prompt's first marker opens the header, right after the leading document's padding.
    header, head = positions(layout.token_ids, ids["pdep"])[:2]
    assert header % B == 0 and head == header + B and ids["hsep"] in layout.token_ids[head:]
    # Nothing after the leading documents: no header either.
    assert technique.documents([DOC_A]) == [Text(DOC_A, shared=False)]


def test_a_repeated_lead_is_laid_out_again_by_the_rest_after_the_header(builder, ids):
    technique = LeadInContext(RefreshedHeads(), as_text=True, header="Passages:\n", repeat=True)
    layout = builder.build([Text("sys"), *technique.documents([DOC_A, LONG]), Dependent("q")])
    same = builder.build([Text("sys"), Text(DOC_A), Dependent("Passages:\n"), RefreshedHeads().span(DOC_A),
                          RefreshedHeads().span(LONG), Dependent("q")])
    assert layout.token_ids == same.token_ids
    # Both documents are spans: the repeat is cached like any span; the lead text is computed by the
    # final ("sys" fills no whole block, so no prefix is prefilled).
    assert [p.kind for p in layout.prefills] == ["span", "span"]
    assert technique.documents([DOC_A]) == [Text(DOC_A, shared=False), Dependent("Passages:\n"),
                                            *RefreshedHeads().documents([DOC_A])]  # fmt: skip


def test_the_prefix_is_prefilled_up_to_the_leading_text_whatever_document_leads(builder, ids):
    system = Text("Answer from the documents, briefly and exactly, and say which one. " * 2)
    technique = LeadInContext(RefreshedHeads(), as_text=True, repeat=True)
    layouts = [builder.build([system, *technique.documents(docs), Dependent("q")])
               for docs in ([DOC_A, LONG], [LONG, DOC_A])]  # fmt: skip
    prefixes = [[p for p in layout.prefills if p.kind == "prefix"] for layout in layouts]
    assert [p.key for p in prefixes[0]] == [p.key for p in prefixes[1]] and len(prefixes[0]) == 1  # one serves both
    (prefix,) = prefixes[0]
    system_ids = builder.build([system]).token_ids  # the last segment: not padded
    assert len(prefix.token_ids) == len(system_ids) // B * B > 0
    for layout in layouts:
        assert layout.token_ids[: len(prefix.token_ids)] == list(prefix.token_ids)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"lead": 0}, "lead must be at least 1"),
    ({"rest": LeadInContext()}, "rest is a per-document technique"),
    ({"header": " \n"}, "a header needs text"),
])
def test_lead_in_context_rejects_what_it_cannot_lay_out(kwargs, match):
    with pytest.raises(PromptError, match=match):
        LeadInContext(**kwargs)


def test_a_joined_head_continues_the_prefix_with_its_padding_before_the_last_template_text(builder, ids,
                                                                                         sdk_tokenizer):
    doc_ids = sdk_tokenizer.encode(LONG, add_special_tokens=False)
    turn = "<|im_end|>\n<|im_start|>user\n"
    parts = [Text(DOC_B * 2), Text(turn, template=True), *RefreshedHeads(join_prefix=True).documents([LONG, DOC_A]),
             Dependent("q")]
    layout = builder.build(parts)
    tokens = layout.token_ids
    (span, second), first_pdep = positions(tokens, ids["hsep"]), positions(tokens, ids["pdep"])[0]
    turn_ids = list(sdk_tokenizer.encode(turn, add_special_tokens=False))
    # [sys pad..][turn][head] fills whole blocks; then the whole document as a hidden-head span.
    assert span % B == 0 and tokens[span - B + 1 : span] == doc_ids[: B - 1] == tokens[span + 1 : span + B]
    assert tokens[span - B + 1 - len(turn_ids) : span - B + 1] == turn_ids
    assert ids["pad"] in tokens[: span - B + 1 - len(turn_ids)] and first_pdep > span  # DOC_A's head is refreshed
    # Prefilled: the prefix's whole blocks before the padding (every prompt's) and the spans.
    assert [p.kind for p in layout.prefills] == ["prefix", "span", "span"] and second > first_pdep
    assert list(layout.prefills[0].token_ids) == tokens[: len(layout.prefills[0].token_ids)]
    assert len(layout.prefills[0].token_ids) == tokens.index(ids["pad"]) // B * B > 0


def test_a_joined_head_not_right_after_the_prefix_is_a_refreshed_one(builder):
    def laid_out(head: str, *before: Span) -> list[int]:
        spans = (Span(LONG, head=head), Span("short", head=head))
        return builder.build([Text("sys"), *before, *spans, Dependent("q")]).token_ids

    assert laid_out("joined", Span(DOC_A)) == laid_out("refreshed", Span(DOC_A))  # a module span first
    assert laid_out("joined") != laid_out("refreshed")  # right after the prefix: joined


def test_hidden_sink_spans_open_with_hsep(builder, ids):
    layout = builder.build([Text("sys"), HiddenSink().span(LONG), HiddenSink().span("short"), Dependent("q")])
    tokens = layout.token_ids
    # "short" fits in one block: hiding it would hide all of it, so it stays an SSep span.
    assert positions(tokens, ids["hsep"]) == [B] and len(positions(tokens, ids["ssep"])) == 1
    assert [p.kind for p in layout.prefills] == ["prefix", "span", "span"]
    assert layout.cacheable_tokens == positions(tokens, ids["pdep"])[0]


def test_prefix_sink_spans_open_with_a_hidden_copy_of_the_prefix_tail(builder, ids, sdk_tokenizer):
    system = DOC_B * 2
    prefix = list(sdk_tokenizer.encode(system, add_special_tokens=False))
    layout = builder.build([Text(system), *PrefixSink().documents([LONG, "short"]), Dependent("q")])
    tokens = layout.token_ids
    spans = positions(tokens, ids["hsep"])
    assert len(spans) == 2 and ids["ssep"] not in tokens and all(s % B == 0 for s in spans)
    for start, doc in zip(spans, (LONG, "short")):
        # [HSep, the prefix's last B-1 tokens][the whole document, padded]: even a one-block document
        assert tokens[start + 1 : start + B] == prefix[-(B - 1) :]
        doc_ids = list(sdk_tokenizer.encode(doc, add_special_tokens=False))
        assert tokens[start + B : start + B + len(doc_ids)] == doc_ids
    # Every span is reused whole, as Block-Attention's: only the question is computed.
    assert [p.kind for p in layout.prefills] == ["prefix", "span", "span"]
    assert layout.cacheable_tokens == positions(tokens, ids["pdep"])[0]


def test_a_refreshed_document_that_fits_the_head_is_all_dependent(builder, ids):
    layout = builder.build([Span("short", head="refreshed"), Dependent("q")])
    assert ids["hsep"] not in layout.token_ids and ids["ssep"] not in layout.token_ids
    assert positions(layout.token_ids, ids["pdep"]) == [B, 2 * B]


def test_refreshing_the_first_heads_only_hides_the_others_over_the_same_spans(builder):
    docs = [LONG, LONG + "2", LONG + "3"]
    assert RefreshedHeads(first=1).documents(docs) == [RefreshedHeads().span(LONG), *HiddenSink().documents(docs[1:])]
    some = builder.build([Text("sys"), *RefreshedHeads(first=1).documents(docs), Dependent("q")])
    every = builder.build([Text("sys"), *RefreshedHeads().documents(docs), Dependent("q")])
    none = builder.build([Text("sys"), *HiddenSink().documents(docs), Dependent("q")])
    assert {p.key for p in some.prefills} == {p.key for p in every.prefills} == {p.key for p in none.prefills}
    assert len(none.token_ids) < len(some.token_ids) < len(every.token_ids)  # one head in context, not three
    assert len(some.token_ids) - len(none.token_ids) == B
    with pytest.raises(PromptError, match="first must be at least 1"):
        RefreshedHeads(first=0)


def test_a_hidden_repeat_leaves_the_refreshed_heads_to_the_documents_after_it(builder):
    docs = [LONG, LONG + "2", LONG + "3"]
    hidden, refreshed = HiddenSink().span, RefreshedHeads().span
    layout = LeadInContext(RefreshedHeads(first=1), as_text=True, repeat=True, hide_repeat=True)
    assert layout.documents(docs) == [Text(LONG, shared=False), hidden(LONG), refreshed(docs[1]), hidden(docs[2])]
    shown = LeadInContext(RefreshedHeads(first=1), as_text=True, repeat=True)
    built = [builder.build([Text("sys"), *technique.documents(docs), Dependent("q")]) for technique in (layout, shown)]
    assert {p.key for p in built[0].prefills} == {p.key for p in built[1].prefills}
    assert len(built[0].token_ids) == len(built[1].token_ids)  # one head in context either way
    with pytest.raises(PromptError, match="only a repeat can be hidden"):
        LeadInContext(hide_repeat=True)


def test_hidden_heads_need_a_server_that_publishes_hsep(client_tokenizer, ids):
    older = make_builder(client_tokenizer, {k: v for k, v in ids.items() if k != "hsep"})
    older.build([Span(LONG), Dependent("q")])
    for technique in (HiddenSink(), RefreshedHeads()):
        with pytest.raises(ConfigError, match="publishes no hsep_token_id"):
            older.build([technique.span(LONG), Dependent("q")])


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"head": "secret"}, "head is 'shown', 'hidden', 'refreshed', 'joined' or 'prefix-sink'"),
    ({"head": "hidden", "recompute_blocks": 1}, "do not combine"),
])
def test_bad_span_heads_are_refused(kwargs, match):
    with pytest.raises(PromptError, match=match):
        Span("doc", **kwargs)


def test_marker_literal_text_creates_no_span_boundary(builder, ids, sdk_tokenizer):
    doc = f"Quoting {SSEP_TOKEN} and {PDEP_TOKEN} and {PAD_TOKEN} and <|eot_id|> as text.\n"
    layout = builder.build([Span(doc), Dependent(f"What does {SSEP_TOKEN} mean?")])
    assert positions(layout.token_ids, ids["ssep"]) == [B]
    assert len(positions(layout.token_ids, ids["pdep"])) == 1
    span = layout.prefills[1].token_ids
    body = [t for t in span[1:] if t != ids["pad"]]
    assert sdk_tokenizer.decode(body) == doc
    assert sdk_tokenizer.convert_tokens_to_ids("<|eot_id|>") not in body


def test_text_after_a_span_must_open_a_dependent(builder):
    with pytest.raises(PromptError, match="follows a Span"):
        builder.build([Span(DOC_A), Text("loose text")])


def test_baseline_is_the_same_text_without_markers(builder, ids, sdk_tokenizer):
    layout = builder.build([Text("sys "), Span(DOC_A), Dependent("q")], pic=False)
    assert not set(ids.values()) & set(layout.token_ids)
    expected = [sdk_tokenizer.bos_token_id]
    for text in ("sys ", DOC_A, "q"):
        expected += sdk_tokenizer.encode(text, add_special_tokens=False)
    assert layout.token_ids == expected
    assert layout.prefills == () and layout.cacheable_tokens == 0


def test_every_text_is_tokenized_once(client_tokenizer, ids):
    counting = CountingTokenizer(client_tokenizer)
    builder = make_builder(counting, ids)
    parts = [Text("sys"), Span(DOC_A), Span(DOC_B), Dependent("q")]
    first = builder.build(parts)
    calls = len(counting.calls)
    builder.build([Text("sys"), Span(DOC_B), Span(DOC_A), Dependent("other q")])
    assert counting.calls[calls:] == ["other q"]
    assert builder.build(parts) == first


def test_chat_layout_matches_the_template_with_spans_inside_the_user_turn(
    builder, ids, sdk_tokenizer, client_tokenizer
):
    chat = ChatTemplate(client_tokenizer)
    system, task = "Answer from the documents.", "Which mill?"
    parts = chat.parts(system, [Span(DOC_A), Span(DOC_B)], task)
    plain = builder.build(parts, pic=False, add_special_tokens=False).token_ids
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": DOC_A + DOC_B + task},
    ]
    rendered = sdk_tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True
    )
    assert plain == rendered["input_ids"]

    layout = builder.build(parts, add_special_tokens=False)
    prefix = sdk_tokenizer.decode([t for t in layout.prefills[0].token_ids if t != ids["pad"]])
    assert prefix.endswith("<|start_header_id|>user<|end_header_id|>\n\n")
    pdep = positions(layout.token_ids, ids["pdep"])[0]
    tail = sdk_tokenizer.decode(layout.token_ids[pdep + 1 :])
    assert tail == task + "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"


def test_chat_layout_without_system_prompt(client_tokenizer):
    parts = ChatTemplate(client_tokenizer).parts(None, [Span(DOC_A)], "q")
    assert [type(p).__name__ for p in parts] == ["Text", "Span", "Dependent", "Text"]
    assert "system" not in parts[0].text


@pytest.mark.parametrize(
    ("docs", "match"),
    [
        (["fine", ""], "document 1 is empty"),
        (["   \n"], "document 0 is empty"),
        (["fine", 3], "document 1 is int, not str"),
        ([None], "document 0 is NoneType"),
        ("a single string", "not a list"),
    ],
)
def test_bad_documents_are_rejected(docs, match):
    with pytest.raises(InvalidDocumentError, match=match):
        check_documents(docs)
