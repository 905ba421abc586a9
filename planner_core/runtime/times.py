"""Times given by an operator: `--since`, `--until`, `--from`, `--to` and the report and replay flows' bounds.

One parser for all of them, so every command takes the same forms: an ISO 8601 time (naive means UTC) or a span
back from now such as `90m`, `12h`, `7d`.
"""

from __future__ import annotations

import datetime as dt
import re

# The forms `parse_time` takes, for option help.
TIME_HELP = "ISO 8601 time (naive = UTC) or a span back from now (90m, 12h, 7d)"

_SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$")
_SPAN_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_time(value: str, *, now: dt.datetime, name: str = "--since") -> dt.datetime:
    """An aware UTC datetime from an ISO 8601 timestamp (naive = UTC) or a span back from `now` (`7d`, `12h`).

    Raises:
        ValueError: one line naming the option and the value.
    """
    span = _SPAN.match(value)
    if span is not None:
        return now - dt.timedelta(seconds=float(span.group(1)) * _SPAN_SECONDS[span.group(2)])
    try:
        parsed = dt.datetime.fromisoformat(value.strip())
    except ValueError:
        raise ValueError(
            f"{name} = {value!r}: expected an ISO 8601 time (2024-05-01T12:00Z) or a span back from now (90m, 12h, 7d)"
        ) from None
    return parsed.replace(tzinfo=dt.UTC) if parsed.tzinfo is None else parsed.astimezone(dt.UTC)
