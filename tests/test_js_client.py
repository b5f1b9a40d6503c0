"""The JavaScript client (clients/js) under `node --test` against a real gunicorn."""
import json
import os
import shutil
import subprocess

import pytest

from conftest import ROOT

NODE = shutil.which("node")
JS_TESTS = ROOT / "clients" / "js" / "test"


@pytest.mark.skipif(NODE is None, reason="node is not installed: the JS client was not tested")
def test_js_client_against_live_server(live_server_factory):
    server = live_server_factory(workers=1, keys={"jskey-0123456789abcdef": ("jsteam", ["push", "search", "admin"])})
    env = dict(os.environ, CONTEXT_URL=server.url, CONTEXT_API_KEY="jskey-0123456789abcdef")
    files = sorted(str(p) for p in JS_TESTS.glob("*.test.mjs"))
    assert files, "no clients/js/test/*.test.mjs found"
    rv = subprocess.run([NODE, "--test", *files], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert rv.returncode == 0, rv.stdout[-4000:] + rv.stderr[-2000:]
    assert "# skipped 0" in rv.stdout, rv.stdout[-2000:]
    assert "# fail 0" in rv.stdout


@pytest.mark.skipif(NODE is None, reason="node is not installed: the JS README was not run")
def test_js_readme_example_runs_and_finds_what_it_pushed(live_server_factory, tmp_path):
    """clients/js/README.md's example, verbatim but for the URL and the module path (issue 14)."""
    import json
    import re
    server = live_server_factory(workers=1, keys={"jskey-readme-0123456789": ("jsteam", ["push", "search"])})
    [code] = re.findall(r"```js\n(.*?)```", (ROOT / "clients" / "js" / "README.md").read_text(), flags=re.S)
    code = code.replace('"./context-mode.mjs"', json.dumps((ROOT / "clients" / "js" / "context-mode.mjs").as_uri()))
    code = code.replace('"http://localhost:5000"', json.dumps(server.url))
    script = tmp_path / "readme.mjs"
    script.write_text(code + "\nconsole.log(JSON.stringify({ results, context, hits }));\n")
    env = dict(os.environ, CONTEXT_API_KEY="jskey-readme-0123456789")
    rv = subprocess.run([NODE, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert rv.returncode == 0, rv.stderr
    out = json.loads(rv.stdout.strip().splitlines()[-1])
    assert out["results"] and "ORD-7890" in out["results"][0]["content"]
    assert "ORD-7890" in out["context"]
    assert out["hits"] and "ORD-7890" in out["hits"][0]["text"]


TS = ROOT / ".ci" / "node_modules_ts"


@pytest.fixture(scope="module")
def tsc():
    """TypeScript's compiler and Node's types (.ci/setup.d/typescript.sh installs them for CI; installed here
    the same way when missing); skips without npm or the registry."""
    binary = TS / "node_modules" / ".bin" / "tsc"
    if not binary.exists() and shutil.which("npm"):
        subprocess.run(["npm", "install", "--prefix", str(TS), "--no-audit", "--no-fund", "--loglevel=error",
                        "typescript@5.9.3", "@types/node@20.19.43"], capture_output=True, timeout=300)
    if not binary.exists():
        pytest.skip("TypeScript could not be installed (npm typescript@5): the declarations were not checked")
    return binary


def test_the_typescript_declarations_type_the_readme_and_catch_misuse(tsc, tmp_path):
    """clients/js ships context-mode.d.mts (package.json "types"): the README's example type-checks under
    --strict against it, and a wrong use (a CID taken as a number, a push without its options' `source`) does not."""
    import re
    for name in ("context-mode.mjs", "context-mode.d.mts"):
        shutil.copy(ROOT / "clients" / "js" / name, tmp_path / name)
    [code] = re.findall(r"```js\n(.*?)```", (ROOT / "clients" / "js" / "README.md").read_text(), flags=re.S)
    (tmp_path / "readme.mts").write_text(code + "\nexport {};\n")
    (tmp_path / "wrong.mts").write_text(
        'import { ContextModeClient, makeUnit } from "./context-mode.mjs";\n'
        'const cm = new ContextModeClient();\n'
        'const n: number = (await cm.push("x", { source: "s" })).cid;\n'
        'await makeUnit("x", { type: "tool_output" });\n'
        'export {};\n')
    args = [str(tsc), "--noEmit", "--strict", "--module", "nodenext", "--target", "es2022",
            "--typeRoots", str(TS / "node_modules" / "@types"), "--types", "node"]

    def check(name):
        return subprocess.run([*args, name], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    good = check("readme.mts")
    assert good.returncode == 0, good.stdout
    bad = check("wrong.mts")
    assert "wrong.mts(3," in bad.stdout and "wrong.mts(4," in bad.stdout, bad.stdout
    assert json.loads((ROOT / "clients" / "js" / "package.json").read_text())["types"] == "./context-mode.d.mts"
