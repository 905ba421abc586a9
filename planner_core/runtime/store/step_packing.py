"""How a tick's explanation is stored: its steps as shared templates plus each tick's numbers (migration 0018).

A load tick's explanation is ~30 steps whose sentences repeat from tick to tick with other numbers ("p0: TTFT
399.50 ms (13961 queued tokens ...)"). Each step is split into a template, its step name, component, reason and
detail with every number replaced by a placeholder (`PLACEHOLDER`), and the numbers; templates are stored once
in `step_templates` (a few dozen per deployment), and a tick stores one line in `tick_step_lists.packed`:
per step `template_id,value,number,number,...`, steps separated by `;`. The view `tick_steps` puts every step
back together in SQL, character for character (`step_detail`, migration 0018).

The split is lossless by construction: the numbers are the detail's own substrings (never reformatted), and a
literal placeholder character in a detail is taken out like a number, so joining the template's parts with the
numbers gives the detail back. Only the delimiters `,` and `;` must not occur in a number or a value, which the
token pattern and `value_text` guarantee.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, event, text
from sqlalchemy.orm import Session

from planner_core.domain import StepRecord
from planner_core.runtime.store.db import PlannerSession

PLACEHOLDER = "\x1f"  # ASCII unit separator: where a number stood in a template
# The same pattern as migration 0018's (Postgres ARE and Python agree on it: no alternation order subtleties
# beyond the placeholder, which cannot start a number).
NUMBER_TOKEN = re.compile(r"-?[0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?|\x1f")
STEP_SEPARATOR = ";"
FIELD_SEPARATOR = ","

_PG_FLOAT_WORDS = {"inf": "Infinity", "-inf": "-Infinity", "nan": "NaN"}


@dataclass(frozen=True, slots=True)
class StepTemplate:
    """What a step's row shares with the same step of other ticks: everything but its value and numbers."""

    step: str
    component: str | None
    reason: str
    template: str

    @property
    def template_md5(self) -> str:
        """md5 of the template as Postgres' `md5(template)` computes it (hex of its UTF-8 bytes): the index key."""
        return hashlib.md5(self.template.encode("utf-8"), usedforsecurity=False).hexdigest()


@dataclass(frozen=True, slots=True)
class SplitStep:
    template: StepTemplate
    value: str  # '' for no value
    numbers: tuple[str, ...]


def value_text(value: float | None) -> str:
    """The step's value as `float8` reads it back exactly: Python's shortest round-trip repr, Postgres' words for
    the non-finite values, '' for none."""
    if value is None:
        return ""
    number = float(value)
    if not math.isfinite(number):
        return _PG_FLOAT_WORDS[str(number)]
    return repr(value) if isinstance(value, int) else repr(number)


# The same pattern as one group: `re.split` gives the text between numbers and the numbers in one pass.
_SPLIT_AT_NUMBERS = re.compile(f"({NUMBER_TOKEN.pattern})")


def split_step(step: StepRecord) -> SplitStep:
    """A step as its template and the numbers its detail holds, in order."""
    pieces = _SPLIT_AT_NUMBERS.split(step.detail)  # text, number, text, ..., text
    template = StepTemplate(
        step=getattr(step.step, "value", step.step),
        component=step.component.value if step.component else None,
        reason=step.reason.value,
        template=PLACEHOLDER.join(pieces[0::2]),
    )
    return SplitStep(template=template, value=value_text(step.value), numbers=tuple(pieces[1::2]))


def join_detail(template: str, numbers: Sequence[str]) -> str:
    """The detail back from its template and numbers (what the SQL function `step_detail` does)."""
    parts = template.split(PLACEHOLDER)
    if len(parts) != len(numbers) + 1:
        raise ValueError(f"template has {len(parts) - 1} placeholders, {len(numbers)} numbers given")
    return "".join(part + number for part, number in zip(parts, (*numbers, ""), strict=True))


