"""One licence, Apache-2.0, said the same everywhere a package is made from (issue 51): the repository's LICENSE,
the service's and the Python client's pyproject.toml (SPDX, PEP 639) and the JavaScript client's package.json, each
package with the same text beside it."""
import json
import tomllib

from conftest import ROOT


def test_every_package_says_apache_2_and_ships_the_same_text():
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "END OF TERMS AND CONDITIONS" in text
    for folder in (ROOT, ROOT / "clients" / "python"):
        project = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
        assert (project["license"], project["license-files"]) == ("Apache-2.0", ["LICENSE"])
        assert (folder / "LICENSE").read_text() == text
    assert json.loads((ROOT / "clients" / "js" / "package.json").read_text())["license"] == "Apache-2.0"
    assert (ROOT / "clients" / "js" / "LICENSE").read_text() == text
