"""How a replayed tick is compared with the recorded one (pure): both put in one JSON form (`_recorded_form`,
`_replayed_form`), compared with `==` where NaN equals NaN (`_same`), and the differing fields listed per section
(`_diff`). Used by `planner_core.runtime.replay`."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from planner_core.domain import PlannerState, TickOutcome


def _recorded_form(row: Any, *, non_finite: bool = True) -> dict[str, Any]:
    """The recorded outcome of a tick in the comparable form (what `record_tick` wrote, read back). Without
    `non_finite`, the steps and prediction are left as read, their non-finite numbers still strings: equal to the
    replayed form in the common case, at a fraction of the cost (`_finite` walks every step)."""
    fix = _finite if non_finite else _as_read
    decision = None
    if row.decision_status is not None:
        decision = {
            "target_prefill": row.target_prefill,
            "target_decode": row.target_decode,
            "advisory": row.decision_status == "advisory",
        }
    return {
        "reason": row.reason,
        "decision": decision,
        "proposals": row.proposals or [],
        "prediction": fix(row.prediction),
        "steps": fix(row.steps or []),
    }


def _as_read(value: Any) -> Any:
    return value


def _replayed_form(outcome: TickOutcome) -> dict[str, Any]:
    """A replayed outcome in the same form, as `record_tick` would have written it."""
    decision = outcome.decision
    prediction = outcome.prediction
    return {
        "reason": outcome.reason.value,
        "decision": None
        if decision.is_empty
        else {
            "target_prefill": decision.num_prefill,
            "target_decode": decision.num_decode,
            "advisory": decision.advisory,
        },
        "proposals": [
            {"component": p.component.value, "current": p.current, "desired": p.desired, "reason": p.reason.value}
            for p in outcome.proposals
        ],
        "prediction": None
        if prediction is None
        else {
            "num_req": prediction.num_req,
            "isl": prediction.isl,
            "osl": prediction.osl,
            "reason": (outcome.prediction_reason or outcome.reason).value,
            "quantile": prediction.quantile,
            "isl_quantile": prediction.isl_quantile,
            "osl_quantile": prediction.osl_quantile,
        },
        "steps": [
            {
                "step": s.step,
                "component": s.component.value if s.component is not None else None,
                "value": s.value,
                "reason": s.reason.value,
                "detail": s.detail,
            }
            for s in outcome.steps
        ],
    }


# The state's fields other than its load history (compared field by field; the history is compared apart).
_STATE_REST_FIELDS = tuple(f.name for f in dataclasses.fields(PlannerState) if f.name != "load_history")
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _finite(value: Any) -> Any:
    """Postgres writes non-finite doubles into JSON as strings ("NaN"); turn them back into floats."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, str) and value in _NON_FINITE:
        return _NON_FINITE[value]
    return value


def _same_rest(replayed: PlannerState, recorded: PlannerState) -> bool:
    """Whether the state's fields other than its load history are equal as objects: a field unchanged by the tick
    is the very object the recorded state before it held (`is`), the others compare with the dataclasses' `==`.
    Equal objects encode to equal JSON, so True means identical; False (a NaN, a list for a tuple, a real
    difference) leaves the verdict to the comparison of their JSON forms."""
    for name in _STATE_REST_FIELDS:
        a, b = getattr(replayed, name), getattr(recorded, name)
        if a is not b and a != b:
            return False
    return True


def _same(a: Any, b: Any) -> bool:
    """Exact equality of JSON-like values, with NaN equal to NaN."""
    if a == b:
        return True
    if isinstance(a, float) and isinstance(b, float):
        return math.isnan(a) and math.isnan(b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return False


def _diff(path: str, recorded: Any, replayed: Any, out: list[dict[str, Any]], *, limit: int) -> None:
    """Append the leaves where `recorded` and `replayed` differ, as {"field", "recorded", "replayed"}, until `out`
    holds `limit` entries; then one {"field": "<path>...", "note"} entry says more were left out."""
    if _same(recorded, replayed):
        return
    if len(out) >= limit:
        if not out[-1].get("note"):
            out.append({"field": f"{path}...", "note": "more differences in this section not listed"})
        return
    if isinstance(recorded, dict) and isinstance(replayed, dict):
        for key in sorted(recorded.keys() | replayed.keys()):
            _diff(f"{path}.{key}", recorded.get(key), replayed.get(key), out, limit=limit)
        return
    if isinstance(recorded, list) and isinstance(replayed, list) and len(recorded) == len(replayed):
        for index, (a, b) in enumerate(zip(recorded, replayed, strict=True)):
            _diff(f"{path}[{index}]", a, b, out, limit=limit)
        return
    out.append({"field": path, "recorded": _json_safe(recorded), "replayed": _json_safe(replayed)})


def _json_safe(value: Any) -> Any:
    """JSONB has no NaN or infinity: write them as strings, as the state JSON does."""
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return repr(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value
