"""Check the audit log's hash chain (migration 0009): `planner audit verify`.

Each `audit_log` row carries `prev_hash` (the row before's `row_hash`, 32 zero bytes for the first) and
`row_hash = sha256(prev_hash || content)`, set by a database trigger. Here the chain is walked in id order and
every hash recomputed in Python from the row's content, so an edit made around the append-only trigger (by the
owner or a superuser), a deleted row or a cut end shows as the first broken link. The content text comes from
the database (jsonb's canonical text, which Python cannot reproduce byte for byte); the hashing and the linking
are checked here, independently of the trigger.

A chain is evidence against edits by anyone who cannot rewrite every later row and the head too; the owner (or a
superuser) can recompute the whole chain and its head. Against them the head is anchored outside the database:
`planner audit head` exports it (`ChainHead`: row, hash, time) for an operator to keep where the owner cannot write
(a file, a Kubernetes ConfigMap, a ticket), and `planner audit verify --head H` checks that the chain still holds
that row with that hash. A chain recomputed after an edit at or before the anchored row then fails at the anchor;
the log may have grown since, so rows after the anchor are checked by the chain alone (until the next anchor).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    field: str  # "prev_hash", "row_hash", "head" or "anchor" (the head kept outside the database)
    expected: str  # hex
    found: str  # hex

    def line(self) -> str:
        where = "the chain head" if self.row_id is None else f"audit_log row {self.row_id}"
        if self.field == "anchor":
            return (
                f"{where}: row_hash expected {self.expected} (the head kept outside the database), found {self.found}"
            )
        return f"{where}: {self.field} expected {self.expected}, found {self.found}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ChainHead:
    """A head of the chain as exported for keeping outside the database: its newest row then (None: an empty log),
    that row's hash (hex) and its time."""

    row_id: int | None
    hash_hex: str
    at: dt.datetime | None = None

    def to_json(self) -> dict[str, Any]:
        return {"row": self.row_id, "hash": self.hash_hex, "at": None if self.at is None else self.at.isoformat()}

    @classmethod
    def parse(cls, text: str, source: str) -> ChainHead:
        """A head from `planner audit head`'s JSON, or `ROW:HASH`.

        Raises:
            ValueError: one line naming `source` (the file or option) and what is wrong.
        """
        text = text.strip()
        short = re.fullmatch(r"(\d+):([0-9a-fA-F]{64})", text)
        if short is not None:
            return cls(row_id=int(short[1]), hash_hex=short[2].lower())
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            raise ValueError(
                f"{source}: not a head (the JSON `planner audit head` prints, or ROW:HASH): {text[:80]!r}"
            ) from None
        if not isinstance(data, dict):
            raise ValueError(f"{source}: not a head (a JSON object with 'row' and 'hash'): {text[:80]!r}")
        row, digest = data.get("row"), data.get("hash")
        if row is not None and (isinstance(row, bool) or not isinstance(row, int) or row < 1):
            raise ValueError(f"{source}: field 'row' = {row!r}: not a row id (an integer >= 1, or null)")
        if not isinstance(digest, str) or re.fullmatch(r"[0-9a-fA-F]{64}", digest) is None:
            raise ValueError(f"{source}: field 'hash' = {digest!r:.80}: not a sha256 in hex (64 digits)")
        return cls(row_id=row, hash_hex=digest.lower())


@dataclass(frozen=True, slots=True, kw_only=True)
class ChainReport:
    """The walk's result: rows checked, the head hash, and the first broken link (None: the chain holds)."""

    num_rows: int
    head_hash: str  # hex of the last row's hash (the genesis hash for an empty log)
    broken: BrokenLink | None
    head_row_id: int | None = None  # the last row walked (None: an empty log, or broken before its first row)

    @property
    def ok(self) -> bool:
        return self.broken is None


def row_hash(prev_hash: bytes, content: str) -> bytes:
    """sha256(prev_hash || utf8(content)): what the trigger stores in `row_hash`."""
    return hashlib.sha256(prev_hash + content.encode("utf-8")).digest()


