"""The fleet control plane on a real Postgres and a real Prefect server: the registry, one flow run ticking every
due member (a broken member does not block the others), the GPU budget arbitration recorded and replayed, and
the cut decisions executed."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys

import psycopg
import pytest

from planner_core.config import ConfigError
from planner_core.domain import Loop
from planner_core.runtime.fleet import (
    FleetError,
    add_member,
    due_ticks,
    list_members,
    read_fleet_folder,
    remove_member,
    replay_round,
    set_budget,
    slot_at,
    slot_phase_s,
    sync_members,
)
from planner_core.runtime.service import load_context
from planner_core.runtime.store.db import session_factory, to_libpq_uri
from tests.conftest import REPO_ROOT, write_config
from tests.runtime.databases import record_decision
from tests.runtime.lifecycle import STOP_SIGNAL_IDS, STOP_SIGNALS, start_command, stop_with

SLOT = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)  # a multiple of 60 s


def _rows(url: str, sql: str, *params):
    with psycopg.connect(to_libpq_uri(url)) as conn:
        return conn.execute(sql, params).fetchall()


def test_registry_add_list_update_remove(database_url, tmp_path, profile_dir) -> None:
    config = write_config(tmp_path)
    sessions = session_factory(database_url)
    with sessions.begin() as session:
        add_member(session, "chat", config, min_gpus=2, max_gpus=8, priority=1, weight=2.0)
        add_member(session, "batch", config)
    with sessions.begin() as session:
        add_member(session, "chat", config, min_gpus=3, max_gpus=8, priority=1, weight=2.0)  # an update
        members = list_members(session)
    assert [(m.name, m.min_gpus, m.max_gpus, m.priority, m.weight) for m in members] == [
        ("batch", 0, None, 0, 1.0),
        ("chat", 3, 8, 1, 2.0),
    ]
    with sessions.begin() as session:
        assert remove_member(session, "batch") is True
        assert remove_member(session, "batch") is False
        assert [m.name for m in list_members(session)] == ["chat"]
    events = [r[0] for r in _rows(database_url, "SELECT event FROM audit_log WHERE event LIKE 'fleet_%%' ORDER BY id")]
    assert events == ["fleet_member_added", "fleet_member_added", "fleet_member_added", "fleet_member_removed"]


@pytest.mark.parametrize(
    ("share", "message"),
    [
        ({"weight": 0.0}, "deployment 'bad': weight must be a finite number > 0, got 0.0"),
        ({"min_gpus": 4, "max_gpus": 2}, "deployment 'bad': max_gpus 2 is below min_gpus 4"),
        ({"min_gpus": -1}, "deployment 'bad': min_gpus must be >= 0, got -1"),
    ],
)
def test_registry_refuses_a_bad_share_writing_nothing(database_url, tmp_path, profile_dir, share, message) -> None:
    with pytest.raises(FleetError, match=message), session_factory(database_url).begin() as session:
        add_member(session, "bad", write_config(tmp_path), **share)
    assert _rows(database_url, "SELECT count(*) FROM deployments WHERE name = 'bad'") == [(0,)]


def test_cli_add_list_budget_remove(database_url, tmp_path, profile_dir) -> None:
    env = dict(os.environ, PLANNER_DATABASE_URL=database_url, PYTHONPATH=str(REPO_ROOT))
    config = write_config(tmp_path)

    def planner(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "planner_cli", *args], env=env, capture_output=True, text=True, timeout=120
        )

    assert (
        planner("deployments", "add", "chat", "--config", str(config), "--min-gpus", "2", "--weight", "3").returncode
        == 0
    )
    assert planner("deployments", "budget", "12").returncode == 0
    listed = planner("deployments", "list")
    assert "fleet budget: 12 GPUs" in listed.stdout and "chat\tmin 2\tmax -\tpriority 0\tweight 3" in listed.stdout
    bad = planner("deployments", "add", "x", "--config", str(tmp_path / "missing.yaml"))
    assert bad.returncode == 2 and "missing.yaml" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    # a budget that caps every scale-up is valid: said on stderr and recorded (as `serve` and `demo` do)
    capped = planner("deployments", "add", "capped", "--config", str(write_config(tmp_path, max_gpu_budget=2)))
    assert capped.returncode == 0 and "planner deployments add: warning: " in capped.stderr, capped.stderr
    assert "the prefill pool cannot scale up from its minimum of 1" in capped.stderr
    warned = _rows(database_url, "SELECT detail->>'warning' FROM audit_log WHERE event = 'config_warning'")
    assert [w for (w,) in warned] == [
        line.removeprefix("planner deployments add: warning: ") for line in capped.stderr.strip().splitlines()
    ]
    gone = planner("deployments", "remove", "nobody")
    assert gone.returncode == 2 and "deployment 'nobody': not a member of the fleet" in gone.stderr
    assert planner("deployments", "remove", "chat").returncode == 0
    assert "chat" not in planner("deployments", "list").stdout


def _fleet_folder(tmp_path, shares: dict[str, dict | None]):
    """A folder with one config file per entry, named `<entry>.yaml`, whose `fleet:` section is the entry's value."""
    import shutil

    folder = tmp_path / "fleet"
    folder.mkdir(exist_ok=True)
    for stem, share in shares.items():
        written = write_config(tmp_path) if share is None else write_config(tmp_path, fleet=share)
        shutil.move(written, folder / f"{stem}.yaml")
    return folder


