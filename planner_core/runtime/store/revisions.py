"""Live retune: a deployment's config revisions (`config_revisions`, migration 0024) read, and a new one written.

Every config a deployment runs is a numbered revision: its config file's policy (source `file`, recorded by the
tick or `planner deployments add/sync` when the file's policy changes: `repository.follow_file`) or a live retune
(source `set`: `retune`, what `planner config set` calls). A retune names the revision it was made from; it is
refused in one line when that is not the current one (another change came first), when it changes a field that
cannot change live (`planner_core.config.LIVE_FIELDS`), when the new policy fails the config loader's checks or the
early refusals every command applies (`refuse_what_cannot_work`), and, by the database, when the login writing it
is not a member of `planner_operator`. The database's trigger is the rule for every writer (this module, or an
INSERT in SQL): it numbers the revisions, refuses a stale one and an unauthorised one, records the login as the
author and appends the revision to the audit log. The next tick of the deployment runs the newest revision and
records its number (`ticks.config_revision`); replay reads each tick's revision.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from planner_core.config import PlannerConfig, live_changes, parse_config
from planner_core.config.policy import _ALIAS_TO_FIELD
from planner_core.runtime.store import repository as repo
from planner_core.runtime.store.models import ConfigRevisionRow, Deployment

# SQLSTATEs the revisions' trigger raises (migration 0024): a retune by a login outside `planner_operator` (or a
# login without the table privileges), and a stale expected revision.
UNAUTHORISED_SQLSTATE = "42501"
STALE_SQLSTATE = "PR001"
SOURCE = "planner config set"


class RetuneRefused(ValueError):
    """A retune that is not done, in one line: the deployment, and what is wrong (stale, not allowed, no change)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigRevision:
    """One revision of a deployment's config, as `config_revisions` holds it."""

    deployment: str
    revision: int
    config_hash: str
    source: str  # `file` or `set`
    changes: Mapping[str, Sequence[Any]]  # field -> (before, after) against the previous revision
    source_path: str | None
    author: str
    reason: str
    created_at: dt.datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "deployment": self.deployment,
            "revision": self.revision,
            "config_hash": self.config_hash,
            "source": self.source,
            "changes": {name: list(pair) for name, pair in self.changes.items()},
            "source_path": self.source_path,
            "author": self.author,
            "reason": self.reason,
            "created_at": self.created_at.isoformat(),
        }


def _revision(name: str, row: ConfigRevisionRow) -> ConfigRevision:
    return ConfigRevision(
        deployment=name,
        revision=row.revision,
        config_hash=row.config_hash,
        source=row.source,
        changes=dict(row.changes),
        source_path=row.source_path,
        author=row.author,
        reason=row.reason,
        created_at=row.created_at,
    )


def _deployment(session: Session, name: str) -> Deployment:
    deployment = repo.find_deployment(session, name)
    if deployment is None:
        raise RetuneRefused(f"deployment {name!r}: not recorded (its first tick or `planner deployments add` does)")
    if deployment.config_revision is None:
        raise RetuneRefused(f"deployment {name!r}: no config revision yet (its next tick records revision 1)")
    return deployment


def history(session: Session, name: str) -> list[ConfigRevision]:
    """Every revision of deployment `name`, oldest first."""
    deployment = _deployment(session, name)
    rows = session.scalars(
        select(ConfigRevisionRow)
        .where(ConfigRevisionRow.deployment_id == deployment.id)
        .order_by(ConfigRevisionRow.revision)
    )
    return [_revision(name, row) for row in rows]


def get_revision(session: Session, name: str, revision: int | None = None) -> tuple[ConfigRevision, PlannerConfig]:
    """Revision `revision` of deployment `name` (default: the current one) and its policy."""
    deployment = _deployment(session, name)
    number = deployment.config_revision if revision is None else revision
    row = session.get(ConfigRevisionRow, (deployment.id, number))
    if row is None:
        raise RetuneRefused(
            f"deployment {name!r}: no config revision {number} (the current revision is {deployment.config_revision})"
        )
    source = f"deployment {name!r}: config revision {number}"
    return _revision(name, row), repo.stored_policy(session, row.config_hash, source)


