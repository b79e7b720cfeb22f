"""Question families of the accuracy harness: questions over real passages (and synthetic ones).

Every family makes `Item`s (a question, its answer, the passages that hold it); `place` then
puts each item's passages among distractors drawn from a bounded pool, so passages recur
across prompts as in real RAG and a span cache has something to reuse.

- ``single``: one passage answers (born / died year, film director), from fixed patterns;
- ``bridge``: two passages answer: "In which year was the director of the film T born?"
  needs the film's passage (its director) and the director's (the year);
- ``comparison``: two passages answer "Who was born first, A or B?": the answer must name
  the earlier-born and not the other, so a coin flip scores 50% (its chance level);
- ``synthetic``: a made-up entity whose made-up code only its synthetic passage states,
  with another synthetic passage (another entity, another code) among the distractors.

Open answers (a year, a name, a code) have a chance level of about 0.

A prompt's passages come in random order (``order="shuffled"``: the answering passage as likely
at every place), or as a retriever would rank them for the question (``order="ranked"``, what
`SpanRAG` sends: the passages sharing most of the question's own words first, `rank`).
"""

from __future__ import annotations

import random
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

_DATE = r"(?:\d{{1,2}} [A-Z][a-z]+ |[A-Z][a-z]+ \d{{1,2}}, )(?P<{}>\d{{3,4}})"
_LIFE = re.compile(
    r"^[^()]{3,80}?\(\s*(?:born\s+" + _DATE.format("born_only") + "|" + _DATE.format("born")
    + r"\s*[–-]\s*" + _DATE.format("died") + r")\s*\)"
)
_DIRECTOR = re.compile(r"^[^.]*?\bfilm directed by ([A-Z][^\s,.;()]+(?:\s+(?:[A-Z]\.|[A-Z][^\s,.;()]+)){1,3})")
SINGLE_QUESTIONS = {
    "born": "In which year was {} born?",
    "died": "In which year did {} die?",
    "director": "Who directed the film {}?",
}


@dataclass
class Corpus:
    """Passages by index: the real ones first, synthetic ones appended by families."""

    titles: list[str]
    texts: list[str]  # as they go in a prompt: ``title\ntext\n\n``
    usable: set[int]  # real passages short enough to be drawn as distractors

    @classmethod
    def of(cls, passages: Sequence[dict[str, str]], usable: set[int]) -> Corpus:
        return cls([p["title"] for p in passages], [f"{p['title']}\n{p['text']}\n\n" for p in passages], usable)

    def add(self, title: str, text: str) -> int:
        """Append a synthetic passage; return its index."""
        self.titles.append(title)
        self.texts.append(f"{title}\n{text}\n\n")
        return len(self.texts) - 1


@dataclass(frozen=True)
class Fact:
    passage: int
    kind: str  # born, died, director
    subject: str  # a person's name, or a film's title
    value: str  # a year, or the director's name


@dataclass(frozen=True)
class Item:
    """A question before placement: `golds` answer it, `decoys` must also be in its prompt."""

    kind: str
    question: str
    answer: str
    golds: tuple[int, ...]
    reject: tuple[str, ...] = ()  # strings that make an answer wrong (the other option)
    decoys: tuple[int, ...] = ()


@dataclass(frozen=True)
class Question:
    id: str
    family: str
    kind: str
    question: str
    answer: str
    reject: tuple[str, ...]
    passages: tuple[int, ...]  # corpus indices in prompt order
    gold_positions: tuple[int, ...]
    chance: float


def extract_facts(passages: Sequence[dict[str, str]]) -> list[Fact]:
    """Facts stated plainly at the start of a passage about its title."""
    facts = []
    for index, passage in enumerate(passages):
        name = re.sub(r"\s*\(.*?\)\s*$", "", passage["title"]).strip()
        text = passage["text"]
        if not name or not text.startswith(name):
            continue
        if life := _LIFE.match(text):
            facts.append(Fact(index, "born", name, life["born_only"] or life["born"]))
            if life["died"]:
                facts.append(Fact(index, "died", name, life["died"]))
        if director := _DIRECTOR.match(text):
            facts.append(Fact(index, "director", name, director[1]))
    return facts