def test_sync_registers_a_folder_updates_and_prunes(database_url, tmp_path, profile_dir) -> None:
    """A folder of config files is the fleet: each file a member named by `fleet.name` or its file name, with the
    share of its `fleet:` section; a second sync adds, updates and (with --prune) removes, and says what it did."""
    folder = _fleet_folder(tmp_path, {"chat": {"min_gpus": 2, "max_gpus": 8, "priority": 1, "weight": 2}, "b": None})
    sessions = session_factory(database_url)
    with sessions.begin() as session:
        add_member(session, "legacy", write_config(tmp_path))  # registered by hand, not in the folder
        plan = sync_members(session, read_fleet_folder(folder), prune=False)
    assert (plan.added, plan.updated, plan.unchanged, plan.removed, plan.kept) == (
        ("b", "chat"), (), (), (), ("legacy",)
    )  # fmt: skip
    with sessions.begin() as session:
        members = {m.name: (m.min_gpus, m.max_gpus, m.priority, m.weight) for m in list_members(session)}
    assert members == {"b": (0, None, 0, 1.0), "chat": (2, 8, 1, 2.0), "legacy": (0, None, 0, 1.0)}

    (folder / "b.yaml").unlink()
    _fleet_folder(tmp_path, {"chat": {"min_gpus": 4, "max_gpus": 8, "priority": 1, "weight": 2},
                             "x": {"name": "batch"}})  # fmt: skip
    with sessions.begin() as session:
        preview = sync_members(session, read_fleet_folder(folder), prune=True, dry_run=True)
    with sessions.begin() as session:
        assert [m.name for m in list_members(session)] == ["b", "chat", "legacy"]  # the dry run wrote nothing
        plan = sync_members(session, read_fleet_folder(folder), prune=True)
    assert plan == preview
    assert (plan.added, plan.updated, plan.unchanged, plan.removed, plan.kept) == (
        ("batch",), ("chat",), (), ("b", "legacy"), ()
    )  # fmt: skip
    with sessions.begin() as session:
        assert {m.name: m.min_gpus for m in list_members(session)} == {"batch": 0, "chat": 4}
        assert sync_members(session, read_fleet_folder(folder), prune=True).unchanged == ("batch", "chat")


