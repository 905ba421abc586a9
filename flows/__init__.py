"""Prefect flows of the planner: thin orchestration over `planner_core.runtime.service`; no business logic here."""
