"""The start-up-aware horizon (`planner_core.policy.horizon`): measured start-up times, the learned headroom and how
the throughput loop applies them; the bench's knob rows and frontier."""

from __future__ import annotations

import dataclasses
import json

import pytest

from planner_core.domain import (
    AppliedTargets,
    Component,
    HorizonWindow,
    PendingScaleUp,
    PlannerState,
    ReasonCode,
    StartupSample,
    StartupState,
)
from planner_core.perf.model import ProfilePerfModel
from planner_core.policy.horizon import (
    HORIZON_WINDOWS_KEPT,
    STARTUP_SAMPLES_KEPT,
    horizon_headroom,
    horizon_residuals,
    pool_startup_s,
    record_window,
    track_startups,
)
from planner_core.runtime.store.codec import from_jsonable, to_jsonable
from planner_core.tick import tick
from tests.core.test_tick import PROFILE_DIR, desired, make_config, steps_named, throughput_inputs, traffic, workers

BOTH = (Component.PREFILL, Component.DECODE)
PERF = ProfilePerfModel.load(PROFILE_DIR)


# --- measured start-up ------------------------------------------------------------------------------------------


def test_a_scale_up_is_timed_from_the_raising_tick_to_the_tick_that_sees_it_ready() -> None:
    """Prefill raised 1 -> 3 at 60 s; still starting at 120 s; ready at 180 s: one sample of 120 s."""
    state = track_startups(StartupState(), 60.0, workers(1, 1), {Component.PREFILL: 3, Component.DECODE: 1}, BOTH)
    assert state.pending == (PendingScaleUp(component=Component.PREFILL, at_s=60.0, target=3),)
    state = track_startups(state, 120.0, workers(3, 1, ready=(1, 1)), {}, BOTH)
    assert state.samples == () and len(state.pending) == 1
    state = track_startups(state, 180.0, workers(3, 1), {}, BOTH)
    assert state.pending == ()
    assert state.samples == (StartupSample(component=Component.PREFILL, at_s=180.0, startup_s=120.0),)


def test_a_cancelled_scale_up_gives_no_sample() -> None:
    """The target lowered below the pending one before its engines started: dropped, nothing measured."""
    state = track_startups(StartupState(), 60.0, workers(1, 1), {Component.DECODE: 4}, BOTH)
    state = track_startups(state, 120.0, workers(1, 2, ready=(1, 1)), {}, BOTH)
    assert state == StartupState()


def test_each_raise_over_one_in_flight_is_timed_from_its_own_tick() -> None:
    """2 at 60 s, 4 at 120 s; 2 ready at 180 s (sample 120 s), 4 ready at 300 s (sample 180 s)."""
    state = track_startups(StartupState(), 60.0, workers(1, 1), {Component.PREFILL: 2}, BOTH)
    state = track_startups(state, 120.0, workers(2, 1, ready=(1, 1)), {Component.PREFILL: 4}, BOTH)
    assert [p.target for p in state.pending] == [2, 4]
    state = track_startups(state, 180.0, workers(4, 1, ready=(2, 1)), {}, BOTH)
    state = track_startups(state, 300.0, workers(4, 1), {}, BOTH)
    assert [s.startup_s for s in state.samples] == [120.0, 180.0]


