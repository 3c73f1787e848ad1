"""Database URL resolution and helpers shared by every relay command.

Precedence: an explicit ``--database-url`` > ``ENGRAM_RELAY_DATABASE_URL`` >
``DATABASE_URL`` > ``None``, which means "run the embedded PostgreSQL".
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

__all__ = [
    "DATABASE_URL_ENV_VARS",
    "redact_url",
    "resolve_database_url",
    "to_libpq_url",
    "to_sqlalchemy_url",
]

log = logging.getLogger(__name__)

#: Environment variables consulted, highest priority first.
DATABASE_URL_ENV_VARS: tuple[str, ...] = ("ENGRAM_RELAY_DATABASE_URL", "DATABASE_URL")

_SCHEME_RE = re.compile(r"^(postgres|postgresql)(\+[A-Za-z0-9_]+)?://", re.IGNORECASE)


def resolve_database_url(
    explicit: str | None = None, environ: Mapping[str, str] | None = None
) -> str | None:
    """Return the database URL to use, or ``None`` for the embedded server.

    Blank values (empty or whitespace, e.g. ``DATABASE_URL=`` in an env file)
    count as unset.
    """
    env = os.environ if environ is None else environ
    candidates: list[tuple[str, str | None]] = [("--database-url", explicit)]
    candidates += [(name, env.get(name)) for name in DATABASE_URL_ENV_VARS]
    for source, value in candidates:
        if value is not None and value.strip():
            url = value.strip()
            log.debug(
                "database url resolved source=%s url=%s",
                source,
                redact_url(url),
                extra={"source": source, "url": redact_url(url)},
            )
            return url
    log.debug("no database url configured; using embedded postgres")
    return None


def redact_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***`` (safe to log)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable database url>"
    redacted_query = re.sub(r"(?i)(^|&)(password=)[^&]*", r"\1\2***", parts.query)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostinfo = netloc.rpartition("@")
        if ":" in userinfo:
            user = userinfo.split(":", 1)[0]
            netloc = f"{user}:***@{hostinfo}"
    return urlunsplit((parts.scheme, netloc, parts.path, redacted_query, parts.fragment))


def _check_scheme(url: str) -> re.Match[str]:
    match = _SCHEME_RE.match(url)
    if match is None:
        raise ValueError(
            f"not a PostgreSQL URL: {redact_url(url)!r} "
            "(expected postgresql://user[:password]@host[:port]/database)"
        )
    return match


def to_libpq_url(url: str) -> str:
    """Return ``url`` as a plain ``postgresql://`` URL (as asyncpg and libpq take it)."""
    match = _check_scheme(url)
    return "postgresql://" + url[match.end() :]


def to_sqlalchemy_url(url: str) -> str:
    """Return ``url`` for SQLAlchemy's sync psycopg 3 dialect (used by alembic)."""
    match = _check_scheme(url)
    return "postgresql+psycopg://" + url[match.end() :]
