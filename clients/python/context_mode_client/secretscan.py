"""One secret detector, linear in its input: credentials found in text, to be masked (the agent hooks, the
service's ``CONTEXT_MASK_PUSHES``) or refused (the service's tool registry).

Where the rules come from: gitleaks' default rule set (``config/gitleaks.toml`` of github.com/gitleaks/gitleaks,
MIT licence, Copyright (c) 2019 Zachary Rice; a rule taken from it keeps its gitleaks id as its name) and this
project's own earlier rules (names with ``_``). Each was rewritten so that no pattern backtracks over its input:

- A *token* rule starts with its literal prefix (the regex engine finds a literal by a fast search), then a
  fixed-width look-behind checks that the prefix starts a token (the character before it is no token
  character), then it reads a run of the token's characters. Two attempts of one rule never read the same
  characters (an attempt inside a run is refused by the look-behind), so each rule reads the text a bounded
  number of times whatever it holds.
- A *context* rule (``password = …``, ``Authorization: …``, ``--api-key …``, ``user:pw@host``, ``?sig=…``)
  starts at a literal keyword or separator and reads bounded or self-delimiting runs; *line* rules
  (``mysql -p…``, ``curl -u``, ``.netrc``) look only inside the lines their command word is on, each line once.
- Whole blocks (PEM and PuTTY private keys) are found with ``str.find``.
A rule whose keywords are absent from the text is skipped, and its pattern is compiled the first time it is
needed: importing this module compiles nothing (a hook runs in a fresh process for every call).

Standard library only, Python 3.9 and later (the client's constraints).
"""
from __future__ import annotations

import re
from bisect import bisect_right
from functools import lru_cache
from typing import Callable, Iterable, Iterator, List, Optional, Tuple

Span = Tuple[int, int, str]

_ASCII_LOWER = {c: c + 32 for c in range(65, 91)}


def _lower(text: str) -> str:
    """``text`` lower-cased with every character kept in place (so positions in it are positions in ``text``)."""
    low = text.lower()
    return low if len(low) == len(text) else text.translate(_ASCII_LOWER)


# --- names whose value is a secret ------------------------------------------------------------------------
# Compared lower-case without "-", "_", "." and spaces. A name that equals one of SECRET_NAMES or ends with one
# of SECRET_ENDINGS holds a secret (DB_PASSWORD, x-api-key, PRIVATE-TOKEN, aws_secret_access_key, passphrase).
SECRET_NAMES = frozenset({
    "password", "passwd", "passphrase", "secret", "token", "apikey", "apitoken", "accesstoken", "refreshtoken",
    "authtoken", "bearer", "bearertoken", "idtoken", "sessiontoken", "cookie", "authorization",
    "proxyauthorization", "credential", "credentials", "privatekey", "secretkey", "accesskey", "clientsecret",
    "xapikey", "privatetoken", "accountkey", "sharedaccesskey", "sharedaccesssignature", "masterkey"})
SECRET_ENDINGS = ("password", "passwd", "passphrase", "secret", "token", "apikey", "accesskey", "secretkey",
                  "privatekey", "authkey", "sessionkey", "signingkey", "encryptionkey", "masterkey", "accountkey",
                  "credentials", "credential", "pwd")
# Not secrets although they end like one: the shell's working directories.
NOT_SECRET_NAMES = frozenset({"pwd", "oldpwd"})
# Names that hold a secret as a metadata or JSON key, but are ordinary words in prose.
LOOSE_NAMES = frozenset({"auth", "sig", "signature", "pass"})
# URL parameters that carry credentials (?sig= of Azure SAS, ?key= of Google APIs, ?code= of Azure Functions).
SECRET_PARAMS = frozenset({
    "sig", "signature", "key", "code", "token", "auth", "apikey", "api_key", "access_token", "refresh_token",
    "id_token", "client_secret", "password", "passwd", "pwd", "secret", "x-amz-signature", "x-amz-credential",
    "x-amz-security-token", "x-goog-signature", "x-goog-credential", "sas", "private_token", "session_token"})
_NAME_DROP = str.maketrans("", "", "-_. ")


def secret_name(name: str, *, strict: bool = False) -> bool:
    """Whether a key named ``name`` holds a secret. ``strict`` (a name found in running text): the words in
    ``LOOSE_NAMES`` (auth, sig) count only as metadata or JSON keys, not there."""
    raw = name.strip().lower()
    norm = raw.translate(_NAME_DROP)
    if not norm or norm in NOT_SECRET_NAMES:
        return False
    if norm in SECRET_NAMES or norm.endswith(SECRET_ENDINGS):
        return True
    if raw.endswith(("_pass", "-pass", ".pass")) or norm in ("dbpass", "smtppass"):
        return True
    return not strict and norm in LOOSE_NAMES


def secret_param(name: str) -> bool:
    """Whether a URL query or fragment parameter named ``name`` carries a credential."""
    return name.strip().lower() in SECRET_PARAMS or secret_name(name)