@dataclass(frozen=True, slots=True)
class StoredTemplate:
    """A `step_templates` row as `unpack_steps` uses it: the template already cut at its placeholders."""

    step: str
    component: str | None
    reason: str
    parts: tuple[str, ...]


def stored_templates(connection: Connection) -> dict[int, StoredTemplate]:
    """Every `step_templates` row by id (a few dozen per deployment), read in the caller's transaction."""
    rows = connection.execute(text("SELECT id, step, component, reason, template FROM step_templates"))
    return {
        row.id: StoredTemplate(
            step=row.step,
            component=row.component,
            reason=row.reason,
            # string_to_array('', E'\x1f') is an empty array: an empty template gives an empty detail
            parts=tuple(row.template.split(PLACEHOLDER)) if row.template else (),
        )
        for row in rows
    }


def unpack_steps(packed: str | None, templates: dict[int, StoredTemplate]) -> list[dict]:
    """A tick's steps as the view `tick_steps` gives them, `{"step", "component", "value", "reason", "detail"}` in
    order, from its `tick_step_lists.packed` (None: no row, no steps): what the view computes in SQL, done here
    without a round of SQL functions per step (a week of load ticks spent ~50 s of the server's CPU on them).
    Like the view: a step whose template id has no row is left out (its inner join), part n of the template is
    followed by number n or nothing, numbers beyond the placeholders are ignored; the value is `float8` of its text
    (Postgres' words for the non-finite ones read as Python's floats)."""
    return StepUnpacker(templates)(packed)


class StepUnpacker:
    """`unpack_steps` for many ticks in a row: a step whose entry (template id, value and numbers) was met before
    is the dict built then (a load tick repeats most of the previous ticks' steps, numbers and all: 94 % of the
    entries of a recorded week). The dicts are shared between ticks: read them, never change them."""

    MAX_ENTRIES = 100_000  # entries remembered; forgotten all at once past it

    def __init__(self, templates: dict[int, StoredTemplate]) -> None:
        self._templates = templates
        self._steps: dict[str, dict | None] = {}

    def __call__(self, packed: str | None) -> list[dict]:
        if packed is None:
            return []
        known = self._steps
        if len(known) > self.MAX_ENTRIES:
            known.clear()
        steps = []
        for entry in packed.split(STEP_SEPARATOR):
            if entry in known:
                step = known[entry]
            else:
                step = known[entry] = self._unpack(entry)
            if step is not None:
                steps.append(step)
        return steps

    def _unpack(self, entry: str) -> dict | None:
        fields = entry.split(FIELD_SEPARATOR)
        template = self._templates.get(int(fields[0]))
        if template is None:
            return None
        numbers, parts = fields[2:], template.parts
        if len(numbers) == len(parts) - 1:  # as `record_steps` writes them: a number for every placeholder
            pieces = [""] * (2 * len(parts) - 1)
            pieces[0::2], pieces[1::2] = parts, numbers
            detail = "".join(pieces)
        else:
            detail = "".join(
                part + numbers[index] if index < len(numbers) else part for index, part in enumerate(parts)
            )
        value = fields[1]
        return {
            "step": template.step,
            "component": template.component,
            "value": float(value) if value else None,
            "reason": template.reason,
            "detail": detail,
        }


_FIND_TEMPLATES = text(
    "SELECT id, step, component, reason, template FROM step_templates WHERE md5(template) = ANY(:md5s)"
)
_INSERT_TEMPLATE = text(
    "INSERT INTO step_templates (step, component, reason, template) "
    "VALUES (:step, :component, :reason, :template) ON CONFLICT DO NOTHING"
)
_TABLE_OID = text("SELECT 'step_templates'::regclass::oid")
# The steps' row, written only while `step_templates` is the table the cached ids were read from.
_INSERT_PACKED = text(
    "INSERT INTO tick_step_lists (tick_id, scheduled_at, packed) SELECT :tick_id, :scheduled_at, :packed "
    "WHERE 'step_templates'::regclass::oid = :table_oid"
)

