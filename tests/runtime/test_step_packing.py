"""Explanations stored as templates plus numbers (`step_packing`, migration 0018): lossless for any detail, shared
between ticks, safe when two ticks insert the same new template at once."""

from __future__ import annotations

import datetime as dt
import threading

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_core.domain import (
    Component,
    Loop,
    PlannerState,
    ReasonCode,
    ScalingDecision,
    StepRecord,
    TickInputs,
    TickOutcome,
    TrafficObservation,
)
from planner_core.runtime.service import load_context, run_tick
from planner_core.runtime.store.db import to_libpq_uri
from planner_core.runtime.store.step_packing import (
    FIELD_SEPARATOR,
    PLACEHOLDER,
    STEP_SEPARATOR,
    StepTemplate,
    join_detail,
    split_step,
    template_ids,
)
from tests.conftest import write_config
from tests.runtime.databases import record_outcome

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
BUSY = TrafficObservation(duration_s=60, num_req=6000, isl=3000, osl=300)

# Details that stress the split: the placeholder itself, both delimiters, signs, exponents, dots, unicode.
TRICKY_DETAILS = (
    "",
    "0",
    "-1.5e-07 and 2e+05, 3.;4;-",
    f"a{PLACEHOLDER}b {PLACEHOLDER}{PLACEHOLDER}7",
    "p0: TTFT 399.50 ms (13961 queued tokens + next 3014, compute fraction 1.00)",
    "1e5x 1.e 1.5e 12-3 --4 ü 5 €6",
    "x" * 1500,
)


@given(st.text(alphabet=st.sampled_from("0123456789.-+e,; x\x1fü"), max_size=60) | st.text(max_size=60))
@settings(max_examples=400, deadline=None)
def test_any_detail_splits_into_a_template_and_numbers_that_join_back(detail: str) -> None:
    step = StepRecord(step="demand", reason=ReasonCode.NO_CHANGE, detail=detail)
    split = split_step(step)
    assert join_detail(split.template.template, split.numbers) == detail
    assert split.template.template.count(PLACEHOLDER) == len(split.numbers)
    for number in split.numbers:  # the stored line's delimiters never occur inside a field
        assert FIELD_SEPARATOR not in number and STEP_SEPARATOR not in number


def test_ticks_that_differ_in_numbers_share_their_templates() -> None:
    first = split_step(StepRecord(step="itl_estimate", reason=ReasonCode.NO_CHANGE, detail="d0: ITL 25.86 ms"))
    second = split_step(StepRecord(step="itl_estimate", reason=ReasonCode.NO_CHANGE, detail="d0: ITL 31.02 ms"))
    assert first.template == second.template and first.numbers == ("0", "25.86") and second.numbers[1] == "31.02"


@pytest.fixture
def ctx(database_url, tmp_path, profile_dir):
    context = load_context(database_url, "packing", write_config(tmp_path))
    run_tick(context, Loop.THROUGHPUT, T0, BUSY)
    return context, run_tick(context, Loop.LOAD, T0, None).inputs.workers


def _record(ctx, at: dt.datetime, steps: tuple[StepRecord, ...]) -> int:
    context, workers = ctx
    inputs = TickInputs(now_s=at.timestamp(), loop=Loop.THROUGHPUT, workers=workers, traffic=BUSY)
    outcome = TickOutcome(decision=ScalingDecision(), next_state=PlannerState(), steps=steps)
    with context.sessions.begin() as session:
        return record_outcome(session, "packing", inputs, outcome)


def _view(url: str, tick_id: int) -> list[tuple]:
    with psycopg.connect(to_libpq_uri(url)) as conn:
        return conn.execute(
            "SELECT seq, step, component, value, reason, detail FROM tick_steps WHERE tick_id = %s ORDER BY seq",
            (tick_id,),
        ).fetchall()


def test_the_view_gives_every_detail_back_character_for_character(ctx) -> None:
    steps = tuple(
        StepRecord(step=f"s{i % 3}", reason=ReasonCode.NO_CHANGE, component=Component.PREFILL, value=i / 3, detail=d)
        for i, d in enumerate(TRICKY_DETAILS)
    )
    tick_id = _record(ctx, T0 + dt.timedelta(minutes=1), steps)
    assert _view(ctx[0].database_url, tick_id) == [
        (i, s.step, "prefill", s.value, "no_change", s.detail) for i, s in enumerate(steps)
    ]


