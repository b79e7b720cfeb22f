"""The split of wrong year answers by where the named year comes from (`benchmarks/accuracy_errors.py`)."""

from __future__ import annotations

from accuracy_errors import CAUSES, cause, wrong_years

GOLD = "Ann Lee\nAnn Lee (3 May 1901 – 9 June 1977) was a painter."
OTHER = "Bo Lee\nBo Lee (born 1950) is a singer; his album came out in 1977."


def test_a_wrong_year_is_blamed_on_the_first_source_that_holds_it() -> None:
    assert cause("She died in 1950.", [GOLD], [OTHER]) == CAUSES[0]  # another passage's
    assert cause("She died in 1977.", [GOLD], [OTHER]) == CAUSES[0]  # in both: the other passage first
    assert cause("She died in 1901.", [GOLD], [OTHER]) == CAUSES[1]  # the answering passage's birth year
    assert cause("She died in 1812.", [GOLD], [OTHER]) == CAUSES[2]
    assert cause("The answer is:", [GOLD], [OTHER]) == CAUSES[3]


def test_only_wrong_answers_count_and_director_questions_are_not_split() -> None:
    def question(kind: str, text: str, correct: bool) -> dict:
        return {"kind": kind, "passages": [1, 0], "gold_positions": [1],
                "answers": {"full": {"text": text, "correct": correct}}}  # fmt: skip

    questions = [question("died", "1977", True), question("died", "1950", False), question("born", "1901", False),
                 question("director", "Bo Lee", False)]  # fmt: skip
    expected = {"wrong": 3, CAUSES[0]: 1, CAUSES[1]: 1, CAUSES[2]: 0, CAUSES[3]: 0}
    assert wrong_years(questions, [GOLD, OTHER], "full") == expected
