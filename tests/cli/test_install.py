"""`pip install .` (not editable) gives a working `planner`: the wheel carries the data, configs and migrations,
and the installed command runs the demo from a folder that holds nothing of the repository."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # No build isolation: the test extra installs the build backend, so nothing is fetched at test time.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(out), "."],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("llm_planner-*.whl")
    return built


def test_the_wheel_carries_data_configs_and_migrations(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = [
        "planner_core/data/profiles/H200_TP1P_TP1D/selected_prefill_interpolation/raw_data.npz",
        "planner_core/data/traces/AzureLLMInferenceTrace_conv.csv",
        "planner_core/data/SHA256SUMS",
        "planner_core/configs/policies/planner.yaml",
    ]
    missing = [name for name in shipped if name not in names]
    assert not missing, missing
    assert any(name.endswith("migrations/alembic.ini") for name in names)
    assert sum("migrations/versions/" in name for name in names) >= 6
    assert not any(name.startswith("tests/") for name in names)


def test_the_installed_planner_runs_the_demo_from_any_folder(wheel: Path, tmp_path: Path) -> None:
    """Installed into its own folder (dependencies from this environment), run from an empty folder: the demo
    finds its trace, config, profile and migrations in the package and writes only under the data folder."""
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PLANNER_", "PREFECT_API_URL"))}
    env |= {"PYTHONPATH": str(site), "PREFECT_HOME": str(tmp_path / "prefect")}
    probe = subprocess.run(
        [sys.executable, "-c", "import planner_core; print(planner_core.__file__)"],
        cwd=cwd, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert probe.stdout.strip().startswith(str(site)), probe.stdout  # the installed copy, not the checkout
    planner = str(site / "bin" / "planner")
    try:
        demo = subprocess.run(
            [planner, "demo", "--max-windows", "3"], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
        )
    finally:  # the demo leaves its embedded Postgres running for later commands: stop it
        subprocess.run([planner, "db", "stop"], cwd=cwd, env=env, capture_output=True, timeout=60, check=False)
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "ticks recorded 3" in demo.stdout, demo.stdout
    assert (cwd / ".planner" / "reports").is_dir()  # reports beside the database, not inside the package
    assert not list(site.rglob("planner_reports"))
