"""The documentation site's generated pages: the benchmark records' tables and the configuration reference."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("docs_hooks_generated", REPO_ROOT / "docs" / "hooks" / "generated.py")
assert _spec is not None and _spec.loader is not None
hooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hooks)


def _row(policy: str, sla: float, gpu_hours: float, vs_oracle: float | None) -> dict:
    return {
        "policy": policy, "requests": 100, "ttft_attainment": sla, "itl_attainment": 1.0, "sla_attainment": sla,
        "attainable": 1.0, "goodput_rps": 1.0, "gpu_hours": gpu_hours, "gpu_hours_vs_oracle": vs_oracle,
        "scaling_events": 3, "ttft_ms_mean": 100.0, "ttft_ms_p90": 250.4, "itl_ms_mean": 9.0, "itl_ms_p90": 12.34,
        "wall_s": 1.0,
    }  # fmt: skip


def test_bench_record_renders_one_table_under_its_date_command_and_commit(tmp_path: Path) -> None:
    record = {
        "format": "planner-bench-record/v1",
        "date": "2026-01-02T03:04:05Z",
        "command": "planner bench --trace t.csv --policies oracle,planner",
        "commit": "v0.1-5-gabc1234",
        "rows": [_row("oracle", 0.995, 5.95, 1.0), _row("planner", 0.993, 6.8306, None)],
    }
    (tmp_path / "conv.json").write_text(json.dumps(record), encoding="utf-8")
    text = hooks.render_bench_records(tmp_path)
    assert "### conv" in text
    assert "- date: 2026-01-02T03:04:05Z" in text
    assert "- command: `planner bench --trace t.csv --policies oracle,planner`" in text
    assert "- commit: `v0.1-5-gabc1234`" in text
    # × oracle: the row's own ratio when recorded, else computed from the oracle row
    assert "| `oracle` | 99.5% | 99.5% | 100.0% | 5.95 | 1.00x | 3 | 250 | 12.3 |" in text
    assert "| `planner` | 99.3% | 99.3% | 100.0% | 6.83 | 1.15x | 3 | 250 | 12.3 |" in text


def test_a_record_on_engines_off_their_profile_names_their_speed(tmp_path: Path) -> None:
    """`planner bench --engine-speed ... --record`: the record's `engine_speed` is a line under its commit; a record
    without it (older ones too) says nothing of the engines."""
    record = {
        "format": "planner-bench-record/v1", "date": "2026-01-02T03:04:05Z", "command": "planner bench",
        "commit": "abc", "engine_speed": {"prefill": 0.8, "decode": 1.0,
                                          "change": {"at_s": 1200.0, "speed": {"prefill": 0.75, "decode": 1.0}}},
        "rows": [_row("oracle", 0.995, 5.95, 1.0)],
    }  # fmt: skip
    (tmp_path / "lie.json").write_text(json.dumps(record), encoding="utf-8")
    text = hooks.render_bench_records(tmp_path)
    assert (
        "- engines: prefill 0.8× / decode 1× the profile's speed, from 1200 s of the run prefill 0.75× / decode 1× "
        "(the planners read the profile)"
    ) in text
    del record["engine_speed"]
    (tmp_path / "lie.json").write_text(json.dumps(record), encoding="utf-8")
    assert "- engines:" not in hooks.render_bench_records(tmp_path)


def test_dynamo_engine_records_render_beside_the_default_ones(tmp_path: Path) -> None:
    def record(commit: str, rows: list[dict]) -> str:
        return json.dumps({"format": "planner-bench-record/v1", "date": f"date-{commit}", "command": "planner bench",
                           "commit": commit, "rows": rows})  # fmt: skip

    (tmp_path / "dynamo-engine").mkdir()
    (tmp_path / "conv.json").write_text(
        record("aaa", [_row("oracle", 0.995, 5.95, 1.0), _row("planner", 0.993, 6.83, 1.15)])
    )
    (tmp_path / "dynamo-engine" / "conv.json").write_text(
        record(
            "bbb",
            [_row("oracle", 0.99, 4.0, 1.0), _row("planner", 0.98, 5.0, 1.25), _row("dynamo-1.6.1", 0.5, 2.0, 0.5)],
        )
    )
    text = hooks.render_engine_comparison(tmp_path, tmp_path / "dynamo-engine")
    assert "### conv: both engines" in text
    assert "- our simulator: date-aaa, commit `aaa`" in text and "- Dynamo's replay: date-bbb, commit `bbb`" in text
    assert "| `planner` | 99.3% | 6.83 | 1.15x | 98.0% | 5.00 | 1.25x |" in text
    assert "| `dynamo-1.6.1` |  |  |  | 50.0% | 2.00 | 0.50x |" in text  # only on one engine
    assert "### conv (Dynamo's replay)" in text  # the record in full after the side-by-side tables
    assert hooks.render_bench_records(tmp_path).count("### ") == 1  # the subfolder is not a default-engine record
    assert hooks.render_engine_comparison(tmp_path, tmp_path / "missing").startswith("No run on Dynamo's engine")


def test_no_records_says_so(tmp_path: Path) -> None:
    assert hooks.render_bench_records(tmp_path / "missing").startswith("No benchmark run has been recorded yet")


def test_config_reference_walks_nested_models() -> None:
    text = hooks.config_reference(hooks.load_models(hooks.REFERENCE_MODELS))
    models = (
        "PlannerConfig", "ServiceConfig", "SchedulingConfig", "EngineLimitsConfig", "PluginsConfig", "RuntimeSettings"
    )  # fmt: skip
    for model in models:
        assert f"### `{model}`" in text
    assert "| `ttft_ms` | `ttft` | float | `500.0` |" in text
    assert "| `database_url` | `PLANNER_DATABASE_URL` |" in text


def test_router_records_compare_each_policy_under_each_router(tmp_path: Path) -> None:
    def record(router: str, rows: list[dict]) -> dict:
        return {
            "format": "planner-bench-record/v1", "date": "2026-11-26T15:00:00+00:00",
            "command": f"planner bench --trace t.csv --router {router}", "commit": "abc1234", "rows": rows,
        }  # fmt: skip

    slo_row = {
        **_row("planner", 0.951, 6.66, 1.13), "router": "slo", "unplaced": 1150, "rejected": 0, "local_prefills": 409,
        "overdue": 835, "ttft_pred_err_p50": 0.169, "ttft_pred_err_p90": 0.361, "tpot_pred_err_p50": 0.047,
        "tpot_pred_err_p90": 0.157,
    }  # fmt: skip
    (tmp_path / "code--slo.json").write_text(json.dumps(record("slo", [slo_row])), encoding="utf-8")
    rows = [_row("planner", 0.93, 6.66, 1.13), _row("oracle", 0.999, 5.88, 1.0)]
    (tmp_path / "code--least_loaded.json").write_text(json.dumps(record("least_loaded", rows)), encoding="utf-8")
    text = hooks.render_router_records(tmp_path)
    assert "### code" in text
    # least_loaded first whatever the file order; a policy missing under a router gets an empty cell
    assert "| policy | least_loaded: SLA / GPU-h | slo: SLA / GPU-h |" in text
    assert "| `planner` | 93.0% / 6.66 | 95.1% / 6.66 |" in text
    assert "| `oracle` | 99.9% / 5.88 |  |" in text
    assert "- `slo`: 2026-11-26T15:00:00+00:00, commit `abc1234`, `planner bench --trace t.csv --router slo`" in text
    assert "| `planner` | 1150 | 0 | 409 | 835 | 16.9% / 36.1% | 4.7% / 15.7% |" in text
    assert hooks.render_router_records(tmp_path / "missing").startswith("No router comparison has been recorded yet")
    # the plain records page ignores the routers' folder
    assert hooks.render_bench_records(tmp_path.parent / "nothing-here").startswith("No benchmark run")


def test_the_startup_marker_renders_the_startup_folder_only(tmp_path: Path) -> None:
    """`<!-- startup-records -->` becomes the tables of `results/startup/`; the main marker keeps the top folder's."""
    record = {
        "format": "planner-bench-record/v1",
        "date": "2026-01-02T03:04:05Z",
        "command": "planner bench --startup-s 600",
        "commit": "abc1234",
        "rows": [
            _row("oracle", 0.995, 5.875, 1.0),
            _row("planner", 0.93, 6.6, 1.12),
            _row("planner@q0.9", 0.97, 9.4, 1.6),
        ],
    }
    (tmp_path / "results" / "startup").mkdir(parents=True)
    (tmp_path / "results" / "startup" / "code-s600.json").write_text(json.dumps(record), encoding="utf-8")
    page = f"{hooks.BENCH_MARKER}\n\n{hooks.STARTUP_MARKER}"
    text = hooks.on_page_markdown(page, None, {"docs_dir": str(tmp_path)}, None)
    main, startup = text.split("### code-s600", 1)[0], text
    assert main.startswith("No benchmark run has been recorded yet")
    assert "### code-s600" in startup and "| `planner@q0.9` | 97.0% |" in startup
    # above the tables, one line per record: the goal on it and the knob's best
    assert startup.split(hooks.BENCH_MARKER)[-1].count("goal not met: planner 93.0 % of attainable at 6.60 GPU-h") == 1
    assert "knob: no setting reaches 99 %; the highest, q0.9: 97.0 % of attainable at 9.40 GPU-h (1.60x" in startup


