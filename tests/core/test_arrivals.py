"""The prompt-token arrival curve and the arrivals it is computed from (`planner_core.arrivals`)."""

from __future__ import annotations

import numpy as np
import pytest

from planner_core.arrivals import LOOKBACK_S, PromptCap, RequestArrivals, arrivals_from_counts, prompt_arrival_curve
from tests.core.fakes import make_trace

# Requests at 0, 0.1, 0.2 and 5 s of 100, 200, 300 and 400 prompt tokens.
TRACE = make_trace([0.0, 0.1, 0.2, 5.0], [100, 200, 300, 400], [2, 2, 2, 2])


def test_curve_is_the_p99_of_tokens_in_each_lookback() -> None:
    """Over [0, 10): tokens in the 250 ms up to each arrival are 100, 300, 600 and 400; their p99 (numpy's linear
    percentile) is 400 + 0.97 x 200 = 594. Over 30 s every request sees all earlier ones: 100, 300, 600, 1000 ->
    p99 = 600 + 0.97 x 400 = 988."""
    curve = prompt_arrival_curve(TRACE.arrivals(0.0, 10.0), 0.0, 10.0)
    assert curve["prompt_tokens_p99_250ms"] == pytest.approx(594.0)
    assert curve["prompt_tokens_p99_30s"] == pytest.approx(988.0)


def test_curve_is_read_by_the_requests_that_can_meet_the_target() -> None:
    """At 4,000 tokens/s and 50 ms of slack only prompts up to 200 tokens can meet the target: the first two
    requests. Nothing is capped (one engine's share at 250 ms is 1,200); the tokens in the 250 ms up to those two
    are 100 and 300 -> p99 = 100 + 0.99 x 200 = 298 (the 600 seen by the third request no longer counts)."""
    cap = PromptCap(engine_prompt_tokens_per_s=4000.0, slack_s=0.05)
    curve = prompt_arrival_curve(TRACE.arrivals(0.0, 10.0), 0.0, 10.0, cap=cap)
    assert curve["prompt_tokens_p99_250ms"] == pytest.approx(298.0)
    assert prompt_arrival_curve(TRACE.arrivals(20.0, 30.0), 20.0, 30.0) == {}  # idle window: no curve


def test_curve_counts_each_prompt_up_to_one_engine_share() -> None:
    """An engine of 400 tokens/s and 50 ms of slack: at 250 ms one engine computes 400 x 0.3 = 120 tokens, so the
    prompts count 100, 120, 120, 120: tokens in the 250 ms up to each arrival are 100, 220, 340 and 120 -> p99 =
    220 + 0.97 x 120 = 336.4. At 30 s the share (12,020) caps nothing: 988."""
    cap = PromptCap(engine_prompt_tokens_per_s=400.0, slack_s=0.05)
    curve = prompt_arrival_curve(TRACE.arrivals(0.0, 10.0), 0.0, 10.0, cap=cap)
    assert curve["prompt_tokens_p99_250ms"] == pytest.approx(336.4)
    assert curve["prompt_tokens_p99_30s"] == pytest.approx(988.0)


def test_earlier_windows_requests_count_through_the_lookback() -> None:
    """The window [5, 10) holds one request (400 tokens at 5 s); within 30 s before it came 600 more tokens, which
    the trace passes (`RequestTrace.arrivals` reaches LOOKBACK_S back): 30 s -> 1000, 250 ms -> 400."""
    arrivals = TRACE.arrivals(5.0, 10.0)
    assert arrivals.num_requests == 4 and LOOKBACK_S == 30.0
    curve = prompt_arrival_curve(arrivals, 5.0, 10.0)
    assert (curve["prompt_tokens_p99_250ms"], curve["prompt_tokens_p99_30s"]) == (400.0, 1000.0)


def test_arrivals_rebuilt_from_counts_spread_over_each_step() -> None:
    """Two 1 s steps ending at 11 and 12 s with 2 and 1 requests of 300 and 600 tokens: arrivals at 10.25, 10.75
    and 11.5 s. At that resolution the curve leaves out its 250 and 500 ms points; at 1 s the tokens up to each
    arrival are 300, 600 and 600 (the first step's second request is 0.75 s before the third)."""
    arrivals = arrivals_from_counts(np.array([11.0, 12.0]), np.array([2.0, 1.0]), np.array([300.0, 600.0]),
                                    resolution_s=1.0)  # fmt: skip
    assert arrivals.arrival_s.tolist() == [10.25, 10.75, 11.5]
    assert arrivals.isl.tolist() == [300.0, 300.0, 600.0]
    curve = prompt_arrival_curve(arrivals, 10.0, 12.0)
    assert "prompt_tokens_p99_250ms" not in curve and "prompt_tokens_p99_500ms" not in curve
    assert curve["prompt_tokens_p99_1s"] == pytest.approx(np.percentile([300, 600, 900], 99))


def test_counts_are_rounded_to_whole_requests_and_bad_counts_refused() -> None:
    """Prometheus' increase() extrapolates to fractions: 1.6 requests are 2, 0.4 none; a negative count (a counter
    reset the caller did not handle), a step of 0 or arrays of different lengths are refused in one line."""
    arrivals = arrivals_from_counts(np.array([1.0, 2.0]), np.array([1.6, 0.4]), np.array([10.0, 10.0]),
                                    resolution_s=1.0)  # fmt: skip
    assert arrivals.num_requests == 2
    for counts, resolution_s, match in (
        ([1.0, -1.0], 1.0, "request count per step is negative"),
        ([1.0, 1.0], 0.0, "resolution_s = 0.0"),
        ([1.0], 1.0, "2 steps, 1 counts"),
    ):
        with pytest.raises(ValueError, match=match):
            arrivals_from_counts(np.array([1.0, 2.0]), np.array(counts), np.array([5.0, 5.0]),
                                 resolution_s=resolution_s)  # fmt: skip
    with pytest.raises(ValueError, match="non-decreasing"):
        RequestArrivals(arrival_s=np.array([2.0, 1.0]), isl=np.array([1.0, 1.0]))
