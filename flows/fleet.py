"""The fleet control plane: one `fleet-tick` flow run per interval ticks every due member of the fleet.

Each due (deployment, loop) slot is one task run (`fleet-member-tick`, named and tagged after its deployment, so the
Prefect UI lists each deployment's ticks), mapped over a thread pool of `max_concurrent` workers; each tick is its
own transaction (`run_tick`), so a failing deployment fails its own task run and never blocks the others. After
the ticks, one task arbitrates the fleet's GPU budget and records the round; then the members with a pending
decision are executed right away, each in its own transaction, instead of waiting for an execution poll.

`serve_fleet` runs the flow in-process at every slot of the fleet interval: members' contexts (configs, perf
models, plugins) are loaded once per process and reloaded when a config file changes.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from prefect import Flow, flow, get_run_logger, tags, task
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import MissingContextError
from prefect.futures import wait
from prefect.runtime import flow_run, task_run
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.annotations import quote
from pydantic import SecretStr

from flows.ticks import tick_summary_line
from planner_core.policy.arbitration import GpuGrant
from planner_core.runtime.fleet import (
    ContextCache,
    DueTick,
    FleetMember,
    RoundResult,
    arbitrate_round,
    due_ticks,
    finish_round,
    fleet_ceilings,
    list_members,
    run_round,
    tick_fleet_member,
)
from planner_core.runtime.redact import redact_text
from planner_core.runtime.service import run_execution
from planner_core.runtime.settings import RuntimeSettings
from planner_core.runtime.store.db import get_engine, resolve_database_url, session_factory
from planner_core.runtime.store.partitions import ensure_partitions_ahead
from planner_core.runtime.store.repository import pending_decisions_of

DEFAULT_MAX_CONCURRENT = 4
_CACHES: dict[str, ContextCache] = {}
_CACHES_LOCK = threading.Lock()


def context_cache(database_url: str) -> ContextCache:
    """The process's context cache for a database (kept between flow runs of `serve_fleet`)."""
    with _CACHES_LOCK:
        return _CACHES.setdefault(database_url, ContextCache(database_url))


def _logger() -> logging.Logger | logging.LoggerAdapter:
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)


@task(name="fleet-member-tick", task_run_name="{due.deployment} {due.loop.value}-tick", cache_policy=NO_CACHE)
def tick_member(due: DueTick, member: FleetMember, database_url: str, gpu_ceiling: int | None = None) -> dict:
    """One member's tick for one loop and slot, in its own transaction (skipped if already recorded)."""
    ctx = context_cache(database_url).get(member)
    began = time.perf_counter()
    result = tick_fleet_member(
        ctx, due, gpu_ceiling=gpu_ceiling, flow_run_id=str(flow_run.id or ""), task_run_id=str(task_run.id or "")
    )
    tick_ms = (time.perf_counter() - began) * 1000.0
    if result.outcome is None:
        return {
            "deployment": due.deployment, "loop": due.loop.value, "tick_id": None, "skipped": "already recorded",
            "tick_ms": tick_ms,
        }  # fmt: skip
    _logger().info("%s", tick_summary_line(due.deployment, due.loop, due.scheduled_at, result.outcome))
    return {
        "deployment": due.deployment,
        "loop": due.loop.value,
        "tick_id": result.tick_id,
        "reason": result.outcome.reason.value,
        "missed": due.num_missed,
        "tick_ms": tick_ms,  # the wall time of `run_tick`, as `run_round` measures it
    }


@task(name="fleet-arbitrate", cache_policy=NO_CACHE)
def arbitrate_task(database_url: str, scheduled_at: dt.datetime, members: list[FleetMember]) -> list[dict]:
    """One arbitration of the fleet budget over every member with a loaded context, recorded in one transaction."""
    cache = context_cache(database_url)
    contexts = {member.name: cache.get(member) for member in members}
    with session_factory(database_url).begin() as session:
        grants = arbitrate_round(session, scheduled_at, members, contexts)
    return grants_summary(grants)


def grants_summary(grants: tuple[GpuGrant, ...] | None) -> list[dict]:
    """A round's grants as a flow run's result holds them (none: no budget, or the round recorded elsewhere)."""
    return [
        {"deployment": g.deployment, "proposed_gpus": g.proposed_gpus, "granted_gpus": g.granted_gpus,
         "reason": g.reason.value}
        for g in grants or ()
    ]  # fmt: skip


@task(name="fleet-member-execute", task_run_name="{member.name} execute", cache_policy=NO_CACHE)
def execute_member(member: FleetMember, database_url: str) -> list[dict]:
    """Apply the member's newest pending decision through its connector (its own transaction)."""
    ctx = context_cache(database_url).get(member)
    return [
        {"decision_id": s.decision_id, "outcome": s.outcome.value, "status": s.status.value}
        for s in run_execution(ctx, dt.datetime.now(dt.UTC))
    ]


