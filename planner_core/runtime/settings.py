"""Runtime settings read from the environment: where the database, Prefect and the traffic source are.

The planner's policy lives in `PlannerConfig` (a file, hashed on every tick); this is the other half: things that
differ per machine and never change a decision.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from planner_core.runtime.redact import register_secret, register_secrets_of

# The deployment `planner serve` and `planner ingest` record into when neither --deployment nor PLANNER_DEPLOYMENT
# names one.
DEFAULT_DEPLOYMENT = "default"


class RuntimeSettings(BaseSettings):
    """Environment-provided settings (prefix `PLANNER_`)."""

    model_config = SettingsConfigDict(env_prefix="PLANNER_", frozen=True, extra="ignore", allow_inf_nan=False)

    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL of Postgres; unset = embedded server under data_dir/pg"
    )
    migration_database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the schema owner, for migrations; unset = database_url (then the planner "
        "owns its tables: see docs/database-and-sql.md, writer role)",
    )
    data_dir: Path = Field(default=Path(".planner"), description="embedded Postgres, Prefect home, reports")
    config: Path | None = Field(default=None, description="PlannerConfig file used by the served flows")
    deployment: str | None = Field(
        default=None,
        description="name of the managed deployment; unset: the only one recorded (reading commands) or "
        f"{DEFAULT_DEPLOYMENT!r} (serve, ingest)",
    )
    trace: Path | None = Field(
        default=None, description="trace replayed in wall-clock time as the traffic source of served flows"
    )
    trace_rate_scale: float = Field(
        default=1.0,
        gt=0,
        le=1000,
        description="multiply the PLANNER_TRACE replay's request rate (its shape kept), e.g. 12",
    )

    # Prometheus traffic source. Each also answers to Dynamo's variable name, so a Dynamo deployment's environment
    # carries over; the PLANNER_ name wins when both are set. The endpoint in the config file
    # (`metric_pulling_prometheus_endpoint`) wins over both.
    prometheus_endpoint: str | None = Field(
        default=None,
        validation_alias=AliasChoices("PLANNER_PROMETHEUS_ENDPOINT", "PROMETHEUS_ENDPOINT", "prometheus_endpoint"),
        description="Prometheus base URL (e.g. http://prometheus:9090) when the config names none",
    )
    prometheus_token: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("PLANNER_PROMETHEUS_TOKEN", "PROMETHEUS_TOKEN", "prometheus_token"),
        description="bearer token sent to Prometheus",
    )
    prometheus_token_file: Path | None = Field(
        default=None,
        validation_alias=AliasChoices(
            "PLANNER_PROMETHEUS_TOKEN_FILE", "PROMETHEUS_TOKEN_FILE", "prometheus_token_file"
        ),
        description="file holding the bearer token, re-read on every collection (rotated service-account tokens)",
    )
    prometheus_ca_bundle: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("PLANNER_PROMETHEUS_CA_BUNDLE", "PROMETHEUS_CA_BUNDLE", "prometheus_ca_bundle"),
        description="PEM file of the CA(s) that signed Prometheus' TLS certificate",
    )
    # Dynamo defaults to not verifying; we verify unless told not to.
    prometheus_ssl_verify: bool = Field(
        default=True,
        validation_alias=AliasChoices(
            "PLANNER_PROMETHEUS_SSL_VERIFY", "PROMETHEUS_SSL_VERIFY", "prometheus_ssl_verify"
        ),
        description="verify Prometheus' TLS certificate",
    )
    prometheus_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        validation_alias=AliasChoices(
            "PLANNER_PROMETHEUS_TIMEOUT_S",
            "DYN_PLANNER_PROMETHEUS_REQUEST_TIMEOUT_SECONDS",
            "prometheus_timeout_s",
        ),
        description="timeout of each Prometheus HTTP request (s)",
    )
    prometheus_window_deadline_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="deadline of all the Prometheus queries of one window together (s); past it the tick records "
        "what it has: no traffic data (window_deadline) without the request count and lengths, else the observation "
        "without its optional figures (audited as traffic_partial)",
    )
    # `planner demo` / `planner serve` end (status 3, one line) when the Prefect server is lost this long.
    prefect_lost_s: float = Field(
        default=30.0, gt=0, le=3600, description="seconds without an answer from the Prefect server before giving up"
    )
    # The embedded Postgres (no PLANNER_DATABASE_URL): how long starting it, or waiting for another process that is
    # starting one, may take before the command fails in one line.
    embedded_start_timeout_s: float = Field(
        default=60.0, gt=0, le=3600, description="seconds to start (or wait to start) the embedded Postgres"
    )
    # The planner's own /metrics (`planner serve` with metric_reporting_prometheus_port set).
    metrics_bind: str = Field(
        default="127.0.0.1",
        description="address /metrics listens on; 0.0.0.0 exposes the unauthenticated metrics on every interface",
    )
    metrics_cache_s: float = Field(
        default=5.0, ge=0, le=3600, description="seconds a /metrics snapshot is reused before Postgres is read again"
    )
    # Forward-pass metrics ingest (`planner ingest`).
    fpm_bind: str = Field(
        default="tcp://127.0.0.1:20380", description="ZMQ endpoint the ingest binds its SUB socket to"
    )
    fpm_retention_minutes: float = Field(
        default=30.0, gt=0, le=366 * 24 * 60, description="raw forward-pass samples kept this long"
    )
    fpm_curve_secret_key_file: Path | None = Field(
        default=None,
        description="the ingest's ZeroMQ CURVE certificate (secret key file); set: only publishers whose public "
        "certificate is in PLANNER_FPM_CURVE_CLIENTS_DIR are heard, encrypted",
    )
    fpm_curve_clients_dir: Path | None = Field(
        default=None, description="folder of the public CURVE certificates of the publishers the ingest accepts"
    )

    def model_post_init(self, _context: object, /) -> None:
        # the process's configured secrets are masked verbatim in every text it logs, audits or prints, whatever
        # shape the text quotes them in (planner_core/runtime/redact.py)
        for url in (self.database_url, self.migration_database_url, self.prometheus_endpoint):
            register_secrets_of(url)
        if self.prometheus_token is not None:
            register_secret(self.prometheus_token.get_secret_value())

    @property
    def embedded_pg_dir(self) -> Path:
        return self.data_dir.resolve() / "pg"
