"""The repository carries what it needs: the shipped data matches its checksums and its README, and no tracked
file names a folder outside the repository (a clone anywhere, or an installed package, must find everything)."""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

from planner_core import data
from tests.conftest import REPO_ROOT

# Folders of one machine (home and work trees) and the team's library beside the checkout. Built from pieces so
# that this file does not match itself.
_OUTSIDE = re.compile(
    r"""(?:["'`\s(=]|^)/(?:"""
    + "work|home|root|Users|mnt"
    + r""")/[\w.-]"""
    + r"|\.\./"
    + "shared"
    + r"\b"
    + r"|parents\[\d\]\s*/\s*[\"']"
    + "shared"
    + r"[\"']"
    + r"|\.parent\s*/\s*[\"']"
    + "shared"
    + r"[\"']",
    re.MULTILINE,
)


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True, text=True
    ).stdout.split("\0")
    files = []
    for name in filter(None, listed):
        path = REPO_ROOT / name
        if path.suffix in {".npz", ".png"} or not path.is_file():
            continue
        files.append(path)
    return files


def test_no_tracked_file_names_a_folder_outside_the_repository() -> None:
    # The shipped data are byte-for-byte copies of third-party files (their checksums are checked below); what
    # their rows say (aiconfigurator's sample names its authors' machines) is data, never a path this project uses.
    copies = {data.DATA_DIR / name for name in _checksums()}
    offenders = []
    for path in (path for path in _tracked_text_files() if path not in copies):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for match in _OUTSIDE.finditer(text):
            line_no = text.count("\n", 0, match.start()) + 1
            offenders.append(f"{path.relative_to(REPO_ROOT)}:{line_no}: {match.group(0).strip()!r}")
    assert not offenders, "paths outside the repository:\n" + "\n".join(offenders)


def test_the_outside_path_check_catches_what_it_is_for() -> None:
    """The pattern above must find the kinds of path it exists to refuse (else the test above cannot fail)."""
    catches = ['P = "/' + "work/" + 'shared/perf"', "x: ../" + "shared/traces", 'ROOT.parent / "' + "shared" + '"']
    passes = ['url = "http://host/' + 'work/x"', "planner_core/data/traces", '"/' + 'tmp/x"']
    assert all(_OUTSIDE.search(text) for text in catches)
    assert not any(_OUTSIDE.search(text) for text in passes)


def _checksums() -> dict[str, str]:
    sums = {}
    for line in data.CHECKSUMS_FILE.read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        sums[name.removeprefix("./")] = digest
    return sums


def test_shipped_data_matches_its_checksums() -> None:
    sums = _checksums()
    on_disk = {
        str(path.relative_to(data.DATA_DIR))
        for path in data.DATA_DIR.rglob("*")
        if path.is_file()
        and path.parts[len(data.DATA_DIR.parts)] != "licenses"
        and path.name not in {"README.md", "SHA256SUMS", "__init__.py"}
        and "__pycache__" not in path.parts
    }
    assert on_disk == set(sums), "files and SHA256SUMS disagree"
    for name, digest in sums.items():
        assert hashlib.sha256((data.DATA_DIR / name).read_bytes()).hexdigest() == digest, name


def test_every_shipped_file_has_a_source_and_licence_in_the_readme() -> None:
    readme = (data.DATA_DIR / "README.md").read_text()
    for name in _checksums():
        # a row names the file, or its folder for a profile's two NPZ files
        folder = name.split("/selected_")[0]
        assert name in readme or folder in readme, f"{name}: not in planner_core/data/README.md"
    for licence in (data.DATA_DIR / "licenses").iterdir():
        assert licence.name in readme, f"{licence.name}: no file in the README names this licence"


def test_the_named_paths_exist() -> None:
    named = [value for key, value in vars(data).items() if key.isupper() and isinstance(value, Path)]
    assert len(named) >= 10
    missing = [str(path) for path in named if not path.exists()]
    assert not missing, missing