def test_sync_refuses_a_bad_folder_writing_nothing(database_url, tmp_path, profile_dir) -> None:
    """A bad file anywhere in the folder, or two files naming one deployment: one line naming the file and the
    field, and the registry is left as it was."""
    folder = _fleet_folder(tmp_path, {"good": None, "bad": {"min_gpus": 4, "max_gpus": 2}})
    with pytest.raises(ConfigError) as error:
        read_fleet_folder(folder)
    message = str(error.value)
    assert "bad.yaml" in message and "max_gpus 2 is below min_gpus 4" in message and "\n" not in message
    (folder / "bad.yaml").unlink()
    _fleet_folder(tmp_path, {"other": {"name": "good"}})
    with pytest.raises(FleetError, match=r"other\.yaml: deployment 'good' is also declared by .*good\.yaml"):
        read_fleet_folder(folder)
    with pytest.raises(FleetError, match="missing: not a folder"):
        read_fleet_folder(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FleetError, match=r"empty: no config file \(\.yaml, \.yml, \.json\) in it"):
        read_fleet_folder(tmp_path / "empty")
    assert _rows(database_url, "SELECT count(*) FROM fleet_members") == [(0,)]


def test_cli_sync(database_url, tmp_path, profile_dir) -> None:
    """`deployments sync` says what it did on stdout; a budget that caps every scale-up of a member it writes is
    said on stderr and recorded (`config_warning`), as `deployments add`, `serve` and `demo` do."""
    env = dict(os.environ, PLANNER_DATABASE_URL=database_url, PYTHONPATH=str(REPO_ROOT))
    folder = _fleet_folder(tmp_path, {"chat": {"priority": 2}})
    capped = write_config(tmp_path, max_gpu_budget=2)
    capped.rename(folder / "capped.yaml")
    command = [sys.executable, "-m", "planner_cli", "deployments", "sync", str(folder)]
    dry = subprocess.run([*command, "--dry-run"], env=env, capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0 and dry.stdout.strip() == "added (dry run: nothing written): capped, chat", dry.stderr
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "added: capped, chat", done.stderr
    assert _rows(database_url, "SELECT priority FROM fleet_members ORDER BY priority") == [(0,), (2,)]
    said = "planner deployments sync: warning: "
    printed = [line.removeprefix(said) for line in done.stderr.splitlines() if line.startswith(said)]
    assert printed and all(f"{folder.resolve() / 'capped.yaml'}: field 'max_gpu_budget' = 2: " in w for w in printed)
    assert "the prefill pool cannot scale up from its minimum of 1" in done.stderr
    assert [line.removeprefix(said) for line in dry.stderr.splitlines() if line.startswith(said)] == printed
    warned = _rows(
        database_url,
        "SELECT a.detail->>'warning' FROM audit_log a JOIN deployments d ON d.id = a.deployment_id "
        "WHERE a.event = 'config_warning' AND d.name = 'capped' ORDER BY a.id",
    )
    assert [w for (w,) in warned] == printed
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert again.stdout.strip() == "unchanged: capped, chat" and said not in again.stderr  # nothing written or said


def test_due_ticks_follow_each_members_intervals_and_count_missed_slots(database_url, tmp_path, profile_dir) -> None:
    fast = write_config(tmp_path, enable_load_scaling=True, load_adjustment_interval_seconds=5)
    slow = write_config(tmp_path)  # throughput only, every 60 s
    sessions = session_factory(database_url)
    with sessions.begin() as session:
        members = [add_member(session, "fast", fast), add_member(session, "slow", slow)]
    contexts = {m.name: load_context(database_url, m.name, m.config_path) for m in members}
    configs = {name: ctx.config for name, ctx in contexts.items()}
    now = SLOT + dt.timedelta(seconds=7)
    # Throughput slots are offset from the minute by each member's phase; load slots are not.
    fast_slot, slow_slot = (slot_at(now, 60.0, slot_phase_s(m.deployment_id, Loop.THROUGHPUT, 60.0)) for m in members)
    assert fast_slot != slow_slot and all(now - dt.timedelta(seconds=60) < s <= now for s in (fast_slot, slow_slot))
    record_decision(contexts["slow"], "slow", slow_slot - dt.timedelta(seconds=180), 2, 2)  # a tick 3 slots ago
    with sessions.begin() as session:
        due = due_ticks(session, members, configs, now)
    assert sorted((d.deployment, d.loop.value, d.scheduled_at, d.num_missed) for d in due) == [
        ("fast", "load", SLOT + dt.timedelta(seconds=5), 0),
        ("fast", "throughput", fast_slot, 0),
        ("slow", "throughput", slow_slot, 2),  # the two slots between were never ticked
    ]


def test_throughput_phases_spread_a_fleets_slots_over_the_minute() -> None:
    """100 consecutive deployment ids with 60 s throughput ticks: each 5 s round holds 7 to 10 of their slots
    (all 100 in one round every minute without phases); the load loop keeps the epoch's grid."""
    phases_s = [slot_phase_s(deployment_id, Loop.THROUGHPUT, 60.0) for deployment_id in range(57, 157)]
    assert all(p == int(p) and 0 <= p < 60 for p in phases_s)
    per_round = [sum(5 * k <= p < 5 * (k + 1) for p in phases_s) for k in range(12)]
    assert min(per_round) >= 7 and max(per_round) <= 10, per_round
    assert {slot_phase_s(deployment_id, Loop.LOAD, 5.0) for deployment_id in range(1, 50)} == {0.0}
    at = dt.datetime(2026, 3, 1, 12, 0, 7, tzinfo=dt.UTC)
    assert slot_at(at, 60.0, 37.0) == dt.datetime(2026, 3, 1, 11, 59, 37, tzinfo=dt.UTC)
    assert slot_at(at, 60.0, 7.0) == at


@pytest.mark.prefect
def test_fleet_tick_ticks_members_arbitrates_and_executes(prefect_api_url, database_url, tmp_path, profile_dir):
    """Three members with pending decisions over a 10-GPU budget, plus one whose config broke after registering.

    Budget 10; minimums 2 + 2 + 0 = 4, 6 GPUs to share. `gold` (priority 1) proposes 4P+4D = 8 GPUs: 6 above its
    minimum, exactly what is left, so it is granted in full. `silver` (priority 0, proposes 3P+3D = 6) and `bronze`
    (priority 0, no pending decision, runs the default 1P+1D = 2) keep their minimums: silver 2 GPUs
    (`preempted_by_priority`), bronze 0 (`preempted_by_priority` too: it asked for 2 above its minimum). silver's
    decision is cut under 2 GPUs by its own guard: 1P+1D (its minimum endpoints).
    """
    from flows.fleet import run_fleet_tick

    sessions = session_factory(database_url)
    configs = {name: write_config(tmp_path) for name in ("gold", "silver", "bronze", "broken")}
    with sessions.begin() as session:
        add_member(session, "gold", configs["gold"], min_gpus=2, priority=1)
        add_member(session, "silver", configs["silver"], min_gpus=2, priority=0)
        add_member(session, "bronze", configs["bronze"], min_gpus=0, priority=0)
        add_member(session, "broken", configs["broken"])
        set_budget(session, 10)
    configs["broken"].write_text("ttft_ms: [not a number\n")
    before = SLOT - dt.timedelta(seconds=60)
    record_decision(load_context(database_url, "gold", configs["gold"]), "gold", before, 4, 4)
    record_decision(load_context(database_url, "silver", configs["silver"]), "silver", before, 3, 3)

    summary = run_fleet_tick(SLOT, database_url, max_concurrent=2)

    assert sorted(t["deployment"] for t in summary["ticks"]) == ["bronze", "gold", "silver"]
    assert set(summary["failed"]) == {"broken"} and configs["broken"].name in summary["failed"]["broken"]
    assert sorted((g["deployment"], g["granted_gpus"], g["reason"]) for g in summary["grants"]) == [
        ("bronze", 0, "preempted_by_priority"),
        ("gold", 8, "granted"),
        ("silver", 2, "preempted_by_priority"),
    ]
    grants = _rows(
        database_url,
        "SELECT d.name, g.proposed_prefill, g.proposed_decode, g.granted_prefill, g.granted_decode "
        "FROM arbitration_grants g JOIN deployments d ON d.id = g.deployment_id WHERE g.decision_id IS NOT NULL "
        "ORDER BY d.name",
    )
    assert grants == [("gold", 4, 4, 4, 4), ("silver", 3, 3, 1, 1)]
    # executed right after the round: the virtual connector holds the granted targets
    applied = _rows(
        database_url,
        "SELECT d.name, v.num_prefill_workers, v.num_decode_workers FROM virtual_connector_state v "
        "JOIN deployments d ON d.id = v.deployment_id WHERE v.decision_id >= 0 ORDER BY d.name",
    )
    assert applied == [("gold", 4, 4), ("silver", 1, 1)]
    [(round_id,)] = _rows(database_url, "SELECT id FROM arbitration_rounds")
    with sessions.begin() as session:
        same, _ = replay_round(session, round_id)
    assert same

    # A second control plane (or a retry) at the same slot ticks nothing twice and records no second round.
    again = run_fleet_tick(SLOT, database_url, max_concurrent=2)
    assert again["ticks"] == [] and again["grants"] == []
    assert _rows(database_url, "SELECT count(*) FROM ticks WHERE scheduled_at > %s", before) == [(3,)]

    # The next slot as one task run for the whole round: the same ticks, round and broken member.
    batched = run_fleet_tick(SLOT + dt.timedelta(seconds=60), database_url, max_concurrent=2, task_per_member=False)
    assert (batched["num_ticked"], set(batched["failed_to_load"])) == (3, {"broken"})
    assert len(batched["grants"]) == 3
    assert _rows(database_url, "SELECT count(*) FROM arbitration_rounds") == [(2,)]

    # Each member's tick is its own Prefect task run, named and tagged after its deployment.
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

    async def names() -> list[tuple[str, list[str]]]:
        async with get_client() as client:
            runs = await client.read_task_runs(
                task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="throughput-tick"))
            )
            return [(run.name, sorted(run.tags)) for run in runs]

    runs = asyncio.run(names())
    assert ("gold throughput-tick", ["deployment:gold", "fleet"]) in runs


