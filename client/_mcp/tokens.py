"""The bearer tokens of `engram-sync mcp --http`, one per AI client (docs/mcp.md "HTTP").

`engram-sync mcp token add NAME` makes a random token, prints it once and keeps only its
SHA-256 (the token has 256 random bits: a slow hash would add nothing) in
`mcp-tokens.json` in the vault's directory, 0600 like every file there. The server reads
the file on every request, so `token revoke NAME` refuses that client's next request
without a restart. No `mcp` import: the server wraps `TokenStore.name_of` in the `mcp`
package's token verifier.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from .._atomic import read_json, write_json_atomic

TOKENS_FILE: Final = "mcp-tokens.json"
TOKEN_PREFIX: Final = "engram_mcp_"  # noqa: S105 (a prefix, not a secret)
MAX_TOKEN_CHARS: Final = 200
_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class TokenError(ValueError):
    """A token command refused (a bad name, a name taken or unknown); the message says why."""


@dataclass(frozen=True)
class TokenInfo:
    """One client's token as `token list` shows it (never the token)."""

    name: str
    created_at: str


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise TokenError(
            f"{name[:64]!r} is not a token name: 1 to 64 letters, digits, '.', '_' or '-'"
            " (starting with a letter or digit)"
        )
    return name


class TokenStore:
    """The tokens of the vault in `vault_dir`."""

    def __init__(self, vault_dir: Path) -> None:
        self.path = vault_dir / TOKENS_FILE

    def _load(self) -> dict[str, dict[str, Any]]:
        if not self.path.exists():
            return {}
        data = read_json(self.path)
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(tokens, dict):
            raise TokenError(f"{self.path} is not a token file: remove it and add the tokens again")
        return {str(k): v for k, v in tokens.items() if isinstance(v, dict)}

    def _save(self, tokens: dict[str, dict[str, Any]]) -> None:
        write_json_atomic(self.path, {"version": 1, "tokens": tokens}, mode=0o600)

    def add(self, name: str) -> str:
        """A new token for client `name` (shown once: only its hash is kept)."""
        tokens = self._load()
        if check_name(name) in tokens:
            raise TokenError(
                f"a token named {name!r} exists: `engram-sync mcp token revoke {name}` first"
            )
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        created = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        tokens[name] = {"sha256": _digest(token), "created_at": created}
        self._save(tokens)
        return token

    def list(self) -> list[TokenInfo]:
        return [
            TokenInfo(name, str(entry.get("created_at", "")))
            for name, entry in sorted(self._load().items())
        ]

    def revoke(self, name: str) -> None:
        tokens = self._load()
        if tokens.pop(name, None) is None:
            raise TokenError(f"no token named {name[:64]!r}: `engram-sync mcp token list`")
        self._save(tokens)

    def name_of(self, token: str) -> str | None:
        """The client `token` was made for; None for a token that is not (or no longer) one."""
        if not token.startswith(TOKEN_PREFIX) or len(token) > MAX_TOKEN_CHARS:
            return None
        try:
            tokens = self._load()
        except (TokenError, OSError, ValueError):
            return None
        digest = _digest(token)
        found = None
        for name, entry in tokens.items():  # every entry compared, in constant time each
            if hmac.compare_digest(str(entry.get("sha256", "")), digest):
                found = name
        return found

    def __len__(self) -> int:
        return len(self._load())