# Values that only name a secret, never hold one (after gitleaks' global allowlist): references to variables
# and templates, placeholders, booleans and types.
_REFERENCE = (r"""^(?:\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|%[A-Za-z_][A-Za-z0-9_]*%|\{\{.*\}\}|<[^<>]*>|\*+|x+|\.+
                            |null|none|nil|true|false|undefined|string|str|int|integer|bool|boolean|required
                            |optional|redacted|\[redacted[^\]]*\])$""")
# An unquoted value that is code, not a literal: a call or subscript, or a configuration object's attribute.
_CODE = r"^[A-Za-z_][A-Za-z0-9_.]*[(\[]|^(?:os|self|this|process|settings|config|cfg|conf|env|secrets|vars|request|ctx|args|options|opts|params)\."


_COMPILED: dict = {}


def _re(source: str, flags: int = 0) -> re.Pattern:
    """``source`` compiled the first time it is used: nothing is compiled at import."""
    found = _COMPILED.get((source, flags))
    if found is None:
        found = _COMPILED[(source, flags)] = re.compile(source, flags)
    return found


_PLACEHOLDER_STARTS = frozenset("$%{<*xX.[nNtTfFuUsSiIbBrRoO")   # the first characters _REFERENCE can match
_FLAGS = re.I | re.X


def _placeholder(value: str) -> bool:
    return value[:1] in _PLACEHOLDER_STARTS and _re(_REFERENCE, _FLAGS).match(value) is not None


# --- rules ---------------------------------------------------------------------------------------------------
class Rule:
    """A named pattern, compiled when first needed. Its secret is group ``s`` (or the whole match); ``on``
    says whether it reads the text or its lower-cased copy; ``keys`` (lower-case) are words one of which must
    be in the text for the rule to run; ``check`` may refuse a match; ``left`` extends a match whose literal
    sits inside the secret leftwards, by a pattern of at most ``left[1]`` characters."""

    __slots__ = ("name", "keys", "source", "on", "check", "left")

    def __init__(self, name: str, keys: Iterable[str], source: str, *, on: str = "text",
                 check: Optional[Callable[[str], bool]] = None, left: Optional[Tuple[str, int]] = None):
        self.name, self.keys, self.source = name, tuple(keys), source
        self.on, self.check, self.left = on, check, left

    def applies(self, low: str) -> bool:
        return not self.keys or any(k in low for k in self.keys)

    def spans(self, text: str, low: str) -> Iterator[Tuple[int, int]]:
        regex = _re(self.source)
        group = "s" if "s" in regex.groupindex else 0
        for m in regex.finditer(low if self.on == "low" else text):
            start, end = m.span(group)
            if start < 0:
                continue
            if self.left is not None:
                found = _re("(?:" + self.left[0] + r")\Z").search(text, max(0, start - self.left[1]), start)
                if found is None or (found.start() and _re(_TOKEN_CHAR).match(text, found.start() - 1)):
                    continue
                start = found.start()
            if self.check is None or self.check(text[start:end]):
                yield start, end


_TOKEN_CHAR = r"[A-Za-z0-9_]"
_T = "A-Za-z0-9_"                 # token characters: a prefix preceded by one starts no token


def token(name: str, prefix: str, body: str, keys: Iterable[str] = (), *, boundary: str = _T + "-",
          check=None) -> Rule:
    """A token: ``prefix`` (a fixed-width pattern, literal first), not preceded by a ``boundary`` character,
    then ``body``. ``keys`` default to the prefix, lower-cased (when it is a plain literal)."""
    keys = tuple(keys) or (prefix.replace("\\", "").lower(),)
    return Rule(name, keys, f"{prefix}(?<![{boundary}]{prefix}){body}", check=check)


def _mixed(value: str) -> bool:
    """Random-looking: upper case, lower case and digits (not a word, a hex hash or a path)."""
    return (any(c.isupper() for c in value) and any(c.islower() for c in value)
            and any(c.isdigit() for c in value))


def _aws_secret(value: str) -> bool:
    return _mixed(value) and not value.startswith("/") and value.count("/") <= 4


def _basic_credentials(value: str) -> bool:
    """A Basic credential is base64 of ``user:password``."""
    import base64
    import binascii
    try:
        decoded = base64.b64decode(value + "=" * (-len(value) % 4), validate=True)
    except (binascii.Error, ValueError):
        return False
    return b":" in decoded


def _bearer(value: str) -> bool:
    """A token, not a word ("Bearer authentication"): a digit or punctuation in it, or long."""
    return len(value) >= 20 or any(c.isdigit() or c in "._~+/=-" for c in value)


def _b64ish(value: str) -> bool:
    return len(value) >= 8 and _re(r"[A-Za-z0-9+/=_-]+\Z").match(value) is not None


