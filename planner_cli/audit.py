"""The audit log: `planner audit verify` walks its hash chain and reports the first broken link."""

from __future__ import annotations

import argparse

from planner_core.runtime.settings import RuntimeSettings


def cmd_audit_verify(args: argparse.Namespace) -> int:  # noqa: ARG001 (argparse passes the namespace)
    from planner_core.runtime.store.audit_chain import verify_chain
    from planner_core.runtime.store.db import resolve_database_url, session_factory
    from planner_core.runtime.store.migrate import check_schema_current

    url = resolve_database_url(RuntimeSettings())
    check_schema_current(url)  # one line with the fix on a database without the chain's columns
    with session_factory(url).begin() as session:
        report = verify_chain(session)
    if report.broken is not None:
        print(f"planner: audit chain broken after {report.num_rows} good rows: {report.broken.line()}")
        return 1
    print(f"audit chain intact: {report.num_rows} rows, head {report.head_hash}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the audit command group's parsers."""
    audit = sub.add_parser("audit", help="the audit log: verify its hash chain")
    actions = audit.add_subparsers(dest="action", required=True, metavar="ACTION", help="what to do")
    verify = actions.add_parser(
        "verify", help="recompute the audit log's hash chain; exit 1 and name the first broken link if it fails"
    )
    verify.set_defaults(func=cmd_audit_verify)
