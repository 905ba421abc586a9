"""The live wake (run by hand): a pool scaled to zero by the planner wakes for the first requests and serves them.

`python -m planner_core.lab.live.wake [--out FILE]` brings up the live stack's parts under `.planner/live/wake`
(the embedded Postgres, Prometheus, Dynamo's frontend in direct mode on file discovery, `planner route-proxy
--wake-deployment live`, `planner serve` with the local connector starting Dynamo's mocker engines), then:

1. waits for the first engine and sends a few requests (demand the planner sees);
2. waits for the planner to take the pool to zero (`scale_to_zero_idle_seconds` without demand) and the engine to
   stop;
3. has aiperf send `NUM_WAKE_REQUESTS` streamed requests 250 ms apart to the proxy: they are held, the proxy's
   NOTIFY makes `planner serve` run a wake tick, its decision starts an engine, and the held requests are forwarded
   once it registers;
4. reads each request's time to first token and error from aiperf's record export, the proxy's counts, the
   decisions and the woken engine's start (`local_workers`), and compares the wake latency (the longest time to
   first token) with the engine's start-up plus one load interval.

The figures are printed as JSON and written to `--out`. Needs `make dynamo-env live-env` and Prometheus, as
`planner live`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path

from planner_core.lab.live.run import (
    _base_env,
    _fresh_run_dir,
    _migrated_database,
    _Ports,
    _start_metrics_and_frontend,
    _start_planner,
    _stop_workers,
    _worker_env,
)
from planner_core.lab.live.scoring import _ms
from planner_core.lab.live.spec import RunSpec, compressed_policy
from planner_core.lab.live.stack import (
    DEPLOYMENT,
    MODEL_NAME,
    PROFILE_DIR,
    REPO,
    find_tools,
    get,
    process,
    wait_for,
)
from planner_core.runtime.localhost import free_port

SPEEDUP = 6.0  # the recommended policy's time constants / 6: a 10 s throughput window
IDLE_HOLD_S = 20.0  # scale_to_zero_idle_seconds
LOAD_INTERVAL_S = 5  # load_adjustment_interval_seconds (the wake's bound: start-up + one load interval)
NUM_WARM_REQUESTS = 3
NUM_WAKE_REQUESTS = 4
ZERO_TIMEOUT_S = 180.0


def _config(run_dir: Path, worker_env: dict[str, str], prometheus_url: str) -> Path:
    import yaml

    from planner_core.data import DEFAULT_CONFIG

    body = compressed_policy(DEFAULT_CONFIG, SPEEDUP)
    body.update(
        {
            "environment": "local",
            "mode": "agg",
            "throughput_capacity_feedback": False,
            "namespace": "dynamo",
            "model_name": MODEL_NAME,
            "ttft_ms": 2000,
            "itl_ms": 100,
            "profile_results_dir": str(PROFILE_DIR),
            "min_endpoint": 0,
            "scale_to_zero_idle_seconds": IDLE_HOLD_S,
            "load_adjustment_interval_seconds": LOAD_INTERVAL_S,
            "max_gpu_budget": 1,
            "metric_pulling_prometheus_endpoint": prometheus_url,
            "execution_interval_seconds": 5,
            "report_interval_hours": None,
            "local_workers": {
                "env": worker_env,
                "discovery_dir": str(run_dir / "kv"),
                "drain_grace_seconds": 5,
                "initial_decode": 1,
            },
        }
    )
    path = run_dir / "planner.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


async def _requests(url: str, num: int) -> list[dict]:
    """`num` chat completions at once through the proxy (the warm-up): each one's status, latency and error type."""
    import httpx

    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "wake up"}], "max_tokens": 8}

    async def one(client: httpx.AsyncClient) -> dict:
        started = time.monotonic()
        reply = await client.post(f"{url}/v1/chat/completions", json=body)
        kind = None if reply.status_code == 200 else reply.json().get("error", {}).get("type")
        return {"status": reply.status_code, "latency_s": round(time.monotonic() - started, 3), "error": kind}

    async with httpx.AsyncClient(timeout=600) as client:
        return list(await asyncio.gather(*(one(client) for _ in range(num))))


