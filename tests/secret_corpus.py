"""Secret shapes and near-misses for the one secret detector (clients/python/context_mode_client/secretscan.py),
shared by its tests, the hooks' masking tests and the registry's refusal tests.

Every value follows its issuer's published format (gitleaks' rule for it, or the issuer's documentation) but is
made up here from a seeded generator: none is a live credential. ``SECRETS`` holds (shape, text, secret): the
secret must leave the text; ``NEAR_MISSES`` holds technical text that must come back unchanged.
"""
from __future__ import annotations

import base64
import random
import string

_RNG = random.Random(39)
ALNUM = string.ascii_letters + string.digits
LOWER_ALNUM = string.ascii_lowercase + string.digits
HEX = "0123456789abcdef"
UPPER_ALNUM = string.ascii_uppercase + string.digits
URLSAFE = ALNUM + "_-"
B64 = ALNUM + "+/"


def r(alphabet: str, n: int) -> str:
    """``n`` characters of ``alphabet``, mixed: at least one upper, lower and digit when it has them."""
    while True:
        out = "".join(_RNG.choice(alphabet) for _ in range(n))
        kinds = [set(alphabet) & set(k) for k in (string.ascii_uppercase, string.ascii_lowercase, string.digits)]
        if all(not k or set(out) & k for k in kinds) or n < 6:
            return out


def pem(kind: str) -> str:
    body = "\n".join(r(B64, 64) for _ in range(6))
    label = f"{kind} PRIVATE KEY" if kind else "PRIVATE KEY"
    return f"-----BEGIN {label}-----\n{body}\n-----END {label}-----"


PUTTY = ("PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nComment: deploy@ci\nPublic-Lines: 2\n"
         f"{r(B64, 64)}\n{r(B64, 20)}\nPrivate-Lines: 1\n{r(B64, 44)}\nPrivate-MAC: {r(HEX, 64)}")
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9." + base64.urlsafe_b64encode(b'{"sub":"user-42","exp":1900000000}')
       .decode().rstrip("=") + "." + r(URLSAFE, 43))
BASIC = base64.b64encode(b"deploy:" + r(ALNUM, 14).encode()).decode()