def single_items(facts: list[Fact], corpus: Corpus, rng: random.Random, count: int) -> list[Item]:
    """Every single-passage question, kinds interleaved so any prefix is balanced."""
    by_kind = {kind: [f for f in facts if f.kind == kind] for kind in SINGLE_QUESTIONS}
    for group in by_kind.values():
        rng.shuffle(group)
    rounds = zip(*by_kind.values())
    return [Item(f.kind, SINGLE_QUESTIONS[f.kind].format(f.subject), f.value, (f.passage,))
            for round_ in rounds for f in round_]  # fmt: skip


def bridge_items(facts: list[Fact], corpus: Corpus, rng: random.Random, count: int) -> list[Item]:
    """Film -> its director's passage -> the director's birth or death year."""
    lives: dict[tuple[str, str], list[Fact]] = {}
    for fact in facts:
        if fact.kind in ("born", "died"):
            lives.setdefault((fact.kind, fact.subject), []).append(fact)
    items = []
    for film in (f for f in facts if f.kind == "director"):
        for kind, verb in (("born", "was {} born"), ("died", "did {} die")):
            people = lives.get((kind, film.value), [])
            if len(people) == 1 and corpus.titles[people[0].passage] != corpus.titles[film.passage]:
                question = f"In which year {verb.format('the director of the film ' + film.subject)}?"
                items.append(Item(kind, question, people[0].value, (film.passage, people[0].passage)))
    rng.shuffle(items)
    return items


def comparison_items(facts: list[Fact], corpus: Corpus, rng: random.Random, count: int) -> list[Item]:
    """`count` "Who was born first, A or B?" pairs with different years and distinct names."""
    people = [f for f in facts if f.kind == "born"]
    items: list[Item] = []
    seen: set[frozenset[int]] = set()
    for _ in range(count * 20):
        if len(items) == count:
            break
        a, b = rng.sample(people, 2)
        key = frozenset((a.passage, b.passage))
        na, nb = normalise(a.subject), normalise(b.subject)
        if key in seen or a.value == b.value or na in nb or nb in na:
            continue
        seen.add(key)
        first, second = (a, b) if int(a.value) < int(b.value) else (b, a)
        question = f"Who was born first, {a.subject} or {b.subject}?"
        items.append(Item("born_first", question, first.subject, (a.passage, b.passage), (second.subject,)))
    return items


_SYLLABLES = ("var", "nol", "tes", "ker", "mir", "dan", "lo", "vek", "sha", "rim", "bel", "tor", "ga", "quin")
_PLACES = ("Archive", "Observatory", "Foundation", "Library", "Institute", "Museum", "Guild", "Society")


def synthetic_items(facts: list[Fact], corpus: Corpus, rng: random.Random, count: int) -> list[Item]:
    """`count` made-up entities with a made-up five-digit code each; each prompt also holds another's."""
    names: set[str] = set()
    while len(names) < count:
        word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()
        names.add(f"The {word} {rng.choice(_PLACES)}")
    codes = rng.sample(range(10000, 100000), count)
    passages = []
    for name, code in zip(sorted(names), codes):
        text = (f"{name} is a small {name.split()[-1].lower()} founded in {rng.randint(1850, 1990)}. "
                f"Its registry code is {code}, assigned when it was first listed.")  # fmt: skip
        passages.append((name, str(code), corpus.add(name, text)))
    items = []
    for n, (name, code, index) in enumerate(passages):
        decoys = (passages[(n + rng.randrange(1, count)) % count][2],) if count > 1 else ()
        items.append(Item("code", f"What is the registry code of {name}?", code, (index,), decoys=decoys))
    return items


@dataclass(frozen=True)
class Family:
    """How a family makes `count` items, and the score of a guess that ignores the passages."""

    make: Callable[[list[Fact], Corpus, random.Random, int], list[Item]]
    chance: float
    description: str


FAMILIES: dict[str, Family] = {
    "single": Family(single_items, 0.0, "one passage answers: a birth or death year, or a film's director"),
    "bridge": Family(bridge_items, 0.0, "two passages answer: the year a film's director was born or died"),
    "comparison": Family(comparison_items, 0.5,
                         "two passages answer 'who was born first, A or B?' (only that name counts)"),
    "synthetic": Family(synthetic_items, 0.0,
                        "a made-up entity's made-up code, another entity's code among the distractors"),
}  # fmt: skip


ORDERS = ("shuffled", "ranked")
ORDER_HELP = "each prompt's passages shuffled, or ranked for the question as a retriever would"


