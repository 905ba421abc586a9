"""`planner deployments` (the fleet's registry and GPU budget) and `planner fleet` (serve, one tick, replay)."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from planner_core.runtime.settings import RuntimeSettings

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from planner_core.lab.fleet_bench import FleetBenchShape


def _sessions():
    from planner_core.runtime.store.db import resolve_database_url, resolve_owner_database_url, session_factory
    from planner_core.runtime.store.migrate import upgrade

    settings = RuntimeSettings()
    upgrade(resolve_owner_database_url(settings))  # the registry's tables may be new (idempotent)
    return session_factory(resolve_database_url(settings))


def cmd_add(args: argparse.Namespace) -> int:
    from planner_core.runtime.fleet import add_member, member_budget_warnings

    with _sessions().begin() as session:
        member = add_member(
            session,
            args.name,
            args.config,
            min_gpus=args.min_gpus,
            max_gpus=args.max_gpus,
            priority=args.priority,
            weight=args.weight,
        )
    print(f"{member.name}: {member.config_path} (min {member.min_gpus}, max {member.max_gpus}, "
          f"priority {member.priority}, weight {member.weight:g})")  # fmt: skip
    for warning in member_budget_warnings(member.config_path):  # recorded by `add_member`, in the same words
        print(f"planner deployments add: warning: {warning}", file=sys.stderr)
    return 0


def cmd_sync(args: argparse.Namespace) -> int:
    """Register every config file of a folder (one transaction: all or nothing)."""
    from planner_core.runtime.fleet import member_budget_warnings, read_fleet_folder, sync_members

    declared = read_fleet_folder(args.folder)  # every file checked before anything is written
    with _sessions().begin() as session:
        plan = sync_members(session, declared, prune=args.prune, dry_run=args.dry_run)
    mark = " (dry run: nothing written)" if args.dry_run else ""
    for label, names in (("added", plan.added), ("updated", plan.updated), ("unchanged", plan.unchanged),
                         ("removed", plan.removed)):  # fmt: skip
        if names:
            print(f"{label}{mark}: {', '.join(names)}")
    if plan.kept:
        print(f"not in {args.folder}, kept (--prune removes them): {', '.join(plan.kept)}")
    paths = {member.name: member.config_path for member in declared}
    for name in (*plan.added, *plan.updated):  # the members `add_member` wrote, and recorded these for
        for warning in member_budget_warnings(paths[name]):
            print(f"planner deployments sync: warning: {warning}", file=sys.stderr)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from planner_core.runtime.fleet import get_budget, list_members

    with _sessions().begin() as session:
        members, budget = list_members(session), get_budget(session)
    if args.json:
        rows = [
            {"name": m.name, "config_path": m.config_path, "min_gpus": m.min_gpus, "max_gpus": m.max_gpus,
             "priority": m.priority, "weight": m.weight}
            for m in members
        ]  # fmt: skip
        print(json.dumps({"budget_gpus": budget, "members": rows}))
        return 0
    print(f"fleet budget: {'none' if budget is None else f'{budget} GPUs'}")
    for m in members:
        ceiling = "-" if m.max_gpus is None else m.max_gpus
        print(f"{m.name}\tmin {m.min_gpus}\tmax {ceiling}\tpriority {m.priority}\tweight {m.weight:g}\t{m.config_path}")
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    from planner_core.runtime.fleet import remove_member

    with _sessions().begin() as session:
        removed = remove_member(session, args.name)
    if not removed:
        raise LookupError(f"deployment {args.name!r}: not a member of the fleet")
    print(f"{args.name}: removed from the fleet (its records stay)")
    return 0


def cmd_budget(args: argparse.Namespace) -> int:
    from planner_core.runtime.fleet import set_budget

    gpus = None if args.gpus == "none" else int(args.gpus)
    with _sessions().begin() as session:
        set_budget(session, gpus)
    print(f"fleet budget: {'none' if gpus is None else f'{gpus} GPUs'}")
    return 0


def _budget_value(text: str) -> str:
    if text == "none" or text.isdigit():
        return text
    raise argparse.ArgumentTypeError(f"GPUS must be a whole number >= 0 or 'none', got {text!r}")


def cmd_fleet_tick(args: argparse.Namespace) -> int:
    from planner_cli.common import prefect_environment

    settings = RuntimeSettings()
    _sessions()
    prefect_environment(settings)
    from flows.prefect_server import prefect_api

    at = args.at or dt.datetime.now(dt.UTC)
    with prefect_api(port=args.port, exit_when_lost=True):
        from flows.fleet import run_fleet_tick
        from planner_core.runtime.store.db import resolve_database_url

        summary = run_fleet_tick(
            at, resolve_database_url(settings), args.max_concurrent, task_per_member=args.task_per_member
        )
    print(json.dumps(summary, indent=2))
    return 0 if not summary["failed"] else 1


def _warn_about_members(settings: RuntimeSettings, sessions: sessionmaker[Session]) -> None:
    """Each member's budget warnings, printed and recorded (`config_warning`) at start, as `planner serve` does for
    its deployment. A member whose file no longer loads is named here; its ticks fail and record why."""
    from planner_core.config import ConfigError
    from planner_core.runtime.fleet import list_members, member_budget_warnings
    from planner_core.runtime.service import record_config_warnings
    from planner_core.runtime.store.db import resolve_database_url

    with sessions.begin() as session:
        members = list_members(session)
    for member in members:
        try:
            warnings = member_budget_warnings(member.config_path)
        except ConfigError as exc:
            print(f"planner fleet serve: warning: deployment {member.name!r}: {exc}", file=sys.stderr)
            continue
        for warning in warnings:
            print(f"planner fleet serve: warning: {warning}", file=sys.stderr)
        record_config_warnings(resolve_database_url(settings), member.name, warnings)


def cmd_fleet_serve(args: argparse.Namespace) -> int:
    from planner_cli.common import prefect_environment

    settings = RuntimeSettings()
    sessions = _sessions()
    prefect_environment(settings)
    import signal
    import threading

    from flows.prefect_server import prefect_api

    stop = threading.Event()

    def finish_the_round(signum: int, _frame: object) -> None:
        # SIGTERM used to end the process at once: the round in flight crashed (its runs left Running) and the
        # Prefect server started below was orphaned. Now the round finishes, then the server is stopped.
        print(f"planner fleet serve: {signal.Signals(signum).name}: finishing the round in flight", file=sys.stderr)
        stop.set()

    audit_head = None
    if args.audit_head_file is not None:
        from flows.fleet import AuditHeadPublishing

        if not args.audit_head_file.parent.is_dir():  # checked before anything starts
            raise ValueError(f"--audit-head-file {args.audit_head_file}: folder {args.audit_head_file.parent} does "
                             "not exist")  # fmt: skip
        audit_head = AuditHeadPublishing(path=args.audit_head_file, every_s=args.audit_head_every_s)
    _warn_about_members(settings, sessions)  # after the checks: nothing recorded for a command that refuses
    with prefect_api(port=args.port, exit_when_lost=True) as api_url:
        print(f"Prefect UI: {api_url.removesuffix('/api')}", file=sys.stderr)
        from flows.fleet import serve_fleet

        signal.signal(signal.SIGTERM, finish_the_round)
        signal.signal(signal.SIGINT, finish_the_round)
        # The rounds run in a thread of their own: a flow run in the main thread installs Prefect's SIGTERM
        # handler for its duration, which crashes the run in flight instead of letting it finish. The main
        # thread only waits, so the handlers above get every signal.
        failure: list[BaseException] = []

        def rounds() -> None:
            try:
                serve_fleet(
                    args.interval, args.max_concurrent, stop, task_per_member=args.task_per_member,
                    audit_head=audit_head,
                )  # fmt: skip
            except BaseException as exc:  # re-raised in the main thread, as if serve_fleet had run there
                failure.append(exc)
                stop.set()

        worker = threading.Thread(target=rounds, name="fleet-rounds")
        worker.start()
        while worker.is_alive():
            worker.join(timeout=0.5)
        if failure:
            raise failure[0]
    print("planner fleet serve: stopped", file=sys.stderr)
    return 0


def cmd_fleet_replay(args: argparse.Namespace) -> int:
    from planner_core.runtime.fleet import replay_round

    with _sessions().begin() as session:
        same, grants = replay_round(session, args.round_id)
    for g in grants:
        print(f"{g.deployment}\tproposed {g.proposed_gpus}\tgranted {g.granted_gpus}\t{g.reason.value}")
    print(f"round {args.round_id}: {'identical to the record' if same else 'DIFFERS from the record'}")
    return 0 if same else 1


def bench_shape(args: argparse.Namespace) -> FleetBenchShape:
    """The benchmark's fleet and timing from the command line, the same with and without Prefect."""
    from planner_core.lab.fleet_bench import FleetBenchShape

    return FleetBenchShape(
        num_deployments=args.deployments,
        duration_s=args.duration,
        interval_s=args.interval,
        realtime=args.realtime,
        max_concurrent=args.max_concurrent,
        budget_gpus=args.budget,
    )