# (shape, text with {} where the secret goes, the secret)
_SHAPES = [
    # cloud providers
    ("aws-access-key-id", "AWS_ACCESS_KEY_ID={}", "AKIA" + r(UPPER_ALNUM, 16)),
    ("aws-session-key-id", "aws_access_key_id = {}", "ASIA" + r(UPPER_ALNUM, 16)),
    ("aws-secret-bare", "the secret key is {} (from the console)", r(ALNUM + "/+", 40)),
    ("aws-secret-ini", "aws_secret_access_key = {}", r(ALNUM + "/+", 40)),
    ("aws-secret-json", '{{"SecretAccessKey": "{}"}}', r(ALNUM + "/+", 40)),
    ("aws-session-token", "AWS_SESSION_TOKEN={}", "IQoJb3JpZ2luX2Vj" + r(B64, 120)),
    ("aws-bedrock", "BEDROCK_KEY {}", "ABSK" + r(B64, 120)),
    ("gcp-api-key", "maps key: {}", "AIza" + r(URLSAFE, 35)),
    ("google-oauth-secret", '{{"client_secret": "{}"}}', "GOCSPX-" + r(URLSAFE, 28)),
    ("google-access-token", "token {} expires in 3599", "ya29." + r(URLSAFE, 60)),
    ("azure-storage-connection", "DefaultEndpointsProtocol=https;AccountName=acme;AccountKey={};EndpointSuffix=core.windows.net",
     r(B64, 86) + "=="),
    ("azure-sas-sig", "https://acme.blob.core.windows.net/c/f.txt?sv=2022-11-02&sr=b&sp=r&sig={}", r(ALNUM, 43) + "%3D"),
    ("azure-service-bus", "Endpoint=sb://acme.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey={}",
     r(B64, 43) + "="),
    ("azure-ad-client-secret", "AZURE_CLIENT_SECRET {}", "xYz8Q~" + r(ALNUM + "_~.-", 34)),
    ("alibaba-key-id", "accessKeyId {}", "LTAI" + r(ALNUM, 20)),
    ("digitalocean-pat", "doctl auth init -t {}", "dop_v1_" + r(HEX, 64)),
    ("digitalocean-oauth", "token: {}", "doo_v1_" + r(HEX, 64)),
    ("heroku-v2", "HEROKU_API_KEY {}", "HRKU-AA" + r(URLSAFE, 58)),
    ("flyio-token", "fly deploy --access-token {}", "fo1_" + r(URLSAFE, 43)),
    ("databricks", "DATABRICKS {}", "dapi" + r(HEX, 32)),
    # source hosting and registries
    ("github-pat", "GITHUB_TOKEN={}", "ghp_" + r(ALNUM, 36)),
    ("github-oauth", "oauth {}", "gho_" + r(ALNUM, 36)),
    ("github-fine-grained", "GH_PAT={}", "github_pat_11" + r(ALNUM + "_", 80)),
    ("github-app-in-url", "remote: https://x-access-token:{}@github.com/acme/app.git", "ghs_" + r(ALNUM, 36)),
    ("gitlab-pat", "GITLAB {}", "glpat-" + r(URLSAFE, 20)),
    ("gitlab-runner", "runner token {}", "glrt-" + r(URLSAFE, 20)),
    ("gitlab-deploy", "deploy token {}", "gldt-" + r(URLSAFE, 20)),
    ("gitlab-private-token-header", "curl --header 'PRIVATE-TOKEN: {}' https://gitlab.example.com/api/v4/projects",
     r(ALNUM, 20)),
    ("npm-token", "NPM {}", "npm_" + r(ALNUM, 36)),
    ("npmrc", "//registry.npmjs.org/:_authToken={}", r(ALNUM, 36)),
    ("pypi-token", "password = {}", "pypi-AgEIcHlwaS5vcmc" + r(URLSAFE, 60)),
    ("huggingface", "HF {}", "hf_" + r(ALNUM, 34)),
    ("rubygems", "GEM_HOST_API_KEY: {}", "rubygems_" + r(HEX, 48)),
    ("clojars", "deploy with {}", "CLOJARS_" + r(LOWER_ALNUM, 60)),
    ("artifactory", "X-JFrog {}", "AKCp" + r(ALNUM, 69)),
    ("postman", "postman key {}", "PMAK-" + r(HEX, 24) + "-" + r(HEX, 34)),
    ("pulumi", "PULUMI {}", "pul-" + r(HEX, 40)),
    ("sourcegraph", "src token {}", "sgp_" + r(HEX, 16) + "_" + r(HEX, 40)),
    ("terraform-cloud", "credentials app.terraform.io {{ token = {} }}", r(LOWER_ALNUM, 14) + ".atlasv1." + r(URLSAFE, 64)),
    ("doppler", "DOPPLER {}", "dp.pt." + r(ALNUM, 43)),
    ("dynatrace", "DT {}", "dt0c01." + r(UPPER_ALNUM, 24) + "." + r(UPPER_ALNUM, 64)),
    ("grafana-service-account", "grafana {}", "glsa_" + r(ALNUM, 32) + "_" + r(HEX, 8)),
    ("grafana-cloud", "grafana cloud {}", "glc_" + r(ALNUM, 40)),
    ("linear", "LINEAR {}", "lin_api_" + r(ALNUM, 40)),
    ("notion", "NOTION {}", "ntn_" + r(string.digits, 11) + r(ALNUM, 35)),
    ("sentry-user", "SENTRY {}", "sntryu_" + r(HEX, 64)),
    ("new-relic", "NEW_RELIC {}", "NRAK-" + r(UPPER_ALNUM, 27)),
    ("planetscale", "PSCALE {}", "pscale_tkn_" + r(URLSAFE, 43)),
    ("vault-service", "VAULT_TOKEN {}", "hvs." + r(URLSAFE, 95)),
    ("vault-batch", "batch {}", "hvb." + r(URLSAFE, 140)),
    ("age-secret-key", "# created: 2024-01-01\n{}", "AGE-SECRET-KEY-1" + r("QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L", 58)),
    ("typeform", "TYPEFORM {}", "tfp_" + r(URLSAFE, 59)),
    ("perplexity", "PPLX {}", "pplx-" + r(ALNUM, 48)),
    # AI providers
    ("anthropic", "ANTHROPIC_API_KEY {}", "sk-ant-api03-" + r(URLSAFE, 93) + "AA"),
    ("openai-project", "export OPENAI_API_KEY {}", "sk-proj-" + r(URLSAFE, 60)),
    ("openai-legacy", "openai {}", "sk-" + r(ALNUM, 48)),
    # payments
    ("stripe-secret", '{{"stripe": "{}"}}', "sk_live_51" + r(ALNUM, 30)),
    ("stripe-restricted", "STRIPE {}", "rk_live_51" + r(ALNUM, 30)),
    ("stripe-webhook", "whsec {}", "whsec_" + r(ALNUM, 32)),
    ("square", "SQUARE {}", "EAAA" + r(URLSAFE, 60)),
    ("shopify", "SHOPIFY {}", "shpat_" + r(HEX, 32)),
    ("easypost", "EASYPOST {}", "EZAK" + r(ALNUM, 54)),
    ("shippo", "SHIPPO {}", "shippo_live_" + r(HEX, 40)),
    # messaging and mail
    ("slack-bot", "SLACK_BOT_TOKEN={}", "xoxb-2048" + r(string.digits, 5) + "-4096" + r(string.digits, 6) + "-" + r(ALNUM, 24)),
    ("slack-user", "slack {}", "xoxp-" + r(string.digits, 11) + "-" + r(string.digits, 11) + "-" + r(ALNUM, 32)),
    ("slack-app", "SLACK_APP {}", "xapp-1-A" + r(UPPER_ALNUM, 10) + "-" + r(string.digits, 13) + "-" + r(HEX, 64)),
    ("slack-webhook", "posting to {}", "https://hooks.slack.com/services/T" + r(UPPER_ALNUM, 8) + "/B" +
     r(UPPER_ALNUM, 8) + "/" + r(ALNUM, 24)),
    ("discord-webhook", "webhook {}", "https://discord.com/api/webhooks/1234567890123456789/" + r(URLSAFE, 68)),
    ("teams-webhook", "teams {}", "https://acme.webhook.office.com/webhookb2/" + r(HEX, 8) + "-1111-2222-3333-" +
     r(HEX, 12) + "@" + r(HEX, 8) + "-aaaa-bbbb-cccc-" + r(HEX, 12) + "/IncomingWebhook/" + r(HEX, 32) + "/" +
     r(HEX, 8) + "-dddd-eeee-ffff-" + r(HEX, 12)),
    ("telegram-bot", "TELEGRAM {}", r(string.digits, 10) + ":AA" + r(URLSAFE, 33)),
    ("discord-bot", "DISCORD {}", "M" + r(ALNUM, 25) + "." + r(URLSAFE, 6) + "." + r(URLSAFE, 38)),
    ("sendgrid", "SENDGRID_API_KEY {}", "SG." + r(URLSAFE, 22) + "." + r(URLSAFE, 43)),
    ("sendinblue", "BREVO {}", "xkeysib-" + r(HEX, 64) + "-" + r(ALNUM, 16)),
    ("twilio-api-key", "TWILIO {}", "SK" + r(HEX, 32)),
    ("mailgun", "MAILGUN {}", "key-" + r(HEX, 32)),
    ("mailchimp", "MAILCHIMP {}", r(HEX, 32) + "-us21"),
    ("mapbox", "MAPBOX {}", "sk.eyJ1IjoiYWNtZSIsImEiOiJ" + r(URLSAFE, 40) + "." + r(URLSAFE, 22)),
    # identity, headers, generic
    ("jwt", "id_token={}", JWT),
    ("context-mode-key", "CONTEXT_API_KEY={}", "cms_" + r(URLSAFE, 43)),
    ("okta", "OKTA {}", "00" + r(URLSAFE, 40)),
    ("bearer-header", "curl -H 'Authorization: Bearer {}' https://api.example.com", r(URLSAFE, 40)),
    ("bearer-json", '{{"headers": {{"Authorization": "Bearer {}"}}}}', r(URLSAFE, 40)),
    ("basic-header", "curl -H 'Authorization: Basic {}' https://intranet", BASIC),
    ("authorization-token", "Authorization: Token {}", r(HEX, 40)),
    ("x-api-key", "X-Api-Key: {}", r(ALNUM, 32)),
    ("x-auth-token", "X-Auth-Token: {}", r(ALNUM, 32)),
    ("cookie", "Cookie: {}", "session=" + r(ALNUM, 32)),
    ("db-password-env", "DB_PASSWORD={}", "correct-horse-battery-staple"),
    ("password-yaml", "database:\n  user: orders\n  password: {}\n  host: db", "Tr0ub4dor&3"),
    ("password-json", '{{"password":"{}"}}', "P@ssw0rd!2024"),
    ("passphrase", "passphrase: {}", "hunter2-is-not-a-passphrase"),
    ("pgpassword", "PGPASSWORD={} psql -h db", "s3cr3t!pg"),
    ("mysql-root-quoted", 'MYSQL_ROOT_PASSWORD="{}"', "root pass with spaces"),
    ("jwt-secret", "JWT_SECRET={}", r(HEX, 32)),
    ("django-secret", "SECRET_KEY = '{}'", "django-insecure-8#x@!v2k" + r(ALNUM, 20)),
    ("password-confirmation", "password_confirmation={}", "Sommer2024!"),
    ("mysql-p", "mysql -u root -p{} orders", "Root_pw_2024"),
    ("mariadb-p", "mariadb -h db -u app -p{}", "mariaPW99"),
    ("curl-u", "curl -u deploy:{} https://api.example.com/v1", "Deploy!Pass1"),
    ("curl-user-quoted", "curl --user 'ci:{}' https://nexus.example.com", "n3xus-Pa55"),
    ("netrc-line", "machine api.example.com login deploy password {}", "netrcPass42"),
    ("netrc-lines", "machine api.example.com\n  login deploy\n  password {}\n", "netrcPass43"),
    ("docker-config-auth", '{{"auths": {{"registry.example.com": {{"auth": "{}"}}}}}}', BASIC),
    ("docker-login", "docker login -u bot --password {}", "dckr_pat_" + r(URLSAFE, 27)),
    ("api-key-option", "deploy --api-key {} --env prod", "live_" + r(HEX, 16)),
    ("sshpass", "sshpass -p {} ssh deploy@host", "sshPass!77"),
    # issue 50, L4: shapes the detector missed
    ("sshpass-quoted", "sshpass -p '{}' ssh deploy@host", "sshPass!78"),
    ("sshpass-double-quoted", 'sshpass -p "{}" scp a deploy@host:', "sshPass!79"),
    ("doppler-service-token", "DOPPLER_TOKEN {}", "dp.st." + r(ALNUM, 43)),
    ("doppler-service-token-config", "doppler run --token {}", "dp.st.prd." + r(ALNUM, 43)),
    ("github-pat-after-dash", "session sess-x-{} resumed", "ghp_" + r(ALNUM, 36)),
    ("redis-cli", "redis-cli -h cache -a {} PING", "r3dis-Auth"),
    ("url-postgres", "DATABASE_URL=postgres://orders:{}@db.internal:5432/orders", "Tr0ub4dor&3"),
    ("url-redis-no-user", "redis://:{}@cache:6379/0", "r3d1s-p4ss-w0rd"),
    ("url-git-https", "git clone https://deploy:{}@git.example.com/app.git", "gh-deploy-9f8e7d6c"),
    ("user-password-no-scheme", "proxy: squid:{}@proxy.internal:3128", "Pr0xyPass"),
    ("query-key", "https://maps.example.com/api/geocode?address=x&key={}", r(ALNUM, 39)),
    ("query-code", "https://acme.azurewebsites.net/api/hook?code={}", r(URLSAFE, 54) + "=="),
    ("fragment-access-token", "https://app.example.com/cb#access_token={}&token_type=bearer", r(URLSAFE, 40)),
    ("pem-rsa", "cat id_rsa\n{}\n$ ls", pem("RSA")),
    ("pem-openssh", "{}", pem("OPENSSH")),
    ("pem-ec", "key:\n{}", pem("EC")),
    ("pem-pkcs8", "{}", pem("")),
    ("pem-pgp", "{}", "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n" + r(B64, 64) + "\n-----END PGP PRIVATE KEY BLOCK-----"),
    ("putty", "{}", PUTTY),
    ("onepassword-service-account", "OP_SERVICE_ACCOUNT_TOKEN {}", "ops_eyJ" + r(B64, 260)),
]
SECRETS = [(shape, text.format(secret), secret) for shape, text, secret in _SHAPES]

