"""Worker counts and forward-pass metrics stored by position, state deltas compressed with a preset dictionary.

Why: a load tick stored 2.7 kB (`planner fleet bytes`, 3-deployment fleet bench, 600 s); the goal is 2 kB. Of the
`ticks` row (~0.86 kB) ~0.7 kB were the engines' forward-pass metrics in `ticks.inputs`, most of it their key
names (`"sum_decode_kv_tokens":`), ~170 B an engine; and a planner-state delta (~0.48 kB compressed) spelled out
the state's key names and a fit's sentence at every tick. Now `inputs.workers` and each engine of `inputs.fpm`
are JSON arrays of their fields in declared order (`domain.stored_inputs`, trailing defaults left out; the order
is pinned by tests/runtime/test_stored_defaults.py), ~100 B an engine, and the inputs leave out `loop` and `now_s`
where the row's `loop` and `scheduled_at` give them back exactly; and a delta is zlib-compressed with a preset
dictionary of that shared text (`state_delta.encode_delta`, whose zlib header names the dictionary), ~0.21 kB.
The view `fpm_snapshots` expands the arrays back into the same rows and whole `metrics` objects as 0019's.
Also a whole planner state (a full state starts each chain of deltas, every 32 states and every UTC day) is
stored as a delta from nothing, `{"=": state}`, compressed the same way: ~3.4 kB where JSONB took ~5.5 kB.
Changes: every row of `ticks` (its `inputs` rewritten: same values, the new form); every row of
`planner_states` (a delta recompressed with the dictionary; a whole state moved from `state` to `delta`, without
a base); check `ck_planner_states_full_or_delta` (now: `state` or `delta`, and `state` never with a base); view
`fpm_snapshots` (dropped and created again over the positional form: same columns, rows, grants and comment).
Locks: ROW EXCLUSIVE on `ticks` and `planner_states` while every row is rewritten once (a tick recorded meanwhile
by the old code would be in the old form: stop the planner first), ACCESS EXCLUSIVE on `planner_states` while its
check is replaced (it reads every row) and briefly on the view.
Downgrade: each row's inputs back to 0019's form (objects without their default fields, which 0019's view and
reader fill back in; `loop` and `now_s` written back), every delta recompressed without a dictionary (0016's
form), every whole state back into `state` (JSONB), 0019's check and view.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-27 08:00:00
"""

import json
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from planner_core.runtime.store.state_delta import apply_delta, decode_delta, encode_delta

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The positional records as this revision writes them: (field, default) in declared order, None for a required
# field (pinned against the domain's dataclasses by tests/runtime/test_stored_defaults.py).
SCHEDULED = (
    ("num_prefill_requests", 0),
    ("sum_prefill_tokens", 0),
    ("var_prefill_length", 0.0),
    ("sum_prefill_kv_tokens", 0),
    ("num_decode_requests", 0),
    ("sum_decode_kv_tokens", 0),
    ("var_decode_kv_tokens", 0.0),
)
QUEUED = tuple(item for item in SCHEDULED if item[0] != "sum_prefill_kv_tokens")
FPM = (
    ("component", None),
    ("worker_id", None),
    ("dp_rank", 0),
    ("counter_id", 0),
    ("wall_time_s", 0.0),
    ("scheduled", SCHEDULED),
    ("queued", QUEUED),
    ("lifecycle", "serving"),
)
WORKERS = (("ready_prefill", None), ("ready_decode", None), ("expected_prefill", None), ("expected_decode", None))
_NESTED = {"scheduled": SCHEDULED, "queued": QUEUED}


def _strictly_default(value: Any, default: Any) -> bool:
    """The value `to_jsonable` leaves out: its default, of the same type (0 is not 0.0; -0.0 is not 0.0)."""
    if default is None or type(value) is not type(default) or value != default:
        return False
    return not isinstance(value, float) or str(value) == str(default)


def _left_out(value: Any, default: Any) -> bool:
    return value == [] if default == [] else _strictly_default(value, default)


def to_positional(record: dict[str, Any], layout: tuple[tuple[str, Any], ...]) -> list[Any]:
    """An object of 0019's form (fields at their defaults left out, or present: older rows) as this revision's
    array: every field in order, trailing defaults left out."""
    items, defaults = [], []
    for name, default in layout:
        nested = _NESTED.get(name) if layout is FPM else None
        if nested is not None:
            items.append(to_positional(record.get(name, {}), nested))
            defaults.append([])
        else:
            if name not in record and default is None:
                raise RuntimeError(f"migration 0020: stored record {record!r} lacks its field {name!r}")
            items.append(record.get(name, default))
            defaults.append(default)
    end = len(items)
    while end > 0 and _left_out(items[end - 1], defaults[end - 1]):
        end -= 1
    return items[:end]


