"""One live run: bring the stack up under the run's folder (the embedded Postgres, Prometheus, Dynamo's frontend,
the routing proxy when asked, `planner serve` and the forward-pass ingest), replay the trace through it with aiperf,
let the planner cool down, stop everything and read the run's figures."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from planner_core.lab.live.scoring import (
    aiperf_figures,
    db_figures,
    longest_saturated_s,
    replay_figures,
    view_figures,
)
from planner_core.lab.live.spec import WORKER_TARGETS_FILE, RunSpec, write_config
from planner_core.lab.live.stack import (
    CHARS_PER_TOKEN,
    DEPLOYMENT,
    DRAIN_GRACE_S,
    MODEL_NAME,
    PREFECT_LOST_S,
    REPO,
    STUBS_DIR,
    CpuSampler,
    LiveCancelled,
    get,
    process,
    wait_for,
)
from planner_core.runtime.localhost import free_port


@dataclass(frozen=True)
class _Ports:
    """The run's local ports, each free when the run starts."""

    frontend: int
    prometheus: int
    prefect: int
    proxy: int


def _fresh_run_dir(spec: RunSpec, root: Path) -> Path:
    """The run's folder, emptied (a database server left by an earlier run of the same folder stopped first)."""
    from planner_core.runtime.store.db import stop_embedded_database

    run_dir = root / spec.name
    stop_embedded_database(run_dir / "data" / "pg")
    shutil.rmtree(run_dir, ignore_errors=True)
    (run_dir / "kv").mkdir(parents=True)
    (run_dir / "logs").mkdir()
    return run_dir


def _base_env(run_dir: Path) -> dict[str, str]:
    """The environment of the run's planner processes (serve, ingest, the routing proxy)."""
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
    return base_env


def _worker_env(tools: dict[str, str], profile_dir: Path) -> dict[str, str]:
    """What the local connector's mocker workers need: Dynamo's Python, the model folder and name, the profile that
    times them, and the stub of Dynamo's vendor-only import."""
    return {
        "DYNAMO_PYTHON": tools["dynamo"],
        "PLANNER_LOCAL_MODEL_DIR": tools["model"],
        "PLANNER_LOCAL_MODEL_NAME": MODEL_NAME,
        "PLANNER_LOCAL_PROFILE_DIR": str(profile_dir),
        "PYTHONPATH": str(STUBS_DIR),
    }


def _migrated_database(run_dir: Path) -> str:
    """The run's embedded Postgres, started and migrated; its URL."""
    os.environ["PLANNER_DATA_DIR"] = str(run_dir / "data")
    from planner_core.runtime.settings import RuntimeSettings
    from planner_core.runtime.store.db import resolve_database_url, resolve_owner_database_url
    from planner_core.runtime.store.migrate import upgrade

    settings = RuntimeSettings()
    database_url = resolve_database_url(settings)  # starts the run's embedded Postgres
    # migrated (as the schema's owner) before serve and the ingest start side by side: the ingest refuses an
    # unmigrated schema
    upgrade(resolve_owner_database_url(settings))
    return database_url


def _start_metrics_and_frontend(
    stack: contextlib.ExitStack, spec: RunSpec, tools: dict[str, str], run_dir: Path, ports: _Ports, base_env: dict
) -> dict[str, subprocess.Popen]:
    """Prometheus scraping the frontend and the engines every second, and Dynamo's frontend on file discovery; both
    up. The engines come and go: the local connector lists the running ones in a file-discovery targets file, which
    Prometheus reads again when it changes (each series labelled with the engine's pool and worker id)."""
    logs = run_dir / "logs"
    (run_dir / "prometheus.yml").write_text(prometheus_config(ports.frontend, run_dir / WORKER_TARGETS_FILE))
    prometheus = stack.enter_context(
        process(
            [
                tools["prometheus"],
                f"--config.file={run_dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={run_dir / 'prometheus'}",
                f"--web.listen-address=127.0.0.1:{ports.prometheus}",
            ],
            logs / "prometheus.log",
        )
    )
    dynamo_env = {**base_env, "DYN_FILE_KV": str(run_dir / "kv"), "PYTHONPATH": str(STUBS_DIR)}
    direct = ["--router-mode", "direct"] if spec.router == "slo" else []
    frontend = stack.enter_context(
        process(
            [tools["dynamo"], "-m", "dynamo.frontend", "--http-port", str(ports.frontend),
             "--discovery-backend", "file", *direct],
            logs / "frontend.log",
            dynamo_env,
        )
    )  # fmt: skip
    wait_for("Prometheus", lambda: get(f"http://127.0.0.1:{ports.prometheus}/-/ready"), 60, prometheus)
    wait_for("Dynamo frontend", lambda: get(f"http://127.0.0.1:{ports.frontend}/metrics"), 120, frontend)
    return {"prometheus": prometheus, "frontend": frontend}


