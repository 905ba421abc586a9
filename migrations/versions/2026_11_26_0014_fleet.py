"""The fleet: managed deployments registered for one control plane, one GPU budget, and each arbitration round.

Why: one `planner fleet serve` ticks every registered deployment and arbitrates one GPU budget across them
(`planner_core.policy.arbitration`). The registry says which config each deployment runs with and its share of the
budget; every round is recorded with its inputs (so it replays exactly) and a grant with a reason per deployment.
Creates: tables `fleet_members`, `fleet_budget` (one row), `arbitration_rounds`, `arbitration_grants`.
Locks: new tables only.
Downgrade: drops the four tables (the registry and the recorded rounds are lost; ticks and decisions stay).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26 19:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "fleet_members",
        sa.Column("deployment_id", sa.Integer(), nullable=False),
        sa.Column("config_path", sa.Text(), nullable=False, comment="The PlannerConfig file the deployment runs"),
        sa.Column("min_gpus", sa.Integer(), nullable=False, comment="GPUs it always keeps, whatever the budget"),
        sa.Column("max_gpus", sa.Integer(), nullable=True, comment="GPUs it may never exceed; NULL: no maximum"),
        sa.Column("priority", sa.Integer(), nullable=False, comment="Higher is served first when over budget"),
        sa.Column("weight", sa.Double(), nullable=False, comment="Share within its priority tier (> 0)"),
        sa.Column("added_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("min_gpus >= 0", name=op.f("ck_fleet_members_min_gpus_non_negative")),
        sa.CheckConstraint("max_gpus IS NULL OR max_gpus >= min_gpus", name=op.f("ck_fleet_members_max_over_min")),
        sa.CheckConstraint("weight > 0", name=op.f("ck_fleet_members_weight_positive")),
        sa.ForeignKeyConstraint(
            ["deployment_id"], ["deployments.id"], name=op.f("fk_fleet_members_deployment_id_deployments")
        ),
        sa.PrimaryKeyConstraint("deployment_id", name=op.f("pk_fleet_members")),
        comment="Managed deployments ticked by the fleet control plane, with their share of the GPU budget",
    )
    op.create_table(
        "fleet_budget",
        sa.Column("id", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("budget_gpus", sa.Integer(), nullable=False, comment="GPUs the whole fleet may use"),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_fleet_budget_single_row")),
        sa.CheckConstraint("budget_gpus >= 0", name=op.f("ck_fleet_budget_non_negative")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fleet_budget")),
        comment="The fleet's GPU budget (one row); no row: no fleet budget, nothing is arbitrated",
    )
    op.create_table(
        "arbitration_rounds",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("scheduled_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("budget_gpus", sa.Integer(), nullable=False),
        sa.Column(
            "inputs",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=False,
            comment="The ArbitrationRound (budget and claims) that arbitrate() ran on: replay reads it",
        ),
        sa.Column("recorded_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_arbitration_rounds")),
        sa.UniqueConstraint("scheduled_at", name=op.f("uq_arbitration_rounds_scheduled_at")),
        comment="One GPU budget arbitration across the fleet per fleet tick",
    )
    op.create_table(
        "arbitration_grants",
        sa.Column("round_id", sa.BigInteger(), nullable=False),
        sa.Column("deployment_id", sa.Integer(), nullable=False),
        sa.Column("decision_id", sa.BigInteger(), nullable=True, comment="The pending decision it applied to"),
        sa.Column("proposed_gpus", sa.Integer(), nullable=False),
        sa.Column("request_gpus", sa.Integer(), nullable=False),
        sa.Column("granted_gpus", sa.Integer(), nullable=False),
        sa.Column("reason", sa.String(length=60), nullable=False),
        sa.Column("proposed_prefill", sa.Integer(), nullable=True, comment="The decision's targets before the grant"),
        sa.Column("proposed_decode", sa.Integer(), nullable=True),
        sa.Column("granted_prefill", sa.Integer(), nullable=True, comment="The decision's targets under the grant"),
        sa.Column("granted_decode", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["round_id"], ["arbitration_rounds.id"], name=op.f("fk_arbitration_grants_round_id_arbitration_rounds")
        ),
        sa.ForeignKeyConstraint(
            ["deployment_id"], ["deployments.id"], name=op.f("fk_arbitration_grants_deployment_id_deployments")
        ),
        sa.ForeignKeyConstraint(
            ["decision_id"], ["decisions.id"], name=op.f("fk_arbitration_grants_decision_id_decisions")
        ),
        sa.PrimaryKeyConstraint("round_id", "deployment_id", name=op.f("pk_arbitration_grants")),
        comment="Each deployment's GPU grant in an arbitration round, with its reason code",
    )


def downgrade() -> None:
    op.drop_table("arbitration_grants")
    op.drop_table("arbitration_rounds")
    op.drop_table("fleet_budget")
    op.drop_table("fleet_members")
