"""`ConfigError` and the rendering of one violation: what every rule and every loading step raises.

A cross-field rule reports a violation as (field, value, requirement); `_raise_rules` raises the first of a list as a
pydantic error that `planner_core.config.loading` turns into the one-line `ConfigError`, counting the rest.
"""

from __future__ import annotations

import enum
import json
from typing import Any

from pydantic_core import PydanticCustomError

Violation = tuple[str, Any, str]
"""One broken rule: the field to blame (dotted), its value, and what is required of it."""


class ConfigError(ValueError):
    """A configuration could not be read or is invalid.

    `str()` is always one line: ``<source>: <detail>``, e.g.
    ``planner.yaml: field 'ttft_ms' = -5: must be > 0``.

    Attributes:
        source: the file path or label the configuration came from.
        field: dotted name of the offending field, or None when the problem is not about one field
            (unreadable file, bad syntax, top level not a mapping).
    """

    def __init__(self, message: str, *, source: str = "", field: str | None = None) -> None:
        super().__init__(message)
        self.source = source
        self.field = field


_RULE_ERROR = "planner_config_rule"
_MAX_SHOWN_VALUE = 80


def _show(value: Any) -> str:
    """Render a value for an error message: strings quoted, other scalars as JSON, one line, bounded."""
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, str):
        text = repr(value)
    else:
        try:
            text = json.dumps(value, default=str, allow_nan=True)
        except (TypeError, ValueError):
            text = repr(value)
    text = text.replace("\n", " ")
    if len(text) > _MAX_SHOWN_VALUE:
        text = text[: _MAX_SHOWN_VALUE - 3] + "..."
    return text


def _rule(field: str, value: Any, requirement: str) -> Violation:
    """One cross-field violation: the field to blame, its value, and what is required of it."""
    return field, value, requirement


def _raise_rules(violations: list[Violation]) -> None:
    """Raise the first violation as a pydantic error that remembers the field, value and remaining count."""
    if not violations:
        return
    field, value, requirement = violations[0]
    raise PydanticCustomError(
        _RULE_ERROR,
        "field '{field}' = {shown}: {requirement}",
        {"field": field, "shown": _show(value), "requirement": requirement, "more": len(violations) - 1},
    )
