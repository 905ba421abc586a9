"""The tick tables partitioned by time: one partition per UTC day, so retention drops whole days.

Why: a load tick every 5 s is ~17 000 ticks a day per deployment, each with rows in seven tables. Deleting old
rows (`planner db prune --older-than`) rewrites nothing but leaves dead tuples, index bloat and vacuum work in
proportion; dropping a day's partitions is a catalog operation whatever the day holds
(`planner db prune --drop-partitions-older-than`, store/partitions.py).
Creates:
- `ticks`, `traffic_observations`, `worker_observations`, `predictions`, `proposals`, `tick_step_lists` and
  `planner_states` as tables PARTITION BY RANGE (scheduled_at), same columns, checks, comments and defaults. The
  six tables that hold one tick's rows gain `scheduled_at` (copied from their tick, NOT NULL) and reference the
  tick with a composite foreign key (tick_id, scheduled_at) -> ticks (id, scheduled_at). Primary keys gain
  `scheduled_at` (`ticks` (id, scheduled_at), the others (tick_id, scheduled_at), `proposals` (id, scheduled_at))
  and so does `proposals`' unique (tick_id, component, scheduled_at): Postgres needs the partition key in every
  unique index of a partitioned table; the tick id alone still determines the row. `ticks`' unique
  (deployment_id, loop, scheduled_at) is unchanged.
- partitions `<table>_pYYYYMMDD` for every day existing rows fall on (`tick_step_lists`' with
  toast_tuple_target = 128, as the table had).
- function `planner_tick_partitions(day date)` (SECURITY DEFINER, EXECUTE for `planner_writer`): creates the
  seven partitions of a day if missing, under a transaction-level advisory lock, and returns how many it created;
  the planner calls it ahead (upgrade, serve, fleet start) and on demand before recording a tick of a new day.
- function `planner_drop_tick_partitions(day date)` (SECURITY DEFINER, EXECUTE for `planner_writer`): drops the
  seven partitions of a day (the children first); `planner db prune --drop-partitions-older-than` decides which
  days may go.
Drops: the foreign keys of `decisions.tick_id`, `audit_log.tick_id`, `replay_ticks.tick_id` and
`ticks.previous_tick_id` (a column may now name a tick whose partition retention dropped; the audit log is
append-only and cannot lose rows, and the decisions it references stay), and `planner_states.base_tick_id`'s
(a delta's base is in the same partition by construction: a tick whose previous tick is in another day stores
its state whole, `state_delta.same_partition`; existing deltas whose base is in another day are rewritten
whole here).
Views reading these tables (`tick_summary`, `decision_history`, `fpm_snapshots`, `tick_steps`, ...) are
re-pointed at the new tables, same columns, their joins of a tick table to `ticks` by tick id also equating
`scheduled_at` (so Postgres can read the tick's partition only); grants as before (`planner_writer`: SELECT,
INSERT, UPDATE, DELETE; `planner_analyst`: SELECT); the id sequences move to the new tables.
Locks: ACCESS EXCLUSIVE on the seven tables (and the tables whose foreign keys are dropped) for the whole copy:
about as long as reading them; ticks are not recorded meanwhile.
Downgrade: back to unpartitioned tables (the rows copied, the old keys and foreign keys restored, the functions
dropped); refuses, changing nothing, if a decision, audit row, replay row or previous-tick reference names a
tick whose partition was dropped (the old foreign keys could not hold).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27 05:00:00
"""

import datetime as dt
import re
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from planner_core.runtime.store.state_delta import StateDeltaError, apply_delta, decode_delta

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The partitioned tables, the parent first; every other one holds rows of one tick.
TICK_TABLES = (
    "ticks",
    "traffic_observations",
    "worker_observations",
    "predictions",
    "proposals",
    "tick_step_lists",
    "planner_states",
)
CHILD_TABLES = TICK_TABLES[1:]

# The key of the advisory lock the partition functions take (any constant unique to this purpose).
PARTITION_LOCK_KEY = 170017

_ARRAY = "ARRAY[" + ", ".join(f"'{t}'" for t in TICK_TABLES) + "]"

