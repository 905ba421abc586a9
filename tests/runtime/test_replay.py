"""Replay: recorded ticks re-run exactly under their recorded config; a what-if config reports and stores the
differences; the production history is never written."""

from __future__ import annotations

import datetime as dt
import json
import math

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_core.domain import LoadHistory
from planner_core.runtime.replay import _history_jsonable, replay
from planner_core.runtime.store.codec import to_jsonable
from planner_core.runtime.store.db import to_libpq_uri
from planner_core.runtime.store.models import ReplayMode
from tests.cli.test_cli import planner
from tests.conftest import write_config
from tests.core.test_domain import ANY_FLOAT, FINITE
from tests.runtime.recording import record_simulated_run

PRODUCTION_TABLES = (
    "planner_configs",
    "deployments",
    "ticks",
    "traffic_observations",
    "worker_observations",
    "fpm_snapshots",
    "predictions",
    "proposals",
    "tick_steps",
    "planner_states",
    "decisions",
    "executions",
    "virtual_connector_state",
    "virtual_decisions",
    "audit_log",
)
ONE_HOUR = dt.timedelta(hours=1)


def _rows(url: str, sql: str, *params):
    with psycopg.connect(to_libpq_uri(url)) as conn:
        return conn.execute(sql, params).fetchall()


def _snapshot(url: str) -> dict[str, tuple]:
    """Row count and a digest of all rows of every production table (catches inserts, updates and deletes)."""
    digest = "md5(COALESCE(string_agg(t::text, '|' ORDER BY t::text), ''))"
    return {table: _rows(url, f"SELECT count(*), {digest} FROM {table} t")[0] for table in PRODUCTION_TABLES}


@pytest.fixture(scope="module")
def recorded(postgres_server_url, template_database, tmp_path_factory, azure_conv_trace, profile_dir):
    """25 throughput windows of 60 s with load ticks every 20 s between them (75 ticks), Kalman forecasts."""
    from tests.runtime.databases import create_database

    url = create_database(postgres_server_url, template_database)
    config = write_config(tmp_path_factory.mktemp("replay"), load_predictor="kalman")
    times = record_simulated_run(url, config, azure_conv_trace, "replayed", num_windows=25)
    return url, times[0] - ONE_HOUR, times[-1] + dt.timedelta(seconds=1)


@pytest.mark.parametrize("mode", [ReplayMode.RECORDED, ReplayMode.CHAINED])
def test_a_recorded_run_replays_exactly_under_its_recorded_config(recorded, mode) -> None:
    """Every tick of both loops comes out identical: reason, decision, proposals, forecast, steps, next state."""
    url, start, end = recorded
    before = _snapshot(url)
    summary = replay(url, "replayed", start, end, mode=mode)
    assert (summary.num_ticks, summary.num_identical, summary.num_differing, summary.num_skipped) == (75, 75, 0, 0)
    assert summary.differences == ()
    # the run and every replayed tick are in the replay tables; the production tables are untouched
    [(num_ticks, num_identical, config_source, run_mode)] = _rows(
        url, "SELECT num_ticks, num_identical, config_source, mode FROM replay_runs WHERE id = %s", summary.run_id
    )
    assert (num_ticks, num_identical, config_source, run_mode) == (75, 75, "recorded", mode.value)
    replayed = _rows(url, "SELECT outcome, count(*) FROM replay_ticks WHERE run_id = %s GROUP BY 1", summary.run_id)
    assert replayed == [("identical", 75)]
    assert _snapshot(url) == before


