"""Prefect flows of the planner: thin orchestration over `planner_core.service`; no business logic here."""