def test_a_second_tick_with_other_numbers_adds_no_template_and_stores_a_short_line(ctx) -> None:
    def steps(ms: float, tokens: int) -> tuple[StepRecord, ...]:
        detail = f"p0: TTFT {ms:.2f} ms ({tokens} queued tokens + next 3014, compute fraction 1.00)"
        return (StepRecord(step="ttft_estimate", reason=ReasonCode.NO_CHANGE, value=ms, detail=detail),) * 20

    first = _record(ctx, T0 + dt.timedelta(minutes=1), steps(399.5043, 13961))
    with psycopg.connect(to_libpq_uri(ctx[0].database_url)) as conn:
        num_templates = conn.execute("SELECT count(*) FROM step_templates").fetchone()[0]
    second = _record(ctx, T0 + dt.timedelta(minutes=2), steps(412.25, 14200))
    with psycopg.connect(to_libpq_uri(ctx[0].database_url)) as conn:
        assert conn.execute("SELECT count(*) FROM step_templates").fetchone()[0] == num_templates
        packed = conn.execute("SELECT packed FROM tick_step_lists WHERE tick_id = %s", (second,)).fetchone()[0]
    assert len(packed) < 20 * 40  # per step: an id, the value and six numbers, not the ~80-character sentence
    assert _view(ctx[0].database_url, second)[0][5] == steps(412.25, 14200)[0].detail
    assert _view(ctx[0].database_url, first)[0][5] == steps(399.5043, 13961)[0].detail


def test_a_rolled_back_tick_leaves_no_template_behind(ctx) -> None:
    step = StepRecord(step="demand", reason=ReasonCode.NO_CHANGE, detail="never stored 1")
    bad = StepRecord(step="x" * 81, reason=ReasonCode.NO_CHANGE)  # over the 80-character bound: the insert fails
    with pytest.raises(Exception, match="too long"):
        _record(ctx, T0 + dt.timedelta(minutes=1), (step, bad))
    with psycopg.connect(to_libpq_uri(ctx[0].database_url)) as conn:
        found = conn.execute("SELECT count(*) FROM step_templates WHERE template = 'never stored \x1f'").fetchone()
    assert found == (0,)


def test_two_transactions_inserting_the_same_new_template_both_get_its_id(ctx) -> None:
    """The second insert waits for the first transaction; once it commits, the second finds the row and uses it."""
    template = StepTemplate(step="demand", component=None, reason="no_change", template="new \x1f")
    first_inserted, results = threading.Event(), {}

    def first() -> None:
        with ctx[0].sessions.begin() as session:
            results["first"] = template_ids(session, {template})[0][template]
            first_inserted.set()
            threading.Event().wait(1.0)  # hold the uncommitted row while the second inserts

    def second() -> None:
        first_inserted.wait(10)
        with ctx[0].sessions.begin() as session:
            results["second"] = template_ids(session, {template})[0][template]

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results["first"] == results["second"]
    with psycopg.connect(to_libpq_uri(ctx[0].database_url)) as conn:
        assert conn.execute("SELECT count(*) FROM step_templates WHERE template = 'new \x1f'").fetchone() == (1,)


def _count_template_reads(ctx, record) -> int:
    """How many statements read `step_templates` while `record()` runs."""
    from sqlalchemy import event

    engine = ctx[0].sessions.kw["bind"]
    reads = []

    def count(_conn, _cursor, statement, *_args) -> None:
        if "FROM step_templates" in statement:
            reads.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        record()
    finally:
        event.remove(engine, "before_cursor_execute", count)
    return len(reads)


def test_templates_a_committed_tick_used_are_not_read_again(ctx) -> None:
    steps = (StepRecord(step="demand", reason=ReasonCode.NO_CHANGE, detail="cached 1"),)
    assert _count_template_reads(ctx, lambda: _record(ctx, T0 + dt.timedelta(minutes=1), steps)) > 0
    assert _count_template_reads(ctx, lambda: _record(ctx, T0 + dt.timedelta(minutes=2), steps)) == 0


def test_an_id_learned_in_a_rolled_back_tick_is_not_kept(ctx) -> None:
    """The rolled-back tick inserted a template and learned its id; the next tick must not use that id."""
    new = StepRecord(step="demand", reason=ReasonCode.NO_CHANGE, detail="rolled back 1")
    bad = StepRecord(step="x" * 81, reason=ReasonCode.NO_CHANGE)
    with pytest.raises(Exception, match="too long"):
        _record(ctx, T0 + dt.timedelta(minutes=1), (new, bad))
    tick_id = _record(ctx, T0 + dt.timedelta(minutes=2), (new,))
    assert [row[5] for row in _view(ctx[0].database_url, tick_id)] == ["rolled back 1"]


def test_ids_cached_before_the_table_was_made_again_are_not_used(ctx, tmp_path) -> None:
    """A connection that cached ids, then the table dropped and created again (a downgrade and upgrade): the steps'
    insert sees the table changed, and the ids are looked up again."""
    from planner_core.runtime.store.migrate import downgrade, upgrade

    url = ctx[0].database_url
    first = (StepRecord(step="demand", reason=ReasonCode.NO_CHANGE, detail="a 1"),)
    _record(ctx, T0 + dt.timedelta(minutes=1), first)
    downgrade(url, "0017")
    upgrade(url)
    with psycopg.connect(to_libpq_uri(url)) as conn:  # different templates take the ids the cache holds
        conn.execute("DELETE FROM step_templates")
        conn.execute(
            "INSERT INTO step_templates (step, reason, template) SELECT 'other', 'no_change', 'x' || g "
            "FROM generate_series(1, 50) g"
        )
    tick_id = _record(ctx, T0 + dt.timedelta(minutes=2), first)
    assert [row[1:] for row in _view(url, tick_id)] == [("demand", None, None, "no_change", "a 1")]