CREATE_FUNCTION = f"""
CREATE FUNCTION planner_tick_partitions(day date) RETURNS integer LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public AS $$
DECLARE
    t text;
    created integer := 0;
    suffix text := '_p' || to_char(day, 'YYYYMMDD');
    lo timestamptz := day::timestamp AT TIME ZONE 'UTC';
BEGIN
    -- the common case, every partition there: no lock, no DDL
    IF NOT EXISTS (SELECT FROM unnest({_ARRAY}) AS n WHERE to_regclass('public.' || n || suffix) IS NULL) THEN
        RETURN 0;
    END IF;
    -- two planners creating the same day: the second waits here, then finds them all
    PERFORM pg_advisory_xact_lock({PARTITION_LOCK_KEY});
    FOREACH t IN ARRAY {_ARRAY} LOOP
        -- IF NOT EXISTS: this session's catalog cache may not show yet what the lock holder committed; the
        -- statement itself looks again under its own lock. Created by this transaction: its row's xmin is ours.
        EXECUTE format('CREATE TABLE IF NOT EXISTS public.%I PARTITION OF public.%I FOR VALUES FROM (%L) TO (%L)%s',
                       t || suffix, t, lo, lo + interval '1 day',
                       CASE WHEN t = 'tick_step_lists' THEN ' WITH (toast_tuple_target = 128)' ELSE '' END);
        IF (SELECT c.xmin = pg_current_xact_id()::xid FROM pg_class c
             WHERE c.oid = to_regclass('public.' || t || suffix)) THEN
            created := created + 1;
        END IF;
    END LOOP;
    RETURN created;
END
$$
"""

DROP_FUNCTION = f"""
CREATE FUNCTION planner_drop_tick_partitions(day date) RETURNS integer LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public AS $$
DECLARE
    t text;
    dropped integer := 0;
    suffix text := '_p' || to_char(day, 'YYYYMMDD');
BEGIN
    PERFORM pg_advisory_xact_lock({PARTITION_LOCK_KEY});
    -- every parent locked at once, `ticks` first as a tick's transaction takes them: no deadlock with a tick
    LOCK TABLE {", ".join(TICK_TABLES)} IN ACCESS EXCLUSIVE MODE;
    -- the tables referencing ticks first, ticks last; detached first, since a partition of a table other tables
    -- reference cannot be dropped while attached (Postgres checks no row references it when it is detached)
    FOREACH t IN ARRAY {_ARRAY.replace("ARRAY['ticks', ", "ARRAY[")} || ARRAY['ticks'] LOOP
        IF to_regclass('public.' || t || suffix) IS NOT NULL THEN
            EXECUTE format('ALTER TABLE public.%I DETACH PARTITION public.%I', t, t || suffix);
            EXECUTE format('DROP TABLE public.%I', t || suffix);
            dropped := dropped + 1;
        END IF;
    END LOOP;
    RETURN dropped;
END
$$
"""

_WRITER_GRANTS = """
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'planner_writer') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON {tables} TO planner_writer;
        {functions}
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'planner_analyst') THEN
        GRANT SELECT ON {tables} TO planner_analyst;
    END IF;
END
$$
"""

# The views that read `relation` (decision_history, tick_summary, ...), each with its definition (as 0015).
_DEPENDENT_VIEWS = """
SELECT DISTINCT v.relname, pg_get_viewdef(v.oid) AS definition
  FROM pg_depend d
  JOIN pg_rewrite r ON r.oid = d.objid
  JOIN pg_class v ON v.oid = r.ev_class
 WHERE d.refobjid = CAST(CAST(:relation AS text) AS regclass) AND v.relname::text <> CAST(:relation AS text)
"""


def _repoint_views(renamed: str, name: str) -> None:
    """Point the views that read `renamed` at the relation now called `name` (CREATE OR REPLACE keeps their
    columns, grants and comments; a renamed relation's dependents follow its OID, not its name)."""
    bind = op.get_bind()
    for view, definition in bind.execute(sa.text(_DEPENDENT_VIEWS), {"relation": renamed}).all():
        pattern = re.compile(rf"\b{renamed}\b")
        op.execute(f"CREATE OR REPLACE VIEW {view} AS {pattern.sub(name, definition)}")


