"""Secrets in targets: which values are credentials, how a target is shown without them,
and how a target sent back with "***" keeps them (never at another destination).

Secret header values, URL passwords, secret query parameters and secret task kwargs are
write-only on every surface: the API, the console, the audit log. Every surface that
shows a target shows `redact_target(...)`; every write of a target sent by a client
goes through `unmask_target(...)`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDACTED = "***"
# Header, query-parameter and kwarg names whose values are credentials.
_SECRET_NAME = re.compile(r"auth|cookie|token|secret|key|passw|credential|session|signature", re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name or ""))


def _redact_url(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:{REDACTED}@{host}" if ":" in userinfo else f"{REDACTED}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(is_secret_name(name) for name, _ in pairs):
            query = urlencode([(n, REDACTED if is_secret_name(n) else v) for n, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def marked_secret(target: dict | None) -> frozenset[str]:
    """Lower-cased header names the client listed in the target's `secret_headers`."""
    names = target.get("secret_headers") if isinstance(target, dict) else None
    if not isinstance(names, list):
        return frozenset()
    return frozenset(str(name).lower() for name in names)


def _redact_mapping(values: object, marked: frozenset[str] = frozenset()) -> object:
    def secret(name: object) -> bool:
        return is_secret_name(str(name)) or str(name).lower() in marked

    if isinstance(values, dict):
        return {name: REDACTED if secret(name) else value for name, value in values.items()}
    if isinstance(values, list):
        # Headers given as [[name, value], ...] pairs.
        out = []
        for item in values:
            if isinstance(item, list | tuple) and len(item) == 2 and secret(item[0]):
                out.append([item[0], REDACTED])
            else:
                out.append(item)
        return out
    return values


def redact_target(target: dict | None, *, also_secret: Iterable[str] = ()) -> dict:
    """A copy of a target snapshot that is safe to show: credential-looking headers (and
    those named in `secret_headers` or `also_secret`), URL passwords and query
    parameters, and task kwargs are replaced by "***"."""
    if not isinstance(target, dict):
        return {}
    out = dict(target)
    if "headers" in out:
        marked = marked_secret(target) | {str(name).lower() for name in also_secret}
        out["headers"] = _redact_mapping(out["headers"], marked)
    if "kwargs" in out:
        out["kwargs"] = _redact_mapping(out["kwargs"])
    if isinstance(out.get("url"), str):
        out["url"] = _redact_url(out["url"])
    return out


class SecretNotCarried(ValueError):
    """A target sent back "***" for stored secrets while its destination changed.

    `fields` are the places ("headers.Authorization", "url", "kwargs.api_key") whose
    secret must be sent again."""

    def __init__(self, fields: list[str]):
        super().__init__(", ".join(fields))
        self.fields = fields


def _origin(url: object) -> tuple[str, str, int | None] | None:
    """(scheme, host, port) with the scheme's default port filled in; None if unreadable."""
    if not isinstance(url, str):
        return None
    try:
        parts = urlsplit(url.strip())
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower())
    except ValueError:
        return None
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


def _destination(target: dict) -> tuple:
    """Where a target's secrets go: an HTTP origin, or a task by name."""
    if target.get("type") == "task":
        return ("task", target.get("name"))
    return ("http", _origin(target.get("url")))


def unmask_target(new: object, stored: object) -> object:
    """`new` with every "***" that stands for a stored secret replaced by the stored value.

    A client (or the admin form) that read a job gets "***" for its secrets and may send
    the target back unchanged: that keeps the stored secrets instead of saving "***".
    Only a value that is exactly "***" where the stored target showed "***" is restored;
    a newly typed value always wins. A restored header stays marked secret (it is added
    to `secret_headers` when only the stored marking made it secret), so "***" never
    turns a secret into clear text. A secret is never carried to another destination (a
    changed URL origin or task): raises SecretNotCarried naming the fields to send again.
    """
    if not isinstance(new, dict) or not isinstance(stored, dict):
        return new
    out = dict(new)
    moved = _destination(new) != _destination(stored)
    refused: list[str] = []
    stored_marked = marked_secret(stored)
    kept_marks: list[str] = []
    for part in ("headers", "kwargs"):
        given, kept = out.get(part), stored.get(part)
        if not isinstance(given, dict) or not isinstance(kept, dict):
            continue
        marked = stored_marked if part == "headers" else frozenset()
        shown = _redact_mapping(kept, marked)
        by_name = {str(name).lower(): (value, shown[name]) for name, value in kept.items()}
        merged = {}
        for name, value in given.items():
            stored_value, stored_shown = by_name.get(str(name).lower(), (None, None))
            if value == REDACTED and stored_shown == REDACTED and stored_value != REDACTED:
                if moved:
                    refused.append(f"{part}.{name}")
                    merged[name] = value
                    continue
                merged[name] = stored_value
                if part == "headers" and not is_secret_name(str(name)):
                    kept_marks.append(str(name).lower())
            else:
                merged[name] = value
        out[part] = merged
    url, kept_url = out.get("url"), stored.get("url")
    if isinstance(url, str) and isinstance(kept_url, str) and REDACTED in url:
        out["url"], url_refused = _unmask_url(url, kept_url, moved=moved)
        if url_refused:
            refused.append("url")
    if refused:
        raise SecretNotCarried(refused)
    given_marks = out.get("secret_headers")
    if kept_marks and (given_marks is None or isinstance(given_marks, list)):
        names = list(given_marks or [])
        known = {str(n).lower() for n in names}
        out["secret_headers"] = names + [n for n in kept_marks if n not in known]
    return out


def _unmask_url(url: str, kept_url: str, *, moved: bool) -> tuple[str, bool]:
    """`url` with a "***" password or secret query value replaced by the stored one at
    the same origin; (url, True) when "***" stands for a stored secret at another."""
    if _redact_url(kept_url) == url:
        return kept_url, False  # sent back as read: the same origin by construction
    try:
        new, kept = urlsplit(url), urlsplit(kept_url)
    except ValueError:
        return url, False
    kept_query = dict(parse_qsl(kept.query, keep_blank_values=True))
    pairs = parse_qsl(new.query, keep_blank_values=True)
    masked_query = [n for n, v in pairs if v == REDACTED and is_secret_name(n) and n in kept_query]
    masked_password = new.password == REDACTED and kept.password is not None and new.username == kept.username
    if not (masked_query or masked_password):
        return url, False
    if moved:
        return url, True
    netloc = new.netloc
    if masked_password:
        netloc = netloc.replace(f":{REDACTED}@", f":{kept.password}@", 1)
    query = new.query
    if masked_query:
        query = urlencode([(n, kept_query[n] if n in masked_query else v) for n, v in pairs])
    return urlunsplit((new.scheme, netloc, new.path, query, new.fragment)), False
