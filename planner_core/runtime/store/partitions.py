"""The tick tables' daily partitions: created ahead, created on demand, known in-process so recording does no DDL.

The seven tick tables (`TICK_TABLES`) are partitioned by `scheduled_at`, one partition per UTC day named
`<table>_pYYYYMMDD` (migration 0017). A row whose day has no partition cannot be inserted, so:

* `ensure_partitions_ahead` creates today's and the next days' partitions in its own transaction; `planner db
  upgrade`, `planner serve` and the fleet flow call it when they start, and the tick runners (`run_tick`) call
  `ensure_partitions` for the tick's day before their transaction begins;
* `ensure_partition` (called by `repository.record_tick` inside the tick's transaction) is a dictionary lookup
  when the day is known; otherwise it asks the database (`planner_tick_partitions(day)`, which creates what is
  missing under an advisory lock, so two processes never race), so a tick of any day records: a replay of
  history, `planner ingest`, the simulator's epochs, tests with arbitrary dates.

The database function runs as the schema's owner (SECURITY DEFINER): the planner's writer role owns nothing and
could not create a table. Known days are remembered per database for `KNOWN_FOR_S` seconds, then asked again
(one catalog lookup, no DDL), so a day dropped by another process's retention is noticed; retention in this
process forgets the days it drops at once (`forget`).

The day arithmetic (`partition_day`, `partition_start`, `partition_bounds`, `same_partition`) is pure: the
deltas' chains (`state_delta`, cut at each day by `repository.state_row_values`), retention and the runners bound
their rows' times with it.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

# Time partitions. The tick tables are partitioned by `scheduled_at`, one partition per UTC day (migration 0017),
# and retention drops whole days. A delta chain must never cross a day boundary, or dropping a day would leave a
# later day's deltas without their base: a tick whose previous tick lies in another day stores its state whole.
# (Pure arithmetic, here beside the partitions it names; the deltas (`state_delta`) and any other per-tick chain
# follow the same rule.)


def partition_day(at: dt.datetime) -> dt.date:
    """The UTC day whose partition holds a row scheduled at `at` (an aware datetime)."""
    if at.tzinfo is None:
        raise ValueError(f"partition_day: {at!r} is a naive datetime; the tick tables hold aware UTC times")
    return at.astimezone(dt.UTC).date()


def partition_start(at: dt.datetime) -> dt.datetime:
    """The first instant (UTC midnight) of the partition holding `at`."""
    return dt.datetime.combine(partition_day(at), dt.time(), tzinfo=dt.UTC)


def partition_bounds(at: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """[start, end) of the partition holding `at`: the range a query may bound `scheduled_at` to."""
    start = partition_start(at)
    return start, start + dt.timedelta(days=1)


def same_partition(a: dt.datetime, b: dt.datetime) -> bool:
    """Whether rows scheduled at `a` and `b` lie in the same partition (the same UTC day)."""
    return partition_day(a) == partition_day(b)


TICK_TABLES = (
    "ticks",
    "traffic_observations",
    "worker_observations",
    "predictions",
    "proposals",
    "tick_step_lists",
    "planner_states",
)
DAYS_AHEAD = 2  # partitions created ahead: today and the next two days
KNOWN_FOR_S = 60.0  # how long a day found or created is trusted without asking the database again

_CREATE = text("SELECT planner_tick_partitions(CAST(:day AS date))")
_known: dict[tuple[str, dt.date], float] = {}  # (database URL, day) -> monotonic time it was last confirmed


_PARTITION_NAME = re.compile(r"_p\d{8}$")


def is_partition(name: str | None) -> bool:
    """Whether a table name is a day's partition (`ticks_p20260105`): Alembic's autogenerate leaves those alone,
    the models describe the partitioned tables."""
    return name is not None and _PARTITION_NAME.search(name) is not None and name[: -len("_p20260105")] in TICK_TABLES


def include_name(name: str | None, type_: str, _parent_names: object) -> bool:
    """Alembic's `include_name` hook: every object but the tick tables' partitions (and their indexes)."""
    if type_ == "table":
        return not is_partition(name)
    return True


def include_object(item: Any, _name: str | None, type_: str, _reflected: bool, _compare_to: Any) -> bool:
    """Alembic's `include_object` hook: not the foreign keys Postgres keeps per partition of `ticks` (a composite
    foreign key to a partitioned table is one constraint per referenced partition in the catalog)."""
    if type_ == "foreign_key_constraint":
        return not is_partition(item.referred_table.name)
    return True


def partition_name(table: str, day: dt.date) -> str:
    """The name of `table`'s partition of `day`."""
    return f"{table}_p{day:%Y%m%d}"


def _database(bind: Any) -> str:
    return bind.engine.url.render_as_string(hide_password=True)


def _is_known(database: str, day: dt.date) -> bool:
    confirmed = _known.get((database, day))
    return confirmed is not None and time.monotonic() - confirmed < KNOWN_FOR_S


def ensure_partition(session: Session, at: dt.datetime) -> int:
    """Make sure the partitions holding rows scheduled at `at` exist, inside the caller's transaction; the number
    of tables created (0 when known or already there)."""
    day = partition_day(at)
    database = _database(session.get_bind())
    if _is_known(database, day):
        return 0
    created = int(session.scalar(_CREATE, {"day": day}) or 0)
    if created == 0:  # there already, committed; what this transaction created is known once it commits
        _known[(database, day)] = time.monotonic()
    return created


def ensure_partitions(engine: Engine, days: list[dt.date]) -> int:
    """Create the partitions of `days` that are missing, each day in its own short transaction (so the DDL holds
    its locks only for that long); the number of tables created."""
    database = _database(engine)
    created = 0
    for day in days:
        if _is_known(database, day):
            continue
        with engine.begin() as conn:
            created += int(conn.scalar(_CREATE, {"day": day}) or 0)
        _known[(database, day)] = time.monotonic()
    return created


def ensure_partitions_ahead(engine: Engine, now: dt.datetime, days_ahead: int = DAYS_AHEAD) -> int:
    """Create today's partitions and those of the next `days_ahead` days (UTC) where missing."""
    today = partition_day(now)
    return ensure_partitions(engine, [today + dt.timedelta(days=i) for i in range(days_ahead + 1)])


def forget(engine: Engine, day: dt.date) -> None:
    """Forget that `day`'s partitions exist (retention dropped them)."""
    _known.pop((_database(engine), day), None)


def forget_all() -> None:
    """Forget every known day (a migration may have dropped and recreated the tables)."""
    _known.clear()


def partition_days(session: Session) -> list[dt.date]:
    """The days that have a `ticks` partition, oldest first."""
    names = session.scalars(
        text(
            """SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                WHERE i.inhparent = 'ticks'::regclass ORDER BY c.relname"""
        )
    ).all()
    return [dt.datetime.strptime(name.removeprefix("ticks_p"), "%Y%m%d").date() for name in names]
