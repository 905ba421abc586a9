"""Recording ticks in Postgres: everything in one transaction, never twice, state chained, replay exact."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math

import psycopg
import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import DataError

from planner_core.config import parse_config
from planner_core.domain import (
    PROMPT_ARRIVAL_INTERVALS_S,
    Component,
    Loop,
    PlannerState,
    ReasonCode,
    ScalingDecision,
    StepRecord,
    TickInputs,
    TickOutcome,
    TrafficObservation,
    UnplacedRequests,
)
from planner_core.perf.model import ProfilePerfModel
from planner_core.runtime.service import load_context, run_tick
from planner_core.runtime.store import repository as repo
from planner_core.runtime.store.codec import from_jsonable, inputs_from_stored
from planner_core.runtime.store.db import to_libpq_uri
from planner_core.runtime.store.models import (
    AuditLogRow,
    DecisionRow,
    PlannerConfigRow,
    PlannerStateRow,
    Tick,
    TrafficObservationRow,
)
from planner_core.tick import tick
from tests.conftest import write_config
from tests.runtime.databases import record_outcome

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
BUSY = TrafficObservation(duration_s=60, num_req=6000, isl=3000, osl=300)


def _count(url: str, table: str) -> int:
    with psycopg.connect(to_libpq_uri(url)) as conn:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


@pytest.fixture
def ctx(database_url, tmp_path, profile_dir):
    return load_context(database_url, "store-test", write_config(tmp_path))


def test_tick_records_everything_it_saw_and_decided(ctx) -> None:
    """One busy tick writes observation, workers, prediction, proposals, steps, state, decision and audit."""
    result = run_tick(ctx, Loop.THROUGHPUT, T0, BUSY)
    assert result.tick_id is not None and result.outcome is not None
    # 6000 req/min = 100 req/s; prefill 100*3000 = 300k tok/s / 49.5k per GPU -> 7; decode 100*300 = 30k / 4.56k -> 7;
    # 14 GPUs fit the budget of 16, and 7 is within the change cap of 8 from 1.
    assert (result.outcome.decision.num_prefill, result.outcome.decision.num_decode) == (7, 7)
    url = ctx.database_url
    for table in ("ticks", "traffic_observations", "worker_observations", "predictions", "planner_states"):
        assert _count(url, table) == 1, table
    assert _count(url, "proposals") == 2
    assert _count(url, "tick_steps") == len(result.outcome.steps)
    assert _count(url, "decisions") == 1
    with ctx.sessions.begin() as session:
        events = list(session.scalars(select(AuditLogRow.event).order_by(AuditLogRow.id)))
        decision = session.scalar(select(DecisionRow))
        assert decision.status == "pending" and decision.reason == "scale"
    assert events == ["deployment_created", "config_revision", "decision_created", "tick_recorded"]


def test_a_tick_is_never_recorded_twice(ctx) -> None:
    """Running the same (deployment, loop, scheduled time) again records nothing and decides nothing."""
    first = run_tick(ctx, Loop.THROUGHPUT, T0, BUSY)
    again = run_tick(ctx, Loop.THROUGHPUT, T0, BUSY)
    assert first.tick_id is not None
    assert again.tick_id is None and again.outcome is None
    assert _count(ctx.database_url, "ticks") == 1
    assert _count(ctx.database_url, "decisions") == 1
    other_loop = run_tick(ctx, Loop.LOAD, T0, None)
    assert other_loop.tick_id is not None  # uniqueness is per loop


def test_unique_constraint_backs_the_check(ctx) -> None:
    """Even bypassing the existence check, the database refuses a second row for the same tick identity."""
    result = run_tick(ctx, Loop.THROUGHPUT, T0, BUSY)
    with ctx.sessions.begin() as session:
        recorded = record_outcome(session, "store-test", result.inputs, result.outcome, previous_tick_id=result.tick_id)
        assert recorded is None


def test_a_failing_record_leaves_nothing_half_written(ctx) -> None:
    """If any insert of a tick fails, none of the tick's rows remain (one transaction)."""
    run_tick(ctx, Loop.THROUGHPUT, T0, BUSY)
    workers = run_tick(ctx, Loop.LOAD, T0, None).inputs.workers
    tables = ("ticks", "tick_steps", "planner_states", "decisions", "audit_log")
    before = {t: _count(ctx.database_url, t) for t in tables}
    later = T0 + dt.timedelta(seconds=60)
    inputs = TickInputs(now_s=later.timestamp(), loop=Loop.THROUGHPUT, workers=workers, traffic=BUSY)
    too_long_step = StepRecord(step="x" * 500, reason=ReasonCode.NO_CHANGE)  # over 80 characters: the insert fails
    outcome = TickOutcome(
        decision=ScalingDecision(num_prefill=3, num_decode=3), next_state=PlannerState(), steps=(too_long_step,)
    )
    with pytest.raises(DataError, match="too long"):
        with ctx.sessions.begin() as session:
            record_outcome(session, "store-test", inputs, outcome)
    assert {t: _count(ctx.database_url, t) for t in tables} == before