H = "[0-9a-f]"
RULES: Tuple[Rule, ...] = (
    # cloud providers
    token("aws-access-token", "(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|A3T[A-Z0-9])",
          "[A-Z0-9]{16}(?![A-Za-z0-9])", ("akia", "asia", "abia", "acca", "agpa", "aida", "aroa", "aipa", "anpa",
                                          "anva", "a3t")),
    token("aws-amazon-bedrock-api-key-long-lived", "ABSK", "[A-Za-z0-9+/]{109,}={0,2}"),
    token("gcp-api-key", "AIza", r"[\w-]{35}"),
    token("google_oauth_client_secret", "GOCSPX-", r"[\w-]{20,}"),
    token("google_access_token", r"ya29\.", r"[\w-]{20,}"),
    Rule("azure-ad-client-secret", ("q~",), r"Q~(?<=[A-Za-z0-9_~.]{3}[0-9]Q~)[A-Za-z0-9_~.-]{31,34}(?![A-Za-z0-9_~.-])",
         left=(r"[A-Za-z0-9_~.]{3}[0-9]", 4)),
    token("alibaba-access-key-id", "LTAI", "[A-Za-z0-9]{20}(?![A-Za-z0-9])"),
    token("digitalocean-pat", "dop_v1_", f"{H}{{64}}"),
    token("digitalocean-access-token", "doo_v1_", f"{H}{{64}}"),
    token("digitalocean-refresh-token", "dor_v1_", f"{H}{{64}}"),
    token("heroku-api-key-v2", "HRKU-AA", r"[0-9a-zA-Z_-]{58}"),
    token("flyio-access-token", "(?:fo1_|fm2_)", r"[\w+/-]{40,}={0,3}", ("fo1_", "fm2_")),
    token("flyio-access-token", "fm1[ar]_", r"[\w+/-]{40,}={0,3}", ("fm1a_", "fm1r_")),
    token("cloudflare-origin-ca-key", r"v1\.0-", f"{H}{{24}}-{H}{{146}}"),
    token("databricks-api-token", "dapi", f"{H}{{32}}(?:-[0-9])?(?![A-Za-z0-9])"),
    token("scalingo-api-token", "tk-us-", r"[\w-]{48}"),
    token("openshift-user-token", "sha256~", r"[\w-]{43}"),
    # source hosting, registries, developer services
    # (after a "-" too: an id that ends in a token, sess-x-ghp_..., issue 50 L4)
    token("github-pat", "gh[pousr]_", "[A-Za-z0-9]{30,}", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), boundary=_T),
    token("github-fine-grained-pat", "github_pat_", r"\w{22,}"),
    token("gitlab-pat", "glpat-", r"[\w.-]{20,}"),
    token("gitlab-ptt", "glptt-", "[0-9a-f]{40}"),
    token("gitlab-deploy-token", "gldt-", r"[\w-]{20,}"),
    token("gitlab-runner-authentication-token", "glrt-", r"[\w.-]{20,}"),
    token("gitlab-scim-token", "glsoat-", r"[\w-]{20,}"),
    token("gitlab-cicd-job-token", "glcbt-", r"[\w-]{20,}"),
    token("gitlab-feed-token", "glft-", r"[\w-]{20,}"),
    token("gitlab-incoming-mail-token", "glimt-", r"[\w-]{25,}"),
    token("gitlab-kubernetes-agent-token", "glagent-", r"[\w-]{50,}"),
    token("gitlab-oauth-app-secret", "gloas-", r"[\w-]{64,}"),
    token("gitlab-rrt", "GR1348941", r"[\w-]{20,}"),
    Rule("gitlab-session-cookie", ("_gitlab_session",), r"_gitlab_session=(?P<s>[0-9a-z]{32})"),
    token("npm-access-token", "npm_", "[A-Za-z0-9]{36,}"),
    token("pypi-upload-token", "pypi-", r"[\w-]{50,}"),
    token("rubygems-api-token", "rubygems_", f"{H}{{48}}"),
    token("clojars-api-token", "CLOJARS_", "[a-z0-9]{60}"),
    token("artifactory-api-key", "AKCp", "[A-Za-z0-9]{69}"),
    token("artifactory-reference-token", "cmVmd", "[A-Za-z0-9]{59}"),
    token("huggingface-access-token", "hf_", "[A-Za-z0-9]{30,}"),
    token("huggingface-organization-api-token", "api_org_", "[A-Za-z0-9]{30,}"),
    token("postman-api-token", "PMAK-", f"{H}{{24}}-{H}{{34}}"),
    token("pulumi-api-token", "pul-", f"{H}{{40}}"),
    token("prefect-api-token", "pnu_", "[A-Za-z0-9]{36}"),
    token("readme-api-token", "rdme_", "[a-z0-9]{70}"),
    token("sourcegraph-access-token", "sgp_", f"(?:{H}{{16}}_|local_){H}{{40}}"),
    Rule("hashicorp-tf-api-token", (".atlasv1.",), r"\.atlasv1\.(?<=[A-Za-z0-9]{14}\.atlasv1\.)[\w=-]{60,70}",
         left=("[A-Za-z0-9]{14}", 14)),
    token("harness-api-key", r"(?:pat|sat)\.", r"[\w-]{22}\.[A-Za-z0-9]{24}\.[A-Za-z0-9]{20}", ("pat.", "sat.")),
    token("doppler-api-token", r"dp\.pt\.", "[A-Za-z0-9]{43}"),
    # a service token (issue 50, L4), with its config's name before the secret when it has one
    token("doppler-service-token", r"dp\.st\.", r"(?:[a-z0-9_-]{1,64}\.)?[A-Za-z0-9]{40,}"),
    token("dynatrace-api-token", r"dt0c01\.", r"[A-Za-z0-9]{24}\.[A-Za-z0-9]{64}"),
    token("grafana-cloud-api-token", "glc_", "[A-Za-z0-9+/]{32,}={0,2}"),
    token("grafana-service-account-token", "glsa_", "[A-Za-z0-9]{32}_[A-Fa-f0-9]{8}"),
    token("grafana-api-key", "eyJrIjoi", "[A-Za-z0-9]{70,}={0,3}"),
    token("1password-service-account-token", "ops_eyJ", "[A-Za-z0-9+/]{250,}={0,3}"),
    token("1password-secret-key", "A3-",
          "[A-Z0-9]{6}-(?:[A-Z0-9]{11}|[A-Z0-9]{6}-[A-Z0-9]{5})-[A-Z0-9]{5}-[A-Z0-9]{5}-[A-Z0-9]{5}"),
    token("airtable-personnal-access-token", "pat", r"[A-Za-z0-9]{14}\.[a-f0-9]{64}"),
    token("linear-api-key", "lin_api_", "[A-Za-z0-9]{40}"),
    token("notion-api-token", "ntn_", "[0-9]{11}[A-Za-z0-9]{35}"),
    token("sentry-org-token", "sntrys_eyJ", "[A-Za-z0-9+/=_]{30,}"),
    token("sentry-user-token", "sntryu_", f"{H}{{64}}"),
    token("infracost-api-token", "ico-", "[A-Za-z0-9]{32}"),
    token("octopus-deploy-api-key", "API-", "[A-Z0-9]{26}(?![A-Za-z0-9])"),
    token("new-relic-user-api-key", "NRAK-", "[A-Z0-9]{27}"),
    token("new-relic-browser-api-token", "NRJS-", f"{H}{{19}}"),
    token("new-relic-insert-key", "NRII-", r"[\w-]{32}"),
    token("planetscale-api-token", "pscale_tkn_", r"[\w=.-]{32,}"),
    token("planetscale-password", "pscale_pw_", r"[\w=.-]{32,}"),
    token("planetscale-oauth-token", "pscale_oauth_", r"[\w=.-]{32,}"),
    token("intra42-client-secret", "s-s4t2(?:ud|af)-", f"{H}{{64}}", ("s-s4t2",)),
    token("frameio-api-token", "fio-u-", r"[\w=-]{64}"),
    token("settlemint-personal-access-token", "sm_(?:aat|pat|sat)_", "[A-Za-z0-9]{16}",
          ("sm_aat_", "sm_pat_", "sm_sat_")),
    token("typeform-api-token", "tfp_", r"[\w.=-]{59}"),
    token("perplexity-api-key", "pplx-", "[A-Za-z0-9]{48}"),
    token("vault-service-token", r"hvs\.", r"[\w-]{90,}"),
    token("vault-batch-token", r"hvb\.", r"[\w-]{138,}"),
    token("vault-service-token", r"s\.", "[A-Za-z0-9]{24}(?![A-Za-z0-9.])", check=lambda v: _mixed(v[2:])),
    token("age-secret-key", "AGE-SECRET-KEY-1", "[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58}"),
    # AI providers
    token("anthropic-api-key", "sk-ant-", r"[\w-]{20,}"),
    token("openai-api-key", "sk-", r"(?:proj-|svcacct-|admin-)?[\w-]{20,}"),
    # payments and commerce
    token("stripe-access-token", "(?:sk|rk)_(?:live|test|prod)_", "[A-Za-z0-9]{10,}", ("sk_", "rk_")),
    token("stripe_webhook_secret", "whsec_", "[A-Za-z0-9]{24,}"),
    token("square-access-token", "EAAA", r"[\w-]{22,}"),
    token("square-access-token", "sq0atp-", r"[\w-]{22,}"),
    token("square_oauth_secret", "sq0csp-", r"[\w-]{40,}"),
    token("shopify-access-token", "shp(?:at|ca|pa|ss)_", "[a-fA-F0-9]{32}", ("shpat_", "shpca_", "shppa_", "shpss_")),
    token("shippo-api-token", "shippo_(?:live|test)_", "[a-fA-F0-9]{40}", ("shippo_",)),
    token("duffel-api-token", "duffel_(?:test|live)_", r"[\w=-]{43}", ("duffel_",)),
    token("easypost-api-token", "EZ[AT]K", "[A-Za-z0-9]{54}", ("ezak", "eztk")),
    token("flutterwave-secret-key", "FLWSECK-", "[a-hA-H0-9]{32}-X"),
    token("flutterwave-secret-key", "FLWSECK_TEST-", "[a-hA-H0-9]{32}-X"),
    token("facebook-page-access-token", "EAA[MC]", "[A-Za-z0-9]{100,}", ("eaam", "eaac")),
    # messaging and mail
    token("slack-bot-token", "xox[baprseo]-", "[A-Za-z0-9-]{10,}",
          ("xoxb-", "xoxa-", "xoxp-", "xoxr-", "xoxs-", "xoxe-", "xoxo-")),
    token("slack-app-token", "xapp-", "[0-9]-[A-Z0-9]+-[0-9]+-[a-z0-9]+"),
    Rule("slack-webhook-url", ("hooks.slack.com",),
         r"hooks\.slack\.com/(?:services|workflows|triggers)/(?P<s>[A-Za-z0-9+/]{20,})"),
    Rule("discord_webhook", ("discord",), r"discord(?:app)?\.com/api/webhooks/(?P<s>[0-9]{5,30}/[\w-]{20,})"),
    Rule("microsoft-teams-webhook", ("webhook.office.com",), r"webhook\.office\.com/webhookb2/(?P<s>[\w@/-]{40,})"),
    Rule("telegram-bot-api-token", (":aa",), r":AA(?<=[0-9]:AA)[\w-]{30,}", left=("[0-9]{5,16}", 16)),
    token("discord-api-token", "[MNO]", r"[A-Za-z0-9]{23,25}\.[\w-]{6}\.[\w-]{27,}", ("m", "n", "o"),
          check=lambda v: any(c.isdigit() for c in v)),
    token("sendgrid-api-token", r"SG\.", r"[\w-]{16,32}\.[\w-]{16,64}"),
    token("sendinblue-api-token", "xkeysib-", f"{H}{{64}}-[A-Za-z0-9]{{16}}"),
    token("twilio-api-key", "SK", "[0-9a-fA-F]{32}(?![A-Za-z0-9])"),
    token("mailgun-private-api-token", "key-", f"{H}{{32}}(?![A-Za-z0-9])"),
    Rule("mailchimp-api-key", ("-us",), r"-us[0-9]{1,2}(?![A-Za-z0-9])(?:(?<=[0-9a-f]{32}-us[0-9])|(?<=[0-9a-f]{32}-us[0-9]{2}))",
         left=(f"{H}{{32}}", 32)),
    token("mapbox-api-token", r"sk\.eyJ", r"[\w.-]{50,}"),
    # identity and generic token shapes
    token("jwt", "eyJ", r"[\w-]{8,}\.eyJ[\w-]{8,}\.[\w-]{8,}", boundary=_T + ".-"),
    token("context_mode_key", "cms_", r"[\w-]{20,}"),
    token("okta-access-token", "00", r"[\w-]{40}(?![\w-])", check=_mixed),
    Rule("bearer_token", ("bearer",), r"bearer[ \t]+(?P<s>[a-z0-9._~+/=-]{8,})", on="low", check=_bearer),
    Rule("basic_auth", ("basic",), r"basic[ \t]+(?P<s>[a-z0-9+/]{8,}={0,2})(?![a-z0-9+/=])", on="low",
         check=_basic_credentials),
    # scheme://user:password@host (the user stays)
    Rule("url_password", ("://",), r"://[^\s:/@]{0,256}:(?P<s>[^\s@/]{1,512})@"),
    # an AWS secret access key on its own: 40 characters of base64
    Rule("aws_secret_key", (), r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])", check=_aws_secret),
)