def verify_chain(session: Session, anchor: ChainHead | None = None) -> ChainReport:
    """Walk the whole audit log in id order; stop at the first broken link. With an `anchor` (a head kept outside
    the database), the row it names must be there with its hash (field "anchor" otherwise).

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
            if anchor is not None and row_id == anchor.row_id and stored.hex() != anchor.hash_hex:
                # the chain holds within the database but not at the head kept outside it: recomputed
                link = BrokenLink(row_id=row_id, field="anchor", expected=anchor.hash_hex, found=stored.hex())
                return ChainReport(num_rows=num_rows, head_hash=expected_prev.hex(), broken=link, head_row_id=last_id)
            expected_prev, last_id, num_rows = stored, row_id, num_rows + 1
        if len(rows) < BATCH_ROWS:
            break
    head = session.execute(text("SELECT last_id, last_hash FROM audit_chain_head WHERE id = 1")).one_or_none()
    head_id, head_hash = (None, GENESIS_HASH) if head is None else (head[0], bytes(head[1]))
    if head_hash != expected_prev or (head_id or 0) != last_id:
        # rows were cut from the end (or the head was edited): the head names a row the walk did not end on
        found = f"{head_hash.hex()} (row {head_id})"
        link = BrokenLink(row_id=None, field="head", expected=f"{expected_prev.hex()} (row {last_id})", found=found)
        return ChainReport(num_rows=num_rows, head_hash=expected_prev.hex(), broken=link, head_row_id=last_id or None)
    if anchor is not None and anchor.row_id is not None and anchor.row_id > last_id:
        # the anchored row is past the end: rows were cut (and the head moved back with them)
        link = BrokenLink(row_id=anchor.row_id, field="anchor", expected=anchor.hash_hex, found="no such row")
        return ChainReport(num_rows=num_rows, head_hash=expected_prev.hex(), broken=link, head_row_id=last_id or None)
    if anchor is not None and anchor.row_id is not None:
        seen = session.execute(text("SELECT 1 FROM audit_log WHERE id = :id"), {"id": anchor.row_id}).first()
        if seen is None:  # inside the walked range but gone, the chain relinked around it
            link = BrokenLink(row_id=anchor.row_id, field="anchor", expected=anchor.hash_hex, found="no such row")
            return ChainReport(
                num_rows=num_rows, head_hash=expected_prev.hex(), broken=link, head_row_id=last_id or None
            )
    return ChainReport(num_rows=num_rows, head_hash=expected_prev.hex(), broken=None, head_row_id=last_id or None)


def current_head(session: Session) -> tuple[ChainReport, ChainHead | None]:
    """Verify the chain and, when it holds, its head to export (`planner audit head`): the newest row, its hash
    and its time. A broken chain has no head worth anchoring (None)."""
    report = verify_chain(session)
    if not report.ok:
        return report, None
    at = None
    if report.head_row_id is not None:
        at = session.execute(text("SELECT at FROM audit_log WHERE id = :id"), {"id": report.head_row_id}).scalar_one()
    return report, ChainHead(row_id=report.head_row_id, hash_hex=report.head_hash, at=at)


def publish_head(session: Session, path: Path) -> tuple[ChainReport, ChainHead | None]:
    """Verify the chain and write its head to `path` as `planner audit head` prints it, atomically (a reader sees
    the previous head or the new one, never half of one); a broken chain leaves the file as it was, so the last good
    anchor survives whoever broke it. The fleet publishes it periodically (`planner fleet serve --audit-head-file`)
    to a place the database's owner does not control."""
    report, head = current_head(session)
    if head is None:
        return report, None
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(head.to_json()) + "\n", encoding="utf-8")
    os.replace(partial, path)
    return report, head


def _broken(num_rows: int, head: bytes, row_id: int, field: str, expected: bytes, found: bytes) -> ChainReport:
    link = BrokenLink(row_id=row_id, field=field, expected=expected.hex(), found=found.hex())
    return ChainReport(num_rows=num_rows, head_hash=head.hex(), broken=link)
