"""The example out-of-process plugin (`examples/grpc-plugin/`) in `planner demo`: it changes the decisions through
gRPC, and the run replays identically with the plugin process stopped."""

from __future__ import annotations

import datetime as dt
import socket
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import yaml

from planner_core.data import DEFAULT_CONFIG
from planner_core.runtime.store.db import to_libpq_uri
from tests.conftest import REPO_ROOT
from tests.test_flows import _run_demo, prefect_api_url  # noqa: F401 - the session's Prefect server fixture

pytestmark = pytest.mark.prefect

EXAMPLE = REPO_ROOT / "examples" / "grpc-plugin"
NUM_WINDOWS = 5


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _config(directory: Path, name: str, external_plugins: list[dict]) -> Path:
    """The recommended policy (the demo's default), with these external plugins."""
    body = yaml.safe_load(DEFAULT_CONFIG.read_text())
    body["profile_results_dir"] = str((DEFAULT_CONFIG.parent / body["profile_results_dir"]).resolve())
    if external_plugins:
        body["scheduling"] = {"external_plugins": external_plugins}
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def _targets(url: str, deployment: str) -> list[tuple]:
    """Every throughput tick's decision: (scheduled_at, reason, prefill target, decode target)."""
    with psycopg.connect(to_libpq_uri(url)) as conn:
        return conn.execute(
            """SELECT t.scheduled_at, t.reason, d.target_prefill, d.target_decode
                 FROM ticks t JOIN deployments dep ON dep.id = t.deployment_id
                 LEFT JOIN decisions d ON d.tick_id = t.id
                WHERE dep.name = %s ORDER BY t.scheduled_at""",
            (deployment,),
        ).fetchall()


def test_the_example_plugin_changes_demo_decisions_and_the_run_replays_without_it(
    prefect_api_url,  # noqa: F811
    database_url: str,
    azure_conv_trace: Path,
    tmp_path: Path,
) -> None:
    from planner_core.runtime.replay import replay

    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLE / "llm_planner_spot_price.py"), "--listen", f"127.0.0.1:{port}",
         "--price", "3.2", "--max-price", "2.5", "--max-prefill", "3"],
        stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT,
    )  # fmt: skip
    try:
        assert process.stdout is not None and "serving on" in process.stdout.readline()
        endpoint = f"grpc://127.0.0.1:{port}"
        with_plugin = _config(
            tmp_path,
            "spot-price",
            [
                {"plugin_id": "spot_price_feed", "plugin_type": "observe", "endpoint": endpoint},
                {"plugin_id": "spot_price_cap", "plugin_type": "constrain", "endpoint": endpoint},
            ],
        )
        _run_demo(database_url, with_plugin, azure_conv_trace, "with-plugin", max_windows=NUM_WINDOWS)
    finally:
        process.kill()
        process.wait(timeout=10)
    _run_demo(database_url, _config(tmp_path, "plain", []), azure_conv_trace, "plain", max_windows=NUM_WINDOWS)

    plain, capped = _targets(database_url, "plain"), _targets(database_url, "with-plugin")
    assert len(plain) == len(capped) == NUM_WINDOWS
    # the demo starts at the oracle's 4 prefill engines; the plugin's ceiling (price 3.2 > 2.5) takes it to 3
    assert all(prefill is None or prefill > 3 for _, _, prefill, _ in plain)
    assert capped[0][1:3] == ("scale", 3)
    assert [row for row in capped if row[2] is not None and row[2] > 3] == []
    assert capped != plain

    # every tick saw the price through OBSERVE and the cap through CONSTRAIN, recorded with the tick
    with psycopg.connect(to_libpq_uri(database_url)) as conn:
        steps = conn.execute(
            """SELECT ts.step, ts.reason, ts.value FROM tick_steps ts JOIN ticks t ON t.id = ts.tick_id
                 JOIN deployments d ON d.id = t.deployment_id
                WHERE d.name = 'with-plugin' AND ts.step IN ('observation:spot_price_usd_per_gpu_hour',
                                                            'constrain:spot_price_cap')
                  AND ts.reason IN ('observed', 'plugin_overrides')""",
        ).fetchall()
    assert sorted(set(steps)) == [
        ("constrain:spot_price_cap", "plugin_overrides", None),
        ("observation:spot_price_usd_per_gpu_hour", "observed", 3.2),
    ]
    assert len(steps) == 2 * NUM_WINDOWS

    # the plugin process is gone: replay reads its recorded answers
    start = capped[0][0] - dt.timedelta(seconds=1)
    summary = replay(database_url, "with-plugin", start, capped[-1][0] + dt.timedelta(seconds=1))
    assert (summary.num_ticks, summary.num_identical) == (NUM_WINDOWS, NUM_WINDOWS), summary.differences

