"""Credentials masked before a hook stores anything (issue 27: secrets never leave the machine).

Each rule is a named pattern; what it matches becomes ``[REDACTED:<name>]`` (a key name or URL user
before the secret is kept, so the stored text still says *what* was there). Rules run in order:
whole private keys first, then token shapes with a known prefix, then ``name=value`` assignments.
Over-masking a harmless value costs little; storing a live key in a shared memory costs a rotation.
"""
from __future__ import annotations

import re
from typing import Iterable

# Names that say "the value is a secret" in env dumps, config files, JSON and command lines.
_SECRET_NAME = (r"(?:[A-Za-z0-9_.-]*?(?:password|passwd|pwd|secret|token|api[_-]?key|apikey|access[_-]?key"
                r"|private[_-]?key|client[_-]?secret|credential|auth[_-]?key|session[_-]?key|signing[_-]?key)"
                r"[A-Za-z0-9_.-]*)")

RULES: tuple[tuple[str, re.Pattern], ...] = (
    ("private_key", re.compile(
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----.*?(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY"
        r"(?: BLOCK)?-----|\Z)", re.S)),
    ("context_mode_key", re.compile(r"\bcms_[A-Za-z0-9_-]{20,}")),
    ("anthropic_key", re.compile(r"\bsk-ant-[A-Za-z0-9_-]{20,}")),
    ("openai_key", re.compile(r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}")),
    ("stripe_key", re.compile(r"\b(?:sk|rk|pk|whsec)_(?:live|test)_[A-Za-z0-9]{16,}")),
    ("github_token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,})")),
    ("gitlab_token", re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}")),
    ("slack_token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("slack_webhook", re.compile(r"https://hooks\.slack\.com/services/[A-Za-z0-9/]+")),
    ("google_api_key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}")),
    ("npm_token", re.compile(r"\bnpm_[A-Za-z0-9]{36}")),
    ("pypi_token", re.compile(r"\bpypi-[A-Za-z0-9_-]{50,}")),
    ("huggingface_token", re.compile(r"\bhf_[A-Za-z0-9]{30,}")),
    ("aws_access_key_id", re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b")),
    ("jwt", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),
    # "Authorization: Bearer x", "Basic x", "token x": the scheme is kept, the credential goes.
    ("bearer_token", re.compile(r"(?i)(?<=\bbearer )[A-Za-z0-9._~+/=-]{8,}")),
    ("basic_auth", re.compile(r"(?i)(?<=\bbasic )[A-Za-z0-9+/=]{8,}")),
    # scheme://user:password@host: the user stays, the password goes.
    ("url_password", re.compile(r"(?<=://)([^\s:/@]*):[^\s@/]+(?=@)")),
    # PASSWORD=..., "api_key": "...", client_secret: ...: the name (and any quotes) stays, the value goes.
    ("secret_assignment", re.compile(
        rf"(?i)\b({_SECRET_NAME})([\"']?\s*(?:=|:|=>)\s*)(?!\[REDACTED)(\"[^\"\n]{{3,}}\"|'[^'\n]{{3,}}'|[^\s\"',;}}]{{3,}})")),
    ("secret_option", re.compile(rf"(?i)(--{_SECRET_NAME}(?:=|\s+))(?!\[REDACTED)([^\s\"']{{3,}})")),
    # A bare AWS secret access key: 40 characters of base64 (checked in _aws_secret below).
    ("aws_secret_key", re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")),
)


# Not secrets although their names end like one: the shell's working directories.
_NOT_SECRET_NAMES = {"PWD", "OLDPWD"}


def _aws_secret(value: str) -> bool:
    """Random-looking: upper, lower and digits, not a path (git SHAs are hex and lowercase)."""
    return (any(c.isupper() for c in value) and any(c.islower() for c in value) and any(c.isdigit() for c in value)
            and not value.startswith("/") and value.count("/") <= 4)


def _replace(name: str):
    def sub(m: re.Match) -> str:
        tag = f"[REDACTED:{name}]"
        if name == "url_password":
            return f"{m.group(1)}:{tag}"
        if name == "secret_assignment":
            key, sep, value = m.groups()
            if key.upper() in _NOT_SECRET_NAMES:
                return m.group(0)
            quote = value[0] if value[0] in "\"'" else ""
            return f"{key}{sep}{quote}{tag}{quote}"
        if name == "secret_option":
            return f"{m.group(1)}{tag}"
        if name == "aws_secret_key" and not _aws_secret(m.group(0)):
            return m.group(0)
        return tag
    return sub


def mask(text: str, literals: Iterable[str] = ()) -> str:
    """``text`` with every credential-looking value replaced; ``literals`` (e.g. the hook's own API key)
    are masked wherever they appear, whatever their shape."""
    for value in literals:
        if value and len(value) >= 8:
            text = text.replace(value, "[REDACTED:configured_key]")
    for name, pattern in RULES:
        text = pattern.sub(_replace(name), text)
    return text
