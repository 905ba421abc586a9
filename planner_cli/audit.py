"""The audit log: `planner audit verify` walks its hash chain and reports the first broken link; `planner audit
head` exports the chain's head for keeping outside the database, and `verify --head` checks the chain against it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from planner_core.runtime.settings import RuntimeSettings

if TYPE_CHECKING:  # imported late at run time: `planner --help` stays fast
    from sqlalchemy.orm import sessionmaker

    from planner_core.runtime.store.audit_chain import ChainHead


def _sessions() -> sessionmaker:
    from planner_core.runtime.store.db import resolve_database_url, session_factory
    from planner_core.runtime.store.migrate import check_schema_current

    url = resolve_database_url(RuntimeSettings())
    check_schema_current(url)  # one line with the fix on a database without the chain's columns
    return session_factory(url)


def read_anchor(value: str) -> ChainHead:
    """`--head`: `ROW:HASH`, or a file holding what `planner audit head` printed (a ConfigMap's key mounted as a
    file, say). Raises ValueError in one line naming the option or the file."""
    from planner_core.runtime.store.audit_chain import ChainHead

    if ":" in value and not Path(value).exists():
        return ChainHead.parse(value, f"--head {value!r}")
    path = Path(value)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--head {value}: cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    return ChainHead.parse(text, str(path))


def cmd_audit_verify(args: argparse.Namespace) -> int:
    from planner_core.runtime.store.audit_chain import verify_chain

    anchor = read_anchor(args.head) if args.head else None  # a bad --head is one line before the database
    with _sessions().begin() as session:
        report = verify_chain(session, anchor)
    if report.broken is not None:
        print(f"planner: audit chain broken after {report.num_rows} good rows: {report.broken.line()}")
        return 1
    print(f"audit chain intact: {report.num_rows} rows, head {report.head_hash}")
    if anchor is not None:
        print(f"anchored head holds: row {anchor.row_id} has hash {anchor.hash_hex}")
    return 0


def cmd_audit_head(args: argparse.Namespace) -> int:  # noqa: ARG001 (argparse passes the namespace)
    from planner_core.runtime.store.audit_chain import current_head

    with _sessions().begin() as session:
        report, head = current_head(session)
    if head is None:
        assert report.broken is not None
        print(
            f"planner: no head exported: audit chain broken after {report.num_rows} good rows: {report.broken.line()}"
        )
        return 1
    print(json.dumps(head.to_json()))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the audit command group's parsers."""
    audit = sub.add_parser("audit", help="the audit log: verify its hash chain, export its head")
    actions = audit.add_subparsers(dest="action", required=True, metavar="ACTION", help="what to do")
    verify = actions.add_parser(
        "verify", help="recompute the audit log's hash chain; exit 1 and name the first broken link if it fails"
    )
    verify.add_argument(
        "--head", metavar="FILE|ROW:HASH", default=None,
        help="also check the chain against a head kept outside the database: a file holding what `planner audit "
        "head` printed, or ROW:HASH; a chain recomputed (by the owner or a superuser) at or before that row fails",
    )  # fmt: skip
    verify.set_defaults(func=cmd_audit_verify)
    head = actions.add_parser(
        "head",
        help="verify the chain and print its head as one JSON line (row, hash, time) to keep outside the database "
        "(a file, a Kubernetes ConfigMap); exit 1 if the chain is broken",
    )
    head.set_defaults(func=cmd_audit_head)
