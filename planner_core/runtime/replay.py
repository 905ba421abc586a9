"""Replay: re-run recorded ticks from their stored inputs and states, and say tick by tick what differs.

`replay()` reads a deployment's ticks over a time range (inputs from `ticks.inputs`, the state before each tick
from `planner_states` of the tick it chained from), calls `planner_core.runtime.service.decide` — the very function live
ticks call — and compares the outcome with what was recorded: headline reason, decision, proposals, forecast,
explanation steps and next state. Results go to `replay_runs` and `replay_ticks` only, in one transaction; the
production history is read in one consistent snapshot and never written.

Configs: by default each tick runs under the policy it was recorded with: the config revision it ran
(`ticks.config_revision`, migration 0024: a live retune is in force from the tick after it, so the ticks before and
after it replay each under its own), whose policy is in `planner_configs` by the revision's `config_hash` (ticks
recorded before revisions: by the tick's own hash). With the same code every tick must come out identical. With a
what-if config file every tick runs under that file's policy instead, and the differences are what that policy
would have changed; the file's service settings (reports, ports, endpoints) play no part, so a file differing only
in them replays identically.

States (`ReplayMode`):
- `recorded` (default without a what-if config): every tick starts from the state the original run had before
  it, so each tick is checked on its own and one difference does not spread to the ticks after it (where
  `planner db prune` removed that state, from the replayed state of the tick before, if it was replayed);
- `chained` (default with a what-if config): each tick starts from the previous replayed tick's state (the
  first from the recorded state before it), so the forecast history follows the what-if decisions' own path.
Either way the inputs are the recorded ones: worker counts and traffic are what the real cluster showed under
the original decisions (replay does not simulate how the cluster would have reacted).

Exactness: states and inputs are JSON built from the frozen domain dataclasses; floats round-trip exactly
through JSONB and Postgres' shortest-exact float output, so the comparison is `==` (NaN equal to NaN).

Comparing a replayed tick with the recorded one is `planner_core.runtime.replay_compare` (pure).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, text

from planner_core.config import PlannerConfig, config_hash, load_config, parse_config
from planner_core.domain import LoadHistory, Loop, PlannerState, TickOutcome
from planner_core.runtime.replay_compare import (
    _STATE_REST_FIELDS,
    _diff,
    _recorded_form,
    _replayed_form,
    _same,
    _same_rest,
)
from planner_core.runtime.replay_parallel import TickRange, num_processes, run_ranges, tick_ranges
from planner_core.runtime.replay_rows import TICKS_SQL, with_states
from planner_core.runtime.service import PlannerContext, context_for_config, decide, initial_state
from planner_core.runtime.store import repository as repo
from planner_core.runtime.store.codec import field_converters, from_jsonable, inputs_from_stored, to_jsonable
from planner_core.runtime.store.db import get_engine
from planner_core.runtime.store.models import ReplayMode, ReplayTickOutcome
from planner_core.runtime.store.step_packing import StoredTemplate, stored_templates

MAX_FIELDS_PER_SECTION = 12  # differing fields listed per section (reason, decision, ..., next_state)
# How each field of a state other than its load history is decoded (the history is decoded apart, once per change).
_REST_CONVERTERS = tuple((name, convert) for name, convert in field_converters(PlannerState) if name != "load_history")
_COPY_BATCH = 10_000


@dataclass(frozen=True, slots=True, kw_only=True)
class TickDifference:
    """One replayed tick that differs from the recorded one (or could not be replayed)."""

    tick_id: int
    scheduled_at: dt.datetime
    loop: str
    outcome: ReplayTickOutcome
    fields: tuple[dict[str, Any], ...]  # {"field": "steps[3].value", "recorded": ..., "replayed": ...}
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "tick_id": self.tick_id,
            "scheduled_at": self.scheduled_at.isoformat(),
            "loop": self.loop,
            "outcome": self.outcome.value,
            "fields": list(self.fields),
            **({"detail": self.detail} if self.detail else {}),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplaySummary:
    """What a replay found; `run_id` is its row in `replay_runs`."""

    run_id: int
    deployment: str
    mode: ReplayMode
    config_source: str
    num_ticks: int
    num_identical: int
    num_differing: int
    num_skipped: int
    elapsed_s: float
    differences: tuple[TickDifference, ...]  # differing and skipped ticks, in tick order
    revisions: tuple[int, ...] = ()  # the config revisions the replayed ticks ran (ticks before 0024 have none)

    def to_json(self) -> dict[str, Any]:
        return {
            "ticks": self.num_ticks,
            "identical": self.num_identical,
            "differing": self.num_differing,
            "skipped": self.num_skipped,
            "run_id": self.run_id,
            "deployment": self.deployment,
            "mode": self.mode.value,
            "config": self.config_source,
            "elapsed_s": round(self.elapsed_s, 3),
            "revisions": list(self.revisions),
            "differences": [d.to_json() for d in self.differences],
        }


def code_version() -> str:
    """The planner's version and, in a git checkout, its commit (`+dirty` when the tree has changes)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = version("llm-planner")
    except PackageNotFoundError:
        release = "unknown"
    from planner_core.runtime.localhost import code_commit

    commit = code_commit()
    return f"{release}+{commit}" if commit else release


