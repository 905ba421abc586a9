"""The fleet's registry in the database: the managed deployments (`fleet_members`: `add_member`,
`remove_member`, `list_members`), a folder of config files as the fleet (`read_fleet_folder`, `plan_sync`,
`sync_members`; GitOps) and the GPU budget (`fleet_budget`: `set_budget`, `get_budget`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from planner_core.config import load_config
from planner_core.planner import budget_warnings, refuse_what_cannot_work
from planner_core.runtime.store import repository as repo
from planner_core.runtime.store.models import (
    Deployment,
    FleetBudgetRow,
    FleetMemberRow,
)


class FleetError(ValueError):
    """A registry command that cannot be done (one line naming the deployment, the field and the value)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetMember:
    """A registered deployment and its share of the fleet budget."""

    name: str
    deployment_id: int
    config_path: str
    min_gpus: int
    max_gpus: int | None
    priority: int
    weight: float


def _check_share(name: str, min_gpus: int, max_gpus: int | None, weight: float) -> None:
    if min_gpus < 0:
        raise FleetError(f"deployment {name!r}: min_gpus must be >= 0, got {min_gpus}")
    if max_gpus is not None and max_gpus < min_gpus:
        raise FleetError(f"deployment {name!r}: max_gpus {max_gpus} is below min_gpus {min_gpus}")
    if not (weight > 0 and math.isfinite(weight)):
        raise FleetError(f"deployment {name!r}: weight must be a finite number > 0, got {weight}")


def add_member(
    session: Session,
    name: str,
    config_path: Path,
    *,
    min_gpus: int = 0,
    max_gpus: int | None = None,
    priority: int = 0,
    weight: float = 1.0,
) -> FleetMember:
    """Register (or update) `name` to run `config_path` in the fleet; the config is loaded and checked first.

    Raises:
        ConfigError: the config file is bad (one line).
        FleetError: the share is bad (one line).
    """
    _check_share(name, min_gpus, max_gpus, weight)
    path = str(config_path.resolve())
    loaded = load_config(path)
    refuse_what_cannot_work(loaded.policy, Path(path))  # not a member recording model_not_ready every minute
    # the file's policy is the deployment's newest `file` revision (a live retune of the same file stays in force)
    deployment = repo.ensure_deployment(session, name, loaded.policy, source_path=path)
    values = {
        "config_path": path,
        "min_gpus": min_gpus,
        "max_gpus": max_gpus,
        "priority": priority,
        "weight": weight,
    }
    session.execute(
        pg_insert(FleetMemberRow)
        .values(deployment_id=deployment.id, **values)
        .on_conflict_do_update(index_elements=["deployment_id"], set_=values)
    )
    repo.audit(session, "fleet_member_added", {"name": name, **values}, deployment_id=deployment.id)
    for warning in budget_warnings(loaded.policy, Path(path)):  # valid, but said (`member_budget_warnings` prints)
        repo.audit(session, "config_warning", {"deployment": name, "warning": warning}, deployment_id=deployment.id)
    return FleetMember(name=name, deployment_id=deployment.id, **values)


def member_budget_warnings(config_path: str | Path) -> tuple[str, ...]:
    """The `budget_warnings` of a member's config file worded as `add_member` records them (the path resolved, as
    the registry stores it), for the commands that print them: `deployments add`, `deployments sync`, `fleet serve`.

    Raises:
        ConfigError: the file is bad (one line).
    """
    path = Path(config_path).resolve()
    return budget_warnings(load_config(path).policy, path)


def remove_member(session: Session, name: str) -> bool:
    """Take `name` out of the fleet (its ticks and decisions stay); False when it was not a member."""
    deployment = repo.find_deployment(session, name)
    if deployment is None:
        return False
    row = session.get(FleetMemberRow, deployment.id)
    if row is None:
        return False
    session.delete(row)
    repo.audit(session, "fleet_member_removed", {"name": name}, deployment_id=deployment.id)
    return True


CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True, slots=True)
class FolderMember:
    """A deployment as a folder of config files declares it: the file, and the name and share of its `fleet:`."""

    name: str
    config_path: Path
    min_gpus: int
    max_gpus: int | None
    priority: int
    weight: float


