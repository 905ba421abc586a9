"""`planner chaos`: kill -9 the demo's processes at random and check that no decision is duplicated or lost.

The run, in a folder of its own (`--data-dir`, default a new folder under the data dir) with its own embedded
Postgres and its own Prefect server:

1. an uninterrupted `planner demo` of `--windows` windows (deployment `baseline`): the reference sequence;
2. rounds of the same demo under faults (deployments `chaos-1`, `chaos-2`, ...): each attempt is a fresh
   `planner demo` process, and before it ends one fault is injected, drawn at random:
   - `demo-random`: SIGKILL of the demo process at a random moment of its run (start-up, a tick, an execution,
     the report at the end: wherever it is);
   - `demo-after-tick`: SIGKILL as soon as a new tick row is committed (the moment between a tick's transaction
     and the execution of its decision, which a random kill rarely hits);
   - `postgres`: SIGKILL of the Postgres postmaster (crash recovery on restart); the demo loses its database and
     must end by itself (a hung demo is killed and counted);
   - `prefect`: SIGKILL of the Prefect server's process group and a restart on the same port; the demo either
     rides it out or ends (a hung demo is killed and counted);
   then the demo is started again, until the round's demo exits 0; a round ends when its run completes.
3. Every finished round is compared with the baseline: the ticks (scheduled time, reason, targets) and the
   decision history (time, targets, status, acknowledged), duplicates (two ticks at one scheduled time, two
   decisions of one tick), losses (a baseline tick or decision missing) and extras; the audit chain is verified.

Before the demo leg, `--ingest-kills N` runs the ingest leg (`planner_cli.chaos_ingest`): kill -9 of a
`planner ingest` process, and of Postgres under it, while a publisher sends numbered forward-pass metrics; the
stored samples are checked against the messages sent.

The JSON report (`--report`) has the kill counts by kind, each kill's log line, the per-round comparison and the
ingest leg's check. The demo runs the tick and the execution in one process (Prefect runs the tasks in-process),
so "the tick process" and "the execution process" are that one process, killed at different moments; the demo
runs no FPM ingest (its traffic comes from the simulator), which is why the ingest has a leg of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner_cli.chaos_ingest import INGEST_FAULTS, ingest_leg_clean, run_ingest_leg
from planner_cli.common import DEFAULT_TRACE, stop_like_ctrl_c
from planner_core.data import CHAOS_CONFIG
from planner_core.runtime.settings import RuntimeSettings

FAULTS = ("demo-random", "demo-after-tick", "postgres", "prefect")
HUNG_FACTOR = 3.0  # a demo still running this many baseline durations after a Postgres/Prefect fault is hung ...
POLL_S = 0.02
# The demos' runtime settings: the defaults (their environment drops every PLANNER_ variable but the data dir).
DEMO_SETTINGS = RuntimeSettings.model_construct()


@dataclass
class Kill:
    """One injected fault, as the report lists it."""

    round: int
    fault: str
    after_s: float  # since the attempt's demo started
    demo_exit: int | None  # the demo's exit status after the fault (None: it was the one killed)
    note: str = ""


@dataclass
class ChaosRun:
    """Where the run lives and the processes it owns (the Prefect server; Postgres is pgserver's)."""

    folder: Path
    port: int
    env: dict[str, str]
    prefect: subprocess.Popen | None = None
    demo: subprocess.Popen | None = None  # the demo attempt running now
    kills: list[Kill] = field(default_factory=list)
    commit: str | None = None  # the code's commit when the run began (the checkout may move while it runs)

    @property
    def pg_dir(self) -> Path:
        return self.folder / "data" / "pg"

    def owner_url(self) -> str:
        """The embedded server's superuser URL, starting the server if it is down (after a Postgres kill)."""
        from planner_core.runtime.store.db import embedded_database_url

        return embedded_database_url(self.pg_dir)

    # --- Prefect ------------------------------------------------------------------------------------------

    def start_prefect(self) -> None:
        from flows.prefect_server import wait_healthy

        prefect_bin = str(Path(sys.executable).parent / "prefect")
        log = (self.folder / "prefect-server.log").open("ab")
        self.prefect = subprocess.Popen(
            [prefect_bin, "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        wait_healthy(self.env["PREFECT_API_URL"], timeout_s=180)

    def kill_prefect(self) -> None:
        """SIGKILL the server's process group (the server and any worker it started), then wait for it."""
        if self.prefect is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.prefect.pid, signal.SIGKILL)
        self.prefect.wait(timeout=30)
        self.prefect = None

    def stop_prefect(self) -> None:
        if self.prefect is not None:
            os.killpg(self.prefect.pid, signal.SIGTERM)
            try:
                self.prefect.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill_prefect()
            self.prefect = None

    # --- Postgres -----------------------------------------------------------------------------------------

    def stop_postgres(self) -> None:
        """Stop the run's embedded Postgres (fast shutdown; SIGKILL if it is still there after 60 s), whoever
        started it last (this process, or a demo after a Postgres kill): the run leaves no server behind."""
        from planner_core.runtime.store.db import postmaster_pid, process_alive, stop_embedded_database

        pid = postmaster_pid(self.pg_dir)
        if pid is None or not stop_embedded_database(self.pg_dir):
            return
        deadline = time.monotonic() + 60
        while process_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if process_alive(pid):
            self.kill_postgres()

    def kill_postgres(self) -> bool:
        """SIGKILL the postmaster (its backends exit when they notice). False if it was not running."""
        from planner_core.runtime.store.db import postmaster_pid

        pid = postmaster_pid(self.pg_dir)
        if pid is None:
            return False
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # wait for the postmaster to be gone before anyone restarts it
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        return True


def _commit() -> str | None:
    """The code's git commit (None outside a git checkout), so a report says what it measured."""
    try:
        result = subprocess.run(
            ["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
    except OSError:
        return None
    return result.stdout.strip() or None if result.returncode == 0 else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rows(url: str, sql: str, *params: Any) -> list[tuple]:
    import psycopg

    from planner_core.runtime.store.db import to_libpq_uri

    with psycopg.connect(to_libpq_uri(url), connect_timeout=5) as conn:
        return conn.execute(sql, params).fetchall()


def _tick_count(url: str, deployment: str) -> int | None:
    """Ticks recorded for the deployment; None while the database cannot answer (down, or no schema yet)."""
    try:
        return _rows(
            url, "SELECT count(*) FROM ticks t JOIN deployments d ON d.id = t.deployment_id WHERE d.name = %s",
            deployment,
        )[0][0]  # fmt: skip
    except Exception:  # noqa: BLE001 (any failure here means "no answer yet"; the demo's own exit tells why)
        return None


def _demo_command(args: argparse.Namespace, deployment: str) -> list[str]:
    return [
        # resolved: the demo runs in the run's folder, so a path relative to the caller's folder would not be found
        sys.executable, "-m", "planner_cli.main", "demo", "--trace", str(args.trace.resolve()),
        "--config", str(args.config.resolve()),
        "--deployment", deployment, "--max-windows", str(args.windows), "--rate-scale", str(args.rate_scale),
    ]  # fmt: skip


def _start_demo(run: ChaosRun, args: argparse.Namespace, deployment: str, attempt: int) -> subprocess.Popen:
    log = (run.folder / "logs" / f"{deployment}-{attempt:03d}.log").open("wb")
    run.demo = subprocess.Popen(
        _demo_command(args, deployment), env=run.env, stdout=log, stderr=subprocess.STDOUT, cwd=run.folder
    )
    return run.demo


def _wait(process: subprocess.Popen, timeout_s: float) -> int | None:
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None


def _kill(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)


def hung_after_s(baseline_s: float, settings: RuntimeSettings) -> float:
    """... plus the waits a demo riding a fault out may spend within its configured bounds: restarting the embedded
    Postgres (or waiting for another process starting one), releasing its handle at exit, and the Prefect server's
    silence before giving up. Beyond that the demo has broken a bound: it is hung. (The baseline's duration alone
    misjudged a demo that restarted Postgres on a loaded machine and was finishing its exit: seed-26 round 33.)"""
    from planner_core.runtime.store.db import EXIT_LOCK_TIMEOUT_S

    return baseline_s * HUNG_FACTOR + settings.embedded_start_timeout_s + EXIT_LOCK_TIMEOUT_S + settings.prefect_lost_s


def _kill_hung(process: subprocess.Popen) -> None:
    """Kill a demo that neither finished nor failed, after asking it for every thread's stack (SIGUSR1: the CLI
    prints them to its log), so the log says where it was waiting."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGUSR1)
        time.sleep(2.0)
    _kill(process)


def run_baseline(run: ChaosRun, args: argparse.Namespace) -> float:
    """The uninterrupted demo; returns its wall time (s)."""
    started = time.monotonic()
    process = _start_demo(run, args, "baseline", 0)
    code = _wait(process, args.attempt_timeout_s)
    if code != 0:
        if code is None:
            _kill(process)
        raise RuntimeError(f"the uninterrupted demo failed (exit {code}): see {run.folder / 'logs'}")
    return time.monotonic() - started


def _inject(
    run: ChaosRun,
    rng: random.Random,
    process: subprocess.Popen,
    deployment: str,
    round_no: int,
    baseline_s: float,
    fault: str,
) -> Kill | None:
    """Inject `fault` during the running demo at a random moment, and see the demo to its end. None: the demo
    finished before the fault's moment came (no kill)."""
    started = time.monotonic()
    at_s = rng.uniform(0.0, baseline_s)
    if fault == "demo-after-tick":
        url = run.owner_url()
        before = _tick_count(url, deployment)
        while process.poll() is None and time.monotonic() - started < baseline_s * HUNG_FACTOR:
            now = _tick_count(url, deployment)
            if now is not None and before is not None and now > before:
                _kill(process)
                return Kill(round_no, fault, time.monotonic() - started, None, f"after tick {now}")
            if before is None:
                before = now
            time.sleep(POLL_S)
        if process.poll() is not None:
            return None
        fault = "demo-random"  # no new tick within the time: fall back to a plain kill now
    if _wait(process, at_s) is not None:
        return None  # finished first
    after_s = time.monotonic() - started
    if fault == "demo-random":
        _kill(process)
        return Kill(round_no, fault, after_s, None)
    if fault == "postgres":
        killed = run.kill_postgres()
        code = _wait(process, hung_after_s(baseline_s, DEMO_SETTINGS))
        note = "" if killed else "postmaster not running"
        if code is None:
            _kill_hung(process)
            note = (note + "; " if note else "") + "demo hung after the Postgres kill: killed (stacks in its log)"
        run.owner_url()  # restart Postgres (crash recovery) before the next attempt
        return Kill(round_no, fault, after_s, code, note)
    run.kill_prefect()
    run.start_prefect()
    code = _wait(process, hung_after_s(baseline_s, DEMO_SETTINGS))
    note = ""
    if code is None:
        _kill_hung(process)
        note = "demo hung after the Prefect restart: killed (stacks in its log)"
    return Kill(round_no, fault, after_s, code, note)


def _sequences(url: str, deployment: str) -> dict[str, list]:
    ticks = _rows(
        url,
        """SELECT t.scheduled_at, t.loop, t.reason, d.target_prefill, d.target_decode
             FROM ticks t JOIN deployments dep ON dep.id = t.deployment_id
             LEFT JOIN decisions d ON d.tick_id = t.id
            WHERE dep.name = %s ORDER BY t.scheduled_at, t.loop""",
        deployment,
    )
    decisions = _rows(
        url,
        """SELECT decided_at, target_prefill, target_decode, status, acknowledged_at IS NOT NULL
             FROM decision_history WHERE deployment = %s ORDER BY decided_at""",
        deployment,
    )
    duplicate_ticks = _rows(
        url,
        """SELECT count(*) FROM (SELECT 1 FROM ticks t JOIN deployments dep ON dep.id = t.deployment_id
            WHERE dep.name = %s GROUP BY t.loop, t.scheduled_at HAVING count(*) > 1) x""",
        deployment,
    )[0][0]
    duplicate_decisions = _rows(
        url,
        """SELECT count(*) FROM (SELECT 1 FROM decisions d JOIN deployments dep ON dep.id = d.deployment_id
            WHERE dep.name = %s GROUP BY d.tick_id HAVING count(*) > 1) x""",
        deployment,
    )[0][0]
    return {"ticks": ticks, "decisions": decisions, "dup_ticks": duplicate_ticks, "dup_decisions": duplicate_decisions}


def diff_rows(baseline: list[tuple], got: list[tuple], key_fields: int) -> dict[str, list]:
    """Rows keyed by their first `key_fields` fields (a tick's scheduled time and loop, a decision's time): the
    baseline's rows whose key `got` lacks (lost), `got`'s rows whose key the baseline lacks (extra), and the keys
    in both whose rows differ (changed: recorded once, with other content)."""

    def keyed(rows: list[tuple]) -> dict[Any, tuple]:
        return {row[:key_fields]: row for row in rows}

    old, new = keyed(baseline), keyed(got)
    return {
        "lost": [old[k] for k in old if k not in new],
        "extra": [new[k] for k in new if k not in old],
        "changed": [(old[k], new[k]) for k in old if k in new and old[k] != new[k]],
    }


def compare_round(url: str, deployment: str, baseline: dict[str, list]) -> dict[str, Any]:
    """One finished round against the baseline: duplicates, losses, extras, changed rows, identical sequences."""
    got = _sequences(url, deployment)
    ticks = diff_rows(baseline["ticks"], got["ticks"], key_fields=2)  # (scheduled_at, loop)
    decisions = diff_rows(baseline["decisions"], got["decisions"], key_fields=1)  # decided_at
    return {
        "deployment": deployment,
        "num_ticks": len(got["ticks"]),
        "num_decisions": len(got["decisions"]),
        "duplicate_ticks": got["dup_ticks"],
        "duplicate_decisions": got["dup_decisions"],
        "lost_ticks": len(ticks["lost"]),
        "lost_decisions": len(decisions["lost"]),
        "extra_ticks": len(ticks["extra"]),
        "extra_decisions": len(decisions["extra"]),
        "changed_ticks": len(ticks["changed"]),
        "changed_decisions": len(decisions["changed"]),
        "changes": [[str(value) for value in pair] for pair in ticks["changed"] + decisions["changed"]],
        "ticks_identical": got["ticks"] == baseline["ticks"],
        "decisions_identical": got["decisions"] == baseline["decisions"],
    }


def run_chaos(args: argparse.Namespace) -> dict[str, Any]:
    """The whole run (module docstring); returns the report, also written to `--report` after every round (so a
    long run stopped early leaves its figures so far)."""
    from planner_core.runtime.store.audit_chain import verify_chain
    from planner_core.runtime.store.db import get_engine, session_factory, to_sqlalchemy_url

    rng = random.Random(args.seed)
    folder = args.data_dir or RuntimeSettings().data_dir / f"chaos-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}"
    folder = folder.resolve()
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    port = _free_port()
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
    run = ChaosRun(folder=folder, port=port, env=env, commit=_commit())
    print(f"run folder: {folder} (each demo attempt's log in logs/)", file=sys.stderr)
    started_at = dt.datetime.now(dt.UTC)
    wall_started = time.monotonic()
    rounds: list[dict[str, Any]] = []
    num_attempts = 0
    # SIGINT is set too, since a process started in the background by a shell inherits SIGINT ignored and Ctrl-C
    # (or a SIGINT sent to it) would otherwise be lost
    stop_like_ctrl_c()
    ingest: dict[str, Any] | None = None
    baseline: dict[str, list] = {"ticks": [], "decisions": []}
    baseline_s = 0.0
    try:
        run.owner_url()  # the embedded server, initialised before any kill (a first initialisation is not a target)
        if args.ingest_kills > 0:
            ingest = run_ingest_leg(
                run, num_kills=args.ingest_kills, config=args.config.resolve(), seed=args.seed,
                rate_hz=args.ingest_rate_hz, rng=rng, port=_free_port(), reconnect_s=args.ingest_reconnect_s,
                log=lambda line: print(line, file=sys.stderr),
            )  # fmt: skip
            print(f"ingest leg: {_ingest_summary(ingest)}", file=sys.stderr)
        if args.kills > 0:
            run.start_prefect()
            baseline_s = run_baseline(run, args)
            print(f"baseline: {args.windows} windows in {baseline_s:.1f} s", file=sys.stderr)
            baseline = _sequences(run.owner_url(), "baseline")
        round_no = 0

        def out_of_time() -> bool:
            return args.max_duration_s is not None and time.monotonic() - wall_started > args.max_duration_s

        while len(run.kills) < args.kills and not out_of_time():
            round_no += 1
            deployment = f"chaos-{round_no}"
            kills_before = len(run.kills)
            while True:
                num_attempts += 1
                process = _start_demo(run, args, deployment, num_attempts)
                if len(run.kills) < args.kills and not out_of_time():
                    fault = args.faults[len(run.kills) % len(args.faults)] if args.cycle else rng.choice(args.faults)
                    kill = _inject(run, rng, process, deployment, round_no, baseline_s, fault)
                    if kill is not None:
                        run.kills.append(kill)
                        print(f"kill {len(run.kills)}: {kill}", file=sys.stderr)
                        if kill.demo_exit == 0:
                            break  # the demo rode out the fault and finished the round
                        continue
                code = _wait(process, args.attempt_timeout_s)
                if code == 0:
                    break
                if code is None:
                    _kill(process)
                run.owner_url()  # a failed attempt (after a fault): Postgres back up, try again
            result = compare_round(run.owner_url(), deployment, baseline)
            result["num_kills"] = len(run.kills) - kills_before
            rounds.append(result)
            print(f"round {round_no}: {result}", file=sys.stderr)
            _write_report(
                args, _report(args, run, rounds, baseline, baseline_s, num_attempts, started_at, None, ingest)
            )
        url = to_sqlalchemy_url(run.owner_url())
        with session_factory(url).begin() as session:
            chain = verify_chain(session)
        get_engine(url).dispose()
    finally:
        if run.demo is not None and run.demo.poll() is None:
            _kill(run.demo)  # an interrupted run leaves no demo behind
        run.stop_prefect()
        run.stop_postgres()  # on success, error, Ctrl-C or SIGTERM alike
    report = _report(args, run, rounds, baseline, baseline_s, num_attempts, started_at, chain, ingest)
    _write_report(args, report)
    return report


def _write_report(args: argparse.Namespace, report: dict[str, Any]) -> None:
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps(report, indent=2, default=str) + "\n")


def _report(
    args: argparse.Namespace,
    run: ChaosRun,
    rounds: list[dict[str, Any]],
    baseline: dict[str, list],
    baseline_s: float,
    num_attempts: int,
    started_at: dt.datetime,
    chain: Any,
    ingest: dict[str, Any] | None,
) -> dict[str, Any]:
    """The JSON report; `chain` (the audit chain check) is None while the run is still going, `ingest` (the
    ingest leg's result) None when it did not run. `num_kills` and `kills_by_fault` count both legs."""
    by_fault = {fault: sum(1 for k in run.kills if k.fault == fault) for fault in FAULTS}
    by_fault |= {fault: 0 if ingest is None else ingest["kills_by_fault"][fault] for fault in INGEST_FAULTS}
    return {
        "command": " ".join(["planner", *args.argv]),
        "commit": run.commit,
        "started_at": started_at.isoformat(timespec="seconds"),
        "finished": chain is not None,
        "duration_s": round((dt.datetime.now(dt.UTC) - started_at).total_seconds(), 1),
        "seed": args.seed,
        "windows": args.windows,
        "baseline_s": round(baseline_s, 1),
        "num_kills": sum(by_fault.values()),
        "num_demo_kills": len(run.kills),
        "kills_by_fault": by_fault,
        "num_demo_attempts": num_attempts,
        "hung_demos_killed": sum(1 for k in run.kills if "hung" in k.note),
        "num_rounds": len(rounds),
        "duplicate_ticks": sum(r["duplicate_ticks"] for r in rounds),
        "duplicate_decisions": sum(r["duplicate_decisions"] for r in rounds),
        "lost_ticks": sum(r["lost_ticks"] for r in rounds),
        "lost_decisions": sum(r["lost_decisions"] for r in rounds),
        "extra_ticks": sum(r["extra_ticks"] for r in rounds),
        "extra_decisions": sum(r["extra_decisions"] for r in rounds),
        "changed_ticks": sum(r["changed_ticks"] for r in rounds),
        "changed_decisions": sum(r["changed_decisions"] for r in rounds),
        "rounds_identical": sum(1 for r in rounds if r["ticks_identical"] and r["decisions_identical"]),
        "baseline_ticks": len(baseline["ticks"]),
        "baseline_decisions": len(baseline["decisions"]),
        "audit_chain": None
        if chain is None
        else {"ok": chain.ok, "num_rows": chain.num_rows, "broken": chain.broken and chain.broken.line()},
        "ingest": ingest,
        "rounds": rounds,
        "kills": [k.__dict__ for k in run.kills],
    }  # no folder: a machine-local path, meaningless in a report kept elsewhere (printed at the start instead)


def _ingest_summary(ingest: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in ingest.items() if k != "faults"}


def cmd_chaos(args: argparse.Namespace) -> int:
    if args.kills < 0 or args.ingest_kills < 0 or args.kills + args.ingest_kills < 1:
        raise ValueError(
            f"--kills = {args.kills}, --ingest-kills = {args.ingest_kills}: need at least 1 kill in all, none negative"
        )
    if args.windows < 2:
        raise ValueError(f"--windows = {args.windows}: need at least 2 windows")
    if not args.ingest_rate_hz > 0 or not args.ingest_reconnect_s >= 0:
        raise ValueError(
            f"--ingest-rate-hz = {args.ingest_rate_hz}, --ingest-reconnect-s = {args.ingest_reconnect_s}: "
            "need a rate > 0 and a reconnection allowance >= 0"
        )
    unknown = sorted(set(args.faults) - set(FAULTS))
    if unknown:
        known = ", ".join(FAULTS)
        raise ValueError(f"--faults = {','.join(args.faults)}: unknown {', '.join(unknown)} (known: {known})")
    report = run_chaos(args)
    summary = {k: v for k, v in report.items() if k not in ("rounds", "kills", "ingest")}
    if report["ingest"] is not None:
        summary["ingest"] = _ingest_summary(report["ingest"])
    print(json.dumps(summary, indent=2, default=str))
    clean = (
        report["duplicate_ticks"] == report["duplicate_decisions"] == 0
        and report["lost_ticks"] == report["lost_decisions"] == 0
        and report["extra_ticks"] == report["extra_decisions"] == 0
        and report["rounds_identical"] == report["num_rounds"]
        and report["audit_chain"]["ok"]
        and (report["ingest"] is None or ingest_leg_clean(report["ingest"]))
    )
    return 0 if clean else 1


def register(sub: argparse._SubParsersAction) -> None:
    """Add the chaos command's parser."""
    chaos = sub.add_parser(
        "chaos", help="kill -9 the demo, Postgres and Prefect at random; report duplicated or lost decisions"
    )
    chaos.add_argument("--kills", type=int, default=10, help="faults to inject over demo runs (0: no demo leg)")
    chaos.add_argument(
        "--ingest-kills", type=int, default=0,
        help="faults to inject under a running FPM ingest first (kill -9 of the ingest, or of Postgres under it)",
    )  # fmt: skip
    chaos.add_argument(
        "--ingest-rate-hz", type=float, default=50.0, help="forward-pass messages per second the ingest leg publishes"
    )
    chaos.add_argument(
        "--ingest-reconnect-s", type=float, default=1.0,
        help="after a restarted ingest listens, how long a message may still be lost (publisher reconnection)",
    )  # fmt: skip
    chaos.add_argument("--windows", type=int, default=12, help="throughput windows of each demo run")
    chaos.add_argument("--seed", type=int, default=0, help="seed of the fault draws and their moments")
    chaos.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="the demo's trace")
    chaos.add_argument(
        "--config", type=Path, default=CHAOS_CONFIG,
        help="the demo's PlannerConfig (default: the recommended policy without its scale-down hold: it decides often)",
    )  # fmt: skip
    chaos.add_argument("--rate-scale", type=float, default=12.0, help="the demo's --rate-scale")
    chaos.add_argument(
        "--data-dir", type=Path, default=None,
        help="folder of the run (its Postgres, Prefect home, logs); default: chaos-<time> in the data dir",
    )  # fmt: skip
    chaos.add_argument(
        "--faults", type=lambda text: tuple(text.split(",")), default=FAULTS,
        help=f"comma-separated fault kinds to draw from (default: all of {','.join(FAULTS)})",
    )  # fmt: skip
    chaos.add_argument(
        "--cycle", action="store_true", help="take the faults in turn (in --faults order) instead of drawing them"
    )
    chaos.add_argument(
        "--max-duration-s", type=float, default=None,
        help="inject no fault after this much wall time; the round under way is finished and reported",
    )  # fmt: skip
    chaos.add_argument("--report", type=Path, default=None, help="write the JSON report here")
    chaos.add_argument(
        "--attempt-timeout-s", type=float, default=900.0, help="a demo attempt running longer is hung: killed"
    )
    chaos.set_defaults(func=cmd_chaos)