_ALL_VIEWS = (
    "SELECT c.relname, pg_get_viewdef(c.oid) FROM pg_class c "
    "WHERE c.relkind = 'v' AND c.relnamespace = 'public'::regnamespace"
)


def _join_on_partition_key(definition: str) -> str:
    """A view's joins of a tick table to `ticks` by tick id also equate `scheduled_at`, so Postgres may read the
    tick's partition only (measured on 80 days: `sla_by_hour` over 7 days ~1.1 s -> ~0.2 s)."""
    ticks = re.findall(r"(?:FROM|JOIN)\s+\(*ticks\s+(\w+)", definition)
    rows = re.findall(rf"(?:FROM|JOIN)\s+\(*(?:{'|'.join(CHILD_TABLES)})\s+(\w+)", definition)
    for row in rows:
        for tick in ticks:
            definition = re.sub(
                rf"\({row}\.tick_id = {tick}\.id\)",
                f"({row}.tick_id = {tick}.id AND {row}.scheduled_at = {tick}.scheduled_at)",
                definition,
            )
    return definition


def _rewrite_views(rewrite: object) -> None:
    """Replace every view whose definition `rewrite` changes (same columns: CREATE OR REPLACE keeps grants and
    comments)."""
    for view, definition in op.get_bind().execute(sa.text(_ALL_VIEWS)).all():
        changed = rewrite(definition)  # type: ignore[operator]
        if changed != definition:
            op.execute(f"CREATE OR REPLACE VIEW {view} AS {changed}")


def _set_aside(table: str) -> str:
    """Rename `table` and its indexes out of the way (`<name>_o17`), so the new table takes the old names."""
    old = f"{table}_o17"
    op.execute(f"ALTER TABLE {table} RENAME TO {old}")
    bind = op.get_bind()
    indexes = bind.execute(
        sa.text("SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = :t"),
        {"t": bind.scalar(sa.text("SELECT CAST(CAST(:n AS text) AS regclass)::oid"), {"n": old})},
    ).scalars()
    for index in list(indexes):
        op.execute(f"ALTER INDEX {index} RENAME TO {index[:58]}_o17")  # renames its constraint too
    return old


def _drop_tick_foreign_keys() -> None:
    """Every foreign key referencing `ticks`, and `planner_states.base_tick_id`'s."""
    bind = op.get_bind()
    rows = bind.execute(
        sa.text(
            """SELECT conrelid::regclass::text AS tbl, conname FROM pg_constraint
                WHERE contype = 'f' AND (confrelid = 'ticks'::regclass OR confrelid = 'planner_states'::regclass)"""
        )
    ).all()
    for row in rows:
        op.execute(f'ALTER TABLE {row.tbl} DROP CONSTRAINT "{row.conname}"')


def _create_partitioned(table: str, old: str) -> None:
    """`table` as `old` (columns, defaults, checks, comments), partitioned by `scheduled_at`, which the tables of a
    tick's rows gain (last, so `INSERT ... SELECT old.*, scheduled_at` lines up)."""
    extra = "" if table == "ticks" else ", scheduled_at timestamptz NOT NULL"
    op.execute(
        f"CREATE TABLE {table} (LIKE {old} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING COMMENTS "
        f"INCLUDING STORAGE INCLUDING COMPRESSION{extra}) PARTITION BY RANGE (scheduled_at)"
    )
    if table != "ticks":
        op.execute(
            f"COMMENT ON COLUMN {table}.scheduled_at IS 'The scheduled time of the tick the row belongs to (copied "
            "from ticks.scheduled_at): the partition key (migration 0017)'"
        )


