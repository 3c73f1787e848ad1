"""Several vaults on one device: names for vault directories, kept in `vaults.json` under
the user's config directory (`$XDG_CONFIG_HOME/engram-sync`, else `~/.config/engram-sync`;
typer.get_app_dir), and `engram-sync vaults` to list them with their relay and state.

`--vault VALUE` (or ENGRAM_VAULT): a bare word (no `/`, not starting with `~` or `.`) that is
a registered name means that vault's directory; anything else is a directory path.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Final

import typer

from .._atomic import read_json, write_json_atomic
from .._sync.config import load_sync_config
from .._sync.state import SyncState
from .support import DEFAULT_VAULT, CliError, out, print_json

APP_NAME: Final = "engram-sync"
REGISTRY_FILE: Final = "vaults.json"
NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

vaults_app = typer.Typer(
    help="Named vaults on this device (`--vault NAME`): list, add, remove.",
    invoke_without_command=True,
)


def registry_path() -> Path:
    """`vaults.json` in the user's config directory for engram-sync."""
    return Path(typer.get_app_dir(APP_NAME)) / REGISTRY_FILE


def load_registry() -> dict[str, str]:
    """name -> vault directory ({} when there is no registry yet)."""
    path = registry_path()
    if not path.exists():
        return {}
    data = read_json(path)
    vaults = data.get("vaults") if isinstance(data, dict) else None
    if not isinstance(vaults, dict) or not all(isinstance(v, str) for v in vaults.values()):
        raise CliError(f'{path} is not a vault registry: expected {{"vaults": {{name: dir}}}}')
    return {str(name): str(directory) for name, directory in vaults.items()}


def _save(vaults: dict[str, str]) -> None:
    path = registry_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_json_atomic(path, {"vaults": dict(sorted(vaults.items()))})


def _is_bare_word(value: str) -> bool:
    return "/" not in value and not value.startswith(("~", "."))


def resolve_vault(value: str | None) -> Path:
    """The vault directory `--vault VALUE` means (module docstring); the default without one."""
    if value is None:
        return DEFAULT_VAULT.expanduser()
    if _is_bare_word(value):
        registered = load_registry().get(value)
        if registered is not None:
            return Path(registered)
    return Path(value).expanduser()


def _state(name: str, directory: Path) -> dict[str, Any]:
    """What the directory holds, read without the passphrase (config.json, sync_state.json)."""
    row: dict[str, Any] = {"name": name, "path": str(directory), "relay": None,
                           "vault_id": None, "state": "no vault", "last_sync_at": None,
                           "last_error": None}  # fmt: skip
    if not (directory / "engrams.db").exists():
        return row
    try:
        config = load_sync_config(directory)
        state = SyncState.load(directory)
    except (ValueError, OSError) as exc:
        row["state"] = f"unreadable: {exc}"
        return row
    row.update(relay=config.server_url, vault_id=config.vault_id,
               last_sync_at=state.last_sync_at, last_error=state.last_error)  # fmt: skip
    if state.revoked:
        row["state"] = "revoked"
    elif not config.server_url or not config.vault_id:
        row["state"] = "not linked"
    elif state.last_error:
        row["state"] = "failing"
    elif state.last_sync_at:
        row["state"] = "synced"
    else:
        row["state"] = "linked, never synced"
    return row


@vaults_app.callback()
def vaults_list(
    ctx: typer.Context,
    json_out: Annotated[bool, typer.Option("--json", help="JSON output.")] = False,
) -> None:
    """List the named vaults (and the default one) with their relay and state."""
    if ctx.invoked_subcommand is not None:
        return
    rows = [_state(name, Path(directory)) for name, directory in sorted(load_registry().items())]
    default = DEFAULT_VAULT.expanduser()
    if (default / "engrams.db").exists() and all(Path(r["path"]) != default for r in rows):
        rows.append(_state("(default)", default))
    if json_out:
        print_json(rows)
        return
    if not rows:
        out.print("no named vaults: `engram-sync vaults add NAME DIR`")
    for r in rows:
        relay = f"{r['relay']} ({r['vault_id']})" if r["relay"] else "-"
        when = f", last sync {r['last_sync_at'][:19]}" if r["last_sync_at"] else ""
        out.print(f"{r['name']}  {r['path']}  {relay}  {r['state']}{when}", markup=False)


@vaults_app.command("add")
def vaults_add(
    name: Annotated[str, typer.Argument(help="A name: letters, digits, . _ - (64 at most).")],
    directory: Annotated[Path, typer.Argument(help="The vault directory (it may not exist yet).")],
) -> None:
    """Name a vault directory, so `--vault NAME` finds it."""
    if not NAME.fullmatch(name):
        raise CliError(f"{name!r} is not a vault name: letters, digits, . _ - (64 at most)")
    vaults = load_registry()
    path = directory.expanduser().resolve()
    if vaults.get(name) not in (None, str(path)):
        raise CliError(f"the name {name!r} is taken ({vaults[name]}): `vaults remove {name}` first")
    vaults[name] = str(path)
    _save(vaults)
    out.print(f"{name} = {path}", markup=False)


@vaults_app.command("remove")
def vaults_remove(name: Annotated[str, typer.Argument(help="A vault name.")]) -> None:
    """Forget a name (the vault directory itself is left alone)."""
    vaults = load_registry()
    if name not in vaults:
        raise CliError(f"no vault named {name!r}; `engram-sync vaults` lists them")
    del vaults[name]
    _save(vaults)
    out.print(f"removed the name {name} (the directory is kept)", markup=False)