def _aiperf_wake(tools: dict[str, str], url: str, run_dir: Path, base_env: dict) -> tuple[int, list[dict]]:
    """aiperf sending `NUM_WAKE_REQUESTS` streamed chat requests 250 ms apart through the proxy (a Mooncake trace on
    its timestamps): its exit status and, per request of its record export, when it was sent (epoch s), its time
    to first token and latency (s), and its error (None when answered)."""
    trace = run_dir / "wake-trace.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": 250 * k, "input_length": 64, "output_length": 8}) + "\n"
            for k in range(NUM_WAKE_REQUESTS)
        )
    )
    out = run_dir / "aiperf"
    done = subprocess.run(
        [
            tools["aiperf"], "profile", "--model", MODEL_NAME, "--url", url, "--endpoint-type", "chat", "--streaming",
            "--tokenizer", tools["model"], "--input-file", str(trace), "--custom-dataset-type", "mooncake_trace",
            "--fixed-schedule", "--output-artifact-dir", str(out), "--request-timeout-seconds", "300",
            "--ui", "none", "--no-auto-plot",
        ],
        stdout=(run_dir / "logs" / "aiperf.log").open("ab"),
        stderr=subprocess.STDOUT,
        env={**base_env, "PYTHONPATH": ""},
        check=False,
    )  # fmt: skip
    requests = []
    for path in sorted(out.rglob("profile_export.jsonl"))[:1]:
        for line in path.read_text().splitlines():
            record = json.loads(line)
            metrics = record.get("metrics") or {}
            error = record.get("error")
            ttft = metrics.get("time_to_first_token")
            latency = metrics.get("request_latency")
            requests.append(
                {
                    "sent_at_s": record["metadata"]["request_start_ns"] / 1e9,
                    "first_token_s": None if ttft is None else round(_ms(ttft) / 1000.0, 3),
                    "latency_s": None if latency is None else round(_ms(latency) / 1000.0, 3),
                    "error": None if not error and ttft is not None else str(error or "no first token")[:300],
                }
            )
    return done.returncode, sorted(requests, key=lambda r: r["sent_at_s"])


def _running_workers(database_url: str) -> int:
    from sqlalchemy import text

    from planner_core.runtime.store.db import session_factory

    with session_factory(database_url).begin() as session:
        return int(session.scalar(text("SELECT count(*) FROM local_workers WHERE ended_at IS NULL")) or 0)


def _db_figures(database_url: str, since: dt.datetime, zero_s: float) -> dict:
    """The decisions and ticks since `since` and the engine started by the first decision, their times in seconds
    from `zero_s` (epoch s)."""
    from sqlalchemy import text

    from planner_core.runtime.store.db import session_factory

    with session_factory(database_url).begin() as session:
        decisions = session.execute(
            text(
                "SELECT d.id, d.created_at, d.target_decode, d.summary, t.loop, t.scheduled_at FROM decisions d "
                "JOIN ticks t ON t.id = d.tick_id WHERE d.created_at >= :since ORDER BY d.id"
            ),
            {"since": since},
        ).all()
        ticks = session.execute(
            text("SELECT loop, count(*) AS n FROM ticks WHERE scheduled_at >= :since GROUP BY loop"), {"since": since}
        ).all()
        worker = session.execute(
            text("SELECT started_at, ready_at FROM local_workers WHERE started_at >= :since ORDER BY id LIMIT 1"),
            {"since": since},
        ).first()
    return {
        "ticks_since": {t.loop: t.n for t in ticks},
        "decisions": [
            {
                "id": d.id,
                "at_s": round(d.created_at.timestamp() - zero_s, 3),
                "target_decode": d.target_decode,
                "loop": d.loop,
                "summary": d.summary,
            }
            for d in decisions
        ],  # fmt: skip
        "engine_started_s": None if worker is None else round(worker.started_at.timestamp() - zero_s, 3),
        "engine_ready_s": None
        if worker is None or worker.ready_at is None
        else round(worker.ready_at.timestamp() - zero_s, 3),
    }


