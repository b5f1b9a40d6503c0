"""A release names one version everywhere: the service's package, the Python client, the Claude Code plugin, the
JS client, what MCP's initialize reports, and a heading of CHANGELOG.md (issue 51: "no changelog, tags or upgrade
notes"). docs/releasing.md says how one is cut."""
import json
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_every_package_names_the_services_version():
    from context_mode_client import __version__
    from service.mcp.dispatch import SERVER_VERSION
    version = _version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)
    assert tomllib.loads((ROOT / "clients/python/pyproject.toml").read_text())["project"]["version"] == version
    assert json.loads((ROOT / "clients/python/.claude-plugin/plugin.json").read_text())["version"] == version
    assert json.loads((ROOT / "clients/js/package.json").read_text())["version"] == version
    assert __version__ == version and SERVER_VERSION == version


def test_the_changelog_heads_the_version_with_its_date_and_upgrade_notes():
    text = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    released = [h for h in headings if h != "Unreleased"]
    assert headings[:1] in (["Unreleased"], released[:1])          # (only what is not released yet above it)
    m = re.fullmatch(r"(\d+\.\d+\.\d+) \((\d{4}-\d{2}-\d{2})\)", released[0])
    assert m and m.group(1) == _version()
    section = text.split(f"## {released[0]}", 1)[1].split("\n## ", 1)[0]
    assert "### Upgrade notes" in section