# Metadata keys that name a secret, whatever their value looks like.
SECRET_KEYS = ["PRIVATE-TOKEN", "passphrase", "auth", "password", "X-Api-Key", "client_secret", "DB_PASS",
               "aws_secret_access_key", "Authorization", "refresh_token", "pass"]

_PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk" + r(B64, 600) + "=="
_JPEG = "data:image/jpeg;base64,/9j/4AAQSkZJRgABAQEASABIAAD" + r(B64, 800)
NEAR_MISSES = [
    "commit 3f786850e387550fdab836ed7e6dc881de23001b (HEAD -> main)",
    "Merge 9fceb02 into main; see a1b2c3d for the fix",
    "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "digest=9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "request id 550e8400-e29b-41d4-a716-446655440000 took 12 ms",
    "session_id: 4f1c2a9b-7d3e-4c1a-9b2f-0e8d7c6b5a49",
    f'<img src="{_PNG}">',
    f"background: url({_JPEG})",
    "PWD=/home/dev/orders OLDPWD=/home/dev",
    "/Users/Alice/Projects/OrdersService/src/Main1234",
    "订单 ORD-7890 已发货, tracking 1Z999AA10123456784",
    "https://docs.python.org/3/library/secrets.html#module-secrets",
    "Password reset emails are sent by the notifier service.",
    "password: the one you chose when you signed up",
    "tokenizer: bert-base-uncased",
    "max_tokens: 4096",
    "token_count=1523",
    "secret_name: db-credentials",
    "password: ${DB_PASSWORD}",
    "api_key: <your-api-key>",
    "password = os.environ['DB_PASSWORD']",
    "token = get_token(scope='read')",
    "def check(password: str) -> bool:",
    "if password == confirm: return True",
    "Authorization: Bearer <token>",
    "Use bearer authentication for the API.",
    "Basic authentication is disabled on this host.",
    "git@github.com:acme/app.git",
    "ssh://git@github.com:22/acme/app.git",
    "write to alice@example.com or mailto:bob@example.com",
    "https://user@example.com/path/to/page",
    "http://localhost:5000/mcp/search?q=ORD-7890&top_k=5",
    "https://example.com/list?page=2&sort=desc&q=orders",
    "the meeting is at 12:30 in room 4",
    "mysql -u root -p",
    "curl -u alice https://api.example.com/v1/me",
    "docker run -p 8080:80 -v /data:/data nginx",
    "npm install --save-dev typescript@5.4.0",
    "pip install requests==2.31.0",
    "fe80::1ff:fe23:4567:890a%eth0",
    "https://hooks.example.com/services/T000/B000",
    "The AKIA prefix marks an AWS access key id.",
    "sk-learn is not a thing; scikit-learn is",
    "the ghp_ prefix marks a GitHub token",
    "eyJhbGciOiJIUzI1NiJ9 is only a JWT header",
    "color: #ff00aa; margin: 0 auto;",
    "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAu1SU1LfVLPHCozMxH2Mo\n-----END PUBLIC KEY-----",
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl dev@laptop",
    "export PATH=/usr/local/bin:$PATH",
    "version v1.0-rc1 released 2024-05-01T10:00:00Z",
    "passing: 120, failing: 0, skipped: 3",
    "kind: Secret\nmetadata:\n  name: db-credentials",
]
