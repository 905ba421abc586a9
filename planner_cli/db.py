"""The database: `planner db url | upgrade | stop | prune`."""

from __future__ import annotations

import argparse
import sys

from planner_cli.common import add_deployment_argument, select_deployment
from planner_core.runtime.settings import RuntimeSettings


def cmd_db(args: argparse.Namespace) -> int:
    from planner_core.runtime.store.db import (
        resolve_database_url,
        resolve_owner_database_url,
        stop_embedded_database,
        to_libpq_uri,
    )
    from planner_core.runtime.store.migrate import upgrade

    settings = RuntimeSettings()
    if args.action == "stop":
        stopped = stop_embedded_database(settings.embedded_pg_dir)
        print("stopped" if stopped else f"no embedded server running under {settings.embedded_pg_dir}")
        return 0
    if args.action == "upgrade":
        import datetime as dt

        from planner_core.runtime.store.db import get_engine
        from planner_core.runtime.store.partitions import ensure_partitions_ahead

        owner_url = resolve_owner_database_url(settings)
        upgrade(owner_url)  # migrations run as the schema's owner
        created = ensure_partitions_ahead(get_engine(owner_url), dt.datetime.now(dt.UTC))
        print(f"schema at head; {created} tick partitions created ahead")
        return 0
    url = resolve_database_url(settings)
    if args.action == "prune":
        return _db_prune(url, args)
    print(url)
    print(f'psql "{to_libpq_uri(url)}"', file=sys.stderr)
    return 0


def _db_prune(url: str, args: argparse.Namespace) -> int:
    """`planner db prune --older-than DAYS`: delete old high-volume tick detail in batches;
    `--drop-partitions-older-than DAYS`: drop whole days of the tick tables (see store/prune.py)."""
    import datetime as dt

    from planner_core.runtime.store.prune import prune_history

    if args.drop_partitions_older_than is not None:
        if args.deployment or args.all_deployments:
            raise ValueError("--drop-partitions-older-than: a day's partitions hold every deployment; no --deployment")
        return _db_drop_partitions(url, args)

    if args.all_deployments and args.deployment:
        raise ValueError("--all-deployments: give it without --deployment")
    summary = prune_history(
        url,
        older_than_days=args.older_than,
        now=dt.datetime.now(dt.UTC),
        deployment=None if args.all_deployments else select_deployment(url, args.deployment),
        batch_size=args.batch_size,
        dry_run=args.dry_run,
    )
    verb = "would delete" if summary.dry_run else "deleted"
    print(f"ticks scheduled before {summary.cutoff.isoformat(timespec='seconds')}:")
    for name, counts in summary.by_deployment.items():
        print(
            f"  {name}: {counts.num_ticks} ticks examined; {verb} "
            f"{counts.num_tick_steps} tick_steps, {counts.num_planner_states} planner_states"
        )
    if not summary.by_deployment:
        print("  no deployments")
    if not summary.dry_run:
        print(f"{summary.num_batches} batches, each one transaction with its history_pruned audit event")
    return 0


def _db_drop_partitions(url: str, args: argparse.Namespace) -> int:
    import datetime as dt

    from planner_core.runtime.store.prune import drop_partitions

    verb = "would drop" if args.dry_run else "dropped"

    def report(day) -> None:  # a DroppedDay
        rows = ", ".join(f"{n} {table}" for table, n in day.rows.items() if table != "ticks")
        print(f"  {day.day.isoformat()}: {verb} {day.num_ticks} ticks ({rows})", flush=True)

    now = dt.datetime.now(dt.UTC)
    cutoff = now - dt.timedelta(days=args.drop_partitions_older_than)
    print(f"tick partitions of days ending by {cutoff.isoformat(timespec='seconds')}:", flush=True)
    summary = drop_partitions(
        url, older_than_days=args.drop_partitions_older_than, now=now, dry_run=args.dry_run, on_day=report
    )
    for day, why in summary.kept.items():
        print(f"  {day.isoformat()}: kept, {why}")
    if not summary.dropped and not summary.kept:
        print("  none")
    if summary.dropped and not summary.dry_run:
        print(f"{len(summary.dropped)} days, each one transaction with its partitions_dropped audit event")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the db command group's parsers: one subcommand per action, so an option of one (prune's) is refused
    by the others."""
    db = sub.add_parser("db", help="the database: url (print how to connect), upgrade, stop, prune")
    actions = db.add_subparsers(dest="action", required=True, metavar="ACTION", help="what to do with the database")
    url = actions.add_parser("url", help="print the SQLAlchemy URL (stdout) and a psql command (stderr)")
    upgrade = actions.add_parser("upgrade", help="migrate the database to the newest schema")
    stop = actions.add_parser("stop", help="stop the embedded Postgres under PLANNER_DATA_DIR")
    prune = actions.add_parser(
        "prune", help="delete the high-volume detail of old ticks in batches, or drop old days' tick partitions"
    )
    what = prune.add_mutually_exclusive_group(required=True)
    what.add_argument("--older-than", type=float, metavar="DAYS", help="ticks scheduled more than DAYS ago")
    what.add_argument(
        "--drop-partitions-older-than",
        type=float,
        metavar="DAYS",
        help="drop every whole day of the tick tables older than DAYS (>= 1), all deployments",
    )
    add_deployment_argument(prune)
    prune.add_argument("--all-deployments", action="store_true", help="prune every deployment")
    prune.add_argument("--batch-size", type=int, default=5000, help="ticks per transaction")
    prune.add_argument("--dry-run", action="store_true", help="count what would be deleted, delete nothing")
    for parser in (url, upgrade, stop, prune):
        parser.set_defaults(func=cmd_db)
