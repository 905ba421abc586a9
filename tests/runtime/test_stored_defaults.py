"""`ticks.inputs` is stored without the fields that hold their defaults (`to_jsonable(..., omit_defaults=True)`,
migration 0019), and `from_jsonable` fills them back in from the dataclasses. A changed default would silently
change every stored tick that left it out, and with it what replay feeds the decision: so the defaults of every
dataclass a tick's inputs hold are pinned here. Changing one needs a migration that writes the old default into
the stored inputs first."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_core.domain import (
    AppliedTargets,
    Component,
    EngineLifecycle,
    ForwardPassMetrics,
    Loop,
    QueuedRequests,
    RecordedArrivals,
    ScheduledRequests,
    TickInputs,
    TrafficObservation,
    UnplacedRequests,
    WorkerCounts,
)
from planner_core.runtime.store import codec
from planner_core.runtime.store.codec import from_jsonable, to_jsonable

_NO_TRAFFIC_FEATURES = dict.fromkeys(
    (
        "isl_p50 isl_p90 isl_p99 osl_p50 osl_p90 osl_p99 ttft_ms itl_ms ttft_ms_p95 ttft_ms_p99 queue_ms kv_hit_rate "
        "accept_length prompt_tokens_p99_250ms prompt_tokens_p99_500ms prompt_tokens_p99_1s prompt_tokens_p99_2s "
        "prompt_tokens_p99_5s prompt_tokens_p99_10s prompt_tokens_p99_30s prompt_arrivals ttft_histogram itl_histogram"
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
    "TickInputs": {
        "traffic": None,
        "fpm": [],
        "unplaced": [],
        "remote": [],
        "gpu_ceiling": None,
        "applied": [],
        # ours, safe actuation: no outside change, worker counts read (what every tick before them saw)
        "outside_changes": [],
        "workers_observed": True,
    },
    "WorkerCounts": {},
    "TrafficObservation": {**_NO_TRAFFIC_FEATURES, "prompt_tokens_quantiles": []},
    "PromptBurstQuantiles": {},
    "LatencyHistogram": {},
    "RecordedArrivals": {"at_s": [], "isl": [], "num_req": [], "resolution_s": 0.0},
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
    "AppliedTargets": {"num_prefill": None, "num_decode": None},
    "OutsideChange": {},
}


def _defaults_reachable_from(cls: type, seen: dict[str, dict]) -> dict[str, dict]:
    if cls.__name__ in seen:
        return seen
    defaults: dict = {}
    seen[cls.__name__] = defaults
    for f in dataclasses.fields(cls):
        default = codec.field_default(f)
        if default is not dataclasses.MISSING:
            defaults[f.name] = to_jsonable(default)
        for name in re.findall(r"[A-Za-z_]+", str(f.type)):
            if name in codec._DATACLASSES:
                _defaults_reachable_from(codec._DATACLASSES[name], seen)
    return seen


def test_the_defaults_stored_inputs_leave_out_are_pinned() -> None:
    assert _defaults_reachable_from(TickInputs, {}) == PINNED_DEFAULTS


def test_the_fpm_defaults_the_view_fills_in_are_the_domains() -> None:
    """Migration 0019's `fpm_snapshots` view puts the left-out fields back into each engine's `metrics`."""
    module = _migration("0019")
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
    now_s=st.sampled_from([0.0, -0.0, 1767571495.0]),
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
        prompt_arrivals=st.none()
        | st.builds(
            RecordedArrivals,
            start_s=_floats,
            end_s=_floats,
            at_s=st.lists(_floats, max_size=3).map(tuple),
            isl=st.lists(_floats, max_size=3).map(tuple),
            num_req=st.lists(_floats, max_size=3).map(tuple),
            resolution_s=_floats,
        ),
    ),
    fpm=st.lists(_fpm, max_size=3).map(tuple),
    unplaced=st.lists(
        st.builds(UnplacedRequests, component=st.sampled_from(Component), num_waiting=_counts), max_size=2
    ).map(tuple),
    applied=st.lists(
        st.builds(AppliedTargets, at_s=_floats, num_prefill=st.none() | _counts, num_decode=st.none() | _counts),
        max_size=2,
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


# The order of the fields stored by position (`codec.stored_inputs`, migration 0020). Stored ticks are read back by
# position: a field moved, inserted before others or removed would make every stored tick read another value.
POSITIONAL_ORDER = {
    "WorkerCounts": ["ready_prefill", "ready_decode", "expected_prefill", "expected_decode"],
    "ForwardPassMetrics": [
        "component", "worker_id", "dp_rank", "counter_id", "wall_time_s", "scheduled", "queued", "lifecycle"
    ],
    "ScheduledRequests": [
        "num_prefill_requests", "sum_prefill_tokens", "var_prefill_length", "sum_prefill_kv_tokens",
        "num_decode_requests", "sum_decode_kv_tokens", "var_decode_kv_tokens",
    ],
    "QueuedRequests": [
        "num_prefill_requests", "sum_prefill_tokens", "var_prefill_length", "num_decode_requests",
        "sum_decode_kv_tokens", "var_decode_kv_tokens",
    ],
}  # fmt: skip


def test_the_field_order_of_positional_records_is_pinned() -> None:
    classes = {"WorkerCounts": WorkerCounts, "ForwardPassMetrics": ForwardPassMetrics}
    classes |= {"ScheduledRequests": ScheduledRequests, "QueuedRequests": QueuedRequests}
    assert {name: [f.name for f in dataclasses.fields(cls)] for name, cls in classes.items()} == POSITIONAL_ORDER
    assert codec.POSITIONAL_IN_STORED_INPUTS == ("workers", "fpm")


def _migration(revision: str):
    from importlib import util

    from planner_core.runtime.store.migrate import MIGRATIONS_DIR

    path = next(MIGRATIONS_DIR.glob(f"versions/*_{revision}_*.py"))
    spec = util.spec_from_file_location(f"migration_{revision}", path)
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_migration_0020_converts_with_the_domains_order_and_defaults() -> None:
    """Migration 0020's own copy of the positional layout (it converts stored rows and its view reads them) is the
    domain's: the same fields in the same order, with the pinned defaults."""
    module = _migration("0020")
    fpm = PINNED_DEFAULTS["ForwardPassMetrics"]
    assert [name for name, _ in module.FPM] == POSITIONAL_ORDER["ForwardPassMetrics"]
    assert [name for name, _ in module.WORKERS] == POSITIONAL_ORDER["WorkerCounts"]
    for name, default in module.FPM:
        if name in ("scheduled", "queued"):
            assert dict(default) == fpm[name] and [k for k, _ in default] == list(fpm[name])
        else:
            assert default == fpm.get(name) and type(default) is type(fpm.get(name))