def test_the_acknowledgement_splits_a_start_up_into_applying_and_the_engines_start() -> None:
    """Prefill raised 1 -> 3 at 60 s. Applied decisions listed by the next ticks: one from before the raise (30 s)
    and one with a smaller target (70 s) do not start these engines; the one at 75 s does, though the tick at
    120 s does not list it yet (the execution flow ran late): ready at 180 s, 120 s of which 15 s to apply."""
    earlier = AppliedTargets(at_s=30.0, num_prefill=3)
    smaller = AppliedTargets(at_s=70.0, num_prefill=2, num_decode=1)
    applying = AppliedTargets(at_s=75.0, num_prefill=3, num_decode=1)
    state = track_startups(StartupState(), 60.0, workers(1, 1), {Component.PREFILL: 3}, BOTH)
    state = track_startups(state, 120.0, workers(3, 1, ready=(1, 1)), {}, BOTH, applied=(earlier, smaller))
    assert state.pending[0].applied_at_s is None
    state = track_startups(state, 150.0, workers(3, 1, ready=(1, 1)), {}, BOTH, applied=(applying, smaller))
    assert state.pending[0].applied_at_s == 75.0
    state = track_startups(state, 180.0, workers(3, 1), {}, BOTH, applied=(AppliedTargets(at_s=170.0, num_prefill=9),))
    assert state.samples == (StartupSample(component=Component.PREFILL, at_s=180.0, startup_s=120.0, apply_s=15.0),)
    value, step = pool_startup_s(state, Component.PREFILL, 600.0)
    assert value == 120.0  # counted from the decision: the horizon a decision looks over includes the applying
    assert "acknowledgement: median 15 s of 1" in step.detail


def test_the_pool_start_up_is_the_median_of_its_last_samples_else_the_configured_one() -> None:
    configured, step = pool_startup_s(StartupState(), Component.DECODE, 120.0)
    assert (configured, step.reason) == (120.0, ReasonCode.STARTUP_CONFIGURED)
    samples = tuple(
        StartupSample(component=Component.PREFILL, at_s=float(i), startup_s=s)
        for i, s in enumerate((900.0, 600.0, 540.0, 660.0, 600.0, 600.0))
    )
    state = track_startups(StartupState(samples=samples), 10.0, workers(1, 1), {}, BOTH)
    assert len(state.samples) == STARTUP_SAMPLES_KEPT  # the oldest (900 s) forgotten
    measured, step = pool_startup_s(state, Component.PREFILL, 120.0)
    assert (measured, step.reason) == (600.0, ReasonCode.STARTUP_MEASURED)
    assert pool_startup_s(state, Component.DECODE, 120.0)[0] == 120.0  # per pool


# --- learned headroom -------------------------------------------------------------------------------------------


def windows_of(planned: list[float], observed: list[float]) -> tuple[HorizonWindow, ...]:
    windows: tuple[HorizonWindow, ...] = ()
    for i, (p, o) in enumerate(zip(planned, observed, strict=True)):
        windows = record_window(windows, 60.0 * i, {Component.PREFILL: p}, {Component.PREFILL: o})
    return windows


def test_residuals_are_the_horizon_peak_need_less_the_planned_one() -> None:
    """Planned 2 every window, observed needs 1, 5, 1, 3: two-window horizons close for the first two ticks."""
    windows = windows_of([2, 2, 2, 2], [1, 5, 1, 3])
    assert horizon_residuals(windows, Component.PREFILL, 2) == [3.0, 1.0]  # max(5, 1) - 2, max(1, 3) - 2
    assert horizon_residuals(windows, Component.PREFILL, 1) == [3.0, -1.0, 1.0]


def test_headroom_is_the_conformal_quantile_of_the_residuals() -> None:
    """Residuals 0..9 (planned 0, observed i over a one-window horizon): q = 0.5 takes the ceil(11 * 0.5) = 6th
    smallest (5), q = 0.8 the 9th (8); q = 0.95 would need the 11th of 10 and takes the largest (9)."""
    windows = windows_of([0.0] * 11, [0.0, *[float(i) for i in range(10)]])
    common = {"startup_s": 0.0, "interval_s": 60.0, "component": Component.PREFILL}
    assert horizon_headroom(windows, quantile=0.5, **common)[0] == 5.0
    assert horizon_headroom(windows, quantile=0.8, **common)[0] == 8.0
    value, step = horizon_headroom(windows, quantile=0.95, **common)
    assert (value, step.reason) == (9.0, ReasonCode.HORIZON_SHORT_HISTORY)
    assert horizon_headroom(windows[:1], quantile=0.5, **common)[1].reason is ReasonCode.HORIZON_NO_HISTORY