def from_positional(row: list[Any], layout: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    """This revision's array as 0019's object: the fields not at their defaults."""
    record: dict[str, Any] = {}
    for (name, default), value in zip(layout, row, strict=False):
        nested = _NESTED.get(name) if layout is FPM else None
        if nested is not None:
            value = from_positional(value, nested)
            if value:
                record[name] = value
        elif not _strictly_default(value, default):
            record[name] = value
    return record


def _with_inputs(convert: Callable[[dict[str, Any], Any], dict[str, Any]]) -> None:
    """Rewrite every tick's `inputs` through `convert(inputs, row)`, a batch of ticks at a time."""
    bind = op.get_bind()
    select = sa.text(
        "SELECT id, scheduled_at, loop, inputs::text AS inputs FROM ticks WHERE id > :after ORDER BY id LIMIT 2000"
    )
    update = sa.text("UPDATE ticks SET inputs = CAST(:inputs AS json) WHERE id = :id AND scheduled_at = :at")
    after = -1
    while rows := bind.execute(select, {"after": after}).all():
        bind.execute(
            update,
            [
                {
                    "id": r.id,
                    "at": r.scheduled_at,
                    "inputs": json.dumps(convert(json.loads(r.inputs), r), separators=(",", ":")),
                }
                for r in rows
            ],
        )
        after = rows[-1].id


def _positional_inputs(inputs: dict[str, Any], row: Any) -> dict[str, Any]:
    if inputs.get("loop") != row.loop:
        raise RuntimeError(
            f"migration 0020: tick {row.id}'s inputs say loop {inputs.get('loop')!r}, its row {row.loop!r}"
        )
    del inputs["loop"]
    now_s = inputs["now_s"]
    if isinstance(now_s, float) and now_s == row.scheduled_at.timestamp() and str(now_s)[0] != "-":
        del inputs["now_s"]  # the row's scheduled_at gives it back exactly
    inputs["workers"] = to_positional(inputs["workers"], WORKERS)
    if inputs.get("fpm"):
        inputs["fpm"] = [to_positional(engine, FPM) for engine in inputs["fpm"]]
    return inputs


def _object_inputs(inputs: dict[str, Any], row: Any) -> dict[str, Any]:
    inputs = {"now_s": row.scheduled_at.timestamp(), "loop": row.loop, **inputs}
    inputs["workers"] = {name: value for (name, _), value in zip(WORKERS, inputs["workers"], strict=True)}
    if inputs.get("fpm"):
        inputs["fpm"] = [from_positional(engine, FPM) for engine in inputs["fpm"]]
    return inputs


def _restore_states(store: Callable[[Any], dict[str, Any]]) -> None:
    """Every planner-state row rewritten as `store(row)` gives its columns, a batch of rows at a time."""
    bind = op.get_bind()
    select = sa.text(
        "SELECT tick_id, scheduled_at, state, delta, base_tick_id FROM planner_states WHERE tick_id > :after "
        "ORDER BY tick_id LIMIT 2000"
    )
    update = sa.text(
        "UPDATE planner_states SET state = :state, delta = :delta WHERE tick_id = :id AND scheduled_at = :at"
    ).bindparams(sa.bindparam("state", type_=postgresql.JSONB(none_as_null=True)))
    after = -1
    while rows := bind.execute(select, {"after": after}).all():
        bind.execute(update, [{"id": r.tick_id, "at": r.scheduled_at, **store(r)} for r in rows])
        after = rows[-1].tick_id


def _compressed(row: Any) -> dict[str, Any]:
    """This revision's form: a delta with the dictionary, a whole state as a delta from nothing."""
    delta = {"=": row.state} if row.state is not None else decode_delta(row.delta)
    return {"state": None, "delta": encode_delta(delta)}


def _as_0019(row: Any) -> dict[str, Any]:
    """0019's form: a delta without a dictionary, a whole state as JSONB."""
    if row.state is not None:
        return {"state": row.state, "delta": None}
    delta = decode_delta(row.delta)
    if row.base_tick_id is None:
        return {"state": apply_delta(None, delta), "delta": None}
    return {"state": None, "delta": _encode_0016(delta)}


_CHECK = "ALTER TABLE planner_states ADD CONSTRAINT ck_planner_states_full_or_delta CHECK ({})"
_DROP_CHECK = "ALTER TABLE planner_states DROP CONSTRAINT ck_planner_states_full_or_delta"
CHECK = "(state IS NULL) <> (delta IS NULL) AND (state IS NULL OR base_tick_id IS NULL)"
OLD_CHECK = "(state IS NULL) <> (delta IS NULL) AND (delta IS NULL) = (base_tick_id IS NULL)"


def _encode_0016(delta: dict[str, Any]) -> bytes:
    """0016's form: the compact JSON text, zlib-compressed without a dictionary."""
    return zlib.compress(json.dumps(delta, separators=(",", ":"), allow_nan=False).encode(), 9)


def _value(field: str, default: Any) -> str:
    """SQL for one field of a stored engine (`field`, a jsonb expression), or its default when left out."""
    return field if default is None else f"COALESCE({field}, '{json.dumps(default)}'::jsonb)"


def _whole(r: str) -> str:
    """SQL for one engine's whole metrics object (as 0019's view gives it) from its positional array `r` (jsonb)."""
    fields = []
    for i, (name, default) in enumerate(FPM):
        if name in _NESTED:
            counters = (f"'{c}', {_value(f'{r}->{i}->{j}', d)}" for j, (c, d) in enumerate(_NESTED[name]))
            fields.append(f"'{name}', jsonb_build_object({', '.join(counters)})")
        else:
            fields.append(f"'{name}', {_value(f'{r}->{i}', default)}")
    return f"jsonb_build_object({', '.join(fields)})"


def _fpm_snapshots_view(metrics_joins: str) -> str:
    """The `fpm_snapshots` definition, with `metrics_joins` making `m.metrics` (one engine's whole metrics object)
    from `f.raw` (the element of `ticks.inputs->'fpm'` as stored)."""
    return f"""
CREATE VIEW fpm_snapshots AS
SELECT t.id AS tick_id,
       f.seq::int AS seq,
       m.metrics->>'component' AS component,
       m.metrics->>'worker_id' AS worker_id,
       (m.metrics->>'dp_rank')::int AS dp_rank,
       (m.metrics->>'wall_time_s')::float8 AS wall_time_s,
       m.metrics
  FROM ticks t
 CROSS JOIN LATERAL json_array_elements(COALESCE(t.inputs->'fpm', '[]'::json)) WITH ORDINALITY AS f(raw, seq)
{metrics_joins}
"""


FPM_SNAPSHOTS_VIEW = _fpm_snapshots_view(
    f""" CROSS JOIN LATERAL (SELECT f.raw::jsonb AS r) e
 CROSS JOIN LATERAL (SELECT {_whole("e.r")} AS metrics) m"""
)

# 0019's definition, over objects without their default fields.
_OLD_DEFAULTS = {
    name: (dict(_NESTED[name]) if name in _NESTED else default) for name, default in FPM if default is not None
}


def _old_whole(metrics: str) -> str:
    defaults, scheduled, queued = (json.dumps(v) for v in (_OLD_DEFAULTS, dict(SCHEDULED), dict(QUEUED)))
    return (
        f"('{defaults}'::jsonb || {metrics} || jsonb_build_object("
        f"'scheduled', '{scheduled}'::jsonb || COALESCE({metrics}->'scheduled', '{{}}'::jsonb), "
        f"'queued', '{queued}'::jsonb || COALESCE({metrics}->'queued', '{{}}'::jsonb)))"
    )


OLD_FPM_SNAPSHOTS_VIEW = _fpm_snapshots_view(
    f""" CROSS JOIN LATERAL (SELECT {_old_whole("f.raw::jsonb")} AS metrics) m"""
)

_GRANTS_AND_COMMENT = """
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'planner_analyst') THEN
        GRANT SELECT ON fpm_snapshots TO planner_analyst;
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'planner_writer') THEN
        GRANT SELECT ON fpm_snapshots TO planner_writer;
    END IF;
END
$$;
COMMENT ON VIEW fpm_snapshots IS {comment};
"""
_COMMENT = (  # 0019's words
    "'The forward-pass metrics each tick saw, one row per engine, expanded from ticks.inputs (the one stored copy; "
    "migration {revisions}).'"
)


def upgrade() -> None:
    op.execute("DROP VIEW fpm_snapshots")
    _with_inputs(_positional_inputs)
    op.execute(FPM_SNAPSHOTS_VIEW)
    op.execute(_GRANTS_AND_COMMENT.format(comment=_COMMENT.format(revisions="0015, 0019, 0020")))
    op.execute(_DROP_CHECK)
    _restore_states(_compressed)
    op.execute(_CHECK.format(CHECK))


def downgrade() -> None:
    op.execute(_DROP_CHECK)
    _restore_states(_as_0019)
    op.execute(_CHECK.format(OLD_CHECK))
    op.execute("DROP VIEW fpm_snapshots")
    _with_inputs(_object_inputs)
    op.execute(OLD_FPM_SNAPSHOTS_VIEW)
    op.execute(_GRANTS_AND_COMMENT.format(comment=_COMMENT.format(revisions="0015, 0019")))
