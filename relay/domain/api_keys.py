"""API keys: minting, hashing, the static `SYNC_API_KEYS` list, and what a key may do.

PROTOCOL §5: minted keys are `en_` + base64url-no-padding(32 random bytes), shown
once and stored only as SHA-256. Static keys come from `SYNC_API_KEYS` =
comma-separated `key[:rate[:scope]]`; scope is a `;` list of vault ids where
`vault+admin` grants admin on that vault; no scope = every vault and admin; keys
shorter than 16 characters are ignored; rate defaults to 100 requests/second.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from dataclasses import dataclass
from typing import Final

from engram_sync.shared_format.b64 import b64url_encode

log = logging.getLogger(__name__)

MINTED_PREFIX: Final = "en_"
MIN_STATIC_KEY_LEN: Final = 16
DEFAULT_KEY_RATE: Final = 100
DISPLAY_PREFIX_LEN: Final = 8


def hash_key(key: str) -> bytes:
    """SHA-256 of the key text: the only form in which a key is stored."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def key_prefix(key: str) -> str:
    """The first characters of a key, safe to show and log."""
    return key[:DISPLAY_PREFIX_LEN]


def mint_key() -> str:
    """A new random key (PROTOCOL §5)."""
    return MINTED_PREFIX + b64url_encode(secrets.token_bytes(32))


def new_key_id() -> str:
    """A short public id for a minted key (for `keys list` / `keys revoke`)."""
    return "k_" + secrets.token_hex(6)


@dataclass(frozen=True)
class Principal:
    """What an authenticated key may do.

    `vaults is None` means every vault; `admin_vaults is None` means admin on
    every vault the key reaches. `device_id` binds the key to one device (§10).
    `account_id` is the account a minted key belongs to; None for operator keys
    (static keys, `engram-relay keys create`, codes the operator issued).
    """

    key_id: str
    prefix: str
    rate: int
    vaults: frozenset[str] | None
    admin_vaults: frozenset[str] | None
    device_id: str | None = None
    account_id: str | None = None

    def can_access(self, vault_id: str) -> bool:
        """True when the key is valid for this vault."""
        return self.vaults is None or vault_id in self.vaults

    def is_admin_for(self, vault_id: str) -> bool:
        """True when the key is an admin key for this vault."""
        if not self.can_access(vault_id):
            return False
        return self.admin_vaults is None or vault_id in self.admin_vaults

    @property
    def is_global_admin(self) -> bool:
        """Admin on every vault (operator keys)."""
        return self.vaults is None and self.admin_vaults is None


@dataclass(frozen=True)
class StaticKey:
    """One entry of `SYNC_API_KEYS`, kept only as a hash."""

    key_hash: bytes
    principal: Principal


def parse_static_keys(spec: str) -> list[StaticKey]:
    """Parse `SYNC_API_KEYS` (PROTOCOL §5); malformed entries are skipped with a warning."""
    keys: list[StaticKey] = []
    for index, raw in enumerate(spec.split(",")):
        entry = raw.strip()
        if not entry:
            continue
        key, _, rest = entry.partition(":")
        rate_text, _, scope_text = rest.partition(":")
        if len(key) < MIN_STATIC_KEY_LEN:
            log.warning("SYNC_API_KEYS entry %d ignored: key shorter than 16 characters", index)
            continue
        try:
            rate = int(rate_text) if rate_text.strip() else DEFAULT_KEY_RATE
        except ValueError:
            log.warning(
                "SYNC_API_KEYS entry %d ignored: rate %r is not an integer", index, rate_text
            )
            continue
        if rate <= 0:
            log.warning("SYNC_API_KEYS entry %d ignored: rate must be positive", index)
            continue
        vaults: frozenset[str] | None = None
        admin: frozenset[str] | None = None
        scope = [s.strip() for s in scope_text.split(";") if s.strip()]
        if scope:
            names = [s.removesuffix("+admin") for s in scope]
            vaults = frozenset(names)
            admin = frozenset(s.removesuffix("+admin") for s in scope if s.endswith("+admin"))
        principal = Principal(
            key_id=f"static:{index}",
            prefix=key_prefix(key),
            rate=rate,
            vaults=vaults,
            admin_vaults=admin,
        )
        keys.append(StaticKey(key_hash=hash_key(key), principal=principal))
    return keys
