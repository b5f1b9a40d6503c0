"""The tool contract: what a registered tool may hold, checked before anything is stored.

A tool is a name, a description, an endpoint, an ``auth_type``, tags, metadata, and input/output
schemas checked as JSON Schema 2020-12 (``jsonschema``). No credential is ever stored: every string of
a tool is checked, keys included (title, description, metadata, every schema keyword and value, the
endpoint's user info, query and fragment); only the kind of auth is kept. Schemas' $ref and $id are
local pointers or anchors, recursive only through a deeper part of the instance, with a bounded
expansion (service/schemarefs.py).
service/store/sqlite/registry.py stores and searches what passes.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

# The client's secret detector, the one the hooks mask with (tests/test_code_shape.py, SERVICE_USES_OF_THE_CLIENT)
from context_mode_client import secretscan

from .errors import ApiError, BadRequest, NotFound, Unprocessable
from .formats import is_tool_name
from .params import plain_text
from .schemarefs import check_refs
from .units import _check_metadata_values
from .uris import tool_uri

TAG_RE = re.compile(r"[a-z0-9][a-z0-9_.:-]{0,63}")
AUTH_TYPES = ("none", "api_key", "bearer", "basic", "oauth2", "custom")
FIELDS = ("name", "title", "description", "endpoint", "auth_type", "tags", "metadata", "input_schema",
          "output_schema")
MAX_TITLE, MAX_DESCRIPTION, MAX_ENDPOINT, MAX_TAGS = 200, 8192, 2048, 32
MAX_SCHEMA_BYTES = 256 * 1024
MAX_SCHEMA_DEPTH = 64
MAX_SEARCH_QUERY = 4096
DRAFT_2020_12 = ("https://json-schema.org/draft/2020-12/schema", "https://json-schema.org/draft/2020-12/schema#")

# Credentials are refused wherever they may hide (metadata keys and values, the endpoint, schema defaults and
# examples, the description), found by the client package's one secret detector, the one the hooks mask with:
# linear in its input, so a registration cannot hold a worker (issue 39, findings 5 and 6).
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


class CredentialRefused(Unprocessable):
    code = "credential_not_allowed"

    def __init__(self, where: str):
        super().__init__(f"{where} looks like a credential. The registry never stores credentials: keep only "
                         "'auth_type' here and the secret in the caller's own configuration.", field=where)


@dataclass(frozen=True)
class Tool:
    name: str
    title: str | None
    description: str
    endpoint: str | None
    auth_type: str
    tags: tuple[str, ...]
    metadata: dict | None
    input_schema: dict
    output_schema: dict | None


def _secret_key(key: str) -> bool:
    return secretscan.secret_name(key)


def _secret_value(key: str, value) -> bool:
    """A value under a key named like a secret: any for password, token, ...; a string for auth, sig (an
    object under "auth" describes the auth, and is scanned like any other)."""
    if value in (None, "", False):
        return False
    return secretscan.secret_name(key, strict=True) or (secretscan.secret_name(key) and isinstance(value, str))


class _Texts:
    """The strings of one part of a tool, checked for credentials together: the detector reads them joined by
    newlines (no rule matches across a line break) in one pass, not once per string (a 40,000-string enum
    took 3 s one by one); only a refusal looks up which string it was."""

    def __init__(self):
        self.paths: list[str] = []
        self.texts: list[str] = []

    def add(self, text: str, path: str) -> None:
        self.paths.append(path)
        self.texts.append(text)

    def check(self) -> None:
        if not self.texts:
            return
        hit = secretscan.first_span("\n".join(self.texts))
        if hit is None:
            return
        start, at = hit[0], 0
        for path, text in zip(self.paths, self.texts):
            if start <= at + len(text):
                raise CredentialRefused(path)
            at += len(text) + 1
        raise CredentialRefused(self.paths[-1])


def _scan(value, where: str, *, keys: bool, texts: _Texts | None = None) -> None:
    """Refuse a credential-looking key (when ``keys``) or string value anywhere in ``value``; its strings are
    checked when this returns, or with ``texts`` when its caller checks them."""
    mine = texts is None
    texts = _Texts() if texts is None else texts
    stack = [(value, where)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            texts.add(item, path)
        elif isinstance(item, dict):
            for k, v in item.items():
                if keys and _secret_value(str(k), v):
                    raise CredentialRefused(f"{path}.{k}")
                texts.add(str(k), f"{path}.{k}")
                stack.append((v, f"{path}.{k}"))
        elif isinstance(item, list):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(item))
    if mine:
        texts.check()


_NAMED = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_LITERALS = ("default", "const", "examples", "enum")


def _schema_values(schema, where: str) -> None:
    """Every string in a schema, keys included, holds no credential: literal values (default, const,
    examples, enum) are scanned with their keys, a credential-named keyword (``x-api-key``) may carry no
    value, a credential-named property no literal value, and every other string is scanned as text."""
    texts = _Texts()
    stack = [(schema, where, False)]
    while stack:
        node, path, secret_named = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                key = str(k)
                texts.add(key, path)
                if key in _LITERALS:
                    _scan(v, f"{path}.{key}", keys=True, texts=texts)
                    if secret_named and v not in (None, "", False, []):
                        raise CredentialRefused(f"{path}.{key}")
                elif key in _NAMED and isinstance(v, dict):
                    for name, sub in v.items():
                        texts.add(str(name), f"{path}.{key}")
                        stack.append((sub, f"{path}.{key}.{name}", _secret_key(str(name))))
                else:
                    if _secret_key(key) and not isinstance(v, (dict, list, bool)) and v not in (None, ""):
                        raise CredentialRefused(f"{path}.{key}")
                    stack.append((v, f"{path}.{key}", False))
        elif isinstance(node, list):
            stack.extend((v, f"{path}[{i}]", False) for i, v in enumerate(node))
        elif isinstance(node, str):
            texts.add(node, path)
    texts.check()


def _refs(schema, name: str) -> None:
    """$ref and $id point inside the schema only, recursion is told apart from expansion (schemarefs)."""
    def bad(msg):
        return BadRequest(f"Field {name!r}: {msg}", code="invalid_schema", field=name)
    check_refs(schema, bad)


def _string(raw: dict, name: str, limit: int, *, required: bool = False) -> str | None:
    value = raw.get(name)
    if value is None:
        if required:
            raise BadRequest(f"Field {name!r} is required.", code="missing_field", field=name)
        return None
    if not isinstance(value, str) or (required and not value.strip()):
        raise BadRequest(f"Field {name!r} must be a{' non-empty' if required else ''} string.", field=name)
    if len(value) > limit:
        raise BadRequest(f"Field {name!r} must be at most {limit} characters.", field=name)
    if "\0" in value:       # (text for people and models; PostgreSQL's text cannot hold it either)
        raise BadRequest(f"Field {name!r} must not contain NUL characters.", field=name)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(f"Field {name!r} is not valid Unicode (lone surrogate).", field=name) from None
    return value


def _endpoint(raw: dict) -> str | None:
    value = _string(raw, "endpoint", MAX_ENDPOINT)
    if value is None:
        return None
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        raise BadRequest("Field 'endpoint' must be an http(s) URL.", code="invalid_endpoint", field="endpoint") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or _CONTROL_RE.search(value) or port == 0:
        raise BadRequest("Field 'endpoint' must be an http(s) URL with a host.", code="invalid_endpoint",
                         field="endpoint")
    if parts.username is not None or parts.password is not None:
        raise CredentialRefused("endpoint")
    for key, val in parse_qsl(parts.query, keep_blank_values=True) + parse_qsl(parts.fragment, keep_blank_values=True):
        if secretscan.secret_param(key) and val:
            raise CredentialRefused("endpoint")
    _scan(value, "endpoint", keys=False)
    return value


def _json_schema(raw: dict, name: str, *, required: bool) -> dict | None:
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError
    schema = raw.get(name)
    if schema is None:
        if required:
            raise BadRequest(f"Field {name!r} is required (a JSON Schema of the tool's arguments).",
                             code="missing_field", field=name)
        return None
    if not isinstance(schema, dict):
        raise BadRequest(f"Field {name!r} must be a JSON Schema object.", code="invalid_schema", field=name)
    try:
        _check_metadata_values(schema, MAX_SCHEMA_DEPTH)
    except BadRequest as e:
        raise BadRequest(e.message.replace("'metadata'", repr(name)), code="invalid_schema", field=name) from None
    try:
        size = len(json.dumps(schema, ensure_ascii=False, allow_nan=False).encode("utf-8"))
    except (ValueError, UnicodeEncodeError):
        raise BadRequest(f"Field {name!r} is not serializable JSON.", code="invalid_schema", field=name) from None
    if size > MAX_SCHEMA_BYTES:
        raise BadRequest(f"Field {name!r} exceeds {MAX_SCHEMA_BYTES} bytes serialized.", code="schema_too_large",
                         field=name)
    declared = schema.get("$schema")
    if declared is not None and declared not in DRAFT_2020_12:
        raise BadRequest(f"Field {name!r}: only JSON Schema 2020-12 is accepted ($schema {DRAFT_2020_12[0]!r} "
                         "or none).", code="invalid_schema", field=name)
    if schema.get("type") != "object":
        raise BadRequest(f"Field {name!r} must describe a JSON object (\"type\": \"object\"), as MCP tools "
                         "take and return objects.", code="invalid_schema", field=name)
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path)[:120]
        raise BadRequest(f"Field {name!r} is not a valid JSON Schema 2020-12"
                         f"{' at ' + where if where else ''}: {e.message[:200]}", code="invalid_schema",
                         field=name) from None
    except (RecursionError, ValueError, TypeError):
        raise BadRequest(f"Field {name!r} is not a valid JSON Schema 2020-12.", code="invalid_schema",
                         field=name) from None
    _schema_values(schema, name)
    _refs(schema, name)
    return schema


def validate_tool(raw, config, *, name: str | None = None) -> Tool:
    """Check one tool description; raise ApiError (400, 422 for credentials) on the first problem.
    ``name`` is the one in the URL of an update: the body may repeat it, not change it."""
    if not isinstance(raw, dict):
        raise BadRequest("A tool must be a JSON object.", code="invalid_body")
    for key in raw:
        if key not in FIELDS:
            if _secret_key(str(key)) or str(key).lower() in ("auth", "headers", "header"):
                raise CredentialRefused(str(key)[:64])
            raise BadRequest(f"Unknown field {str(key)[:64]!r}; allowed fields are {', '.join(FIELDS)}.",
                             code="unknown_field", field=str(key)[:64])
    given = raw.get("name", name)
    if name is not None and given != name:
        raise BadRequest("Field 'name' must equal the name in the URL (a tool is renamed by deleting it and "
                         "registering it again).", field="name")
    if given is None:
        raise BadRequest("Field 'name' is required.", code="missing_field", field="name")
    if not is_tool_name(given):
        raise BadRequest("Field 'name' must be 1-128 letters, digits, '_', '-' or '.', starting with a letter or "
                         "digit.", code="invalid_name", field="name")
    _scan(given, "name", keys=False)         # (a name is shown to every reader, as a tag is: no token in it, issue 50 I2)
    title = _string(raw, "title", MAX_TITLE)
    if title is not None:
        _scan(title, "title", keys=False)
    description = _string(raw, "description", MAX_DESCRIPTION, required=True)
    _scan(description, "description", keys=False)
    endpoint = _endpoint(raw)
    auth_type = raw.get("auth_type", "none")
    if auth_type not in AUTH_TYPES:
        raise BadRequest(f"Field 'auth_type' must be one of: {', '.join(AUTH_TYPES)}.", code="invalid_auth_type",
                         field="auth_type")
    tags = parse_tags(raw.get("tags"))
    metadata = raw.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise BadRequest("Field 'metadata' must be a JSON object.", field="metadata")
        _check_metadata_values(metadata, config.max_metadata_depth)
        try:
            size = len(json.dumps(metadata, ensure_ascii=False, allow_nan=False).encode("utf-8"))
        except (ValueError, UnicodeEncodeError):
            raise BadRequest("Field 'metadata' is not serializable JSON.", field="metadata") from None
        if size > config.max_metadata_bytes:
            raise BadRequest(f"Field 'metadata' exceeds {config.max_metadata_bytes} bytes serialized.",
                             code="metadata_too_large", field="metadata")
        _scan(metadata, "metadata", keys=True)
    return Tool(name=given, title=title, description=description, endpoint=endpoint, auth_type=auth_type,
                tags=tags, metadata=metadata, input_schema=_json_schema(raw, "input_schema", required=True),
                output_schema=_json_schema(raw, "output_schema", required=False))


def parse_tags(value, field: str = "tags") -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [v for v in value.split(",") if v]
    if not isinstance(value, list) or len(value) > MAX_TAGS:
        raise BadRequest(f"Field {field!r} must be a list of at most {MAX_TAGS} tags.", field=field)
    for tag in value:
        if not isinstance(tag, str) or not TAG_RE.fullmatch(tag):
            raise BadRequest(f"Field {field!r}: a tag is 1-64 lowercase letters, digits, '_', '.', ':' or '-'.",
                             code="invalid_tag", field=field)
    return tuple(dict.fromkeys(value))


def parse_tool_search(body: dict) -> dict:
    """{query, top_k (1-50, default 5), tags, auth_type} of a tool search (REST and the MCP tool)."""
    if not isinstance(body, dict):
        raise BadRequest("The search body must be a JSON object.", code="invalid_body")
    unknown = sorted(set(body) - {"query", "top_k", "tags", "auth_type"})
    if unknown:
        raise BadRequest(f"Unknown field {unknown[0]!r}.", code="unknown_field", field=unknown[0])
    query = body.get("query")
    if not isinstance(query, str):
        raise BadRequest("Field 'query' is required: plain text describing what the tool should do.",
                         code="missing_field", field="query")
    plain_text(query, "query")
    if len(query) > MAX_SEARCH_QUERY:
        raise BadRequest(f"Field 'query' must be at most {MAX_SEARCH_QUERY} characters.", code="query_too_long",
                         field="query")
    top_k = body.get("top_k", 5)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= 50:
        raise BadRequest("Field 'top_k' must be an integer between 1 and 50.", field="top_k")
    auth_type = body.get("auth_type")
    if auth_type is not None and auth_type not in AUTH_TYPES:
        raise BadRequest(f"Field 'auth_type' must be one of: {', '.join(AUTH_TYPES)}.", code="invalid_auth_type",
                         field="auth_type")
    return {"query": query, "top_k": top_k, "tags": parse_tags(body.get("tags")), "auth_type": auth_type}


def tool_dict(row) -> dict:
    """The public shape of a registered tool."""
    return {"name": row["name"], "uri": tool_uri(row["name"]), "title": row["title"],
            "description": row["description"], "endpoint": row["endpoint"], "auth_type": row["auth_type"],
            "tags": json.loads(row["tags"]), "metadata": json.loads(row["metadata"]) if row["metadata"] else None,
            "input_schema": json.loads(row["input_schema"]),
            "output_schema": json.loads(row["output_schema"]) if row["output_schema"] else None,
            "version": row["version"], "created_at": row["created_ms"] // 1000,
            "updated_at": row["updated_ms"] // 1000}


def dump_json(value) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def not_found(name: str) -> ApiError:
    shown = name[:64] if isinstance(name, str) else ""
    return NotFound(f"No tool named {shown!r} is registered.", code="not_found", field="name")
