"""Router `slo` in the simulator (planner_core.lab.sim.des with planner_core.routing): placement by predicted
latency at both stages, the explicit no-endpoint outcomes (frontend queue, rejection), adaptive disaggregation, the
unplaced-request report the planner reads, and the load loop's scale-up on it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from planner_core.domain import Component, ReasonCode, UnplacedRequests
from planner_core.lab.sim.bench import prediction_errors
from planner_core.lab.sim.des import ClusterSimulator, NoEndpointAction, RouterPolicy, SimSpec, SloRouting
from planner_core.policy.load import calculate_load_replicas
from planner_core.routing.predictor import LatencyPredictor
from planner_core.routing.scheduler import SloTargets
from planner_core.routing.tables import tables_from_forward_model
from tests.core.fakes import FWD, make_trace
from tests.core.test_load_policy import MODEL, by_step, headline, inputs, prefill_fleet

CHUNK = 8192  # EngineLimits' default max_num_batched_tokens
TTFT_TABLE, TPOT_TABLE = tables_from_forward_model(
    FWD, chunk_tokens=CHUNK, metadata={}, batch_sizes=(1, 2, 4, 8, 16), tokens_per_request=(100, 1000, 10000)
)
PREDICTOR = LatencyPredictor(TTFT_TABLE, TPOT_TABLE)


def slo_spec(ttft_ms: float, tpot_ms: float = 1000.0, **routing: object) -> SimSpec:
    settings = SloRouting(predictor=PREDICTOR, targets=SloTargets(ttft_ms=ttft_ms, tpot_ms=tpot_ms))
    return SimSpec(
        router=RouterPolicy.SLO, first_token_from_decode=False, slo_routing=dataclasses.replace(settings, **routing)
    )


def run(trace, spec: SimSpec, *, num_prefill: int = 1, num_decode: int = 1):
    sim = ClusterSimulator(trace, FWD, spec, num_prefill=num_prefill, num_decode=num_decode)
    sim.run_to_completion()
    return sim, sim.result()


def test_router_slo_needs_its_settings() -> None:
    with pytest.raises(ValueError, match="router 'slo' needs SimSpec.slo_routing"):
        ClusterSimulator(
            make_trace([0.0], [10], [2]), FWD, SimSpec(router=RouterPolicy.SLO), num_prefill=1, num_decode=1
        )


def test_prediction_is_exact_on_an_idle_engine() -> None:
    # one prompt on an idle prefill engine: the table is the engine's own model, so predicted = measured
    _, result = run(make_trace([0.0], [3000], [2]), slo_spec(ttft_ms=500))
    assert result.predicted_ttft_ms[0] == pytest.approx(1000 * FWD.prefill_wall_s(3000))
    assert result.ttft_s[0] == pytest.approx(FWD.prefill_wall_s(3000))


def test_slo_spreads_requests_by_predicted_ttft() -> None:
    # 8 prompts of 4000 tokens at t=0 on 4 engines: each goes to the engine with the least queued work, 2 each
    _, result = run(make_trace([0.0] * 8, [4000] * 8, [2] * 8), slo_spec(ttft_ms=500), num_prefill=4)
    assert sorted(result.ttft_s.tolist()) == pytest.approx([0.05] * 4 + [0.1] * 4)
    assert result.num_unplaced == 0
    # the second wave was predicted behind the first prompt (one chunk of 8000 tokens: 0.09 s), measured 0.1 s
    assert sorted(result.predicted_ttft_ms.tolist()) == pytest.approx([50.0] * 4 + [90.0] * 4)


@pytest.mark.parametrize(
    ("action", "served", "rejected"),
    [(NoEndpointAction.QUEUE, True, 0), (NoEndpointAction.REJECT, False, 1)],
)
def test_no_available_endpoint_is_queued_or_rejected_and_counted(
    action: NoEndpointAction, served: bool, rejected: int
) -> None:
    # TTFT target 60 ms: the first prompt (50 ms) fits; the second, behind it, is predicted 90 ms: no endpoint.
    spec = slo_spec(ttft_ms=60, no_endpoint=action, adaptive_pd=False)
    sim, result = run(make_trace([0.0, 0.0], [4000, 4000], [2, 2]), spec)
    assert result.num_unplaced == 1
    assert result.num_rejected == rejected
    assert bool(np.isfinite(result.finish_s[1])) is served
    if served:
        # it waited at the frontend until the first prompt was done (retried every 50 ms: placed at 0.05 s, when
        # the engine is idle again and the prediction 50 ms fits), then took its own 50 ms
        assert result.ttft_s[1] == pytest.approx(0.1)
        assert result.num_overdue == 0
    report = sim.unplaced(0.0, 1.0)
    prefill = next(r for r in report if r.component is Component.PREFILL)
    assert (prefill.num_unplaced, prefill.num_rejected, prefill.num_waiting) == (1, rejected, 0)
    assert sim.unplaced(0.5, 1.0)[0].num_unplaced == 0  # counted in the window it happened in


def test_queued_request_is_placed_anyway_past_its_max_wait() -> None:
    # a 20000-token prompt takes 0.21 s even alone: never within a 100 ms target; after max_wait_s it goes to the
    # lowest predicted engine whatever the prediction
    spec = slo_spec(ttft_ms=100, adaptive_pd=False, max_wait_s=0.2)
    _, result = run(make_trace([0.0], [20000], [2]), spec)
    assert (result.num_unplaced, result.num_overdue) == (1, 1)
    assert result.ttft_s[0] == pytest.approx(
        0.2 + 2 * FWD.prefill_wall_s(CHUNK) + FWD.prefill_wall_s(20000 - 2 * CHUNK)
    )


def test_adaptive_disaggregation_prefills_a_short_prompt_on_a_decode_engine() -> None:
    # A prompt of two full chunks (2 x 91.92 ms) keeps the prefill engine busy; a 500-token prompt arriving then is
    # predicted behind it at 198.8 ms. With a 190 ms target the prefill stage has no endpoint for it, so the idle
    # decode engine prefills it itself (15 ms) and decodes it there: no frontend wait, no transfer.
    trace = make_trace([0.0, 0.001], [2 * CHUNK, 500], [2, 10])
    _, result = run(trace, slo_spec(ttft_ms=300, adaptive_max_prompt_tokens=1024))
    assert result.num_local_prefills == 0  # with 300 ms the prefill engine is predicted in time
    _, result = run(trace, slo_spec(ttft_ms=190, adaptive_max_prompt_tokens=1024))
    assert (result.num_local_prefills, result.num_unplaced) == (1, 0)
    assert result.predicted_ttft_ms[1] == pytest.approx(15.0)
    assert result.ttft_s[1] == pytest.approx(FWD.prefill_wall_s(500))
    assert np.isfinite(result.finish_s).all()
    assert result.itl_s[1] == pytest.approx(FWD.decode_wall_s(1, 500 + 4.5), rel=1e-3)  # it decodes on that engine
    # a prompt above the limit is not prefilled on a decode engine: it waits at the frontend
    _, result = run(trace, slo_spec(ttft_ms=190, adaptive_max_prompt_tokens=400))
    assert (result.num_local_prefills, result.num_unplaced) == (0, 1)
    assert np.isfinite(result.finish_s).all()


def test_decode_stage_avoids_the_engine_predicted_slow() -> None:
    # TPOT target 6 ms: one decode engine gets the first (long-context) request; the second request goes to the
    # other engine (lowest predicted TPOT); with a 5.3 ms target no engine is within it for a 10k-token context
    trace = make_trace([0.0, 0.001], [10000, 100], [50, 50])
    _, result = run(trace, slo_spec(ttft_ms=1000, tpot_ms=6.0), num_decode=2)
    assert result.num_unplaced == 0
    assert result.predicted_tpot_ms[1] == pytest.approx(1000 * FWD.decode_wall_s(1, 100), rel=1e-6)
    _, tight = run(make_trace([0.0], [10000], [50]), slo_spec(ttft_ms=1000, tpot_ms=5.1, max_wait_s=0.3), num_decode=1)
    assert (tight.num_unplaced, tight.num_overdue) == (1, 1)
    assert np.isfinite(tight.finish_s[0])


def test_prediction_errors_compare_with_the_measured_latencies() -> None:
    trace = make_trace([0.0, 0.0, 0.0], [3000, 3000, 3000], [20, 20, 20])
    _, result = run(trace, slo_spec(ttft_ms=1000))
    errors = prediction_errors(result, trace)
    assert errors is not None and errors.num_ttft == 3 and errors.num_tpot == 3
    assert errors.ttft_p50 == pytest.approx(0.0, abs=1e-9)  # idle-engine chunks: the model itself
    assert errors.tpot_p90 is not None and errors.tpot_p90 >= errors.tpot_p50 >= 0
    # other routers make no predictions
    _, blind = run(trace, SimSpec(first_token_from_decode=False))
    assert blind.predicted_ttft_ms is None and prediction_errors(blind, trace) is None


HOLD = ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION


@pytest.mark.parametrize(
    ("queued", "unplaced", "expected_reason", "desired"),
    [
        # two prefill engines whose queues hold them (one fewer would break the TTFT budget)
        ((12000, 12000), None, HOLD, 2),
        ((12000, 12000), UnplacedRequests(component=Component.PREFILL), HOLD, 2),
        ((12000, 12000), UnplacedRequests(component=Component.PREFILL, num_unplaced=3, num_rejected=1), "up", 3),
        ((12000, 12000), UnplacedRequests(component=Component.PREFILL, num_waiting=1), "up", 3),
        # idle engines would scale down; requests the router could not place turn that into one up
        ((0, 0), None, ReasonCode.SCALE_DOWN, 1),
        ((0, 0), UnplacedRequests(component=Component.PREFILL, num_unplaced=1), "up", 3),
        # engines already over the SLA scale up anyway: still one replica, not two
        ((90000, 90000), UnplacedRequests(component=Component.PREFILL, num_unplaced=1), "up", 3),
    ],
)
def test_load_loop_scales_up_on_unplaced_requests(
    queued: tuple[int, int], unplaced: UnplacedRequests | None, expected_reason: object, desired: int
) -> None:
    fpm = prefill_fleet(queued)
    value, steps = calculate_load_replicas(inputs(Component.PREFILL, fpm, unplaced=unplaced), MODEL)
    assert value == desired
    assert headline(steps) is (ReasonCode.SCALE_UP if expected_reason == "up" else expected_reason)
    signal = by_step(steps, "unplaced_signal")
    assert len(signal) == (0 if unplaced is None else 1)
    if expected_reason == "up":
        assert signal[0].reason is ReasonCode.UNPLACED_REQUESTS
