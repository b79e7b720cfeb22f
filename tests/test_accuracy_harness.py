"""The accuracy harness (benchmarks/accuracy*.py) on a small passage set it builds itself:
family generators, scoring, statistics against known values, token accounting."""

from __future__ import annotations

import random
import uuid

import pytest

import minipic_client
from minipic_client import BlockAttention, Epic, LeadInContext, Tokenizer
from minipic_client.prompt import Dependent, Span, Text

from accuracy import STOCK, Server, family_counts, server_variants, summarise
from accuracy_families import (
    FAMILIES,
    Corpus,
    Question,
    build_family,
    extract_facts,
    is_correct,
    rank,
    reuse_stats,
)
from accuracy_layouts import (
    LAYOUTS,
    LayoutContext,
    MarkerLeadIn,
    PassResult,
    Prompt,
    TaskFirst,
    parse_counters,
    register_sdk,
    run_pass,
)
from accuracy_stats import TokenLedger, mcnemar_exact, paired_difference, versus, wilson

FIRST = ("Anna", "Boris", "Clara", "Dmitri", "Elena", "Felix", "Greta", "Hugo", "Irene", "Jonas")
LAST = ("Abel", "Brandt", "Castell", "Dorn", "Eberle", "Falk", "Gruber", "Hahn")


def passages() -> list[dict[str, str]]:
    """80 people with life dates, a film directed by each, and 20 fillers."""
    people = [f"{first} {last}" for first in FIRST for last in LAST]
    out = []
    for n, name in enumerate(people):
        out.append({"title": name, "text": f"{name}( 3 May {1850 + n} – 9 June {1920 + n}) was a film director."})
        out.append({"title": f"Picture {n}", "text": f"Picture {n} is a {1930 + n} film directed by {name}."})
    out += [{"title": f"River {n}", "text": f"River {n} flows into the sea."} for n in range(20)]
    return out


def build(name: str, count: int = 30, docs: int = 5, pool: int = 10, seed: int = 0,
          order: str = "shuffled") -> tuple[Corpus, list[Question]]:  # fmt: skip
    data = passages()
    corpus = Corpus.of(data, set(range(len(data))))
    return corpus, build_family(name, extract_facts(data), corpus, count, docs, pool, random.Random(seed), order)


def test_facts_are_read_from_the_patterns():
    facts = {(f.kind, f.subject): f.value for f in extract_facts(passages())}
    assert facts[("born", "Anna Abel")] == "1850"
    assert facts[("died", "Anna Brandt")] == "1921"
    assert facts[("director", "Picture 2")] == "Anna Castell"
    assert len(facts) == 3 * 80


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_places_its_answer_among_recurring_distractors(family):
    corpus, questions = build(family)
    assert len(questions) == 30 and len({q.question for q in questions}) == 30
    for q in questions:
        assert len(q.passages) == 5 and len({corpus.titles[i] for i in q.passages}) == 5
        golds = [corpus.texts[q.passages[p]] for p in q.gold_positions]
        assert len(golds) == (2 if family in ("bridge", "comparison") else 1)
        assert q.chance == FAMILIES[family].chance
        if family != "comparison":  # the comparison's answer is a name both passages' years decide
            assert q.answer in golds[-1] or q.answer in golds[0]
    assert reuse_stats(questions, [10] * len(corpus.texts))["max_prompts_per_passage"] > 1


def test_bridge_needs_the_film_and_its_director():
    corpus, questions = build("bridge")
    for q in questions:
        film, person = (corpus.texts[q.passages[p]] for p in q.gold_positions)
        director = film.split("directed by ")[1].rstrip(".\n")
        assert director in q.question or director in person
        assert person.startswith(director) and q.answer in person and q.answer not in film


def test_comparison_accepts_only_the_earlier_born():
    _, questions = build("comparison")
    for q in questions:
        (other,) = q.reject
        assert {q.answer, other} == set(q.question[len("Who was born first, "):-1].split(" or "))
    q = questions[0]
    assert is_correct(f"{q.answer} was born first.", q)
    assert not is_correct(f"{q.answer} or {q.reject[0]}", q)
    assert not is_correct(q.reject[0], q)