def test_fleet_bench_counts_what_it_ran(database_url, tmp_path, profile_dir) -> None:
    """Three simulated deployments for 3 rounds of 5 s on simulated time: every load slot ticked once, the first
    round's throughput slot too, nothing missed or failed, and the measured sizes are the database's."""
    from planner_core.lab.fleet_bench.bench import run_fleet_bench

    config = write_config(tmp_path, enable_load_scaling=True, load_adjustment_interval_seconds=5)
    result = run_fleet_bench(database_url, config, num_deployments=3, duration_s=15.0, max_concurrent=2)
    assert (result.num_rounds, result.num_load_ticks, result.num_throughput_ticks) == (3, 9, 3)
    assert (result.missed_ticks, result.num_failed_ticks) == (0, 0)
    assert result.tick_ms_p50 > 0 and result.tick_ms_p99 >= result.tick_ms_p50
    assert result.cpu_s_planner > 0
    [(load_bytes,)] = _rows(
        database_url,
        "SELECT sum(pg_column_size(t.*)) FROM ticks t WHERE t.loop = 'load'",
    )
    assert result.bytes_per_load_tick > load_bytes / 9  # the tick rows alone are a part of the total
    assert _rows(database_url, "SELECT count(*) FROM arbitration_rounds") == [(3,)]


