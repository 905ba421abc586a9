"""`planner config set / show / history`: a deployment's config revisions, and a live retune (a new revision the
next tick runs). The login of `PLANNER_DATABASE_URL` is the author: a retune needs a member of `planner_operator`
(docs/operations.md, Live retune)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from planner_core.runtime.settings import RuntimeSettings

if TYPE_CHECKING:  # imported late at run time: `planner --help` stays fast
    from sqlalchemy.orm import sessionmaker


def _sessions() -> sessionmaker:
    from planner_core.runtime.store.db import resolve_database_url, session_factory
    from planner_core.runtime.store.migrate import check_schema_current

    url = resolve_database_url(RuntimeSettings())
    check_schema_current(url)  # no migration here: an operator's login owns nothing
    return session_factory(url)


def _changes(changes: dict) -> str:
    return ", ".join(f"{name} {before!r} -> {after!r}" for name, (before, after) in changes.items()) or "-"


def cmd_set(args: argparse.Namespace) -> int:
    from planner_core.planner import refuse_what_cannot_work
    from planner_core.runtime.store.revisions import parse_assignments, retune

    updates = parse_assignments(args.set)  # a bad FIELD=VALUE is one line before the database
    with _sessions().begin() as session:
        written = retune(
            session, args.deployment, args.expect_revision, updates, args.reason, check=refuse_what_cannot_work
        )
    if args.json:
        print(json.dumps(written.to_json()))
        return 0
    print(f"{written.deployment}: config revision {written.revision} by {written.author}: {_changes(written.changes)}"
          f" (the next tick runs it)")  # fmt: skip
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from planner_core.runtime.store.revisions import get_revision

    with _sessions().begin() as session:
        revision, policy = get_revision(session, args.deployment, args.revision)
    if args.json:
        print(json.dumps({**revision.to_json(), "config": policy.model_dump(mode="json")}))
        return 0
    print(f"# {revision.deployment}: config revision {revision.revision} ({revision.source}) by {revision.author} "
          f"at {revision.created_at.isoformat()}: {revision.reason}")  # fmt: skip
    import yaml

    print(yaml.safe_dump(policy.model_dump(mode="json"), sort_keys=True), end="")
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    from planner_core.runtime.store.revisions import history

    with _sessions().begin() as session:
        revisions = history(session, args.deployment)
    if args.json:
        print(json.dumps([r.to_json() for r in revisions]))
        return 0
    for r in revisions:
        print(f"{r.revision}\t{r.created_at.isoformat()}\t{r.source}\t{r.author}\t{_changes(r.changes)}\t{r.reason}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `config` command group's parsers."""
    config = sub.add_parser("config", help="a deployment's config revisions; change SLA targets, budgets and floors "
                            "live")  # fmt: skip
    csub = config.add_subparsers(dest="config_command", required=True, metavar="ACTION", help="what to do")
    set_ = csub.add_parser(
        "set", help="write the next config revision (the next tick runs it); needs a planner_operator login"
    )
    set_.add_argument("deployment", help="the managed deployment")
    set_.add_argument(
        "--expect-revision", type=int, required=True, metavar="N",
        help="the revision this change is made from (`planner config show` prints it); refused if it is not the "
        "current one",
    )  # fmt: skip
    set_.add_argument(
        "--set", action="append", required=True, metavar="FIELD=VALUE",
        help="a live field and its new value (YAML: 300, 0.5, true, null); repeat for several",
    )  # fmt: skip
    set_.add_argument("--reason", required=True, help="why the config changes (kept with the revision and audited)")
    set_.add_argument("--json", action="store_true", help="print the new revision as JSON")
    set_.set_defaults(func=cmd_set)
    show = csub.add_parser("show", help="a config revision (default: the current one) and its policy")
    show.add_argument("deployment", help="the managed deployment")
    show.add_argument("--revision", type=int, default=None, metavar="N", help="this revision (default: the current)")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(func=cmd_show)
    hist = csub.add_parser("history", help="every config revision: who, when, why and what changed")
    hist.add_argument("deployment", help="the managed deployment")
    hist.add_argument("--json", action="store_true", help="print JSON")
    hist.set_defaults(func=cmd_history)