# --- context finders ----------------------------------------------------------------------------------------
# name = value, name: value, "name": "value", name => value: the keyword first (a literal), then the rest of
# the name, bounded; the name's start is found walking back (_name_before).
_QUOTED = r"\"[^\"\r\n]{1,4096}\"|'[^'\r\n]{1,4096}'"
_UNQUOTED = r"[^\s\"',;<>{}]{1,4096}"
_ASSIGN = (r"(?:pass|pwd|secret|token|api[_-]?key|access[_-]?key|private[_-]?key|credential|cookie|auth|sig"
           r"|account[_-]?key|shared[_-]?access|session[_-]?key|signing[_-]?key|encryption[_-]?key|master[_-]?key)"
           r"(?=(?P<rest>[a-z0-9_.-]{0,40}))(?P=rest)[\"']?[ \t]{0,8}"
           rf"(?:(?P<sep>=>|:=|==?)[ \t]{{0,8}}(?P<s>{_QUOTED}|{_UNQUOTED})"
           # after ":", an unquoted word followed by more words is prose ("password: the one you chose")
           rf"|:[ \t]{{0,8}}(?P<c>{_QUOTED}|(?=(?P<u>{_UNQUOTED}))(?P=u)(?![ \t]+[a-z])))")
_ASSIGN_KEYS = ("pass", "pwd", "secret", "token", "key", "credential", "cookie", "auth", "sig")
_OPTION = (r"--(?P<n>[a-z0-9][a-z0-9-]{0,40})(?:=|[ \t]{1,8})"
           r"(?P<s>\"[^\"\r\n]{1,4096}\"|'[^'\r\n]{1,4096}'|[^\s\"'=-][^\s\"']{0,4095})")
