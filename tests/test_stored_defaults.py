"""`ticks.inputs` is stored without the fields that hold their defaults (`to_jsonable(..., omit_defaults=True)`,
migration 0019), and `from_jsonable` fills them back in from the dataclasses. A changed default would silently
change every stored tick that left it out, and with it what replay feeds the decision: so the defaults of every
dataclass a tick's inputs hold are pinned here. Changing one needs a migration that writes the old default into
the stored inputs first."""

from __future__ import annotations

import dataclasses
import math
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from planner_core import domain
from planner_core.domain import (
    Component,
    EngineLifecycle,
    ForwardPassMetrics,
    Loop,
    QueuedRequests,
    ScheduledRequests,
    TickInputs,
    TrafficObservation,
    UnplacedRequests,
    WorkerCounts,
    from_jsonable,
    to_jsonable,
)

_NO_TRAFFIC_FEATURES = dict.fromkeys(
    (
        "isl_p50 isl_p90 isl_p99 osl_p50 osl_p90 osl_p99 ttft_ms itl_ms ttft_ms_p95 ttft_ms_p99 queue_ms kv_hit_rate "
        "accept_length prompt_tokens_p99_250ms prompt_tokens_p99_500ms prompt_tokens_p99_1s prompt_tokens_p99_2s "
        "prompt_tokens_p99_5s prompt_tokens_p99_10s prompt_tokens_p99_30s"
    ).split()
)
_SCHEDULED = {
    "num_prefill_requests": 0,
    "sum_prefill_tokens": 0,
    "var_prefill_length": 0.0,
    "sum_prefill_kv_tokens": 0,
    "num_decode_requests": 0,
    "sum_decode_kv_tokens": 0,
    "var_decode_kv_tokens": 0.0,
}
_QUEUED = {k: v for k, v in _SCHEDULED.items() if k != "sum_prefill_kv_tokens"}
PINNED_DEFAULTS = {
    "TickInputs": {"traffic": None, "fpm": [], "unplaced": [], "remote": []},
    "WorkerCounts": {},
    "TrafficObservation": _NO_TRAFFIC_FEATURES,
    "ForwardPassMetrics": {
        "dp_rank": 0,
        "counter_id": 0,
        "wall_time_s": 0.0,
        "scheduled": _SCHEDULED,
        "queued": _QUEUED,
        "lifecycle": "serving",
    },
    "ScheduledRequests": _SCHEDULED,
    "QueuedRequests": _QUEUED,
    "UnplacedRequests": {"num_waiting": 0, "num_unplaced": 0, "num_rejected": 0},
    "RemoteAnswer": {"detail": "", "predictions": None, "overrides": [], "final": False, "observations": []},
    "PartialPrediction": dict.fromkeys(("num_req", "isl", "osl", "quantile", "isl_quantile", "osl_quantile")),
    "ReplicaOverride": {"replicas": None, "reason": ""},
    "ObservedValue": {},
}


def _defaults_reachable_from(cls: type, seen: dict[str, dict]) -> dict[str, dict]:
    if cls.__name__ in seen:
        return seen
    defaults: dict = {}
    seen[cls.__name__] = defaults
    for f in dataclasses.fields(cls):
        default = domain.field_default(f)
        if default is not dataclasses.MISSING:
            defaults[f.name] = to_jsonable(default)
        for name in re.findall(r"[A-Za-z_]+", str(f.type)):
            if name in domain._DATACLASSES:
                _defaults_reachable_from(domain._DATACLASSES[name], seen)
    return seen


def test_the_defaults_stored_inputs_leave_out_are_pinned() -> None:
    assert _defaults_reachable_from(TickInputs, {}) == PINNED_DEFAULTS


def test_the_fpm_defaults_the_view_fills_in_are_the_domains() -> None:
    """Migration 0019's `fpm_snapshots` view puts the left-out fields back into each engine's `metrics`."""
    from importlib import util
    from pathlib import Path

    path = next(Path(domain.__file__).parent.glob("runtime/store/migrations/versions/*_0019_*.py"))
    spec = util.spec_from_file_location("migration_0019", path)
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.FPM_DEFAULTS == PINNED_DEFAULTS["ForwardPassMetrics"]


_counts = st.integers(min_value=0, max_value=3)
_floats = st.sampled_from([0.0, -0.0, 1.0, 0.5, 1e-9, 3.25])
_scheduled = st.builds(ScheduledRequests, num_prefill_requests=_counts, var_prefill_length=_floats)
_queued = st.builds(QueuedRequests, sum_prefill_tokens=_counts, var_decode_kv_tokens=_floats)
_fpm = st.builds(
    ForwardPassMetrics,
    component=st.sampled_from(Component),
    worker_id=st.sampled_from(["p0", "d1"]),
    dp_rank=_counts,
    counter_id=_counts,
    wall_time_s=_floats,
    scheduled=_scheduled,
    queued=_queued,
    lifecycle=st.sampled_from(EngineLifecycle),
)
_inputs = st.builds(
    TickInputs,
    now_s=st.sampled_from([0.0, 1767571495.0]),
    loop=st.sampled_from(Loop),
    workers=st.builds(
        WorkerCounts, ready_prefill=_counts, ready_decode=_counts, expected_prefill=_counts, expected_decode=_counts
    ),
    traffic=st.none()
    | st.builds(
        TrafficObservation,
        duration_s=st.just(60.0),
        num_req=_floats,
        isl=_floats,
        osl=_floats,
        ttft_ms=st.none() | _floats,
    ),
    fpm=st.lists(_fpm, max_size=3).map(tuple),
    unplaced=st.lists(
        st.builds(UnplacedRequests, component=st.sampled_from(Component), num_waiting=_counts), max_size=2
    ).map(tuple),
)


@given(_inputs)
@settings(max_examples=300, deadline=None)
def test_inputs_without_their_defaults_read_back_strictly_equal(inputs: TickInputs) -> None:
    stored = to_jsonable(inputs, omit_defaults=True)
    back = from_jsonable(TickInputs, stored)
    assert to_jsonable(back) == to_jsonable(inputs)
    for fpm, fpm_back in zip(inputs.fpm, back.fpm, strict=True):  # a negative zero keeps its sign
        assert math.copysign(1.0, fpm.wall_time_s) == math.copysign(1.0, fpm_back.wall_time_s)
        assert math.copysign(1.0, fpm.queued.var_decode_kv_tokens) == math.copysign(
            1.0, fpm_back.queued.var_decode_kv_tokens
        )