def run(root: Path) -> dict:
    tools = find_tools()
    spec = RunSpec(
        name="wake", adaptive=True, fixed_size=1, duration_s=0, ttft_ms=2000, itl_ms=100, interval_s=None,
        max_workers=1, trace=Path(), nice=0, profile_dir=PROFILE_DIR, cooldown_s=0, router="slo",
    )  # fmt: skip
    run_dir = _fresh_run_dir(spec, root)
    base_env = _base_env(run_dir)
    database_url = _migrated_database(run_dir)
    ports = _Ports(frontend=free_port(), prometheus=free_port(), prefect=free_port(), proxy=free_port())
    worker_env = _worker_env(tools, PROFILE_DIR)
    config = _config(run_dir, worker_env, f"http://127.0.0.1:{ports.prometheus}")
    figures: dict = {"idle_hold_s": IDLE_HOLD_S, "load_interval_s": LOAD_INTERVAL_S}
    with contextlib.ExitStack() as stack:
        _start_metrics_and_frontend(stack, spec, tools, run_dir, ports, base_env)
        url = f"http://127.0.0.1:{ports.proxy}"
        proxy = stack.enter_context(
            process(
                [sys.executable, "-m", "planner_cli", "route-proxy", "--frontend", f"http://127.0.0.1:{ports.frontend}",
                 "--discovery-dir", str(run_dir / "kv"), "--profile", str(PROFILE_DIR), "--ttft-ms", "2000",
                 "--itl-ms", "100", "--port", str(ports.proxy), "--wake-deployment", DEPLOYMENT,
                 "--wake-renotify-s", "5"],
                run_dir / "logs" / "route-proxy.log",
                base_env,
            )
        )  # fmt: skip
        wait_for("the routing proxy", lambda: get(f"{url}/route/status"), 60, proxy)
        stack.callback(_stop_workers, database_url, config)
        components = _start_planner(stack, run_dir, config, ports, base_env)
        wait_for("the first engine", lambda: MODEL_NAME.encode() in get(f"{url}/v1/models"), 300, components["serve"])
        figures["warm"] = asyncio.run(_requests(url, NUM_WARM_REQUESTS))
        idle_from = time.monotonic()
        wait_for("the pool at zero", lambda: _running_workers(database_url) == 0, ZERO_TIMEOUT_S, components["serve"])
        wait_for("the proxy to see no worker", lambda: not json.loads(get(f"{url}/route/status"))["workers"], 30)
        figures["to_zero_s"] = round(time.monotonic() - idle_from, 1)
        time.sleep(2 * LOAD_INTERVAL_S)  # at zero for a while: a wake is not the tail of the scale-down
        since = dt.datetime.now(dt.UTC)
        figures["aiperf_exit"], wake = _aiperf_wake(tools, url, run_dir, base_env)
        figures["proxy"] = json.loads(get(f"{url}/route/status"))
        figures["components_exited"] = {n: p.returncode for n, p in components.items() if p.poll() is not None}
    figures["wake"] = wake
    figures["num_wake_requests"] = NUM_WAKE_REQUESTS
    figures["lost_or_errored"] = NUM_WAKE_REQUESTS - sum(1 for r in wake if r["error"] is None)
    if not wake:
        figures["within_bound"] = False
        return figures
    first_sent_s = wake[0]["sent_at_s"]  # the times below are from the first request sent
    figures.update(_db_figures(database_url, since, first_sent_s))
    answered = [r for r in wake if r["error"] is None]
    # the wake latency: each request's wait for its first token (held at the proxy, then served)
    figures["wake_latency_max_s"] = max((r["first_token_s"] for r in answered), default=None)
    startup = None
    if figures["engine_started_s"] is not None and answered:
        # the engine's start-up: from its process start to the first token of the first answer (registration, the
        # frontend and the proxy's discovery included: an upper bound of the engine's own start)
        first_token_at = min(r["sent_at_s"] - first_sent_s + r["first_token_s"] for r in answered)
        startup = round(first_token_at - figures["engine_started_s"], 3)
    figures["engine_startup_s"] = startup
    # what the wake adds to the engine's start-up: the NOTIFY, the wake tick and the execution that starts it
    figures["wake_overhead_s"] = figures["engine_started_s"]
    figures["bound_s"] = None if startup is None else round(startup + LOAD_INTERVAL_S, 3)
    figures["within_bound"] = startup is not None and figures["wake_latency_max_s"] <= startup + LOAD_INTERVAL_S
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write the figures (JSON) here too")
    args = parser.parse_args(argv)
    from planner_core.runtime.store.db import stop_embedded_database

    root = REPO / ".planner" / "live"
    try:
        figures = run(root)
    finally:
        stop_embedded_database(root / "wake" / "data" / "pg")  # the run's database outlived it otherwise
    from planner_core.runtime.replay import code_version

    figures["date"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    figures["commit"] = code_version()
    figures["command"] = "python -m planner_core.lab.live.wake" + "".join(f" {a}" for a in sys.argv[1:])
    text = json.dumps(figures, indent=2, default=str)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0 if figures["within_bound"] and figures["lost_or_errored"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