@pytest.mark.parametrize("mode", [ReplayMode.RECORDED, ReplayMode.CHAINED])
def test_a_range_starting_inside_a_chain_of_deltas_replays_exactly(recorded, mode) -> None:
    """Most states are stored as deltas (migration 0016): a range whose first tick's state, and the state it
    starts from, are deltas whose full state lies before the range still replays exactly, across the next full
    state."""
    url, _, end = recorded
    [(first_delta_at, num_full, num_delta)] = _rows(
        url,
        "SELECT (SELECT t.scheduled_at FROM ticks t JOIN planner_states s ON s.tick_id = t.id "
        "         WHERE s.base_tick_id IS NOT NULL ORDER BY t.id OFFSET 9 LIMIT 1), "
        "count(*) FILTER (WHERE base_tick_id IS NULL), count(*) FILTER (WHERE base_tick_id IS NOT NULL) "
        "FROM planner_states",
    )
    assert (num_full, num_delta) == (3, 72)  # ticks 1, 33 and 65 store the whole state
    summary = replay(url, "replayed", first_delta_at, end, mode=mode)
    assert summary.num_ticks == 75 - 10 and summary.num_identical == summary.num_ticks


def test_the_recorded_run_made_decisions_worth_replaying(recorded) -> None:
    """The fixture's history is not trivial: it scaled, forecast with Kalman, and interleaved both loops."""
    url, _, _ = recorded
    [(num_decisions, num_predicted, num_load)] = _rows(
        url,
        "SELECT (SELECT count(*) FROM decisions), (SELECT count(*) FROM predictions WHERE reason = 'predicted'), "
        "(SELECT count(*) FROM ticks WHERE loop = 'load')",
    )
    assert num_decisions >= 5 and num_predicted >= 10 and num_load == 50


def test_what_if_under_a_tighter_sla_reports_and_stores_differences(recorded, tmp_path) -> None:
    """TTFT 50 ms / ITL 5 ms: throughput ticks size more decode replicas; load ticks are unaffected; all stored."""
    url, start, end = recorded
    before = _snapshot(url)
    tight = write_config(tmp_path, load_predictor="kalman", ttft_ms=50, itl_ms=5)
    summary = replay(url, "replayed", start, end, config_path=tight)
    assert summary.mode is ReplayMode.CHAINED  # the default with a what-if config
    assert summary.num_ticks == 75 and summary.num_skipped == 0
    assert summary.num_differing == 25  # every throughput tick sizes differently; the 50 load ticks do not
    assert {d.loop for d in summary.differences} == {"throughput"}
    fields = {f["field"] for d in summary.differences for f in d.fields}
    assert "decision.target_decode" in fields or "proposals[1].desired" in fields
    # stored: one row per tick, the differences as JSON, and the comparison view pairs them with the recording
    stored = _rows(
        url,
        "SELECT outcome, count(*), count(differences) FROM replay_ticks WHERE run_id = %s GROUP BY 1 ORDER BY 1",
        summary.run_id,
    )
    assert stored == [("differing", 25, 25), ("identical", 50, 0)]
    [(recorded_decode, replayed_decode)] = _rows(
        url,
        "SELECT sum(recorded_decode), sum(replayed_decode) FROM replay_comparison "
        "WHERE run_id = %s AND recorded_decode IS NOT NULL AND replayed_decode IS NOT NULL",
        summary.run_id,
    )
    # the H200 profile serves ~4.6k decode tokens/s/GPU under ITL 10 ms but far fewer under 5 ms
    assert replayed_decode > recorded_decode
    [(config_source, config_hash, ttft)] = _rows(
        url, "SELECT config_source, config_hash, config_body->>'ttft_ms' FROM replay_runs WHERE id = %s", summary.run_id
    )
    assert config_source == str(tight) and len(config_hash) == 64 and float(ttft) == 50
    assert _snapshot(url) == before


def test_what_if_in_recorded_mode_checks_each_tick_from_its_recorded_state(recorded, tmp_path) -> None:
    """Recorded mode under another predictor: each tick starts from the recorded state, so only forecasts move."""
    url, start, end = recorded
    other = write_config(tmp_path, load_predictor="constant")
    summary = replay(url, "replayed", start, end, config_path=other, mode=ReplayMode.RECORDED)
    assert summary.num_ticks == 75
    # constant vs Kalman: the predictor state stored after every throughput tick differs (no Kalman filter)
    assert summary.num_differing == 25
    for difference in summary.differences:
        assert any(f["field"].startswith("next_state.load_history") for f in difference.fields)


