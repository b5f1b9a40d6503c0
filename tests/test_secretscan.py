"""The one secret detector (clients/python/context_mode_client/secretscan.py, issue 39 finding 5): every shape of
tests/secret_corpus.py is found and masked with its context kept, every near-miss comes back unchanged, metadata
is masked string by string, and the module runs on the client's oldest Python with nothing compiled at import.
Its speed on adversarial input is measured by bench/secretscan.py, not here."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT
from context_mode_client import masking, secretscan
from context_mode_client.client import compute_cid
from secret_corpus import NEAR_MISSES, SECRET_KEYS, SECRETS

MODULE = ROOT / "clients" / "python" / "context_mode_client" / "secretscan.py"


def test_the_corpus_is_as_large_as_promised():
    assert len({shape for shape, *_ in SECRETS}) >= 80 and len(set(NEAR_MISSES)) >= 40


@pytest.mark.parametrize("shape,text,secret", SECRETS, ids=[s[0] for s in SECRETS])
def test_every_secret_shape_is_masked_and_its_context_kept(shape, text, secret):
    masked = secretscan.mask("before\n" + text + "\nafter")
    assert secret not in masked
    assert "[REDACTED:" in masked and masked.startswith("before\n") and masked.endswith("\nafter")
    assert secretscan.first(text) is not None
    # what is around the secret stays: the text minus the secret is still there, in order
    head, _, tail = text.partition(secret)
    assert masked.find(head) >= 0 and masked.rfind(tail) >= masked.find(head)


@pytest.mark.parametrize("text", NEAR_MISSES, ids=[f"near-{i}" for i in range(len(NEAR_MISSES))])
def test_near_misses_stay_unmasked(text):
    assert secretscan.mask(text) == text
    assert secretscan.first(text) is None


def test_names_users_and_schemes_stay_so_the_text_still_says_what_was_there():
    mask = secretscan.mask
    assert mask("DB_PASSWORD=hunter2x") == "DB_PASSWORD=[REDACTED:secret_assignment]"
    assert mask('{"client_secret": "abc123456"}') == '{"client_secret": "[REDACTED:secret_assignment]"}'
    assert mask("postgres://orders:pw1234@db/x") == "postgres://orders:[REDACTED:url_password]@db/x"
    assert mask("proxy squid:Pr0xyPass@proxy:3128") == "proxy squid:[REDACTED:user_password]@proxy:3128"
    assert mask("Authorization: Bearer abcdefghij123") == "Authorization: Bearer [REDACTED:bearer_token]"
    assert mask('"Authorization": "Token 0123456789abcdef"') == '"Authorization": "Token [REDACTED:authorization]"'
    assert mask("curl -u deploy:s3cret-pw https://x") == "curl -u deploy:[REDACTED:curl-auth-user] https://x"
    assert mask("mysql -u root -pRoot_pw_1 db") == "mysql -u root -p[REDACTED:mysql_password] db"
    assert mask("https://x.example/f?sv=1&sig=abcDEF123%3D") == "https://x.example/f?sv=1&sig=[REDACTED:url_parameter]"
    assert mask("AccountName=acme;AccountKey=abc123==;EndpointSuffix=core") == \
        "AccountName=acme;AccountKey=[REDACTED:url_parameter];EndpointSuffix=core"


def test_a_private_key_goes_whole_and_a_cut_one_to_the_end():
    key = next(secret for shape, _, secret in SECRETS if shape == "pem-rsa")
    assert secretscan.mask(f"cat id_rsa\n{key}\n$ ls") == "cat id_rsa\n[REDACTED:private_key]\n$ ls"
    cut = key[: len(key) // 2]
    assert secretscan.mask("x\n" + cut) == "x\n[REDACTED:private_key]"
    putty = next(secret for shape, _, secret in SECRETS if shape == "putty")
    assert secretscan.mask(putty[:80]) == "[REDACTED:putty-private-key]"


def test_literals_go_whatever_their_shape():
    assert secretscan.mask("token is plainword-2f9c1e and more", ["plainword-2f9c1e"]) == \
        "token is [REDACTED:configured_key] and more"
    assert secretscan.mask("short", ["short"]) == "short"          # under 8 characters: no literal


@pytest.mark.parametrize("name,holds", [
    ("DB_PASSWORD", True), ("PRIVATE-TOKEN", True), ("x-api-key", True), ("passphrase", True), ("DB_PASS", True),
    ("aws_secret_access_key", True), ("auth", True), ("GITHUB_TOKEN", True), ("db_pwd", True),
    ("PWD", False), ("OLDPWD", False), ("tokenizer", False), ("max_tokens", False), ("secret_name", False),
    ("password_hint", False), ("bypass", False), ("author", False), ("session_id", False), ("cwd", False),
])
def test_secret_names(name, holds):
    assert secretscan.secret_name(name) is holds


def test_metadata_is_masked_string_by_string_keys_included():
    literal = "cms_configured-0123456789abcdefghij"
    meta = {"cwd": "/home/dev/ghp_" + "a1B2c3D4e5" * 4 + "/repo", "session_id": "4f1c2a9b-7d3e-4c1a-9b2f-0e8d7c6b5a49",
            "hook": "claude-code PostToolUse", "input": "curl -u deploy:s3cret-pw https://x",
            "nested": [{"url": "https://u:pw12345@h.example/x"}, 7, None, True],
            "AKIA" + "ABCDEFGHIJKLMNOP": "a key as a key", "note": f"uses {literal}"}
    for key in SECRET_KEYS:
        meta[key] = "abc12345"
    out = masking.mask_value(meta, [literal])
    assert out["cwd"] == "/home/dev/[REDACTED:github-pat]/repo"
    assert out["session_id"] == meta["session_id"] and out["hook"] == meta["hook"]
    assert out["input"] == "curl -u deploy:[REDACTED:curl-auth-user] https://x"
    assert out["nested"] == [{"url": "https://u:[REDACTED:url_password]@h.example/x"}, 7, None, True]
    assert out["[REDACTED:aws-access-token]"] == "a key as a key"
    assert out["note"] == "uses [REDACTED:configured_key]"
    assert all(out[key] == "[REDACTED:secret_name]" for key in SECRET_KEYS)


def test_a_masked_unit_gets_the_cid_of_what_it_stores():
    unit = {"type": "tool_output", "source": "bash_v1", "timestamp": 1_700_000_000,
            "content": "export GITHUB_TOKEN=ghp_" + "a1B2c3D4e5" * 4, "metadata": {"cwd": "/srv"}}
    unit["cid"] = compute_cid(unit["content"], unit["timestamp"], unit["source"])
    out = masking.mask_unit(unit)
    assert out["content"] == "export GITHUB_TOKEN=[REDACTED:github-pat]"
    assert out["cid"] == compute_cid(out["content"], out["timestamp"], out["source"]) != unit["cid"]
    clean = dict(unit, content="nothing secret here")
    clean["cid"] = compute_cid(clean["content"], clean["timestamp"], clean["source"])
    assert masking.mask_unit(clean) == clean


def test_importing_compiles_nothing():
    code = ("import re, sys, importlib.util\n"
            "calls = []\n_compile = re.compile\n"
            "re.compile = lambda *a, **k: calls.append(a) or _compile(*a, **k)\n"
            f"spec = importlib.util.spec_from_file_location('secretscan', {str(MODULE)!r})\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "print(len(calls), len(m._COMPILED))\n"
            "m.mask('Authorization: Bearer abcdefghij123')\n"
            "print(len(m._COMPILED))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[:2] == ["0", "0"]              # nothing at import
    assert 0 < int(out[2]) < 20               # only what that text needed


def older_pythons() -> list[str]:
    """Python 3.9 and 3.10 interpreters that run (a version manager's shim may name one it cannot start)."""
    found = [shutil.which(f"python3.{minor}") for minor in (9, 10)]
    for minor in (9, 10):
        found += sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/3.{minor}.*/bin/python")))[:1]
    return sorted({p for p in found if p and subprocess.run([p, "-c", "pass"], capture_output=True).returncode == 0})


@pytest.mark.skipif(not older_pythons(), reason="no Python 3.9 or 3.10 on this machine to run the client's oldest")
def test_the_detector_runs_on_the_clients_oldest_python():
    code = ("import importlib.util, sys\n"
            f"sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
            f"spec = importlib.util.spec_from_file_location('secretscan', {str(MODULE)!r})\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "from secret_corpus import SECRETS, NEAR_MISSES\n"
            "missed = [s for s, t, v in SECRETS if v in m.mask(t)]\n"
            "masked = [t for t in NEAR_MISSES if m.mask(t) != t]\n"
            "print(sys.version_info[:2], missed, masked)\n")
    for python in older_pythons():
        rv = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
        assert rv.returncode == 0, rv.stderr
        assert rv.stdout.strip().endswith("[] []"), (python, rv.stdout)


def test_metadata_read_in_one_pass_masks_as_string_by_string_would():
    """mask_value reads a value's strings joined by newlines in one pass; what it masks is what masking each
    string alone masks, over every shape and near-miss of the corpus, as values and as keys."""
    def one_by_one(value):
        if isinstance(value, str):
            return secretscan.mask(value)
        if isinstance(value, list):
            return [one_by_one(v) for v in value]
        if isinstance(value, dict):
            return {secretscan.mask(k): "[REDACTED:secret_name]" if secretscan.secret_name(k) and v else one_by_one(v)
                    for k, v in value.items()}
        return value
    texts = [text for _, text, _ in SECRETS] + NEAR_MISSES
    meta = {"values": texts, "nested": [{"note": t, "n": i} for i, t in enumerate(texts)],
            **{f"key {i}: {t[:60]}": i for i, t in enumerate(texts)}}
    assert secretscan.mask_value(meta) == one_by_one(meta)
