"""`planner chaos`, small: a few kill -9s of the FPM ingest, the demo, Postgres and the Prefect server, then every
finished round compared with an uninterrupted one and the stored samples with the messages sent (the full run,
100+ kills, is in docs/operations.md); the ingest leg's check on rows planted to fail it; and the command leaves no
server behind, at its end or on Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.prefect


def _chaos_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("PLANNER_", "PREFECT_"))}


def _processes_of(folder: Path) -> list[str]:
    """Processes still running for the run in `folder`: a command line (Postgres' `-D <folder>/...`) or an
    environment (the Prefect server's and the demos' PREFECT_HOME / PLANNER_DATA_DIR) that names it."""
    mark = str(folder)
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = " ".join(process.info["cmdline"] or ())
            environ = process.environ() if mark not in cmdline else {}
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if mark in cmdline or any(mark in value for value in environ.values()):
            found.append(f"{process.info['pid']}: {cmdline[:200]}")
    return found


def test_a_small_chaos_run_loses_and_duplicates_nothing(tmp_path) -> None:
    """Two faults under a running FPM ingest (kill -9 of the ingest or of Postgres under it), then a kill of the
    demo just after a tick's commit (before its execution) and a kill -9 of Postgres, in turn (`--cycle`), over
    2-window demos at a light rate (kept to a couple of minutes for `make test`; the other two demo kinds, a kill at
    a random moment and a Prefect restart, are in the full run): every stored sample was sent, once and unchanged,
    and every lost one was sent while no ingest listened; every round ends identical to the uninterrupted run, with
    no duplicated, lost or changed tick or decision; the audit chain holds; and the run stops the Postgres and
    Prefect servers it started."""
    report_path = tmp_path / "chaos.json"
    command = [
        sys.executable, "-m", "planner_cli.main", "chaos", "--kills", "2", "--windows", "2", "--rate-scale", "2",
        "--seed", "6", "--cycle", "--faults", "demo-after-tick,postgres", "--ingest-kills", "2",
        "--data-dir", str(tmp_path / "run"), "--report", str(report_path),
    ]  # fmt: skip
    result = subprocess.run(command, env=_chaos_env(), cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["finished"] and report["num_kills"] == 4 and report["num_demo_kills"] == 2 == len(report["kills"])
    # one of each (a `demo-after-tick` that saw no new tick in time falls back to a plain kill, and says so)
    assert report["kills_by_fault"]["postgres"] == 1 and sum(report["kills_by_fault"].values()) == 4
    ingest = report["ingest"]
    assert ingest["num_kills"] == 2 == len(ingest["faults"])
    assert ingest["kills_by_fault"]["ingest"] + ingest["kills_by_fault"]["postgres-under-ingest"] == 2
    assert ingest["duplicated"] == ingest["changed"] == ingest["extra"] == ingest["lost_unexplained"] == 0, ingest
    assert ingest["num_stored"] > 0 and ingest["num_stored"] + ingest["lost"] == ingest["num_sent"]
    # each kill that ended its attempt (the demo killed, or failing after the Postgres kill) takes one more; a demo
    # can also ride out the Postgres kill (it had written everything already) and finish its attempt
    ended_attempts = sum(1 for kill in report["kills"] if kill["demo_exit"] != 0)
    assert ended_attempts >= 1 and report["num_demo_attempts"] >= 1 + ended_attempts
    for figure in ("duplicate_ticks", "duplicate_decisions", "lost_ticks", "lost_decisions", "changed_ticks"):
        assert report[figure] == 0, figure
    assert report["num_rounds"] >= 1 and report["rounds_identical"] == report["num_rounds"]
    assert all(r["num_ticks"] == report["baseline_ticks"] == 2 for r in report["rounds"])
    assert report["audit_chain"]["ok"] and report["audit_chain"]["num_rows"] > 0
    assert json.loads(result.stdout)["num_kills"] == 4  # the summary printed on stdout
    assert not (tmp_path / "run" / "data" / "pg" / "postmaster.pid").exists()
    assert _processes_of(tmp_path / "run") == []


def test_ctrl_c_stops_the_servers_the_run_started(tmp_path) -> None:
    """Ctrl-C while the run starts its Prefect server, with its Postgres up: exit 130 within a minute, and neither
    server (nor anything else of the run) is left running."""
    folder = tmp_path / "run"
    command = [sys.executable, "-m", "planner_cli.main", "chaos", "--kills", "1", "--data-dir", str(folder)]
    process = subprocess.Popen(command, env=_chaos_env(), cwd=REPO_ROOT, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and process.poll() is None:
            started = (folder / "data" / "pg" / "postmaster.pid").exists() and any(
                "server start" in line for line in _processes_of(folder)
            )
            if started:
                break
            time.sleep(0.2)
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        assert (folder / "data" / "pg" / "postmaster.pid").exists(), "Postgres never started"
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == "planner: interrupted"
    assert not (folder / "data" / "pg" / "postmaster.pid").exists()
    assert _processes_of(folder) == []


def test_chaos_refuses_an_unknown_fault(tmp_path) -> None:
    """A fault kind it does not know is one line and exit 2, before anything starts."""
    command = [sys.executable, "-m", "planner_cli.main", "chaos", "--faults", "postgres,disk", "--data-dir",
               str(tmp_path / "run")]  # fmt: skip
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "planner: error: --faults = postgres,disk: unknown disk "
        "(known: demo-random, demo-after-tick, postgres, prefect)"
    )
    assert not (tmp_path / "run").exists()


def test_diff_rows_tells_lost_extra_and_changed_apart() -> None:
    """A tick missing, one more, and one recorded with another reason: each counted once, in its own kind."""
    from planner_core.lab.chaos import diff_rows

    baseline = [(1, "t", "no_change"), (2, "t", "no_change"), (3, "t", "scale")]
    got = [(1, "t", "no_change"), (2, "t", "no_traffic_data"), (4, "t", "no_change")]
    assert diff_rows(baseline, got, key_fields=2) == {
        "lost": [(3, "t", "scale")],
        "extra": [(4, "t", "no_change")],
        "changed": [((2, "t", "no_change"), (2, "t", "no_traffic_data"))],
    }
    assert diff_rows(baseline, baseline, key_fields=2) == {"lost": [], "extra": [], "changed": []}


def test_the_ingest_check_counts_each_kind_of_defect(database_url) -> None:
    """Samples planted in the leg's deployment: message 3 stored twice, 5 with another figure, one that was never
    sent, 7 and 8 missing; 7 was sent inside an ingest kill's window and 8 outside any (and inside a Postgres
    kill's, which explains nothing: the ingest must keep samples in memory then). Each is counted in its kind."""
    import dataclasses
    import datetime as dt

    from planner_core.data import DEFAULT_CONFIG
    from planner_core.lab.chaos.ingest_leg import DEPLOYMENT, IngestFault, check_ingest_leg, synthetic_message
    from planner_core.runtime.ingest import resolve_deployment_id
    from planner_core.runtime.store.db import session_factory, to_sqlalchemy_url
    from planner_core.runtime.store.fpm import FpmSample, insert_fpm_samples

    seed, now = 5, dt.datetime(2026, 11, 26, tzinfo=dt.UTC)
    sent_at_s = [float(i) for i in range(10)]  # message i sent at i s
    messages = [synthetic_message(seed, i) for i in (0, 1, 2, 3, 3, 4, 6, 9)]
    messages.append(dataclasses.replace(synthetic_message(seed, 5), wall_time_s=123.0))
    messages.append(synthetic_message(seed, 10))  # the publisher sent 10 messages (0..9): this one never was
    assert synthetic_message(seed, 6) == synthetic_message(seed, 6) != synthetic_message(seed + 1, 6)
    deployment_id = resolve_deployment_id(database_url, DEPLOYMENT, DEFAULT_CONFIG)
    with session_factory(to_sqlalchemy_url(database_url)).begin() as session:
        insert_fpm_samples(session, deployment_id, [FpmSample(fpm=m, received_at=now, version=1) for m in messages])
    faults = [
        IngestFault("ingest", at_s=6.5, ready_at_s=6.8, caught_up_at_s=6.2),  # window [6.2, 7.3]: explains 7
        IngestFault("postgres-under-ingest", at_s=7.9, ready_at_s=8.5, caught_up_at_s=7.5),  # explains nothing
    ]
    result = check_ingest_leg(database_url, seed=seed, faults=faults, sent_at_s=sent_at_s, rate_hz=1.0, reconnect_s=0.5)
    assert {k: result[k] for k in ("num_sent", "num_stored", "duplicated", "changed", "extra", "lost")} == {
        "num_sent": 10, "num_stored": 10, "duplicated": 1, "changed": 1, "extra": 1, "lost": 2,
    }  # fmt: skip
    assert (result["lost_explained"], result["lost_unexplained"], result["unexplained_sent_at_s"]) == (1, 1, [8.0])
    assert result["kills_by_fault"] == {"ingest": 1, "postgres-under-ingest": 1}
