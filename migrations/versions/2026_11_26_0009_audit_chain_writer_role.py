"""A hash-chained audit log, and a writer role that owns nothing.

Why: the audit log's append-only trigger stopped accidents only. The planner connected as the tables' owner (the
superuser in the embedded setup), and an owner can disable the trigger, set `session_replication_role = replica`
or drop the table. Now the planner writes through `planner_writer`, a role with row privileges only (no
ownership, no TRIGGER, no TRUNCATE, and only SELECT and INSERT on `audit_log`), while migrations run as the
owner. And every audit row carries the hash of the row before it, so an edit made by anyone who can get around
the trigger (the owner, a superuser, a restored backup) breaks the chain at that row, which `planner audit
verify` reports. The chain is computed by a BEFORE INSERT trigger, so every writer's row is chained, whatever
code wrote it.
Creates:
- columns `audit_log.prev_hash` and `audit_log.row_hash` (bytea, NOT NULL): `row_hash = sha256(prev_hash ||
  utf8(content))` where content is the JSON array text of (id, at in UTC as YYYY-MM-DDTHH:MI:SS.US,
  deployment_id, tick_id, decision_id, event, detail); the first row's `prev_hash` is 32 zero bytes. Existing
  rows are chained in id order.
- table `audit_chain_head` (one row: the newest chained row's id and hash), which serialises the chain: the
  trigger locks it, so concurrent writers chain one after the other, and the row id is drawn after the lock, so
  the id order is the chain order. It also lets `planner audit verify` notice rows cut from the end.
- function `audit_log_chain()` (SECURITY DEFINER: it runs as the owner, so the writer needs no privilege on
  the head) and trigger `audit_log_chain` BEFORE INSERT ON audit_log.
- role `planner_writer` (NOLOGIN) if it does not exist and this user may create roles (otherwise a NOTICE says
  so and the grants are skipped, as for `planner_analyst`): USAGE on the schema; SELECT, INSERT, UPDATE, DELETE
  on every table but `audit_log` (SELECT, INSERT), `audit_chain_head` and `alembic_version` (SELECT); USAGE
  and SELECT on the sequences; the same by default on tables and sequences this user creates later.
Locks: ALTER TABLE audit_log takes an ACCESS EXCLUSIVE lock on it while the columns are added and the existing
rows chained (one UPDATE pass: about a second per million audit rows); ticks wait for it. The trigger is
disabled during that pass and enabled again in the same transaction. GRANT takes brief catalog locks.
Downgrade: drops the trigger, the function, the head table and the two columns (the hashes are lost: a later
upgrade chains the rows again, from whatever they hold then), revokes `planner_writer`'s privileges in this
database and drops the role only when nothing in any database depends on it and it has no members.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26 17:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WRITER_ROLE = "planner_writer"

# The text a row's hash covers. A JSON array keeps the fields apart whatever they hold (an event with "|" in it
# cannot shift a boundary); jsonb's text form is canonical (key order, spacing), and the time is written in UTC
# so the session's TimeZone does not change it. `planner audit verify` builds the same text (its own copy).
_CONTENT = """jsonb_build_array(
        {row}.id, to_char({row}.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'), {row}.deployment_id,
        {row}.tick_id, {row}.decision_id, {row}.event, {row}.detail)::text"""

_GENESIS = "'\\x0000000000000000000000000000000000000000000000000000000000000000'::bytea"

_CHAIN_FUNCTION = f"""
CREATE FUNCTION audit_log_chain() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public AS $$
DECLARE
    previous bytea;
BEGIN
    -- the head row's lock is held to the end of the transaction: the next writer waits, then reads this row
    SELECT last_hash INTO previous FROM public.audit_chain_head WHERE id = 1 FOR UPDATE;
    NEW.id := nextval(pg_get_serial_sequence('public.audit_log', 'id'));
    NEW.prev_hash := previous;
    NEW.row_hash := sha256(previous || convert_to({_CONTENT.format(row="NEW")}, 'UTF8'));
    UPDATE public.audit_chain_head SET last_id = NEW.id, last_hash = NEW.row_hash WHERE id = 1;
    RETURN NEW;
END
$$
"""

# Chain the rows already there, in id order (the trigger refusing UPDATE is off for this pass only).
_CHAIN_EXISTING = f"""
DO $$
DECLARE
    r record;
    previous bytea := {_GENESIS};
    last bigint := NULL;
BEGIN
    FOR r IN SELECT * FROM audit_log ORDER BY id LOOP
        UPDATE audit_log SET prev_hash = previous,
                             row_hash = sha256(previous || convert_to({_CONTENT.format(row="r")}, 'UTF8'))
         WHERE id = r.id
        RETURNING row_hash INTO previous;
        last := r.id;
    END LOOP;
    INSERT INTO audit_chain_head (id, last_id, last_hash) VALUES (1, last, previous);
END
$$
"""

_GRANT_WRITER = f"""
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{WRITER_ROLE}') THEN
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = current_user AND (rolcreaterole OR rolsuper)) THEN
            RAISE NOTICE 'role {WRITER_ROLE} not created: % may not create roles (see docs, writer role)',
                current_user;
            RETURN;
        END IF;
        CREATE ROLE {WRITER_ROLE} NOLOGIN;
    END IF;
    COMMENT ON ROLE {WRITER_ROLE} IS
        'What the planner writes through: row privileges only, no ownership (see docs/database-and-sql.md)';
    GRANT USAGE ON SCHEMA public TO {WRITER_ROLE};
    GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {WRITER_ROLE};
    REVOKE UPDATE, DELETE ON audit_log, audit_chain_head, alembic_version FROM {WRITER_ROLE};
    REVOKE INSERT ON audit_chain_head, alembic_version FROM {WRITER_ROLE};
    GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {WRITER_ROLE};
    ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {WRITER_ROLE};
    ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO {WRITER_ROLE};
