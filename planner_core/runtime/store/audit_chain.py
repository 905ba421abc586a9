"""Check the audit log's hash chain (migration 0009): `planner audit verify`.

Each `audit_log` row carries `prev_hash` (the row before's `row_hash`, 32 zero bytes for the first) and
`row_hash = sha256(prev_hash || content)`, set by a database trigger. Here the chain is walked in id order and
every hash recomputed in Python from the row's content, so an edit made around the append-only trigger (by the
owner or a superuser), a deleted row or a cut end shows as the first broken link. The content text comes from
the database (jsonb's canonical text, which Python cannot reproduce byte for byte); the hashing and the linking
are checked here, independently of the trigger.

A chain is evidence against edits by anyone who cannot rewrite every later row and the head too; the owner can
recompute the whole chain, so an operator who needs evidence against the owner keeps the head hash this prints
somewhere the owner cannot write (a ticket, a log shipper) and compares.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.orm import Session

GENESIS_HASH = bytes(32)

# The text each row's hash covers: the same expression as the `audit_log_chain` trigger's (migration 0009).
_ROWS_SQL = """
SELECT id, prev_hash, row_hash,
       jsonb_build_array(id, to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'), deployment_id,
                         tick_id, decision_id, event, detail)::text AS content
  FROM audit_log
 WHERE id > :after
 ORDER BY id
 LIMIT :batch
"""

BATCH_ROWS = 5000  # rows read per query: a year of audit rows is walked without holding them all


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokenLink:
    """The first place the chain does not hold: the row, which hash, what it should be and what is stored."""

    row_id: int | None  # None: the chain's head does not match its last row
    field: str  # "prev_hash", "row_hash" or "head"
    expected: str  # hex
    found: str  # hex

    def line(self) -> str:
        where = "the chain head" if self.row_id is None else f"audit_log row {self.row_id}"
        return f"{where}: {self.field} expected {self.expected}, found {self.found}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ChainReport:
    """The walk's result: rows checked, the head hash, and the first broken link (None: the chain holds)."""

    num_rows: int
    head_hash: str  # hex of the last row's hash (the genesis hash for an empty log)
    broken: BrokenLink | None

    @property
    def ok(self) -> bool:
        return self.broken is None


def row_hash(prev_hash: bytes, content: str) -> bytes:
    """sha256(prev_hash || utf8(content)): what the trigger stores in `row_hash`."""
    return hashlib.sha256(prev_hash + content.encode("utf-8")).digest()


def verify_chain(session: Session) -> ChainReport:
    """Walk the whole audit log in id order; stop at the first broken link.

    Call it first in its transaction: it reads in one snapshot (REPEATABLE READ, read only), so rows the
    planner appends during the walk neither show in some batches and not others nor move the head past the
    walk's end."""
    session.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"))
    expected_prev = GENESIS_HASH
    last_id, num_rows = 0, 0
    while True:
        rows = session.execute(text(_ROWS_SQL), {"after": last_id, "batch": BATCH_ROWS}).all()
        for row_id, prev, stored, content in rows:
            prev, stored = bytes(prev), bytes(stored)
            if prev != expected_prev:
                return _broken(num_rows, expected_prev, row_id, "prev_hash", expected_prev, prev)
            recomputed = row_hash(prev, content)
            if stored != recomputed:
                return _broken(num_rows, expected_prev, row_id, "row_hash", recomputed, stored)
            expected_prev, last_id, num_rows = stored, row_id, num_rows + 1
        if len(rows) < BATCH_ROWS:
            break
    head = session.execute(text("SELECT last_id, last_hash FROM audit_chain_head WHERE id = 1")).one_or_none()
    head_id, head_hash = (None, GENESIS_HASH) if head is None else (head[0], bytes(head[1]))
    if head_hash != expected_prev or (head_id or 0) != last_id:
        # rows were cut from the end (or the head was edited): the head names a row the walk did not end on
        found = f"{head_hash.hex()} (row {head_id})"
        link = BrokenLink(row_id=None, field="head", expected=f"{expected_prev.hex()} (row {last_id})", found=found)
        return ChainReport(num_rows=num_rows, head_hash=expected_prev.hex(), broken=link)
    return ChainReport(num_rows=num_rows, head_hash=expected_prev.hex(), broken=None)


def _broken(num_rows: int, head: bytes, row_id: int, field: str, expected: bytes, found: bytes) -> ChainReport:
    link = BrokenLink(row_id=row_id, field=field, expected=expected.hex(), found=found.hex())
    return ChainReport(num_rows=num_rows, head_hash=head.hex(), broken=link)