def replay(
    database_url: str,
    deployment: str,
    start: dt.datetime,
    end: dt.datetime,
    *,
    config_path: Path | None = None,
    recorded_config_dir: Path | None = None,
    profile_dir: Path | None = None,
    mode: ReplayMode | None = None,
    jobs: int = 1,
    on_progress: Callable[[int, int], None] | None = None,
) -> ReplaySummary:
    """Replay the deployment's ticks scheduled in [start, end) and record the comparison in the replay tables.

    Args:
        database_url: the planner database.
        deployment: the managed deployment whose ticks are replayed.
        start, end: the range of scheduled times (aware datetimes), end excluded.
        config_path: a what-if config file; None replays each tick under its recorded config.
        recorded_config_dir: where relative paths of recorded configs (`profile_results_dir`, the warm-up trace)
            are taken from: the folder the original config file was in.
        profile_dir: use this profile folder instead of the configs' `profile_results_dir`.
        mode: which state each tick starts from; default `recorded` without a what-if config, else `chained`.
        jobs: processes replaying at once (`replay_parallel`): in `recorded` mode the range is cut into up to
            `jobs` parts replayed side by side, with the very results of one process; `chained` mode uses one.
        on_progress: called with (ticks done, ticks in range) as the replay advances.

    Raises:
        ValueError: an unknown deployment, an empty or reversed range, a config or profile that cannot be loaded
            (one line naming it), `jobs` below 1.
    """
    if end <= start:
        raise ValueError(f"--to {end.isoformat()} must be after --from {start.isoformat()}")
    if jobs < 1:
        raise ValueError(f"--jobs {jobs}: must be at least 1")
    mode = mode or (ReplayMode.RECORDED if config_path is None else ReplayMode.CHAINED)
    started = time.perf_counter()
    engine = get_engine(database_url)
    contexts = _Contexts(database_url, deployment, config_path, recorded_config_dir, profile_dir)
    with engine.connect() as reader, engine.connect() as writer:
        # One consistent snapshot of the history, however long the replay takes; never written.
        reader.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY"))
        range_params, total, first_id, last_id = _tick_range(reader, deployment, start, end)
        run_id = _insert_run(writer, range_params, mode, contexts, profile_dir)
        shared = _Shared(
            database_url=database_url,
            run_id=run_id,
            mode=mode,
            contexts=contexts,
            range_params=range_params,
            templates=stored_templates(reader),
        )
        # chained states follow the replayed path from tick to tick: one process
        parts = num_processes(jobs, total) if mode is ReplayMode.RECORDED and first_id is not None else 1
        ranges = tick_ranges(reader, range_params, first_id, last_id, total, parts) if parts > 1 else []
        if len(ranges) > 1:
            tally = _replay_in_processes(reader, writer, shared, ranges, total, on_progress)
        else:
            tally = _Tally(run_id=run_id, writer=writer)
            comparer = _Comparer(reader, contexts, mode)
            for result in comparer.run(_tick_rows(reader, shared, TickRange(first_id or 0, last_id or 0))):
                tally.add(result)
                if on_progress is not None and (tally.done % 500 == 0 or tally.done == total):
                    on_progress(tally.done, total)
            tally.revisions = comparer.revisions
        tally.flush()
        reader.rollback()
        elapsed_s = time.perf_counter() - started
        _finish_run(writer, run_id, tally.done, tally.counts, elapsed_s)
        writer.commit()
    done, counts = tally.done, tally.counts
    if on_progress is not None and done != total:
        on_progress(done, done)
    return ReplaySummary(
        run_id=run_id,
        deployment=deployment,
        mode=mode,
        config_source=contexts.source,
        num_ticks=done,
        num_identical=counts[ReplayTickOutcome.IDENTICAL],
        num_differing=counts[ReplayTickOutcome.DIFFERING],
        num_skipped=counts[ReplayTickOutcome.SKIPPED],
        elapsed_s=elapsed_s,
        differences=tuple(tally.differences),
        revisions=tuple(sorted(tally.revisions)),
    )


