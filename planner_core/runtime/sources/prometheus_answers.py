"""Prometheus' answers checked strictly and turned into traffic (pure): instant and range answers parsed
(`parse_instant_answer`, `parse_range_answer`), counters diffed into per-step increments and rebuilt into
arrivals (`StepGrid`, `step_increments`, `arrivals_from_increments`), and the window's answers checked against
the plausibility limits into an observation (`observation_from_answers`)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from planner_core.arrivals import RequestArrivals, arrivals_from_counts
from planner_core.domain import LatencyHistogram, TrafficObservation
from planner_core.runtime.sources.base import NoTrafficDataKind, TrafficUnavailable

# Plausibility limits: beyond these a value is a broken exporter or query, not traffic.
MAX_REQUESTS_PER_S = 1_000_000.0  # a million requests per second through one deployment's frontends
MAX_SEQUENCE_TOKENS = 10_000_000.0  # longer than any model's context window
MAX_LATENCY_S = 3_600.0  # an hour to the first token or between tokens
MAX_ACCEPT_LENGTH = 64.0  # speculative decoding proposes far fewer tokens per step
MAX_ANSWER_BYTES = 1 << 20  # one sample per query: a megabyte is already absurd
# A range answer holds ~30 bytes per point: 8 MiB is ~90 series of a 60 s window at 1 s, many frontends.
MAX_RANGE_ANSWER_BYTES = 8 << 20
MAX_RANGE_POINTS = 11_000  # per series: Prometheus refuses more itself
KV_HIT_RATE_SLACK = 1e-9  # sum/count of values in [0, 1] may exceed 1 by rounding


def _shown(query: str) -> str:
    return query if len(query) <= 120 else query[:117] + "..."


def _api_data(status_code: int, body: bytes, query: str) -> dict:
    """The `data` object of a successful Prometheus API answer.

    Raises:
        TrafficUnavailable: non-2xx status (HTTP_ERROR), status "error" (QUERY_ERROR), or a body that is not a
            JSON API answer (MALFORMED).
    """
    shown = _shown(query)
    try:
        answer = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        answer = None
    if isinstance(answer, dict) and answer.get("status") == "error":
        error = str(answer.get("error", ""))[:200]
        kind = NoTrafficDataKind.QUERY_ERROR
        raise TrafficUnavailable(kind, f"HTTP {status_code}, {answer.get('errorType', 'error')}: {error} ({shown})")
    if not 200 <= status_code < 300:
        raise TrafficUnavailable(NoTrafficDataKind.HTTP_ERROR, f"HTTP {status_code} for {shown}")
    if answer is None:
        raise TrafficUnavailable(NoTrafficDataKind.MALFORMED, f"answer is not JSON: {body[:80]!r} ({shown})")
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(answer, dict) or answer.get("status") != "success" or not isinstance(data, dict):
        raise TrafficUnavailable(NoTrafficDataKind.MALFORMED, f"not a Prometheus API answer ({shown})")
    return data


def _instant_vector(status_code: int, body: bytes, query: str) -> list:
    """The samples of a successful instant-vector answer (`_api_data`); MALFORMED for any other result type."""
    data = _api_data(status_code, body, query)
    result = data.get("result")
    if data.get("resultType") != "vector" or not isinstance(result, list):
        found = data.get("resultType")
        raise TrafficUnavailable(
            NoTrafficDataKind.MALFORMED, f"expected an instant vector, got {found!r} ({_shown(query)})"
        )
    return result


def parse_instant_answer(status_code: int, body: bytes, query: str) -> float | None:
    """The single sample of a Prometheus instant-vector answer, or None when the vector is empty.

    Raises:
        TrafficUnavailable: non-2xx status (HTTP_ERROR), status "error" (QUERY_ERROR), or anything that is not
            a JSON instant vector of at most one sample with a numeric string value (MALFORMED).
    """
    shown = _shown(query)
    result = _instant_vector(status_code, body, query)
    if not result:
        return None
    if len(result) != 1:
        raise TrafficUnavailable(NoTrafficDataKind.MALFORMED, f"expected one sample, got {len(result)} ({shown})")
    sample = result[0]
    value = sample.get("value") if isinstance(sample, dict) else None
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[1], str)):
        raise TrafficUnavailable(NoTrafficDataKind.MALFORMED, f"sample without a [time, value] pair ({shown})")
    return _sample_value(value[1], shown)


def _sample_value(text: str, shown: str) -> float:
    try:
        return float(text)  # Prometheus writes "NaN", "+Inf", "-Inf" for the special values
    except ValueError:
        raise TrafficUnavailable(
            NoTrafficDataKind.MALFORMED, f"sample value {text[:40]!r} is not a number ({shown})"
        ) from None


def parse_bucket_answer(status_code: int, body: bytes, query: str) -> tuple[tuple[float, float], ...]:
    """A histogram's buckets from an instant-vector answer of `sum by (le) (...)`: (upper bound, count) pairs
    sorted by bound, the +Inf bucket last as `math.inf`; empty when the vector is.

    Raises:
        TrafficUnavailable: as `parse_instant_answer`, for anything that is not a JSON instant vector whose samples
            each carry an `le` label that is a number and a [time, numeric string] value (MALFORMED).
    """
    shown = _shown(query)
    result = _instant_vector(status_code, body, query)
    buckets: list[tuple[float, float]] = []
    for sample in result:
        metric = sample.get("metric") if isinstance(sample, dict) else None
        value = sample.get("value") if isinstance(sample, dict) else None
        le = metric.get("le") if isinstance(metric, dict) else None
        if not isinstance(le, str) or not (isinstance(value, list) and len(value) == 2 and isinstance(value[1], str)):
            raise TrafficUnavailable(NoTrafficDataKind.MALFORMED, f"bucket without an le label or value ({shown})")
        buckets.append((_sample_value(le, shown), _sample_value(value[1], shown)))
    return tuple(sorted(buckets))


def histogram_from_buckets(field_name: str, buckets: tuple[tuple[float, float], ...] | None) -> LatencyHistogram | None:
    """A latency histogram (ms) from Prometheus' buckets in seconds (`parse_bucket_answer`); None without buckets,
    without a +Inf bucket or without a request. Each bucket's `increase` is extrapolated on its own, so the counts
    are made non-decreasing (a running maximum) before they are read.

    Raises:
        TrafficUnavailable: INVALID_VALUE for a negative, NaN or infinite count or bound.
    """
    if not buckets or buckets[-1][0] != math.inf:
        return None
    bounds_ms: list[float] = []
    cumulative: list[float] = []
    running = 0.0
    for bound_s, count in buckets:
        if math.isnan(count) or math.isinf(count) or count < 0:
            raise _invalid(field_name, count, f"bucket le={bound_s:g} is not a non-negative count")
        running = max(running, count)
        if bound_s == math.inf:
            break
        if math.isnan(bound_s) or bound_s < 0:
            raise _invalid(field_name, bound_s, "bucket bound is not a non-negative number")
        bounds_ms.append(bound_s * 1000.0)
        cumulative.append(running)
    if running <= 0:
        return None
    return LatencyHistogram(bounds_ms=tuple(bounds_ms), cumulative=tuple(cumulative), count=running)


# A series of a range answer: its points as (time, value), time in epoch seconds.
RangeSeries = tuple[tuple[float, float], ...]


def parse_range_answer(status_code: int, body: bytes, query: str) -> tuple[RangeSeries, ...]:
    """Every series of a Prometheus range-matrix answer (`/api/v1/query_range`); empty when none matched.

    Raises:
        TrafficUnavailable: as `parse_instant_answer`, for anything that is not a JSON matrix of series whose
            `values` are [time, numeric string] pairs (MALFORMED).
    """
    shown = _shown(query)
    data = _api_data(status_code, body, query)
    result = data.get("result")
    if data.get("resultType") != "matrix" or not isinstance(result, list):
        found = data.get("resultType")
        raise TrafficUnavailable(NoTrafficDataKind.MALFORMED, f"expected a range matrix, got {found!r} ({shown})")
    parsed = []
    for item in result:
        values = item.get("values") if isinstance(item, dict) else None
        if not isinstance(values, list):
            raise TrafficUnavailable(NoTrafficDataKind.MALFORMED, f"series without a values list ({shown})")
        points = []
        for pair in values:
            if not (
                isinstance(pair, list)
                and len(pair) == 2
                and isinstance(pair[0], int | float)
                and not isinstance(pair[0], bool)
                and isinstance(pair[1], str)
            ):
                raise TrafficUnavailable(NoTrafficDataKind.MALFORMED, f"point without a [time, value] pair ({shown})")
            points.append((float(pair[0]), _sample_value(pair[1], shown)))
        parsed.append(tuple(points))
    return tuple(parsed)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepGrid:
    """The evaluation times of a range query: `start_ms + k * step_ms` for k in 0..num_steps (epoch ms).

    Step k (1..num_steps) is the interval (point k-1, point k]; increments are indexed k - 1."""

    start_ms: int
    step_ms: int
    num_steps: int

    @classmethod
    def ending_at(cls, end_s: float, span_s: float, step_s: float) -> StepGrid:
        """The grid of whole-millisecond steps of about `step_s` whose last point is `end_s` and which covers at
        least `span_s` before it."""
        step_ms = max(1, round(step_s * 1000))
        num_steps = max(1, math.ceil(span_s * 1000 / step_ms - 1e-9))
        end_ms = round(end_s * 1000)
        return cls(start_ms=end_ms - num_steps * step_ms, step_ms=step_ms, num_steps=num_steps)

    @property
    def step_s(self) -> float:
        return self.step_ms / 1000.0

    @property
    def start_s(self) -> float:
        return self.start_ms / 1000.0

    @property
    def end_s(self) -> float:
        return (self.start_ms + self.num_steps * self.step_ms) / 1000.0

    def step_end_s(self) -> np.ndarray:
        """End of every step (epoch s)."""
        return (self.start_ms + self.step_ms * np.arange(1, self.num_steps + 1)) / 1000.0


def step_increments(series: tuple[RangeSeries, ...], grid: StepGrid, name: str) -> np.ndarray:
    """Per-step increase of counters, summed over their series (length `grid.num_steps`).

    Each series' consecutive points are diffed; a decrease is a counter reset, the counter restarted from 0, so
    the step gets the new value (Prometheus' `increase` reads resets the same way). A series' first point is its
    baseline (a series that appears inside the range, a new frontend, counts from its second point, as `increase`
    does); an increment across missing points (the target was down) is spread evenly over the steps it spans.

    Raises:
        TrafficUnavailable: MALFORMED for a point off the grid or out of order; INVALID_VALUE for a value that is
            NaN, infinite or negative.
    """
    out = np.zeros(grid.num_steps)
    for points in series:
        previous: tuple[int, float] | None = None
        for time_s, value in points:
            k = round((time_s * 1000 - grid.start_ms) / grid.step_ms)
            on_grid = abs(time_s * 1000 - (grid.start_ms + k * grid.step_ms)) < 0.5
            if not (on_grid and 0 <= k <= grid.num_steps) or (previous is not None and k <= previous[0]):
                raise TrafficUnavailable(
                    NoTrafficDataKind.MALFORMED, f"{name}: point at {time_s!r} is off the query's steps or out of order"
                )
            if not math.isfinite(value) or value < 0:
                raise _invalid(name, value, "a counter must be a finite number >= 0")
            if previous is not None:
                last_k, last_value = previous
                increase = value - last_value if value >= last_value else value  # a reset restarts from 0
                out[last_k:k] += increase / (k - last_k)
            previous = (k, value)
    return out


def arrivals_from_increments(
    grid: StepGrid, num_req: np.ndarray, isl_sum: np.ndarray, isl_count: np.ndarray, window_start_s: float
) -> RequestArrivals:
    """Arrivals rebuilt from per-step increments of the started counter and the ISL histogram's `_sum` and
    `_count` (`arrivals_from_counts`): a step's requests get the step's mean ISL, or, where the step has no ISL
    observation, the window's mean (the steps ending after `window_start_s`), else the whole range's.

    Raises:
        TrafficUnavailable: INVALID_VALUE for more requests per step than `MAX_REQUESTS_PER_S` allows, a mean ISL
            above `MAX_SEQUENCE_TOKENS`, or requests in a range without a single ISL observation.
    """
    step_s = grid.step_s
    busiest = float(num_req.max()) if len(num_req) else 0.0
    if busiest > MAX_REQUESTS_PER_S * step_s:
        raise _invalid("requests per step", busiest, f"above the plausible maximum {MAX_REQUESTS_PER_S * step_s:g}")
    in_window = grid.step_end_s() > window_start_s
    fallback = None
    for part in (in_window, np.ones(grid.num_steps, dtype=bool)):
        if isl_count[part].sum() > 0:
            fallback = float(isl_sum[part].sum() / isl_count[part].sum())
            break
    if fallback is None:
        if num_req.sum() >= 0.5:
            raise _invalid("isl", math.nan, f"no observations although {num_req.sum():g} requests started")
        fallback = 0.0
    observed = isl_count > 0
    mean_isl = np.full(grid.num_steps, fallback)
    mean_isl[observed] = isl_sum[observed] / isl_count[observed]
    longest = float(mean_isl.max()) if len(mean_isl) else 0.0
    if longest > MAX_SEQUENCE_TOKENS:
        raise _invalid("isl", longest, f"above the plausible maximum {MAX_SEQUENCE_TOKENS:g}")
    return arrivals_from_counts(grid.step_end_s(), num_req, mean_isl, resolution_s=step_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class RawAnswers:
    """The values Prometheus returned for one window; None = the series does not exist, NaN = 0/0."""

    duration_s: float
    num_req: float
    isl: float | None
    osl: float | None
    ttft_s: float | None = None
    itl_s: float | None = None
    kv_hit_rate: float | None = None
    accept_length: float | None = None
    ttft_p95_s: float | None = None
    ttft_p99_s: float | None = None
    queue_s: float | None = None
    # the TTFT and ITL histograms' buckets, (le seconds, count) with +Inf last (`parse_bucket_answer`)
    ttft_buckets: tuple[tuple[float, float], ...] | None = None
    itl_buckets: tuple[tuple[float, float], ...] | None = None


def _invalid(field_name: str, value: float, why: str) -> TrafficUnavailable:
    return TrafficUnavailable(NoTrafficDataKind.INVALID_VALUE, f"{field_name} = {value!r}: {why}")


def _checked(field_name: str, value: float, low: float, high: float) -> float:
    if math.isnan(value) or math.isinf(value):
        raise _invalid(field_name, value, "not a finite number")
    if value < low:
        raise _invalid(field_name, value, f"below {low:g}")
    if value > high:
        raise _invalid(field_name, value, f"above the plausible maximum {high:g}")
    return value


def _optional(field_name: str, value: float | None, low: float, high: float) -> float | None:
    """An optional figure: absent or 0/0 (no observations in the window) is None, anything else is checked."""
    if value is None or math.isnan(value):
        return None
    return _checked(field_name, value, low, high)


def observation_from_answers(answers: RawAnswers) -> TrafficObservation:
    """Validate the answers of one window and build its observation.

    Idle (num_req 0): ISL and OSL are 0/0 in Prometheus and become 0. Busy: ISL and OSL must be finite; the
    optional figures (TTFT, ITL, KV hit rate, accept length) are None when absent or 0/0.

    Raises:
        TrafficUnavailable: NO_SERIES when the ISL/OSL histograms are missing; INVALID_VALUE for a NaN where a
            number is needed, a negative, infinite or implausibly large value.
    """
    duration_s = answers.duration_s
    num_req = _checked("num_req", answers.num_req, 0.0, MAX_REQUESTS_PER_S * max(duration_s, 1.0))
    lengths = {}
    for name, value in (("isl", answers.isl), ("osl", answers.osl)):
        if value is None:
            raise TrafficUnavailable(NoTrafficDataKind.NO_SERIES, f"no {name} histogram series")
        if num_req == 0 and math.isnan(value):
            lengths[name] = 0.0  # idle window: no requests, so no mean length (Dynamo normalises the same way)
        elif math.isnan(value):
            raise _invalid(name, value, f"no observations although {num_req:g} requests started")
        else:
            lengths[name] = _checked(name, value, 0.0, MAX_SEQUENCE_TOKENS)
    ttft_s = _optional("ttft_s", answers.ttft_s, 0.0, MAX_LATENCY_S)
    itl_s = _optional("itl_s", answers.itl_s, 0.0, MAX_LATENCY_S)
    tail_ms = {  # the observation's field: the answer's seconds, checked, in ms
        field_name: None if seconds is None else seconds * 1000.0
        for field_name, seconds in (
            ("ttft_ms_p95", _optional("ttft_p95_s", answers.ttft_p95_s, 0.0, MAX_LATENCY_S)),
            ("ttft_ms_p99", _optional("ttft_p99_s", answers.ttft_p99_s, 0.0, MAX_LATENCY_S)),
            ("queue_ms", _optional("queue_s", answers.queue_s, 0.0, MAX_LATENCY_S)),
        )
    }
    return TrafficObservation(
        duration_s=duration_s,
        num_req=num_req,
        isl=lengths["isl"],
        osl=lengths["osl"],
        ttft_ms=None if ttft_s is None else ttft_s * 1000.0,
        itl_ms=None if itl_s is None else itl_s * 1000.0,
        **tail_ms,
        kv_hit_rate=_optional("kv_hit_rate", answers.kv_hit_rate, 0.0, 1.0 + KV_HIT_RATE_SLACK),
        accept_length=_optional("accept_length", answers.accept_length, 1.0, MAX_ACCEPT_LENGTH),
        ttft_histogram=histogram_from_buckets("ttft_buckets", answers.ttft_buckets),
        itl_histogram=histogram_from_buckets("itl_buckets", answers.itl_buckets),
    )
