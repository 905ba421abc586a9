"""One live run's specification (`RunSpec`) and the planner config it runs: the recommended policy,
time-compressed with the trace, with the run's deployment facts (disaggregated prefill and decode pools, or one
aggregated pool)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from planner_core.lab.live.stack import DRAIN_GRACE_S, MODEL_NAME


@dataclass(frozen=True)
class RunSpec:
    """One run of the live stack: the planner (`adaptive`) or fixed-size pools, on one trace, under one SLA.

    `fixed_size` and `initial_size` are the decode pool's (in mode agg: the one aggregated pool's); `fixed_prefill`
    and `initial_prefill` the prefill pool's (mode disagg only)."""

    name: str
    adaptive: bool
    fixed_size: int
    duration_s: float
    ttft_ms: float
    itl_ms: float
    interval_s: float | None  # None: the policy's own, divided by the trace compression
    max_workers: int
    trace: Path
    nice: int
    profile_dir: Path
    cooldown_s: float
    router: str = "round-robin"  # or "slo": the frontend in direct mode behind `planner route-proxy`
    speedup: float = 1.0  # the trace's time compression: the policy's time constants are divided by it
    initial_size: int = 1  # engines running when the run starts (the deployment the planner takes over)
    traffic: str = ""  # what the trace is (kind, rates, requests), kept in the run's figures
    command: str = ""  # the `planner live` command line and the code's commit, kept in the run's figures
    commit: str | None = None
    mode: str = "agg"  # or "disagg": prefill and decode mocker engines, each pool scaled by the planner
    fixed_prefill: int = 0  # disagg: prefill engines of the fixed-size run
    initial_prefill: int = 0  # disagg: prefill engines running when the run starts

    @property
    def disaggregated(self) -> bool:
        return self.mode == "disagg"


def compressed_policy(policy: Path, speedup: float) -> dict:
    """A policy file's settings with every time constant (`*_seconds`: the throughput window, the scale-down hold,
    the assumed start-up) divided by the trace's compression: traffic replayed `speedup` times faster rises and
    falls that much sooner, so the policy sees the same number of windows per rise as on the uncompressed trace."""
    import yaml

    body = yaml.safe_load(policy.read_text())
    for key, value in list(body.items()):
        if key.endswith("_seconds") and isinstance(value, int | float) and not isinstance(value, bool):
            scaled = value / speedup
            # the adjustment intervals are whole seconds
            body[key] = max(1, round(scaled)) if key.endswith("interval_seconds") else scaled
    return body


# `planner live --router`: the router in front of the engines, as the planner config names it (`RouterKind`)
LIVE_ROUTER_KIND = {"round-robin": "round_robin", "slo": "slo"}

WORKER_TARGETS_FILE = "prometheus-workers.json"  # in the run's folder: the engines Prometheus scrapes (file discovery)


def write_config(spec: RunSpec, run_dir: Path, env: dict[str, str], prometheus_url: str) -> Path:
    """The run's planner config: the recommended policy (what `planner serve` runs by default), time-compressed
    with the trace, with the run's deployment facts: mocker engines on this machine (prefill and decode pools, or
    one aggregated pool), the slowed profile, the run's SLA and budget, the frontend's metrics through Prometheus.
    The fixed-size run is the same planner pinned: each pool's minimum at its fixed size and the budget their sum."""
    import yaml

    from planner_core.data import DEFAULT_CONFIG

    body = compressed_policy(DEFAULT_CONFIG, spec.speedup)
    if spec.interval_s is not None:
        body["throughput_adjustment_interval_seconds"] = round(spec.interval_s)
    if not spec.disaggregated:
        # the closed loop learns separate prefill and decode pools' speeds (disagg only): off on aggregated
        # engines, as `planner bench --mode agg` runs the recommended policy (with it on, since aedd43b, the config
        # was refused and `planner live` could not start a run)
        body["throughput_capacity_feedback"] = False
    # the router the frontend runs, which the throughput loop sizes for (round robin: each prefill engine its own
    # queue, `policy/dispatch.py`), as `planner bench --engine dynamo` tells the planners
    body["router"] = LIVE_ROUTER_KIND[spec.router]
    fixed_budget = spec.fixed_size + (spec.fixed_prefill if spec.disaggregated else 0)
    body.update(
        {
            "environment": "local",
            "mode": spec.mode,
            "namespace": "dynamo",
            "model_name": MODEL_NAME,
            "ttft_ms": spec.ttft_ms,
            "itl_ms": spec.itl_ms,
            "profile_results_dir": str(spec.profile_dir),
            # the fixed-size run: the same planner pinned between min and max (the config needs one loop on)
            "min_endpoint": 1 if spec.adaptive or spec.disaggregated else spec.fixed_size,
            "max_gpu_budget": spec.max_workers if spec.adaptive else fixed_budget,
            "metric_pulling_prometheus_endpoint": prometheus_url,
            "execution_interval_seconds": 5,
            "report_interval_hours": None,
            "local_workers": {
                "env": env,
                "discovery_dir": str(run_dir / "kv"),
                "drain_grace_seconds": DRAIN_GRACE_S,
                "nice": spec.nice,
                "initial_decode": spec.initial_size,
                "metrics_targets_file": str(run_dir / WORKER_TARGETS_FILE),
            },
        }
    )
    if spec.disaggregated:
        body["local_workers"]["initial_prefill"] = spec.initial_prefill
        if not spec.adaptive:
            body.update({"prefill_min_endpoint": spec.fixed_prefill, "decode_min_endpoint": spec.fixed_size})
    path = run_dir / "planner.yaml"
    path.write_text(yaml.safe_dump(body))
    return path