def _replayed_rows(url: str, run_id: int) -> list[tuple]:
    return _rows(
        url,
        "SELECT tick_id, outcome, reason, target_prefill, target_decode, differences::text, detail FROM replay_ticks "
        "WHERE run_id = %s ORDER BY tick_id",
        run_id,
    )


@pytest.mark.parametrize("what_if", [False, True], ids=["recorded-config", "what-if"])
def test_a_replay_in_processes_gives_the_one_process_answer(recorded, tmp_path, monkeypatch, what_if) -> None:
    """`jobs`: recorded states cut the range into parts replayed side by side, whose results (counts, every
    difference, every stored row) are the one-process replay's, in tick order; chained states stay in one."""
    import planner_core.runtime.replay as replay_module
    import planner_core.runtime.replay_parallel as replay_parallel

    monkeypatch.setattr(replay_parallel, "MIN_TICKS_PER_JOB", 2)  # 75 ticks in 3 parts
    url, start, end = recorded
    config = write_config(tmp_path, load_predictor="constant") if what_if else None  # 25 ticks differ
    used: list[int] = []
    run_ranges = replay_module.run_ranges
    monkeypatch.setattr(replay_module, "run_ranges", lambda *a: used.append(len(a[2])) or run_ranges(*a))
    one = replay(url, "replayed", start, end, config_path=config, mode=ReplayMode.RECORDED)
    assert used == []
    before = _snapshot(url)
    three = replay(url, "replayed", start, end, config_path=config, mode=ReplayMode.RECORDED, jobs=3)
    assert used == [3]
    assert one.num_differing == (25 if what_if else 0)
    assert (three.num_ticks, three.num_identical, three.num_differing, three.num_skipped) == (
        one.num_ticks, one.num_identical, one.num_differing, one.num_skipped,
    )  # fmt: skip
    assert three.differences == one.differences
    assert _replayed_rows(url, three.run_id) == _replayed_rows(url, one.run_id)
    assert _snapshot(url) == before
    chained = replay(url, "replayed", start, end, config_path=config, mode=ReplayMode.CHAINED, jobs=3)
    assert used == [3] and chained.num_ticks == 75


def test_a_failing_part_fails_the_replay_and_records_nothing(recorded, monkeypatch) -> None:
    """A tick that cannot be decided in one of the processes stops the whole replay with that tick's error, as in
    one process; no replay run is stored."""
    import planner_core.runtime.replay as replay_module
    import planner_core.runtime.replay_parallel as replay_parallel

    url, start, end = recorded
    [(last_id,)] = _rows(url, "SELECT max(id) FROM ticks")
    decide = replay_module.decide

    def failing(ctx, inputs, state):  # inherited by the forked processes; only the last part meets the tick
        if inputs.now_s == failing.at_s:
            raise ValueError("no model")
        return decide(ctx, inputs, state)

    [(failing.at_s,)] = _rows(url, "SELECT extract(epoch FROM scheduled_at)::float8 FROM ticks WHERE id = %s", last_id)
    monkeypatch.setattr(replay_parallel, "MIN_TICKS_PER_JOB", 2)
    monkeypatch.setattr(replay_module, "decide", failing)
    runs_before = _rows(url, "SELECT count(*) FROM replay_runs")[0][0]
    with pytest.raises(RuntimeError, match=f"replaying tick {last_id} .*: no model"):
        replay(url, "replayed", start, end, mode=ReplayMode.RECORDED, jobs=3)
    assert _rows(url, "SELECT count(*) FROM replay_runs")[0][0] == runs_before