def test_steps_read_back_through_the_view_exactly(ctx) -> None:
    """A tick's steps are one `tick_step_lists` row; the view `tick_steps` gives each back in order with its value
    bit for bit, the non-finite ones (which JSON has no number for) included."""
    run_tick(ctx, Loop.THROUGHPUT, T0, BUSY)
    workers = run_tick(ctx, Loop.LOAD, T0, None).inputs.workers
    later = T0 + dt.timedelta(seconds=60)
    inputs = TickInputs(now_s=later.timestamp(), loop=Loop.THROUGHPUT, workers=workers, traffic=BUSY)
    values = (0.1 + 0.2, 1e-300, -2.5, math.inf, -math.inf, math.nan, None)
    steps = tuple(
        StepRecord(step=f"s{i}", reason=ReasonCode.NO_CHANGE, component=Component.DECODE, value=v, detail=f"d{i}")
        for i, v in enumerate(values)
    )
    outcome = TickOutcome(decision=ScalingDecision(), next_state=PlannerState(), steps=steps)
    with ctx.sessions.begin() as session:
        tick_id = record_outcome(session, "store-test", inputs, outcome)
    with psycopg.connect(to_libpq_uri(ctx.database_url)) as conn:
        rows = conn.execute(
            "SELECT seq, step, component, value, reason, detail FROM tick_steps WHERE tick_id = %s ORDER BY seq",
            (tick_id,),
        ).fetchall()
        assert conn.execute("SELECT count(*) FROM tick_step_lists WHERE tick_id = %s", (tick_id,)).fetchone() == (1,)
    assert [(seq, step, component, reason, detail) for seq, step, component, _, reason, detail in rows] == [
        (i, f"s{i}", "decode", "no_change", f"d{i}") for i in range(len(values))
    ]
    stored = [row[3] for row in rows]
    assert stored[:5] == list(values[:5]) and math.isnan(stored[5]) and stored[6] is None


def test_state_chains_from_tick_to_tick(ctx) -> None:
    """Each tick starts from the state the previous tick stored and says which tick that was."""
    first = run_tick(ctx, Loop.THROUGHPUT, T0, BUSY)
    second = run_tick(ctx, Loop.THROUGHPUT, T0 + dt.timedelta(minutes=1), BUSY)
    with ctx.sessions.begin() as session:
        row = session.get(Tick, second.tick_id)
        assert row.previous_tick_id == first.tick_id
        stored = repo.state_json(session, second.tick_id)  # a delta against the first tick's (migration 0016)
        assert session.get(PlannerStateRow, second.tick_id).base_tick_id == first.tick_id
        assert from_jsonable(PlannerState, stored) == second.outcome.next_state
    assert second.outcome.next_state.load_history.num_req == (6000.0, 6000.0)
    assert second.outcome.next_state.num_throughput_ticks == 2