@task(name="fleet-round", task_run_name="fleet-round {scheduled_at:%Y-%m-%d %H:%M:%S}", cache_policy=NO_CACHE)
def fleet_round(
    database_url: str,
    scheduled_at: dt.datetime,
    members: list[FleetMember],
    max_concurrent: int,
    due: list[DueTick] | None = None,
    finish: bool = True,
) -> dict:
    """The whole round (ticks, arbitration, executions) as one task run: `run_round` on a thread pool. Every tick
    it records carries this task run's id (`ticks.task_run_id`). With `due` and `finish` False, only those ticks
    (a part of a round too large for one task run's tags, `ROUND_TAGS_MAX`)."""
    cache = context_cache(database_url)
    contexts = {member.name: cache.get(member) for member in members}
    with ThreadPoolExecutor(max_workers=max_concurrent) as pool:
        result = run_round(
            database_url, members, contexts, scheduled_at, pool, due=due, finish=finish,
            flow_run_id=str(flow_run.id or ""), task_run_id=str(task_run.id or ""),
        )  # fmt: skip
    for name, problem in result.failed.items():
        _logger().error("%s: tick failed: %s", name, problem)
    _logger().info(
        "fleet round %s: %d ticks recorded, %d missed, %d failed, %d executed",
        scheduled_at.isoformat(), result.num_ticked, result.num_missed, len(result.failed), len(result.executed),
    )  # fmt: skip
    return {
        "scheduled_at": scheduled_at.isoformat(),
        "num_ticked": result.num_ticked,
        "missed": result.num_missed,
        "failed": result.failed,
        "grants": grants_summary(result.grants),
        "executed": list(result.executed),
        "tick_ms": list(result.tick_ms),
    }


# A task run's events (which the Prefect server records task runs from) relate at most 100 resources, its tags
# among them: a run with more tags is never recorded. So a round's task run carries at most this many deployments.
ROUND_TAGS_MAX = 64


def _round_as_task_runs(
    url: str, scheduled_at: dt.datetime, loaded: list[FleetMember], max_concurrent: int, due: list[DueTick]
) -> dict:
    """The round as one `fleet-round` task run tagged with every deployment it ticks (filtering the UI's task
    runs by `deployment:NAME` lists the rounds that ticked NAME; each tick row names its task run), or, for more
    than `ROUND_TAGS_MAX` deployments, one per part of them, all at once (each task run's start waits on the
    Prefect server: 1-2 s a run at 100 members, one after another the larger part of a round), then the round's
    arbitration and executions in the flow run once every part has ticked."""
    names = sorted({item.deployment for item in due})
    parts = [names[start : start + ROUND_TAGS_MAX] for start in range(0, len(names), ROUND_TAGS_MAX)] or [[]]
    if len(parts) == 1:
        with tags("fleet", *(f"deployment:{name}" for name in parts[0])):
            return fleet_round(url, scheduled_at, quote(loaded), max_concurrent, quote(due)) | {"num_task_runs": 1}
    futures = []
    for part in parts:
        in_part = set(part)
        with tags("fleet", *(f"deployment:{name}" for name in part)):
            futures.append(
                fleet_round.submit(
                    url,
                    scheduled_at,
                    quote(loaded),
                    max_concurrent,
                    quote([item for item in due if item.deployment in in_part]),
                    finish=False,
                )  # fmt: skip
            )
    wait(futures)
    summaries = [future.result() for future in futures]
    cache = context_cache(url)
    contexts = {member.name: cache.get(member) for member in loaded}
    with ThreadPoolExecutor(max_workers=max_concurrent) as pool:
        grants, executed = finish_round(url, loaded, contexts, scheduled_at, pool)
    _logger().info("fleet round %s: arbitrated, %d executed", scheduled_at.isoformat(), len(executed))
    return {
        "scheduled_at": scheduled_at.isoformat(),
        "num_ticked": sum(summary["num_ticked"] for summary in summaries),
        "missed": sum(summary["missed"] for summary in summaries),
        "failed": {name: problem for summary in summaries for name, problem in summary["failed"].items()},
        "grants": grants_summary(grants),
        "executed": list(executed),
        "tick_ms": [ms for summary in summaries for ms in summary["tick_ms"]],
        "num_task_runs": len(summaries),
    }