def test_unpacked_steps_are_the_views_steps(recorded) -> None:
    """Replay reads each tick's packed steps and unpacks them itself: the very rows the view `tick_steps` gives
    (every step of every tick of the recorded run, NaN equal to NaN), and `step_detail`'s edge cases (fewer or
    more numbers than placeholders, an empty template)."""
    from sqlalchemy import text

    from planner_core.runtime.store.db import get_engine
    from planner_core.runtime.store.step_packing import (
        PLACEHOLDER,
        StepUnpacker,
        StoredTemplate,
        stored_templates,
        unpack_steps,
    )

    url, _, _ = recorded
    with get_engine(url).connect() as conn:
        templates = stored_templates(conn)
        packed = dict(conn.execute(text("SELECT tick_id, packed FROM tick_step_lists")).all())
        view: dict[int, list[dict]] = {}
        for row in conn.execute(text("SELECT * FROM tick_steps ORDER BY tick_id, seq")):
            step = {k: getattr(row, k) for k in ("step", "component", "value", "reason", "detail")}
            view.setdefault(row.tick_id, []).append(step)
        edge_cases = [(" a \x1f b \x1f c", ["9", "", "1.5"]), ("x\x1fy", ["9", "", "1", "2", "3"]), ("", ["9", "7"])]
        for template, fields in edge_cases:
            sql_detail = conn.scalar(text("SELECT step_detail(:t, :f)"), {"t": template, "f": fields})
            parts = tuple(template.split(PLACEHOLDER)) if template else ()
            one = StoredTemplate(step="s", component=None, reason="r", parts=parts)
            [unpacked] = unpack_steps(",".join(fields), {9: one})
            assert unpacked["detail"] == sql_detail, (template, fields)
    assert len(view) == 75 and sum(len(steps) for steps in view.values()) > 75 * 5
    unpack = StepUnpacker(templates)  # as replay does: the steps met before reused
    for tick_id, steps in view.items():
        assert _same_steps(unpack(packed[tick_id]), steps), tick_id
        assert _same_steps(unpack_steps(packed[tick_id], templates), steps), tick_id
    assert unpack_steps(None, templates) == []


def _same_steps(a: list[dict], b: list[dict]) -> bool:
    from planner_core.runtime.replay_compare import _same

    return _same(a, b)


def test_a_stored_state_field_that_differs_is_reported(recorded) -> None:
    """A state field the tick left as it was (the lower bounds, on a load tick) but stored differently is a
    difference of that tick: replay reuses the decoded fields that did not change from one row to the next, and
    the replayed state shares them with the state it started from, yet a changed stored field is still seen."""
    from planner_core.runtime.store.state_delta import apply_delta, decode_delta, encode_delta

    url, start, end = recorded
    [(tick_id, delta)] = _rows(
        url,
        "SELECT s.tick_id, s.delta FROM planner_states s JOIN ticks t ON t.id = s.tick_id "
        "WHERE s.base_tick_id IS NULL AND s.delta IS NOT NULL AND t.loop = 'load' ORDER BY s.tick_id OFFSET 1 LIMIT 1",
    )
    state = apply_delta(None, decode_delta(delta))
    tampered = {**state, "throughput_lower_bound_prefill": state["throughput_lower_bound_prefill"] + 7}
    update = "UPDATE planner_states SET delta = %s WHERE tick_id = %s"
    with psycopg.connect(to_libpq_uri(url), autocommit=True) as conn:
        conn.execute(update, (encode_delta({"=": tampered}), tick_id))
    try:
        summary = replay(url, "replayed", start, end, mode=ReplayMode.RECORDED)
    finally:
        with psycopg.connect(to_libpq_uri(url), autocommit=True) as conn:
            conn.execute(update, (delta, tick_id))
    [difference] = [d for d in summary.differences if d.tick_id == tick_id]
    assert [(f["field"], f["recorded"], f["replayed"]) for f in difference.fields] == [
        (
            "next_state.throughput_lower_bound_prefill",
            state["throughput_lower_bound_prefill"] + 7,
            state["throughput_lower_bound_prefill"],
        )
    ]
    assert replay(url, "replayed", start, end, mode=ReplayMode.RECORDED).num_differing == 0  # restored


