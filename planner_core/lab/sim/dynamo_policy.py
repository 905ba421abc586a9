"""Dynamo 1.6.1's own planner as a `planner bench` policy, run in Dynamo's separate virtualenv.

Role: a peer baseline. The decisions come from Dynamo's code (`planner_core/lab/dynamo/run_planner.py`, started with the
Python of a virtualenv holding `ai-dynamo`; see README, "Simulator fidelity"), not from this project's planner.
This module maps the simulator's view to that script's line-delimited JSON protocol and back:

- each planner tick (Dynamo's `scale_interval`, the greatest common divisor of its load and throughput
  intervals) sends the ready engines (their ids), the starting ones (a count), every ready engine's
  forward-pass snapshot (`ClusterSimulator.latest_fpm`), and, when Dynamo asked for traffic at that tick, the
  frontend's view of the window it asked for (`ClusterSimulator.observe` over the declared duration, with the
  prefix-cache hit rate of the window's requests when the trace has prefix blocks);
- the answer is Dynamo's absolute targets (None: no change), applied at once (start-up delays still apply).

The mapping functions are pure (tested without Dynamo); `DynamoPlannerPolicy` owns the subprocess.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from planner_core.domain import Component, EngineLimits, ForwardPassMetrics, TrafficObservation, WorkerCounts
from planner_core.lab.sim.des import ClusterSimulator, SimSpec

DYNAMO_VERSION = "1.6.1"
DYNAMO_PYTHON_ENV = "DYNAMO_PYTHON"
RUN_PLANNER_SCRIPT = Path(__file__).resolve().parents[1] / "dynamo" / "run_planner.py"
# `make dynamo-env` builds the comparison environment here, in the checkout (absent from an installed package).
DYNAMO_ENV_PYTHON = Path(__file__).resolve().parents[3] / ".dynamo-venv" / "bin" / "python"

# Dynamo's planner in its two SLA modes; every field not set here or by the bench's base config (SLA targets,
# GPU budget, throughput interval, per-step replica limit) keeps Dynamo's default (ARIMA predictor, 5 s load
# interval, min_endpoint 1, ...).
DYNAMO_PRESETS: dict[str, dict[str, object]] = {
    f"dynamo-{DYNAMO_VERSION}": {"enable_throughput_scaling": True, "enable_load_scaling": False},
    f"dynamo-{DYNAMO_VERSION}-load": {"enable_throughput_scaling": True, "enable_load_scaling": True},
}
# Bench base-config fields that carry over under the same name (they are Dynamo's names).
_BASE_FIELDS = ("ttft_ms", "itl_ms", "max_gpu_budget", "throughput_adjustment_interval_seconds",
                "max_throughput_scaling_replicas", "load_adjustment_interval_seconds")  # fmt: skip
_DYNAMO_LOAD_INTERVAL_S = 5  # Dynamo's default load_adjustment_interval_seconds
_TICK_TOLERANCE_S = 1e-6


class DynamoPlannerError(ValueError):
    """Dynamo's planner could not be started or stopped answering (one line, for the CLI)."""


def dynamo_config(base: dict[str, object], preset: str) -> dict[str, object]:
    """Dynamo `PlannerConfig` fields for a preset: disaggregated SLA mode, the bench's shared fields, the rest
    Dynamo's defaults."""
    if preset not in DYNAMO_PRESETS:
        raise ValueError(f"--policies: unknown Dynamo preset {preset!r} (known: {', '.join(DYNAMO_PRESETS)})")
    config: dict[str, object] = {"mode": "disagg", "optimization_target": "sla"}
    config.update({name: base[name] for name in _BASE_FIELDS if name in base})
    config.update(DYNAMO_PRESETS[preset])
    return config


def scale_interval_s(config: dict[str, object]) -> float:
    """Dynamo's pipeline cadence when not configured: the gcd of the load interval and, when throughput scaling
    is on, the throughput interval (whole seconds here)."""
    intervals = [int(config.get("load_adjustment_interval_seconds", _DYNAMO_LOAD_INTERVAL_S))]
    if config.get("enable_throughput_scaling", True):
        intervals.append(int(config.get("throughput_adjustment_interval_seconds", 180)))
    return float(math.gcd(*intervals))


