"""Credential masking before a hook stores anything (issue 27): realistic secrets in the places tool outputs
carry them (env dumps, config files, JSON, curl lines, URLs, key files) never survive, and ordinary text
that merely looks technical does. (The live path, a tool output masked in the store, is in test_hooks.py.)"""
from __future__ import annotations

import pytest

from context_mode_client.masking import mask

# (where it appears, the secret). Shapes follow each issuer's published formats; none is a live key.
SECRETS = [
    ("env", "CONTEXT_API_KEY={}", "cms_3q2-8sYzL0bK_fWm1xRt9vQeJ4uH6pN7aC5dG2iO0kA"),       # this service's keys
    ("env", "export OPENAI_API_KEY={}", "sk-proj-Zx8Kq3Lm9Vt2Rb7Nc4Wp1Ys6Hd0Jf5Ga3Ue8Io2Pq"),
    ("env", "ANTHROPIC_API_KEY={}", "sk-ant-api03-Xy9Zq8Wv7Ut6Sr5Qp4On3Ml2Kj1Ih0GfEdCbA-1a2b3c4d"),
    ("env", "AWS_ACCESS_KEY_ID={}", "AKIAIOSFODNN7EXAMPLE"),
    ("env", "AWS_SECRET_ACCESS_KEY={}", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
    ("ini", "aws_secret_access_key = {}", "je7MtGbClwBF/2Zp9Utk/h3yCo8nvbEXAMPLEKEY"),
    ("text", "the secret key is {} (from the console)", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
    ("env", "GITHUB_TOKEN={}", "ghp_16C7e42F292c6912E7710c838347Ae178B4a"),
    ("text", "remote: https://x-access-token:{}@github.com/acme/app.git", "ghs_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"),
    ("env", "GH_PAT={}", "github_pat_11ABCDEFG0abcdefghijkl_mnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123"),
    ("env", "GITLAB_TOKEN={}", "glpat-x7Yz9Ab2Cd4Ef6Gh8Ij0"),
    ("env", "SLACK_BOT_TOKEN={}", "xoxb-2048-4096-aBcDeFgHiJkLmNoPqRsTuVwX"),
    ("text", "posting to {}", "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX"),
    ("json", '{{"stripe": "{}"}}', "sk_live_51H8xYzAbCdEfGhIjKlMnOpQr"),
    ("yaml", "google:\n  api_key: {}", "AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY"),
    ("npmrc", "//registry.npmjs.org/:_authToken={}", "npm_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"),
    ("pypirc", "password = {}", "pypi-AgEIcHlwaS5vcmcCJDg3NWE4YzVhLTU1ZWQtNDkyNS05ZmZkLWNhYzg2Y2IwYjQ1NgACKlszLCJm"),
    ("env", "HF_TOKEN={}", "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567"),
    ("curl", "curl -H 'Authorization: Bearer {}' https://api.example.com", "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9"
     ".eyJzdWIiOiJ1c2VyLTQyIiwiZXhwIjoxOTAwMDAwMDAwfQ.c2lnbmF0dXJlLW9mLXRoZS10b2tlbi1oZXJl"),
    ("curl", "curl -H 'Authorization: Bearer {}' https://api.example.com", "ya29.a0AfH6SMBx3kQ9-LmNoPq_rStUv"),
    ("curl", "curl -H 'Authorization: Basic {}' https://intranet", "YWRtaW46czNjcjN0LXBhc3N3b3Jk"),
    ("http", "Authorization: token {}", "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"),
    ("url", "DATABASE_URL=postgres://orders:{}@db.internal:5432/orders", "Tr0ub4dor&3"),
    ("url", "redis://:{}@cache:6379/0", "r3d1s-p4ss-w0rd"),
    ("url", "git clone https://deploy:{}@git.example.com/app.git", "gh-deploy-9f8e7d6c"),
    ("env", "DB_PASSWORD={}", "correct-horse-battery-staple"),
    ("env", "PGPASSWORD={} psql -h db", "s3cr3t!pg"),
    ("env", 'MYSQL_ROOT_PASSWORD="{}"', "root pass with spaces"),
    ("env", "JWT_SECRET={}", "a9f8e7d6c5b4a3928170"),
    ("env", "SESSION_SECRET_KEY={}", "django-insecure-8#x@!v2k"),
    ("json", '{{"client_secret": "{}", "client_id": "app"}}', "GOCSPX-1a2B3c4D5e6F7g8H9i0J"),
    ("json", '{{"password":"{}"}}', "P@ssw0rd!2024"),
    ("cli", "mysql --password={} -u root", "hunter22"),
    ("cli", "deploy --api-key {} --env prod", "live_8c1f0d2e3a"),
    ("docker", "docker login -u bot --password {}", "dckr_pat_AbC123xYz"),
]
PRIVATE_KEY = ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
               "QyNTUxOQAAACBqc2VjcmV0LWtleS1tYXRlcmlhbC1ub3QtcmVhbAAAAJgAAAAAAAAAAA==\n"
               "-----END OPENSSH PRIVATE KEY-----")


@pytest.mark.parametrize("where,template,secret", SECRETS, ids=[f"{w}-{i}" for i, (w, *_) in enumerate(SECRETS)])
def test_a_realistic_secret_does_not_survive(where, template, secret):
    text = "before\n" + template.format(secret) + "\nafter"
    masked = mask(text)
    assert secret not in masked
    assert "[REDACTED:" in masked and masked.startswith("before\n") and masked.endswith("\nafter")


@pytest.mark.parametrize("key", [PRIVATE_KEY, PRIVATE_KEY.replace("OPENSSH", "RSA"),
                                 PRIVATE_KEY.replace("OPENSSH ", ""), PRIVATE_KEY.replace("OPENSSH", "EC")])
def test_private_keys_go_whole_even_when_cut_off(key):
    assert mask(f"cat id_key\n{key}\n$ ls") == "cat id_key\n[REDACTED:private_key]\n$ ls"
    cut = key[: len(key) // 2]                   # an output truncated mid-key still hides what it shows
    assert "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ" not in mask("x\n" + cut)


def test_keys_named_by_the_caller_go_whatever_their_shape():
    assert mask("token is plainword-2f9c1e and more", literals=["plainword-2f9c1e"]) == \
        "token is [REDACTED:configured_key] and more"


def test_names_and_users_stay_so_the_text_still_says_what_was_there():
    assert mask("DB_PASSWORD=hunter2x") == "DB_PASSWORD=[REDACTED:secret_assignment]"
    assert mask("postgres://orders:pw1234@db/x") == "postgres://orders:[REDACTED:url_password]@db/x"
    assert mask('{"api_key": "abc123456"}') == '{"api_key": "[REDACTED:secret_assignment]"}'
    assert mask("Authorization: Bearer abcdefghij123") == "Authorization: Bearer [REDACTED:bearer_token]"


@pytest.mark.parametrize("text", [
    "commit 3f786850e387550fdab836ed7e6dc881de23001b (HEAD -> main)",       # git SHAs: hex, 40 characters
    "PWD=/home/dev/orders OLDPWD=/home/dev",                                 # the shell's directories
    "/Users/Alice/Projects/OrdersService/src/Main1234",                      # a 40-character path
    "request id 550e8400-e29b-41d4-a716-446655440000 took 12 ms",
    "订单 ORD-7890 已发货, tracking 1Z999AA10123456784",
    "https://docs.python.org/3/library/secrets.html#module-secrets",
    "Password reset emails are sent by the notifier service.",
    "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
])
def test_ordinary_technical_text_is_left_alone(text):
    assert mask(text) == text