_PARAM = r"[?&#;](?P<n>[a-z0-9_.-]{1,40})=(?P<s>[^&#;\s\"'<>]{3,})"
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_.-")
_USER_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._%+-")
_SCHEMES = ("bearer", "basic", "token", "digest", "negotiate", "ntlm", "apikey", "api-key", "sso-key", "hmac")
_CREDENTIAL = r"[^\s\"',;]{8,}"
# a password repeated to confirm it is still the password
_PASSWORD_MORE = ("confirm", "confirmation", "again", "repeat", "new", "old")


def _name_before(low: str, start: int) -> int:
    """Where the name whose keyword starts at ``start`` begins (at most 64 characters back)."""
    i, floor = start, max(0, start - 64)
    while i > floor and low[i - 1] in _NAME_CHARS:
        i -= 1
    return i


@lru_cache(maxsize=4096)
def _name_kind(name: str) -> str:
    """How an assignment's name is read: "secret", "authorization", "token-like" (auth, sig: only when the
    value looks like a token) or ""."""
    norm = name.translate(_NAME_DROP)
    if norm in ("authorization", "proxyauthorization"):
        return "authorization"
    if secret_name(name, strict=True):
        return "secret"
    if "password" in norm and norm.rstrip("0123456789").endswith(_PASSWORD_MORE):
        return "secret"
    return "token-like" if norm in ("auth", "sig", "signature") else ""