def engine_capabilities(spec: SimSpec) -> dict[str, dict[str, int]]:
    """The simulated engines' limits as Dynamo's per-role `EngineCapabilities` fields."""

    def role(limits: EngineLimits) -> dict[str, int]:
        caps = {
            "num_gpu": limits.num_gpu,
            "max_num_batched_tokens": limits.max_num_batched_tokens,
            "max_num_seqs": limits.max_num_seqs,
            "max_kv_tokens": limits.max_kv_tokens,
        }
        if limits.context_length is not None:
            caps["context_length"] = limits.context_length
        return caps

    return {"prefill": role(spec.prefill_limits), "decode": role(spec.decode_limits)}


def fpm_message(fpm: ForwardPassMetrics) -> dict[str, Any]:
    """One engine's snapshot in the field names of Dynamo's replay FPM snapshots."""
    scheduled, queued = fpm.scheduled, fpm.queued
    return {
        "worker_id": fpm.worker_id,
        "dp_rank": fpm.dp_rank,
        "wall_time": fpm.wall_time_s,
        "num_prefill_requests": scheduled.num_prefill_requests,
        "sum_prefill_tokens": scheduled.sum_prefill_tokens,
        "var_prefill_length": scheduled.var_prefill_length,
        "sum_prefill_kv_tokens": scheduled.sum_prefill_kv_tokens,
        "num_decode_requests": scheduled.num_decode_requests,
        "sum_decode_kv_tokens": scheduled.sum_decode_kv_tokens,
        "var_decode_kv_tokens": scheduled.var_decode_kv_tokens,
        "num_queued_prefill": queued.num_prefill_requests,
        "sum_queued_prefill_tokens": queued.sum_prefill_tokens,
        "var_queued_prefill_length": queued.var_prefill_length,
        "num_queued_decode": queued.num_decode_requests,
        "sum_queued_decode_kv_tokens": queued.sum_decode_kv_tokens,
        "var_queued_decode_kv_tokens": queued.var_decode_kv_tokens,
    }


def traffic_message(traffic: TrafficObservation, *, kv_hit_rate: float | None, kv_hit_count: int) -> dict[str, Any]:
    """A window in the fields of Dynamo's replay traffic stats. Means that are unknown go as 0 with a zero
    sample count (how Dynamo's replay reports an empty statistic); the TTFT/ITL sample counts are not known
    here, so the window's request count stands in for them (Dynamo uses them only as merge weights)."""
    known = traffic.num_req
    return {
        "duration_s": traffic.duration_s,
        "num_req": traffic.num_req,
        "avg_isl": traffic.isl,
        "avg_osl": traffic.osl,
        "shape_count": known,
        "avg_ttft_ms": traffic.ttft_ms if traffic.ttft_ms is not None else 0.0,
        "ttft_count": known if traffic.ttft_ms is not None else 0.0,
        "avg_itl_ms": traffic.itl_ms if traffic.itl_ms is not None else 0.0,
        "itl_count": known if traffic.itl_ms is not None else 0.0,
        "avg_kv_hit_rate": kv_hit_rate if kv_hit_rate is not None else 0.0,
        "hit_rate_count": float(kv_hit_count) if kv_hit_rate is not None else 0.0,
    }


