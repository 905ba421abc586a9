"""Live retune: config revisions per deployment, written by an operator role, run and recorded by each tick.

Why: changing an SLA target, a budget or a floor meant editing the file and restarting the planner, with no record
of who changed it or why, and nothing stopped two operators from overwriting each other's change. Now every config
a deployment runs is a numbered revision; `planner config set` (or an INSERT in SQL) writes the next one, naming
the revision it was made from, and the database refuses a stale revision and a retune by a role that may not.
Creates:
- role `planner_operator` (NOLOGIN) if it does not exist and this user may create roles (otherwise a NOTICE says
  so and the grants are skipped, as for `planner_analyst`): USAGE on the schema; SELECT on `deployments`,
  `planner_configs`, `config_revisions`, `fleet_members` and `alembic_version`; INSERT on `planner_configs` and
  `config_revisions`. Nothing else: it cannot write ticks, decisions or the deployments table.
- table `config_revisions` (deployment_id, revision) -> config_hash (the policy's body in `planner_configs`),
  source (`file`: the config file the planner runs; `set`: a live retune), changes (field -> [before, after] against
  the previous revision), source_path (the file whose folder relative paths are taken from), author (the database
  login that wrote it, `session_user`, set by the trigger whatever the INSERT says), reason, created_at.
  Append-only: UPDATE, DELETE and TRUNCATE are refused by triggers (and not granted).
- function `config_revisions_guard()` (SECURITY DEFINER) and trigger BEFORE INSERT: locks the deployment's row,
  refuses a `set` revision by a login that is not a member of `planner_operator` (SQLSTATE 42501), refuses a
  revision that is not the current one plus one (SQLSTATE PR001: a stale expected revision), sets author and
  created_at, moves `deployments.config_revision` / `config_hash` to the new revision and appends a
  `config_revision` row to the audit log (who, why, what changed).
- column `deployments.config_revision` (the newest revision; NULL before any) and `ticks.config_revision` (the
  revision the tick ran; NULL on ticks recorded before this revision), with a foreign key (deployment_id,
  config_revision, config_hash) -> config_revisions, so a tick's config hash is its revision's.
- revision 1 (source `file`) of every deployment already recorded: the config it runs now.
Locks: ACCESS EXCLUSIVE on `deployments` and `ticks` (and its partitions) for the ADD COLUMNs (nullable, no
default: no rewrite) and the foreign key's validation (every existing tick has NULL: a scan, no lookups).
Downgrade: drops the foreign key, the two columns, the table, the function and the operator role's privileges
(the role itself only when nothing depends on it and it has no members). The `config_revision` audit rows stay.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-07 09:20:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OPERATOR_ROLE = "planner_operator"
WRITER_ROLE = "planner_writer"

_TABLE = """
CREATE TABLE config_revisions (
    deployment_id integer NOT NULL,
    revision integer NOT NULL,
    config_hash varchar(64) NOT NULL,
    source varchar(10) NOT NULL,
    changes jsonb NOT NULL DEFAULT '{}'::jsonb,
    source_path text,
    author text NOT NULL DEFAULT session_user,
    reason text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT pk_config_revisions PRIMARY KEY (deployment_id, revision),
    CONSTRAINT uq_config_revisions_deployment_id_revision_config_hash UNIQUE (deployment_id, revision, config_hash),
    CONSTRAINT fk_config_revisions_deployment_id_deployments FOREIGN KEY (deployment_id) REFERENCES deployments (id),
    CONSTRAINT fk_config_revisions_config_hash_planner_configs FOREIGN KEY (config_hash)
        REFERENCES planner_configs (config_hash),
    CONSTRAINT ck_config_revisions_source CHECK (source IN ('file', 'set')),
    CONSTRAINT ck_config_revisions_revision CHECK (revision >= 1)
)
"""

_COMMENTS = [
    "COMMENT ON TABLE config_revisions IS 'Every config a deployment has run, numbered: from its file (source file) "
    "or a live retune (source set, planner_operator only); append-only (migration 0024)'",
    "COMMENT ON COLUMN config_revisions.changes IS 'field -> [before, after] against the previous revision'",
    "COMMENT ON COLUMN config_revisions.author IS 'The database login that wrote the revision (session_user, set "
    "by the trigger)'",
    "COMMENT ON COLUMN config_revisions.source_path IS 'The config file whose folder relative paths (profile, perf "
    "table, warm-up trace) are taken from'",
    "COMMENT ON COLUMN deployments.config_revision IS 'The newest config revision (config_revisions); NULL before "
    "any (migration 0024)'",
    "COMMENT ON COLUMN ticks.config_revision IS 'The config revision the tick ran (config_revisions); NULL on ticks "
    "recorded before migration 0024'",
]

_GUARD = f"""
CREATE FUNCTION config_revisions_guard() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public AS $$
DECLARE
    who text := session_user;
    current integer;
    deployment text;
BEGIN
    -- the deployment's row lock: revisions of one deployment are numbered one after the other, never mid-tick
    SELECT d.config_revision, d.name INTO current, deployment FROM public.deployments d
     WHERE d.id = NEW.deployment_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'config revision of deployment id %: no such deployment', NEW.deployment_id
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    IF NEW.source = 'set' AND NOT pg_has_role(who, '{OPERATOR_ROLE}', 'MEMBER') THEN
        RAISE EXCEPTION 'role % may not retune deployment %: not a member of {OPERATOR_ROLE}', who,
            quote_literal(deployment) USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NEW.revision IS DISTINCT FROM COALESCE(current, 0) + 1 THEN
        RAISE EXCEPTION 'deployment %: stale config revision: expected revision %, the current revision is %',
            quote_literal(deployment), NEW.revision - 1, COALESCE(current, 0) USING ERRCODE = 'PR001';
    END IF;
    NEW.author := who;
    NEW.created_at := now();
    UPDATE public.deployments SET config_revision = NEW.revision, config_hash = NEW.config_hash
     WHERE id = NEW.deployment_id;
    INSERT INTO public.audit_log (event, detail, deployment_id)
    VALUES ('config_revision', jsonb_build_object('revision', NEW.revision, 'source', NEW.source,
                                                  'config_hash', NEW.config_hash, 'changes', NEW.changes,
                                                  'author', who, 'reason', NEW.reason), NEW.deployment_id);
    RETURN NEW;