def test_headroom_is_never_negative_and_the_horizon_follows_the_start_up() -> None:
    """A plan above every later need adds nothing; a longer start-up spans more windows (a later peak counts)."""
    windows = windows_of([5, 5, 5, 5, 5], [0, 1, 1, 1, 9])
    common = {"interval_s": 60.0, "quantile": 0.5, "component": Component.PREFILL}
    assert horizon_headroom(windows, startup_s=0.0, **common)[0] == 0.0  # residuals -4, -4, -4, 4: median -4
    value, step = horizon_headroom(windows, startup_s=180.0, **common)  # 4-window horizon: max(1, 1, 1, 9) - 5
    assert value == 4.0 and "240 s (4 windows)" in step.detail


def test_the_window_history_is_bounded() -> None:
    windows: tuple[HorizonWindow, ...] = ()
    for i in range(HORIZON_WINDOWS_KEPT + 5):
        windows = record_window(windows, float(i), {}, {})
    assert len(windows) == HORIZON_WINDOWS_KEPT and windows[0].at_s == 5.0


# --- the throughput loop ------------------------------------------------------------------------------------------


def horizon_config(quantile: float):  # PlannerConfig
    return make_config(throughput_algorithm="engine_capacity", throughput_horizon_quantile=quantile)


def run_windows(quantile: float, loads: list[float]) -> tuple[list[int], PlannerState, list]:
    """Throughput ticks on windows of `loads` requests (ISL 3000, OSL 300), each decision ready at once."""
    config, state, prefill, decode = horizon_config(quantile), PlannerState(), 1, 1
    sizes, outcomes = [], []
    for i, num_req in enumerate(loads):
        outcome = tick(
            throughput_inputs(traffic(num_req, 3000, 300), workers(prefill, decode), now_s=60.0 * (i + 1)),
            state, config, PERF,
        )  # fmt: skip
        state = outcome.next_state
        prefill, decode = desired(outcome)[Component.PREFILL], desired(outcome)[Component.DECODE]
        sizes.append(prefill)
        outcomes.append(outcome)
    return sizes, state, outcomes


BURSTY = [6000.0, 60.0, 60.0, 6000.0, 60.0, 60.0, 6000.0, 60.0, 60.0, 6000.0, 60.0, 60.0]


def test_the_horizon_holds_prefill_through_the_lulls_between_repeat_bursts() -> None:
    """Bursts of 100 req/s (6 prefill engines at 16.7 req/s each) every third minute, 1 req/s between: without
    the horizon the pool follows each window down to 1; with it the learned shortfall keeps it near the burst
    size in the lulls, once a horizon has closed."""
    plain, _, _ = run_windows(0.0, BURSTY)
    held, state, outcomes = run_windows(0.75, BURSTY)
    assert plain[-2:] == [1, 1]
    assert min(held[4:]) >= 6 > max(plain[i] for i in (4, 5, 7, 8, 10, 11))
    assert len(state.horizon_windows) == len(BURSTY)
    (step,) = steps_named(outcomes[-1], "horizon", Component.PREFILL)
    assert step.reason in (ReasonCode.HORIZON_HEADROOM, ReasonCode.HORIZON_SHORT_HISTORY) and step.value > 0


def history_with_residual(residual: float, *, planned: float = 3.0, num_windows: int = 10) -> PlannerState:
    """A state whose every closed horizon fell short of its plan by `residual` engines (both pools); the windows end
    one interval before the tick at 660 s that `ordering_tick` runs."""
    windows = tuple(
        HorizonWindow(at_s=60.0 * (i + 1), planned_prefill=planned, observed_prefill=planned + residual,
                      planned_decode=planned, observed_decode=planned + residual)
        for i in range(num_windows)
    )  # fmt: skip
    return PlannerState(horizon_windows=windows)


