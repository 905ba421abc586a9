"""The fault suite's whole run (`run_chaos`): the run's folder and servers, the ingest leg, the baseline demo,
then rounds of the demo under faults, each compared with the baseline, the audit chain verified at the end."""

from __future__ import annotations

import datetime as dt
import os
import random
import sys
import time
from typing import Any

from planner_core.lab.chaos.demo_leg import inject, kill, run_baseline, start_demo, wait_exit
from planner_core.lab.chaos.ingest_leg import run_ingest_leg
from planner_core.lab.chaos.options import ChaosOptions
from planner_core.lab.chaos.queries import compare_round, sequences
from planner_core.lab.chaos.report import build_report, ingest_summary, write_report
from planner_core.lab.chaos.stack import ChaosRun
from planner_core.runtime.localhost import code_commit, free_port
from planner_core.runtime.settings import RuntimeSettings


def _new_run(options: ChaosOptions) -> ChaosRun:
    """The run's folder (its logs/ made) and the environment of its processes: their own data dir, Prefect home
    and Prefect server on a free port, nothing else of the caller's PLANNER_ and PREFECT_ settings."""
    folder = options.data_dir or RuntimeSettings().data_dir / f"chaos-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}"
    folder = folder.resolve()
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PLANNER_", "PREFECT_"))}
    env |= {
        "PLANNER_DATA_DIR": str(folder / "data"),
        "PREFECT_HOME": str(folder / "prefect"),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_LOGGING_TO_API_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "OPENBLAS_NUM_THREADS": "1",
    }
    return ChaosRun(folder=folder, port=port, env=env, commit=code_commit())


def _demo_round(
    run: ChaosRun, options: ChaosOptions, rng: random.Random, *, round_no: int, baseline_s: float,
    num_attempts: int, out_of_time,
) -> int:  # fmt: skip
    """One round: demo attempts of deployment `chaos-<round_no>`, each with a fault while kills remain, until one
    finishes; the number of attempts so far."""
    deployment = f"chaos-{round_no}"
    while True:
        num_attempts += 1
        process = start_demo(run, options, deployment, num_attempts)
        if len(run.kills) < options.kills and not out_of_time():
            faults = options.faults
            fault = faults[len(run.kills) % len(faults)] if options.cycle else rng.choice(faults)
            killed = inject(run, rng, process, deployment, round_no, baseline_s, fault)
            if killed is not None:
                run.kills.append(killed)
                print(f"kill {len(run.kills)}: {killed}", file=sys.stderr)
                if killed.demo_exit == 0:
                    return num_attempts  # the demo rode out the fault and finished the round
                continue
        code = wait_exit(process, options.attempt_timeout_s)
        if code == 0:
            return num_attempts
        if code is None:
            kill(process)
        run.owner_url()  # a failed attempt (after a fault): Postgres back up, try again


def _verified_chain(run: ChaosRun) -> Any:
    """The audit chain's check on the run's database at the end."""
    from planner_core.runtime.store.audit_chain import verify_chain
    from planner_core.runtime.store.db import get_engine, session_factory, to_sqlalchemy_url

    url = to_sqlalchemy_url(run.owner_url())
    with session_factory(url).begin() as session:
        chain = verify_chain(session)
    get_engine(url).dispose()
    return chain


def run_chaos(options: ChaosOptions) -> dict[str, Any]:
    """The whole run (the room's docstring); returns the report, also written to `--report` after every round (so a
    long run stopped early leaves its figures so far)."""
    rng = random.Random(options.seed)
    run = _new_run(options)
    print(f"run folder: {run.folder} (each demo attempt's log in logs/)", file=sys.stderr)
    started_at = dt.datetime.now(dt.UTC)
    wall_started = time.monotonic()
    rounds: list[dict[str, Any]] = []
    num_attempts = 0
    ingest: dict[str, Any] | None = None
    baseline: dict[str, list] = {"ticks": [], "decisions": []}
    baseline_s = 0.0

    def out_of_time() -> bool:
        return options.max_duration_s is not None and time.monotonic() - wall_started > options.max_duration_s

    try:
        run.owner_url()  # the embedded server, initialised before any kill (a first initialisation is not a target)
        if options.ingest_kills > 0:
            ingest = run_ingest_leg(
                run, num_kills=options.ingest_kills, config=options.config.resolve(), seed=options.seed,
                rate_hz=options.ingest_rate_hz, rng=rng, port=free_port(), reconnect_s=options.ingest_reconnect_s,
                log=lambda line: print(line, file=sys.stderr),
            )  # fmt: skip
            print(f"ingest leg: {ingest_summary(ingest)}", file=sys.stderr)
        if options.kills > 0:
            run.start_prefect()
            baseline_s = run_baseline(run, options)
            print(f"baseline: {options.windows} windows in {baseline_s:.1f} s", file=sys.stderr)
            baseline = sequences(run.owner_url(), "baseline")
        round_no = 0
        while len(run.kills) < options.kills and not out_of_time():
            round_no += 1
            kills_before = len(run.kills)
            num_attempts = _demo_round(
                run, options, rng, round_no=round_no, baseline_s=baseline_s, num_attempts=num_attempts,
                out_of_time=out_of_time,
            )  # fmt: skip
            result = compare_round(run.owner_url(), f"chaos-{round_no}", baseline)
            result["num_kills"] = len(run.kills) - kills_before
            rounds.append(result)
            print(f"round {round_no}: {result}", file=sys.stderr)
            so_far = build_report(options, run, rounds, baseline, baseline_s, num_attempts, started_at, None, ingest)
            write_report(options, so_far)
        chain = _verified_chain(run)
    finally:
        if run.demo is not None and run.demo.poll() is None:
            kill(run.demo)  # an interrupted run leaves no demo behind
        run.stop_prefect()
        run.stop_postgres()  # on success, error, Ctrl-C or SIGTERM alike
    report = build_report(options, run, rounds, baseline, baseline_s, num_attempts, started_at, chain, ingest)
    write_report(options, report)
    return report