def prometheus_config(frontend_port: int, worker_targets: Path) -> str:
    """The run's Prometheus config: the frontend at a fixed port, the engines from the local connector's targets
    file, every second."""
    return (
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - {{job_name: frontend, static_configs: [{{targets: ['127.0.0.1:{frontend_port}']}}]}}\n"
        f"  - {{job_name: workers, file_sd_configs: [{{files: ['{worker_targets}'], refresh_interval: 5s}}]}}\n"
    )


def _start_route_proxy(stack: contextlib.ExitStack, spec: RunSpec, run_dir: Path, ports: _Ports, base_env: dict) -> str:
    """`planner route-proxy` in front of the frontend (in direct mode), up; the URL the traffic goes to."""
    traffic_url = f"http://127.0.0.1:{ports.proxy}"
    proxy = stack.enter_context(
        process(
            [sys.executable, "-m", "planner_cli", "route-proxy", "--frontend", f"http://127.0.0.1:{ports.frontend}",
             "--discovery-dir", str(run_dir / "kv"), "--profile", str(spec.profile_dir),
             "--ttft-ms", str(spec.ttft_ms), "--itl-ms", str(spec.itl_ms), "--port", str(ports.proxy),
             "--chars-per-token", str(CHARS_PER_TOKEN)],
            run_dir / "logs" / "route-proxy.log",
            base_env,
        )
    )  # fmt: skip
    wait_for("the routing proxy", lambda: get(f"{traffic_url}/route/status"), 60, proxy)
    return traffic_url


def _start_planner(
    stack: contextlib.ExitStack, run_dir: Path, config: Path, ports: _Ports, base_env: dict
) -> dict[str, subprocess.Popen]:
    """`planner serve` (its Prefect server, the deployments) and the forward-pass ingest."""
    logs = run_dir / "logs"
    serve = stack.enter_context(
        process(
            [sys.executable, "-m", "planner_cli", "serve", "--config", str(config), "--port", str(ports.prefect),
             "--deployment", DEPLOYMENT],
            logs / "serve.log",
            base_env,
        )
    )  # fmt: skip
    # the engines' forward-pass metrics (Dynamo's event plane, found in the discovery store) into Postgres
    ingest = stack.enter_context(
        process(
            [sys.executable, "-m", "planner_cli", "ingest", "--dynamo-discovery", str(run_dir / "kv"),
             "--deployment", DEPLOYMENT, "--config", str(config)],
            logs / "ingest.log",
            base_env,
        )
    )  # fmt: skip
    return {"serve": serve, "ingest": ingest}


def _run_aiperf(spec: RunSpec, tools: dict[str, str], traffic_url: str, run_dir: Path, base_env: dict) -> int:
    """aiperf replaying the trace on its timestamps against `traffic_url`; its exit status."""
    aiperf = subprocess.run(
        [
            tools["aiperf"], "profile", "--model", MODEL_NAME, "--url", traffic_url,
            "--endpoint-type", "chat", "--streaming", "--tokenizer", tools["model"],
            "--input-file", str(spec.trace), "--custom-dataset-type", "mooncake_trace", "--fixed-schedule",
            "--output-artifact-dir", str(run_dir / "aiperf"), "--request-timeout-seconds", "120",
            "--ui", "none", "--no-auto-plot",
        ],
        stdout=(run_dir / "logs" / "aiperf.log").open("ab"),
        stderr=subprocess.STDOUT,
        env={**base_env, "PYTHONPATH": ""},
        preexec_fn=(lambda: os.nice(spec.nice)) if spec.nice else None,
        check=False,
    )  # fmt: skip
    return aiperf.returncode