def _named_secret(kind: str, name: str, value: str) -> bool:
    if kind == "token-like":        # docker's "auth", a signature: only token-like values
        return _b64ish(value.strip("\"'")) and len(value) >= (8 if name.endswith("auth") else 16)
    return kind == "secret"


def _assignment_spans(text: str, low: str) -> Iterator[Span]:
    for m in _re(_ASSIGN).finditer(low):
        begin = _name_before(low, m.start())
        if low.endswith("://", 0, begin) or low[begin - 1:begin] in ("?", "&", "#", ";"):
            continue                                          # a URL's user or parameter: url_password's, url_parameter's
        name = low[begin:m.start("rest")] + m.group("rest")
        start, end = m.span("s" if m.group("s") is not None else "c")
        value = text[start:end]
        if m.group("sep") == "==" or value.startswith("="):
            continue                                          # a comparison, not an assignment
        kind = _name_kind(name)
        if kind == "authorization":
            yield from _authorization(text, low, start, end)
            continue
        if not _named_secret(kind, name, value):
            continue
        quoted = value[:1] in "\"'"
        inner = value[1:-1] if quoted else value
        if not inner.strip() or _placeholder(inner.strip().rstrip(")]")):
            continue
        if not quoted:
            if len(inner) < 3 or _re(_CODE).match(inner):
                continue
        yield (start + 1, end - 1, "secret_assignment") if quoted else (start, end, "secret_assignment")


def _authorization(text: str, low: str, start: int, end: int) -> Iterator[Span]:
    """``Authorization: <scheme> <credential>``: the credential goes, the scheme stays."""
    quoted = text[start:start + 1] in "\"'"
    inner_start, inner_end = (start + 1, end - 1) if quoted else (start, end)
    space = low.find(" ", inner_start, inner_end)
    word = low[inner_start:space if space >= 0 else inner_end]
    if word in _SCHEMES:
        at = space + 1 if space >= 0 else end
        while at < len(text) and text[at] in " \t":
            at += 1
        found = _re(_CREDENTIAL).match(text, at, inner_end if quoted else len(text))
        if found:
            yield found.start(), found.end(), {"bearer": "bearer_token", "basic": "basic_auth"}.get(word, "authorization")
    elif inner_end - inner_start >= 8 and not _placeholder(text[inner_start:inner_end]):
        yield inner_start, inner_end, "authorization"


def _option_spans(text: str, low: str) -> Iterator[Span]:
    """--password x, --api-key=x, --client-secret "x"."""
    for m in _re(_OPTION).finditer(low):
        if secret_name(m.group("n"), strict=True):
            start, end = m.span("s")
            if text[start:start + 1] in "\"'":
                start, end = start + 1, end - 1
            if end - start >= 3 and not _placeholder(text[start:end]):
                yield start, end, "secret_option"