# Known template ids are kept per database connection (`Connection.info` lives as long as the connection, which
# never changes database), keyed by the table's oid; ids learned in a transaction are added only once it commits,
# so a rolled-back insert never leaves an id behind.
_CACHE = "planner_step_templates"
_LEARNED = "planner_step_templates_learned"


@dataclass(slots=True)
class _KnownTemplates:
    table_oid: int
    ids: dict[StepTemplate, int]


def template_ids(session: Session, templates: set[StepTemplate]) -> tuple[dict[StepTemplate, int], int]:
    """The id of every template, inserting the new ones (in the caller's transaction), and the oid of the table
    they were read from. A template another transaction is inserting at the same time is waited for by the insert
    and read by the second look (a new statement sees what committed meanwhile)."""
    connection_info = session.connection().info
    known: _KnownTemplates | None = connection_info.get(_CACHE)
    if known is not None and all(template in known.ids for template in templates):
        return {template: known.ids[template] for template in templates}, known.table_oid
    table_oid = int(session.execute(_TABLE_OID).scalar_one())
    ids: dict[StepTemplate, int] = {}

    def look() -> None:
        md5s = sorted({template.template_md5 for template in templates if template not in ids})
        for row in session.execute(_FIND_TEMPLATES, {"md5s": md5s}):
            key = StepTemplate(step=row.step, component=row.component, reason=row.reason, template=row.template)
            if key in templates:
                ids[key] = row.id

    look()
    missing = [template for template in templates if template not in ids]
    if missing:
        # sorted, so two transactions inserting the same new templates take their index locks in one order
        for template in sorted(missing, key=lambda t: (t.step, t.component or "", t.reason, t.template)):
            session.execute(
                _INSERT_TEMPLATE,
                {
                    "step": template.step,
                    "component": template.component,
                    "reason": template.reason,
                    "template": template.template,
                },
            )
        look()
    unresolved = [template for template in templates if template not in ids]
    if unresolved:
        first = unresolved[0]
        raise RuntimeError(f"step_templates: no row for step {first.step!r} reason {first.reason!r} after inserting it")
    _learn_on_commit(session, connection_info, table_oid, ids)
    return ids, table_oid


def _learn_on_commit(session: Session, connection_info: dict, table_oid: int, ids: dict[StepTemplate, int]) -> None:
    session.info.setdefault(_LEARNED, []).append((connection_info, table_oid, ids))


# The project's sessions only (`PlannerSession`): a listener on `Session` would run for every session in the process.
@event.listens_for(PlannerSession, "after_commit")
def _publish(session: Session) -> None:
    for connection_info, table_oid, ids in session.info.pop(_LEARNED, ()):
        known = connection_info.get(_CACHE)
        if known is None or known.table_oid != table_oid:
            known = connection_info[_CACHE] = _KnownTemplates(table_oid=table_oid, ids={})
        known.ids.update(ids)


@event.listens_for(PlannerSession, "after_soft_rollback")
def _forget(session: Session, _previous_transaction: object) -> None:
    session.info.pop(_LEARNED, None)  # any rollback, a savepoint's too: learn nothing from this transaction


def record_steps(session: Session, tick_id: int, scheduled_at: dt.datetime, steps: Sequence[StepRecord]) -> None:
    """Store a tick's steps (`tick_step_lists.packed`, see the module docstring)."""
    split = [split_step(step) for step in steps]
    for _attempt in range(2):
        ids, table_oid = template_ids(session, {item.template for item in split})
        packed = STEP_SEPARATOR.join(
            FIELD_SEPARATOR.join((str(ids[item.template]), item.value, *item.numbers)) for item in split
        )
        params = {"tick_id": tick_id, "scheduled_at": scheduled_at, "packed": packed, "table_oid": table_oid}
        if session.execute(_INSERT_PACKED, params).rowcount == 1:
            return
        session.connection().info.pop(_CACHE, None)  # the table was made again since the ids were cached
    raise RuntimeError(f"tick_step_lists: tick {tick_id}'s steps could not be stored (step_templates keeps changing)")
