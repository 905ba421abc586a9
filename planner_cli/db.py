"""The database: `planner db url | upgrade | stop | prune`."""

from __future__ import annotations

import argparse
import sys

from planner_core.runtime.settings import RuntimeSettings


def cmd_db(args: argparse.Namespace) -> int:
    from planner_core.runtime.store.db import resolve_database_url, stop_embedded_database, to_libpq_uri
    from planner_core.runtime.store.migrate import upgrade

    settings = RuntimeSettings()
    if args.action == "stop":
        stopped = stop_embedded_database(settings.embedded_pg_dir)
        print("stopped" if stopped else f"no embedded server running under {settings.embedded_pg_dir}")
        return 0
    url = resolve_database_url(settings)
    if args.action == "prune":
        return _db_prune(url, args)
    if args.action == "upgrade":
        upgrade(url)
        print("schema at head")
        return 0
    print(url)
    print(f'psql "{to_libpq_uri(url)}"', file=sys.stderr)
    return 0


def _db_prune(url: str, args: argparse.Namespace) -> int:
    """`planner db prune --older-than DAYS`: delete old high-volume tick detail in batches (see store/prune.py)."""
    import datetime as dt

    from planner_core.runtime.store.prune import prune_history

    if args.older_than is None:
        raise ValueError("planner db prune: --older-than DAYS is required")
    summary = prune_history(
        url,
        older_than_days=args.older_than,
        now=dt.datetime.now(dt.UTC),
        deployment=args.deployment,
        batch_size=args.batch_size,
        dry_run=args.dry_run,
    )
    verb = "would delete" if summary.dry_run else "deleted"
    print(f"ticks scheduled before {summary.cutoff.isoformat(timespec='seconds')}:")
    for name, counts in summary.by_deployment.items():
        print(
            f"  {name}: {counts.num_ticks} ticks examined; {verb} {counts.num_fpm_snapshots} fpm_snapshots, "
            f"{counts.num_tick_steps} tick_steps, {counts.num_planner_states} planner_states"
        )
    if not summary.by_deployment:
        print("  no deployments")
    if not summary.dry_run:
        print(f"{summary.num_batches} batches, each one transaction with its history_pruned audit event")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the db command group's parsers."""
    db = sub.add_parser("db", help="the database: url (print how to connect), upgrade, stop, prune")
    db.add_argument("action", choices=["url", "upgrade", "stop", "prune"])
    db.add_argument("--older-than", type=float, default=None, metavar="DAYS", help="prune: ticks older than DAYS")
    db.add_argument("--deployment", default=None, help="prune: only this deployment (default all)")
    db.add_argument("--batch-size", type=int, default=5000, help="prune: ticks per transaction")
    db.add_argument("--dry-run", action="store_true", help="prune: count what would be deleted, delete nothing")
    db.set_defaults(func=cmd_db)