def test_comparison_answer_is_the_earlier_year():
    data = passages()
    born = {f.subject: int(f.value) for f in extract_facts(data) if f.kind == "born"}
    _, questions = build("comparison")
    assert all(born[q.answer] < born[q.reject[0]] for q in questions)


def test_synthetic_codes_are_stated_once_and_a_decoy_is_present():
    corpus, questions = build("synthetic")
    for q in questions:
        texts = [corpus.texts[i] for i in q.passages]
        assert sum(q.answer in t for t in texts) == 1
        assert sum("registry code" in t for t in texts) >= 2  # the decoy's code is there too


def test_families_are_deterministic_and_refuse_too_many_questions():
    assert build("single", seed=3)[1] == build("single", seed=3)[1]
    assert build("single", seed=3)[1] != build("single", seed=4)[1]
    with pytest.raises(SystemExit, match="only 240"):
        build("single", count=241)


def test_ranked_prompts_hold_the_shuffled_passages_those_about_the_subject_first():
    _, shuffled = build("single", seed=5)
    corpus, ranked = build("single", seed=5, order="ranked")
    for s, r in zip(shuffled, ranked):
        assert (s.question, sorted(s.passages)) == (r.question, sorted(r.passages))
        assert r.gold_positions == (0,)  # the passage named after the question's subject
        assert list(r.passages) == rank(r.question, s.passages, corpus)  # the shuffled prompt, ranked
    assert any(s.gold_positions != (0,) for s in shuffled)
    with pytest.raises(ValueError, match="order must be one of"):
        build("single", order="best")


def test_ranking_counts_the_questions_own_words_not_its_template():
    corpus = Corpus.of([{"title": "Anna Abel", "text": "Anna Abel was born in 1850."},
                        {"title": "Year", "text": "In which year was the film born? Who directed it?"},
                        {"title": "Anna", "text": "Anna is a name."}], {0, 1, 2})  # fmt: skip
    assert rank("In which year was Anna Abel born?", [1, 2, 0], corpus) == [0, 2, 1]


def test_family_question_counts_override_some_families_and_refuse_bad_ones():
    assert family_counts(["single=1200", "synthetic=600"]) == {"single": 1200, "synthetic": 600}
    for bad in ("singles=10", "single=", "single=0", "single=ten"):
        with pytest.raises(SystemExit, match="FAMILY=N"):
            family_counts([bad])


def test_reuse_counts_repeats_in_run_order():
    first = Question("x", "f", "k", "?", "a", (), (0, 1), (0,), 0.0)
    second = Question("y", "f", "k", "?", "a", (), (1, 2), (0,), 0.0)
    stats = reuse_stats([first, second], [10, 30, 60])
    assert stats == {"passage_slots": 4, "distinct_passages": 3, "mean_prompts_per_passage": 1.33,
                     "max_prompts_per_passage": 2, "repeat_slot_share": 0.25,
                     "repeat_token_share": round(30 / 130, 4)}  # fmt: skip


def test_scoring_ignores_case_accents_and_punctuation_but_not_word_bounds():
    q = Question("x", "f", "k", "?", "José Ferrer", (), (0,), (0,), 0.0)
    assert is_correct("It was JOSE ferrer.", q)
    assert not is_correct("Josefine Ferrer", q)
    year = Question("y", "f", "k", "?", "1950", (), (0,), (0,), 0.0)
    assert not is_correct("in 19501", year) and is_correct("(1950)", year)


def test_wilson_known_values():
    assert wilson(5, 10) == pytest.approx((0.236593, 0.763407), abs=1e-6)
    assert wilson(0, 10) == pytest.approx((0.0, 0.277533), abs=1e-6)
    assert wilson(10, 10)[1] == pytest.approx(1.0)
    assert wilson(181, 300) == pytest.approx((0.547005, 0.657049), abs=1e-6)


def test_mcnemar_exact_known_values():
    assert mcnemar_exact(1, 9) == pytest.approx(22 / 1024)
    assert mcnemar_exact(0, 6) == pytest.approx(2 / 64)
    assert mcnemar_exact(9, 1) == mcnemar_exact(1, 9)
    assert mcnemar_exact(5, 5) == 1.0 and mcnemar_exact(0, 0) == 1.0


