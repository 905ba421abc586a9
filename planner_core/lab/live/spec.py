"""One live run's specification (`RunSpec`) and the planner config it runs: the recommended policy,
time-compressed with the trace, with the run's deployment facts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from planner_core.lab.live.stack import DRAIN_GRACE_S, MODEL_NAME


@dataclass(frozen=True)
class RunSpec:
    """One run of the live stack: the planner (`adaptive`) or a fixed-size pool, on one trace, under one SLA."""

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


def write_config(spec: RunSpec, run_dir: Path, env: dict[str, str], prometheus_url: str) -> Path:
    """The run's planner config: the recommended policy (what `planner serve` runs by default), time-compressed
    with the trace, with the run's deployment facts: aggregated mocker engines on this machine, the slowed
    profile, the run's SLA and budget, the frontend's metrics through Prometheus."""
    import yaml

    from planner_core.data import DEFAULT_CONFIG

    body = compressed_policy(DEFAULT_CONFIG, spec.speedup)
    if spec.interval_s is not None:
        body["throughput_adjustment_interval_seconds"] = round(spec.interval_s)
    body.update(
        {
            "environment": "local",
            "mode": "agg",
            # the closed loop learns separate prefill and decode pools' speeds (disagg only): off on the stack's
            # aggregated engines, as `planner bench --mode agg` runs the recommended policy (with it on, since
            # aedd43b, the config was refused and `planner live` could not start a run)
            "throughput_capacity_feedback": False,
            "namespace": "dynamo",
            "model_name": MODEL_NAME,
            "ttft_ms": spec.ttft_ms,
            "itl_ms": spec.itl_ms,
            "profile_results_dir": str(spec.profile_dir),
            # the fixed-size run: the same planner pinned between min and max (the config needs one loop on)
            "min_endpoint": 1 if spec.adaptive else spec.fixed_size,
            "max_gpu_budget": spec.max_workers if spec.adaptive else spec.fixed_size,
            "metric_pulling_prometheus_endpoint": prometheus_url,
            "execution_interval_seconds": 5,
            "report_interval_hours": None,
            "local_workers": {
                "env": env,
                "discovery_dir": str(run_dir / "kv"),
                "drain_grace_seconds": DRAIN_GRACE_S,
                "nice": spec.nice,
                "initial_decode": spec.initial_size,
            },
        }
    )
    path = run_dir / "planner.yaml"
    path.write_text(yaml.safe_dump(body))
    return path
