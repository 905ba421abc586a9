"""The `planner` command line: one-line errors, nothing written on bad input, database URL."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest

from planner_core.runtime.store.db import to_libpq_uri
from tests.conftest import REPO_ROOT, write_config


def planner(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "planner_cli.main", *args],
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _error_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("planner: error:")]


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        ({"ttft_ms": -5}, ["field 'ttft_ms'", "-5", "must be > 0"]),
        ({"mode": "foo"}, ["field 'mode'", "'foo'", "disagg, prefill, decode, agg"]),
        ({"profile_results_dir": "/nonexistent/profile"}, ["/nonexistent/profile"]),
    ],
    ids=["negative-ttft", "unknown-mode", "missing-profile"],
)
def test_bad_config_fails_in_one_line_and_writes_nothing(database_url, tmp_path, overrides, fragments) -> None:
    """A bad config exits 2 with one line naming the file, field and value, and records nothing."""
    config = write_config(tmp_path, **overrides)
    result = planner("demo", "--config", str(config), env={"PLANNER_DATABASE_URL": database_url})
    assert result.returncode == 2
    [line] = _error_lines(result)
    for fragment in fragments:
        assert fragment in line
    if "profile" not in fragments[0]:
        assert str(config) in line
    with psycopg.connect(to_libpq_uri(database_url)) as conn:
        assert conn.execute("SELECT count(*) FROM ticks").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM audit_log").fetchone()[0] == 0


def test_missing_trace_fails_in_one_line(tmp_path) -> None:
    """A trace that does not exist is named in a one-line error."""
    result = planner("demo", "--trace", str(tmp_path / "nope.csv"))
    assert result.returncode == 2
    assert _error_lines(result) == [f"planner: error: {tmp_path / 'nope.csv'}: no such file"]


def test_db_url_prints_the_configured_database(database_url) -> None:
    """`planner db url` prints the SQLAlchemy URL on stdout and a psql command on stderr."""
    result = planner("db", "url", env={"PLANNER_DATABASE_URL": database_url})
    assert result.returncode == 0
    assert result.stdout.strip() == database_url
    assert f'psql "{to_libpq_uri(database_url)}"' in result.stderr


def test_capacity_json_agrees_with_dynamo_documented_figures(profile_dir) -> None:
    """H200 at ISL 3000 / OSL 300 under 200 ms / 10 ms: ~49.5k prefill and ~4.6k decode tokens/s/GPU (Dynamo's doc)."""
    import json

    result = planner(
        "capacity", "--profile", str(profile_dir), "--isl", "3000", "--osl", "300", "--ttft-ms", "200",
        "--itl-ms", "10", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert set(figures) == {
        "prefill_tokens_per_s_per_gpu",
        "prefill_ttft_ms",
        "decode_tokens_per_s_per_gpu",
        "decode_itl_ms",
        "requests_per_s_per_gpu",
        "feasible",
        "unreachable",
    }
    assert figures["feasible"] is True and figures["unreachable"] == []
    assert figures["prefill_tokens_per_s_per_gpu"] == pytest.approx(49_500, rel=0.01)
    assert figures["prefill_ttft_ms"] == pytest.approx(60, rel=0.02)
    assert figures["decode_tokens_per_s_per_gpu"] == pytest.approx(4_600, rel=0.02)
    assert figures["decode_itl_ms"] == pytest.approx(9.7, rel=0.01)
    # 4,556 / 300 = 15.19 requests/s: decode is the slower phase (prefill 49,481 / 3,000 = 16.49)
    assert figures["requests_per_s_per_gpu"] == pytest.approx(15.19, abs=0.01)


@pytest.mark.parametrize(
    ("ttft_ms", "itl_ms", "fragments"),
    [
        ("1", "10", ["TTFT <= 1 ms is unreachable (the best is 60.5 ms at ISL 3000"]),
        ("200", "0.5", ["ITL <= 0.5 ms is unreachable (the best is 4.43 ms"]),
        ("1", "0.5", ["TTFT <= 1 ms is unreachable", "ITL <= 0.5 ms is unreachable"]),
    ],
    ids=["ttft", "itl", "both"],
)
def test_capacity_of_an_unreachable_sla_prints_no_sizes_and_fails(profile_dir, ttft_ms, itl_ms, fragments) -> None:
    """H200 at ISL 3000 cannot reach TTFT 1 ms (60.5 ms at batch 1) or ITL 0.5 ms: one line naming the missed
    target and the best latency, nothing on stdout, exit 1 (not 2: the input is valid, the answer is no)."""
    result = planner(
        "capacity", "--profile", str(profile_dir), "--isl", "3000", "--osl", "300", "--ttft-ms", ttft_ms,
        "--itl-ms", itl_ms,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stdout == ""
    [line] = _error_lines(result)
    assert line.startswith("planner: error: no capacity meets the SLA: ")
    for fragment in fragments:
        assert fragment in line


def test_capacity_json_of_an_unreachable_sla_says_infeasible(profile_dir) -> None:
    """With --json an unreachable SLA exits 0 with `feasible: false`, the reason, no rate, and the best latency."""
    import json

    result = planner(
        "capacity", "--profile", str(profile_dir), "--isl", "3000", "--osl", "300", "--ttft-ms", "1",
        "--itl-ms", "10", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert figures["feasible"] is False
    assert figures["requests_per_s_per_gpu"] is None
    assert figures["prefill_ttft_ms"] == pytest.approx(60.5, abs=0.1)  # the best TTFT the profile reaches
    [reason] = figures["unreachable"]
    assert reason.startswith("TTFT <= 1 ms is unreachable")


def test_capacity_with_a_missing_profile_fails_in_one_line(tmp_path) -> None:
    """A profile folder that does not exist is named in a one-line error."""
    result = planner(
        "capacity", "--profile", str(tmp_path / "none"), "--isl", "3000", "--osl", "300", "--ttft-ms", "200",
        "--itl-ms", "10",
    )  # fmt: skip
    assert result.returncode == 2
    [line] = _error_lines(result)
    assert str(tmp_path / "none") in line


def test_capacity_of_a_trace_at_mean_and_p90(profile_dir) -> None:
    """`--trace` sizes the Azure conv trace (x12) at its mean and p90 lengths with both algorithms."""
    import json

    from tests.conftest import AZURE_CONV

    result = planner(
        "capacity", "--profile", str(profile_dir), "--trace", str(AZURE_CONV),
        "--rate-scale", "12", "--ttft-ms", "500", "--itl-ms", "50", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = {(row["sizing"], row["algorithm"]): row for row in json.loads(result.stdout)}
    assert set(rows) == {(s, a) for s in ("mean", "p90") for a in ("interpolation", "engine_capacity")}
    for algorithm in ("interpolation", "engine_capacity"):
        mean, tail = rows[("mean", algorithm)], rows[("p90", algorithm)]
        assert tail["isl"] > mean["isl"] and tail["osl"] > mean["osl"]
        # longer requests: fewer requests/s per engine, so at least as many replicas at the same rate
        assert tail["prefill_rps_per_engine"] < mean["prefill_rps_per_engine"]
        assert tail["decode_replicas_peak"] >= mean["decode_replicas_peak"]
        assert mean["peak_rps"] > mean["mean_rps"]
        assert mean["prefill_replicas_peak"] >= mean["prefill_replicas_mean"]
    assert all(row["feasible"] and row["unreachable"] == [] for row in rows.values())


def test_capacity_of_a_trace_under_an_unreachable_sla_gives_no_replicas(profile_dir) -> None:
    """TTFT 1 ms / ITL 0.5 ms is out of the H200 profile's reach at any length: no row gives replicas; the table
    names the missed targets per row and the command exits 1; --json exits 0 with `feasible: false` per row."""
    import json

    from tests.conftest import AZURE_CONV

    command = (
        "capacity", "--profile", str(profile_dir), "--trace", str(AZURE_CONV), "--ttft-ms", "1", "--itl-ms", "0.5"
    )  # fmt: skip
    result = planner(*command)
    assert result.returncode == 1
    [line] = _error_lines(result)
    assert "the SLA is unreachable for 4 of 4 sizings" in line and "TTFT <= 1 ms is unreachable" in line
    rows = [row for row in result.stdout.splitlines() if row.lstrip().startswith(("mean ", "p90 "))]
    assert len(rows) == 4
    for row in rows:
        assert "+" not in row  # no "P+D" replica pair
        assert "TTFT <= 1 ms is unreachable" in row and "ITL <= 0.5 ms is unreachable" in row

    result = planner(*command, "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert len(rows) == 4
    for row in rows:
        assert row["feasible"] is False and len(row["unreachable"]) == 2
        assert row["prefill_replicas_peak"] is None and row["decode_replicas_mean"] is None
        assert row["prefill_latency_ms"] > 1 and row["decode_latency_ms"] > 0.5


def test_capacity_needs_lengths_or_a_trace(profile_dir) -> None:
    result = planner("capacity", "--profile", str(profile_dir), "--ttft-ms", "200", "--itl-ms", "10")
    assert result.returncode == 2
    [line] = _error_lines(result)
    assert "--isl" in line and "--trace" in line


# --- one behaviour for every command ----------------------------------------------------------------------------


def _record_deployments(database_url: str, tmp_path, *names: str) -> None:
    """Create managed deployments (no ticks) with the real repository."""
    from planner_core.config import load_config
    from planner_core.runtime.store import repository as repo
    from planner_core.runtime.store.db import session_factory

    config = load_config(write_config(tmp_path)).policy
    with session_factory(database_url).begin() as session:
        for name in names:
            repo.ensure_deployment(session, name, config)


def _reading_commands(tmp_path) -> dict[str, list[str]]:
    """Each command that reads a recorded deployment, with its other required arguments."""
    return {
        "history": ["history"],
        "report": ["report", "--out", str(tmp_path / "r.html")],
        "replay": ["replay", "--from", "1d"],
        "db prune": ["db", "prune", "--older-than", "30", "--dry-run"],
    }


def _without_deployment_env(env: dict[str, str]) -> dict[str, str]:
    return {"PLANNER_DEPLOYMENT": "", **env}  # empty = unset, whatever the calling shell exports


@pytest.mark.parametrize("command", ["history", "report", "replay", "db prune"])
def test_unknown_deployment_is_one_line_naming_the_known_ones(database_url, tmp_path, command) -> None:
    """Every command that reads a deployment refuses an unknown one alike: exit 2, one line listing the known."""
    _record_deployments(database_url, tmp_path, "alpha", "beta")
    args = _reading_commands(tmp_path)[command]
    result = planner(*args, "--deployment", "nope", env={"PLANNER_DATABASE_URL": database_url})
    assert result.returncode == 2, result.stdout + result.stderr
    assert _error_lines(result) == ["planner: error: --deployment = 'nope': no such deployment (known: alpha, beta)"]
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("command", ["history", "report", "replay", "db prune"])
def test_deployment_default_is_the_same_rule_everywhere(database_url, tmp_path, command) -> None:
    """No --deployment: PLANNER_DEPLOYMENT, else the only deployment recorded; several and none named is an error
    listing them (the same line from every command)."""
    args = _reading_commands(tmp_path)[command]
    env = _without_deployment_env({"PLANNER_DATABASE_URL": database_url})
    _record_deployments(database_url, tmp_path, "only")
    alone = planner(*args, env=env)
    assert alone.returncode == 0, alone.stderr
    _record_deployments(database_url, tmp_path, "other")
    several = planner(*args, env=env)
    assert several.returncode == 2
    assert _error_lines(several) == [
        "planner: error: 2 deployments recorded (known: only, other): choose one with --deployment NAME"
    ]
    named = planner(*args, env={**env, "PLANNER_DEPLOYMENT": "other"})
    assert named.returncode == 0, named.stderr
    unknown = planner(*args, env={**env, "PLANNER_DEPLOYMENT": "gone"})
    assert _error_lines(unknown) == [
        "planner: error: PLANNER_DEPLOYMENT = 'gone': no such deployment (known: only, other)"
    ]


def test_history_all_deployments(database_url, tmp_path) -> None:
    """`--all-deployments` reads every deployment where there are several (history's old default)."""
    _record_deployments(database_url, tmp_path, "alpha", "beta")
    env = _without_deployment_env({"PLANNER_DATABASE_URL": database_url})
    result = planner("history", "--all-deployments", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "no decisions"


def test_serve_and_ingest_never_guess_a_deployment(monkeypatch) -> None:
    """Commands that record take --deployment, else PLANNER_DEPLOYMENT, else `default`: never the database's only
    deployment, which may be the demo's."""
    from planner_cli.common import select_deployment

    monkeypatch.delenv("PLANNER_DEPLOYMENT", raising=False)
    assert select_deployment(None, None, records=True) == "default"
    assert select_deployment(None, "new", records=True) == "new"
    monkeypatch.setenv("PLANNER_DEPLOYMENT", "prod")
    assert select_deployment(None, None, records=True) == "prod"


@pytest.mark.parametrize("command", ["report", "history"])
def test_time_options_take_spans_in_every_command(database_url, tmp_path, command) -> None:
    """`--since 7d` means the same in `report` as in `history` and `replay` (one parser)."""
    _record_deployments(database_url, tmp_path, "demo")
    args = {"report": ["report", "--out", str(tmp_path / "r.html")], "history": ["history"]}[command]
    result = planner(*args, "--deployment", "demo", "--since", "7d", env={"PLANNER_DATABASE_URL": database_url})
    assert result.returncode == 0, result.stderr
    bad = planner(*args, "--deployment", "demo", "--since", "last week", env={"PLANNER_DATABASE_URL": database_url})
    assert _error_lines(bad) == [
        "planner: error: --since = 'last week': expected an ISO 8601 time (2024-05-01T12:00Z) or a span back from "
        "now (90m, 12h, 7d)"
    ]


def test_every_option_has_help_and_shows_its_default() -> None:
    """Every option of every command, at every level, has help text; set defaults are shown in it."""
    import argparse

    from planner_cli.main import build_parser
    from planner_cli.parser import walk_parsers

    parsers = list(walk_parsers(build_parser()))
    assert len(parsers) > 15
    missing = [
        f"{parser.prog} {'/'.join(action.option_strings) or action.dest}"
        for parser in parsers
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction) and not (action.help or "").strip()
    ]
    assert missing == []
    helps = {parser.prog: " ".join(parser.format_help().split()) for parser in parsers}
    history_format = "table (a line per decision, cells cut to 40 characters, its why in full on the line below), "
    assert f"{history_format}CSV or JSON (default: table)" in helps["planner history"]
    assert "(default: 9400)" in helps["planner sim-exporter"]
    assert "random seed of the synthetic metrics; range [0, 4294967295] (default: 0)" in helps["planner fpm-publish"]
    assert "(default: 5000)" in helps["planner db prune"]
    assert "(default: None)" not in " ".join(helps.values())
    assert "(default: False)" not in " ".join(helps.values())


@pytest.mark.parametrize(
    "args",
    [["db", "url", "--older-than", "3"], ["db", "stop", "--dry-run"], ["history", "--no-such-option"]],
    ids=["prune-option-on-url", "prune-flag-on-stop", "unknown-option"],
)
def test_unknown_options_are_refused_in_one_line(args) -> None:
    """An option a command does not take exits 2 with one line, before anything runs."""
    result = planner(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("planner: error: unrecognized arguments: ")


def test_every_numeric_option_has_a_range_in_its_help() -> None:
    """Every int or float option of every command converts through `Bounded` and states its range in its help;
    a numeric option missing from planner_cli/ranges.py fails the parser's construction."""
    import argparse

    from planner_cli.main import build_parser
    from planner_cli.parser import walk_parsers
    from planner_cli.ranges import Bounded, bound_numeric_options

    numeric = 0
    for parser in walk_parsers(build_parser()):
        for action in parser._actions:
            assert action.type not in (int, float), f"{parser.prog} {action.dest}: unbounded"
            if isinstance(action.type, Bounded):
                numeric += 1
                assert f"range {action.type.bounds}" in action.help, f"{parser.prog} {action.dest}"
    assert numeric >= 100  # every command's numbers (111 when written)
    stray = argparse.ArgumentParser(prog="planner stray")
    stray.add_argument("--unlisted-number", type=float)
    with pytest.raises(LookupError, match="--unlisted-number: a numeric option needs its range"):
        bound_numeric_options(stray)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["demo", "--rate-scale", "nan"], "argument --rate-scale: nan is not in (0, 1000]"),
        (["demo", "--rate-scale", "100000"], "argument --rate-scale: 100000 is not in (0, 1000]"),
        (["demo", "--max-windows", "0"], "argument --max-windows: 0 is not in [1, 1000000]"),
        (["capacity", "--ttft-ms", "inf"], "argument --ttft-ms: inf is not in (0, 3600000]"),
        (["bench", "--max-gpu-budget", "1.5"], "argument --max-gpu-budget: '1.5' is not an integer"),
    ],
)
def test_numbers_out_of_range_are_refused_in_one_line(args: list[str], error: str) -> None:
    result = planner(*args)
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith(f"planner: error: {error} (see `planner ")


def test_demo_refuses_what_the_machine_cannot_carry_before_starting(tmp_path) -> None:
    """A rate scale within range but beyond the trace, or floors no simulator can hold with no GPU ceiling: one
    line, status 2, in seconds, and no database or Prefect server started (no embedded Postgres, no Prefect
    database in the data folder)."""
    env = {"PLANNER_DATA_DIR": str(tmp_path / "data")}
    scaled = planner("demo", "--rate-scale", "1000", env=env)
    assert scaled.returncode == 2
    [line] = scaled.stderr.splitlines()
    assert line.startswith("planner: error: --rate-scale = 1000: ") and "more than a run carries (2000000)" in line
    config = write_config(tmp_path, min_endpoint=10000, max_gpu_budget=-1)
    floors = planner("demo", "--config", str(config), env=env)
    assert floors.returncode == 2
    assert floors.stderr.splitlines() == [
        f"planner: error: {config}: field 'min_endpoint' = 10000: the floors hold the demo's simulated cluster at "
        "20000 engines, more than it carries (1000)"
    ]
    data = tmp_path / "data"
    assert not (data / "pg").exists() and not list(data.rglob("*.db"))


def test_a_runtime_setting_out_of_range_is_one_line() -> None:
    result = planner("db", "url", env={"PLANNER_PROMETHEUS_TIMEOUT_S": "nan"})
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "planner: error: RuntimeSettings: PLANNER_PROMETHEUS_TIMEOUT_S = 'nan': Input should be a finite number"
    ]


def test_version_is_the_installed_distribution() -> None:
    from importlib.metadata import version

    result = planner("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"planner {version('llm-planner')}\n"


def _complete(script: str, *words: str) -> list[str]:
    """What bash completes after `words` (the last one being typed) with the generated script loaded."""
    line = " ".join(f"'{w}'" for w in words)
    call = f'COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _planner_complete; printf "%s\\n" "${{COMPREPLY[@]}}"'
    program = f"{script}\n{call}"
    result = subprocess.run(["bash", "--norc", "-c", program], capture_output=True, text=True, timeout=30, check=True)
    return [word for word in result.stdout.splitlines() if word]


def test_bash_completion_from_the_parser_tree() -> None:
    """`planner completion bash` completes commands, nested actions, options and option choices."""
    result = planner("completion", "bash")
    assert result.returncode == 0, result.stderr
    script = result.stdout
    assert "complete -o default -F _planner_complete planner" in script
    assert {"db", "history", "report", "completion", "--version"} <= set(_complete(script, "planner", ""))
    assert _complete(script, "planner", "db", "") == ["url", "upgrade", "stop", "prune", "-h", "--help"]
    assert set(_complete(script, "planner", "db", "prune", "--d")) == {
        "--deployment",
        "--dry-run",
        "--drop-partitions-older-than",
    }
    assert _complete(script, "planner", "history", "--format", "") == ["table", "csv", "json"]
    assert _complete(script, "planner", "history", "--deployment", "x", "--f") == ["--format"]
    assert _complete(script, "planner", "completion", "") == ["bash", "zsh", "-h", "--help"]


def test_zsh_completion_loads_the_same_through_bashcompinit() -> None:
    result = planner("completion", "zsh")
    assert result.returncode == 0, result.stderr
    assert "autoload -U +X bashcompinit && bashcompinit" in result.stdout
    assert "complete -o default -F _planner_complete planner" in result.stdout
    assert planner("completion", "fish").returncode == 2


def test_no_runtime_dir_warning_without_xdg_runtime_dir() -> None:
    """Without XDG_RUNTIME_DIR (usual in containers) the embedded database's start says nothing on stderr about
    it: platformdirs' two-line RuntimeDirWarning is silenced at the CLI entry."""
    import shutil
    import tempfile

    data_dir = tempfile.mkdtemp(prefix="pcx", dir="/tmp")  # short: unix socket paths are limited
    env = {key: value for key, value in os.environ.items() if key not in ("XDG_RUNTIME_DIR", "PLANNER_DATABASE_URL")}
    env["PLANNER_DATA_DIR"] = data_dir
    try:
        result = subprocess.run(
            [sys.executable, "-m", "planner_cli.main", "db", "url"],
            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert "RuntimeDirWarning" not in result.stderr and "XDG_RUNTIME_DIR" not in result.stderr
        assert result.stderr.startswith('psql "postgresql://')
    finally:
        subprocess.run(
            [sys.executable, "-m", "planner_cli.main", "db", "stop"], cwd=REPO_ROOT, env=env, timeout=60, check=False
        )
        shutil.rmtree(data_dir, ignore_errors=True)


def test_sigusr1_prints_where_a_command_waits_and_it_goes_on() -> None:
    """`kill -USR1` on a command that seems stuck: every thread's stack on stderr, and the command carries on to
    its own end (here: a publisher waiting 10 s for an ingest that never comes)."""
    import signal
    import subprocess
    import time

    process = subprocess.Popen(
        [sys.executable, "-m", "planner_cli", "fpm-publish", "--connect", "tcp://127.0.0.1:9", "--seconds", "1"],
        stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT,
    )  # fmt: skip

    def catches_sigusr1() -> bool:  # registered (else SIGUSR1 would end the process): the kernel's caught mask
        with open(f"/proc/{process.pid}/status") as status:
            mask = next(line for line in status if line.startswith("SigCgt:")).split()[1]
        return bool(int(mask, 16) >> (signal.SIGUSR1 - 1) & 1)

    deadline = time.monotonic() + 60
    while not catches_sigusr1():
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.05)
    time.sleep(1.0)  # on its way to, or in, the wait for a subscriber (10 s)
    process.send_signal(signal.SIGUSR1)
    _, stderr = process.communicate(timeout=60)
    assert "most recent call first" in stderr and 'File "' in stderr  # a stack, wherever the command was
    assert process.returncode == 2 and "no ingest subscribed within 10 s" in stderr.splitlines()[-1]


def test_a_sigterm_unwinds_like_ctrl_c_so_finally_blocks_run(tmp_path) -> None:
    """`stop_like_ctrl_c` (planner live, planner chaos): a SIGTERM raises KeyboardInterrupt in the command, so the
    `finally` that stops what it started runs; without it the process dies with the finally skipped."""
    marker = tmp_path / "cleaned-up"
    script = (
        "import os, signal, time\n"
        "from planner_cli.common import stop_like_ctrl_c\n"
        "stop_like_ctrl_c()\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(30)\n"
        "finally:\n"
        f"    open({str(marker)!r}, 'w').write('stopped')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert "KeyboardInterrupt" in result.stderr and marker.read_text() == "stopped"


def test_a_stop_that_lands_during_the_first_stops_cleanup_still_exits_130(monkeypatch, capsys) -> None:
    """The command interrupted, and interrupted again while `main` closes its database pools: exit 130 with one
    line, not a KeyboardInterrupt escaping `main` (the process then dies of SIGINT, -2)."""
    import argparse

    from planner_cli import main as cli

    def interrupted(_args: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    parser = argparse.ArgumentParser()
    parser.set_defaults(func=interrupted)

    def interrupted_again() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    monkeypatch.setattr(cli, "dispose_engines", interrupted_again)
    assert cli.main([]) == 130
    assert capsys.readouterr().err == "planner: interrupted\n"


def test_a_signal_re_sent_after_the_handler_was_put_back_does_not_break_the_stopping(tmp_path) -> None:
    """A library may put back the handler it found (ours) while the interrupt unwinds through it and re-send a
    signal it caught, as Prefect's flow engine does with SIGTERM. The stopping already under way goes on: the command
    exits 130 with one line, not killed by a second KeyboardInterrupt after it (the demo's SIGTERM test saw status -2
    after "planner: interrupted"; without the fix this test dies the same way)."""
    script = (
        "import os, signal, sys, time\n"
        "from planner_cli.common import stop_like_ctrl_c\n"
        "stop_like_ctrl_c()\n"
        "ours = signal.getsignal(signal.SIGTERM)\n"
        "try:\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(30)\n"
        "    finally:\n"
        "        signal.signal(signal.SIGTERM, ours)  # what the flow engine does on its way out\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(0.5)\n"
        "except KeyboardInterrupt:\n"
        "    print('planner: interrupted', file=sys.stderr)\n"
        "    signal.signal(signal.SIGTERM, ours)  # put back once more, and a signal after the stopping\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(0.5)\n"
        "    sys.exit(130)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 130, result.stderr
    assert result.stderr.strip() == "planner: interrupted"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["demo", "--max-windows", "0"], "argument --max-windows: 0 is not in [1, 1000000]"),
        (["demo", "--rate-scale", "-2"], "argument --rate-scale: -2 is not in (0, 1000]"),
        (["demo", "--startup-s", "nan?"], "argument --startup-s: 'nan?' is not a number"),
        (
            ["bench", "--trace", "t.csv", "--throughput-interval-s", "0"],
            "argument --throughput-interval-s: 0 is not in [1, 86400]",
        ),
        (["bench", "--trace", "t.csv", "--compress", "0"], "argument --compress: 0 is not in (0, 1000]"),
    ],
    ids=["demo-max-windows", "demo-rate-scale", "demo-startup", "bench-interval", "bench-compress"],
)
def test_numbers_out_of_range_are_refused_before_anything_is_recorded(database_url, args, message) -> None:
    """A number out of its range is refused while the arguments are parsed: exit 2, one line naming the flag and
    the value, and no deployment recorded (the demo used to record one, then fail 50 s later)."""
    result = planner(*args, env={"PLANNER_DATABASE_URL": database_url})
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith(f"planner: error: {message}"), line
    with psycopg.connect(to_libpq_uri(database_url)) as conn:
        assert conn.execute("SELECT count(*) FROM deployments").fetchone()[0] == 0


@pytest.mark.parametrize("flag", ["--json", "--html", "--record"])
def test_bench_output_into_a_missing_folder_is_refused_before_the_run(tmp_path, flag) -> None:
    """`bench --json missing/rows.json` is one line before the policies are sized (it used to fail after the run)."""
    out = tmp_path / "missing" / "rows.json"
    result = planner("bench", "--trace", "planner_core/data/traces/synthetic_trace.jsonl", flag, str(out))
    assert result.returncode == 2
    assert _error_lines(result) == [f"planner: error: {flag} {out}: folder {out.parent} does not exist"]
    assert "sizing the policies" not in result.stderr


def test_keda_scaler_refuses_a_deployment_that_is_not_recorded(database_url, tmp_path) -> None:
    """`keda-scaler --deployment nope` would serve nothing on every KEDA poll: refused at start, naming the known."""
    _record_deployments(database_url, tmp_path, "alpha")
    result = planner("keda-scaler", "--deployment", "nope", "--port", "0", env={"PLANNER_DATABASE_URL": database_url})
    assert result.returncode == 2
    assert _error_lines(result) == ["planner: error: --deployment = 'nope': no such deployment (known: alpha)"]
    assert "KEDA external scaler on" not in result.stderr


_CANNOT_WORK = {
    "missing-profile": (
        {"profile_results_dir": "/nonexistent/profile"},
        "field 'profile_results_dir' = '/nonexistent/profile': no such folder /nonexistent/profile",
    ),
    "unreachable-ttft": (
        {"ttft_ms": 5},
        "field 'ttft_ms' = 5: unreachable, the profile's best TTFT for its shortest request is 19.5 ms at batch 1",
    ),
    "unreachable-itl": (
        {"itl_ms": 1},
        "field 'itl_ms' = 1: unreachable, the profile's best ITL for its shortest request is ",
    ),
}


@pytest.mark.parametrize("problem", list(_CANNOT_WORK))
@pytest.mark.parametrize(
    "command",
    [["serve", "--port", "0"], ["deployments", "add", "member"], ["demo"]],
    ids=["serve", "deployments-add", "demo"],
)
def test_a_config_that_cannot_work_is_refused_alike_by_every_command(database_url, tmp_path, command, problem):
    """A missing profile folder or an SLA the profile cannot reach: exit 2, the same one line from every command
    that loads a config, before a Prefect server starts or anything is recorded (serve used to start and record
    `model_not_ready` every minute; the demo to run at 0 %)."""
    overrides, message = _CANNOT_WORK[problem]
    config = write_config(tmp_path, **overrides)
    result = planner(*command, "--config", str(config), env={"PLANNER_DATABASE_URL": database_url})
    assert result.returncode == 2, result.stderr
    assert _error_lines(result)[0].startswith(f"planner: error: {config}: {message}")
    assert "Prefect" not in result.stderr
    with psycopg.connect(to_libpq_uri(database_url)) as conn:
        assert conn.execute("SELECT count(*) FROM deployments").fetchone()[0] == 0


def test_demo_refuses_an_sla_the_traces_mean_request_cannot_meet(database_url, tmp_path) -> None:
    """TTFT 25 ms is within reach of the shortest prompt (19.5 ms) but not of the conversation trace's mean one:
    the demo, which knows its trace, refuses it rather than run at 0 %."""
    config = write_config(tmp_path, ttft_ms=25)
    result = planner("demo", "--config", str(config), env={"PLANNER_DATABASE_URL": database_url})
    assert result.returncode == 2
    [line] = _error_lines(result)
    assert line.startswith(
        f"planner: error: {config}: field 'ttft_ms' = 25: unreachable, the profile's best TTFT for the trace's mean "
        "request (ISL 1"
    ), line


def test_profile_and_live_write_under_planner_data_dir_by_default(monkeypatch, tmp_path) -> None:
    """`profile --out` and `live --out` default to PLANNER_DATA_DIR/profile and /live, with the database and the
    reports (they were `.planner/...` of the working folder whatever PLANNER_DATA_DIR said); a flag still wins."""
    from planner_cli.common import data_subfolder

    monkeypatch.setenv("PLANNER_DATA_DIR", str(tmp_path / "data"))
    assert data_subfolder(None, "profile") == tmp_path / "data" / "profile"
    assert data_subfolder(None, "live") == tmp_path / "data" / "live"
    assert data_subfolder(tmp_path / "mine", "live") == tmp_path / "mine"
    for command in ("profile", "live"):
        assert f"PLANNER_DATA_DIR/{command}" in " ".join(planner(command, "--help").stdout.split())


def test_replay_leaves_no_connection_to_the_garbage_collector(database_url, tmp_path, profile_dir) -> None:
    """`planner replay` closes its pooled database connections as it ends: no ResourceWarning at exit (it printed
    two, one per connection of its snapshot reader and its writer)."""
    import datetime as dt

    from planner_core.domain import Loop, TrafficObservation
    from planner_core.runtime.service import load_context, run_tick
    from planner_core.runtime.store.db import get_engine

    ctx = load_context(database_url, "replayed", write_config(tmp_path))
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    run_tick(ctx, Loop.THROUGHPUT, at, TrafficObservation(duration_s=60, num_req=600, isl=3000, osl=300))
    get_engine(database_url).dispose()
    result = subprocess.run(
        [sys.executable, "-W", "always::ResourceWarning", "-m", "planner_cli.main", "replay", "--deployment",
         "replayed", "--from", "2025-12-31", "--to", "2026-01-02"],
        cwd=REPO_ROOT, env={**os.environ, "PLANNER_DATABASE_URL": database_url}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "1 identical, 0 differing" in result.stdout
    assert "ResourceWarning" not in result.stderr, result.stderr


@pytest.mark.parametrize("command", [["serve"], ["keda-scaler", "--host", "127.0.0.1"]], ids=["serve", "keda-scaler"])
def test_a_port_that_is_taken_is_one_line_at_once(database_url, command) -> None:
    """A port another socket listens on: exit 2 with one line naming the flag and the port, before any server
    starts (serve used to print nothing for two minutes, then `cannot join thread before it is started`)."""
    import socket
    import time

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        result = planner(*command, "--port", str(port), env={"PLANNER_DATABASE_URL": database_url})
        elapsed_s = time.monotonic() - started
    assert result.returncode == 2
    assert _error_lines(result) == [
        f"planner: error: --port {port}: cannot listen on 127.0.0.1:{port} (Address already in use)"
    ]
    assert "Prefect UI" not in result.stderr and "KEDA external scaler on" not in result.stderr
    assert elapsed_s < 30  # the interpreter's start and imports; the Prefect health check alone waited 120 s


def test_a_port_out_of_range_is_refused_while_parsing() -> None:
    result = planner("serve", "--port", "70000")
    assert result.returncode == 2
    assert result.stderr.startswith("planner: error: argument --port: 70000 is not in [0, 65535]")


def test_bench_says_what_the_oracle_will_search() -> None:
    """The line `bench` prints while it sizes the policies: the whole trace only when a row needs it, the first
    window alone for the planners' starting size, nothing with `--initial min` and no oracle row."""
    from pathlib import Path

    from planner_cli.bench import _oracle_work
    from planner_core.lab.sim.benchmark import BenchRequest

    trace, profile = Path("t.csv"), Path("profile")
    whole = "the oracle simulates every window at several sizes"
    assert _oracle_work(BenchRequest(trace=trace, profile=profile)) == whole  # the default policies
    assert _oracle_work(BenchRequest(trace=trace, profile=profile, policies=("planner", "static-best"))) == whole
    assert _oracle_work(BenchRequest(trace=trace, profile=profile, policies=("planner",))) == (
        "no oracle row: the oracle searches the first window alone, the planners' starting size"
    )
    assert _oracle_work(BenchRequest(trace=trace, profile=profile, policies=("planner",), initial="min")) == (
        "no oracle row and --initial min: no oracle search"
    )