def test_profile_roundtrip_record_renders_its_tables(tmp_path):
    record = REPO_ROOT / "docs" / "results" / "profile" / "roundtrip.json"
    text = hooks.render_profile_roundtrip(record)
    data = json.loads(record.read_text())
    assert text.startswith(f"Recorded {data['date']} at commit `{data['commit']}`")
    num_points = len(data["points"]["source"])
    assert text.count("\n| prefill |") + text.count("\n| decode |") == num_points
    assert "| the mocker's own timing table | decode |" in text
    assert "run `make profile-roundtrip`" in hooks.render_profile_roundtrip(tmp_path / "missing.json")


def test_chaos_reports_render_one_column_per_run_newest_first(tmp_path: Path) -> None:
    """Two reports: the newer one (with an ingest leg) first; the older one, which lacks figures a later version
    counts, shows "-" in their cells; a file that is not a report is refused, naming it."""
    base = {
        "command": "planner chaos --kills 2", "commit": "0123456789abcdef", "duration_s": 600.0, "num_kills": 2,
        "kills_by_fault": {"demo-random": 1, "demo-after-tick": 0, "postgres": 1, "prefect": 0},
        "num_demo_attempts": 3, "hung_demos_killed": 0, "num_rounds": 1, "baseline_ticks": 14,
        "baseline_decisions": 1, "rounds_identical": 1, "duplicate_ticks": 0, "duplicate_decisions": 0,
        "lost_ticks": 0, "lost_decisions": 0, "extra_ticks": 0, "extra_decisions": 0,
        "audit_chain": {"ok": True, "num_rows": 40, "broken": None},
    }  # fmt: skip
    old = base | {"started_at": "2026-01-01T10:00:00+00:00"}
    new = base | {
        "started_at": "2026-01-02T10:00:00+00:00", "num_kills": 5, "changed_ticks": 0, "changed_decisions": 0,
        "kills_by_fault": base["kills_by_fault"] | {"ingest": 2, "postgres-under-ingest": 1},
        "ingest": {"num_sent": 1000, "num_stored": 950, "duplicated": 0, "changed": 0, "extra": 0,
                   "lost_explained": 50, "lost_unexplained": 0},
    }  # fmt: skip
    (tmp_path / "a-old.json").write_text(json.dumps(old), encoding="utf-8")
    (tmp_path / "b-new.json").write_text(json.dumps(new), encoding="utf-8")
    lines = hooks.render_chaos_records(tmp_path).splitlines()
    assert lines[0] == "| | `b-new` | `a-old` |"
    assert "| date (UTC) | 2026-01-02T10:00:00 | 2026-01-01T10:00:00 |" in lines
    assert "| kills in all | 5 | 2 |" in lines
    assert "| ingest / postgres-under-ingest | 2 / 1 | - |" in lines
    assert "| changed ticks / decisions | 0 / 0 | - |" in lines
    assert "| messages lost: while no ingest listened / otherwise | 50 / 0 | - |" in lines
    assert "| audit chain | intact, 40 rows | intact, 40 rows |" in lines
    assert "- `b-new`: `planner chaos --kills 2`" in lines
    (tmp_path / "c-bad.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ValueError, match=r"c-bad\.json: not a `planner chaos --report` file"):
        hooks.render_chaos_records(tmp_path)
    assert "holds no report" in hooks.render_chaos_records(tmp_path / "none")


def test_live_records_render_each_runs_command_and_the_live_table_newest_first(tmp_path: Path) -> None:
    """Two `planner live --record` files: the newer first, each run named with its command and commit, the figures
    in `planner live`'s own table; a file of another format is refused, naming it."""
    run = {
        "run": "planner", "command": "planner live --keep-every 12", "commit": "abc1234", "aiperf_records": 100,
        "aiperf_errors": 0, "attainment": 0.995, "gpu_seconds": 1234.5, "scale_ups": 1, "scale_downs": 2,
    }  # fmt: skip
    fixed = run | {"run": "fixed-3", "attainment": 0.9976, "gpu_seconds": 1816.9, "scale_ups": 0, "scale_downs": 0}
    old = {"format": "planner-live-record/v1", "date": "2026-01-01T00:00:00+00:00", "ttft_ms": 2000, "itl_ms": 100,
           "runs": [run]}  # fmt: skip
    new = old | {"date": "2026-01-02T00:00:00+00:00", "runs": [run, fixed]}
    (tmp_path / "a.json").write_text(json.dumps(old), encoding="utf-8")
    (tmp_path / "b.json").write_text(json.dumps(new), encoding="utf-8")
    text = hooks.render_live_records(tmp_path)
    assert text.index("**`b`**") < text.index("**`a`**")
    assert "- `fixed-3`: `planner live --keep-every 12` at commit `abc1234`" in text
    assert "| attainment TTFT<=2000 ms & ITL<=100 ms | 99.50 % | 99.76 % |" in text
    assert "| GPU-seconds (1 GPU per engine) | 1234.5 | 1816.9 |" in text
    (tmp_path / "c.json").write_text(json.dumps({"format": "planner-bench-record/v1"}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"c\.json: not a `planner live --record` file"):
        hooks.render_live_records(tmp_path)
    assert "holds no record" in hooks.render_live_records(tmp_path / "none")