def test_replaying_recorded_ticks_reproduces_them_exactly(ctx) -> None:
    """tick() on each stored input, with the previous stored state and the stored config, gives the same outcome."""
    loads = [6000, 3000, 0, 0, 9000, 12000]
    for minute, num_req in enumerate(loads):
        traffic = TrafficObservation(
            duration_s=60, num_req=num_req, isl=3000 if num_req else 0, osl=300 if num_req else 0
        )
        run_tick(ctx, Loop.THROUGHPUT, T0 + dt.timedelta(minutes=minute), traffic)
    with ctx.sessions.begin() as session:
        ticks = list(session.scalars(select(Tick).order_by(Tick.id)))
        assert len(ticks) == len(loads)
        for row in ticks:
            config = parse_config(session.get(PlannerConfigRow, row.config_hash).body).policy
            previous = repo.state_json(session, row.previous_tick_id) if row.previous_tick_id else None
            state = from_jsonable(PlannerState, previous) if previous else PlannerState()
            outcome = tick(
                inputs_from_stored(row.inputs, Loop(row.loop), row.scheduled_at.timestamp()),
                state,
                config,
                ProfilePerfModel.load(config.profile_results_dir),
            )
            stored_state = from_jsonable(PlannerState, repo.state_json(session, row.id))
            assert outcome.next_state == stored_state
            assert outcome.reason.value == row.reason
            stored_steps = [  # through the view over tick_step_lists (migration 0015)
                (s.step, s.reason, s.detail)
                for s in session.execute(
                    text("SELECT step, reason, detail FROM tick_steps WHERE tick_id = :id ORDER BY seq"), {"id": row.id}
                )
            ]
            assert stored_steps == [(s.step, s.reason.value, s.detail) for s in outcome.steps]
            decision = session.scalar(select(DecisionRow).where(DecisionRow.tick_id == row.id))
            if outcome.decision.is_empty:
                assert decision is None
            else:
                assert (decision.target_prefill, decision.target_decode) == (
                    outcome.decision.num_prefill,
                    outcome.decision.num_decode,
                )


def test_every_state_of_a_multi_tick_run_reads_back_exactly(database_url, tmp_path) -> None:
    """States stored as deltas (migration 0016): over 45 ticks (load ticks every 5 s with forward-pass metrics,
    a throughput tick every minute), the state read back after each tick is the one the tick produced, value for
    value, and the JSON a whole copy would have stored; a full state starts the chain and again after
    `FULL_STATE_EVERY` states (compressed like the deltas: a delta from nothing), the rest are deltas, each under
    half the size of a stored full state."""
    from planner_core.lab.fleet_bench import bench_config
    from planner_core.lab.fleet_bench.bench import _reports
    from planner_core.runtime.store.codec import to_jsonable
    from planner_core.runtime.store.fpm import FpmSample, insert_fpm_samples
    from planner_core.runtime.store.state_delta import FULL_STATE_EVERY

    ctx = load_context(database_url, "state-deltas", bench_config(tmp_path, 5.0))  # load loop, online perf models
    produced = {}
    for index in range(45):
        at = T0 + dt.timedelta(seconds=5 * index)
        if index % 12 == 0:
            result = run_tick(ctx, Loop.THROUGHPUT, at, BUSY)
        else:
            with ctx.sessions.begin() as session:
                deployment = repo.ensure_deployment(session, ctx.deployment, ctx.config)
                samples = [FpmSample(fpm=f, received_at=at - dt.timedelta(seconds=1)) for f in _reports(0, at, 1, 1)]
                insert_fpm_samples(session, deployment.id, samples)
            result = run_tick(ctx, Loop.LOAD, at, None)
        produced[result.tick_id] = result.outcome.next_state
    with ctx.sessions.begin() as session:
        rows = session.execute(
            text(
                "SELECT tick_id, base_tick_id IS NULL AS full, state IS NULL AS compressed, "
                "coalesce(pg_column_size(state), pg_column_size(delta)) AS stored_bytes "
                "FROM planner_states ORDER BY tick_id"
            )
        ).all()
        assert [row.tick_id for row in rows] == sorted(produced)
        assert [i for i, row in enumerate(rows) if row.full] == [0, FULL_STATE_EVERY]
        assert all(row.compressed for row in rows)  # whole states too: a delta from nothing (migration 0020)
        for tick_id, state in produced.items():
            stored = repo.state_json(session, tick_id)
            assert from_jsonable(PlannerState, stored) == state, tick_id
            assert stored == json.loads(json.dumps(to_jsonable(state))), tick_id
        # the perf models learned at every load tick: each delta carries a real change
        num_samples = [len(produced[t].perf_models.decode.samples) for t in sorted(produced)]
        assert num_samples[-1] > num_samples[1] > 0
    delta_bytes = [row.stored_bytes for row in rows if not row.full]
    assert max(delta_bytes) < rows[FULL_STATE_EVERY].stored_bytes / 2


