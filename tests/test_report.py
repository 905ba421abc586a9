"""Diagnostics reports: figures from recorded ticks (pure), the page from Postgres, rendering in real Chromium."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",  # Chromium refuses to run as root with its sandbox on
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)


@pytest.fixture(scope="session")
def chromium() -> str:
    """Path of a headless-capable Chromium; installed with apt-get when missing (CI starts from a clean machine)."""
    found = shutil.which("chromium")
    if found:
        return found
    if shutil.which("apt-get") is None:
        pytest.skip("chromium is not installed and apt-get is not available to install it")
    if os.geteuid() != 0:
        pytest.skip("chromium is not installed and installing it with apt-get needs root")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"],
    ):
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if result.returncode != 0:
            pytest.fail(f"{' '.join(command)} exited {result.returncode}: {result.stderr.strip()[-2000:]}")
    found = shutil.which("chromium")
    if found is None:
        pytest.fail("apt-get installed chromium but no `chromium` is on PATH")
    return found


def rendered_dom(chromium: str, page: Path, tmp_path: Path) -> str:
    """The page's DOM after Chromium loaded it and its scripts ran (plotly draws on load)."""
    result = subprocess.run(
        [
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            "--virtual-time-budget=15000",  # let plotly's deferred drawing finish before the DOM is dumped
            "--dump-dom",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_smoke_chromium(chromium, tmp_path):
    import plotly.graph_objects as go
    page = tmp_path / "p.html"
    go.Figure(go.Scatter(x=[1, 2], y=[3, 4])).write_html(page, include_plotlyjs=True)
    dom = rendered_dom(chromium, page, tmp_path)
    assert 'class="main-svg"' in dom
