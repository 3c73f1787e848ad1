"""The vault's `config.json` `sync` block: enabled, server_url, api_key, vault_id, interval_secs.

Other keys of `config.json` (the Engram tools' settings) are preserved untouched.
The file holds an API key, so it is written 0600.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from .._atomic import read_json, write_json_atomic

CONFIG_FILE: Final = "config.json"
DEFAULT_INTERVAL_SECS: Final = 300


@dataclass
class SyncConfig:
    """How this vault syncs."""

    enabled: bool = False
    server_url: str | None = None
    api_key: str | None = None
    vault_id: str | None = None
    interval_secs: int = DEFAULT_INTERVAL_SECS

    def __repr__(self) -> str:
        key = "None" if self.api_key is None else f"'{self.api_key[:6]}…'"
        return (
            f"SyncConfig(enabled={self.enabled}, server_url={self.server_url!r},"
            f" api_key={key}, vault_id={self.vault_id!r}, interval_secs={self.interval_secs})"
        )


def load_config_file(vault_dir: Path) -> dict[str, Any]:
    """The whole of the vault's config.json ({} when it does not exist); the one loader, for the
    `sync` block here and the `account` block (client._accounts.account)."""
    path = vault_dir / CONFIG_FILE
    if not path.exists():
        return {}
    data = read_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return data


def load_sync_config(vault_dir: Path) -> SyncConfig:
    """The `sync` block, defaults for anything missing."""
    block = load_config_file(vault_dir).get("sync") or {}
    if not isinstance(block, dict):
        raise ValueError(f"{vault_dir / CONFIG_FILE}: `sync` must be a JSON object")
    return SyncConfig(
        enabled=bool(block.get("enabled", False)),
        server_url=block.get("server_url"),
        api_key=block.get("api_key"),
        vault_id=block.get("vault_id"),
        interval_secs=int(block.get("interval_secs", DEFAULT_INTERVAL_SECS)),
    )


def save_sync_config(vault_dir: Path, config: SyncConfig) -> None:
    """Replace the `sync` block, keeping every other key of config.json."""
    data = load_config_file(vault_dir)
    data["sync"] = asdict(config)
    write_json_atomic(vault_dir / CONFIG_FILE, data)