def ordering_tick(state: PlannerState, num_req: float = 2500.0, now_s: float = 660.0, prefill: int = 3):
    """One throughput tick with the knob on and the 450 s scale-down hold; 2500 requests a minute (ISL 3000, OSL
    300) need 2.491 prefill engines before rounding up."""
    config = make_config(
        throughput_algorithm="engine_capacity", throughput_horizon_quantile=0.75, throughput_scale_down_hold_seconds=450
    )
    return tick(throughput_inputs(traffic(num_req, 3000, 300), workers(prefill, 3), now_s=now_s), state, config, PERF)


def test_the_headroom_raises_the_need_before_rounding_up() -> None:
    """A 0.01-engine headroom on a need of 2.491 engines gives ceil(2.501) = 3, not the rounded 3 plus a whole
    engine (ceil(3 + 0.01) = 4, what adding it to the size after the hold did); the step shows the sum."""
    outcome = ordering_tick(history_with_residual(0.01))
    (step,) = steps_named(outcome, "horizon", Component.PREFILL)
    assert step.reason is ReasonCode.HORIZON_HEADROOM and step.value == pytest.approx(0.01)
    assert desired(outcome)[Component.PREFILL] == 3
    assert "need 2.491 + 0.010 = 2.501 engines: size max(3, ceil(2.501)) = 3" in step.detail
    # the planned need recorded for this window is the need before the headroom (what the residuals measure)
    assert outcome.next_state.horizon_windows[-1].planned_prefill == pytest.approx(2.491, abs=1e-3)


def test_the_scale_down_hold_keeps_the_engines_the_headroom_adds() -> None:
    """The headroom runs before the hold: a raise it causes (2.491 + 0.6 engines: 4) is a need the hold records,
    so a later tick within the hold whose headroom is gone (no history) and whose need is lower keeps the 4."""
    raised = ordering_tick(history_with_residual(0.6))
    assert desired(raised)[Component.PREFILL] == 4
    assert raised.next_state.recent_throughput_needs[-1].num_prefill == 4
    later_state = dataclasses.replace(raised.next_state, horizon_windows=())
    later = ordering_tick(later_state, num_req=1500.0, now_s=720.0, prefill=4)
    (step,) = steps_named(later, "horizon", Component.PREFILL)
    assert step.reason is ReasonCode.HORIZON_NO_HISTORY
    (hold,) = steps_named(later, "scale_down_hold", Component.PREFILL)
    assert hold.reason is ReasonCode.SCALE_DOWN_HELD and desired(later)[Component.PREFILL] == 4


def test_a_higher_quantile_never_holds_less() -> None:
    sizes = [run_windows(q, BURSTY)[0] for q in (0.25, 0.5, 0.75, 0.95)]
    for lower, higher in zip(sizes, sizes[1:], strict=False):
        assert all(a <= b for a, b in zip(lower, higher, strict=True)), sizes


def test_off_by_default_and_no_state_kept() -> None:
    outcome = tick(throughput_inputs(traffic(600)), PlannerState(), make_config(), PERF)
    assert not steps_named(outcome, "horizon")
    assert outcome.next_state.horizon_windows == () and outcome.next_state.startup == StartupState()


def test_the_state_round_trips_through_json_and_replays_exactly() -> None:
    """The horizon windows and the start-up state are planner state: stored as JSON and read back, the next tick
    decides the same as with the state in memory."""
    _, state, _ = run_windows(0.75, BURSTY)
    state = dataclasses.replace(
        state,
        startup=StartupState(
            pending=(PendingScaleUp(component=Component.DECODE, at_s=700.0, target=3),),
            samples=(StartupSample(component=Component.PREFILL, at_s=600.0, startup_s=540.0),),
        ),
    )
    stored = from_jsonable(PlannerState, json.loads(json.dumps(to_jsonable(state))))
    assert stored == state
    inputs = throughput_inputs(traffic(60, 3000, 300), workers(6, 1), now_s=780.0)
    config = horizon_config(0.75)
    assert tick(inputs, stored, config, PERF) == tick(inputs, state, config, PERF)


