"""Serve Dynamo 1.6.1's own planner, tick by tick, over line-delimited JSON on stdin/stdout.

Runs with the Python of a separate virtualenv holding `ai-dynamo` (never the project's own: see README,
"Simulator fidelity"). The project's `planner bench` policy `dynamo-1.6.1` (planner_core/lab/sim/dynamo_policy.py)
starts it once per run and sends one request per planner tick; Dynamo's code makes every decision.

What runs: the planner that Dynamo's offline replay drives (`dynamo.planner.offline.replay_adapter`:
`ReplayPlannerAdapter` around `OrchestratorEngineAdapter`, the builtin local-planner plugins and
`PlannerScalingState`), built from a `PlannerConfig` with the engine capabilities given here, its perf
regressions bootstrapped from a profile directory the way Dynamo's live planner falls back to
`profile_results_dir` (`dynamo.planner.monitoring.perf_metrics`). Each request becomes the snapshot dict that
Dynamo's Rust replay loop hands to `ReplayPlannerAdapter.on_tick`, so the adapter builds the `TickInput`
(worker counts, FPM cache, traffic window) exactly as in Dynamo's own replay.

Usage:
    DYNAMO_PY run_planner.py --config JSON --capabilities JSON [--profile DIR] [--stubs DIR]
    DYNAMO_PY run_planner.py --check        import Dynamo's planner, print {"dynamo_version": ...}, exit

`--config`: PlannerConfig fields (Dynamo's names), inline JSON. `--capabilities`: {"prefill": {...},
"decode": {...}} with EngineCapabilities fields (num_gpu, max_num_batched_tokens, max_num_seqs, max_kv_tokens,
context_length). `--profile` (default the H200 Llama-3.1-8B-FP8 test profile) is also set as the config's
`profile_results_dir`.

Protocol. First line out, once built: {"ready": true, "dynamo_version", "scale_interval_s", "bootstrap": {...},
"next_tick": TICK}. Then per line in:
    {"now_s": t, "ready_prefill_ids": [...], "ready_decode_ids": [...], "starting_prefill": n,
     "starting_decode": n, "traffic": WINDOW or null, "prefill_fpm": [FPM...], "decode_fpm": [FPM...]}
`now_s` must be the pending tick's time. WINDOW: {"duration_s", "num_req", "avg_isl", "avg_osl", "avg_ttft_ms",
"avg_itl_ms", "ttft_count", "itl_count", "avg_kv_hit_rate", "hit_rate_count"} (the Rust replay's per-tick
traffic fields). FPM: {"worker_id", "wall_time", "num_prefill_requests", "sum_prefill_tokens", ...} (the Rust
replay's FPM snapshot fields). One line out per line in:
    {"num_prefill": n|null, "num_decode": n|null, "scale_to": {...}|null, "diagnostics": {...}, "next_tick": TICK}
TICK: {"at_s", "run_load_scaling", "run_throughput_scaling", "need_traffic_metrics", "need_worker_fpm",
"traffic_metrics_duration_s"} or null (the window Dynamo's live planner would query ends at the tick).
`num_prefill`/`num_decode` are the adapter's absolute targets (null: no change). Errors: one line on stderr,
exit status 1 (2 for a bad command line). End of input closes the planner and exits 0.
"""

# ruff: noqa: T201 - a command-line script: its protocol is printed

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

# Found from this file, not imported: the script runs with the Dynamo environment's interpreter, which does not
# have this project installed. The shipped H200 profile and the stand-in `aisimulate_core` package.
_HERE = Path(__file__).resolve().parent
DEFAULT_PROFILE = str(_HERE.parents[1] / "data" / "profiles" / "H200_TP1P_TP1D")
DEFAULT_STUBS = str(_HERE / "stubs")
FPM_FIELDS = (
    "num_prefill_requests",
    "sum_prefill_tokens",
    "var_prefill_length",
    "sum_prefill_kv_tokens",
    "num_decode_requests",
    "sum_decode_kv_tokens",
    "var_decode_kv_tokens",
    "num_queued_prefill",
    "sum_queued_prefill_tokens",
    "var_queued_prefill_length",
    "num_queued_decode",
    "sum_queued_decode_kv_tokens",
    "var_queued_decode_kv_tokens",
)
DIAGNOSTIC_FIELDS = (
    "estimated_ttft_ms",
    "estimated_itl_ms",
    "predicted_num_req",
    "predicted_isl",
    "predicted_osl",
    "predicted_kv_hit_rate",
    "engine_rps_prefill",
    "engine_rps_decode",
    "throughput_lower_bound_prefill",
    "throughput_lower_bound_decode",
    "load_decision_reason",
    "throughput_decision_reason",
    "load_decision_reason_prefill",
    "load_decision_reason_decode",
    "throughput_decision_reason_prefill",
    "throughput_decision_reason_decode",
    "execute_action",
    "short_circuit_reason",
    "reconcile_reasons",
)


