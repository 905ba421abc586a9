"""Prefect flows of the planner: thin orchestration over `planner_core.runtime.service`; no business logic here."""

from planner_core.runtime.redact import install_log_redaction

# a flow run started by a Prefect worker imports this package without `planner`'s entry point: its log records
# (shipped to Prefect's database too) are masked the same way (planner_core/runtime/redact.py)
install_log_redaction()