def test_the_loop_measures_the_start_up_it_uses() -> None:
    """A scale-up decided at 60 s and seen ready at 660 s gives the pool a measured 600 s start-up, which the next
    tick's horizon spans (11 windows of 60 s)."""
    config, state = horizon_config(0.75), PlannerState()
    first = tick(throughput_inputs(traffic(6000, 3000, 300), workers(1, 1), now_s=60.0), state, config, PERF)
    target = desired(first)[Component.PREFILL]
    assert target > 1 and first.next_state.startup.pending[0].at_s == 60.0
    state = first.next_state
    for now_s in range(120, 660, 60):
        still = workers(target, 1, ready=(1, 1))
        state = tick(
            throughput_inputs(traffic(6000, 3000, 300), still, now_s=float(now_s)), state, config, PERF
        ).next_state
    ready = tick(throughput_inputs(traffic(6000, 3000, 300), workers(target, 1), now_s=660.0), state, config, PERF)
    assert [s.startup_s for s in ready.next_state.startup.samples] == [600.0]
    after = tick(throughput_inputs(traffic(6000, 3000, 300), workers(target, 1), now_s=720.0), ready.next_state,
                 config, PERF)  # fmt: skip
    (startup,) = steps_named(after, "startup", Component.PREFILL)
    (horizon,) = steps_named(after, "horizon", Component.PREFILL)
    assert (startup.reason, startup.value) == (ReasonCode.STARTUP_MEASURED, 600.0)
    assert "660 s (11 windows)" in horizon.detail


# --- the bench ----------------------------------------------------------------------------------------------------


def test_bench_quantiles_parse_and_refuse_bad_values() -> None:
    import argparse

    from planner_cli.bench import _quantiles

    assert _quantiles("0.5, 0.9,0") == (0.5, 0.9, 0.0)
    for bad in ("1", "-0.1", "x"):
        with pytest.raises(argparse.ArgumentTypeError, match="--horizon-quantiles"):
            _quantiles(bad)


def test_bench_adds_the_recommended_policy_at_each_knob_setting_and_draws_its_frontier() -> None:
    """`--horizon-quantiles 0,0.9`: two more planner runs, named by the setting, with the knob set and everything
    else the recommended policy's; the frontier joins them in the knob's order."""
    from planner_core.lab.sim.bench import PlannerPolicy, build_policies, run_bench
    from planner_core.lab.sim.des import SimSpec
    from planner_core.lab.sim.frontier import frontier_figure, knob_points, run_points
    from tests.core.fakes import FWD
    from tests.lab.test_bench import busy_trace

    trace = busy_trace(300, 300.0)
    base = {"ttft_ms": 500.0, "itl_ms": 50.0, "throughput_adjustment_interval_seconds": 60}
    policies = build_policies(
        ["planner"], base, trace, PERF, FWD, SimSpec(), window_s=60, initial="min", horizon_quantiles=(0.9, 0.0)
    )
    assert [p.name for p in policies] == ["planner", "planner@q0.9", "planner@q0"]
    assert all(isinstance(p, PlannerPolicy) for p in policies)
    quantiles = [p.config.throughput_horizon_quantile for p in policies]  # type: ignore[union-attr]
    assert quantiles == [0.0, 0.9, 0.0]  # the shipped policy keeps the knob off
    assert policies[1].config.throughput_decode_target_utilization == 0.7  # type: ignore[union-attr]
    runs = run_bench(policies, trace, FWD, SimSpec(), ttft_ms=500, itl_ms=50)
    points = knob_points(run_points(runs))
    assert [q for q, _ in points] == [0.0, 0.9]
    by_name = {run.row.policy: run.row for run in runs}
    row = by_name["planner@q0.9"]
    assert (points[1][1].gpu_hours, points[1][1].of_attainable) == (row.gpu_hours, row.sla_attainment / row.attainable)
    figure = frontier_figure(runs, title="t")
    knob_line = next(trace for trace in figure.data if trace.mode == "lines+markers+text")
    assert list(knob_line.text) == ["q0", "q0.9"]


