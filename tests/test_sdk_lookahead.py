"""ISPS's look-ahead (`scheduler.LookAhead`): which built job starts next."""

from __future__ import annotations

from dataclasses import dataclass

from minipic_client.errors import PromptError
from minipic_client.prompt import Prefill
from minipic_client.scheduler import LookAhead


@dataclass(frozen=True)
class Job:
    name: str
    prefills: tuple[Prefill, ...]


def job(name: str, *docs: int) -> Job:
    """A job over documents `docs`, each a span prefill of its own tokens."""
    return Job(name, tuple(Prefill.of("span", [doc] * 4) for doc in docs))


def order(jobs: list[Job | PromptError], size: int) -> list[str]:
    picked = LookAhead(enumerate(jobs), size)
    return [j.name if isinstance(j, Job) else str(j) for _, j in picked]


def test_a_job_over_documents_already_started_goes_before_older_ones() -> None:
    jobs = [job("a", 1, 2), job("b", 3, 4), job("c", 1, 5), job("d", 6, 7), job("e", 3, 2), job("f", 4, 3)]
    # a first (nothing started); of b, c: c shares document 1 with a; of b, d, e: e shares 2;
    # then b (sharing 3 with e), and f (sharing 3 and 4) before d.
    assert order(jobs, size=4) == ["a", "c", "e", "b", "f", "d"]


def test_a_look_ahead_of_one_keeps_the_build_order() -> None:
    jobs = [job("a", 1), job("b", 2), job("c", 1)]
    assert order(jobs, size=1) == ["a", "b", "c"]


def test_a_job_passed_over_size_times_goes_next() -> None:
    # Every later job shares document 1 with the first; b shares nothing and must not wait forever.
    jobs = [job("a", 1), job("b", 2), *(job(f"s{i}", 1) for i in range(8))]
    picked = order(jobs, size=3)
    assert picked.index("b") <= 1 + 3 and sorted(picked) == sorted(j.name for j in jobs)


def test_errors_go_out_first_and_only_two_jobs_are_built_before_the_first_pick() -> None:
    built: list[int] = []

    def numbered():
        for i, item in enumerate([job("a", 1), PromptError("bad"), job("c", 1), job("d", 2)]):
            built.append(i)
            yield i, item

    picked = LookAhead(numbered(), 4)
    assert next(picked)[0] == 1 and built == [0, 1]
    assert [i for i, _ in picked] == [0, 2, 3]