def test_two_control_planes_at_once_tick_each_slot_once(database_url, tmp_path, profile_dir) -> None:
    """Two control planes running the same rounds at the same time: every due tick is recorded once (the member's
    row lock and the tick's identity), one arbitration round per slot, no plane fails."""
    from concurrent.futures import ThreadPoolExecutor

    from planner_core.runtime.fleet import ContextCache, run_round

    config = write_config(tmp_path, enable_load_scaling=True, load_adjustment_interval_seconds=5)
    with session_factory(database_url).begin() as session:
        members = [add_member(session, f"m{i}", config, min_gpus=1, priority=i % 2) for i in range(4)]
        set_budget(session, 6)
    cache = ContextCache(database_url)
    contexts = {m.name: cache.get(m) for m in members}
    slots = [SLOT + dt.timedelta(seconds=5 * k) for k in range(3)]
    with ThreadPoolExecutor(2) as planes, ThreadPoolExecutor(2) as pool_a, ThreadPoolExecutor(2) as pool_b:
        results = []
        for at in slots:
            a = planes.submit(run_round, database_url, members, contexts, at, pool_a)
            b = planes.submit(run_round, database_url, members, contexts, at, pool_b)
            results.append((a.result(), b.result()))
    # slot 0: 4 load + 4 throughput ticks (each member's first, at its phase's slot); slots 1, 2: 4 load ticks each
    assert [a.num_ticked + b.num_ticked for a, b in results] == [8, 4, 4]
    assert all(not a.failed and not b.failed for a, b in results)
    assert [(a.grants is None) != (b.grants is None) for a, b in results] == [True, True, True]
    counts = _rows(database_url, "SELECT scheduled_at, count(*) FROM ticks WHERE loop = 'load' GROUP BY 1 ORDER BY 1")
    assert counts == [(slots[0], 4), (slots[1], 4), (slots[2], 4)]
    throughput = _rows(database_url, "SELECT count(*), count(DISTINCT deployment_id) FROM ticks WHERE loop <> 'load'")
    assert throughput == [(4, 4)]
    assert _rows(database_url, "SELECT count(*) FROM arbitration_rounds") == [(3,)]