def install_perf_model_shim() -> None:
    """Back the stub `aisimulate_core.sdk` forward-pass model with Dynamo's own Python FPM regressions.

    Dynamo 1.6.1's planner asks AISimulate's native wheel (vendor index only; a stub here) for one thing: the
    wall time of a forward pass, from a regression on observed forward passes (`estimation_mode=
    "fpm_regression"`). Everything built on that estimate (queue drain, TTFT/ITL, engine capacity, throughput
    and load scaling) is Dynamo's Python. The same wheel still ships the Python regressions its planner used
    before the native model (`PrefillRegressionModel`: wall time on scheduled prefill tokens;
    `DecodeRegressionModel`: on decode requests and their KV tokens, with bucketed sample retirement); this
    shim puts those behind the native interface. It must run before any `dynamo.planner` import.
    """
    import aisimulate_core.sdk as sdk

    sdk.ForwardPassPerfModelConfig = _perf_model_config_class()
    sdk.RustForwardPassPerfModel = RustForwardPassPerfModel


def _perf_model_config_class() -> type:
    """The native perf model's configuration class, as Dynamo's planner builds it (the shim's stand-in). Made when
    the shim is installed: a dataclass needs its module in `sys.modules`, which a script loaded by path may not be."""
    from dataclasses import dataclass, field

    @dataclass
    class ForwardPassPerfModelConfig:
        model: str = ""
        system: str = ""
        backend: str = "vllm"
        worker_type: str = "decode"
        estimation_mode: str = "fpm_regression"
        tp: int = 1
        pp: int = 1
        estimator_config: dict = field(default_factory=dict)

        @classmethod
        def from_legacy_engine_config(
            cls, _legacy: dict, worker_type: str, options: dict
        ) -> ForwardPassPerfModelConfig:
            # Dynamo passes the engine's legacy description too; the regression needs only the options.
            return cls(worker_type=worker_type, estimator_config=dict(options))

    return ForwardPassPerfModelConfig


class RustForwardPassPerfModel:
    """The native forward-pass model's interface over Dynamo's Python regressions (`install_perf_model_shim`);
    Dynamo is imported only when one is built, inside its own virtualenv."""

    def __init__(self, ais_config: dict) -> None:
        import msgspec
        from dynamo.common.forward_pass_metrics import ForwardPassMetrics
        from dynamo.planner.core.perf_model.decode import DecodeRegressionModel
        from dynamo.planner.core.perf_model.prefill import PrefillRegressionModel

        self._convert = lambda payload: msgspec.convert(payload, ForwardPassMetrics)
        self._worker_type = ais_config["worker_type"]
        options = ais_config.get("estimator_config", {})
        regression = {"prefill": PrefillRegressionModel, "decode": DecodeRegressionModel}.get(self._worker_type)
        if regression is None:
            raise RuntimeError(f"perf model shim: worker type {self._worker_type!r} is not served")
        self._regression = regression(
            int(options.get("max_observations", 64)),
            int(options.get("min_observations", 5)),
            int(options.get("bucket_count", 16)),
        )

    @classmethod
    def best_available(cls, ais_config: dict) -> RustForwardPassPerfModel:
        return cls(ais_config)

    def tune_with_fpms(self, iterations: list) -> None:
        for by_rank in iterations:
            for payload in by_rank:
                self._regression.add_observation(self._convert(payload))

    def diagnostics(self) -> dict:
        fitted = self._regression._ensure_fitted()
        return {
            "source": "dynamo_python_fpm_regression",
            "readiness": "ready" if fitted else "insufficient_observations",
            "retained_observations": self._regression.num_observations,
        }

    def estimate_forward_pass_time_ms(self, by_rank: list) -> float | None:
        if not self._regression._ensure_fitted():
            return None
        wall_s = 0.0
        for payload in by_rank:  # one rank per engine here (no attention data parallelism)
            scheduled = self._convert(payload).scheduled_requests
            if self._worker_type == "prefill":
                rank_s = self._regression._predict_wall_time(float(scheduled.sum_prefill_tokens))
            else:
                rank_s = self._regression._predict_2d(
                    float(scheduled.num_decode_requests), float(scheduled.sum_decode_kv_tokens)
                )
            wall_s = max(wall_s, rank_s)
        return wall_s * 1000.0


