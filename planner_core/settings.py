"""Runtime settings read from the environment: where the database, Prefect and the traffic source are.

The planner's policy lives in `PlannerConfig` (a file, hashed on every tick); this is the other half: things that
differ per machine and never change a decision.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class RuntimeSettings(BaseSettings):
    """Environment-provided settings (prefix `PLANNER_`)."""

    model_config = SettingsConfigDict(env_prefix="PLANNER_", frozen=True, extra="ignore")

    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL of Postgres; unset = embedded server under data_dir/pg"
    )
    data_dir: Path = Field(default=Path(".planner"), description="embedded Postgres, Prefect home, reports")
    config: Path | None = Field(default=None, description="PlannerConfig file used by the served flows")
    deployment: str = Field(default="default", description="name of the managed deployment")
    trace: Path | None = Field(
        default=None, description="trace replayed in wall-clock time as the traffic source of served flows"
    )

    @property
    def embedded_pg_dir(self) -> Path:
        return self.data_dir.resolve() / "pg"