_KEYS = {
    "ticks": [
        "ALTER TABLE ticks ADD CONSTRAINT pk_ticks PRIMARY KEY (id, scheduled_at)",
        "ALTER TABLE ticks ADD CONSTRAINT uq_ticks_deployment_id_loop_scheduled_at "
        "UNIQUE (deployment_id, loop, scheduled_at)",
        "ALTER TABLE ticks ADD CONSTRAINT fk_ticks_deployment_id_deployments FOREIGN KEY (deployment_id) "
        "REFERENCES deployments (id)",
        "ALTER TABLE ticks ADD CONSTRAINT fk_ticks_config_hash_planner_configs FOREIGN KEY (config_hash) "
        "REFERENCES planner_configs (config_hash)",
        "CREATE INDEX ix_ticks_deployment_id_scheduled_at ON ticks (deployment_id, scheduled_at)",
        "CREATE INDEX ix_ticks_throughput_hour ON ticks (deployment_id, date_trunc('hour', scheduled_at, 'UTC')) "
        "WHERE loop = 'throughput'",
    ],
    "proposals": [
        "ALTER TABLE proposals ADD CONSTRAINT pk_proposals PRIMARY KEY (id, scheduled_at)",
        "ALTER TABLE proposals ADD CONSTRAINT uq_proposals_tick_id_component_scheduled_at "
        "UNIQUE (tick_id, component, scheduled_at)",
    ],
    "planner_states": [
        "ALTER TABLE planner_states ADD CONSTRAINT fk_planner_states_deployment_id_deployments "
        "FOREIGN KEY (deployment_id) REFERENCES deployments (id)",
        "CREATE INDEX ix_planner_states_deployment_id_tick_id ON planner_states (deployment_id, tick_id)",
        "CREATE INDEX ix_planner_states_base_tick_id ON planner_states (base_tick_id)",
    ],
}


def _add_keys(table: str) -> None:
    if table != "proposals" and table != "ticks":
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT pk_{table} PRIMARY KEY (tick_id, scheduled_at)")
    for statement in _KEYS.get(table, []):
        op.execute(statement)
    if table != "ticks":
        op.execute(
            f"ALTER TABLE {table} ADD CONSTRAINT fk_{table}_tick_id_ticks FOREIGN KEY (tick_id, scheduled_at) "
            "REFERENCES ticks (id, scheduled_at)"
        )


def _rewrite_cross_day_deltas() -> None:
    """A state stored as a delta against a tick of another day is stored whole (a chain never crosses a day)."""
    bind = op.get_bind()
    rows = bind.execute(
        sa.text(
            """SELECT p.tick_id FROM planner_states p JOIN planner_states b ON b.tick_id = p.base_tick_id
                WHERE (p.scheduled_at AT TIME ZONE 'UTC')::date <> (b.scheduled_at AT TIME ZONE 'UTC')::date
                ORDER BY p.tick_id"""
        )
    ).scalars()
    chain = sa.text(
        """WITH RECURSIVE chain AS (
               SELECT tick_id, base_tick_id, state, delta, 0 AS depth FROM planner_states WHERE tick_id = :id
               UNION ALL
               SELECT p.tick_id, p.base_tick_id, p.state, p.delta, c.depth + 1
                 FROM planner_states p JOIN chain c ON p.tick_id = c.base_tick_id WHERE c.state IS NULL)
           SELECT state, delta FROM chain ORDER BY depth DESC"""
    )
    whole: dict[int, object] = {}
    for tick_id in list(rows):
        links = bind.execute(chain, {"id": tick_id}).all()
        if not links or links[0].state is None:
            raise RuntimeError(f"planner_states: tick {tick_id}'s delta chain has no full state; nothing was changed")
        state = links[0].state
        try:
            for link in links[1:]:
                state = apply_delta(state, decode_delta(link.delta))
        except StateDeltaError as exc:
            raise RuntimeError(f"planner_states: tick {tick_id}'s delta does not fit its base: {exc}") from exc
        whole[tick_id] = state
    update = sa.text(
        "UPDATE planner_states SET state = :state, delta = NULL, base_tick_id = NULL WHERE tick_id = :id"
    ).bindparams(sa.bindparam("state", type_=postgresql.JSONB))
    for tick_id, state in whole.items():
        bind.execute(update, {"id": tick_id, "state": state})