class PlannerProtocolError(ValueError):
    """A request line the planner cannot take."""


class _RecordingEngine:
    """Forwards every call to Dynamo's engine and keeps the last tick's `PlannerEffects` (the replay adapter
    returns only the targets; the diagnostics are the decision's reasons)."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.last_effects: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def tick(self, scheduled_tick: Any, tick_input: Any) -> Any:
        self.last_effects = await self._engine.tick(scheduled_tick, tick_input)
        return self.last_effects


def _tick_json(tick: Any) -> dict[str, Any] | None:
    if tick is None:
        return None
    return {
        "at_s": tick.at_s,
        "run_load_scaling": tick.run_load_scaling,
        "run_throughput_scaling": tick.run_throughput_scaling,
        "need_traffic_metrics": tick.need_traffic_metrics,
        "need_worker_fpm": tick.need_worker_fpm,
        "traffic_metrics_duration_s": tick.traffic_metrics_duration_s,
    }


def _finite(value: Any) -> Any:
    """JSON has no NaN/inf: send them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class PlannerServer:
    """Dynamo's replay planner with its tick bookkeeping; one `handle` per request line."""

    def __init__(self, config: dict[str, Any], capabilities: dict[str, Any], profile_dir: str) -> None:
        from dynamo.planner.config.defaults import SubComponentType
        from dynamo.planner.config.planner_config import PlannerConfig
        from dynamo.planner.core.types import EngineCapabilities, WorkerCapabilities
        from dynamo.planner.monitoring.perf_metrics import _convert_profiling_data_to_fpms
        from dynamo.planner.offline.replay_adapter import ReplayPlannerAdapter
        from dynamo.planner.plugins.clock import VirtualClock
        from dynamo.planner.plugins.orchestrator.engine_adapter import OrchestratorEngineAdapter

        planner_config = PlannerConfig.model_validate({**config, "profile_results_dir": profile_dir})
        if planner_config.mode != "disagg":
            raise PlannerProtocolError(f"--config: mode: only 'disagg' is served, got {planner_config.mode!r}")
        # As Dynamo's replay does: the planner only proposes; the caller applies the targets.
        planner_config.advisory = True
        caps = WorkerCapabilities(
            prefill=EngineCapabilities(**capabilities.get("prefill", {})),
            decode=EngineCapabilities(**capabilities.get("decode", {})),
        )
        # The same construction as dynamo.planner.offline.replay_adapter.create_replay_planner_adapter, with the
        # engine wrapped to read the effects back.
        self._engine = _RecordingEngine(OrchestratorEngineAdapter(planner_config, caps, clock=VirtualClock()))
        self._adapter = ReplayPlannerAdapter(
            planner_config=planner_config, engine=self._engine, capabilities=caps, capture_details=False
        )
        bootstrap: dict[str, Any] = {"source": "profile_results_dir", "profile_dir": profile_dir}
        if planner_config.optimization_target == "sla":
            # Dynamo's live planner, with no benchmark endpoint and no AIC spec, bootstraps its perf regressions
            # from profile_results_dir; its replay installs benchmark FPMs through the same engine call.
            prefill_fpms = _convert_profiling_data_to_fpms(profile_dir, SubComponentType.PREFILL)
            decode_fpms = _convert_profiling_data_to_fpms(profile_dir, SubComponentType.DECODE)
            if not prefill_fpms or not decode_fpms:
                raise PlannerProtocolError(f"--profile {profile_dir}: no prefill or decode profiling data")
            self._adapter.install_benchmark_fpms(prefill_fpms=prefill_fpms, decode_fpms=decode_fpms)
            bootstrap.update(prefill_fpms=len(prefill_fpms), decode_fpms=len(decode_fpms))
        self._adapter.start()
        self.scale_interval_s = float(planner_config.scheduling.scale_interval_seconds)
        self.bootstrap = bootstrap
        self._ordinal = 0

    @property
    def pending_tick(self) -> Any:
        return self._adapter._pending_tick

    def close(self) -> None:
        self._adapter.close()

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        tick = self.pending_tick
        now_s = float(request["now_s"])
        if abs(now_s - tick.at_s) > 1e-6:
            raise PlannerProtocolError(f"request {self._ordinal}: now_s {now_s} is not the pending tick {tick.at_s}")
        ready_p = [str(i) for i in request.get("ready_prefill_ids", [])]
        ready_d = [str(i) for i in request.get("ready_decode_ids", [])]
        # The Rust replay's snapshot: `active_*` are the serving workers; `non_draining_*` also count the ones
        # starting, which is what a target is compared against (a pool left alone keeps its starting workers).
        snapshot = {
            "tick_ordinal": self._ordinal,
            "active_prefill_count": len(ready_p),
            "active_decode_count": len(ready_d),
            "non_draining_prefill_count": len(ready_p) + int(request.get("starting_prefill", 0)),
            "non_draining_decode_count": len(ready_d) + int(request.get("starting_decode", 0)),
            "active_prefill_ids": ready_p,
            "active_decode_ids": ready_d,
            "prefill_fpm_snapshots": [_fpm_snapshot(f) for f in request.get("prefill_fpm", [])],
            "decode_fpm_snapshots": [_fpm_snapshot(f) for f in request.get("decode_fpm", [])],
        }
        if request.get("traffic") is not None:
            snapshot["traffic"] = dict(request["traffic"])
        self._ordinal += 1
        decision = self._adapter.on_tick(snapshot)
        effects = self._engine.last_effects
        diagnostics = asdict(effects.diagnostics) if effects is not None else {}
        return {
            "num_prefill": decision["target_prefill"],
            "num_decode": decision["target_decode"],
            "scale_to": None if effects is None or effects.scale_to is None else asdict(effects.scale_to),
            "diagnostics": {
                k: _finite(diagnostics[k]) for k in DIAGNOSTIC_FIELDS if diagnostics.get(k) not in (None, "", {})
            },
            "next_tick": _tick_json(effects.next_tick if effects is not None else None),
        }


