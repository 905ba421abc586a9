"""Reading recorded ticks back for a replay: one row per tick with its recorded outcome in comparable form, its
steps unpacked and its state after rebuilt (whole, or from a delta against the previous tick's).

`planner_core.runtime.replay` streams these rows (`TICKS_SQL`, `with_states`) and replays each tick against them.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from sqlalchemy import Connection

from planner_core.runtime.store import repository as repo
from planner_core.runtime.store.state_delta import apply_delta, decode_delta, same_json
from planner_core.runtime.store.step_packing import StepUnpacker, StoredTemplate

__all__ = ["TICKS_SQL", "with_states"]

# One row per tick: the recorded tick, its outcome in comparable form, and its state after, whole or as a delta
# against the previous tick's (`with_states` rebuilds it; migration 0016).
TICKS_SQL = """
SELECT t.id, t.loop, t.scheduled_at, t.reason, t.inputs, t.previous_tick_id,
       -- the config revision the tick ran (migration 0024; NULL before it) and that revision's policy: the foreign
       -- key makes it the tick's own config hash, which ticks recorded before revisions are replayed under
       t.config_revision, COALESCE(r.config_hash, t.config_hash) AS config_hash,
       s.tick_id IS NOT NULL AS has_state,
       s.state, s.delta, s.base_tick_id,
       -- a fleet member's decision as its tick made it: the targets before the arbitration cut them (its first grant)
       CASE WHEN cut.decision_id IS NULL THEN d.target_prefill ELSE cut.proposed_prefill END AS target_prefill,
       CASE WHEN cut.decision_id IS NULL THEN d.target_decode ELSE cut.proposed_decode END AS target_decode,
       d.status AS decision_status,
       -- the steps as stored (`step_packing`), unpacked by `unpack_steps` as the view `tick_steps` would
       l.packed AS packed_steps,
       (SELECT json_agg(json_build_object('component', p.component, 'current', p.current, 'desired', p.desired,
                                          'reason', p.reason) ORDER BY p.id)
          FROM proposals p WHERE p.tick_id = t.id AND p.scheduled_at = t.scheduled_at) AS proposals,
       CASE WHEN pr.tick_id IS NOT NULL THEN
           json_build_object('num_req', pr.num_req, 'isl', pr.isl, 'osl', pr.osl, 'reason', pr.reason,
                             'quantile', pr.quantile, 'isl_quantile', pr.isl_quantile,
                             'osl_quantile', pr.osl_quantile)
       END AS prediction
  FROM ticks t
  LEFT JOIN config_revisions r ON r.deployment_id = t.deployment_id AND r.revision = t.config_revision
  -- `scheduled_at` in the joins: each row is in its tick's partition, and the range bounds which partitions
  LEFT JOIN planner_states s ON s.tick_id = t.id AND s.scheduled_at = t.scheduled_at
       AND s.scheduled_at >= :start AND s.scheduled_at < :end
  LEFT JOIN tick_step_lists l ON l.tick_id = t.id AND l.scheduled_at = t.scheduled_at
       AND l.scheduled_at >= :start AND l.scheduled_at < :end
  LEFT JOIN decisions d ON d.tick_id = t.id
  LEFT JOIN LATERAL (SELECT g.decision_id, g.proposed_prefill, g.proposed_decode FROM arbitration_grants g
                      WHERE g.decision_id = d.id ORDER BY g.round_id LIMIT 1) AS cut ON true
  LEFT JOIN predictions pr ON pr.tick_id = t.id AND pr.scheduled_at = t.scheduled_at
       AND pr.scheduled_at >= :start AND pr.scheduled_at < :end
 WHERE t.deployment_id = :deployment_id AND t.scheduled_at >= :start AND t.scheduled_at < :end
   AND t.id BETWEEN :first_id AND :last_id  -- bounds the primary-key scan to the range
 ORDER BY t.id
"""


def with_states(reader: Connection, rows: Iterator[Any], templates: dict[int, StoredTemplate]) -> Iterator[Any]:
    """The ticks' rows with their steps unpacked (`steps`, as the view `tick_steps` gives them) and each state
    rebuilt: `state_rest` (the state without its load history) and
    `load_history`, the latter only when it differs from the previous row's (load ticks leave it unchanged, so a
    week of 5 s ticks parses a few thousand histories instead of ~120k). A delta's base is the previous row's
    state, or read from the store for the first row of the range."""
    previous: tuple[int, dict[str, Any]] | None = None  # (tick id, rebuilt state) of the newest row with a state
    previous_history: Any = None
    unpack = StepUnpacker(templates)
    for row in rows:
        values = dict(row._mapping)
        values["steps"] = unpack(row.packed_steps)
        state: dict[str, Any] | None = None
        if row.state is not None:
            state = row.state
        elif row.delta is not None and row.base_tick_id is None:  # a full state, compressed (migration 0020)
            state = apply_delta(None, decode_delta(row.delta))
        elif row.delta is not None:
            if previous is not None and previous[0] == row.base_tick_id:
                base = previous[1]
            else:
                # a delta's base is in the delta's own day (migration 0017): read that partition only
                base = repo.state_json(reader, row.base_tick_id, scheduled_at=row.scheduled_at)
                if base is None:  # prune rebuilds a delta before deleting its base: only a damaged table lands here
                    raise ValueError(f"planner_states: tick {row.id}'s delta has no base (tick {row.base_tick_id})")
            state = apply_delta(base, decode_delta(row.delta))
        values["has_state"] = state is not None
        values["state_rest"] = None if state is None else {k: v for k, v in state.items() if k != "load_history"}
        history = None if state is None else state.get("load_history")
        values["load_history"] = None if state is None or same_json(history, previous_history) else history
        if state is not None:
            previous, previous_history = (row.id, state), history
        else:
            previous_history = None
        yield SimpleNamespace(**values)
