"""`planner live`: the planner scales Dynamo's own serving runtime (frontend + mocker engines, no GPU), driven by
real HTTP traffic from aiperf, then the same traffic on a fixed-size pool; prints both runs side by side.

One run brings up, under its own folder: the embedded Postgres, `planner serve` (its Prefect server and the
deployments: throughput tick, execute-decisions; the local connector starts and stops mocker engines timed by
the shipped H200 profile), Prometheus (Debian's binary) scraping the frontend's `/metrics` every second, Dynamo's
frontend on file discovery, and aiperf replaying a Mooncake trace on its timestamps. At the end it stops
everything it started (the workers by SIGTERM, then SIGKILL) and reads the figures: aiperf's per-request TTFT and
ITL against the SLA, the workers' GPU-seconds (one GPU per engine), the decisions and their acknowledgements, the
CPU idle share of the machine, and whether the recorded ticks replay identical.

Needs the Dynamo virtualenv (`make dynamo-env`; `DYNAMO_PYTHON` points elsewhere) and the live environment
(`make live-env`: aiperf in .aiperf-venv and the tiny model folder, both made locally; `AIPERF` and
`PLANNER_LIVE_MODEL_DIR` point elsewhere).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from planner_core.traces import RateShape, RequestTrace

REPO = Path(__file__).resolve().parents[1]
PROFILE_DIR = REPO / "planner_core" / "data" / "profiles" / "H200_TP1P_TP1D"
STUBS_DIR = REPO / "planner_core" / "lab" / "dynamo" / "stubs"
AZURE_CONV = REPO / "planner_core" / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
MODEL_NAME = "tiny"
# aiperf's synthetic prompts (its Shakespeare corpus) hold 1.68 characters per token of the tiny model's tokenizer
# (measured with `tokenizers` on that corpus); the routing proxy estimates prompt tokens with it
CHARS_PER_TOKEN = 1.68
DEPLOYMENT = "live"
DRAIN_GRACE_S = 20  # a drained engine's SIGTERM-to-SIGKILL grace
PREFECT_LOST_S = 180  # serve's patience with an unanswering Prefect server in a live run (see run_once)


class LiveError(RuntimeError):
    """The live stack cannot run (a missing tool, a component that did not come up): one line."""


def _tool(env_name: str, default: Path, make_target: str) -> str:
    value = os.environ.get(env_name)
    path = Path(value) if value else default
    if not path.exists():
        raise LiveError(f"{path} not found: run `make {make_target}` (or set {env_name})")
    return str(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout_s: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - our own local servers
        return response.read()


def _wait_for(what: str, probe, timeout_s: float, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise LiveError(f"{what}: the process exited with {process.returncode}")
        with contextlib.suppress(Exception):
            if probe():
                return
        time.sleep(0.5)
    raise LiveError(f"{what} not up after {timeout_s:.0f} s")


# --------------------------------------------------------------------------------------------------------
# The trace
# --------------------------------------------------------------------------------------------------------


def write_trace(
    out: Path, *, start_s: float, duration_s: float, speedup: float, keep_every: int, max_isl: int, max_osl: int
) -> int:
    """A Mooncake JSONL for aiperf: the Azure conversation trace's requests in [start_s, start_s + duration_s *
    speedup) of its first arrival, timestamps divided by `speedup` (ms), every `keep_every`-th request kept (with
    `keep_every == speedup` the rate is the trace's, its rises and falls `speedup` times faster), lengths capped.
    Returns the request count."""
    import csv

    rows: list[tuple[float, int, int]] = []
    with AZURE_CONV.open() as f:
        reader = csv.reader(f)
        next(reader)
        first: float | None = None
        index = 0
        for stamp, isl, osl in reader:
            t = dt.datetime.fromisoformat(stamp[:26]).timestamp()
            first = t if first is None else first
            offset = t - first - start_s
            if offset < 0:
                continue
            if offset >= duration_s * speedup:
                break
            index += 1
            if (index - 1) % keep_every:
                continue
            rows.append((offset / speedup, min(int(isl), max_isl), max(1, min(int(osl), max_osl))))
    with out.open("w") as f:
        for t, isl, osl in rows:
            f.write(json.dumps({"timestamp": round(t * 1000), "input_length": isl, "output_length": osl}) + "\n")
    return len(rows)


def day_shape(duration_s: float, trough_ratio: float, window_s: float = 10.0) -> RateShape:
    """One day's load cycle over `duration_s`: a cosine from the day's mean rate at the start, down to
    `trough_ratio` of the peak at a quarter of the span (the night), up to the peak at three quarters (the day)
    and back to the mean at the end; constant within `window_s` windows (each at its centre's value)."""
    import math

    import numpy as np

    from planner_core.traces import RateShape

    if not 0 < trough_ratio <= 1:
        raise LiveError(f"--trough-ratio = {trough_ratio!r}: must be in (0, 1]")
    if not (math.isfinite(duration_s) and duration_s >= window_s > 0):
        raise LiveError(f"--duration-s = {duration_s!r}: must be at least one {window_s:g} s window")
    centres = (np.arange(math.ceil(duration_s / window_s)) + 0.5) * window_s / duration_s
    rates = trough_ratio + (1 - trough_ratio) * (1 - np.cos(2 * np.pi * (centres - 0.25))) / 2
    rates.setflags(write=False)
    return RateShape(source=f"a day's cosine (trough {trough_ratio:g} of the peak)", window_s=window_s, rates=rates)


def day_trace(*, duration_s: float, peak_rps: float, trough_ratio: float) -> RequestTrace:
    """The Azure conversation hour's requests under one day's load cycle (`day_shape`) peaking at `peak_rps`.

    The hour is fitted into the run (arrival offsets scaled to `duration_s`), thinned evenly to the cycle's mean
    rate (`RequestTrace.scaled`, deterministic), then its time axis warped so the rate follows the cycle
    (`shape_trace`, as `planner bench --shape` does): the requests' lengths and their burstiness come from the
    whole hour, in its order; the hour's own rises and falls stay on top of the cycle."""
    from planner_core.traces import load_trace, shape_trace

    if not peak_rps > 0:
        raise LiveError(f"--peak-rps = {peak_rps!r}: must be > 0")
    shape = day_shape(duration_s, trough_ratio)
    hour = load_trace(AZURE_CONV)
    fitted = hour.compressed(hour.duration_s / duration_s)
    mean_rps = peak_rps * float(shape.rates.mean() / shape.rates.max())
    thinned = fitted.scaled(mean_rps * duration_s / fitted.num_requests)
    return shape_trace(thinned, shape, duration_s=duration_s)


def write_day_trace(
    out: Path, *, duration_s: float, peak_rps: float, trough_ratio: float, max_isl: int, max_osl: int
) -> int:
    """`day_trace` as a Mooncake JSONL for aiperf (timestamps in ms, lengths capped). Returns the request count."""
    trace = day_trace(duration_s=duration_s, peak_rps=peak_rps, trough_ratio=trough_ratio)
    with out.open("w") as f:
        for t, isl, osl in zip(trace.arrival_s, trace.isl, trace.osl, strict=True):
            row = {"timestamp": round(float(t) * 1000), "input_length": min(int(isl), max_isl),
                   "output_length": max(1, min(int(osl), max_osl))}  # fmt: skip
            f.write(json.dumps(row) + "\n")
    return trace.num_requests


def write_slowed_profile(out: Path, slowdown: float) -> Path:
    """The H200 profile with every latency `slowdown` times longer and every throughput as many times lower: an
    engine that slow, for the mocker's timing and the planner's capacity model alike (both read this folder).

    Why: at the real H200 speed one engine serves ~27 requests/s of the trace's sizes, so scaling past one engine
    would need more HTTP streams than a 2-core machine carries next to the frontend and aiperf; slowed k times,
    the same decisions happen at 1/k of the request rate (and the SLA is k times looser)."""
    import numpy as np

    for part, scaled in (
        ("selected_prefill_interpolation", {"prefill_ttft": slowdown, "prefill_thpt_per_gpu": 1 / slowdown}),
        ("selected_decode_interpolation", {"z_itl": slowdown, "z_thpt_per_gpu": 1 / slowdown}),
    ):
        with np.load(PROFILE_DIR / part / "raw_data.npz") as npz:
            arrays = {key: npz[key] * scaled.get(key, 1) if key in scaled else npz[key] for key in npz.files}
        (out / part).mkdir(parents=True, exist_ok=True)
        np.savez(out / part / "raw_data.npz", **arrays)
    return out


# --------------------------------------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------------------------------------


@dataclass
class CpuSampler:
    """The machine's CPU idle share over a run (from /proc/stat, every few seconds)."""

    interval_s: float = 5.0
    samples: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    @staticmethod
    def _read() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return fields[3] + fields[4], sum(fields)  # idle + iowait, total

    def run(self) -> None:
        idle0, total0 = self._read()
        while not self._stop.wait(self.interval_s):
            idle1, total1 = self._read()
            if total1 > total0:
                self.samples.append((idle1 - idle0) / (total1 - total0))
            idle0, total0 = idle1, total1

    def start(self) -> None:
        threading.Thread(target=self.run, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()


@dataclass(frozen=True)
class RunSpec:
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


def _config(spec: RunSpec, run_dir: Path, env: dict[str, str], prometheus_url: str) -> Path:
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


@contextlib.contextmanager
def _process(argv: list[str], log: Path, env: dict[str, str] | None = None, *, nice: int = 0) -> Iterator:
    """A child process for the run, in its own process group, stopped by SIGTERM (SIGKILL after 20 s)."""
    with log.open("ab") as out:
        process = subprocess.Popen(  # noqa: S603 - our own commands
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=(lambda: os.nice(nice)) if nice else None,  # noqa: PLW1509 - only os.nice
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def run_once(spec: RunSpec, root: Path, tools: dict[str, str]) -> dict:
    """Bring the stack up, replay the trace through it, stop everything; the run's figures."""
    from planner_core.runtime.store.db import stop_embedded_database

    run_dir = root / spec.name
    stop_embedded_database(run_dir / "data" / "pg")  # a server left by an earlier run of the same folder
    shutil.rmtree(run_dir, ignore_errors=True)
    (run_dir / "kv").mkdir(parents=True)
    (run_dir / "logs").mkdir()
    logs = run_dir / "logs"
    base_env = {
        # serve ends when its Prefect server has not answered for PLANNER_PREFECT_LOST_S (30 s); on a saturated
        # 2-core machine the server went that long unanswered (2026-11-27, load average 12) and the planner run
        # lost its planner mid-traffic: the live run waits longer unless told otherwise
        "PLANNER_PREFECT_LOST_S": str(PREFECT_LOST_S),
        **os.environ,
        "PLANNER_DATA_DIR": str(run_dir / "data"),
        "PYTHONPATH": str(REPO),
    }
    base_env.pop("PLANNER_DATABASE_URL", None)
    os.environ["PLANNER_DATA_DIR"] = str(run_dir / "data")
    from planner_core.runtime.settings import RuntimeSettings
    from planner_core.runtime.store.db import resolve_database_url, resolve_owner_database_url
    from planner_core.runtime.store.migrate import upgrade

    settings = RuntimeSettings()
    database_url = resolve_database_url(settings)  # starts the run's embedded Postgres
    # migrated (as the schema's owner) before serve and the ingest start side by side: the ingest refuses an
    # unmigrated schema
    upgrade(resolve_owner_database_url(settings))
    frontend_port, prometheus_port, prefect_port, proxy_port = _free_port(), _free_port(), _free_port(), _free_port()
    dynamo_env = {**base_env, "DYN_FILE_KV": str(run_dir / "kv"), "PYTHONPATH": str(STUBS_DIR)}
    worker_env = {
        "DYNAMO_PYTHON": tools["dynamo"],
        "PLANNER_LOCAL_MODEL_DIR": tools["model"],
        "PLANNER_LOCAL_MODEL_NAME": MODEL_NAME,
        "PLANNER_LOCAL_PROFILE_DIR": str(spec.profile_dir),
        "PYTHONPATH": str(STUBS_DIR),
    }
    prometheus_url = f"http://127.0.0.1:{prometheus_port}"
    config = _config(spec, run_dir, worker_env, prometheus_url)
    (run_dir / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs: [{{job_name: frontend, static_configs: [{{targets: ['127.0.0.1:{frontend_port}']}}]}}]\n"
    )
    cpu = CpuSampler()
    figures: dict = {"run": spec.name, "command": spec.command, "commit": spec.commit, "traffic": spec.traffic}
    with contextlib.ExitStack() as stack:
        prometheus = stack.enter_context(
            _process(
                [
                    tools["prometheus"],
                    f"--config.file={run_dir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={run_dir / 'prometheus'}",
                    f"--web.listen-address=127.0.0.1:{prometheus_port}",
                ],
                logs / "prometheus.log",
            )
        )
        direct = ["--router-mode", "direct"] if spec.router == "slo" else []
        frontend = stack.enter_context(
            _process(
                [tools["dynamo"], "-m", "dynamo.frontend", "--http-port", str(frontend_port),
                 "--discovery-backend", "file", *direct],
                logs / "frontend.log",
                dynamo_env,
            )
        )  # fmt: skip
        _wait_for("Prometheus", lambda: _get(f"{prometheus_url}/-/ready"), 60, prometheus)
        _wait_for("Dynamo frontend", lambda: _get(f"http://127.0.0.1:{frontend_port}/metrics"), 120, frontend)
        traffic_url = f"http://127.0.0.1:{frontend_port}"
        if spec.router == "slo":
            traffic_url = f"http://127.0.0.1:{proxy_port}"
            proxy = stack.enter_context(
                _process(
                    [sys.executable, "-m", "planner_cli", "route-proxy", "--frontend", f"http://127.0.0.1:{frontend_port}",
                     "--discovery-dir", str(run_dir / "kv"), "--profile", str(spec.profile_dir),
                     "--ttft-ms", str(spec.ttft_ms), "--itl-ms", str(spec.itl_ms), "--port", str(proxy_port),
                     "--chars-per-token", str(CHARS_PER_TOKEN)],
                    logs / "route-proxy.log",
                    base_env,
                )
            )  # fmt: skip
            _wait_for("the routing proxy", lambda: _get(f"{traffic_url}/route/status"), 60, proxy)
        # registered before serve, so it runs after serve has stopped (an exit stack unwinds in reverse): drained
        # while serve still ran, a worker was replaced by serve's next reconcile and the new one outlived the run
        # (the fixed-1 run of 2026-11-27 10:49 left a mocker running)
        stack.callback(_stop_workers, database_url, config)
        serve = stack.enter_context(
            _process(
                [sys.executable, "-m", "planner_cli", "serve", "--config", str(config), "--port", str(prefect_port),
                 "--deployment", DEPLOYMENT],
                logs / "serve.log",
                base_env,
            )
        )  # fmt: skip
        # the engines' forward-pass metrics (Dynamo's event plane, found in the discovery store) into Postgres
        ingest = stack.enter_context(
            _process(
                [sys.executable, "-m", "planner_cli", "ingest", "--dynamo-discovery", str(run_dir / "kv"),
                 "--deployment", DEPLOYMENT, "--config", str(config)],
                logs / "ingest.log",
                base_env,
            )
        )  # fmt: skip
        _wait_for(
            "the first engine registered with the frontend",
            lambda: MODEL_NAME.encode() in _get(f"{traffic_url}/v1/models"),
            300,
            serve,
        )
        started = dt.datetime.now(dt.UTC)
        cpu.start()
        aiperf = subprocess.run(  # noqa: S603 - our own command
            [
                tools["aiperf"], "profile", "--model", MODEL_NAME, "--url", traffic_url,
                "--endpoint-type", "chat", "--streaming", "--tokenizer", tools["model"],
                "--input-file", str(spec.trace), "--custom-dataset-type", "mooncake_trace", "--fixed-schedule",
                "--output-artifact-dir", str(run_dir / "aiperf"), "--request-timeout-seconds", "120",
                "--ui", "none", "--no-auto-plot",
            ],
            stdout=(logs / "aiperf.log").open("ab"),
            stderr=subprocess.STDOUT,
            env={**base_env, "PYTHONPATH": ""},
            preexec_fn=(lambda: os.nice(spec.nice)) if spec.nice else None,  # noqa: PLW1509 - only os.nice
            check=False,
        )  # fmt: skip
        ended = dt.datetime.now(dt.UTC)
        figures["aiperf_exit"] = aiperf.returncode
        # a component that stopped during the traffic (its log in logs/ says why) makes the run's figures suspect
        components = {"prometheus": prometheus, "frontend": frontend, "serve": serve, "ingest": ingest}
        figures["components_exited"] = {name: p.returncode for name, p in components.items() if p.poll() is not None}
        figures["router"] = spec.router
        if spec.router == "slo":
            figures["route_proxy"] = json.loads(_get(f"{traffic_url}/route/status"))
        # the planner keeps running after the traffic (scale-downs it decides now still reach the processes and
        # are acknowledged); GPU-seconds and attainment are over the traffic only
        time.sleep(spec.cooldown_s)
        figures["unsettled_decisions"] = _settle_decisions(database_url, timeout_s=DRAIN_GRACE_S + 40)
        cpu.stop()
    figures["initial_size"] = spec.initial_size
    figures.update(_db_figures(database_url, started, ended, initial_size=spec.initial_size))
    figures["cooldown_s"] = spec.cooldown_s
    figures.update(_aiperf_figures(run_dir / "aiperf", spec))
    figures["cpu_idle_mean"] = sum(cpu.samples) / len(cpu.samples) if cpu.samples else None
    figures["cpu_idle_min"] = min(cpu.samples) if cpu.samples else None
    figures["started"], figures["ended"] = started.isoformat(), ended.isoformat()
    if spec.adaptive:
        figures["replay"] = _replay(database_url, started - dt.timedelta(minutes=5), ended + dt.timedelta(minutes=5))
    (run_dir / "figures.json").write_text(json.dumps(figures, indent=2, default=str))
    stop_embedded_database(run_dir / "data" / "pg")
    return figures


def _settle_decisions(database_url: str, *, timeout_s: float) -> int:
    """Wait (at most `timeout_s`) until no decision is pending or applied-but-unacknowledged, so a decision made
    late in the cool-down is seen through (its workers drained or ready) before the stack stops; the number still
    unsettled at the end."""
    from sqlalchemy import text

    from planner_core.runtime.store.db import session_factory

    sessions = session_factory(database_url)
    deadline = time.monotonic() + timeout_s
    while True:
        with sessions.begin() as session:
            unsettled = session.scalar(text("SELECT count(*) FROM decisions WHERE status IN ('pending', 'applied')"))
        if not unsettled or time.monotonic() >= deadline:
            return int(unsettled or 0)
        time.sleep(1)


def _stop_workers(database_url: str, config: Path) -> None:
    """Drain every local worker of the run and wait for them (SIGKILL after the grace period)."""
    from planner_core.runtime.service import load_context
    from planner_core.runtime.store import repository as repo

    ctx = load_context(database_url, DEPLOYMENT, config)
    with ctx.sessions.begin() as session:
        deployment = repo.find_deployment(session, DEPLOYMENT)
        if deployment is None:
            return
        ctx.local.stop_all(session, deployment.id, dt.datetime.now(dt.UTC))
    deadline = time.monotonic() + ctx.local.settings.drain_grace_seconds + 10
    while time.monotonic() < deadline:
        with ctx.sessions.begin() as session:
            ctx.local.finish_drains(session, deployment.id, dt.datetime.now(dt.UTC))
            if not ctx.local.workers(session, deployment.id, statuses=ctx.local.running_statuses):
                return
        time.sleep(1)


def _db_figures(database_url: str, started: dt.datetime, ended: dt.datetime, *, initial_size: int) -> dict:
    from sqlalchemy import text

    from planner_core.runtime.store.db import session_factory

    with session_factory(database_url).begin() as session:
        workers = session.execute(
            text("SELECT role, started_at, ready_at, ended_at, status FROM local_workers ORDER BY id")
        ).all()
        decisions = session.execute(
            text(
                "SELECT d.id, d.target_decode, d.status, d.reason, t.scheduled_at FROM decisions d "
                "JOIN ticks t ON t.id = d.tick_id ORDER BY d.id"
            )
        ).all()
        num_ticks = session.scalar(text("SELECT count(*) FROM ticks"))
        executions = session.execute(text("SELECT outcome, count(*) FROM executions GROUP BY outcome")).all()
        fpm = session.execute(
            text(
                "SELECT count(*), count(DISTINCT worker_id), count(*) FILTER (WHERE wall_time_s > 0) "
                "FROM fpm_samples WHERE received_at BETWEEN :a AND :b"
            ),
            {"a": started, "b": ended},
        ).one()
    gpu_s = 0.0
    for _role, start, _ready, end, _status in workers:
        a, b = max(start, started), min(end or ended, ended)
        gpu_s += max(0.0, (b - a).total_seconds())  # one GPU per engine, over the traffic's span
    previous = initial_size  # the engines started before any decision
    ups = downs = 0
    applied = []
    for _id, target, status, _reason, _at in decisions:
        if status in ("applied", "acknowledged") and target is not None:
            ups += target > previous
            downs += target < previous
            applied.append((target, status))
            previous = target
    return {
        "num_workers_started": len(workers),
        "num_workers_died": sum(1 for w in workers if w[4] == "died"),
        "gpu_seconds": round(gpu_s, 1),
        "num_ticks": num_ticks,
        "num_decisions": len(decisions),
        "decision_statuses": {s: sum(1 for d in decisions if d[2] == s) for s in {d[2] for d in decisions}},
        "scale_ups": ups,
        "scale_downs": downs,
        "applied_decisions": len(applied),
        "acknowledged_decisions": sum(1 for _t, s in applied if s == "acknowledged"),
        "executions": dict(executions),
        "fpm_samples": fpm[0],
        "fpm_engines": fpm[1],
        "fpm_busy_samples": fpm[2],
    }


def _aiperf_figures(out_dir: Path, spec: RunSpec) -> dict:
    """Per-request TTFT and mean ITL from aiperf's record export; attainment = both within the SLA, over every
    request sent (a failed one, e.g. timed out, missed it)."""
    records = sorted(out_dir.rglob("profile_export.jsonl"))
    if not records:
        return {"aiperf_records": 0}
    num = ok = num_ttft_ok = num_itl_ok = errors = 0
    ttfts: list[float] = []
    for line in records[0].read_text().splitlines():
        record = json.loads(line)
        metrics = record.get("metrics") or {}
        if record.get("error") or "time_to_first_token" not in metrics:
            errors += 1
            continue
        num += 1
        ttft_ms = _ms(metrics["time_to_first_token"])
        itl = metrics.get("inter_token_latency")
        itl_ms = _ms(itl) if itl is not None else 0.0  # one output token: no inter-token latency
        ttfts.append(ttft_ms)
        num_ttft_ok += ttft_ms <= spec.ttft_ms
        num_itl_ok += itl_ms <= spec.itl_ms
        ok += ttft_ms <= spec.ttft_ms and itl_ms <= spec.itl_ms
    ttfts.sort()
    sent = num + errors
    return {
        "aiperf_records": num,
        "aiperf_errors": errors,
        "attainment": ok / sent if sent else None,
        "ttft_attainment": num_ttft_ok / sent if sent else None,
        "itl_attainment": num_itl_ok / sent if sent else None,
        "ttft_p50_ms": ttfts[len(ttfts) // 2] if ttfts else None,
        "ttft_p99_ms": ttfts[int(0.99 * (len(ttfts) - 1))] if ttfts else None,
    }


def _ms(metric) -> float:
    """A metric of aiperf's record export in milliseconds."""
    value, unit = (metric.get("value"), metric.get("unit", "ms")) if isinstance(metric, dict) else (metric, "ms")
    return float(value) * {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


def _replay(database_url: str, start: dt.datetime, end: dt.datetime) -> dict:
    from planner_core.runtime.replay import replay

    summary = replay(database_url, DEPLOYMENT, start, end)
    return {"ticks": summary.num_ticks, "identical": summary.num_identical, "differing": summary.num_differing}


# --------------------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------------------


def live_table(runs: list[dict], *, ttft_ms: float, itl_ms: float) -> str:
    """The runs side by side (Markdown), as `planner live` prints them and the docs render its records."""
    rows = [
        ("traffic", lambda r: r.get("traffic") or "-"),
        ("router", lambda r: r.get("router", "round-robin")),
        ("aiperf requests (errors)", lambda r: f"{r.get('aiperf_records')} ({r.get('aiperf_errors')})"),
        (f"attainment TTFT<={ttft_ms:g} ms & ITL<={itl_ms:g} ms", lambda r: _pct(r.get("attainment"))),
        ("  TTFT attainment", lambda r: _pct(r.get("ttft_attainment"))),
        ("  ITL attainment", lambda r: _pct(r.get("itl_attainment"))),
        ("TTFT p50 / p99 (ms)", lambda r: f"{_num(r.get('ttft_p50_ms'))} / {_num(r.get('ttft_p99_ms'))}"),
        ("GPU-seconds (1 GPU per engine)", lambda r: f"{r.get('gpu_seconds')}"),
        ("workers started (died)", lambda r: f"{r.get('num_workers_started')} ({r.get('num_workers_died')})"),
        ("ticks / decisions", lambda r: f"{r.get('num_ticks')} / {r.get('num_decisions')}"),
        ("scale-ups / scale-downs", lambda r: f"{r.get('scale_ups')} / {r.get('scale_downs')}"),
        ("applied decisions acknowledged", lambda r: f"{r.get('acknowledged_decisions')} of {r.get('applied_decisions')}"),  # noqa: E501
        ("forward-pass samples stored (busy; engines)",
         lambda r: f"{r.get('fpm_samples')} ({r.get('fpm_busy_samples')}; {r.get('fpm_engines')})"),
        ("components that exited during the traffic", lambda r: _exited(r.get("components_exited"))),
        ("CPU idle mean / min", lambda r: f"{_pct(r.get('cpu_idle_mean'))} / {_pct(r.get('cpu_idle_min'))}"),
        ("recorded ticks replay identical", lambda r: _replayed(r.get("replay"))),
        ("proxy: placed per worker / queued / overdue / rejected", lambda r: _proxied(r.get("route_proxy"))),
    ]  # fmt: skip
    header = "| | " + " | ".join(r["run"] for r in runs) + " |"
    lines = [header, "|---" * (len(runs) + 1) + "|"]
    lines += ["| " + label + " | " + " | ".join(get(r) for r in runs) + " |" for label, get in rows]
    return "\n".join(lines)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f} %"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def _proxied(r: dict | None) -> str:
    if r is None:
        return "-"
    placed = "+".join(str(n) for _, n in sorted(r["placed"].items()))
    return f"{placed or 0} / {r['queued']} / {r['overdue']} / {r['rejected']}"


def _exited(r: dict | None) -> str:
    return "-" if r is None else ", ".join(f"{name} (exit {code})" for name, code in r.items()) or "none"


def _replayed(r: dict | None) -> str:
    return "-" if r is None else f"{r['identical']} of {r['ticks']} ({r['differing']} differ)"


def summarize(root: Path, spec: RunSpec) -> list[dict]:
    """The figures of the runs under `root` read again from their databases and aiperf exports (keeping the CPU
    and replay figures measured during the run)."""
    from planner_core.runtime.settings import RuntimeSettings
    from planner_core.runtime.store.db import resolve_database_url, stop_embedded_database

    runs = []
    for figures_file in sorted(root.glob("*/figures.json"), key=lambda f: not f.parent.name.startswith("planner")):
        figures = json.loads(figures_file.read_text())
        run_dir = figures_file.parent
        os.environ["PLANNER_DATA_DIR"] = str(run_dir / "data")
        database_url = resolve_database_url(RuntimeSettings())
        started, ended = (dt.datetime.fromisoformat(figures[k]) for k in ("started", "ended"))
        figures.update(_db_figures(database_url, started, ended, initial_size=figures.get("initial_size", 1)))
        figures.update(_aiperf_figures(run_dir / "aiperf", spec))
        stop_embedded_database(run_dir / "data" / "pg")
        runs.append(figures)
    return runs


def live_record(runs: list[dict], spec: RunSpec) -> dict:
    """The `--record` file: every run's figures (each with the command and commit that made it) under the SLA they
    were scored against; the docs' live tables are generated from these."""
    return {
        "format": "planner-live-record/v1",
        "date": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
        "ttft_ms": spec.ttft_ms,
        "itl_ms": spec.itl_ms,
        "runs": [{k: v for k, v in run.items() if k not in ("started", "ended")} for run in runs],
    }


def cmd_live(args: argparse.Namespace) -> int:
    if args.summarize:
        spec = RunSpec(
            name="", adaptive=True, fixed_size=0, duration_s=0, ttft_ms=args.ttft_ms, itl_ms=args.itl_ms,
            interval_s=None, max_workers=0, trace=args.out, nice=0, profile_dir=args.out, cooldown_s=0,
        )  # fmt: skip
        runs = summarize(args.out.resolve(), spec)
        if args.record:
            args.record.parent.mkdir(parents=True, exist_ok=True)
            args.record.write_text(json.dumps(live_record(runs, spec), indent=1, default=str) + "\n")
        print(live_table(runs, ttft_ms=spec.ttft_ms, itl_ms=spec.itl_ms))
        return 0
    try:
        tools = {
            "dynamo": _tool("DYNAMO_PYTHON", REPO / ".dynamo-venv" / "bin" / "python", "dynamo-env"),
            "aiperf": _tool("AIPERF", REPO / ".aiperf-venv" / "bin" / "aiperf", "live-env"),
            "model": _tool("PLANNER_LIVE_MODEL_DIR", REPO / ".planner" / "live-model", "live-env"),
            "prometheus": shutil.which("prometheus") or "",
        }
        if not tools["prometheus"]:
            raise LiveError("prometheus not found: apt-get install -y prometheus (Debian's package)")
        from planner_cli.common import stop_like_ctrl_c

        stop_like_ctrl_c()  # a stopped run stops its stack (each component is in a session of its own)
        root = args.out.resolve()
        root.mkdir(parents=True, exist_ok=True)
        trace = root / "trace.jsonl"
        if args.traffic == "day":
            num_requests = write_day_trace(
                trace,
                duration_s=args.duration_s,
                peak_rps=args.peak_rps,
                trough_ratio=args.trough_ratio,
                max_isl=args.max_isl,
                max_osl=args.max_osl,
            )
        else:
            num_requests = write_trace(
                trace,
                start_s=args.trace_start_s,
                duration_s=args.duration_s,
                speedup=args.speedup,
                keep_every=args.keep_every,
                max_isl=args.max_isl,
                max_osl=args.max_osl,
            )
        print(f"trace: {num_requests} requests over {args.duration_s:.0f} s -> {trace}", file=sys.stderr)
        if args.traffic == "day":
            traffic = f"day: peak {args.peak_rps:g} req/s, night {args.trough_ratio:g} of it"
        else:
            traffic = f"conv: from {args.trace_start_s:g} s, x{args.speedup:g}, every {args.keep_every}th"
        common = {
            "duration_s": args.duration_s,
            "ttft_ms": args.ttft_ms,
            "itl_ms": args.itl_ms,
            "interval_s": args.interval_s,
            "max_workers": args.max_workers,
            "trace": trace,
            "nice": args.nice,
            "cooldown_s": args.cooldown_s,
            "profile_dir": write_slowed_profile(root / f"profile-x{args.slowdown:g}", args.slowdown),
            "speedup": args.speedup,
            "traffic": f"{traffic}; {num_requests} requests in {args.duration_s:g} s",
            # both runs start from the same deployment: the planner takes over the fixed run's size
            "initial_size": args.initial_size or args.fixed_size or 1,
        }
        import shlex

        from planner_cli.bench import code_commit

        common["command"] = shlex.join(["planner", *getattr(args, "argv", [])])
        common["commit"] = code_commit()
        suffix = "" if args.router == "round-robin" else f"-{args.router}"
        common["router"] = args.router
        specs = [RunSpec(name=f"planner{suffix}", adaptive=True, fixed_size=1, **common)] if not args.fixed_only else []
        if args.fixed_size:
            specs.append(
                RunSpec(name=f"fixed-{args.fixed_size}{suffix}", adaptive=False, fixed_size=args.fixed_size, **common)
            )
        runs = []
        for spec in specs:
            print(f"run {spec.name}: starting", file=sys.stderr)
            runs.append(run_once(spec, root, tools))
            print(f"run {spec.name}: {json.dumps(runs[-1], default=str)}", file=sys.stderr)
    except LiveError as exc:
        print(f"planner live: {exc}", file=sys.stderr)
        return 2
    # read back in a fresh process: this one has engines cached on the runs' stopped embedded servers
    table = subprocess.run(  # noqa: S603 - our own command
        [sys.executable, "-m", "planner_cli", "live", "--summarize", "--out", str(root),
         "--ttft-ms", str(args.ttft_ms), "--itl-ms", str(args.itl_ms),
         *(["--record", str(args.record.resolve())] if args.record else [])],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    ).stdout  # fmt: skip
    (root / "summary.md").write_text(table)
    print(table, end="")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the live command's parser."""
    live = sub.add_parser("live", help="scale Dynamo's frontend + mocker engines under aiperf traffic; compare")
    live.add_argument("--out", type=Path, default=Path(".planner/live"), help="folder of the runs")
    live.add_argument("--duration-s", type=float, default=560.0, help="traffic per run (s)")
    live.add_argument(
        "--traffic",
        choices=("day", "conv"),
        default="day",
        help="day: the Azure conversation hour's requests under one day's load cycle (--peak-rps, --trough-ratio); "
        "conv: the hour as recorded, --speedup times faster, every --keep-every-th request",
    )
    live.add_argument("--peak-rps", type=float, default=2.0, help="day: the cycle's peak request rate (req/s)")
    live.add_argument(
        "--trough-ratio", type=float, default=0.125, help="day: the night's rate as a fraction of the peak"
    )
    live.add_argument(
        "--speedup",
        type=float,
        default=6.0,
        help="the policy's time constants are divided by this (conv: the trace's time compression too)",
    )
    live.add_argument("--keep-every", type=int, default=9, help="conv: keep every N-th request of the trace")
    live.add_argument(
        "--trace-start-s", type=float, default=0.0, help="conv: offset into the Azure conversation trace (s)"
    )
    live.add_argument("--max-isl", type=int, default=2048, help="cap on prompt tokens")
    live.add_argument("--max-osl", type=int, default=256, help="cap on output tokens")
    live.add_argument(
        "--slowdown",
        type=float,
        default=8.0,
        help="engines (mocker and the planner's model) this many times slower than the H200 profile",
    )
    live.add_argument("--ttft-ms", type=float, default=2000.0, help="TTFT SLA (ms)")
    live.add_argument("--itl-ms", type=float, default=100.0, help="ITL SLA (ms)")
    live.add_argument(
        "--interval-s",
        type=float,
        default=None,
        help="throughput adjustment interval (default: the recommended policy's, divided by --speedup)",
    )
    live.add_argument("--max-workers", type=int, default=4, help="GPU budget (one GPU per engine)")
    live.add_argument(
        "--fixed-size",
        type=int,
        default=2,
        help="engines of the fixed-size run (the default day's smallest size meeting 99 %%); 0 = no such run",
    )
    live.add_argument(
        "--initial-size",
        type=int,
        default=None,
        help="engines running when the planner's run starts (default: --fixed-size, else 1)",
    )
    live.add_argument(
        "--cooldown-s", type=float, default=60.0, help="the planner keeps running this long after the traffic"
    )
    live.add_argument("--fixed-only", action="store_true", help="only the fixed-size run")
    live.add_argument("--summarize", action="store_true", help="only print the table of the runs already in --out")
    live.add_argument(
        "--record",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write the runs' figures with their command, commit and date to FILE (docs/results/live/)",
    )
    live.add_argument("--nice", type=int, default=10, help="niceness of the engines and aiperf")
    live.add_argument(
        "--router",
        choices=("round-robin", "slo"),
        default="round-robin",
        help="round-robin: the frontend's own router; slo: the frontend in direct mode behind `planner route-proxy`",
    )
    live.set_defaults(func=cmd_live)