def test_config_hash_is_stored_with_every_tick_and_changes_are_audited(database_url, tmp_path, profile_dir) -> None:
    """Ticks carry the hash of the config they ran under; switching config file is a new config revision (an
    audit event), which the next tick records."""
    first = load_context(database_url, "cfg", write_config(tmp_path, ttft_ms=200))
    second = load_context(database_url, "cfg", write_config(tmp_path, ttft_ms=300))
    run_tick(first, Loop.THROUGHPUT, T0, BUSY)
    run_tick(second, Loop.THROUGHPUT, T0 + dt.timedelta(minutes=1), BUSY)
    with first.sessions.begin() as session:
        hashes = list(session.scalars(select(Tick.config_hash).order_by(Tick.id)))
        assert len(set(hashes)) == 2
        assert session.scalar(select(func.count()).select_from(PlannerConfigRow)) == 2
        revisions = list(session.scalars(text("SELECT config_revision FROM ticks ORDER BY id")))
        events = list(session.scalars(select(AuditLogRow.event).where(AuditLogRow.event == "config_revision")))
    assert revisions == [1, 2] and events == ["config_revision", "config_revision"]


def test_history_views_answer_what_when_why_and_what_happened(ctx) -> None:
    """decision_history joins the decision with its tick time, reasons and execution state."""
    run_tick(ctx, Loop.THROUGHPUT, T0, BUSY)
    with ctx.sessions.begin() as session:
        rows = repo.query_rows(session, "SELECT * FROM decision_history")
        ticks = repo.query_rows(session, "SELECT * FROM tick_history")
        decisions = repo.query_rows(session, "SELECT stage, summary FROM decisions")
    assert len(rows) == 1 and len(ticks) == 1
    row = rows[0]
    assert row["deployment"] == "store-test" and row["decided_at"] == T0
    assert (row["prefill_before"], row["decode_before"], row["target_prefill"], row["target_decode"]) == (1, 1, 7, 7)
    assert row["status"] == "pending" and row["num_attempts"] == 0 and row["acknowledged_at"] is None
    # the deciding stage and its numbers in one line (migration 0023); the loop's headline reason beside it
    assert row["reason"] == "forecast" and row["headline_reason"] == "scale"
    assert row["why"] == "prefill 1->7: forecast needs 7 | decode 1->7: forecast needs 7"
    assert decisions == [{"stage": "forecast", "summary": row["why"]}]
    assert ticks[0]["observed_num_req"] == 6000 and ticks[0]["proposed_decode"] == 7


FEATURES = dataclasses.replace(
    BUSY,
    kv_hit_rate=0.35,
    accept_length=2.5,
    **{name: 10_000.0 * interval_s for name, interval_s in PROMPT_ARRIVAL_INTERVALS_S.items()},
)
FEATURE_COLUMNS = ("kv_hit_rate", "accept_length", *PROMPT_ARRIVAL_INTERVALS_S)


def test_every_traffic_field_has_a_column_in_traffic_observations() -> None:
    """Each figure of TrafficObservation (the window length as `window_s`) is a column of `traffic_observations`."""
    # the recorded arrivals are not a figure: `ticks.inputs` keeps them, the columns keep the curve derived from them
    # nor are the curve's distributions the tick derives with it (the state keeps the windows the burst rule pools),
    # nor the latency histograms (`ticks.inputs` keeps them; the error budget's step records what it read of them)
    fields = {f.name for f in dataclasses.fields(TrafficObservation)} - {
        "duration_s",
        "prompt_arrivals",
        "prompt_tokens_quantiles",
        "ttft_histogram",
        "itl_histogram",
    } | {"window_s"}
    assert fields <= set(TrafficObservationRow.__table__.columns.keys())


def test_traffic_features_are_stored_as_columns(ctx) -> None:
    """KV hit rate, accept length and the arrival curve read back from `traffic_observations` and `tick_summary`."""
    tick_id = run_tick(ctx, Loop.THROUGHPUT, T0, FEATURES).tick_id
    expected = {column: getattr(FEATURES, column) for column in FEATURE_COLUMNS}
    with ctx.sessions.begin() as session:
        for relation in ("traffic_observations", "tick_summary"):
            sql = f"SELECT {', '.join(FEATURE_COLUMNS)} FROM {relation} WHERE tick_id = :tick_id"
            assert repo.query_rows(session, sql, tick_id=tick_id) == [expected], relation
    assert expected["prompt_tokens_p99_250ms"] == 2500.0 and expected["prompt_tokens_p99_30s"] == 300_000.0