def tick_request(
    now_s: float,
    fpms: Sequence[ForwardPassMetrics],
    counts: WorkerCounts,
    traffic: dict[str, Any] | None,
) -> dict[str, Any]:
    """One protocol request: the ready engines are the ones with a snapshot (the simulator reports every ready
    engine); starting ones are the expected minus the ready."""
    prefill = [f for f in fpms if f.component is Component.PREFILL]
    decode = [f for f in fpms if f.component is Component.DECODE]
    return {
        "now_s": now_s,
        "ready_prefill_ids": [f.worker_id for f in prefill],
        "ready_decode_ids": [f.worker_id for f in decode],
        "starting_prefill": max(0, counts.expected_prefill - counts.ready_prefill),
        "starting_decode": max(0, counts.expected_decode - counts.ready_decode),
        "traffic": traffic,
        "prefill_fpm": [fpm_message(f) for f in prefill],
        "decode_fpm": [fpm_message(f) for f in decode],
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class DynamoTick:
    """What Dynamo answered for one tick, and what it wants at the next."""

    num_prefill: int | None
    num_decode: int | None
    next_tick_s: float | None
    need_traffic: bool
    traffic_window_s: float
    diagnostics: dict[str, Any] = dataclasses.field(default_factory=dict)


def parse_tick(line: str, *, source: str) -> DynamoTick:
    """A response (or the handshake) line. Raises DynamoPlannerError naming the field on a malformed line."""
    try:
        message = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DynamoPlannerError(f"{source}: not a JSON line: {line.strip()[:200]!r}") from exc
    if not isinstance(message, dict):
        raise DynamoPlannerError(f"{source}: not a JSON object: {line.strip()[:200]!r}")
    targets = []
    for field in ("num_prefill", "num_decode"):
        value = message.get(field)
        if value is not None and (not isinstance(value, int) or value < 0):
            raise DynamoPlannerError(f"{source}: {field}: not a replica count: {value!r}")
        targets.append(value)
    upcoming = message.get("next_tick")
    if upcoming is not None and not isinstance(upcoming, dict):
        raise DynamoPlannerError(f"{source}: next_tick: not an object: {upcoming!r}")
    upcoming = upcoming or {}
    return DynamoTick(
        num_prefill=targets[0],
        num_decode=targets[1],
        next_tick_s=float(upcoming["at_s"]) if "at_s" in upcoming else None,
        need_traffic=bool(upcoming.get("need_traffic_metrics", False)),
        traffic_window_s=float(upcoming.get("traffic_metrics_duration_s", 0.0)),
        diagnostics=dict(message.get("diagnostics") or {}),
    )


def find_dynamo_python(python: str | None = None) -> str | None:
    """The Dynamo comparison interpreter: `python` (--dynamo-python), else $DYNAMO_PYTHON, else the checkout's
    `.dynamo-venv` when `make dynamo-env` has built it; None when there is none."""
    if python or os.environ.get(DYNAMO_PYTHON_ENV):
        return python or os.environ.get(DYNAMO_PYTHON_ENV)
    return str(DYNAMO_ENV_PYTHON) if DYNAMO_ENV_PYTHON.is_file() else None


def check_dynamo_python(python: str | None, *, script: Path = RUN_PLANNER_SCRIPT) -> str:
    """The Dynamo interpreter to use (`find_dynamo_python`), checked to import Dynamo's planner.
    Returns the version; raises DynamoPlannerError with a one-line reason."""
    python = find_dynamo_python(python)
    if not python:
        raise DynamoPlannerError(
            f"dynamo-{DYNAMO_VERSION}: no Dynamo interpreter: run `make dynamo-env`, or pass --dynamo-python PATH "
            f"or set {DYNAMO_PYTHON_ENV} (a virtualenv with ai-dynamo {DYNAMO_VERSION})"
        )
    if not script.is_file():
        raise DynamoPlannerError(f"dynamo-{DYNAMO_VERSION}: {script}: the planner script is missing")
    try:
        done = subprocess.run(
            [python, str(script), "--check"], capture_output=True, text=True, timeout=120, check=False
        )
    except OSError as exc:
        raise DynamoPlannerError(f"dynamo-{DYNAMO_VERSION}: --dynamo-python {python}: {exc.strerror}") from exc
    if done.returncode != 0:
        raise DynamoPlannerError(
            f"dynamo-{DYNAMO_VERSION}: --dynamo-python {python}: cannot import Dynamo's planner: "
            + _last_line(done.stderr)
        )
    version = json.loads(done.stdout.strip().splitlines()[-1]).get("dynamo_version", "unknown")
    if version != DYNAMO_VERSION:
        raise DynamoPlannerError(
            f"dynamo-{DYNAMO_VERSION}: --dynamo-python {python}: has ai-dynamo {version}, not {DYNAMO_VERSION}"
        )
    return version


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    ours = [line for line in lines if line.startswith("run_planner:")]
    return (ours or lines or ["(no message)"])[-1]


@dataclass(slots=True)
class DynamoPlannerPolicy:
    """Dynamo's planner in the loop through `planner_core/lab/dynamo/run_planner.py`, one subprocess per run."""

    name: str
    python: str
    config: dict[str, object]  # Dynamo PlannerConfig fields
    capabilities: dict[str, dict[str, int]]
    initial_size: tuple[int, int]
    profile_dir: Path | None = None  # None: the script's default (the H200 test profile)
    startup_s: float | None = None
    script: Path = RUN_PLANNER_SCRIPT
    ticks: list[tuple[float, DynamoTick]] = dataclasses.field(default_factory=list)  # every answer of the run
    _process: subprocess.Popen | None = None
    _stderr: IO[bytes] | None = None
    _pending: DynamoTick | None = None

    @property
    def interval_s(self) -> float:
        return scale_interval_s(self.config)

    def initial(self) -> tuple[int, int]:
        self.close()
        self.ticks = []
        self._start()
        return self.initial_size

    def decide(self, now_s: float, sim: ClusterSimulator) -> tuple[int | None, int | None] | None:
        if self._process is None:
            self._start()
        pending = self._pending
        assert pending is not None
        if pending.next_tick_s is None or now_s < pending.next_tick_s - _TICK_TOLERANCE_S:
            return None
        traffic = None
        if pending.need_traffic:
            window_s = pending.traffic_window_s or self.interval_s
            traffic = self._traffic(sim, max(0.0, now_s - window_s), now_s)
        request = tick_request(now_s, sim.latest_fpm(), sim.worker_counts(), traffic)
        answer = self._exchange(request)
        self._pending = answer
        self.ticks.append((now_s, answer))
        if answer.num_prefill is None and answer.num_decode is None:
            return None
        return answer.num_prefill, answer.num_decode

    def close(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            assert process.stdin is not None
            process.stdin.close()  # end of input: the script shuts Dynamo's planner down and exits
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            for stream in (process.stdout,):
                if stream is not None:
                    stream.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        self._pending = None

    # --- internals -----------------------------------------------------------------------------------------

    def _start(self) -> None:
        command = [str(self.python), str(self.script), "--config", json.dumps(self.config),
                   "--capabilities", json.dumps(self.capabilities)]  # fmt: skip
        if self.profile_dir is not None:
            command += ["--profile", str(self.profile_dir)]
        # Dynamo logs every tick at INFO; its warnings are enough, and they go to a file so a full pipe never
        # blocks it (the last line names what failed).
        self._stderr = tempfile.TemporaryFile()
        env = {**os.environ, "DYN_LOG": os.environ.get("DYN_LOG", "warn")}
        try:
            self._process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True, env=env
            )
        except OSError as exc:
            raise DynamoPlannerError(f"{self.name}: {self.python}: {exc.strerror}") from exc
        self._pending = self._read("handshake")

    def _traffic(self, sim: ClusterSimulator, start_s: float, end_s: float) -> dict[str, Any]:
        rate, count = sim.kv_hit_rate(start_s, end_s)
        return traffic_message(sim.observe(start_s, end_s), kv_hit_rate=rate, kv_hit_count=count)

    def _exchange(self, request: dict[str, Any]) -> DynamoTick:
        process = self._process
        assert process is not None and process.stdin is not None
        try:
            process.stdin.write(json.dumps(request) + "\n")
            process.stdin.flush()
        except BrokenPipeError:
            self._fail(f"tick at {request['now_s']:g} s")
        return self._read(f"tick at {request['now_s']:g} s")

    def _read(self, what: str) -> DynamoTick:
        process = self._process
        assert process is not None and process.stdout is not None
        line = process.stdout.readline()
        if not line:
            self._fail(what)
        return parse_tick(line, source=f"{self.name}: {what}")

    def _fail(self, what: str) -> None:
        process = self._process
        if process is not None:
            process.kill()
            process.wait()
        message = "(no message)"
        if self._stderr is not None:
            self._stderr.seek(0)
            message = _last_line(self._stderr.read().decode("utf-8", "replace"))
        self.close()
        raise DynamoPlannerError(f"{self.name}: Dynamo's planner stopped at the {what}: {message}")
