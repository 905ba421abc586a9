"""Secrets out of the record: the one redaction every URL and error text passes before it is logged, audited or
handed to Prefect as a parameter.

A URL may carry a password (`postgresql://planner:pw@db/planner`, `http://user:pw@prometheus:9090`), and an
error text may quote that URL (httpx and libpq both do). Once such a text reaches `audit_log.detail` it stays for
good (the table is append-only and the analyst role reads it), and a Prefect flow-run parameter lives in
Prefect's own database. So the password is replaced by `***` wherever a URL's user-info or a libpq
`password=` keyword appears; the user name, host and path stay, since they are what an operator needs to see.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"

# scheme://user:password@  (the password may hold anything but "@", "/" and white space; a URL-encoded "@" is %40)
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*:)(?P<secret>[^\s@/]+)(?P<tail>@)")
# libpq keyword form and query parameters: password=..., passwd=..., pwd=... (up to white space, "&" or a quote)
_KEYWORD_PASSWORD = re.compile(r"(?i)(?P<head>\b(?:password|passwd|pwd)=)(?P<secret>[^\s&'\"]+)")


def redact_text(text: str) -> str:
    """`text` with every URL password and `password=` value replaced by `***` (anything else unchanged)."""
    text = _URL_PASSWORD.sub(lambda m: m["head"] + MASK + m["tail"], text)
    return _KEYWORD_PASSWORD.sub(lambda m: m["head"] + MASK, text)


def redact_value(value: Any) -> Any:
    """`redact_text` applied to every string inside a JSON-like value (dicts, lists, tuples), keys included."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {redact_value(key): redact_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redact_value(item) for item in value)
    return value
