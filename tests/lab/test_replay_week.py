"""The week-replay benchmark's record and the table generated from it (docs/replay.md includes the table): what a
record holds is what the table says, the database URL never reaches the record."""

from __future__ import annotations

from planner_core.lab.history.replay_week import _shown_arguments, markdown

RECORD = {
    "benchmark": "replay_week",
    "date": "2026-12-07 10:00 UTC",
    "commit": "abc1234",
    "command": "python -m planner_core.lab.history.replay_week --database-url URL --reuse --repeat 3",
    "cpus": 2,
    "load_average_1m_at_start": 2.5,
    "load_average_1m_at_end": 3.0,
    "days": 7.0,
    "predictor": "constant",
    "target_s": 60,
    "num_ticks": 124320,
    "ticks_by_loop": {"load": 120960, "throughput": 3360},
    "planner_states_size": "1665 MB",
    "recording": None,
    "replay": {
        "runs": [
            {"seconds": 30.0, "cpu_seconds": 20.0, "identical": 124320, "differing": 0, "skipped": 0},
            {"seconds": 25.0, "cpu_seconds": 19.0, "identical": 124320, "differing": 0, "skipped": 0},
            {"seconds": 35.0, "cpu_seconds": 21.0, "identical": 124320, "differing": 0, "skipped": 0},
        ],
        "median_s": 30.0,
        "ticks_per_s": 4144,
    },
    "command_replay": {"seconds": 28.0, "wall_seconds": 31.0, "identical": 124320},
    "what_if": {
        "change": "ttft_ms 50, itl_ms 5, chained states",
        "seconds": 27.0,
        "differing": 124284,
        "ticks": 124320,
    },
}


def test_the_table_says_what_the_record_holds() -> None:
    table = markdown(RECORD)
    assert "| Replay of the week (124,320 ticks: 120,960 load, 3,360 throughput) | time | ticks/s |" in table
    assert (
        "recorded config, recorded states, in one process: 124,320 of 124,320 `identical` (median of 3: 30.0, 25.0, "
        "35.0 s; CPU 20.0, 19.0, 21.0 s, all processes) | 30.0 s "
        "(within the 60 s target) | 4,144 |"
    ) in table
    assert "| the same through `planner replay` (its own command) | 28.0 s (31.0 s wall) | 4,440 |" in table
    assert "what-if ttft_ms 50, itl_ms 5, chained states: 124,284 differ | 27.0 s | 4,604 |" in table
    assert "Measured 2026-12-07 10:00 UTC at abc1234 with `python -m planner_core.lab.history.replay_week" in table
    assert "Recording the week took" not in table  # not recorded by this run, and no earlier record of it
    assert "recorded config, recorded states, `--jobs 2`: 124,320 of" in markdown({**RECORD, "jobs": 2})
    slow = {**RECORD, "replay": {**RECORD["replay"], "median_s": 61.0}}
    assert "(over the 60 s target)" in markdown(slow)


def test_the_database_url_is_not_recorded() -> None:
    assert _shown_arguments(["--database-url", "postgresql://u:secret@h/db", "--reuse"]) == [
        "--database-url",
        "URL",
        "--reuse",
    ]
    assert _shown_arguments(["--database-url=postgresql://u:secret@h/db"]) == ["--database-url=URL"]
