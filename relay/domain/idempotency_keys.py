"""Idempotency keys (docs/retries.md): the client's key for one logical request, turned into
what the relay stores without being able to read it back.

A client sends `Idempotency-Key: <22..64 characters of A-Z a-z 0-9 _ ->` (at least 128 random
bits) on a request that creates something, and the same key on every retry of it. The relay
keeps, for 24 hours, the first successful answer to (scope, route, key), where the scope is
who asked (an account, an API key, or nobody for a sign-up):

- `lookup` = SHA-256 over a label, the scope, the route and the key: the row's id;
- `request_mac` = HMAC-SHA256 of the request body under a key derived from the client's key,
  so a repeat with another body is told apart (422 `idempotency_key_reused`) and a stored
  sign-up body, which holds a password, leaves nothing to test guesses against;
- `answer` = the answer's JSON sealed with AES-256-GCM under another derived key (HKDF-SHA256),
  the lookup as associated data: the minted API key or session token in it is readable only
  by whoever holds the client's key.

HTTP-free: the routes use it through `relay.http.routes.once`, the SQL is `relay.store.idempotency`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from dataclasses import dataclass
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from engram_sync.relay.domain.domain_errors import DomainError

HEADER: Final = "Idempotency-Key"
KEY_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]{22,64}")
_LOOKUP_LABEL: Final = b"engram-sync idempotency lookup v1"
_MAC_INFO: Final = b"engram-sync idempotency request mac v1"
_SEAL_INFO: Final = b"engram-sync idempotency answer seal v1"
_NONCE_LEN: Final = 12


class InvalidIdempotencyKeyError(DomainError):
    """The header is present but not 22 to 64 characters of A-Z a-z 0-9 _ -."""


class IdempotencyKeyReusedError(DomainError):
    """The key was used for this route with another request body."""


class SealedAnswerError(DomainError):
    """A stored answer does not open under the key presented (a corrupt or foreign row)."""


def _derive(key: str, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(key.encode())


@dataclass(frozen=True)
class IdempotentRequest:
    """One request under an idempotency key: its row id, its body's MAC, and the seal key."""

    lookup: bytes
    request_mac: bytes
    _seal_key: bytes

    @classmethod
    def of(cls, key: str, *, scope: str, route: str, body: bytes) -> IdempotentRequest:
        """Raises InvalidIdempotencyKeyError for a key outside KEY_PATTERN."""
        if not KEY_PATTERN.fullmatch(key):
            raise InvalidIdempotencyKeyError(
                f"{HEADER} must be 22 to 64 characters of A-Z, a-z, 0-9, '_' and '-' "
                "(send at least 128 random bits, e.g. 22 characters of base64url)"
            )
        lookup = hashlib.sha256(
            b"\x00".join((_LOOKUP_LABEL, scope.encode(), route.encode(), key.encode()))
        ).digest()
        request_mac = hmac.new(_derive(key, _MAC_INFO), body, hashlib.sha256).digest()
        return cls(lookup, request_mac, _derive(key, _SEAL_INFO))

    def seal(self, answer: bytes) -> bytes:
        """The answer encrypted for storage: nonce || AES-GCM(answer), the lookup as AAD."""
        nonce = os.urandom(_NONCE_LEN)
        return nonce + AESGCM(self._seal_key).encrypt(nonce, answer, self.lookup)

    def open(self, request_mac: bytes, sealed: bytes) -> bytes:
        """The stored answer for a repeat of this request; raises IdempotencyKeyReusedError
        when the stored request had another body."""
        if not hmac.compare_digest(request_mac, self.request_mac):
            raise IdempotencyKeyReusedError(
                f"this {HEADER} was used for another request body; send a new key for a new request"
            )
        try:
            return AESGCM(self._seal_key).decrypt(
                sealed[:_NONCE_LEN], sealed[_NONCE_LEN:], self.lookup
            )
        except InvalidTag:
            raise SealedAnswerError("a stored answer did not open under its key") from None