def test_replay_cli_json(recorded) -> None:
    """`planner replay --json` prints the counts and the differences; exit 0 when the recorded replay is exact."""
    url, start, end = recorded
    result = planner(
        "replay", "--deployment", "replayed", "--from", start.isoformat(), "--to", end.isoformat(), "--json",
        env={"PLANNER_DATABASE_URL": url},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    assert {k: body[k] for k in ("ticks", "identical", "differing", "differences")} == {
        "ticks": 75,
        "identical": 75,
        "differing": 0,
        "differences": [],
    }


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--deployment", "nope", "--from", "2023-11-16"], "--deployment = 'nope': no such deployment"),
        (["--deployment", "replayed", "--from", "yesterday"], "--from = 'yesterday': expected an ISO 8601 time"),
        (["--deployment", "replayed", "--from", "2023-11-17", "--to", "2023-11-16"], "must be after --from"),
    ],
    ids=["unknown-deployment", "bad-time", "reversed-range"],
)
def test_replay_cli_bad_input_is_one_line(recorded, args, fragment) -> None:
    """Bad arguments fail with exit 2 and one line naming the option and value; no replay run is recorded."""
    url, _, _ = recorded
    runs_before = _rows(url, "SELECT count(*) FROM replay_runs")[0][0]
    result = planner("replay", *args, env={"PLANNER_DATABASE_URL": url})
    assert result.returncode == 2
    [line] = [line for line in result.stderr.splitlines() if line.startswith("planner: error:")]
    assert fragment in line
    assert _rows(url, "SELECT count(*) FROM replay_runs")[0][0] == runs_before


# --- pure helpers ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("finite", [True, False], ids=["finite", "nan-and-inf"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_history_fast_path_serialises_like_to_jsonable(finite: bool, data: st.DataObject) -> None:
    """The replay's fast serialiser of load histories gives exactly `to_jsonable`'s output."""
    history = data.draw((FINITE if finite else ANY_FLOAT)[LoadHistory])
    assert _history_jsonable(history) == to_jsonable(history)


@pytest.mark.parametrize(
    ("recorded", "replayed", "expected"),
    [
        ({"a": [1, 2]}, {"a": [1, 2.0]}, []),  # 2 == 2.0: JSON numbers compare by value
        ({"a": [1, 2]}, {"a": [1, 3]}, [("x.a[1]", 2, 3)]),
        ({"a": [1, 2]}, {"a": [1]}, [("x.a", [1, 2], [1])]),  # lists of different length: shown whole
        ({"a": 1}, {"b": 1}, [("x.a", 1, None), ("x.b", None, 1)]),
        ({"v": math.nan}, {"v": math.nan}, []),  # NaN equals NaN
        ({"v": math.nan}, {"v": 1.0}, [("x.v", "nan", 1.0)]),  # stored as JSONB: NaN written as a string
    ],
    ids=["int-float", "leaf", "length", "keys", "nan-equal", "nan-differs"],
)
def test_diff_lists_the_differing_leaves(recorded, replayed, expected) -> None:
    """Differences are reported at the deepest differing path, recorded value first."""
    from planner_core.runtime.replay import _diff

    out: list[dict] = []
    _diff("x", recorded, replayed, out, limit=10)
    assert [(d["field"], d["recorded"], d["replayed"]) for d in out] == expected


def test_diff_stops_listing_a_section_at_its_limit() -> None:
    """Past the limit one entry says more differences were left out, from which field on."""
    from planner_core.runtime.replay import _diff

    out: list[dict] = []
    _diff("steps", list(range(10)), list(range(1, 11)), out, limit=3)
    assert [d["field"] for d in out] == ["steps[0]", "steps[1]", "steps[2]", "steps[3]..."]


def test_arima_forecasts_replay_exactly(database_url, tmp_path, azure_conv_trace, profile_dir) -> None:
    """ARIMA (Dynamo's default predictor): order search and fits recomputed from the stored state, bit for bit."""
    config = write_config(tmp_path, load_predictor="arima")
    times = record_simulated_run(database_url, config, azure_conv_trace, "arima", num_windows=14, load_every_s=None)
    fitted = _rows(database_url, "SELECT count(*) FROM predictions WHERE reason = 'predicted'")[0][0]
    assert fitted >= 1  # at least one window forecast by a fitted ARIMA, not the warm-up fallback
    summary = replay(database_url, "arima", times[0] - ONE_HOUR, times[-1] + dt.timedelta(seconds=1))
    assert (summary.num_ticks, summary.num_identical) == (14, 14)