def point(policy: str, gpu_hours: float, of_attainable: float):
    from planner_core.lab.sim.frontier import FrontierPoint

    return FrontierPoint(policy, gpu_hours, of_attainable)


def test_knob_crossing_interpolates_between_the_settings_around_the_target() -> None:
    from planner_core.lab.sim.frontier import knob_crossing

    line = [point("planner@q0.9", 9.0, 0.995), point("planner@q0", 5.0, 0.95), point("planner@q0.5", 7.0, 0.98)]
    crossing = knob_crossing([point("static-peak", 20.0, 1.0), *line])  # other policies are not on the line
    assert (crossing.quantile_below, crossing.quantile_at) == (0.5, 0.9)
    assert crossing.gpu_hours == pytest.approx(7.0 + (0.99 - 0.98) / (0.995 - 0.98) * 2.0)
    first = knob_crossing([point("planner@q0", 5.0, 0.991), point("planner@q0.5", 7.0, 0.999)])
    assert (first.quantile_below, first.quantile_at, first.gpu_hours) == (0.0, 0.0, 5.0)
    assert knob_crossing([point("planner@q0", 5.0, 0.95), point("planner@q0.9", 9.0, 0.989)]) is None


def test_start_up_goal_needs_the_attainment_the_cost_and_no_cheaper_better_competitor() -> None:
    from planner_core.lab.sim.frontier import describe_startup_goal, frontier_points, startup_goal

    def rows(planner: tuple[float, float], **others: tuple[float, float]) -> list[dict]:
        table = {"oracle": (4.0, 0.995), "oracle-ahead": (4.4, 0.995), "planner": planner, **others}
        return [
            {"policy": name.replace("_", "-"), "gpu_hours": gh, "sla_attainment": share * 0.5, "attainable": 0.5}
            for name, (gh, share) in table.items()
        ]

    met = startup_goal(frontier_points(rows((4.5, 0.992), static_mean=(5.0, 0.999))))
    assert met.met is True and met.vs_oracle == pytest.approx(4.5 / 4.4) and met.cheaper_and_better == ()
    assert met.reference == "oracle-ahead" and met.attainment_target == 0.99
    assert met.shipped.of_attainable == pytest.approx(0.992)  # over the attainable half of the requests
    assert startup_goal(frontier_points(rows((4.5, 0.985)))).met is False  # attainment
    assert startup_goal(frontier_points(rows((5.1, 0.995)))).met is False  # 1.16x oracle-ahead
    # where oracle-seen serves less than 99 %, its share is the target
    seen = startup_goal(frontier_points(rows((4.5, 0.985), oracle_seen=(4.2, 0.98))))
    assert seen.met is True and seen.attainment_target == pytest.approx(0.98)
    # without oracle-ahead, the instant oracle's GPU-hours: 4.7 is 1.175x of 4.0
    no_ahead = [row for row in rows((4.7, 0.995)) if row["policy"] != "oracle-ahead"]
    assert startup_goal(frontier_points(no_ahead)).met is False
    beaten = startup_goal(frontier_points(rows((4.5, 0.992), static_mean=(4.4, 0.993))))
    assert beaten.met is False and beaten.cheaper_and_better == ("static-mean",)
    # the oracles and the knob's own settings are not competitors
    assert startup_goal(frontier_points(rows((4.5, 0.992), **{"planner@q0.5": (4.4, 0.999)}))).met is True
    unjudged = [row for row in rows((4.5, 0.992)) if row["policy"] not in ("oracle", "oracle-ahead")]
    assert startup_goal(frontier_points(unjudged)).met is None
    lines = describe_startup_goal(frontier_points(rows((4.5, 0.992))))
    assert lines[0] == "goal met: planner 99.2 % of attainable at 4.50 GPU-h (1.02x oracle-ahead)"
    assert lines[-1].startswith("oracle-ahead (the future known, the start-up paid): 99.5 %")
