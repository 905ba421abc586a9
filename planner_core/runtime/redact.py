"""Secrets out of the record: the one redaction every URL and error text passes before it is logged, audited,
printed or handed to Prefect as a parameter.

A URL may carry a password (`postgresql://planner:pw@db/planner`, `http://user:pw@prometheus:9090`,
`http://prometheus:9090/?token=...`), and an error text may quote that URL (httpx and libpq both do). Once such a
text reaches `audit_log.detail` it stays for good (the table is append-only and the analyst role reads it), and a
Prefect flow-run parameter lives in Prefect's own database. So `redact_text` masks, with `***`:

- the password of every URL's user-info, whatever it holds: URL clients take an unencoded `@`, `/`, `?` or `#`
  in a password (httpx splits user-info from host at the *last* `@`), so the password runs from the first `:`
  after `scheme://` to the last `@` of the URL (the URL ends at white space);
- the same in scheme-less `user:password@host` shapes (a `host:port` written without `http://`);
- the value of every query parameter or `key=value` keyword named like a credential (`password=`, `token=`,
  `api_key=`, `secret=`, `sig=`, ...; libpq's quoted `password='a b'` too);
- every secret the process was configured with (`register_secrets_of`: the database and Prometheus URLs, the bearer
  token), verbatim and percent-encoded, wherever it appears: the only way to catch a password whose URL is
  malformed beyond parsing (white space in it, for one).

User names, hosts and paths stay: they are what an operator needs to see. When a URL's query holds an `@` the mask
may reach past the password to it (the host is then hidden too): on the safe side, as a mask should err.
`install_log_redaction` puts the same function in front of every log record of the process.
"""

from __future__ import annotations

import logging
import re
import threading
import traceback
from typing import Any
from urllib.parse import quote, unquote

MASK = "***"

# a secret shorter than this is masked only where a pattern finds it: masking every "ab" in every text would
# garble the logs, and a password that short is not the secret standing between an attacker and the service
MIN_REGISTERED_SECRET_CHARS = 6

_SCHEME = re.compile(r"(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*://")
_TOKEN = re.compile(r"\S+")
# what may stand before a URL inside a token (`url=http://...`, `(http://...)`): a scheme after anything else
# (`user:x://y@host`) is part of a password
_URL_LEADS = "=(\"'<[{,"
# user:secret@host written without a scheme; an optional lead up to a delimiter (`endpoint=`, a quote, a bracket)
_SCHEMELESS = re.compile(
    r"^(?P<lead>(?:.*?[=(\"'<\[{,])??)(?P<user>[A-Za-z0-9._~%+\-]*):(?P<secret>.+)@(?P<host>[A-Za-z0-9\[][^@]*)$"
)
# key=value where the key names a credential; the value quoted (libpq) or up to white space, "&", ";" or a quote
_CREDENTIAL_NAME = (
    r"[A-Za-z0-9_.\-]*?(?:password|passwd|pwd|passphrase|secret|token(?!s)|api[_\-]?key|access[_\-]?key|"
    r"private[_\-]?key|credentials?|auth|signature)[A-Za-z0-9_\-]*|sig|key"
)
_KEYWORD = re.compile(
    rf"(?i)(?P<head>(?<![A-Za-z0-9_.\-])(?:{_CREDENTIAL_NAME})\s*=\s*)"
    r"(?P<secret>'(?:[^'\\]|\\.)*'?|\"(?:[^\"\\]|\\.)*\"?|[^\s&;'\"]+)"
)
_CREDENTIAL_KEY = re.compile(rf"(?i)^(?:{_CREDENTIAL_NAME})$")

_registered: frozenset[str] = frozenset()
_register_lock = threading.Lock()


def _url_secret_span(token: str) -> tuple[int, int] | None:
    """The (start, end) of the user-info password in `token`, one white-space-free run (or a whole configured URL),
    or None: after `scheme://`, from the first `:` to the last `@`; else the scheme-less `user:secret@host`."""
    scheme = next((m for m in _SCHEME.finditer(token) if m.start() == 0 or token[m.start() - 1] in _URL_LEADS), None)
    if scheme is not None:
        at = token.rfind("@", scheme.end())
        if at < 0:
            return None
        colon = token.find(":", scheme.end(), at)
        return (colon + 1, at) if colon >= 0 else None  # user@host: a user name alone, no password
    schemeless = _SCHEMELESS.match(token)
    return schemeless.span("secret") if schemeless is not None else None


def _mask_token(match: re.Match[str]) -> str:
    token = match.group(0)
    span = _url_secret_span(token)
    return token if span is None else token[: span[0]] + MASK + token[span[1] :]


def _mask_patterns(text: str) -> str:
    text = _TOKEN.sub(_mask_token, text)
    return _KEYWORD.sub(lambda m: m["head"] + MASK, text)


def redact_text(text: str) -> str:
    """`text` with every password, credential parameter and registered secret replaced by `***` (see the module)."""
    # the registered secrets first: a pattern masking part of one would leave the rest unrecognisable
    registered = _registered
    while any(secret in text for secret in registered):  # a replacement can join a new occurrence; each shortens
        for secret in registered:
            text = text.replace(secret, MASK)
    return _mask_patterns(text)


def redact_value(value: Any) -> Any:
    """`redact_text` applied to every string inside a JSON-like value (dicts, lists, tuples), keys included; the
    value under a key named like a credential (`password`, `token`, ...) is masked whole."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {
            redact_value(key): MASK
            if isinstance(key, str) and _CREDENTIAL_KEY.match(key) and isinstance(item, str) and item
            else redact_value(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(redact_value(item) for item in value)
    return value


def secrets_of(url: str) -> tuple[str, ...]:
    """The secrets a configured URL carries (its user-info password, its credential parameters), as written.

    The URL is one value, not a text: its password runs to its last `@` even across white space."""
    found = []
    span = _url_secret_span(url.strip())
    if span is not None:
        found.append(url.strip()[span[0] : span[1]])
    found += [m["secret"].strip("'\"") for m in _KEYWORD.finditer(url)]
    return tuple(secret for secret in found if secret)


def register_secret(secret: str | None) -> None:
    """Mask `secret` (and its percent-encoded and -decoded forms) in every text `redact_text` sees from now on."""
    if not secret or len(secret) < MIN_REGISTERED_SECRET_CHARS:
        return
    global _registered
    forms = {secret, quote(secret, safe=""), quote(secret), unquote(secret)}
    with _register_lock:
        _registered = frozenset(
            sorted(_registered | {f for f in forms if len(f) >= MIN_REGISTERED_SECRET_CHARS}, key=len, reverse=True)
        )


def register_secrets_of(url: str | None) -> None:
    """`register_secret` for each secret in a configured URL (`secrets_of`)."""
    for secret in secrets_of(url or ""):
        register_secret(secret)


class _RedactingRecordFactory:
    """A log record factory that redacts the message, its arguments and its traceback as the record is made, so
    that every handler (the console, a file, Prefect's API log handler) gets the masked text."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record = self.inner(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a malformed format string: the handler reports it; keep the record as it came
            return record
        record.msg, record.args = redact_text(message), None
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            record.exc_text = redact_text("".join(traceback.format_exception(*record.exc_info)).rstrip("\n"))
        return record


def install_log_redaction() -> None:
    """Every log record of this process made redacted from now on (idempotent)."""
    factory = logging.getLogRecordFactory()
    if not isinstance(factory, _RedactingRecordFactory):
        logging.setLogRecordFactory(_RedactingRecordFactory(factory))