def test_first_tick_starts_from_predictors_warmed_on_a_trace(database_url, tmp_path, profile_dir) -> None:
    """With `load_predictor_warmup_trace`, a deployment's first tick starts from the warmed history (audited)."""
    import json

    trace = tmp_path / "warm.jsonl"
    # 3 windows of 60 s: 2, 4 and 6 requests of ISL 1000 / OSL 100
    requests = [(minute * 60_000 + i * 1000, 1000, 100) for minute, n in enumerate((2, 4, 6)) for i in range(n)]
    trace.write_text(
        "".join(json.dumps({"timestamp": t, "input_length": i, "output_length": o}) + "\n" for t, i, o in requests)
    )
    ctx = load_context(database_url, "warm", write_config(tmp_path, load_predictor_warmup_trace="warm.jsonl"))
    result = run_tick(ctx, Loop.THROUGHPUT, T0, BUSY)
    assert result.outcome.next_state.load_history.num_req == (2.0, 4.0, 6.0, 6000.0)
    second = run_tick(ctx, Loop.THROUGHPUT, T0 + dt.timedelta(minutes=1), BUSY)
    assert second.outcome.next_state.load_history.num_req[-2:] == (6000.0, 6000.0)  # warmed only once
    with ctx.sessions.begin() as session:
        events = repo.query_rows(session, "SELECT detail FROM audit_log WHERE event = 'predictor_warm_start'")
    assert [e["detail"]["num_windows"] for e in events] == [3]


def test_unplaced_requests_are_stored_per_pool(ctx) -> None:
    """What the router could not place (`TickInputs.unplaced`) lands in `worker_observations`' columns, NULL for a
    pool without a report, and in the tick's inputs JSON."""
    workers = run_tick(ctx, Loop.LOAD, T0, None).inputs.workers
    later = T0 + dt.timedelta(seconds=5)
    unplaced = (UnplacedRequests(component=Component.PREFILL, num_waiting=2, num_unplaced=7, num_rejected=1),)
    inputs = TickInputs(now_s=later.timestamp(), loop=Loop.LOAD, workers=workers, unplaced=unplaced)
    outcome = TickOutcome(decision=ScalingDecision(), next_state=PlannerState(), steps=())
    with ctx.sessions.begin() as session:
        tick_id = record_outcome(session, "store-test", inputs, outcome)
    columns = ("waiting_prefill", "unplaced_prefill", "rejected_prefill", "waiting_decode", "unplaced_decode")
    with ctx.sessions.begin() as session:
        sql = f"SELECT {', '.join(columns)} FROM worker_observations WHERE tick_id = :tick_id"
        assert repo.query_rows(session, sql, tick_id=tick_id) == [
            dict(zip(columns, (2, 7, 1, None, None), strict=True))
        ]
        stored = session.scalar(select(Tick.inputs).where(Tick.id == tick_id))
    assert inputs_from_stored(stored, Loop.LOAD, later.timestamp()) == inputs


def test_a_load_tick_that_decides_nothing_appends_no_audit_row(ctx) -> None:
    """Quiet load ticks are recorded in `ticks` only; a load tick that decides, and every throughput tick, append
    `tick_recorded` (with the decision's own events)."""
    run_tick(ctx, Loop.THROUGHPUT, T0, BUSY)
    workers = run_tick(ctx, Loop.LOAD, T0, None).inputs.workers

    def events_after(at: dt.datetime, decision: ScalingDecision) -> list[str]:
        with ctx.sessions.begin() as session:
            last_id = session.scalar(select(func.max(AuditLogRow.id)))
            inputs = TickInputs(now_s=at.timestamp(), loop=Loop.LOAD, workers=workers)
            outcome = TickOutcome(decision=decision, next_state=PlannerState(), steps=())
            assert record_outcome(session, "store-test", inputs, outcome) is not None
            return list(
                session.scalars(select(AuditLogRow.event).where(AuditLogRow.id > last_id).order_by(AuditLogRow.id))
            )

    assert events_after(T0 + dt.timedelta(seconds=5), ScalingDecision()) == []
    assert events_after(T0 + dt.timedelta(seconds=10), ScalingDecision(num_prefill=2)) == [
        "decision_created",
        "tick_recorded",
    ]