def parse_assignments(assignments: Sequence[str], option: str = "--set") -> dict[str, Any]:
    """`FIELD=VALUE` pairs as a mapping, each value read as YAML (`300`, `0.5`, `true`, `null`), each field under
    its own name (a Dynamo alias such as `ttft` is taken as `ttft_ms`).

    Raises:
        RetuneRefused: a pair without `=` or with an empty field, a value that is not YAML, or a field given twice.
    """
    updates: dict[str, Any] = {}
    for pair in assignments:
        field, sep, value = pair.partition("=")
        field = field.strip()
        if not sep or not field:
            raise RetuneRefused(f"{option} {pair!r}: expected FIELD=VALUE, e.g. ttft_ms=300")
        try:
            parsed = yaml.safe_load(value) if value.strip() else None
        except yaml.YAMLError as exc:
            raise RetuneRefused(f"{option} {pair!r}: the value is not valid YAML ({type(exc).__name__})") from None
        name = _ALIAS_TO_FIELD.get(field, field)
        if name in updates:
            raise RetuneRefused(f"{option} {pair!r}: field '{name}' is given twice")
        updates[name] = parsed
    if not updates:
        raise RetuneRefused(f"{option}: nothing to change (give FIELD=VALUE at least once)")
    return updates


def retune(
    session: Session,
    name: str,
    expected_revision: int,
    updates: Mapping[str, Any],
    reason: str,
    *,
    check: Callable[[PlannerConfig, Path | None], object],
) -> ConfigRevision:
    """Write revision `expected_revision + 1` of deployment `name`: the current revision's policy with `updates`,
    validated by the config loader and `check` (the early refusals: `refuse_what_cannot_work`), in the caller's
    transaction. The new revision keeps the current one's `source_path` (relative paths are taken from its folder).

    Raises:
        RetuneRefused: the deployment is unknown, `expected_revision` is not the current revision (stale), the
            updates change nothing, the reason is empty, or the database refuses the login (one line).
        ConfigError: a field is unknown, a value is bad, a field cannot change live, or `check` refuses (one line).
    """
    if not reason.strip():
        raise RetuneRefused(f"deployment {name!r}: --reason is empty; say why the config changes")
    deployment = _deployment(session, name)
    current = deployment.config_revision
    if expected_revision != current:
        raise RetuneRefused(
            f"deployment {name!r}: stale config revision: expected revision {expected_revision}, the current "
            f"revision is {current}"
        )
    row = session.get(ConfigRevisionRow, (deployment.id, current))
    assert row is not None  # deployments.config_revision names a revision the trigger wrote
    before = repo.stored_policy(session, row.config_hash, f"deployment {name!r}: config revision {current}")
    after = parse_config({**before.model_dump(mode="json"), **updates}, SOURCE).policy
    changes = live_changes(before, after, SOURCE)
    if not changes:
        raise RetuneRefused(f"deployment {name!r}: {SOURCE} changes nothing (revision {current} has those values)")
    check(after, None if row.source_path is None else Path(row.source_path))
    login = session.scalar(text("SELECT session_user"))  # asked first: a refused INSERT aborts the transaction
    try:
        digest = repo.register_config(session, after)
        session.add(
            ConfigRevisionRow(
                deployment_id=deployment.id,
                revision=current + 1,
                config_hash=digest,
                source="set",
                changes=changes,
                source_path=row.source_path,
                reason=reason,
            )
        )
        session.flush()
    except DBAPIError as exc:
        raise _refusal(login, name, exc) from None
    written = session.get(ConfigRevisionRow, (deployment.id, current + 1))
    assert written is not None
    session.refresh(written)  # author and created_at, as the trigger set them
    return _revision(name, written)


def _refusal(login: str, name: str, exc: DBAPIError) -> Exception:
    """The database's refusal of a retune in one line (the trigger's own text names the role or the revisions)."""
    state = getattr(exc.orig, "sqlstate", None)
    message = str(exc.orig).splitlines()[0] if exc.orig is not None else str(exc)
    if state == STALE_SQLSTATE:
        return RetuneRefused(message)
    if state == UNAUTHORISED_SQLSTATE:
        if message.startswith("role "):  # the trigger's: the login is not a member of planner_operator
            return RetuneRefused(message)
        return RetuneRefused(f"role {login} may not retune deployment {name!r}: {message}")
    return exc