END
$$
"""

_REFUSE = """
CREATE FUNCTION config_revisions_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'config_revisions is append-only: % refused', TG_OP USING ERRCODE = 'insufficient_privilege';
END
$$
"""

_GRANT_OPERATOR = f"""
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{OPERATOR_ROLE}') THEN
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = current_user AND (rolcreaterole OR rolsuper)) THEN
            RAISE NOTICE 'role {OPERATOR_ROLE} not created: % may not create roles (see docs, live retune)',
                current_user;
            RETURN;
        END IF;
        CREATE ROLE {OPERATOR_ROLE} NOLOGIN;
    END IF;
    COMMENT ON ROLE {OPERATOR_ROLE} IS
        'May retune a deployment live (config_revisions, source set); nothing else (see docs/operations.md)';
    GRANT USAGE ON SCHEMA public TO {OPERATOR_ROLE};
    GRANT SELECT ON deployments, planner_configs, config_revisions, fleet_members, alembic_version
        TO {OPERATOR_ROLE};
    GRANT INSERT ON planner_configs, config_revisions TO {OPERATOR_ROLE};
END
$$
"""

# The writer (0009's default privileges gave it every row privilege on the new table) records the file's revisions
# and reads them; it never changes one.
_WRITER = f"""
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{WRITER_ROLE}') THEN
        REVOKE UPDATE, DELETE, TRUNCATE ON config_revisions FROM {WRITER_ROLE};
    END IF;
END
$$
"""

# Revision 1 of every deployment recorded before this migration: the config it runs (through the trigger, so each
# is audited; this user owns the schema, so it may write either source).
_BACKFILL = """
INSERT INTO config_revisions (deployment_id, revision, config_hash, source, reason)
SELECT id, 1, config_hash, 'file', 'migration 0024: the config in force' FROM deployments ORDER BY id
"""

_REVOKE_OPERATOR = f"""
DO $$
DECLARE
    operator oid;
BEGIN
    SELECT oid INTO operator FROM pg_roles WHERE rolname = '{OPERATOR_ROLE}';
    IF operator IS NULL THEN
        RETURN;
    END IF;
    REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {OPERATOR_ROLE};
    REVOKE USAGE ON SCHEMA public FROM {OPERATOR_ROLE};
    IF NOT EXISTS (SELECT FROM pg_shdepend WHERE refclassid = 'pg_authid'::regclass AND refobjid = operator)
       AND NOT EXISTS (SELECT FROM pg_auth_members WHERE roleid = operator) THEN
        BEGIN
            DROP ROLE {OPERATOR_ROLE};
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE NOTICE 'role {OPERATOR_ROLE} kept: % may not drop roles', current_user;
        END;
    END IF;
END
$$
"""


def upgrade() -> None:
    op.execute("ALTER TABLE deployments ADD COLUMN config_revision integer")
    op.execute(_TABLE)
    op.execute(_REFUSE)
    op.execute(
        "CREATE TRIGGER config_revisions_append_only BEFORE UPDATE OR DELETE ON config_revisions "
        "FOR EACH ROW EXECUTE FUNCTION config_revisions_refuse_change()"
    )
    op.execute(
        "CREATE TRIGGER config_revisions_no_truncate BEFORE TRUNCATE ON config_revisions "
        "FOR EACH STATEMENT EXECUTE FUNCTION config_revisions_refuse_change()"
    )
    op.execute(_GUARD)
    op.execute("REVOKE ALL ON FUNCTION config_revisions_guard() FROM PUBLIC")
    op.execute(
        "CREATE TRIGGER config_revisions_guard BEFORE INSERT ON config_revisions "
        "FOR EACH ROW EXECUTE FUNCTION config_revisions_guard()"
    )
    op.execute("ALTER TABLE ticks ADD COLUMN config_revision integer")
    op.execute(
        "ALTER TABLE ticks ADD CONSTRAINT fk_ticks_deployment_id_config_revisions "
        "FOREIGN KEY (deployment_id, config_revision, config_hash) "
        "REFERENCES config_revisions (deployment_id, revision, config_hash)"
    )
    for statement in _COMMENTS:
        op.execute(statement)
    op.execute(_WRITER)
    op.execute(_GRANT_OPERATOR)
    op.execute(_BACKFILL)


def downgrade() -> None:
    op.execute(_REVOKE_OPERATOR)
    op.execute("ALTER TABLE ticks DROP CONSTRAINT IF EXISTS fk_ticks_deployment_id_config_revisions")
    op.execute("ALTER TABLE ticks DROP COLUMN IF EXISTS config_revision")
    op.execute("DROP TABLE IF EXISTS config_revisions")
    op.execute("DROP FUNCTION IF EXISTS config_revisions_guard()")
    op.execute("DROP FUNCTION IF EXISTS config_revisions_refuse_change()")
    op.execute("ALTER TABLE deployments DROP COLUMN IF EXISTS config_revision")