def test_paired_difference_interval():
    delta, low, high = paired_difference(40, 10, 2, 48)
    assert delta == pytest.approx(0.08) and 0 < low < delta < high
    mirrored = paired_difference(40, 2, 10, 48)
    assert mirrored == pytest.approx((-delta, -high, -low))
    # identical verdicts: no difference, and the interval shrinks with n
    narrow, wide = paired_difference(300, 0, 0, 300), paired_difference(30, 0, 0, 30)
    assert narrow[0] == 0 and narrow[1] < 0 < narrow[2] and narrow[2] - narrow[1] < wide[2] - wide[1]
    assert narrow[2] < 0.01 and wide[2] < 0.05


def test_versus_counts_discordant_pairs():
    row = versus([True, True, False, False, True], [True, False, True, False, False])
    assert (row["right_only_here"], row["right_only_in_reference"], row["same_verdict"]) == (2, 1, 0.4)
    assert row["mcnemar_p"] == 1.0 and row["difference"] == 0.2
    with pytest.raises(ValueError):
        versus([True], [True, False])


def test_ledger_sums_computed_tokens_of_every_request():
    ledger = TokenLedger()
    ledger.add("prefix", 32, 0)
    ledger.add("span", 200, 16)
    ledger.add("final", 300, 272)
    ledger.add("final", 50, None)
    assert (ledger.prompt, ledger.cached, ledger.computed) == (582, 288, 294)
    assert ledger.as_dict()["requests"] == {"prefix": 1, "span": 1, "final": 2}
    assert ledger.unreported == 1


def test_server_counters_are_summed_over_labels():
    text = "\n".join([
        "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 1200.0',
        'vllm:prompt_tokens_total{engine="1",model_name="m"} 300.0',
        'vllm:prompt_tokens_cached_total{engine="0",model_name="m"} 500.0',
        'vllm:prompt_tokens_by_source_total{source="x"} 7.0',
    ])  # fmt: skip
    assert parse_counters(text) == (1500.0, 500.0)
    assert parse_counters("vllm:prompt_tokens_total 3.0") is None


def test_summary_compares_each_layout_with_full():
    qs = [Question(f"q{n}", "f", "born" if n % 2 else "died", "?", str(1900 + n), (), (0, 1), (n % 2,), 0.0)
          for n in range(4)]  # fmt: skip
    full, block = TokenLedger(), TokenLedger()
    full.add("final", 1000, 100)
    block.add("span", 600, 0)
    block.add("final", 1000, 800)
    passes = {
        "full": PassResult(["1900", "1901", "1902", "no"], full, 1.0, server_computed=900),
        "block": PassResult(["1900", "no", "no", "1903"], block, 1.0, server_computed=450),
        STOCK: PassResult(["1900", "1901", "1902", "no"], full, 1.0),
    }
    summary = summarise(qs, passes)
    assert summary["full"]["accuracy"] == 0.75 and summary["block"]["accuracy"] == 0.5
    assert summary["block"]["vs_full"]["right_only_here"] == 1
    assert summary["block"]["vs_full"]["right_only_in_reference"] == 2
    assert summary["block"]["vs_full"]["same_text"] == 0.25
    assert summary["block"]["tokens"]["computed"] == 800
    assert summary["block"]["tokens"]["computed_vs_full"] == pytest.approx(800 / 900, abs=1e-4)
    assert summary["block"]["tokens"]["server_computed_vs_full"] == 0.5
    assert summary["block"]["accuracy_by_kind"] == {"born": 0.5, "died": 0.5}
    assert summary["block"]["same_text_as_stock"] == 0.25 and summary[STOCK]["vs_full"]["same_text"] == 1.0


