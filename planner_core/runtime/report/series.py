"""Series derived from the report's data (pure): GPU-hours, forecast against actual, reason runs and the headline
summary (`summarise`)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from planner_core.domain import Loop
from planner_core.domain import cumulative_gpu_hours as domain_cumulative_gpu_hours
from planner_core.runtime.report.data import ReportData, TickRow


def _utc(epoch_s: float) -> dt.datetime:
    """Naive UTC datetime for plotly (plotly.js has no time zones; the axes say UTC)."""
    return dt.datetime.fromtimestamp(epoch_s, tz=dt.UTC).replace(tzinfo=None)


def _iso(epoch_s: float | None) -> str:
    return "-" if epoch_s is None else dt.datetime.fromtimestamp(epoch_s, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def gpu_observations(ticks: Sequence[TickRow]) -> list[tuple[float, int]]:
    """(epoch s, ready GPUs) of every tick that observed the workers, in time order (one time: recording order)."""
    observed = sorted((t.at_s, t.tick_id, t.ready_gpus) for t in ticks if t.ready_gpus is not None)
    return [(at_s, gpus) for at_s, _, gpus in observed]


def cumulative_gpu_hours(ticks: Sequence[TickRow]) -> list[tuple[float, float]]:
    """GPU-hours accumulated between the first and each later tick, as (epoch s, GPU-hours) points.

    `planner_core.domain.cumulative_gpu_hours` over the ticks' worker observations: the ready workers a tick saw
    are taken to run until the next tick (of either loop):
    `sum_i (ready_prefill_i * gpus_per_prefill_engine + ready_decode_i * gpus_per_decode_engine) * (t_{i+1} - t_i)
    / 3600`. Ticks without a worker observation are skipped. The metrics exporter's `gpu_hours` and
    `planner demo`'s summary count the same way.
    """
    return domain_cumulative_gpu_hours(gpu_observations(ticks))


@dataclass(frozen=True, slots=True, kw_only=True)
class ForecastPair:
    """A forecast made at one throughput tick and the window it forecast, as observed by the next tick."""

    at_s: float  # end of the forecast window (the observing tick's scheduled time)
    predicted_num_req: float
    actual_num_req: float
    predicted_isl: float
    actual_isl: float
    predicted_osl: float
    actual_osl: float


def forecast_pairs(ticks: Sequence[TickRow]) -> list[ForecastPair]:
    """Pair each throughput forecast with the observation of the window it was for.

    A tick at t forecasts the window (t, t + interval]; the next throughput tick observes the window ending at its
    own time, which is that window when `next.at_s - next.window_s` is t (within 1 s).
    """
    throughput = [t for t in ticks if t.loop is Loop.THROUGHPUT]
    pairs = []
    for made, seen in zip(throughput, throughput[1:], strict=False):
        if made.predicted_num_req is None or seen.observed_num_req is None or seen.window_s is None:
            continue
        if abs(seen.at_s - seen.window_s - made.at_s) > 1.0:
            continue  # a missed tick: the next observation covers another window
        pairs.append(
            ForecastPair(
                at_s=seen.at_s,
                predicted_num_req=made.predicted_num_req,
                actual_num_req=seen.observed_num_req,
                predicted_isl=made.predicted_isl or 0.0,
                actual_isl=seen.observed_isl or 0.0,
                predicted_osl=made.predicted_osl or 0.0,
                actual_osl=seen.observed_osl or 0.0,
            )
        )
    return pairs


def mape(pairs: Iterable[tuple[float, float]]) -> float | None:
    """Mean absolute percentage error over (forecast, actual) pairs whose actual is not 0; None if there are none."""
    errors = [abs(f - a) / a for f, a in pairs if a != 0]
    return 100.0 * sum(errors) / len(errors) if errors else None


@dataclass(frozen=True, slots=True, kw_only=True)
class ReasonRun:
    """Consecutive ticks of one loop that recorded the same reason (drawn as one segment)."""

    label: str
    start_s: float
    end_s: float
    num_ticks: int
    detail: str


def reason_runs(points: Sequence[tuple[int, float, str, str]]) -> list[ReasonRun]:
    """Merge (tick index in its loop, time, label, detail) points into runs of consecutive ticks with one label."""
    runs: list[ReasonRun] = []
    last_index: dict[str, int] = {}
    open_run: dict[str, int] = {}  # label -> position in `runs` of its run still open
    for index, at_s, label, detail in sorted(points, key=lambda p: (p[0], p[2])):
        position = open_run.get(label)
        if position is not None and last_index[label] == index - 1:
            run = runs[position]
            runs[position] = dataclasses.replace(run, end_s=at_s, num_ticks=run.num_ticks + 1)
        else:
            open_run[label] = len(runs)
            runs.append(ReasonRun(label=label, start_s=at_s, end_s=at_s, num_ticks=1, detail=detail))
        last_index[label] = index
    return runs


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportSummary:
    """The headline figures at the top of the page."""

    deployment: str
    first_tick_s: float | None
    last_tick_s: float | None
    num_ticks: dict[str, int]
    num_decisions: dict[str, int]  # by status
    num_replica_transitions: int  # ticks whose ready (prefill, decode) differ from the previous tick's
    gpu_hours: float
    ttft_target_ms: float | None
    itl_target_ms: float | None
    request_mape_pct: float | None
    num_forecasts_scored: int
    ttft_windows_within_target: tuple[int, int]  # (windows whose mean TTFT <= target, windows with a mean TTFT)
    itl_windows_within_target: tuple[int, int]


def summarise(data: ReportData) -> ReportSummary:
    ticks = data.ticks
    num_ticks = {loop.value: sum(t.loop is loop for t in ticks) for loop in Loop}
    statuses: dict[str, int] = {}
    for t in ticks:
        if t.decision_status is not None:
            statuses[t.decision_status] = statuses.get(t.decision_status, 0) + 1
    ready = [(t.ready_prefill, t.ready_decode) for t in ticks if t.ready_prefill is not None]
    transitions = sum(a != b for a, b in zip(ready, ready[1:], strict=False))
    gpu_points = cumulative_gpu_hours(ticks)
    pairs = forecast_pairs(ticks)
    latest = ticks[-1] if ticks else None

    def within(values: Iterable[tuple[float | None, float | None]]) -> tuple[int, int]:
        known = [(v, target) for v, target in values if v is not None and target is not None]
        return sum(v <= target for v, target in known), len(known)

    return ReportSummary(
        deployment=data.deployment,
        first_tick_s=ticks[0].at_s if ticks else None,
        last_tick_s=ticks[-1].at_s if ticks else None,
        num_ticks=num_ticks,
        num_decisions=dict(sorted(statuses.items())),
        num_replica_transitions=transitions,
        gpu_hours=gpu_points[-1][1] if gpu_points else 0.0,
        ttft_target_ms=latest.ttft_target_ms if latest else None,
        itl_target_ms=latest.itl_target_ms if latest else None,
        request_mape_pct=mape((p.predicted_num_req, p.actual_num_req) for p in pairs),
        num_forecasts_scored=len(pairs),
        ttft_windows_within_target=within((t.observed_ttft_ms, t.ttft_target_ms) for t in ticks),
        itl_windows_within_target=within((t.observed_itl_ms, t.itl_target_ms) for t in ticks),
    )
