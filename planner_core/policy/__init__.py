"""Scaling policies: pure functions from forecasts/observations to replica proposals, each step with a reason."""