def _tick_range(
    reader: Connection, deployment: str, start: dt.datetime, end: dt.datetime
) -> tuple[dict[str, Any], int, int | None, int | None]:
    """The deployment's range query parameters, and how many ticks it holds and their first and last ids."""
    deployment_id = reader.scalar(text("SELECT id FROM deployments WHERE name = :name"), {"name": deployment})
    if deployment_id is None:
        raise ValueError(f"--deployment = {deployment!r}: no such deployment")
    range_params = {"deployment_id": deployment_id, "start": start, "end": end}
    total, first_id, last_id = reader.execute(
        text(
            "SELECT count(*), min(id), max(id) FROM ticks WHERE deployment_id = :deployment_id "
            "AND scheduled_at >= :start AND scheduled_at < :end"
        ),
        range_params,
    ).one()
    return range_params, total, first_id, last_id


def _insert_run(
    writer: Connection, range_params: dict[str, Any], mode: ReplayMode, contexts: _Contexts, profile_dir: Path | None
) -> int:
    """Record the replay run (its figures zero until `_finish_run`); its id."""
    return writer.scalar(
        text(
            """INSERT INTO replay_runs (deployment_id, range_start, range_end, mode, config_source, config_hash,
                                        config_body, profile_dir, code_version, num_ticks, num_identical,
                                        num_differing, num_skipped, elapsed_s)
               VALUES (:deployment_id, :start, :end, :mode, :source, :hash, :body, :profile, :code,
                       0, 0, 0, 0, 0) RETURNING id"""
        ),
        {
            **range_params,
            "mode": mode.value,
            "source": contexts.source,
            "hash": contexts.what_if_hash,
            "body": json.dumps(contexts.what_if_body) if contexts.what_if_body is not None else None,
            "profile": str(profile_dir) if profile_dir is not None else None,
            "code": code_version()[:120],
        },
    )


@dataclass(slots=True, kw_only=True)
class _Tally:
    """A replay's results as they come, in tick order: counts per outcome, the differences and the `replay_ticks`
    rows, copied to `writer` in batches (kept, without a writer: a replay process hands them to its caller)."""

    run_id: int
    writer: Connection | None = None
    counts: dict[ReplayTickOutcome, int] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(ReplayTickOutcome, 0)
    )
    differences: list[TickDifference] = dataclasses.field(default_factory=list)
    rows: list[tuple] = dataclasses.field(default_factory=list)
    revisions: set[int] = dataclasses.field(default_factory=set)  # the config revisions of the ticks replayed
    done: int = 0

    def add(self, result: _Result) -> None:
        self.counts[result.outcome] += 1
        if result.outcome is not ReplayTickOutcome.IDENTICAL:
            self.differences.append(result.difference)
        self.rows.append(result.copy_row(self.run_id))
        self.done += 1
        if self.writer is not None and len(self.rows) >= _COPY_BATCH:
            self.flush()

    def merge(self, other: _Tally) -> None:
        """Append the results of the ticks after this tally's (another process's range)."""
        for outcome, count in other.counts.items():
            self.counts[outcome] += count
        self.differences.extend(other.differences)
        self.rows.extend(other.rows)
        self.revisions |= other.revisions
        self.done += other.done
        self.flush()

    def flush(self) -> None:
        if self.writer is not None:
            _copy_replay_ticks(self.writer, self.rows)
            self.rows.clear()


