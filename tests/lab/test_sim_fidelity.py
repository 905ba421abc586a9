"""Simulator fidelity: TTFT and ITL at fixed batch shapes against measured profile points the simulator's timing
model never saw, and the fast triangle interpolation behind the profile model's decode time.

Held-out points of the H200 Llama-3.1-8B-FP8 profile (`planner_core/data/profiles/H200_TP1P_TP1D`),
left out of the `ProfileForwardPassModel` the simulator runs with (all at once):
- prefill: ISL 2134, 6202, 10270, 14338 (every fourth sampled ISL, none at the ends of the sampled range);
- decode: the middle of the batch sweep of each context length inside the sampled range: context 2997 at batch
  145, 5644 at 79, 8291 at 55, 10938 at 43.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_core.domain import EngineLimits
from planner_core.lab.perf_accuracy import holdout_model
from planner_core.lab.sim.des import ClusterSimulator, RouterPolicy, SimSpec
from planner_core.perf.profile import load_profile
from planner_core.traces import RequestTrace
from tests.conftest import PROFILE_DIR

HELD_OUT_PREFILL_ISL = (2134.0, 6202.0, 10270.0, 14338.0)
HELD_OUT_DECODE = ((2997.0, 145.0), (5644.0, 79.0), (8291.0, 55.0), (10938.0, 43.0))
TOLERANCE = 0.10


@pytest.fixture(scope="module")
def profile():
    return load_profile(PROFILE_DIR)


@pytest.fixture(scope="module")
def held_out_model(profile):
    return holdout_model(profile, prefill_isl=HELD_OUT_PREFILL_ISL, decode_points=HELD_OUT_DECODE)


def make_trace(arrival_s: list[float], isl: list[int], osl: list[int]) -> RequestTrace:
    def frozen(values: list[float] | list[int]) -> np.ndarray:
        array = np.asarray(values, dtype=float)
        array.flags.writeable = False
        return array

    return RequestTrace(source="test", start_epoch_s=0.0, arrival_s=frozen(arrival_s), isl=frozen(isl), osl=frozen(osl))


def test_held_out_points_are_really_left_out(profile, held_out_model) -> None:
    assert held_out_model.prefill.isl.size == profile.prefill.isl.size - len(HELD_OUT_PREFILL_ISL)
    assert held_out_model.decode.itl_ms.size == profile.decode.itl_ms.size - len(HELD_OUT_DECODE)
    assert not set(HELD_OUT_PREFILL_ISL) & set(held_out_model.prefill.isl.tolist())
    with pytest.raises(ValueError, match="no decode point at context 2997, batch 146"):
        holdout_model(profile, decode_points=((2997.0, 146.0),))


@pytest.mark.parametrize("isl", HELD_OUT_PREFILL_ISL)
def test_single_prefill_ttft_matches_a_held_out_point(profile, held_out_model, isl: float) -> None:
    # One request of the held-out ISL on an idle engine that takes a whole prompt per iteration (as profiled), the
    # first token counted at prefill end (the profile measured the prefill engine alone).
    spec = SimSpec(
        prefill_limits=EngineLimits(max_num_batched_tokens=16_384),
        decode_limits=EngineLimits(max_kv_tokens=profile.decode.max_kv_tokens),
        first_token_from_decode=False,
    )
    sim = ClusterSimulator(make_trace([0.0], [int(isl)], [2]), held_out_model, spec, num_prefill=1, num_decode=1)
    sim.run_to_completion()
    measured_ms = float(profile.prefill.ttft_ms[profile.prefill.isl == isl][0])
    simulated_ms = float(sim.result().ttft_s[0]) * 1000.0
    assert abs(simulated_ms - measured_ms) / measured_ms <= TOLERANCE, (simulated_ms, measured_ms)


@pytest.mark.parametrize(("context", "batch"), HELD_OUT_DECODE)
def test_steady_decode_batch_itl_matches_a_held_out_point(
    profile, held_out_model, context: float, batch: float
) -> None:
    # A closed batch: `batch` requests arrive together, one per prefill engine, so they reach the decode engine
    # at the same instant and decode together; OSL 32 and ISL = context - 16, so the KV per request averages the
    # profiled context over the run (the profile's context length is ISL + OSL / 2).
    size, osl = int(batch), 32
    isl = int(context) - osl // 2
    spec = SimSpec(
        decode_limits=EngineLimits(max_kv_tokens=profile.decode.max_kv_tokens, max_num_seqs=512),
        router=RouterPolicy.ROUND_ROBIN,
    )
    trace = make_trace([0.0] * size, [isl] * size, [osl] * size)
    sim = ClusterSimulator(trace, held_out_model, spec, num_prefill=size, num_decode=1)
    sim.run_to_completion()
    itl_s = sim.result().itl_s
    assert np.ptp(itl_s) < 1e-12  # one batch: every request sees the same iterations
    kv_usage = batch * context / profile.decode.max_kv_tokens
    index = np.flatnonzero(
        (profile.decode.context_length == context) & (np.abs(profile.decode.kv_usage - kv_usage) < 5e-4)
    )
    measured_ms = float(profile.decode.itl_ms[index[0]])
    simulated_ms = float(itl_s[0]) * 1000.0
    assert abs(simulated_ms - measured_ms) / measured_ms <= TOLERANCE, (simulated_ms, measured_ms)


@pytest.fixture(scope="module")
def residual_pair(profile):
    """The profile model's decode residual (fast path) and SciPy's interpolator on the same samples."""
    from scipy.interpolate import LinearNDInterpolator

    model = holdout_model(profile)  # nothing left out: the full profile model
    reference = LinearNDInterpolator(residual_points(model), residual_values(model), fill_value=0.0)
    return model._residual, reference  # the fast path under test


@settings(max_examples=300, deadline=None)
@given(x=st.floats(-0.1, 1.1), y=st.floats(-0.1, 1.1))
def test_triangle_interpolation_equals_scipy(residual_pair, x: float, y: float) -> None:
    # Inside the samples' hull: the same piecewise-linear value; outside: 0 (SciPy's fill value).
    residual, reference = residual_pair
    assert residual(x, y) == pytest.approx(float(reference(x, y)), abs=1e-12)


def residual_points(model) -> np.ndarray:
    decode = model.decode
    return np.column_stack([decode.kv_usage, decode.context_length / decode.context_length.max()])


def residual_values(model) -> np.ndarray:
    decode = model.decode
    kv_tokens = decode.kv_usage * decode.max_kv_tokens
    batch = kv_tokens / decode.context_length
    a, b, c = model.decode_plane
    return decode.itl_ms / 1000.0 - (a + b * batch + c * kv_tokens)