def _param_spans(text: str, low: str) -> Iterator[Span]:
    """?sig=…, &key=…, #access_token=…, ;AccountKey=… (Azure connection strings)."""
    for m in _re(_PARAM).finditer(low):
        if secret_param(m.group("n")) and not _placeholder(text[m.start("s"):m.end("s")]):
            yield m.start("s"), m.end("s"), "url_parameter"


# user:password@host, without a scheme (the user stays)
_USER_PASSWORD = r":(?P<s>[^\s:@/\"'<>]{3,256})@[A-Za-z0-9]"
_NOT_USERS = ("mailto", "sip", "sips", "xmpp", "tel", "urn", "im", "news")


def _user_password_spans(text: str, low: str) -> Iterator[Span]:
    for m in _re(_USER_PASSWORD).finditer(text):
        colon = m.start()
        i, floor = colon, max(0, colon - 64)
        while i > floor and text[i - 1] in _USER_CHARS:
            i -= 1
        if i == colon or (i and text[i - 1] in ":/") or low[i:colon] in _NOT_USERS:
            continue                                          # no user; scheme://user:pw@ is url_password's
        yield m.span("s") + ("user_password",)


# Rules scoped to the lines a command is on: (the command, on the lower-cased text; the secret; the rule's name)
LINE_RULES = (
    (r"(?:mysql|mysqldump|mysqladmin|mariadb)(?![a-z])", r"[ \t]-p(?P<s>[^\s\"']{1,256})", "mysql_password"),
    (r"(?:curl|wget)(?![a-z])",
     r"[ \t](?:-u|--user|--proxy-user)(?:=|[ \t]{1,8})[\"']?[^\s:\"']{0,256}:(?P<s>[^\s\"']{1,256})", "curl-auth-user"),
    (r"sshpass(?![a-z])", r"[ \t]-p[ \t]*[\"']?(?P<s>[^\s\"']{1,256})", "sshpass_password"),   # (quoted: issue 50)
    (r"redis-cli(?![a-z])", r"[ \t]-a[ \t]*(?P<s>[^\s\"']{1,256})", "redis_password"),
    (r"(?:machine|login)[ \t]", r"(?<![A-Za-z])[Pp]assword[ \t]+(?P<s>\S{1,256})", "netrc_password"),
)
# .netrc over several lines: an indented "password <value>" line of its own
_NETRC_LINE = r"(?m)^[ \t]+password[ \t]+(?P<s>\S{1,256})[ \t]*$"


def _line_spans(text: str, low: str) -> Iterator[Span]:
    for trigger, inner, name in LINE_RULES:
        pos = 0
        while True:
            m = _re(trigger).search(low, pos)
            if m is None:
                break
            line_start = low.rfind("\n", 0, m.start()) + 1
            line_end = low.find("\n", m.end())
            line_end = len(low) if line_end < 0 else line_end
            for found in _re(inner).finditer(text, line_start, line_end):
                yield found.start("s"), found.end("s"), name
            pos = line_end                                    # each line once
    if "password" in low and ("machine" in low or "login" in low):
        for m in _re(_NETRC_LINE).finditer(low):
            yield m.start("s"), m.end("s"), "netrc_password"


_PEM_BEGIN = r"-----BEGIN[ A-Z0-9_-]{0,64}PRIVATE KEY(?: BLOCK)?-----"
_PEM_END = r"-----END[ A-Z0-9_-]{0,64}PRIVATE KEY(?: BLOCK)?-----"


def _private_key_blocks(text: str, low: str) -> Iterator[Span]:
    """A PEM private key from its BEGIN line through its END line, or to the end of the text when cut off
    (every BEGIN is reported: mask_value reads many strings joined, and each string's key is cut at its end)."""
    pos, ends = 0, True
    while True:
        begin = _re(_PEM_BEGIN).search(text, pos)
        if begin is None:
            return
        end = _re(_PEM_END).search(text, begin.end()) if ends else None
        ends = end is not None                  # no END after here: none after any later BEGIN either
        yield begin.start(), len(text) if end is None else end.end(), "private_key"
        pos = begin.end() if end is None else end.end()


def _putty_blocks(text: str, low: str) -> Iterator[Span]:
    """A PuTTY key file (.ppk): from its first line through ``Private-MAC``'s line, or to the end of the text."""
    pos, macs = 0, True
    while True:
        start = text.find("PuTTY-User-Key-File-", pos)
        if start < 0:
            return
        mac = text.find("Private-MAC:", start) if macs else -1
        macs = mac >= 0
        stop = len(text) if mac < 0 else text.find("\n", mac)
        stop = len(text) if stop < 0 else stop
        yield start, stop, "putty-private-key"
        pos = start + 20 if mac < 0 else stop