@dataclass(frozen=True, slots=True, kw_only=True)
class _Shared:
    """What every part of a replay reads alike (inherited by the processes of a parallel replay)."""

    database_url: str
    run_id: int
    mode: ReplayMode
    contexts: _Contexts
    range_params: dict[str, Any]
    templates: dict[int, StoredTemplate]  # `step_templates` as of the replay's snapshot
    snapshot: str | None = None  # the snapshot the processes read (`pg_export_snapshot`), parallel replays only


def _tick_rows(reader: Connection, shared: _Shared, tick_range: TickRange) -> Iterator[Any]:
    """The rows of the ticks `tick_range` of the replayed range, states rebuilt and steps unpacked, streamed."""
    params = {**shared.range_params, "first_id": tick_range.first_id, "last_id": tick_range.last_id}
    result = reader.execution_options(stream_results=True, yield_per=2000).execute(text(TICKS_SQL), params)
    return with_states(reader, result, shared.templates)


def _replay_in_processes(
    reader: Connection,
    writer: Connection,
    shared: _Shared,
    ranges: list[TickRange],
    total: int,
    on_progress: Callable[[int, int], None] | None,
) -> _Tally:
    """Replay `ranges` side by side (`replay_parallel`) from this transaction's snapshot; their results merged in
    tick order into one tally copying to `writer`."""
    shared.contexts.prepare(reader, shared.range_params)  # built once here, inherited by every process
    snapshot = reader.scalar(text("SELECT pg_export_snapshot()"))
    shared = dataclasses.replace(shared, snapshot=snapshot)
    done = 0

    def progressed(num_ticks: int) -> None:
        nonlocal done
        done += num_ticks
        if on_progress is not None:
            on_progress(done, total)

    tally = _Tally(run_id=shared.run_id, writer=writer)
    for part in run_ranges(_replay_range, shared, ranges, progressed):
        tally.merge(part)
    return tally


_SNAPSHOT_ID = re.compile(r"[0-9A-F]+-[0-9A-F]+(-[0-9]+)?")


def _replay_range(shared: _Shared, tick_range: TickRange, report: Callable[[int], None]) -> _Tally:
    """One process's part of a parallel replay (runs in the forked process): its ticks replayed from the
    replay's snapshot, results kept for the caller."""
    if _SNAPSHOT_ID.fullmatch(shared.snapshot or "") is None:
        raise ValueError(f"not a snapshot id: {shared.snapshot!r}")
    # A new engine of this process's own: the parent's stay referenced (`db._ENGINES`), so the connections this
    # process inherited, which are the parent's too, are neither used nor closed here.
    get_engine.cache_clear()
    engine = get_engine(shared.database_url)
    try:
        with engine.connect() as reader:
            reader.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY"))
            reader.execute(text(f"SET TRANSACTION SNAPSHOT '{shared.snapshot}'"))
            comparer = _Comparer(reader, shared.contexts, shared.mode)
            tally = _Tally(run_id=shared.run_id)
            for result in comparer.run(_tick_rows(reader, shared, tick_range)):
                tally.add(result)
                if tally.done % 500 == 0:
                    report(500)
            report(tally.done % 500)
            tally.revisions = comparer.revisions
            reader.rollback()
        return tally
    finally:
        engine.dispose()


def _finish_run(
    writer: Connection, run_id: int, done: int, counts: dict[ReplayTickOutcome, int], elapsed_s: float
) -> None:
    writer.execute(
        text(
            """UPDATE replay_runs SET finished_at = now(), num_ticks = :n, num_identical = :same,
                      num_differing = :diff, num_skipped = :skip, elapsed_s = :elapsed WHERE id = :id"""
        ),
        {
            "id": run_id,
            "n": done,
            "same": counts[ReplayTickOutcome.IDENTICAL],
            "diff": counts[ReplayTickOutcome.DIFFERING],
            "skip": counts[ReplayTickOutcome.SKIPPED],
            "elapsed": elapsed_s,
        },
    )