def test_a_state_recorded_before_a_field_was_added_still_replays_exactly(database_url, tmp_path, azure_conv_trace):
    """States stored by an older version lack newer `PlannerState` fields: read back with the fields' defaults,
    they are no difference; a stored value that really differs still is."""
    config = write_config(tmp_path)
    times = record_simulated_run(database_url, config, azure_conv_trace, "older", num_windows=4, load_every_s=None)
    start, end = times[0] - ONE_HOUR, times[-1] + dt.timedelta(seconds=1)
    _store_every_state_whole(database_url)  # as states were stored before migration 0016
    with psycopg.connect(to_libpq_uri(database_url)) as conn:
        conn.execute("UPDATE planner_states SET state = state - 'recent_throughput_needs' - 'last_kv_hit_rate'")
    summary = replay(database_url, "older", start, end)
    assert (summary.num_ticks, summary.num_identical) == (4, 4)
    with psycopg.connect(to_libpq_uri(database_url)) as conn:
        conn.execute("UPDATE planner_states SET state = jsonb_set(state, '{num_throughput_ticks}', '99')")
    summary = replay(database_url, "older", start, end)
    assert summary.num_differing == 4


def _store_every_state_whole(url: str) -> None:
    """Rewrite every delta row of `planner_states` as the full state it stands for (newest first, so that each
    row is rebuilt from the chain as stored)."""
    from sqlalchemy import text

    from planner_core.runtime.store import repository as repo
    from planner_core.runtime.store.db import session_factory

    with session_factory(url).begin() as session:
        ids = session.scalars(text("SELECT tick_id FROM planner_states WHERE delta IS NOT NULL")).all()
        whole = {tick_id: repo.state_json(session, tick_id) for tick_id in ids}
        for tick_id, state in whole.items():
            session.execute(
                text(
                    "UPDATE planner_states SET state = CAST(:s AS jsonb), delta = NULL, base_tick_id = NULL "
                    "WHERE tick_id = :id"
                ),
                {"s": json.dumps(state), "id": tick_id},
            )
        assert session.scalar(text("SELECT count(*) FROM planner_states WHERE state IS NULL")) == 0


def test_a_what_if_replay_derives_the_prompt_curve_again_from_the_recorded_arrivals(
    database_url, tmp_path, azure_conv_trace
) -> None:
    """The sources record arrivals, not the curve: replayed under its recorded config a run is identical; under
    another `ttft_ms` the tick derives another curve (each prompt capped at another engine share) from the same
    recorded arrivals; and ticks stored before arrivals were recorded read their stored curve as it is."""
    from planner_core.config import load_config
    from planner_core.domain import Loop
    from planner_core.planner import build_planner
    from planner_core.runtime.store.codec import inputs_from_stored

    recorded_config = write_config(tmp_path, throughput_prefill_burst_sizing=True)
    times = record_simulated_run(
        database_url, recorded_config, azure_conv_trace, "curve", num_windows=6, load_every_s=None, record_arrivals=True
    )
    start, end = times[0] - ONE_HOUR, times[-1] + dt.timedelta(seconds=1)
    assert (replay(database_url, "curve", start, end).num_identical) == 6

    rows = _rows(database_url, "SELECT inputs::text, extract(epoch FROM scheduled_at) FROM ticks ORDER BY id")
    traffic = [inputs_from_stored(json.loads(i), Loop.THROUGHPUT, float(at)).traffic for i, at in rows]
    assert all(t is not None and t.prompt_arrivals is not None for t in traffic)
    planner = build_planner(load_config(recorded_config).policy, recorded_config)
    other_config = write_config(tmp_path, throughput_prefill_burst_sizing=True, ttft_ms=1000)
    other = build_planner(load_config(other_config).policy, other_config)
    # the stored curve is the recorded config's derivation; the other config derives another from the arrivals
    assert [planner.traffic_features(t) for t in traffic] == traffic
    assert [other.traffic_features(t).prompt_arrival_curve() for t in traffic] != [
        t.prompt_arrival_curve() for t in traffic
    ]
    assert replay(database_url, "curve", start, end, config_path=other_config).num_differing > 0

    # ticks stored before the arrivals were recorded hold the curve alone: it is read as stored
    with psycopg.connect(to_libpq_uri(database_url)) as conn:
        conn.execute("UPDATE ticks SET inputs = (inputs::jsonb #- '{traffic,prompt_arrivals}')::json")
    assert (replay(database_url, "curve", start, end).num_identical) == 6