def build_family(
    name: str, facts: list[Fact], corpus: Corpus, count: int, docs: int, pool: int, rng: random.Random,
    order: str = "shuffled",
) -> list[Question]:  # fmt: skip
    """`count` questions of family `name`, each over `docs` passages in `order`."""
    family = FAMILIES[name]
    items = family.make([f for f in facts if f.passage in corpus.usable], corpus, rng, count)[:count]
    if len(items) < count:
        raise SystemExit(f"family {name!r}: only {len(items)} questions from these passages, {count} asked")
    return place(name, items, corpus, docs, pool, family.chance, rng, order)


def place(
    family: str, items: list[Item], corpus: Corpus, docs: int, pool: int, chance: float, rng: random.Random,
    order: str = "shuffled",
) -> list[Question]:  # fmt: skip
    """Fill each item's prompt up to `docs` passages from one pool: the items' own passages plus
    `pool` other usable ones, so every passage recurs in several prompts. ``order="ranked"``
    then sorts each prompt's shuffled passages by `rank` (the same questions and passages as
    ``"shuffled"``: ranking draws nothing from `rng`)."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    own = list(dict.fromkeys(i for item in items for i in (*item.golds, *item.decoys)))
    others = sorted(corpus.usable - set(own))
    candidates = own + rng.sample(others, min(pool, len(others)))
    if len({corpus.titles[i] for i in candidates}) <= docs:
        raise SystemExit(f"family {family!r}: a pool of {len(candidates)} passages cannot fill {docs} per prompt")
    questions = []
    for n, item in enumerate(items):
        chosen = list(dict.fromkeys((*item.golds, *item.decoys)))
        titles = {corpus.titles[i] for i in chosen}
        while len(chosen) < docs:
            pick = rng.choice(candidates)
            if corpus.titles[pick] not in titles:
                titles.add(corpus.titles[pick])
                chosen.append(pick)
        rng.shuffle(chosen)
        if order == "ranked":
            chosen = rank(item.question, chosen, corpus)
        questions.append(Question(
            f"{family}-{n}", family, item.kind, item.question, item.answer, item.reject, tuple(chosen),
            tuple(chosen.index(g) for g in item.golds), chance,
        ))  # fmt: skip
    return questions


# The question templates' own words: every question has them, so they rank nothing.
_TEMPLATE_WORDS = frozenset("in which year was born did die who directed the film what is registry code of".split())


def rank(question: str, passages: Sequence[int], corpus: Corpus) -> list[int]:
    """`passages` by how many of the question's own words (its subject: a name, a title) each
    one's title and text hold, most first; ties keep their order. A lexical retriever's ranking:
    it puts a passage about the question's subject first, and a bridge question's second
    passage (about the film's director, unnamed in the question) wherever it ties."""
    terms = set(normalise(question).split()) - _TEMPLATE_WORDS
    return sorted(passages, key=lambda i: -len(terms & set(normalise(corpus.texts[i]).split())))


def reuse_stats(questions: Sequence[Question], lengths: Sequence[int]) -> dict[str, float | int]:
    """How often passages recur across prompts, in run order: `repeat_*` counts the passage
    slots (and their tokens) whose passage an earlier prompt already held."""
    counts = Counter(i for q in questions for i in q.passages)
    seen: set[int] = set()
    repeat_slots = repeat_tokens = tokens = 0
    for q in questions:
        for i in q.passages:
            tokens += lengths[i]
            if i in seen:
                repeat_slots += 1
                repeat_tokens += lengths[i]
            seen.add(i)
    slots = sum(counts.values())
    return {
        "passage_slots": slots,
        "distinct_passages": len(counts),
        "mean_prompts_per_passage": round(slots / len(counts), 2),
        "max_prompts_per_passage": max(counts.values()),
        "repeat_slot_share": round(repeat_slots / slots, 4),
        "repeat_token_share": round(repeat_tokens / tokens, 4),
    }


def normalise(text: str) -> str:
    """Lower-case ASCII words between single spaces, padded: `a in b` then matches whole words."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode().lower()
    return " " + " ".join(re.sub(r"[^a-z0-9]+", " ", text).split()) + " "


def is_correct(text: str, question: Question) -> bool:
    """The answer appears in `text` and nothing the question rejects does."""
    said = normalise(text)
    return normalise(question.answer) in said and not any(normalise(r) in said for r in question.reject)