def _fpm_snapshot(fpm: dict[str, Any]) -> dict[str, Any]:
    snapshot = {"worker_id": str(fpm["worker_id"]), "dp_rank": int(fpm.get("dp_rank", 0))}
    snapshot["wall_time"] = float(fpm.get("wall_time", 0.0))
    for name in FPM_FIELDS:
        snapshot[name] = fpm.get(name, 0)
    return snapshot


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="PlannerConfig fields, inline JSON (required unless --check)")
    parser.add_argument("--check", action="store_true", help="only check that Dynamo's planner imports")
    parser.add_argument("--capabilities", default="{}", help='{"prefill": {...}, "decode": {...}}, inline JSON')
    parser.add_argument("--profile", default=DEFAULT_PROFILE)
    parser.add_argument("--stubs", default=DEFAULT_STUBS)
    return parser.parse_args(argv)


def _emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message, allow_nan=False) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    args = _parse(argv)
    # Dynamo logs to stderr at INFO per tick; only warnings are worth passing on to the caller's terminal.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    sys.path.insert(0, args.stubs)
    try:
        import aisimulate_core  # noqa: F401 - the stub must be importable before dynamo is

        install_perf_model_shim()
        from dynamo.planner import _version
        from dynamo.planner.offline import replay_adapter  # noqa: F401 - the entry point must import

        if args.check:
            _emit({"dynamo_version": getattr(_version, "__version__", "unknown")})
            return 0
        if args.config is None:
            raise PlannerProtocolError("--config is required")
        config = json.loads(args.config)
        capabilities = json.loads(args.capabilities)
        server = PlannerServer(config, capabilities, args.profile)
    except Exception as exc:  # one line for the caller, whatever failed
        print(f"run_planner: cannot start Dynamo's planner: {type(exc).__name__}: {exc}".replace("\n", " "),
              file=sys.stderr)  # fmt: skip
        return 1
    _emit(
        {
            "ready": True,
            "dynamo_version": getattr(_version, "__version__", "unknown"),
            "scale_interval_s": server.scale_interval_s,
            "bootstrap": server.bootstrap,
            "next_tick": _tick_json(server.pending_tick),
        }
    )
    try:
        for number, line in enumerate(sys.stdin, start=1):
            if not line.strip():
                continue
            try:
                request = json.loads(line)
                _emit(server.handle(request))
            except Exception as exc:
                message = f"{type(exc).__name__}: {exc}".replace("\n", " ")
                print(f"run_planner: request line {number}: {message}", file=sys.stderr)
                return 1
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
