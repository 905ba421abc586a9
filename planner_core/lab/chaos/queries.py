"""The fault suite's reads of the run's database (plain psycopg: a read must not wait on the ORM's pool while
Postgres is being killed): ticks so far, a round's tick and decision sequences, and a round against the baseline."""

from __future__ import annotations

from typing import Any


def query_rows(url: str, sql: str, *params: Any) -> list[tuple]:
    """The rows of one query on the run's database (a connection of its own, 5 s to connect)."""
    import psycopg

    from planner_core.runtime.store.db import to_libpq_uri

    with psycopg.connect(to_libpq_uri(url), connect_timeout=5) as conn:
        return conn.execute(sql, params).fetchall()


def tick_count(url: str, deployment: str) -> int | None:
    """Ticks recorded for the deployment; None while the database cannot answer (down, or no schema yet)."""
    try:
        return query_rows(
            url, "SELECT count(*) FROM ticks t JOIN deployments d ON d.id = t.deployment_id WHERE d.name = %s",
            deployment,
        )[0][0]  # fmt: skip
    except Exception:  # any failure here means "no answer yet"; the demo's own exit tells why
        return None


def sequences(url: str, deployment: str) -> dict[str, list]:
    """A round's ticks (scheduled time, loop, reason, targets), its decision history, and its duplicates."""
    ticks = query_rows(
        url,
        """SELECT t.scheduled_at, t.loop, t.reason, d.target_prefill, d.target_decode
             FROM ticks t JOIN deployments dep ON dep.id = t.deployment_id
             LEFT JOIN decisions d ON d.tick_id = t.id
            WHERE dep.name = %s ORDER BY t.scheduled_at, t.loop""",
        deployment,
    )
    decisions = query_rows(
        url,
        """SELECT decided_at, target_prefill, target_decode, status, acknowledged_at IS NOT NULL
             FROM decision_history WHERE deployment = %s ORDER BY decided_at""",
        deployment,
    )
    duplicate_ticks = query_rows(
        url,
        """SELECT count(*) FROM (SELECT 1 FROM ticks t JOIN deployments dep ON dep.id = t.deployment_id
            WHERE dep.name = %s GROUP BY t.loop, t.scheduled_at HAVING count(*) > 1) x""",
        deployment,
    )[0][0]
    duplicate_decisions = query_rows(
        url,
        """SELECT count(*) FROM (SELECT 1 FROM decisions d JOIN deployments dep ON dep.id = d.deployment_id
            WHERE dep.name = %s GROUP BY d.tick_id HAVING count(*) > 1) x""",
        deployment,
    )[0][0]
    return {"ticks": ticks, "decisions": decisions, "dup_ticks": duplicate_ticks, "dup_decisions": duplicate_decisions}


def diff_rows(baseline: list[tuple], got: list[tuple], key_fields: int) -> dict[str, list]:
    """Rows keyed by their first `key_fields` fields (a tick's scheduled time and loop, a decision's time): the
    baseline's rows whose key `got` lacks (lost), `got`'s rows whose key the baseline lacks (extra), and the keys
    in both whose rows differ (changed: recorded once, with other content)."""

    def keyed(rows: list[tuple]) -> dict[Any, tuple]:
        return {row[:key_fields]: row for row in rows}

    old, new = keyed(baseline), keyed(got)
    return {
        "lost": [old[k] for k in old if k not in new],
        "extra": [new[k] for k in new if k not in old],
        "changed": [(old[k], new[k]) for k in old if k in new and old[k] != new[k]],
    }


def compare_round(url: str, deployment: str, baseline: dict[str, list]) -> dict[str, Any]:
    """One finished round against the baseline: duplicates, losses, extras, changed rows, identical sequences."""
    got = sequences(url, deployment)
    ticks = diff_rows(baseline["ticks"], got["ticks"], key_fields=2)  # (scheduled_at, loop)
    decisions = diff_rows(baseline["decisions"], got["decisions"], key_fields=1)  # decided_at
    return {
        "deployment": deployment,
        "num_ticks": len(got["ticks"]),
        "num_decisions": len(got["decisions"]),
        "duplicate_ticks": got["dup_ticks"],
        "duplicate_decisions": got["dup_decisions"],
        "lost_ticks": len(ticks["lost"]),
        "lost_decisions": len(decisions["lost"]),
        "extra_ticks": len(ticks["extra"]),
        "extra_decisions": len(decisions["extra"]),
        "changed_ticks": len(ticks["changed"]),
        "changed_decisions": len(decisions["changed"]),
        "changes": [[str(value) for value in pair] for pair in ticks["changed"] + decisions["changed"]],
        "ticks_identical": got["ticks"] == baseline["ticks"],
        "decisions_identical": got["decisions"] == baseline["decisions"],
    }