def read_fleet_folder(folder: Path) -> list[FolderMember]:
    """Every config file (`.yaml`, `.yml`, `.json`) directly in `folder`, loaded and checked, by name.

    A file's deployment is named by its `fleet.name`, else by the file's name without the suffix; its share comes
    from `fleet:` (defaults: min 0, no max, priority 0, weight 1). Files starting with `.` are skipped.

    Raises:
        FleetError: the folder is missing or holds no config file, or two files name the same deployment (one line).
        ConfigError: a file is bad (one line starting with its path).
    """
    if not folder.is_dir():
        raise FleetError(f"{folder}: not a folder")
    paths = sorted(
        path
        for path in folder.iterdir()
        if path.is_file() and path.suffix.lower() in CONFIG_SUFFIXES and not path.name.startswith(".")
    )
    if not paths:
        raise FleetError(f"{folder}: no config file ({', '.join(CONFIG_SUFFIXES)}) in it")
    members: dict[str, FolderMember] = {}
    for path in paths:
        loaded = load_config(path)
        refuse_what_cannot_work(loaded.policy, path)
        share = loaded.service.fleet
        name = share.name if share is not None and share.name is not None else path.stem
        if name in members:
            raise FleetError(f"{path}: deployment {name!r} is also declared by {members[name].config_path}")
        members[name] = FolderMember(
            name=name,
            config_path=path.resolve(),
            min_gpus=0 if share is None else share.min_gpus,
            max_gpus=None if share is None else share.max_gpus,
            priority=0 if share is None else share.priority,
            weight=1.0 if share is None else share.weight,
        )
    return list(members.values())


@dataclass(frozen=True, slots=True)
class SyncPlan:
    """What `sync_members` does (or would do), each by name: members added, updated (file or share changed), left as
    they were, removed (registered but not in the folder, with `prune`), and kept (not in the folder, no `prune`)."""

    added: tuple[str, ...]
    updated: tuple[str, ...]
    unchanged: tuple[str, ...]
    removed: tuple[str, ...]
    kept: tuple[str, ...]


def plan_sync(current: list[FleetMember], declared: list[FolderMember], *, prune: bool) -> SyncPlan:
    """Compare the registry with a folder's declarations (pure)."""
    registered = {m.name: m for m in current}
    added, updated, unchanged = [], [], []
    for member in declared:
        old = registered.get(member.name)
        if old is None:
            added.append(member.name)
        elif (old.config_path, old.min_gpus, old.max_gpus, old.priority, old.weight) != (
            str(member.config_path), member.min_gpus, member.max_gpus, member.priority, member.weight
        ):  # fmt: skip
            updated.append(member.name)
        else:
            unchanged.append(member.name)
    names = {m.name for m in declared}
    others = tuple(sorted(name for name in registered if name not in names))
    return SyncPlan(
        added=tuple(sorted(added)),
        updated=tuple(sorted(updated)),
        unchanged=tuple(sorted(unchanged)),
        removed=others if prune else (),
        kept=() if prune else others,
    )


def sync_members(session: Session, declared: list[FolderMember], *, prune: bool, dry_run: bool = False) -> SyncPlan:
    """Make the registry match a folder's declarations, in the caller's transaction (all of it, or nothing if a
    step fails); with `prune`, members the folder does not declare are removed (their records stay)."""
    plan = plan_sync(list_members(session), declared, prune=prune)
    if dry_run:
        return plan
    by_name = {m.name: m for m in declared}
    for name in (*plan.added, *plan.updated):
        member = by_name[name]
        add_member(
            session, name, member.config_path, min_gpus=member.min_gpus, max_gpus=member.max_gpus,
            priority=member.priority, weight=member.weight,
        )  # fmt: skip
    for name in plan.removed:
        remove_member(session, name)
    return plan


def list_members(session: Session) -> list[FleetMember]:
    """Every member, by name."""
    rows = session.execute(
        select(Deployment.name, FleetMemberRow).join(Deployment, Deployment.id == FleetMemberRow.deployment_id)
    ).all()
    return sorted(
        (
            FleetMember(
                name=name,
                deployment_id=row.deployment_id,
                config_path=row.config_path,
                min_gpus=row.min_gpus,
                max_gpus=row.max_gpus,
                priority=row.priority,
                weight=row.weight,
            )
            for name, row in rows
        ),
        key=lambda member: member.name,
    )


def set_budget(session: Session, budget_gpus: int | None) -> None:
    """Set the fleet's GPU budget; None removes it (nothing is arbitrated then)."""
    if budget_gpus is not None and budget_gpus < 0:
        raise FleetError(f"fleet budget: budget_gpus must be >= 0, got {budget_gpus}")
    existing = session.get(FleetBudgetRow, 1)
    if budget_gpus is None:
        if existing is not None:
            session.delete(existing)
    else:
        session.execute(
            pg_insert(FleetBudgetRow)
            .values(id=1, budget_gpus=budget_gpus)
            .on_conflict_do_update(index_elements=["id"], set_={"budget_gpus": budget_gpus, "updated_at": func.now()})
        )
    repo.audit(session, "fleet_budget_set", {"budget_gpus": budget_gpus})


def get_budget(session: Session) -> int | None:
    row = session.get(FleetBudgetRow, 1)
    return None if row is None else row.budget_gpus
