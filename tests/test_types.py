"""The type checker runs with the suite: mypy over the packages ``[tool.mypy]`` names.

The packages live in folders that are not named after them (``engine/`` is ``lamina.engine``:
pyproject.toml's ``package-dir``), which an editable install maps with an import hook that
mypy does not follow. So the check builds the ``lamina`` tree mypy expects out of symlinks to
those folders and points mypy at it: the result does not depend on how Lamina was installed.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _source_tree(at: Path) -> Path:
    """``at/lamina/<package>`` -> the repository folder of each top-level package."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for package, folder in project["tool"]["setuptools"]["package-dir"].items():
        link = at.joinpath(*package.split("."))
        if link.parent != at / "lamina":
            continue  # a subpackage: its parent's link brings it
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(ROOT / folder, target_is_directory=True)
    return at


@pytest.mark.slow
def test_mypy_passes_on_the_checked_packages(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    api = pytest.importorskip("mypy.api", reason="mypy comes with the dev extras")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    monkeypatch.setenv("MYPYPATH", str(_source_tree(tmp_path / "src")))
    args = ["--config-file", str(ROOT / "pyproject.toml"),
            "--cache-dir", os.devnull, "--show-error-codes"]
    for package in project["tool"]["mypy"]["packages"]:
        args += ["-p", package]
    stdout, stderr, status = api.run(args)
    assert status == 0, stdout + stderr
