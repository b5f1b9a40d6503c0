"""The lock files (issue 14, item 7): complete, hashed, consistent, and what `make test` installed."""
from __future__ import annotations

import re
import tomllib
from importlib import metadata

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import ROOT

LOCKS = {name: ROOT / "requirements" / f"{name}.txt" for name in ("run", "test")}


def pins(path) -> dict[str, tuple[str, int]]:
    """name -> (version, number of hashes) from a pip-compile --generate-hashes file."""
    out = {}
    text = path.read_text()
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        head = block.split("\\", 1)[0].strip()
        if not head or head.startswith("#"):
            continue
        name, _, version = head.partition("==")
        assert version, f"{path.name}: {head!r} is not pinned with =="
        out[canonicalize_name(name)] = (version.strip(), block.count("--hash=sha256:"))
    return out


def declared(extra: str | None = None) -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    client = tomllib.loads((ROOT / "clients" / "python" / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + client["dependencies"]
    if extra:
        reqs += project["optional-dependencies"][extra]
    return {canonicalize_name(Requirement(r).name) for r in reqs}


def test_every_pin_is_exact_and_hashed():
    for name, path in LOCKS.items():
        locked = pins(path)
        assert locked, name
        for pkg, (_version, hashes) in locked.items():
            assert hashes >= 1, f"{name}: {pkg} has no hash"


def test_locks_cover_pyproject_and_agree_with_each_other():
    run, test = pins(LOCKS["run"]), pins(LOCKS["test"])
    assert declared() <= set(run), declared() - set(run)
    assert declared("test") <= set(test), declared("test") - set(test)
    for pkg, (version, _) in run.items():
        assert test[pkg][0] == version, f"{pkg}: run {version}, test {test[pkg][0]}"


def test_this_environment_is_the_locked_one():
    """`make test` installs requirements/test.txt, so the suite runs on exactly the locked versions."""
    wrong = {}
    for pkg, (version, _) in pins(LOCKS["test"]).items():
        try:
            got = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            got = None
        if got != version:
            wrong[pkg] = (version, got)
    assert not wrong, f"locked vs installed: {wrong} (run `make .venv/.installed-test` after `make lock`)"


@pytest.mark.parametrize("path,needle", [
    ("Makefile", "--require-hashes -r requirements/run.txt"),
    ("Makefile", "--require-hashes -r requirements/test.txt"),
    ("Makefile", "pip-compile --quiet --generate-hashes"),
    ("Dockerfile", "--require-hashes -r requirements/run.txt"),
    (".ci/run", "make test"),
    ("README.md", "make lock"),
])
def test_every_install_path_uses_the_lock(path, needle):
    assert needle in (ROOT / path).read_text()