def _one_line(exc: BaseException) -> str:
    return redact_text(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")


@flow(name="fleet-tick", log_prints=False, task_runner=ThreadPoolTaskRunner(max_workers=DEFAULT_MAX_CONCURRENT))
def fleet_tick(
    scheduled_at: dt.datetime | None = None,
    database_url: SecretStr | None = None,
    task_per_member: bool = True,
    max_concurrent: int = DEFAULT_MAX_CONCURRENT,
) -> dict:
    """Tick every due member, arbitrate the GPU budget, execute pending decisions. `scheduled_at`: the slot (the
    flow run's scheduled start when None). `task_per_member` False runs the whole round as one task run
    (`fleet-round`, `run_round` on `max_concurrent` threads): each member's tick is a line of its log instead of a
    task run of its own, which costs the Prefect server far less per member (see the fleet docs' figures).
    `database_url` is a `SecretStr`: Prefect keeps a flow run's parameters in its database, and stores a
    `SecretStr` as `**********` (the URL may hold a password). Task parameters are not stored."""
    url = database_url.get_secret_value() if database_url is not None else resolve_database_url(RuntimeSettings())
    if scheduled_at is None:
        scheduled_at = dt.datetime.fromtimestamp(flow_run.scheduled_start_time.timestamp(), tz=dt.UTC)
    cache = context_cache(url)
    with session_factory(url).begin() as session:
        members = list_members(session)
    loaded, failed = [], {}
    for member in members:
        try:
            cache.get(member)
            loaded.append(member)
        except Exception as exc:  # a member whose config cannot load is reported, the rest tick
            failed[member.name] = _one_line(exc)
            _logger().error("%s: context not loaded: %s", member.name, failed[member.name])
    configs = {member.name: cache.get(member).config for member in loaded}
    with session_factory(url).begin() as session:
        due = due_ticks(session, loaded, configs, scheduled_at)
    if not task_per_member:
        return _round_as_task_runs(url, scheduled_at, loaded, max_concurrent, due) | {
            "num_members": len(members),
            "failed_to_load": failed,
        }
    by_name = {member.name: member for member in loaded}
    with session_factory(url).begin() as session:
        ceilings = fleet_ceilings(session)
    futures = []
    for item in due:
        member = by_name[item.deployment]
        with tags("fleet", f"deployment:{item.deployment}"):
            futures.append(tick_member.submit(item, member, url, ceilings.get(member.deployment_id)))
    wait(futures)
    ticks = []
    for item, future in zip(due, futures, strict=True):
        if future.state.is_completed():
            ticks.append(future.result())
        else:
            failed[item.deployment] = _one_line(future.state.result(raise_on_failure=False))
    grants = arbitrate_task(url, scheduled_at, quote(loaded))
    with session_factory(url).begin() as session:
        with_pending = pending_decisions_of(session, [member.deployment_id for member in loaded])
    to_execute = [member for member in loaded if member.deployment_id in with_pending]
    executions = []
    for member in to_execute:
        with tags("fleet", f"deployment:{member.name}"):
            executions.append(execute_member.submit(member, url))
    wait(executions)
    return {
        "scheduled_at": scheduled_at.isoformat(),
        "num_members": len(members),
        "ticks": ticks,
        "missed": sum(item.num_missed for item in due),
        "failed": failed,
        "grants": grants,
        "executed": [m.name for m, f in zip(to_execute, executions, strict=True) if f.state.is_completed()],
    }


_FLOWS: dict[int, Flow] = {}


def _fleet_tick_flow(max_concurrent: int) -> Flow:
    """`fleet_tick` with a task runner of `max_concurrent` threads, made once per process: `with_options` builds
    a new flow object (signature inspection, validation), which every round of `serve_fleet` used to pay."""
    with _CACHES_LOCK:
        if max_concurrent not in _FLOWS:
            _FLOWS[max_concurrent] = fleet_tick.with_options(
                task_runner=ThreadPoolTaskRunner(max_workers=max_concurrent)
            )
        return _FLOWS[max_concurrent]


_NO_HEARTBEATS: list[tuple[object, object]] = []  # (the settings they were made from, those without heartbeats)


@contextlib.contextmanager
def _without_flow_heartbeats() -> Iterator[None]:
    """The current Prefect settings without flow-run heartbeats, for a fleet tick run in this process.

    A flow run's heartbeat thread sleeps in steps of 1 s and the run's end joins it: a fleet round ended 0.6 s
    late on average and up to 1 s, a fifth of a 5 s round (py-spy, 100 members: 10.6 s of joins in 18 rounds).
    Heartbeats tell the server that a run of minutes is still alive; a round lasts seconds and the next one comes
    seconds later. The settings are derived once per settings object (`temporary_settings` builds them anew each
    time, 60 ms of CPU)."""
    from prefect.context import SettingsContext, get_settings_context
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY

    context = get_settings_context()
    with _CACHES_LOCK:
        derived = next((new for source, new in _NO_HEARTBEATS if source is context.settings), None)
        if derived is None:
            derived = context.settings.copy_with_update(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})
            _NO_HEARTBEATS[:] = [(context.settings, derived)]
    with SettingsContext(profile=context.profile, settings=derived):
        yield