def test_members_held_under_the_budget_decide_nothing_until_granted(database_url, tmp_path, profile_dir) -> None:
    """Three members over 60 s of 5 s rounds with a budget of their minimums only (2 GPUs each): every member is
    held where it is. With its fleet ceiling as a tick input, a held member proposes its want (which reaches the
    arbitration as its claim, above its grant) and records no decision, instead of one per tick that the
    arbitration cuts back to a no-op. The ticks replay identically with the recorded ceiling."""
    from planner_core.lab.fleet_bench import bench_config
    from planner_core.lab.fleet_bench.bench import BENCH_EPOCH, run_fleet_bench
    from planner_core.runtime.replay import replay

    config = bench_config(tmp_path, 5.0)
    result = run_fleet_bench(database_url, config, num_deployments=3, duration_s=60.0, budget_gpus=6)
    assert (result.num_rounds, result.num_failed_ticks) == (12, 0)
    # the members want more than the budget gives: their claims exceed their grants...
    [(over,)] = _rows(database_url, "SELECT count(*) FROM arbitration_grants WHERE proposed_gpus > granted_gpus")
    assert over > 0
    # ...and their ticks say why they do not decide it
    [(capped,)] = _rows(
        database_url, "SELECT count(*) FROM tick_steps WHERE step = 'fleet_ceiling' AND reason = 'fleet_ceiling_capped'"
    )
    assert capped > 0
    # no decision was cut to nothing by the arbitration or executed as a no-op
    assert _rows(database_url, "SELECT count(*) FROM decisions WHERE status = 'noop'") == [(0,)]
    [(with_ceiling,)] = _rows(database_url, "SELECT count(*) FROM ticks WHERE inputs::jsonb ? 'gpu_ceiling'")
    assert with_ceiling > 0
    with session_factory(database_url).begin() as session:
        names = [member.name for member in list_members(session)]
    capped_member = _rows(
        database_url,
        "SELECT d.name FROM tick_steps s JOIN ticks t ON t.id = s.tick_id JOIN deployments d ON d.id = t.deployment_id "
        "WHERE s.reason = 'fleet_ceiling_capped' LIMIT 1",
    )[0][0]
    assert capped_member in names
    summary = replay(database_url, capped_member, BENCH_EPOCH, BENCH_EPOCH + dt.timedelta(minutes=2))
    assert summary.num_ticks > 0 and summary.num_identical == summary.num_ticks