def _days(table: str) -> list[dt.date]:
    return list(
        op.get_bind()
        .execute(sa.text(f"SELECT DISTINCT (scheduled_at AT TIME ZONE 'UTC')::date AS d FROM {table} ORDER BY d"))
        .scalars()
    )


def upgrade() -> None:
    _drop_tick_foreign_keys()
    old = {table: _set_aside(table) for table in TICK_TABLES}
    for table in TICK_TABLES:
        _create_partitioned(table, old[table])
    op.execute(CREATE_FUNCTION)
    op.execute(DROP_FUNCTION)
    for function in ("planner_tick_partitions(date)", "planner_drop_tick_partitions(date)"):
        op.execute(f"REVOKE ALL ON FUNCTION {function} FROM PUBLIC")
    # The keys before the partitions: a partition created later inherits them, and so do these.
    for table in TICK_TABLES:
        _add_keys(table)
    for day in _days(old["ticks"]):
        op.execute(sa.text("SELECT planner_tick_partitions(:day)").bindparams(day=day))
    op.execute(f"INSERT INTO ticks SELECT * FROM {old['ticks']}")
    for table in CHILD_TABLES:
        op.execute(
            f"INSERT INTO {table} SELECT c.*, t.scheduled_at "
            f"FROM {old[table]} c JOIN {old['ticks']} t ON t.id = c.tick_id"
        )
    _rewrite_cross_day_deltas()
    op.execute("ALTER SEQUENCE ticks_id_seq OWNED BY ticks.id")
    op.execute("ALTER SEQUENCE proposals_id_seq OWNED BY proposals.id")
    for table in TICK_TABLES:
        _repoint_views(old[table], table)
    for table in reversed(TICK_TABLES):
        op.execute(f"DROP TABLE {old[table]}")
    _rewrite_views(_join_on_partition_key)
    op.execute(
        _WRITER_GRANTS.format(
            tables=", ".join(TICK_TABLES),
            functions="GRANT EXECUTE ON FUNCTION planner_tick_partitions(date), "
            "planner_drop_tick_partitions(date) TO planner_writer;",
        )
    )
    for column in ("decisions.tick_id", "audit_log.tick_id", "replay_ticks.tick_id", "ticks.previous_tick_id"):
        op.execute(
            f"COMMENT ON COLUMN {column} IS 'A tick id (no foreign key since migration 0017): may name a tick whose "
            "partition retention dropped'"
        )


# ---------------------------------------------------------------------------------------------------- downgrade

_OLD_KEYS = {
    "ticks": [
        "ALTER TABLE ticks ADD CONSTRAINT pk_ticks PRIMARY KEY (id)",
        "ALTER TABLE ticks ADD CONSTRAINT uq_ticks_deployment_id_loop_scheduled_at "
        "UNIQUE (deployment_id, loop, scheduled_at)",
        "ALTER TABLE ticks ADD CONSTRAINT fk_ticks_deployment_id_deployments FOREIGN KEY (deployment_id) "
        "REFERENCES deployments (id)",
        "ALTER TABLE ticks ADD CONSTRAINT fk_ticks_config_hash_planner_configs FOREIGN KEY (config_hash) "
        "REFERENCES planner_configs (config_hash)",
        "CREATE INDEX ix_ticks_deployment_id_scheduled_at ON ticks (deployment_id, scheduled_at)",
        "CREATE INDEX ix_ticks_throughput_hour ON ticks (deployment_id, date_trunc('hour', scheduled_at, 'UTC')) "
        "WHERE loop = 'throughput'",
        "ALTER TABLE ticks ADD CONSTRAINT fk_ticks_previous_tick_id_ticks FOREIGN KEY (previous_tick_id) "
        "REFERENCES ticks (id)",
    ],
    "proposals": [
        "ALTER TABLE proposals ADD CONSTRAINT pk_proposals PRIMARY KEY (id)",
        "ALTER TABLE proposals ADD CONSTRAINT uq_proposals_tick_id_component UNIQUE (tick_id, component)",
    ],
    "planner_states": [
        "ALTER TABLE planner_states ADD CONSTRAINT fk_planner_states_deployment_id_deployments "
        "FOREIGN KEY (deployment_id) REFERENCES deployments (id)",
        "CREATE INDEX ix_planner_states_deployment_id_tick_id ON planner_states (deployment_id, tick_id)",
        "CREATE INDEX ix_planner_states_base_tick_id ON planner_states (base_tick_id)",
        "ALTER TABLE planner_states ADD CONSTRAINT fk_planner_states_base_tick_id_planner_states "
        "FOREIGN KEY (base_tick_id) REFERENCES planner_states (tick_id)",
    ],
}

