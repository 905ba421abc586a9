"""A small recorded history (real ticks, a real execution and acknowledgement) for the report and metrics tests."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from planner_core.domain import Loop, TrafficObservation
from planner_core.runtime.connectors.virtual import VirtualConnectorClient
from planner_core.runtime.service import TickResult, load_context, run_execution, run_tick
from tests.conftest import write_config

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
BUSY = TrafficObservation(duration_s=60, num_req=6000, isl=3000, osl=300, ttft_ms=150.0, itl_ms=12.0)
CALM = TrafficObservation(duration_s=60, num_req=3000, isl=2000, osl=200, ttft_ms=90.0, itl_ms=8.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    deployment: str
    first: TickResult  # throughput at T0, saw 1P/1D (the minimum endpoints), decided to scale
    load: TickResult  # load at T0 + 60 s, saw 3P/2D
    second: TickResult  # throughput at T0 + 60 s, saw 3P/2D
    third: TickResult  # throughput at T0 + 120 s, saw 3P/2D


def record_scenario(database_url: str, directory: Path, deployment: str = "scenario") -> Scenario:
    """Four ticks through the real core and store; prefill engines have 2 GPUs, decode engines 1.

    After the first tick its decision is executed through the virtual connector and acknowledged 30 s later; the
    orchestrator then reports 3 prefill and 2 decode workers ready.
    """
    config = write_config(directory, prefill_engine_num_gpu=2, max_gpu_budget=32, ttft_ms=200, itl_ms=10)
    ctx = load_context(database_url, deployment, config)
    first = run_tick(ctx, Loop.THROUGHPUT, T0, BUSY)
    run_execution(ctx, T0)
    with VirtualConnectorClient(database_url, deployment) as client:
        decision = client.wait(timeout_s=0.0)
        assert decision is not None and decision.decision_id >= 0
        client.complete(decision, at=T0 + dt.timedelta(seconds=30))
        client.report_workers(ready_prefill=3, ready_decode=2)
    load = run_tick(ctx, Loop.LOAD, T0 + dt.timedelta(seconds=60), None)
    second = run_tick(ctx, Loop.THROUGHPUT, T0 + dt.timedelta(seconds=60), CALM)
    third = run_tick(ctx, Loop.THROUGHPUT, T0 + dt.timedelta(seconds=120), BUSY)
    return Scenario(deployment=deployment, first=first, load=load, second=second, third=third)


# Ticks ordered by (time, recording order): T0 1P/1D = 1*2 + 1*1 = 3 GPUs for 60 s; T0+60 load 3P/2D = 3*2 + 2 = 8
# GPUs for 0 s (the throughput tick at the same time follows); T0+60 throughput 8 GPUs for 60 s; T0+120 ends it.
# (3*60 + 8*0 + 8*60) / 3600 = 660 / 3600 GPU-hours.
SCENARIO_GPU_HOURS = 660 / 3600
