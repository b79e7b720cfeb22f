"""benchmarks/load_sweep.py's pure parts: the Poisson schedule, percentiles, goodput and the SLO goal."""

from __future__ import annotations

import math
import statistics

import pytest
from load_sweep import Sample, goal, highest_sustained, meets_slo, percentile, poisson_offsets, summarize


def test_poisson_offsets_are_seeded_increasing_and_at_the_rate() -> None:
    offsets = poisson_offsets(20.0, 4000, seed=3)
    assert offsets[0] == 0.0 and offsets == poisson_offsets(20.0, 4000, seed=3)
    assert offsets != poisson_offsets(20.0, 4000, seed=4)
    gaps = [b - a for a, b in zip(offsets, offsets[1:])]
    assert min(gaps) >= 0
    assert statistics.mean(gaps) == pytest.approx(1 / 20, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(1 / 20, rel=0.1)  # exponential: sd = mean
    assert poisson_offsets(5.0, 0, seed=0) == []
    with pytest.raises(ValueError):
        poisson_offsets(0.0, 3, seed=0)


def test_percentile_interpolates_like_numpy() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 50) == 2.5
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 4.0
    assert percentile(list(range(101)), 99) == 99.0
    assert percentile([1.0, 2.0], 99) == pytest.approx(1.99)
    assert percentile([], 50) is None
    inf = math.inf
    assert percentile([1.0, inf, inf], 99) == inf and percentile([1.0, 2.0, inf], 50) == 2.0
    assert percentile([1.0, 2.0, inf], 25) == 1.5


def done(arrival: float, ttft: float, e2e: float, tokens: int) -> Sample:
    gaps = [(e2e - ttft) / (tokens - 1)] * (tokens - 1)
    return Sample(arrival, ttft=ttft, e2e=e2e, chunk_gaps=gaps, tokens=tokens)


def test_summarize_counts_goodput_and_late_samples() -> None:
    samples = [done(0.1 * i, 0.5, 1.5, 11) for i in range(8)] + [done(1.0, 3.0, 4.0, 11)]
    samples.append(Sample(1.1, waited=5.0))  # cancelled at the drain timeout, no token yet
    row = summarize(samples, elapsed=5.0, slo_ttft=2.0)
    assert (row["sent"], row["completed"], row["cancelled"], row["failed"]) == (10, 9, 1, 0)
    assert row["throughput_per_s"] == 9 / 5 and row["goodput_per_s"] == 8 / 5
    assert row["slo_met_fraction"] == 0.8
    assert row["ttft_p50_s"] == 0.5 and row["ttft_censored"]
    assert row["ttft_p99_s"] == pytest.approx(3.0 + 0.91 * 2.0)  # between 3.0 and the waited 5.0
    assert row["itl_p50_s"] == pytest.approx(0.1) and row["tpot_p99_s"] == pytest.approx(0.1)
    assert row["e2e_p50_s"] == 1.5


def test_a_failed_sample_makes_p99_unbounded() -> None:
    samples = [done(0.0, 0.5, 1.0, 2), Sample(0.1, error="ServerError()"), Sample(0.2, error="ServerError()")]
    row = summarize(samples, elapsed=1.0, slo_ttft=2.0)
    assert row["ttft_p99_s"] is None and row["failed"] == 2  # JSON has no infinity (nor NaN)
    assert row["ttft_p50_s"] is None and not meets_slo(row, 2.0)


def rows(server: str, p99: dict[float, float | None]) -> list[dict]:
    return [{"server": server, "rate": rate, "ttft_p99_s": v, "failed": 0} for rate, v in p99.items()]


def test_goal_reads_the_rate_where_stock_passes_the_slo() -> None:
    stock = rows("stock-fa3", {10: 0.2, 20: 0.4, 30: 2.5, 40: 9.0})
    pic = rows("pic-256", {10: 0.1, 20: 0.15, 30: 0.3, 40: 0.5, 50: 3.0})
    assert highest_sustained(stock, 2.0) == 20 and highest_sustained(pic, 2.0) == 40
    out = goal(stock, pic, 2.0)
    assert out["stock_passes_slo_at_rate"] == 30
    assert out["ttft_p99_ratio"] == pytest.approx(2.5 / 0.3) and out["ttft_goal_met"]
    assert out["sustained_rate_ratio"] == 2.0 and out["rate_goal_met"]
    assert not out["pic_met_slo_at_every_rate"]
    never = goal(rows("stock-fa3", {10: 0.2}), pic, 2.0)  # stock never passed it: no TTFT ratio
    assert "ttft_p99_ratio" not in never and never["ttft_goal_met"] is None
    assert highest_sustained(rows("x", {10: 2.5, 20: None}), 2.0) is None