_REFERENCES = (
    ("decisions", "tick_id", "fk_decisions_tick_id_ticks"),
    ("audit_log", "tick_id", "fk_audit_log_tick_id_ticks"),
    ("replay_ticks", "tick_id", "fk_replay_ticks_tick_id_ticks"),
)


def downgrade() -> None:
    bind = op.get_bind()
    # the views' joins on `scheduled_at` first: the unpartitioned tables do not have it
    _rewrite_views(lambda d: re.sub(r"\s+AND\s+\((\w+)\.scheduled_at = (\w+)\.scheduled_at\)", "", d))
    for table, column, _ in (*_REFERENCES, ("ticks", "previous_tick_id", "")):
        dangling = bind.scalar(
            sa.text(
                f"SELECT count(*) FROM {table} r WHERE r.{column} IS NOT NULL "
                f"AND NOT EXISTS (SELECT FROM ticks t WHERE t.id = r.{column})"
            )
        )
        if dangling:
            raise RuntimeError(
                f"migration 0017 downgrade: {dangling} {table}.{column} values name ticks whose partition was dropped "
                "(the unpartitioned schema's foreign key cannot hold); nothing was changed"
            )
    old = {table: _set_aside(table) for table in TICK_TABLES}
    for table in TICK_TABLES:
        columns = [
            name
            for name in bind.execute(
                sa.text(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = :t ORDER BY ordinal_position"
                ),
                {"t": old[table]},
            ).scalars()
            if table == "ticks" or name != "scheduled_at"
        ]
        op.execute(
            f"CREATE TABLE {table} (LIKE {old[table]} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING COMMENTS "
            "INCLUDING STORAGE INCLUDING COMPRESSION)"
        )
        if table != "ticks":
            op.execute(f"ALTER TABLE {table} DROP COLUMN scheduled_at")
        if table == "tick_step_lists":
            op.execute("ALTER TABLE tick_step_lists SET (toast_tuple_target = 128)")
        listed = ", ".join(columns)
        op.execute(f"INSERT INTO {table} ({listed}) SELECT {listed} FROM {old[table]}")
    for table in TICK_TABLES:
        if table not in ("ticks", "proposals"):
            op.execute(f"ALTER TABLE {table} ADD CONSTRAINT pk_{table} PRIMARY KEY (tick_id)")
        for statement in _OLD_KEYS.get(table, []):
            op.execute(statement)
        if table != "ticks":
            op.execute(
                f"ALTER TABLE {table} ADD CONSTRAINT fk_{table}_tick_id_ticks "
                "FOREIGN KEY (tick_id) REFERENCES ticks (id)"
            )
    for table, column, name in _REFERENCES:
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} FOREIGN KEY ({column}) REFERENCES ticks (id)")
        op.execute(f"COMMENT ON COLUMN {table}.{column} IS NULL")
    op.execute("COMMENT ON COLUMN ticks.previous_tick_id IS NULL")
    op.execute("ALTER SEQUENCE ticks_id_seq OWNED BY ticks.id")
    op.execute("ALTER SEQUENCE proposals_id_seq OWNED BY proposals.id")
    for table in TICK_TABLES:
        _repoint_views(old[table], table)
    for table in reversed(TICK_TABLES):
        op.execute(f"DROP TABLE {old[table]}")  # its partitions with it
    op.execute("DROP FUNCTION planner_tick_partitions(date)")
    op.execute("DROP FUNCTION planner_drop_tick_partitions(date)")
    op.execute(_WRITER_GRANTS.format(tables=", ".join(TICK_TABLES), functions=""))