def _copy_replay_ticks(writer: Connection, rows: list[tuple]) -> None:
    """Append replayed ticks with COPY (a week of 5 s ticks is ~120k rows)."""
    if not rows:
        return
    cursor = writer.connection.dbapi_connection.cursor()
    columns = "run_id, tick_id, outcome, reason, target_prefill, target_decode, differences, detail"
    with cursor.copy(f"COPY replay_ticks ({columns}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


class _Contexts:
    """The decision context of each config a replay runs under (built once per config, the live way)."""

    def __init__(
        self,
        database_url: str,
        deployment: str,
        config_path: Path | None,
        recorded_config_dir: Path | None,
        profile_dir: Path | None,
    ) -> None:
        self._url, self._deployment, self._profile_dir = database_url, deployment, profile_dir
        # relative paths of recorded configs resolve as if the config file were in `recorded_config_dir`
        self._anchor = (recorded_config_dir / "recorded.yaml") if recorded_config_dir is not None else None
        self._by_hash: dict[str, PlannerContext] = {}
        self.what_if: PlannerContext | None = None
        self.what_if_hash: str | None = None
        self.what_if_body: dict[str, Any] | None = None
        self.source = "recorded"
        if config_path is not None:
            config = load_config(config_path).policy
            self.what_if = self._build(config, config_path, str(config_path))
            self.what_if_hash = config_hash(config)
            self.what_if_body = config.model_dump(mode="json")
            self.source = str(config_path)

    def prepare(self, reader: Connection, range_params: dict[str, Any]) -> None:
        """Build the context of every config the range's ticks ran under now (`for_tick` builds them as met)."""
        if self.what_if is not None:
            return
        hashes = reader.scalars(
            text(
                "SELECT DISTINCT COALESCE(r.config_hash, t.config_hash) FROM ticks t LEFT JOIN config_revisions r "
                "ON r.deployment_id = t.deployment_id AND r.revision = t.config_revision "
                "WHERE t.deployment_id = :deployment_id AND t.scheduled_at >= :start AND t.scheduled_at < :end"
            ),
            range_params,
        )
        for recorded_hash in hashes:
            self.for_tick(reader, recorded_hash)

    def for_tick(self, reader: Connection, recorded_hash: str) -> PlannerContext:
        if self.what_if is not None:
            return self.what_if
        ctx = self._by_hash.get(recorded_hash)
        if ctx is None:
            body = reader.scalar(
                text("SELECT body FROM planner_configs WHERE config_hash = :hash"), {"hash": recorded_hash}
            )
            source = f"planner_configs[{recorded_hash[:12]}]"
            # The stored hash is only a key here, never recomputed: a body stored before the policy/service split
            # holds the whole file under the whole file's hash, and parse_config splits its service fields off.
            ctx = self._build(parse_config(body, source).policy, self._anchor, source)
            self._by_hash[recorded_hash] = ctx
        return ctx

    def _build(self, config: PlannerConfig, config_path: Path | None, source: str) -> PlannerContext:
        ctx = context_for_config(self._url, self._deployment, config, config_path, profile_dir=self._profile_dir)
        if ctx.perf is None:
            where = self._profile_dir if self._profile_dir is not None else config.profile_results_dir
            raise ValueError(
                f"{source}: field 'profile_results_dir' = {str(where)!r}: profile not found "
                "(give the folder with --profile-dir, or --config-dir for the folder the config was in)"
            )
        return ctx


@dataclass(slots=True)
class _Result:
    tick_id: int
    outcome: ReplayTickOutcome
    difference: TickDifference | None
    replayed: TickOutcome | None

    def copy_row(self, run_id: int) -> tuple:
        decision = self.replayed.decision if self.replayed is not None else None
        fields = self.difference.fields if self.difference is not None else ()
        return (
            run_id,
            self.tick_id,
            self.outcome.value,
            self.replayed.reason.value if self.replayed is not None else None,
            decision.num_prefill if decision is not None else None,
            decision.num_decode if decision is not None else None,
            json.dumps(list(fields)) if fields else None,
            (self.difference.detail or None) if self.difference is not None else None,
        )


def _history_jsonable(value: Any) -> Any:
    """`to_jsonable` of a load history, with a fast path for its series (tuples of finite floats, which
    `to_jsonable` turns into lists of the same floats one call per element)."""
    if isinstance(value, tuple) and all(type(v) is float and math.isfinite(v) for v in value):
        return list(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _history_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return to_jsonable(value)


class _Comparer:
    """Walks the recorded ticks in order, replays each and compares; keeps the parsed load histories it can reuse."""

    def __init__(self, reader: Connection, contexts: _Contexts, mode: ReplayMode) -> None:
        self._reader, self._contexts, self._mode = reader, contexts, mode
        self._history_version = 0  # bumps whenever a row carries a load history different from the previous row's
        self._history_json: dict[str, Any] | None = None
        self._history_obj: LoadHistory | None = None
        self._history_obj_version = -1
        self._equal_cache: dict[tuple[int, int], tuple[LoadHistory, bool]] = {}
        self._json_cache: dict[int, tuple[LoadHistory, Any]] = {}
        # each state field's JSON as the newest row held it, and its value decoded from it (`_recorded_state`)
        self._rest_decoded: dict[str, tuple[Any, Any]] = {}
        self.revisions: set[int] = set()  # the config revisions of the ticks replayed

    def run(self, rows: Iterator[Any]) -> Iterator[_Result]:
        previous_id: int | None = None
        previous_state: PlannerState | None = None  # the recorded state after the previous row (recorded mode)
        chained_state: PlannerState | None = None  # the replayed state after the previous row
        first = True
        for row in rows:
            if row.has_state and row.load_history is not None:
                self._history_version += 1
                self._history_json = row.load_history
            recorded_state = self._recorded_state(row) if row.has_state else None
            if self._mode is ReplayMode.CHAINED and not first and chained_state is not None:
                before = chained_state
            elif row.previous_tick_id is not None and row.previous_tick_id == previous_id:
                # a state removed by `planner db prune` is bridged with the replayed state of that tick
                before = previous_state if previous_state is not None else chained_state
            else:
                before = self._state_of(row)
            first = False
            previous_id, previous_state = row.id, recorded_state
            ctx = self._contexts.for_tick(self._reader, row.config_hash)  # the policy of the tick's revision
            if row.config_revision is not None:
                self.revisions.add(row.config_revision)
            if before is None:
                chained_state = None
                yield self._skipped(row, f"the state before tick {row.id} (tick {row.previous_tick_id}) was pruned")
                continue
            try:
                inputs = inputs_from_stored(row.inputs, Loop(row.loop), row.scheduled_at.timestamp())
            except (KeyError, TypeError, ValueError) as exc:
                chained_state = None
                yield self._skipped(row, f"inputs not readable by this code: {exc}")
                continue
            try:
                outcome = decide(ctx, inputs, before)
            except Exception as exc:
                raise RuntimeError(
                    f"replaying tick {row.id} ({row.loop}, {row.scheduled_at.isoformat()}): {exc}"
                ) from exc
            chained_state = outcome.next_state
            if not row.has_state:
                yield _Result(
                    row.id,
                    ReplayTickOutcome.SKIPPED,
                    self._difference(row, ReplayTickOutcome.SKIPPED, (), "the recorded state after it was pruned"),
                    outcome,
                )
                continue
            fields = self._compare(row, outcome, recorded_state)
            if fields:
                yield _Result(
                    row.id,
                    ReplayTickOutcome.DIFFERING,
                    self._difference(row, ReplayTickOutcome.DIFFERING, fields),
                    outcome,
                )
            else:
                yield _Result(row.id, ReplayTickOutcome.IDENTICAL, None, outcome)

    # --- states ---------------------------------------------------------------------------------------------

    def _recorded_history(self) -> LoadHistory:
        """The current recorded load history, parsed once per distinct history."""
        if self._history_obj_version != self._history_version:
            self._history_obj = from_jsonable(LoadHistory, self._history_json or {})
            self._history_obj_version = self._history_version
        assert self._history_obj is not None
        return self._history_obj

    def _recorded_state(self, row: Any) -> PlannerState:
        """The recorded state after `row`, decoded field by field (`from_jsonable`'s converters). A field whose JSON
        is the very object the previous row's was (a delta shares what it left unchanged with its base, and load
        ticks change few fields) keeps the value decoded then: the states of consecutive ticks share their
        unchanged parts, as the live states do, which also makes their comparison cheap (`_same_rest`)."""
        rest, decoded = row.state_rest, self._rest_decoded
        values: dict[str, Any] = {"load_history": self._recorded_history()}
        for name, convert in _REST_CONVERTERS:
            if name not in rest:  # recorded before the field existed: its default, as `from_jsonable` reads it
                decoded.pop(name, None)
                continue
            raw = rest[name]
            cached = decoded.get(name)
            if cached is None or cached[0] is not raw:
                cached = (raw, convert(raw))
                decoded[name] = cached
            values[name] = cached[1]
        return PlannerState(**values)

    def _state_of(self, row: Any) -> PlannerState | None:
        """The state a tick started from when it is not the previous row's: fetched, initial, or None if pruned."""
        if row.previous_tick_id is None:
            return initial_state(self._contexts.for_tick(self._reader, row.config_hash))
        state = repo.state_json(self._reader, row.previous_tick_id)
        return None if state is None else from_jsonable(PlannerState, state)

    # --- comparison -----------------------------------------------------------------------------------------

    def _compare(self, row: Any, outcome: TickOutcome, recorded_state: PlannerState | None) -> list[dict[str, Any]]:
        """The differing fields, at most `MAX_FIELDS_PER_SECTION` per section so that none hides another."""
        fields: list[dict[str, Any]] = []
        replayed = _replayed_form(outcome)
        if _recorded_form(row, non_finite=False) != replayed:  # the common case decided without walking the steps
            recorded = _recorded_form(row)
            if recorded != replayed:
                for section in recorded:
                    limit = len(fields) + MAX_FIELDS_PER_SECTION
                    _diff(section, recorded[section], replayed[section], fields, limit=limit)
        state = outcome.next_state
        rest = None
        if recorded_state is None or not _same_rest(state, recorded_state):  # equal objects encode equal
            rest = {name: to_jsonable(getattr(state, name)) for name in _STATE_REST_FIELDS}
        if rest is not None and rest != row.state_rest:
            # A state recorded before a field was added to `PlannerState` lacks it: read it back as the code does
            # (the field's default) so that a schema addition alone is not a difference.
            stored = from_jsonable(PlannerState, row.state_rest)
            recorded_rest = {name: to_jsonable(getattr(stored, name)) for name in _STATE_REST_FIELDS}
            if rest != recorded_rest:
                _diff("next_state", recorded_rest, rest, fields, limit=len(fields) + MAX_FIELDS_PER_SECTION)
        if not self._history_equal(state.load_history):
            _diff(
                "next_state.load_history",
                self._history_json,
                self._history_to_json(state.load_history),
                fields,
                limit=len(fields) + MAX_FIELDS_PER_SECTION,
            )
        return fields

    def _history_to_json(self, history: LoadHistory) -> Any:
        cached = self._json_cache.get(id(history))
        if cached is None or cached[0] is not history:
            if len(self._json_cache) > 8:
                self._json_cache.clear()
            cached = (history, _history_jsonable(history))
            self._json_cache[id(history)] = cached
        return cached[1]

    def _history_equal(self, history: LoadHistory) -> bool:
        """Whether `history` serialises to the recorded history of the current row (cached per pair)."""
        key = (id(history), self._history_version)
        cached = self._equal_cache.get(key)
        if cached is None or cached[0] is not history:
            if len(self._equal_cache) > 8:
                self._equal_cache.clear()
            cached = (history, _same(self._history_to_json(history), self._history_json))
            self._equal_cache[key] = cached
        return cached[1]

    def _skipped(self, row: Any, detail: str) -> _Result:
        return _Result(
            row.id, ReplayTickOutcome.SKIPPED, self._difference(row, ReplayTickOutcome.SKIPPED, (), detail), None
        )

    @staticmethod
    def _difference(
        row: Any, outcome: ReplayTickOutcome, fields: list[dict[str, Any]] | tuple, detail: str = ""
    ) -> TickDifference:
        return TickDifference(
            tick_id=row.id,
            scheduled_at=row.scheduled_at,
            loop=row.loop,
            outcome=outcome,
            fields=tuple(fields),
            detail=detail,
        )
