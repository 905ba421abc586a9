"""Out-of-process plugins: the circuit breaker, the OBSERVE phase, and real gRPC plugin processes.

The gRPC tests start `tests/runtime/grpc_plugin_server.py` as a real subprocess (every stage of the contract, its
behaviour switched through a mode file) and call it through the planner's client, as live ticks do; replay is
checked with the process stopped, from the recorded answers only.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from planner_core.config import load_config
from planner_core.domain import (
    Component,
    Loop,
    ObservedValue,
    OverrideType,
    PlannerState,
    PluginSchedule,
    ReasonCode,
    ReplicaOverride,
    TickInputs,
    TrafficObservation,
    WorkerCounts,
)
from planner_core.pipeline import FunctionPlugin, Phase, PluginResult, PluginSpec, run_pipeline
from planner_core.pipeline.breaker import CircuitState, after_failure, after_success, circuit_state
from planner_core.pipeline.remote import RecordedRemotePlugin
from planner_core.pipeline.types import BreakerSpec, PluginFailure
from planner_core.planner import build_planner
from planner_core.runtime.plugin_client import connect_remote_plugins, take_remote_answers
from tests.conftest import REPO_ROOT, write_config

SERVER = REPO_ROOT / "tests" / "runtime" / "grpc_plugin_server.py"
T0 = 1_700_000_000.0


# --- the breaker, pure ------------------------------------------------------------------------------------------


def test_breaker_opens_on_failures_within_the_window_then_half_opens_and_closes() -> None:
    spec = BreakerSpec(failure_threshold=3, window_s=60.0, cooldown_s=30.0)
    schedule = PluginSchedule(plugin_id="p", registered_at_s=0.0)
    opened_at = []
    for now in (0.0, 10.0, 20.0):
        schedule, opened = after_failure(spec, schedule, now)
        opened_at.append(opened)
    assert opened_at == [False, False, True]
    assert circuit_state(spec, schedule, 20.0) is CircuitState.OPEN
    assert circuit_state(spec, schedule, 49.9) is CircuitState.OPEN
    assert circuit_state(spec, schedule, 50.0) is CircuitState.HALF_OPEN
    # a failed trial opens it again from the trial's time
    reopened, opened = after_failure(spec, schedule, 50.0)
    assert opened and reopened.circuit_opened_at_s == 50.0 and circuit_state(spec, reopened, 79.0) is CircuitState.OPEN
    # a successful trial closes it and forgets the failures
    closed, was_closed = after_success(spec, reopened, 80.0)
    assert was_closed and circuit_state(spec, closed, 80.0) is CircuitState.CLOSED and closed.failures_at_s == ()


def test_breaker_forgets_failures_older_than_the_window() -> None:
    spec = BreakerSpec(failure_threshold=2, window_s=60.0, cooldown_s=30.0)
    schedule = PluginSchedule(plugin_id="p", registered_at_s=0.0)
    schedule, opened = after_failure(spec, schedule, 0.0)
    schedule, opened_late = after_failure(spec, schedule, 61.0)  # the first failure left the window
    assert not opened and not opened_late and schedule.failures_at_s == (61.0,)
    schedule, opened = after_failure(spec, schedule, 100.0)
    assert opened


def _inputs(now_s: float, traffic: TrafficObservation | None = None) -> TickInputs:
    workers = WorkerCounts(ready_prefill=2, ready_decode=2, expected_prefill=2, expected_decode=2)
    return TickInputs(now_s=now_s, loop=Loop.THROUGHPUT, workers=workers, traffic=traffic)


def test_pipeline_skips_a_plugin_whose_breaker_is_open_and_closes_it_after_a_good_trial() -> None:
    """Failures counted in tick time: the breaker opens, the plugin is not called while open, a trial call after
    the cool-down closes it; each transition is a recorded step with its reason code."""
    from planner_core.config import PlannerConfig

    calls: list[float] = []
    failing_until_s = T0 + 100

    def flaky(context) -> PluginResult:
        calls.append(context.now_s)
        if context.now_s < failing_until_s:
            raise PluginFailure(ReasonCode.PLUGIN_UNAVAILABLE, "connection refused")
        return PluginResult(
            overrides=(ReplicaOverride(component=Component.DECODE, kind=OverrideType.AT_LEAST, replicas=3),)
        )

    spec = PluginSpec(
        plugin_id="flaky", phase=Phase.PROPOSE, priority=5,
        breaker=BreakerSpec(failure_threshold=2, window_s=120.0, cooldown_s=60.0),
    )  # fmt: skip
    plugin = FunctionPlugin(spec, flaky)
    config = PlannerConfig(mode="disagg")
    state = PlannerState()
    reasons = {}
    for offset in (0, 30, 60, 90, 120):
        outcome = run_pipeline([plugin], _inputs(T0 + offset), state, config)
        state = outcome.next_state
        reasons[offset] = [step.reason for step in outcome.steps if step.step == "propose:flaky"]
    assert reasons[0] == [ReasonCode.PLUGIN_UNAVAILABLE]
    assert reasons[30] == [ReasonCode.PLUGIN_UNAVAILABLE, ReasonCode.PLUGIN_CIRCUIT_OPENED]
    assert reasons[60] == [ReasonCode.PLUGIN_CIRCUIT_OPEN]  # open: not called
    assert reasons[90] == [ReasonCode.PLUGIN_CIRCUIT_HALF_OPEN, ReasonCode.PLUGIN_UNAVAILABLE,
                           ReasonCode.PLUGIN_CIRCUIT_OPENED]  # fmt: skip
    assert reasons[120] == [ReasonCode.PLUGIN_CIRCUIT_OPEN]
    assert calls == [T0, T0 + 30, T0 + 90]
    # later, after the cool-down, the trial succeeds: closed, and its override counts again
    outcome = run_pipeline([plugin], _inputs(T0 + 150), state, config)
    steps = [step.reason for step in outcome.steps if step.step == "propose:flaky"]
    assert steps == [
        ReasonCode.PLUGIN_CIRCUIT_HALF_OPEN,
        ReasonCode.PLUGIN_CIRCUIT_CLOSED,
        ReasonCode.PLUGIN_OVERRIDES,
        ReasonCode.OVERRIDE_AT_LEAST,
    ]
    assert outcome.decision.num_decode == 3
    schedule = outcome.next_state.pipeline.schedule("flaky")
    assert schedule is not None and schedule.circuit_opened_at_s is None and schedule.failures_at_s == ()


def test_observe_plugins_chain_and_later_phases_see_their_values() -> None:
    from planner_core.config import PlannerConfig

    seen = []

    def feed(value: float):
        return lambda _context: PluginResult(observations=(ObservedValue(name="queue_depth", value=value),))

    def propose(context) -> PluginResult:
        seen.append(context.observation("queue_depth"))
        depth = context.observation("queue_depth") or 0.0
        return PluginResult(
            overrides=(ReplicaOverride(component=Component.DECODE, kind=OverrideType.AT_LEAST, replicas=int(depth)),)
        )

    plugins = [
        FunctionPlugin(PluginSpec(plugin_id="feed-b", phase=Phase.OBSERVE, priority=2), feed(9.0)),
        FunctionPlugin(PluginSpec(plugin_id="feed-a", phase=Phase.OBSERVE, priority=1), feed(4.0)),
        FunctionPlugin(PluginSpec(plugin_id="floor", phase=Phase.PROPOSE), propose),
    ]
    outcome = run_pipeline(plugins, _inputs(T0), PlannerState(), PlannerConfig(mode="disagg"))
    assert seen == [4.0]  # first writer (smallest priority) wins
    assert outcome.observations == (ObservedValue(name="queue_depth", value=4.0),)
    recorded = [(s.step, s.value, s.detail) for s in outcome.steps if s.step.startswith("observation:")]
    assert recorded == [("observation:queue_depth", 4.0, "from feed-a")]
    shadowed = next(s for s in outcome.steps if s.step == "observe:feed-b")
    assert "already observed by an earlier plugin: queue_depth" in shadowed.detail
    assert outcome.decision.num_decode == 4


def test_an_observe_plugin_returning_overrides_is_an_invalid_result() -> None:
    from planner_core.config import PlannerConfig

    override = ReplicaOverride(component=Component.DECODE, kind=OverrideType.SET, replicas=1)
    wrong = FunctionPlugin(
        PluginSpec(plugin_id="wrong", phase=Phase.OBSERVE), lambda _context: PluginResult(overrides=(override,))
    )
    outcome = run_pipeline([wrong], _inputs(T0), PlannerState(), PlannerConfig(mode="disagg"))
    [step] = [s for s in outcome.steps if s.step == "observe:wrong"]
    assert step.reason is ReasonCode.PLUGIN_INVALID_RESULT and "OBSERVE plugin returned overrides" in step.detail


# --- real gRPC plugin processes ---------------------------------------------------------------------------------


class PluginProcess:
    """`tests/runtime/grpc_plugin_server.py` in a subprocess; `mode` switches its behaviour without a restart."""

    def __init__(self, directory: Path) -> None:
        self.mode_file = directory / "mode"
        self.mode_file.write_text("ok")
        self.port = 0
        self.process: subprocess.Popen | None = None

    def start(self) -> PluginProcess:
        self.process = subprocess.Popen(
            [sys.executable, str(SERVER), "--port", str(self.port), "--mode-file", str(self.mode_file)],
            stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT,
        )  # fmt: skip
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.startswith("port "), f"plugin server did not start: {line!r}"
        self.port = int(line.split()[1])
        return self

    def set_mode(self, mode: str) -> None:
        self.mode_file.write_text(mode)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    @property
    def endpoint(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"


@pytest.fixture
def plugin_process(tmp_path: Path) -> Iterator[PluginProcess]:
    process = PluginProcess(tmp_path).start()
    yield process
    process.kill()


def _entry(plugin_id: str, phase: str, endpoint: str, **extra: object) -> dict:
    return {"plugin_id": plugin_id, "plugin_type": phase, "endpoint": endpoint, **extra}


def _planner(tmp_path: Path, entries: list[dict]):
    """The policy with these external plugins, as replay builds it (answers from the record)."""
    path = write_config(tmp_path, scheduling={"external_plugins": entries})
    return build_planner(load_config(path).policy, path)


TRAFFIC = TrafficObservation(duration_s=60.0, num_req=600.0, isl=3000.0, osl=150.0)


def _replayed_equal(recorded, replayed) -> None:
    assert replayed.decision == recorded.decision
    assert replayed.steps == recorded.steps
    assert replayed.next_state == recorded.next_state
    assert replayed.prediction == recorded.prediction


def test_every_phase_over_grpc_and_the_tick_replays_without_the_process(
    tmp_path: Path, plugin_process: PluginProcess
) -> None:
    endpoint = plugin_process.endpoint
    planner = _planner(
        tmp_path,
        [
            _entry("queue-feed", "observe", endpoint),
            _entry("forecast", "predict", endpoint, priority=-1),  # before the builtin predictor
            _entry("queue-floor", "propose", endpoint, priority=5),
            _entry("prefill-cap", "reconcile", endpoint),
            _entry("decode-cap", "constrain", endpoint),
        ],
    )
    live = connect_remote_plugins(planner)
    inputs = _inputs(T0, TRAFFIC)
    outcome = live.decide(inputs, PlannerState(), clock=time.monotonic)
    answers = take_remote_answers(live)
    assert [(a.plugin_id, a.reason) for a in answers] == [
        ("queue-feed", ReasonCode.PLUGIN_OBSERVED),
        ("forecast", ReasonCode.PREDICTED),
        ("queue-floor", ReasonCode.PLUGIN_OVERRIDES),
        ("prefill-cap", ReasonCode.PLUGIN_OVERRIDES),
        ("decode-cap", ReasonCode.PLUGIN_OVERRIDES),
    ]
    steps = {step.step: step for step in outcome.steps}
    assert steps["observation:queue_depth"].value == 42.0
    # the forecast service wrote num_req and isl first; the builtin predictor filled only osl
    assert (outcome.prediction.num_req, outcome.prediction.isl) == (1000.0, 2000.0)
    # PROPOSE read the OBSERVE value over the wire: AT_LEAST ceil(42 / 10) decode
    floor = next(a for a in answers if a.plugin_id == "queue-floor")
    assert floor.overrides == (
        ReplicaOverride(component=Component.DECODE, kind=OverrideType.AT_LEAST, replicas=5, reason="queue 42"),
    )
    cap = next(a for a in answers if a.plugin_id == "prefill-cap")
    assert cap.detail == "saw 2 proposals"  # the builtin throughput proposer and queue-floor
    assert outcome.decision.num_prefill is not None and outcome.decision.num_prefill <= 7
    assert outcome.decision.num_decode is not None and 5 <= outcome.decision.num_decode <= 9

    plugin_process.kill()
    replayed = planner.decide(dataclasses.replace(inputs, remote=answers), PlannerState())
    _replayed_equal(outcome, replayed)


@pytest.mark.parametrize(
    ("mode", "reason", "detail"),
    [
        ("slow", ReasonCode.PLUGIN_TIMEOUT, "DEADLINE_EXCEEDED"),
        ("garbage", ReasonCode.PLUGIN_INVALID_RESULT, "does not decode"),
        ("error", ReasonCode.PLUGIN_RAISED, "FAILED_PRECONDITION: plugin not configured"),
        ("bad", ReasonCode.PLUGIN_INVALID_RESULT, "decode replicas = -3: must be >= 0"),
    ],
)
def test_a_failing_plugin_is_skipped_with_its_reason_and_the_tick_goes_on(
    tmp_path: Path, plugin_process: PluginProcess, mode: str, reason: ReasonCode, detail: str
) -> None:
    plugin_process.set_mode(mode)
    planner = _planner(
        tmp_path, [_entry("remote", "propose", plugin_process.endpoint, priority=5, timeout_seconds=0.5)]
    )
    live = connect_remote_plugins(planner)
    started = time.monotonic()
    outcome = live.decide(_inputs(T0, TRAFFIC), PlannerState(), clock=time.monotonic)
    elapsed_s = time.monotonic() - started
    [answer] = take_remote_answers(live)
    assert answer.reason is reason and detail in answer.detail
    [step] = [s for s in outcome.steps if s.step == "propose:remote"]
    assert step.reason is reason
    # the builtin proposers still decided
    assert any(
        s.step == "propose:builtin_throughput_propose" and s.reason is ReasonCode.PLUGIN_OVERRIDES
        for s in outcome.steps
    )
    if mode == "slow":
        assert elapsed_s < 1.9  # the 0.5 s deadline cut the 2 s answer short
    schedule = outcome.next_state.pipeline.schedule("remote")
    assert schedule is not None and schedule.failures_at_s == (T0,)


@pytest.mark.parametrize("phase", ["observe", "predict", "reconcile", "constrain"])
def test_contract_breaking_answers_of_every_phase_are_invalid(
    tmp_path: Path, plugin_process: PluginProcess, phase: str
) -> None:
    plugin_process.set_mode("bad")
    planner = _planner(tmp_path, [_entry("remote", phase, plugin_process.endpoint, priority=-1)])
    live = connect_remote_plugins(planner)
    live.decide(_inputs(T0, TRAFFIC), PlannerState(), clock=time.monotonic)
    [answer] = take_remote_answers(live)
    assert answer.reason is ReasonCode.PLUGIN_INVALID_RESULT, answer


def test_a_rejecting_plugin_short_circuits_the_tick(tmp_path: Path, plugin_process: PluginProcess) -> None:
    plugin_process.set_mode("reject")
    planner = _planner(tmp_path, [_entry("remote", "reconcile", plugin_process.endpoint)])
    live = connect_remote_plugins(planner)
    outcome = live.decide(_inputs(T0, TRAFFIC), PlannerState(), clock=time.monotonic)
    assert outcome.decision.is_empty
    assert (
        outcome.steps[-1].reason is ReasonCode.SKIP_SHORT_CIRCUIT and "maintenance window" in outcome.steps[-1].detail
    )


def test_a_killed_plugin_opens_its_breaker_and_a_restarted_one_closes_it(
    tmp_path: Path, plugin_process: PluginProcess
) -> None:
    """Ticks 60 s apart: ok; killed -> unavailable twice -> open; open -> not called; restarted, after the
    cool-down -> half-open trial succeeds -> closed. The same ticks replay identically from the record."""
    breaker = {"failure_threshold": 2, "window_seconds": 300, "cooldown_seconds": 120}
    planner = _planner(
        tmp_path, [_entry("remote", "propose", plugin_process.endpoint, priority=5, circuit_breaker=breaker)]
    )
    live = connect_remote_plugins(planner)
    state = PlannerState()
    ticks = []
    for offset in (0, 60, 120, 180, 240):
        if offset == 60:
            plugin_process.kill()
        if offset == 240:
            plugin_process.start()  # the same port again
        inputs = _inputs(T0 + offset, TRAFFIC)
        outcome = live.decide(inputs, state, clock=time.monotonic)
        answers = take_remote_answers(live)
        ticks.append((dataclasses.replace(inputs, remote=answers), state, outcome))
        state = outcome.next_state
    reasons = [
        [s.reason for s in outcome.steps if s.step == "propose:remote" and s.reason.family.value == "plugin"]
        for _, _, outcome in ticks
    ]
    assert reasons == [
        [ReasonCode.PLUGIN_OVERRIDES],
        [ReasonCode.PLUGIN_UNAVAILABLE],
        [ReasonCode.PLUGIN_UNAVAILABLE, ReasonCode.PLUGIN_CIRCUIT_OPENED],
        [ReasonCode.PLUGIN_CIRCUIT_OPEN],
        [ReasonCode.PLUGIN_CIRCUIT_HALF_OPEN, ReasonCode.PLUGIN_CIRCUIT_CLOSED, ReasonCode.PLUGIN_OVERRIDES],
    ]
    assert [len(inputs.remote) for inputs, _, _ in ticks] == [1, 1, 1, 0, 1]  # open: not called at all
    plugin_process.kill()
    for inputs, before, outcome in ticks:
        _replayed_equal(outcome, planner.decide(inputs, before))


def test_replay_without_a_recorded_answer_says_so(tmp_path: Path) -> None:
    planner = _planner(tmp_path, [_entry("remote", "propose", "grpc://127.0.0.1:9")])
    assert any(isinstance(p, RecordedRemotePlugin) for p in planner.plugins)
    outcome = planner.decide(_inputs(T0, TRAFFIC), PlannerState())
    [step] = [s for s in outcome.steps if s.step == "propose:remote"]
    assert step.reason is ReasonCode.PLUGIN_ANSWER_MISSING


# --- recorded in Postgres, replayed by `planner replay` ---------------------------------------------------------


def test_recorded_ticks_with_a_remote_plugin_replay_identically_with_the_plugin_stopped(
    tmp_path: Path, database_url: str, plugin_process: PluginProcess
) -> None:
    from sqlalchemy import text

    from planner_core.runtime.metrics import load_metrics_snapshot, metric_families
    from planner_core.runtime.replay import replay
    from planner_core.runtime.service import load_context, run_tick
    from planner_core.runtime.store.db import session_factory

    breaker = {"failure_threshold": 1, "window_seconds": 600, "cooldown_seconds": 600}
    config = write_config(
        tmp_path,
        scheduling={
            "external_plugins": [
                _entry("queue-feed", "observe", plugin_process.endpoint),
                _entry("queue-floor", "propose", plugin_process.endpoint, priority=5, circuit_breaker=breaker),
            ]
        },
    )
    ctx = load_context(database_url, "remote", config)
    start = dt.datetime.fromtimestamp(T0, tz=dt.UTC)
    for minute in range(4):
        if minute == 2:
            plugin_process.set_mode("error")  # queue-floor's breaker opens, queue-feed keeps failing
        run_tick(ctx, Loop.THROUGHPUT, start + dt.timedelta(minutes=minute), TRAFFIC)
    plugin_process.kill()

    with session_factory(database_url).begin() as session:
        rows = session.execute(text("SELECT inputs -> 'remote' FROM ticks ORDER BY scheduled_at")).scalars().all()
        assert [[a["reason"] for a in row] for row in rows] == [
            ["plugin_observed", "plugin_overrides"],
            ["plugin_observed", "plugin_overrides"],
            ["plugin_raised", "plugin_raised"],
            ["plugin_raised"],  # queue-floor's breaker is open: not called
        ]
        families = {family.name: family for family in metric_families(load_metrics_snapshot(session, "remote"))}
    circuit = {s.labels["plugin_id"]: s.value for s in families["dynamo_planner_plugin_circuit_state"].samples}
    assert circuit == {"queue-feed": 0.0, "queue-floor": 1.0}
    skipped = {
        s.labels["plugin_id"]: s.value
        for s in families["dynamo_planner_plugin_circuit_open_skips"].samples
        if s.name.endswith("_total")
    }
    assert skipped == {"queue-feed": 0.0, "queue-floor": 1.0}

    summary = replay(database_url, "remote", start, start + dt.timedelta(minutes=5), recorded_config_dir=config.parent)
    assert (summary.num_ticks, summary.num_identical) == (4, 4), summary.differences


def test_checked_in_stubs_are_generated_from_the_proto(tmp_path: Path) -> None:
    """`plugin_pb2*.py` are what grpcio-tools (the test extra's pinned version) makes of `plugin.proto` today."""
    from grpc_tools import protoc

    proto = Path("planner_core/runtime/plugin_proto/plugin.proto")
    outputs = [f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}"]
    status = protoc.main(["protoc", f"-I{REPO_ROOT}", *outputs, str(REPO_ROOT / proto)])
    assert status == 0
    for name in ("plugin_pb2.py", "plugin_pb2_grpc.py"):
        generated = (tmp_path / proto.parent / name).read_text()
        assert generated == (REPO_ROOT / proto.parent / name).read_text(), f"{name} is stale: regenerate (README.md)"


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (
            [_entry("p", "propose", "grpc://127.0.0.1")],
            "field 'scheduling.external_plugins[0].endpoint' = 'grpc://127.0.0.1': must be grpc://host:port",
        ),
        (
            [_entry("p", "execute", "grpc://127.0.0.1:1")],
            "field 'scheduling.external_plugins[0].plugin_type' = 'execute': must be one of observe, predict",
        ),
        (
            [_entry("p", "propose", "grpc://127.0.0.1:1"), _entry("p", "observe", "grpc://127.0.0.1:1")],
            "field 'scheduling.external_plugins[1].plugin_id' = 'p': listed twice",
        ),
        (
            [_entry("p", "propose", "127.0.0.1:1", needs=["observations.prices"])],
            "field 'scheduling.external_plugins[0].needs' = 'observations.prices': must be one of observations.traffic",
        ),
    ],
    ids=["endpoint", "phase", "duplicate", "needs"],
)
def test_a_bad_external_plugin_entry_is_one_line_naming_the_field(
    tmp_path: Path, entries: list[dict], message: str
) -> None:
    from planner_core.config import ConfigError

    path = write_config(tmp_path, scheduling={"external_plugins": entries})
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    text = str(caught.value)
    assert message in text and "\n" not in text and str(path) in text


def test_an_external_plugin_id_may_not_take_a_builtin_plugins_id(tmp_path: Path) -> None:
    from planner_core.pipeline import PluginConfigError

    path = write_config(
        tmp_path, scheduling={"external_plugins": [_entry("builtin_load_predict", "predict", "127.0.0.1:1")]}
    )
    with pytest.raises(PluginConfigError, match="builtin_load_predict"):
        build_planner(load_config(path).policy, path)