def run_once(spec: RunSpec, root: Path, tools: dict[str, str]) -> dict:
    """Bring the stack up, replay the trace through it, stop everything; the run's figures."""
    from planner_core.runtime.store.db import stop_embedded_database

    run_dir = _fresh_run_dir(spec, root)
    cpu = CpuSampler()
    figures: dict = {
        "run": spec.name, "command": spec.command, "commit": spec.commit, "traffic": spec.traffic,
        "ttft_ms": spec.ttft_ms, "itl_ms": spec.itl_ms, "adaptive": spec.adaptive,
    }  # fmt: skip
    if not spec.adaptive:  # the fixed sizes, for the binding check
        figures.update(fixed_prefill=spec.fixed_prefill if spec.disaggregated else 0, fixed_size=spec.fixed_size)
    try:
        base_env = _base_env(run_dir)
        database_url = _migrated_database(run_dir)
        ports = _Ports(frontend=free_port(), prometheus=free_port(), prefect=free_port(), proxy=free_port())
        worker_env = _worker_env(tools, spec.profile_dir)
        config = write_config(spec, run_dir, worker_env, f"http://127.0.0.1:{ports.prometheus}")
        started, ended = _serve_the_traffic(spec, tools, run_dir, ports, base_env, database_url, config, cpu, figures)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (`stop_like_ctrl_c`): the exit stack has stopped the components
        cpu.stop()
        stop_embedded_database(run_dir / "data" / "pg")
        marker = run_dir / "cancelled.json"
        cancelled = {**figures, "cancelled_at": dt.datetime.now(dt.UTC).isoformat()}
        marker.write_text(json.dumps(cancelled, indent=2, default=str))
        raise LiveCancelled(spec.name, marker) from None
    figures.update(_scored(spec, run_dir, database_url, started, ended, cpu))
    (run_dir / "figures.json").write_text(json.dumps(figures, indent=2, default=str))
    stop_embedded_database(run_dir / "data" / "pg")
    return figures


def _serve_the_traffic(
    spec: RunSpec,
    tools: dict[str, str],
    run_dir: Path,
    ports: _Ports,
    base_env: dict,
    database_url: str,
    config: Path,
    cpu: CpuSampler,
    figures: dict,
) -> tuple[dt.datetime, dt.datetime]:
    """The stack up, the traffic through it, the cool-down; every component stopped on the way out (also when
    interrupted). Fills `figures` with what the run measured; returns the traffic's start and end."""
    with contextlib.ExitStack() as stack:
        components = _start_metrics_and_frontend(stack, spec, tools, run_dir, ports, base_env)
        traffic_url = f"http://127.0.0.1:{ports.frontend}"
        if spec.router == "slo":
            traffic_url = _start_route_proxy(stack, spec, run_dir, ports, base_env)
        # registered before serve, so it runs after serve has stopped (an exit stack unwinds in reverse): drained
        # while serve still ran, a worker was replaced by serve's next reconcile and the new one outlived the run
        # (the fixed-1 run of 2026-11-27 10:49 left a mocker running)
        stack.callback(_stop_workers, database_url, config)
        components.update(_start_planner(stack, run_dir, config, ports, base_env))
        wait_for(
            "the first engine registered with the frontend",
            lambda: MODEL_NAME.encode() in get(f"{traffic_url}/v1/models"),
            300,
            components["serve"],
        )
        if spec.disaggregated:  # the frontend routes to prefill engines once one has registered
            wait_for("an engine of each pool ready", lambda: _ready_roles(database_url) >= {"prefill", "decode"},
                     300, components["serve"])  # fmt: skip
        started = dt.datetime.now(dt.UTC)
        cpu.start()
        figures["aiperf_exit"] = _run_aiperf(spec, tools, traffic_url, run_dir, base_env)
        ended = dt.datetime.now(dt.UTC)
        figures.update(_engine_figures(ports.prometheus, (ended - started).total_seconds() + 60))
        # a component that stopped during the traffic (its log in logs/ says why) makes the run's figures suspect
        figures["components_exited"] = {name: p.returncode for name, p in components.items() if p.poll() is not None}
        figures["router"] = spec.router
        if spec.router == "slo":
            figures["route_proxy"] = json.loads(get(f"{traffic_url}/route/status"))
        # the planner keeps running after the traffic (scale-downs it decides now still reach the processes and
        # are acknowledged); GPU-seconds and attainment are over the traffic only
        time.sleep(spec.cooldown_s)
        figures["unsettled_decisions"] = _settle_decisions(database_url, timeout_s=DRAIN_GRACE_S + 40)
        cpu.stop()
    return started, ended