END
$$
"""

_REVOKE_WRITER = f"""
DO $$
DECLARE
    writer oid;
BEGIN
    SELECT oid INTO writer FROM pg_roles WHERE rolname = '{WRITER_ROLE}';
    IF writer IS NULL THEN
        RETURN;
    END IF;
    ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE ALL ON TABLES FROM {WRITER_ROLE};
    ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE ALL ON SEQUENCES FROM {WRITER_ROLE};
    REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {WRITER_ROLE};
    REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {WRITER_ROLE};
    REVOKE USAGE ON SCHEMA public FROM {WRITER_ROLE};
    IF NOT EXISTS (SELECT FROM pg_shdepend WHERE refclassid = 'pg_authid'::regclass AND refobjid = writer)
       AND NOT EXISTS (SELECT FROM pg_auth_members WHERE roleid = writer) THEN
        BEGIN
            DROP ROLE {WRITER_ROLE};
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE NOTICE 'role {WRITER_ROLE} kept: % may not drop roles', current_user;
        END;
    END IF;
END
$$
"""


def upgrade() -> None:
    op.execute("ALTER TABLE audit_log ADD COLUMN prev_hash bytea, ADD COLUMN row_hash bytea")
    op.execute(
        "CREATE TABLE audit_chain_head (id smallint NOT NULL, last_id bigint, last_hash bytea NOT NULL, "
        "CONSTRAINT pk_audit_chain_head PRIMARY KEY (id), CONSTRAINT ck_audit_chain_head_single_row CHECK (id = 1))"
    )
    op.execute("ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only")
    op.execute(_CHAIN_EXISTING)
    op.execute("ALTER TABLE audit_log ENABLE TRIGGER audit_log_append_only")
    op.execute("ALTER TABLE audit_log ALTER COLUMN prev_hash SET NOT NULL, ALTER COLUMN row_hash SET NOT NULL")
    op.execute(_CHAIN_FUNCTION)
    op.execute("REVOKE ALL ON FUNCTION audit_log_chain() FROM PUBLIC")
    op.execute(
        "CREATE TRIGGER audit_log_chain BEFORE INSERT ON audit_log FOR EACH ROW EXECUTE FUNCTION audit_log_chain()"
    )
    op.execute(_GRANT_WRITER)


def downgrade() -> None:
    op.execute(_REVOKE_WRITER)
    op.execute("DROP TRIGGER IF EXISTS audit_log_chain ON audit_log")
    op.execute("DROP FUNCTION IF EXISTS audit_log_chain()")
    op.execute("DROP TABLE IF EXISTS audit_chain_head")
    op.execute("ALTER TABLE audit_log DROP COLUMN IF EXISTS prev_hash, DROP COLUMN IF EXISTS row_hash")