def test_server_variants_add_their_arguments_and_name_their_passes():
    base = ["--dtype", "bfloat16"]
    variants = server_variants([("bias", "--span-bias -0.5"), ("eager", "--enforce-eager")], base)
    assert variants == {"bias": [*base, "--span-bias", "-0.5"], "eager": [*base, "--enforce-eager"]}
    for bad in ([("a@b", "--x")], [("bias", "")], [("bias", "--x"), ("bias", "--y")]):
        with pytest.raises(SystemExit, match="--server-variant"):
            server_variants(bad, base)
    qs = [Question("q", "f", "born", "?", "1900", (), (0,), (0,), 0.0)]
    passes = {"full": PassResult(["1900"], TokenLedger(), 1.0), "block@bias": PassResult(["no"], TokenLedger(), 1.0)}
    passes["full"].ledger.add("final", 10, 0)
    passes["block@bias"].ledger.add("final", 10, 5)
    row = summarise(qs, passes)["block@bias"]
    assert row["accuracy"] == 0.0 and row["description"].endswith("(server variant bias)")


def test_each_server_reports_its_passes_under_its_own_names(tmp_path):
    log = tmp_path / "server.log"
    assert Server([], log, ["full", "block"]).reported_as("block") == "block"
    assert Server([], log, ["block"], variant="bias").reported_as("block") == "block@bias"
    assert Server([], log, ["full"], stock=True).reported_as("full") == STOCK


def test_layouts_build_their_techniques():
    context = LayoutContext(block_size=16, longest_passage_tokens=100)
    assert LAYOUTS["pdep_passages"].technique(context) == Epic(k=7)
    assert LAYOUTS["block"].technique(context) == BlockAttention()
    assert LAYOUTS["full"].technique is None and not LAYOUTS["closed_book"].passages
    assert LAYOUTS["block_no_pdep"].drop_pdep


def test_the_lead_in_opens_the_first_segment_after_leading_text():
    context = LayoutContext(block_size=16, longest_passage_tokens=100)
    parts = LAYOUTS["leadin_refreshed_heads"].technique(context).documents(["a", "b"])
    assert parts == [Dependent("Passages:\n"), Span("a", head="refreshed"), Span("b", head="refreshed")]
    sdk = LAYOUTS["lead_text_leadin_refreshed_heads"].technique(context)
    assert sdk.documents(["a", "b"]) == MarkerLeadIn(LeadInContext(as_text=True)).documents(["a", "b"]) == [
        Text("a", shared=False), Dependent("Passages:\n"), Span("b", head="refreshed")]


def test_repeated_lead_layouts_lay_the_first_passage_out_again_as_a_span():
    context = LayoutContext(block_size=16, longest_passage_tokens=100)
    spans = [Span("a", head="refreshed"), Span("b", head="refreshed")]
    repeat = LAYOUTS["lead_text_repeat_refreshed_heads"].technique(context)
    assert repeat.documents(["a", "b"]) == [Text("a", shared=False), *spans]
    header = LAYOUTS["lead_text_leadin_repeat_refreshed_heads"].technique(context)
    assert header.documents(["a", "b"]) == [Text("a", shared=False), Dependent("Passages:\n"), *spans]
    last = LAYOUTS["refreshed_heads_then_lead_text"].technique(context)
    assert last.documents(["a", "b"]) == [*spans, Dependent("a")] and last.documents([]) == []


def test_lead_text_layouts_without_recomputed_heads_leave_the_rest_to_cached_spans():
    context = LayoutContext(block_size=16, longest_passage_tokens=100)
    lead = Text("a", shared=False)
    assert LAYOUTS["lead_text_block"].technique(context).documents(["a", "b"]) == [lead, Span("b")]
    assert LAYOUTS["lead_text_repeat_block"].technique(context).documents(["a", "b"]) == [lead, Span("a"), Span("b")]
    hidden = [Span("a", head="hidden"), Span("b", head="hidden")]
    assert LAYOUTS["lead_text_hidden_sink"].technique(context).documents(["a", "b"]) == [lead, hidden[1]]
    assert LAYOUTS["lead_text_repeat_hidden_sink"].technique(context).documents(["a", "b"]) == [lead, *hidden]


def test_task_first_layouts_put_the_question_before_the_passages_as_text():
    context = LayoutContext(block_size=16, longest_passage_tokens=100)
    assert LAYOUTS["full_task_first"].task_first and LAYOUTS["full_task_first"].technique is None
    rh = LAYOUTS["refreshed_heads_task_first"]
    assert rh.task_first and TaskFirst(rh.technique(context), "Who?").documents(["a", "b"]) == [
        Text("Who?\n\n"), Span("a", head="refreshed"), Span("b", head="refreshed")]


