"""What the secret-scanner tests scan: credential-shaped values, innocent ones, a corpus.

Shared by ``test_secrets.py`` (the scanner's verdicts), ``test_secret_prefilter.py``
and ``test_secret_corpus.py`` (nothing reaches the log, the UI or the CLI). Every
credential-shaped value is built by concatenation from a fixed filler or a seeded
generator, so no file here contains a string a secret scanner would flag.
"""

from __future__ import annotations

import base64
import json
import random
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_saga.secrets import CredentialRef

__all__ = [
    "ALNUM",
    "B64",
    "CORPUS",
    "HEX",
    "INNOCENT_KWARGS",
    "KV",
    "QUERY",
    "SECRET_KEYS",
    "SHAPED",
    "Specimen",
    "b64",
    "fill",
]

ALNUM = "aB3dE5gH7jK9mN1pQ2rS4tU6vW8xY0zC"
HEX = "0a1b2c3d4e5f6789"
B64 = "aB3/dE5+gH7jK9mN1pQ2"


def fill(n: int, alphabet: str = ALNUM) -> str:
    """A deterministic, non-secret run of ``n`` characters from ``alphabet``."""
    return (alphabet * (n // len(alphabet) + 1))[:n]


def b64(text: str) -> str:
    """Standard base64 of ``text``."""
    return base64.b64encode(text.encode()).decode()


#: The kinds of the two string shapes that name a key or a query parameter.
KV = "value assigned to a secret-looking key"
QUERY = "credential in a URL query parameter"

# (fixture id, the full value, the secret part that must never be echoed, expected kind)
SHAPED: list[tuple[str, str, str, str]] = [
    ("stripe-live", "sk_" + "live_" + fill(24), fill(24), "Stripe secret key"),
    ("stripe-test", "sk_" + "test_" + fill(24), fill(24), "Stripe secret key"),
    ("stripe-restricted-live", "rk_" + "live_" + fill(24), fill(24), "Stripe restricted key"),
    ("stripe-restricted-test", "rk_" + "test_" + fill(24), fill(24), "Stripe restricted key"),
    ("stripe-webhook", "whsec" + "_" + fill(32), fill(32), "Stripe webhook secret"),
    ("openai-legacy", "sk" + "-" + fill(48), fill(48), "OpenAI API key"),
    ("openai-project", "sk" + "-proj-" + fill(64), fill(64), "OpenAI API key"),
    ("anthropic", "sk" + "-ant-api03-" + fill(80), fill(80), "Anthropic API key"),
    ("github-ghp", "gh" + "p_" + fill(36), fill(36), "GitHub token"),
    ("github-gho", "gh" + "o_" + fill(36), fill(36), "GitHub token"),
    ("github-ghu", "gh" + "u_" + fill(36), fill(36), "GitHub token"),
    ("github-ghs", "gh" + "s_" + fill(36), fill(36), "GitHub token"),
    ("github-ghr", "gh" + "r_" + fill(36), fill(36), "GitHub token"),
    ("github-fine-grained", "github" + "_pat_" + fill(82), fill(82), "GitHub token"),
    ("slack-bot", "xo" + "xb-" + "1234-" + fill(24), fill(24), "Slack token"),
    ("slack-user", "xo" + "xp-" + "1234-" + fill(24), fill(24), "Slack token"),
    ("slack-app-level", "xo" + "xa-" + "2-" + fill(24), fill(24), "Slack token"),
    ("slack-app", "xa" + "pp-1-" + fill(24), fill(24), "Slack token"),
    (
        "slack-webhook",
        "https://hooks." + "slack.com/services/T0000/B0000/" + fill(24),
        fill(24),
        "Slack webhook URL",
    ),
    (
        "aws-access-key-id",
        "AK" + "IA" + fill(16, "ABCDEFGHIJKLMNOP234567"),
        "",
        "AWS access key id",
    ),
    ("aws-session-key-id", "AS" + "IA" + fill(16, "QRSTUVWXYZ234567"), "", "AWS access key id"),
    ("google-api-key", "AI" + "za" + fill(35), fill(35), "Google API key"),
    ("google-oauth-secret", "GOCSPX" + "-" + fill(28), fill(28), "Google OAuth client secret"),
    ("google-oauth-token", "ya" + "29." + fill(60), fill(60), "Google OAuth access token"),
    ("gitlab", "gl" + "pat-" + fill(20), fill(20), "GitLab token"),
    ("twilio", "S" + "K" + fill(32, HEX), fill(32, HEX), "Twilio API key"),
    ("sendgrid", "S" + "G." + fill(22) + "." + fill(43), fill(43), "SendGrid API key"),
    ("npm", "np" + "m_" + fill(36), fill(36), "npm token"),
    ("pypi", "py" + "pi-AgEI" + fill(60), fill(60), "PyPI token"),
    ("huggingface", "h" + "f_" + fill(34), fill(34), "Hugging Face token"),
    (
        "azure-storage",
        "DefaultEndpointsProtocol=https;AccountName=acme;Account" + "Key=" + fill(40) + ";",
        fill(40),
        "password in a connection string",
    ),
    (
        "ado-connection-string",
        "Server=db;User Id=app;Pass" + "word=" + fill(12) + ";",
        fill(12),
        "password in a connection string",
    ),
    (
        "odbc-pwd",
        "DRIVER={x};UID=app;P" + "WD=" + fill(12),
        fill(12),
        "password in a connection string",
    ),
    (
        "pwd-query-parameter",
        "https://x.example/login?user=a&pw" + "d=" + fill(12),
        fill(12),
        "password in a connection string",
    ),
    (
        "url-credentials",
        "postgres://app:" + fill(12) + "@db.internal:5432/app",
        fill(12),
        "URL with embedded credentials",
    ),
    (
        "url-password-only",
        "redis://:" + fill(12) + "@cache:6379/0",
        fill(12),
        "URL with embedded credentials",
    ),
    ("bearer", "Bear" + "er " + fill(40), fill(40), "Bearer token"),
    ("bearer-header", "Authorization: Bear" + "er " + fill(40), fill(40), "Bearer token"),
    (
        "basic",
        "Bas" + "ic " + b64("svc:" + fill(12)),
        b64("svc:" + fill(12)),
        "Basic auth credentials",
    ),
    (
        "jwt",
        "ey" + "J" + b64('{"alg":"HS256"}').rstrip("=") + ".ey" + "JzdWIiOiIxIn0." + fill(43),
        fill(43),
        "JWT",
    ),
    (
        "pem-rsa",
        "-----BEGIN " + "RSA PRIVATE KEY-----\n" + fill(64) + "\n-----END RSA PRIVATE KEY-----",
        fill(64),
        "PEM private key",
    ),
    (
        "pem-pkcs8",
        "-----BEGIN " + "PRIVATE KEY-----\n" + fill(64) + "\n-----END PRIVATE KEY-----\n",
        fill(64),
        "PEM private key",
    ),
    (
        "pem-openssh",
        "-----BEGIN " + "OPENSSH PRIVATE KEY-----\n" + fill(64),
        fill(64),
        "PEM private key",
    ),
    (
        "pem-encrypted",
        "-----BEGIN " + "ENCRYPTED PRIVATE KEY-----\n" + fill(64),
        fill(64),
        "PEM private key",
    ),
    (
        "secret-inside-prose",
        "charge failed for key " + "sk_" + "live_" + fill(24) + " at 10:02",
        fill(24),
        "Stripe secret key",
    ),
    # KEY=value, KEY: value and export lines whose KEY is secret-looking, in any string.
    (
        "env-line-aws-secret",
        "AWS_SECRET" + "_ACCESS_KEY=" + fill(40, B64),
        fill(40, B64),
        KV,
    ),
    ("env-export", "export DATADOG" + "_API_KEY=" + fill(32, HEX), fill(32, HEX), KV),
    ("env-quoted", "SLACK_SIGNING" + '_SECRET="' + fill(32, HEX) + '"', fill(32, HEX), KV),
    ("python-assignment", "SECRET" + '_KEY = "' + fill(50) + '"', fill(50), KV),
    ("yaml-line", "database:\n  user: app\n  pass" + "word: " + fill(20) + "\n", fill(20), KV),
    (
        "json-in-a-string",
        '{"client_id": "app-42", "client' + '_secret": "' + fill(40) + '"}',
        fill(40),
        KV,
    ),
    ("http-header", "X-Api" + "-Key: " + fill(32), fill(32), KV),
    ("cookie-header", "Cookie: sessionid=" + fill(32, HEX) + "; theme=dark", fill(32, HEX), KV),
    (
        "access-token-in-a-query",
        "wss://stream.example.com/feed?access" + "_token=" + fill(40) + "&channel=prices",
        fill(40),
        KV,
    ),
    # URLs (and form bodies) whose query carries a credential parameter.
    (
        "azure-sas-url",
        "https://acct.blob.core.windows.net/c/b.csv?sv=2022-11-02&ss=b&sp=r"
        "&se=2030-01-01T00%3A00%3A00Z&si" + "g=" + fill(43) + "%3D",
        fill(43),
        QUERY,
    ),
    (
        "aws-presigned-signature",
        "https://b.s3.amazonaws.com/k.csv?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Expires=900"
        "&X-Amz-Sig" + "nature=" + fill(64, HEX),
        fill(64, HEX),
        QUERY,
    ),
    (
        "cloudfront-signature",
        "https://d1.cloudfront.net/v.mp4?Expires=1700000000&Sig" + "nature=" + fill(60, B64),
        fill(60, B64),
        QUERY,
    ),
    (
        "oauth-callback-code",
        "https://app.example.com/oauth/callback?co" + "de=4%2F0A" + fill(60) + "&state=af0ifj",
        fill(60),
        QUERY,
    ),
    (
        "api-key-parameter",
        "https://maps.example.com/geocode/json?address=Berlin&ke" + "y=" + fill(32),
        fill(32),
        QUERY,
    ),
    (
        "oauth-form-body",
        "grant_type=authorization_code&co" + "de=" + fill(32) + "&redirect_uri=https%3A%2F%2Fapp",
        fill(32),
        QUERY,
    ),
]

SECRET_KEYS = [
    "password",
    "passwd",
    "pwd",
    "secret",
    "client_secret",
    "api_key",
    "apikey",
    "APIKey",
    "X-Api-Key",
    "access_token",
    "accessToken",
    "refresh_token",
    "token",
    "auth",
    "authorization",
    "Authorization",
    "private_key",
    "credentials",
    "session_id",
    "sessionId",
    "SESSIONID",
    "cookie",
    "Set-Cookie",
    "dbPassword",
    "DB_PASSWORD",
    "userpasswd",
    "clientSecret",
    "aws_secret_access_key",
    "passphrase",
    "webhook_secret",
    "signing_key",
]

INNOCENT_KWARGS: list[tuple[str, dict[str, Any]]] = [
    ("stripe-object-ids", {"charge": "ch_123", "customer": "cus_abc", "account": "acct_1"}),
    ("payment-intent-id", {"payment_intent": "pi_" + fill(24)}),
    ("publishable-key", {"publishable_key": "pk_" + "live_" + fill(24)}),
    ("uuid", {"request_id": str(uuid.UUID(int=0x1234_5678_9ABC_DEF0_1234_5678_9ABC_DEF0))}),
    ("bare-prefixes", {"a": "sk_", "b": "sk_test_", "c": "sk-", "d": "eyJ", "e": "AKIA"}),
    ("short-words", {"currency": "usd", "note": "hi", "status": "ok"}),
    ("numbers-under-secret-keys", {"token_count": 5, "token": 123, "password": 0.5}),
    ("token-count", {"token_count": "5", "max_tokens": "1024", "input_tokens": "12"}),
    ("idempotency-key", {"idempotency_key": "saga-3f2a9c-step-1-attempt-2"}),
    ("credential-ref-name", {"credential_ref": "stripe_prod"}),
    ("password-reset-flag", {"password_reset_required": True, "password_changed_at": "2024-01-01"}),
    ("token-type", {"token_type": "bearer", "auth_type": "oauth", "oauth": "enabled"}),
    ("pagination-tokens", {"next_page_token": "abc123def456", "page_token": "CAEQAA"}),
    ("secret-metadata", {"secret_name": "prod/stripe", "secret_arn_ref": "x", "author": "alice"}),
    ("empty-or-null-secrets", {"password": "", "api_key": None, "token": "   "}),
    ("masked", {"password": "********", "api_key": "<redacted:Stripe secret key>"}),
    ("hex-digest", {"sha256": fill(64, HEX)}),
    ("long-base64-blob", {"attachment": fill(400, B64)}),
    (
        "plain-urls",
        {"url": "https://api.stripe.com/v1/charges?limit=3", "u": "https://user@h.io/x"},
    ),
    ("ssh-remote", {"remote": "git@github.com:org/repo.git", "email": "a.b@example.com"}),
    ("prose-with-keywords", {"note": "Bearer tokens expire; basic information about the order"}),
    ("word-continuations", {"job": "task_live_stream_" + fill(12), "sku": "desk-lamp-" + fill(40)}),
    ("boolean-conn-values", {"query": "reset_password=true&pwd=none"}),
    ("masked-url", {"dsn": "postgres://app:****@db.internal/app"}),
    (
        "code-and-template-stand-ins",
        {
            "content": "password = get_password()\nconnect(user=u, password=self.password)",
            "template": "Server={host};Password={pw};",
            "env": "DB_PWD=$DB_PWD",
            "doc": "postgres://user:<password>@host/db or scheme://user:password@host",
        },
    ),
    ("credential-ref", {"api_key": CredentialRef("stripe_prod")}),
    ("credential-ref-json", {"api_key": {"$credential_ref": "stripe_prod"}}),
    ("unknown-objects", {"when": object(), "path": Path("/tmp/x")}),
    # KEY=value and KEY: value that are not credentials.
    (
        "key-value-with-innocent-keys",
        {"note": "set retries=3 and mode=fast-2; sort_key=created_at2, the key: a map of 12"},
    ),
    (
        "keys-that-only-mention-a-secret-word",
        {
            "note": "max_tokens: 4096, token_count=12, next_page_token=CAEQAA2x, "
            "idempotency_key=saga-3f2a9c-step-1, token_type: Bearer, monkey: abc12345xyz"
        },
    ),
    (
        "prose-with-secret-words-and-colons",
        {"note": "Token: expired. Password: must be reset. Auth: failed for user bob."},
    ),
    (
        "code-that-names-a-secret",
        {
            "content": "self.api_key = api_key\ntoken: str | None = None\n"
            "password: Optional[str] = None\nsecret = os.environ['SECRET']\n"
            "headers = {'Authorization': f'Bearer {token}'}\nclient_secret=settings.CLIENT_SECRET"
        },
    ),
    (
        "config-templates",
        {
            "env": "API_KEY=${API_KEY}\nexport TOKEN=$TOKEN\nSECRET_KEY=your-secret-key-here\n"
            "AUTH_TOKEN=<paste-your-token>\nSESSION_SECRET=********",
            "ci": "token: ${{ secrets.GITHUB_TOKEN }}\npassword: '{{ vault_db_password }}'",
            "yaml": "auth:\n  type: oauth\n  token_url: https://id.example.com/token\n",
        },
    ),
    (
        "harmless-query-parameters",
        {
            "a": "https://shop.example.com/items?page=2&sort=asc&q=red+shoes",
            "b": "https://www.example.com/search?q=how+to+rotate+an+api+key&lang=en",
            "c": "https://api.example.com/v1/items?expand=prices&limit=100&cursor=c2VjcmV0",
        },
    ),
    (
        "short-or-wordy-code-and-key-parameters",
        {
            "a": "https://app.example.com/cb?code=US&state=ok",
            "b": "https://app.example.com/settings?key=notification-preferences",
            "c": "https://shop.example.com/checkout?code=SUMMER24",
        },
    ),
    (
        "code-key-and-signature-outside-a-query",
        {
            "a": "status code=500019283, key=73625abc9 in the cache",
            "b": "signature: Jane Doe 2024-01-01; sig=8f3a2c1b9d7e6f54",
            "c": '{"key": "user-settings-2", "code": 200, "signature": "a1b2c3d4e5f60718"}',
        },
    ),
]


# ------------------------------------------------------------------------- the corpus
#
# Realistic (fake, shape-correct) examples of every shape docs/secrets.md lists: real
# lengths, real surroundings (a .env file, a service-account JSON, a presigned URL).
# The random parts come from a seeded generator, so every run builds the same corpus
# and no two specimens share a fragment.

_RNG = random.Random(20240601)
_UPPER_DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
_B64_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_URL_SAFE = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def _rand(n: int, alphabet: str = ALNUM + "XYZxyz") -> str:
    """``n`` characters drawn by the corpus's seeded generator (mixed case and digits)."""
    while True:
        out = "".join(_RNG.choice(alphabet) for _ in range(n))
        # A credential mixes character classes; an all-letter draw would be a word.
        if any(c.isdigit() for c in out) or not any(c.isalpha() for c in alphabet):
            return out


def _b64url(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


def _pem(label: str, body: str) -> str:
    lines = "\n".join(body[i : i + 64] for i in range(0, len(body), 64))
    return f"-----BEGIN {label}-----\n{lines}\n-----END {label}-----\n"


@dataclass(frozen=True)
class Specimen:
    """A realistic text holding credentials: where it comes from, what must never leak.

    Attributes:
        id: What it is ("gcp-service-account-json").
        text: The whole value a tool, a human or an exception would carry.
        secrets: The credential parts of ``text``; none may appear anywhere.
    """

    id: str
    text: str
    secrets: tuple[str, ...]


def _specimens() -> list[Specimen]:
    out: list[Specimen] = []

    def add(id_: str, text: str, *secrets: str) -> None:
        out.append(Specimen(id_, text, secrets or (text,)))

    k = _rand(24)
    add("stripe-secret-key", "sk_" + "live_" + k, k)
    k = _rand(24)
    add("stripe-restricted-key", "rk_" + "live_" + k, k)
    k = _rand(32)
    add("stripe-webhook-secret", "whsec" + "_" + k, k)
    k = _rand(86, _URL_SAFE)
    add("anthropic-api-key", "sk-" + "ant-api03-" + k + "AA", k)
    k = _rand(64, _URL_SAFE)
    add("openai-project-key", "sk-" + "proj-" + k, k)
    k = _rand(48)
    add("openai-legacy-key", "sk-" + k, k)
    k = _rand(36)
    add("github-classic-token", "gh" + "p_" + k, k)
    a, b = _rand(22, _UPPER_DIGITS), _rand(59)
    add("github-fine-grained-token", "github" + "_pat_11" + a + "_" + b, a, b)
    k = _rand(36)
    add("github-app-token", "gh" + "s_" + k, k)
    k = _rand(24)
    add("slack-bot-token", "xo" + "xb-" + "2748519306-7392048561723-" + k, k)
    k = _rand(32, HEX)
    add("slack-user-token", "xo" + "xp-" + "2748519306-2748519307-7392048561724-" + k, k)
    k = _rand(24)
    hook = "https://hooks." + "slack.com/services/T024BE7LD/B01234ABCDE/" + k
    add("slack-webhook-url", hook, k)
    key_id, secret = "AK" + "IA" + _rand(16, _UPPER_DIGITS), _rand(40, _B64_CHARS)
    add(
        "aws-env-file",
        f"AWS_ACCESS_KEY_ID={key_id}\nAWS_SECRET" + f"_ACCESS_KEY={secret}\n"
        "AWS_DEFAULT_REGION=eu-west-1\n",
        key_id,
        secret,
    )
    k = _rand(35, _URL_SAFE)
    add("google-api-key", "AI" + "za" + k, k)
    k = _rand(28, _URL_SAFE)
    add("google-oauth-client-secret", "GOCSPX" + "-" + k, k)
    k = _rand(120, _URL_SAFE)
    add("google-oauth-access-token", "ya" + "29." + k, k)
    body = _rand(1216, _B64_CHARS)
    account = {
        "type": "service_account",
        "project_id": "acme-prod",
        "private_key_id": _rand(40, HEX),
        "private" + "_key": _pem("PRIVATE" + " KEY", body),
        "client_email": "deployer@acme-prod.iam.gserviceaccount.com",
        "client_id": "104729318475629184756",
        "token_uri": "https://oauth2.googleapis.com/token",
    }
    add("gcp-service-account-json", json.dumps(account, indent=2), body[:64], body[-64:])
    k = _rand(20, _URL_SAFE)
    add("gitlab-token", "gl" + "pat-" + k, k)
    k = _rand(32, HEX)
    add("twilio-api-key", "S" + "K" + k, k)
    a, b = _rand(22, _URL_SAFE), _rand(43, _URL_SAFE)
    add("sendgrid-api-key", "S" + "G." + a + "." + b, a, b)
    k = _rand(36)
    add("npm-token", "np" + "m_" + k, k)
    k = _rand(120, _URL_SAFE)
    add("pypi-token", "py" + "pi-AgEIcHlwaS5vcmc" + k, k)
    k = _rand(34)
    add("hugging-face-token", "h" + "f_" + k, k)
    sig = _rand(86, _URL_SAFE)
    jwt = (
        "ey" + _b64url({"alg": "RS256", "typ": "JWT"})[2:] + "."
        + _b64url({"sub": "1234567890", "iss": "https://id.example.com", "exp": 1900000000})
        + "." + sig
    )  # fmt: skip
    add("jwt", jwt, sig)
    body = _rand(1600, _B64_CHARS)
    add("pem-rsa-private-key", _pem("RSA PRIVATE" + " KEY", body), body[:64], body[-64:])
    body = _rand(400, _B64_CHARS)
    add("pem-openssh-private-key", _pem("OPENSSH PRIVATE" + " KEY", body), body[:64])
    k = _rand(86, _B64_CHARS)
    add(
        "azure-storage-connection-string",
        "DefaultEndpointsProtocol=https;AccountName=acmeprod;Account"
        + "Key=" + k + "==;EndpointSuffix=core.windows.net",
        k,
    )  # fmt: skip
    k = _rand(43, _B64_CHARS)
    add(
        "azure-service-bus-connection-string",
        "Endpoint=sb://acme.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccess" + "Key=" + k + "=",
        k,
    )
    k = _rand(18, ALNUM + "!#%")
    add(
        "sql-server-connection-string",
        "Server=tcp:acme.database.windows.net,1433;Database=app;User ID=app;Pass"
        + "word=" + k + ";Encrypt=True;",
        k,
    )  # fmt: skip
    k = _rand(16)
    add("postgres-url", "postgresql://app:" + k + "@db.internal:5432/app?sslmode=require", k)
    k = _rand(16)
    add("mysql-url", "mysql://root:" + k + "@10.0.0.5:3306/shop", k)
    k = _rand(16)
    add("mongodb-srv-url", "mongodb+srv://svc:" + k + "@cluster0.ab1cd.mongodb.net/?w=majority", k)
    k = _rand(24)
    add("redis-url", "rediss://:" + k + "@cache.internal:6380/0", k)
    k = _rand(40, _URL_SAFE)
    add("bearer-header", "Authorization: Bear" + "er " + k, k)
    creds = b64("svc-deploy:" + _rand(16))
    add("basic-auth-header", "Authorization: Bas" + "ic " + creds, creds)
    k = _rand(32, HEX)
    add("env-export-line", "export DATADOG" + "_API_KEY=" + k, k)
    k = _rand(20)
    add("env-password-line", "DB_HOST=db.internal\nDB_PASS" + "WORD=" + k + "\n", k)
    k = _rand(24)
    add("yaml-password", "database:\n  user: app\n  pass" + "word: " + k + "\n", k)
    k = _rand(40)
    add("json-client-secret", '{"client_id": "app-42", "client' + '_secret": "' + k + '"}', k)
    k = _rand(32)
    add("api-key-header", "X-Api" + "-Key: " + k, k)
    k = _rand(50, ALNUM + "!@#%^*-_=+")
    add("django-settings", "DEBUG = False\nSECRET" + '_KEY = "django-insecure-' + k + '"\n', k)
    a, b = _rand(32, HEX), _rand(32)
    add("cookie-header", "Cookie: sessionid=" + a + "; csrftoken=" + b, a, b)
    k = _rand(43)
    add(
        "azure-sas-url",
        "https://acmeprod.blob.core.windows.net/exports/report.csv?sv=2022-11-02&ss=b&srt=o"
        "&sp=r&se=2030-01-01T00%3A00%3A00Z&spr=https&si" + "g=" + k + "%3D",
        k,
    )
    key_id, sig = "AK" + "IA" + _rand(16, _UPPER_DIGITS), _rand(64, HEX)
    add(
        "aws-presigned-url",
        "https://acme-exports.s3.eu-west-1.amazonaws.com/report.csv"
        "?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=" + key_id
        + "%2F20240101%2Feu-west-1%2Fs3%2Faws4_request&X-Amz-Date=20240101T000000Z"
        "&X-Amz-Expires=900&X-Amz-SignedHeaders=host&X-Amz-Sig" + "nature=" + sig,
        key_id,
        sig,
    )  # fmt: skip
    k = _rand(70, _URL_SAFE)
    add(
        "oauth-callback-url",
        "https://app.example.com/oauth/callback?co" + "de=4%2F0A" + k + "&state=af0ifjsldkj",
        k,
    )
    k = _rand(32)
    add(
        "api-key-in-a-url",
        "https://api.example-maps.com/geocode/json?address=Berlin&ke" + "y=" + k,
        k,
    )
    a, b = _rand(32), _rand(40)
    add(
        "oauth-token-request-body",
        "grant_type=authorization_code&co" + "de=" + a + "&redirect_uri=https%3A%2F%2Fapp"
        "&client_id=app-42&client" + "_secret=" + b,
        a,
        b,
    )
    k = _rand(48)
    add("websocket-access-token", "wss://stream.example.com/v1/feed?access" + "_token=" + k, k)
    return out


#: Every shape docs/secrets.md lists, each in a realistic setting.
CORPUS: list[Specimen] = _specimens()
