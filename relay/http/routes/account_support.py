"""Helpers of the account routes (relay/http/routes/accounts.py), some shared with the pairing and
handoff routes: the per-minute limits, labels, strict base64 fields, emails and passwords."""

from __future__ import annotations

import hashlib
import re
from typing import Any, Final

from litestar import Request

from engram_sync.relay.domain.labels import label_problem
from engram_sync.relay.domain.ratelimit import RateLimiter
from engram_sync.relay.http.app_state import relay_state
from engram_sync.relay.http.errors import RelayError, bad_request, forbidden
from engram_sync.relay.services import passwords
from engram_sync.relay.store import accounts as store
from engram_sync.relay.store.accounts import AccountSession
from engram_sync.shared_format.b64 import Base64Error, b64decode_std
from engram_sync.shared_format.wraps import (
    MAX_SALT_LEN,
    MAX_WRAP_LEN,
    MIN_SALT_LEN,
    NONCE_LEN,
    TAG_LEN,
)

MAX_EMAIL_CHARS: Final = 254
# Password confirmations per account (a stolen session must not become a guessing oracle).
PASSWORD_CHECKS_PER_MINUTE: Final = 10
MIN_WRAP_LEN: Final = NONCE_LEN + TAG_LEN  # an AES-GCM envelope of nothing

_EMAIL = re.compile(r"[^@\s\x00-\x1f\x7f]{1,64}@[^@\s\x00-\x1f\x7f.]+(\.[^@\s\x00-\x1f\x7f.]+)+")


def limit_per_minute(request: Request[Any, Any, Any], bucket: str, per_minute: int) -> None:
    """Spend one token of `bucket` (e.g. "signin:<ip>"); 429 with Retry-After when empty."""
    wait_minutes = relay_state(request).minute_limiter.take(bucket, per_minute)
    if wait_minutes > 0:
        raise RelayError(
            429,
            "rate_limited",
            f"too many attempts (at most {per_minute} a minute); retry later",
            headers={"Retry-After": RateLimiter.retry_after_header(wait_minutes * 60.0)},
        )


async def confirm_password(
    request: Request[Any, Any, Any], session: AccountSession, password: str
) -> None:
    """403 `wrong_password` unless `password` is the account's current login password
    (PROTOCOL §13: every wrap write or delete needs it)."""
    limit_per_minute(request, f"password:{session.account_id}", PASSWORD_CHECKS_PER_MINUTE)
    stored = await store.login_hash(relay_state(request).require_pool(), session.account_id)
    if not await passwords.verify_password(stored, password):
        raise forbidden(
            "the current password is needed to change or delete a wrap, and this one is wrong",
            code="wrong_password",
        )


def check_label(label: str | None, field: str = "label") -> str | None:
    """A trimmed label of printable text, at most 128 characters (relay/domain/labels.py); None
    stays None, blank becomes None."""
    if label is None:
        return None
    label = label.strip()
    problem = label_problem(label, field)
    if problem:
        raise bad_request(problem, code="invalid_request", field=field)
    return label or None


def std_b64(value: str, field: str, lo: int, hi: int) -> bytes:
    """Strict standard base64 of lo..hi decoded bytes; 400 naming the field otherwise."""
    try:
        raw = b64decode_std(value)
    except Base64Error as exc:
        raise bad_request(f"{field}: {exc}", code="invalid_request", field=field) from None
    if not lo <= len(raw) <= hi:
        size = f"exactly {lo}" if lo == hi else f"{lo}..{hi}"
        raise bad_request(
            f"{field} must decode to {size} bytes, got {len(raw)}",
            code="invalid_request",
            field=field,
        )
    return raw


def wrap_b64(value: str, field: str) -> str:
    """`value` if it is a wrap's strict base64 (an AES-GCM envelope); 400 naming the field."""
    std_b64(value, field, MIN_WRAP_LEN, MAX_WRAP_LEN)  # PROTOCOL §13: 512 bytes per wrap
    return value


def salt_b64(value: str, field: str) -> str:
    """`value` if it is a salt's strict base64; 400 naming the field."""
    std_b64(value, field, MIN_SALT_LEN, MAX_SALT_LEN)  # PROTOCOL §13: 64 bytes per salt
    return value


def normal_email(text: str) -> str:
    """The trimmed, lower-cased email; 400 unless it looks like name@domain.tld."""
    email = text.strip().lower()
    if len(email) > MAX_EMAIL_CHARS or not _EMAIL.fullmatch(email):
        raise bad_request(
            "email does not look like an email address (name@example.org)",
            code="invalid_request",
            field="email",
        )
    return email


def email_bucket(email: str) -> str:
    """A bounded bucket key for a normalised email (a digest: any length, never logged)."""
    return hashlib.sha256(email.encode()).hexdigest()[:32]


def strong_password(password: str, field: str) -> str:
    """`password` if relay.services.passwords accepts it; 400 `weak_password` naming the field."""
    problem = passwords.password_problem(password)
    if problem:
        raise bad_request(problem.replace("password", field, 1), code="weak_password", field=field)
    return password


def invalid_credentials() -> RelayError:
    """401: one answer for an unknown email and a wrong password."""
    return RelayError(
        401,
        "invalid_credentials",
        "wrong email or password",
        headers={"WWW-Authenticate": "Bearer"},
    )


def no_wrap(what: str) -> RelayError:
    """404 `no_wrap`: the account has no such wrap stored."""
    return RelayError(404, "no_wrap", f"this account has no {what} stored")
