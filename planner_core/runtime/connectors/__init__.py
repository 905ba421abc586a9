"""Connectors: how decisions reach an orchestrator and how worker counts come back."""