def test_fleet_ticks_run_without_flow_heartbeats_and_keep_the_other_settings() -> None:
    """A fleet tick's flow run has no heartbeat thread (its end would wait up to 1 s on it); the settings it runs
    with are the caller's otherwise, and derived once for the same caller's settings."""
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    from flows.fleet import _without_flow_heartbeats

    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        outside = get_current_settings()
        assert outside.flows.heartbeat_frequency is not None
        with _without_flow_heartbeats():
            first = get_current_settings()
        with _without_flow_heartbeats():
            second = get_current_settings()
        assert first is second and first is not outside
        assert first.flows.heartbeat_frequency is None and first.api.url == "http://127.0.0.1:9/api"
        assert get_current_settings() is outside


@pytest.mark.parametrize("sig", STOP_SIGNALS, ids=STOP_SIGNAL_IDS)
def test_a_signal_to_fleet_serve_finishes_the_round_and_stops_its_server(
    database_url, tmp_path, profile_dir, sig
) -> None:
    """Ctrl-C (the process group) or SIGTERM (the command) during a round: the round finishes (its member's tick
    recorded, no flow run left Running), the Prefect server the command started is stopped, exit 0 (SIGTERM used to
    crash the round and orphan the server). At start it says, and records, the budget warning of its member (a
    budget that caps every scale-up), as `serve` does."""
    import re

    import httpx

    env = dict(os.environ, PLANNER_DATABASE_URL=database_url, PLANNER_DATA_DIR=str(tmp_path / "data"))
    for name in ("PREFECT_API_URL", "PREFECT_HOME"):  # its own Prefect server and home
        env.pop(name, None)
    config = write_config(tmp_path, max_gpu_budget=2)  # valid; warned about by `add` and at each `fleet serve`
    added = subprocess.run(
        [sys.executable, "-m", "planner_cli.main", "deployments", "add", "m1", "--config", str(config)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    args = ["fleet", "serve", "--interval", "2", "--port", "0"]
    with start_command(
        args, env=env, log_path=tmp_path / "fleet.log", ready=lambda log: "Beginning flow run" in log
    ) as command:
        returncode = stop_with(command, sig, timeout_s=120)  # a round is in flight (or the next starts within 2 s)
    text = command.log()
    assert returncode == 0, text[-3000:]
    assert f"planner fleet serve: {sig.name}: finishing the round in flight" in text, text[-3000:]
    assert "planner fleet serve: stopped" in text and "Traceback" not in text and "TerminationSignal" not in text
    [ui] = re.findall(r"Prefect UI: (http://127\.0\.0\.1:\d+)", text)
    with pytest.raises(httpx.TransportError):  # the server it started is gone
        httpx.get(f"{ui}/api/health", timeout=5)
    with psycopg.connect(to_libpq_uri(database_url)) as conn:
        assert conn.execute("SELECT count(*) FROM ticks").fetchone()[0] >= 1  # the round in flight recorded
    said = "planner fleet serve: warning: "
    warned = [line.removeprefix(said) for line in text.splitlines() if line.startswith(said)]
    assert warned and "the prefill pool cannot scale up from its minimum of 1" in warned[0], text[-3000:]
    recorded = _rows(database_url, "SELECT detail->>'warning' FROM audit_log WHERE event = 'config_warning' "
                     "AND detail->>'deployment' = 'm1' ORDER BY id")  # fmt: skip
    assert [w for (w,) in recorded] == warned + warned  # `deployments add`'s, then `fleet serve`'s