def test_trailing_heads_hide_each_span_head_and_recompute_it_before_the_task(tiny_model_dir):
    tokenizer = Tokenizer.from_pretrained(tiny_model_dir)
    docs = ["Anna Abel( 3 May 1850 – 9 June 1920) was a film director from a small town by the river.\n\n",
            "Picture 7 is a 1937 film directed by Boris Brandt, shot in winter on the northern coast.\n\n"]
    context = LayoutContext(block_size=16, longest_passage_tokens=100, tokenizer=tokenizer)
    parts = LAYOUTS["trailing_heads"].technique(context).documents(docs)
    assert parts[:2] == [Span(doc, head="hidden") for doc in docs]
    heads = [part.text for part in parts[2:]]
    assert all(isinstance(part, Dependent) for part in parts[2:]) and len(heads) == 2
    for doc, head in zip(docs, heads, strict=True):
        ids = tokenizer.encode(head)  # more than 15 only where a character spans several byte tokens
        assert doc.startswith(head) and ids[:15] == tokenizer.encode(doc)[:15] and len(ids) <= 18
    with pytest.raises(ValueError, match="needs the run's tokenizer"):
        LAYOUTS["trailing_heads"].technique(LayoutContext(16, 100)).documents(docs)


def test_sdk_techniques_register_only_when_present(monkeypatch):
    class Fancy:
        pass

    monkeypatch.setattr(minipic_client, "Fancy", Fancy, raising=False)
    monkeypatch.setattr("accuracy_layouts.LAYOUTS", dict(LAYOUTS))
    import accuracy_layouts

    register_sdk("fancy", "Fancy", "a test technique")
    register_sdk("missing", "NoSuchTechnique", "not in the SDK")
    assert isinstance(accuracy_layouts.LAYOUTS["fancy"].technique(LayoutContext(16, 1)), Fancy)
    assert "missing" not in accuracy_layouts.LAYOUTS and "fancy" not in LAYOUTS


@pytest.mark.server
async def test_passes_count_computed_tokens_from_a_cold_cache(pic_server):
    """On the tiny model: every layout kind answers; a new salt starts cold, the same salt is warm."""
    tokenizer = Tokenizer.from_pretrained(pic_server.model)
    texts = [f"Passage {n}\nThe river {n} flows {n} miles to the sea.\n\n" for n in range(4)]
    prompts = [Prompt(f"How long is river {n}?", (texts[n], texts[(n + 1) % 4], texts[(n + 2) % 4])) for n in range(4)]
    context = LayoutContext(16, max(len(tokenizer.encode(t)) for t in texts))

    async def computed(layout: str, salt: str) -> TokenLedger:
        result = await run_pass(pic_server.url, LAYOUTS[layout], prompts, tokenizer=tokenizer, context=context,
                                cache_salt=salt, max_tokens=4)  # fmt: skip
        assert len(result.texts) == len(prompts)
        assert 0 < result.ledger.computed <= result.ledger.prompt and result.ledger.unreported == 0
        return result.ledger

    full = await computed("full", "full")
    assert full.requests == {"final": 4}
    asked_first = await computed("full_task_first", "full_task_first")  # a plain prompt, the question twice
    question_tokens = sum(len(tokenizer.encode(f"{p.task}\n\n")) for p in prompts)
    assert asked_first.requests == {"final": 4} and asked_first.prompt == full.prompt + question_tokens
    salt = uuid.uuid4().hex
    cold, again, other = await computed("block", salt), await computed("block", salt), await computed("block", "b")
    assert cold.requests["final"] == 4 and cold.requests["span"] >= 1
    assert cold.computed < cold.prompt  # each passage is prefilled once, then read from the cache
    assert again.computed < cold.computed  # the same salt: warm (a new client prefills again, all cached)
    assert other.computed == cold.computed  # a new salt: cold again
    no_pdep = await computed("block_no_pdep", salt + "x")
    assert no_pdep.requests["final"] == 4 and no_pdep.prompt == cold.prompt - 4