def test_service_settings_are_outside_the_replayed_policy(database_url, tmp_path, azure_conv_trace) -> None:
    """Ticks recorded under a file with service settings replay identically after only those settings changed, under
    the same config hash; a policy change changes the hash. Rows stored before the split (the whole file hashed, its
    body holding service fields) still replay exactly, and re-registering the same policy is a revision that changes
    nothing (a rehash).
    """
    from planner_core.config import config_hash, load_config
    from planner_core.runtime.service import load_context
    from planner_core.runtime.store import repository as repo

    service = {"report_output_dir": "reports-a", "live_dashboard_port": 8081, "execution_interval_seconds": 5.0}
    first = write_config(tmp_path, **service)
    times = record_simulated_run(database_url, first, azure_conv_trace, "split", num_windows=4, load_every_s=None)
    start, end = times[0] - ONE_HOUR, times[-1] + dt.timedelta(seconds=1)
    [(recorded_hash,)] = _rows(database_url, "SELECT DISTINCT config_hash FROM ticks")

    moved = write_config(tmp_path, **{**service, "report_output_dir": "reports-b", "live_dashboard_port": 0})
    assert config_hash(load_config(moved).policy) == recorded_hash
    summary = replay(database_url, "split", start, end, config_path=moved, mode=ReplayMode.RECORDED)
    assert (summary.num_ticks, summary.num_identical, summary.num_differing) == (4, 4, 0)
    [(what_if_hash,)] = _rows(database_url, "SELECT config_hash FROM replay_runs WHERE id = %s", summary.run_id)
    assert what_if_hash == recorded_hash
    assert config_hash(load_config(write_config(tmp_path, **service, ttft_ms=499)).policy) != recorded_hash

    # A row stored before the split: the whole file (policy and service fields) hashed as one.
    old_body = {**load_config(first).policy.model_dump(mode="json"), **load_config(first).service.model_dump()}
    old_hash = "0" * 64
    with psycopg.connect(to_libpq_uri(database_url)) as conn:
        conn.execute(
            "INSERT INTO planner_configs (config_hash, body) VALUES (%s, %s)", (old_hash, json.dumps(old_body))
        )
        # ticks recorded before config revisions (migration 0024) name no revision
        conn.execute("UPDATE ticks SET config_hash = %s, config_revision = NULL", (old_hash,))
        conn.execute("UPDATE deployments SET config_hash = %s", (old_hash,))
        [(deployment_id,)] = conn.execute("SELECT id FROM deployments").fetchall()
        conn.execute(
            "INSERT INTO config_revisions (deployment_id, revision, config_hash, source, reason) "
            "VALUES (%s, 2, %s, 'file', 'as migration 0024 found it')",
            (deployment_id, old_hash),
        )
    summary = replay(database_url, "split", start, end)
    assert (summary.num_ticks, summary.num_identical, summary.num_differing) == (4, 4, 0)
    assert summary.revisions == ()
    ctx = load_context(database_url, "split", first)
    with ctx.sessions.begin() as session:
        repo.ensure_deployment(session, "split", ctx.config, source_path=str(first))
    [(changes, reason)] = _rows(database_url, "SELECT changes, reason FROM config_revisions WHERE revision = 3")
    assert changes == {} and reason == f"config file {first} (the same policy under its current hash)"


def test_recorded_steps_are_step_names_or_plugin_scoped(recorded) -> None:
    """Every step the planner recorded is a `StepName` value; anything else is a plugin-scoped `<scope>:<id>`."""
    from planner_core.domain import StepName

    url, _, _ = recorded
    stored = {step for (step,) in _rows(url, "SELECT DISTINCT step FROM tick_steps")}
    assert stored and all(step in set(StepName) or ":" in step for step in stored), stored