def _scored(
    spec: RunSpec, run_dir: Path, database_url: str, started: dt.datetime, ended: dt.datetime, cpu: CpuSampler
) -> dict:
    """The run's figures after the stack stopped: the database's, aiperf's, the CPU's and replay's."""
    initial = {"initial_size": spec.initial_size, "initial_prefill": spec.initial_prefill}
    figures: dict = {"mode": spec.mode, **initial}
    figures.update(db_figures(database_url, started, ended, **initial))
    figures["cooldown_s"] = spec.cooldown_s
    figures.update(aiperf_figures(run_dir / "aiperf", spec))
    figures.update(view_figures(database_url, run_dir / "aiperf"))
    figures["cpu_idle_mean"] = sum(cpu.samples) / len(cpu.samples) if cpu.samples else None
    figures["cpu_idle_min"] = min(cpu.samples) if cpu.samples else None
    # the curve itself (one share per sample), and whether the machine was saturated (then the run does not count)
    figures["cpu_idle_curve"] = {"interval_s": cpu.interval_s, "idle": [round(x, 3) for x in cpu.samples]}
    figures["cpu_saturated_s"] = longest_saturated_s(cpu.samples, cpu.interval_s)
    figures["started"], figures["ended"] = started.isoformat(), ended.isoformat()
    if spec.adaptive:
        figures["replay"] = replay_figures(
            database_url, started - dt.timedelta(minutes=5), ended + dt.timedelta(minutes=5)
        )
    return figures


def _engine_figures(prometheus_port: int, span_s: float) -> dict:
    """What Prometheus scraped from the engines over the last `span_s`: the most engines of each pool scraped at once
    (`up` of the connector's targets) and the requests each pool's engines served (each engine's request counter
    starts at 0 with its process, so its largest value is what it served; a request passes every pool once)."""

    def by_role(query: str) -> dict[str, int]:
        params = urllib.parse.urlencode({"query": query})
        answer = json.loads(get(f"http://127.0.0.1:{prometheus_port}/api/v1/query?{params}", timeout_s=30))
        return {r["metric"].get("role", "?"): round(float(r["value"][1])) for r in answer["data"]["result"]}

    time.sleep(2)  # the last scrape of the traffic's end (every second)
    window = f"{max(1, round(span_s))}s"
    try:
        return {
            "engines_scraped_by_pool": by_role(
                f'max_over_time((count by (role) (up{{job="workers"}} == 1))[{window}:1s])'
            ),
            "engine_requests_by_pool": by_role(
                f'sum by (role) (max_over_time(dynamo_component_requests_total{{job="workers", '
                f'dynamo_endpoint="generate"}}[{window}]))'
            ),
        }
    except (OSError, ValueError, KeyError) as exc:  # the figures say it instead of failing the run
        return {"engine_figures_error": f"{type(exc).__name__}: {exc}"}


def _ready_roles(database_url: str) -> set[str]:
    """The pools with at least one engine the local connector has seen registered (ready)."""
    from sqlalchemy import text

    from planner_core.runtime.store.db import session_factory

    with session_factory(database_url).begin() as session:
        return set(session.scalars(text("SELECT DISTINCT role FROM local_workers WHERE status = 'ready'")))


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