def test_an_engine_is_stored_as_its_fields_in_order_without_trailing_defaults() -> None:
    workers = WorkerCounts(ready_prefill=4, ready_decode=1, expected_prefill=5, expected_decode=1)
    decode = ForwardPassMetrics(
        component=Component.DECODE,
        worker_id="d0",
        counter_id=12,
        wall_time_s=0.0383,
        scheduled=ScheduledRequests(num_decode_requests=188, sum_decode_kv_tokens=377342),
    )
    prefill = ForwardPassMetrics(
        component=Component.PREFILL, worker_id="p0", queued=QueuedRequests(sum_prefill_tokens=18867)
    )
    inputs = TickInputs(now_s=1767571795.0, loop=Loop.LOAD, workers=workers, fpm=(decode, prefill))
    stored = codec.stored_inputs(inputs, 1767571795.0)
    text = json.dumps(stored, separators=(",", ":"))
    assert text == (
        '{"workers":[4,1,5,1],"fpm":[["decode","d0",0,12,0.0383,[0,0,0.0,0,188,377342]],'
        '["prefill","p0",0,0,0.0,[],[0,18867]]]}'
    )
    assert codec.inputs_from_stored(json.loads(text), Loop.LOAD, 1767571795.0) == inputs
    # `now_s` is stored only when the tick's scheduled time does not give it back to the bit
    assert codec.stored_inputs(inputs, 1767571795.000001)["now_s"] == 1767571795.0


def test_stored_inputs_in_another_form_are_refused_with_the_field() -> None:
    with pytest.raises(ValueError, match="workers .* is not a positional array"):
        codec.inputs_from_stored({"workers": {"ready_prefill": 1}}, Loop.LOAD, 0.0)
    with pytest.raises(ValueError, match="ForwardPassMetrics: stored as .* not an array of at most 8 fields"):
        codec.inputs_from_stored({"workers": [1, 1, 1, 1], "fpm": [{"component": "decode"}]}, Loop.LOAD, 0.0)


@given(_inputs, st.sampled_from([0.0, 1767571495.0, 1767571495.5]))
@settings(max_examples=300, deadline=None)
def test_inputs_as_stored_read_back_strictly_equal(inputs: TickInputs, scheduled_s: float) -> None:
    """What the store writes (`stored_inputs`, as JSON text) reads back (`inputs_from_stored`) the same value for
    value and type for type, the sign of a zero included, whether `now_s` is the scheduled time or not."""
    text = json.dumps(codec.stored_inputs(inputs, scheduled_s), separators=(",", ":"))
    back = codec.inputs_from_stored(json.loads(text), inputs.loop, scheduled_s)
    assert back == inputs
    assert codec._strictly_equal(back, inputs)
