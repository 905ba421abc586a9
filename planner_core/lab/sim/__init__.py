"""Simulated serving cluster: plays the orchestrator behind the virtual connector and produces observations."""
