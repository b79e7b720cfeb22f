"""Statistics of the accuracy harness: intervals, the paired test, the server's computed tokens."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

Z95 = 1.959963984540054


def wilson(correct: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion (95% by default)."""
    if n == 0:
        return (0.0, 1.0)
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: discordant pairs `b` against `c` under Binomial(b + c, 1/2)."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired_difference(both: int, only_a: int, only_b: int, neither: int) -> tuple[float, float, float]:
    """Accuracy of A minus accuracy of B on the same questions, with Newcombe's (1998, method 10)
    95% interval from the two Wilson intervals and the pairs' correlation."""
    n = both + only_a + only_b + neither
    p1, p2 = (both + only_a) / n, (both + only_b) / n
    l1, u1 = wilson(both + only_a, n)
    l2, u2 = wilson(both + only_b, n)
    margins = (both + only_a) * (only_b + neither) * (both + only_b) * (only_a + neither)
    association = both * neither - only_a * only_b
    if association > 0:  # Newcombe's correction: without it, no discordant pair gives a zero-width interval
        association = max(association - n / 2, 0)
    phi = association / math.sqrt(margins) if margins else 0.0
    delta = p1 - p2
    low = delta - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    high = delta + math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return (delta, max(-1.0, low), min(1.0, high))


def versus(correct: Sequence[bool], reference: Sequence[bool]) -> dict[str, float | int | list[float]]:
    """A layout's verdicts against the reference's (full attention) on the same questions."""
    if len(correct) != len(reference):
        raise ValueError(f"{len(correct)} verdicts against {len(reference)}: not the same questions")
    pairs = list(zip(correct, reference))
    both, only_a = pairs.count((True, True)), pairs.count((True, False))
    only_b, neither = pairs.count((False, True)), pairs.count((False, False))
    delta, low, high = paired_difference(both, only_a, only_b, neither)
    return {
        "same_verdict": round((both + neither) / len(pairs), 4),
        "right_only_here": only_a,
        "right_only_in_reference": only_b,
        "mcnemar_p": round(mcnemar_exact(only_a, only_b), 6),
        "difference": round(delta, 4),
        "difference_ci95": [round(low, 4), round(high, 4)],
    }


@dataclass
class TokenLedger:
    """Prompt tokens of every request one layout sent (span and prefix prefills included),
    and what the server reported cached: computed = prompt - cached, summed."""

    prompt: int = 0
    cached: int = 0
    requests: dict[str, int] = field(default_factory=dict)
    unreported: int = 0  # requests whose usage gave no cached count (counted as all computed)

    def add(self, kind: str, prompt_tokens: int, cached_tokens: int | None) -> None:
        self.prompt += prompt_tokens
        self.cached += cached_tokens or 0
        self.requests[kind] = self.requests.get(kind, 0) + 1
        self.unreported += cached_tokens is None

    @property
    def computed(self) -> int:
        return self.prompt - self.cached

    def as_dict(self) -> dict[str, object]:
        return {"prompt": self.prompt, "cached": self.cached, "computed": self.computed,
                "requests": dict(self.requests), "cached_unreported": self.unreported}  # fmt: skip