def cmd_fleet_bench(args: argparse.Namespace) -> int:
    """A fresh database on the planner's Postgres server (dropped afterwards unless --keep), N members, measure.
    With --prefect, a Prefect server of its own (a fresh PREFECT_HOME, removed afterwards) runs every round."""
    import dataclasses
    import tempfile

    from planner_cli.common import check_output_path

    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)  # as it always did: the result's folder is made
        check_output_path(args.json, "--json")  # but a file it cannot write is refused before the members run

    from sqlalchemy.engine import make_url

    from planner_core.lab.fleet_bench import bench_config, run_fleet_bench
    from planner_core.runtime.store.migrate import scratch_database

    if args.task_per_member and not args.prefect:
        print("planner fleet bench: error: --task-per-member is a mode of --prefect", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as stack:
        if args.prefect:
            from planner_cli.common import prefect_environment

            os.environ["PREFECT_HOME"] = stack.enter_context(tempfile.TemporaryDirectory(prefix="fleet-bench-prefect-"))
            os.environ.pop("PREFECT_API_URL", None)  # a server of its own: the one whose CPU it can count
            prefect_environment(RuntimeSettings())
        url = stack.enter_context(scratch_database("fleet_bench", keep=args.keep))
        try:
            with tempfile.TemporaryDirectory() as directory:
                config = args.config or bench_config(Path(directory), args.interval)
                if args.prefect:
                    from flows.lab.fleet_bench import bench_with_prefect

                    result = bench_with_prefect(url, config, bench_shape(args), task_per_member=args.task_per_member)
                else:
                    result = run_fleet_bench(url, config, **bench_shape(args).as_kwargs())
            body = json.dumps(dataclasses.asdict(result), indent=2)
            if args.json is not None:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(body + "\n")
            print(body)
        finally:
            if args.keep:
                print(f"kept database {make_url(url).database}", file=sys.stderr)
    return 0


def cmd_fleet_bytes(args: argparse.Namespace) -> int:
    from planner_core.domain import Loop
    from planner_core.runtime.fleet import stored_bytes_per_tick
    from planner_core.runtime.store import repository as repo

    with _sessions().begin() as session:
        ids = None
        if args.deployment:
            deployment = repo.find_deployment(session, args.deployment)
            if deployment is None:
                raise LookupError(f"deployment {args.deployment!r}: not recorded")
            ids = [deployment.id]
        sizes = stored_bytes_per_tick(session, Loop(args.loop), ids)
    print(json.dumps(sizes, indent=2))
    return 0


def _aware(text: str) -> dt.datetime:
    value = dt.datetime.fromisoformat(text)
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def _granularity(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """--one-task (the default) / --task-per-member: a round's task runs (docs/fleet.md, "The fleet tick")."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--one-task", dest="task_per_member", action="store_false", help=f"{prefix}each round as "
                       "one task run tagged with the deployments it ticks (the default)")  # fmt: skip
    group.add_argument("--task-per-member", dest="task_per_member", action="store_true", help=f"{prefix}a task "
                       "run per member tick (several times the CPU per tick, see docs/fleet.md)")  # fmt: skip
    parser.set_defaults(task_per_member=False)


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `deployments` and `fleet` command groups' parsers."""
    deployments = sub.add_parser("deployments", help="the fleet: register managed deployments and the GPU budget")
    dsub = deployments.add_subparsers(
        dest="deployments_command", required=True, metavar="ACTION", help="what to do with the fleet's registry"
    )
    add = dsub.add_parser("add", help="register (or update) a deployment in the fleet")
    add.add_argument("name", help="the managed deployment's name")
    add.add_argument("--config", type=Path, required=True, help="its PlannerConfig file")
    add.add_argument("--min-gpus", type=int, default=0, help="GPUs it always keeps (default 0)")
    add.add_argument("--max-gpus", type=int, default=None, help="GPUs it may never exceed (default: no maximum)")
    add.add_argument("--priority", type=int, default=0, help="higher is served first over budget (default 0)")
    add.add_argument("--weight", type=float, default=1.0, help="share within its priority (default 1)")
    add.set_defaults(func=cmd_add)
    sync = dsub.add_parser(
        "sync", help="register every config file of a folder (name and share from each file's `fleet:` section)"
    )
    sync.add_argument("folder", type=Path, help="folder of PlannerConfig files (.yaml, .yml, .json)")
    sync.add_argument("--prune", action="store_true", help="remove members the folder does not declare")
    sync.add_argument("--dry-run", action="store_true", help="print what would change, change nothing")
    sync.set_defaults(func=cmd_sync)
    listing = dsub.add_parser("list", help="the members and the budget")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(func=cmd_list)
    remove = dsub.add_parser("remove", help="take a deployment out of the fleet (its records stay)")
    remove.add_argument("name", help="the member to remove")
    remove.set_defaults(func=cmd_remove)
    budget = dsub.add_parser("budget", help="set the fleet's GPU budget ('none' removes it)")
    budget.add_argument("gpus", type=_budget_value, metavar="GPUS", help="GPUs, or 'none'")
    budget.set_defaults(func=cmd_budget)

    fleet = sub.add_parser("fleet", help="run the fleet control plane: every member's ticks, one GPU budget")
    fsub = fleet.add_subparsers(dest="fleet_command", required=True, metavar="ACTION", help="what to run")
    serve = fsub.add_parser("serve", help="a fleet tick at every slot of --interval until Ctrl-C")
    serve.add_argument("--interval", type=float, default=5.0, help="seconds between fleet ticks (default 5)")
    serve.add_argument("--max-concurrent", type=int, default=4, help="member ticks at a time (default 4)")
    serve.add_argument("--port", type=int, default=4200, help="port of the local Prefect server")
    serve.add_argument(
        "--audit-head-file", type=Path, default=None, metavar="PATH",
        help="publish the audit log's head (as `planner audit head` prints it) to PATH at start and every "
        "--audit-head-every-s; keep PATH where the database's owner cannot write (a volume of its own, synced to a "
        "ConfigMap) and check with `planner audit verify --head PATH`. A broken chain leaves the last good head",
    )  # fmt: skip
    serve.add_argument(
        "--audit-head-every-s", type=float, default=3600.0,
        help="seconds between two publications of the audit head (default 3600: verifying reads the whole log)",
    )  # fmt: skip
    _granularity(serve)
    serve.set_defaults(func=cmd_fleet_serve)
    tick = fsub.add_parser("tick", help="one fleet tick now (or --at a time) and print its summary")
    tick.add_argument("--at", type=_aware, default=None, help="the slot time (ISO 8601; default now)")
    tick.add_argument("--max-concurrent", type=int, default=4, help="member ticks at a time (default 4)")
    tick.add_argument("--port", type=int, default=4200, help="port of the local Prefect server")
    _granularity(tick)
    tick.set_defaults(func=cmd_fleet_tick)
    replay = fsub.add_parser("replay", help="run a recorded arbitration round again and compare")
    replay.add_argument("round_id", type=int, help="the round (arbitration_rounds.id)")
    replay.set_defaults(func=cmd_fleet_replay)
    bench = fsub.add_parser("bench", help="N simulated deployments in a fresh database: CPU, latency, bytes per tick")
    bench.add_argument("--deployments", type=int, default=10, help="simulated deployments (default 10)")
    bench.add_argument("--duration", type=float, default=60.0, help="seconds of fleet time (default 60)")
    bench.add_argument("--interval", type=float, default=5.0, help="fleet and load-loop interval, s (default 5)")
    bench.add_argument("--realtime", action="store_true", help="keep wall-clock time (else rounds back to back)")
    bench.add_argument("--max-concurrent", type=int, default=4, help="member ticks at a time (default 4)")
    bench.add_argument("--budget", type=int, default=None, help="fleet GPU budget (default 3 per deployment)")
    bench.add_argument("--config", type=Path, default=None, help="members' config (default: the recommended "
                       "policy with the load loop on)")  # fmt: skip
    bench.add_argument("--keep", action="store_true", help="keep the benchmark's database")
    bench.add_argument("--prefect", action="store_true", help="run every round as a `fleet-tick` flow run on a "
                       "Prefect server of its own, and count that server's CPU")  # fmt: skip
    _granularity(bench, "with --prefect: ")
    bench.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the result to PATH")
    bench.set_defaults(func=cmd_fleet_bench)
    size = fsub.add_parser("bytes", help="mean bytes stored per tick, by table")
    size.add_argument("--loop", choices=["load", "throughput"], default="load", help="which ticks")
    size.add_argument("--deployment", default=None, help="only this deployment's ticks")
    size.set_defaults(func=cmd_fleet_bytes)