def run_fleet_tick(
    scheduled_at: dt.datetime, database_url: str, max_concurrent: int, *, task_per_member: bool = True
) -> dict:
    """One fleet tick with `max_concurrent` member ticks at a time, as a flow run of this process (without
    heartbeats: `_without_flow_heartbeats`)."""
    with _without_flow_heartbeats():
        return _fleet_tick_flow(max_concurrent)(
            scheduled_at=scheduled_at,
            database_url=SecretStr(database_url),  # stored by Prefect as ********** (fleet_tick)
            task_per_member=task_per_member,
            max_concurrent=max_concurrent,
        )


def round_from_summary(summary: dict) -> RoundResult:
    """A `fleet-tick` flow run's summary as the `RoundResult` `run_round` returns (for the scale benchmark)."""
    if "ticks" in summary:  # a task run per member
        ticks = summary["ticks"]
        num_ticked = sum(tick["tick_id"] is not None for tick in ticks)
        tick_ms = tuple(tick["tick_ms"] for tick in ticks)
    else:  # the round as one task run
        num_ticked, tick_ms = summary["num_ticked"], tuple(summary["tick_ms"])
    return RoundResult(
        num_ticked=num_ticked,
        num_missed=summary["missed"],
        tick_ms=tick_ms,
        failed=dict(summary["failed"]) | dict(summary.get("failed_to_load", {})),
        grants=None,
        executed=tuple(summary["executed"]),
    )


def bench_round_runner(
    database_url: str, max_concurrent: int, *, task_per_member: bool = True
) -> Callable[[dt.datetime], RoundResult]:
    """`planner fleet bench --prefect`'s rounds: each one `fleet-tick` flow run, exactly as `serve_fleet` runs it
    (the Prefect API must be set). The flow ticks with the process's `context_cache(database_url)`."""

    def run(at: dt.datetime) -> RoundResult:
        return round_from_summary(run_fleet_tick(at, database_url, max_concurrent, task_per_member=task_per_member))

    return run


@dataclass(frozen=True, slots=True)
class AuditHeadPublishing:
    """Where and how often `serve_fleet` publishes the audit log's head (`planner fleet serve --audit-head-file`)."""

    path: Path
    every_s: float


def publish_audit_head(url: str, path: Path) -> None:
    """Verify the audit chain and write its head to `path` (`audit_chain.publish_head`); a broken chain is logged
    as an error and leaves the last good head in the file."""
    from planner_core.runtime.store.audit_chain import publish_head

    log = logging.getLogger(__name__)
    with session_factory(url).begin() as session:
        report, head = publish_head(session, path)
    if head is None:
        assert report.broken is not None
        log.error("audit head not published: the chain is broken after %d rows: %s", report.num_rows,
                  report.broken.line())  # fmt: skip
    else:
        log.info("audit head published to %s: row %s", path, head.row_id)


def serve_fleet(
    interval_s: float,
    max_concurrent: int,
    stop: threading.Event | None = None,
    *,
    task_per_member: bool = True,
    audit_head: AuditHeadPublishing | None = None,
) -> None:
    """Run a fleet tick at every slot of `interval_s` (aligned to the epoch) until `stop` is set or Ctrl-C; with
    `audit_head`, publish the audit log's head to its file at start and then every `every_s` seconds.

    A tick that overruns its slot makes the next run start at the newest slot: slots in between are not run (the
    members count them as missed ticks), so the fleet never falls further behind."""
    url = resolve_database_url(RuntimeSettings())
    ensure_partitions_ahead(get_engine(url), dt.datetime.now(dt.UTC))  # today's and the next days' (each tick: its own)
    stop = stop or threading.Event()
    next_head_s = time.time()
    while not stop.is_set():
        if audit_head is not None and time.time() >= next_head_s:
            publish_audit_head(url, audit_head.path)
            next_head_s = time.time() + audit_head.every_s
        next_slot_s = math.floor(time.time() / interval_s) * interval_s + interval_s
        if stop.wait(max(0.0, next_slot_s - time.time())):
            break
        at = dt.datetime.fromtimestamp(next_slot_s, tz=dt.UTC)
        summary = run_fleet_tick(at, url, max_concurrent, task_per_member=task_per_member)
        logging.getLogger(__name__).info(
            "fleet tick %s: %d failed, %d missed", summary["scheduled_at"], len(summary["failed"]), summary["missed"]
        )