# Finders beyond the pattern rules: (keywords, finder), run after RULES.
FINDERS = (
    (("private key",), _private_key_blocks),
    (("putty-user-key-file-",), _putty_blocks),
    (_ASSIGN_KEYS, _assignment_spans),
    (("--",), _option_spans),
    (("=",), _param_spans),
    (("@",), _user_password_spans),
    (("mysql", "mariadb", "curl", "wget", "sshpass", "redis-cli", "machine", "login"), _line_spans),
)


# --- scanning -------------------------------------------------------------------------------------------------
def _literal_spans(text: str, literals: Iterable[str]) -> Iterator[Span]:
    for value in literals:
        if value and len(value) >= 8:
            i = text.find(value)
            while i >= 0:
                yield i, i + len(value), "configured_key"
                i = text.find(value, i + len(value))


def _all_spans(text: str, literals: Iterable[str] = ()) -> Iterator[Span]:
    yield from _literal_spans(text, literals)
    low = _lower(text)
    for rule in RULES:
        if rule.applies(low):
            for start, end in rule.spans(text, low):
                yield start, end, rule.name
    for keys, finder in FINDERS:
        if any(k in low for k in keys):
            yield from finder(text, low)


def find(text: str, literals: Iterable[str] = ()) -> List[Span]:
    """The secrets in ``text``: ``(start, end, rule)`` in order, overlaps merged (the first-starting one names
    it). ``literals`` (e.g. the caller's own key) are found wherever they appear, whatever their shape."""
    return _merged(_all_spans(text, literals))


def _merged(spans: Iterable[Span]) -> List[Span]:
    merged: List[Span] = []
    last_end = -1
    for start, end, name in sorted(spans, key=_by_start):
        if start >= end:
            continue
        if start < last_end:
            if end > last_end:
                last_end = end
                merged[-1] = (merged[-1][0], end, merged[-1][2])
        else:
            merged.append((start, end, name))
            last_end = end
    return merged


def _by_start(span: Span) -> int:
    return span[0]            # a stable sort: at one start, the finder that came first names the secret


def first(text: str) -> Optional[str]:
    """The name of a rule that finds a secret in ``text``, or None (stops at the first)."""
    span = first_span(text)
    return None if span is None else span[2]


def first_span(text: str) -> Optional[Span]:
    """The first secret a rule finds in ``text`` (not necessarily the leftmost), or None; stops there."""
    for span in _all_spans(text):
        if span[0] < span[1]:
            return span
    return None


def mask(text: str, literals: Iterable[str] = ()) -> str:
    """``text`` with every secret replaced by ``[REDACTED:<rule>]``; the names, users and schemes around it
    stay, so the text still says what was there."""
    return _apply(text, find(text, literals))


def _apply(text: str, spans: List[Span]) -> str:
    if not spans:
        return text
    out, pos = [], 0
    for start, end, name in spans:
        out.append(text[pos:start])
        out.append(f"[REDACTED:{name}]")
        pos = end
    out.append(text[pos:])
    return "".join(out)


def mask_value(value, literals: Iterable[str] = ()):
    """A JSON value with every string masked, keys included; the value of a key named like a secret
    (``PRIVATE-TOKEN``, ``passphrase``, ``auth``) goes whole. Its strings are read in one pass, joined by
    newlines (no rule matches across a line break), not one by one: metadata of many short strings costs
    what its text does."""
    strings: List[str] = []
    _strings_of(value, strings)
    joined = "\n".join(strings)
    starts, at = [], 0
    for text in strings:
        starts.append(at)
        at += len(text) + 1
    per_string: dict = {}
    for start, stop, name in _all_spans(joined, literals):
        k = bisect_right(starts, start) - 1       # a block that runs on (a cut-off key) ends with its string
        if start < stop:
            per_string.setdefault(k, []).append((start - starts[k], min(stop - starts[k], len(strings[k])), name))
    masked = {starts[k]: _apply(strings[k], _merged(spans)) for k, spans in per_string.items()}
    return _rebuild(value, iter(strings), masked, [0])


def _strings_of(value, out: List[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, list):
        for v in value:
            _strings_of(v, out)
    elif isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str):
                out.append(k)
            _strings_of(v, out)


def _rebuild(value, strings, masked: dict, at: list):
    """``value`` again, each of its strings (in ``_strings_of``'s order) replaced by its masked form."""
    def next_string() -> str:
        text = next(strings)
        out = masked.get(at[0], text)
        at[0] += len(text) + 1
        return out
    if isinstance(value, str):
        return next_string()
    if isinstance(value, list):
        return [_rebuild(v, strings, masked, at) for v in value]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            key = next_string() if isinstance(k, str) else k
            inner = _rebuild(v, strings, masked, at)
            secret = isinstance(k, str) and secret_name(k) and v not in (None, "", False, [], {})
            out[key] = "[REDACTED:secret_name]" if secret else inner
        return out
    return value
