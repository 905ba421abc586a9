"""Fixtures of the runtime's tests."""

from __future__ import annotations

import pytest

from planner_core.runtime import redact


@pytest.fixture(autouse=True)
def _no_secrets_of_other_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no registered secret. A process registers the secrets it is configured with for its
    whole life (`redact.register_secret`), but a test session configures many: a password another test registered
    (a word of six letters or more) would be masked in this test's texts and audit details, keys included."""
    monkeypatch.setattr(redact, "_registered", frozenset())
