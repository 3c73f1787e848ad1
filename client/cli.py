"""The `engram-sync` command: a vault on this device, synced through a relay.

The vault directory comes from `--vault` or `ENGRAM_VAULT` (default
`~/.engram/vault`); the passphrase from `ENGRAM_PASSPHRASE` or a prompt, never
from the command line. Errors are one line and a non-zero exit (`--debug` shows
the traceback).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Annotated, Any, Final

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from client import account as account_ops
from client import conflicts as conflict_ops
from client import pairing, team, vault_keys
from client.errors import SyncError
from client.local_store import add_memory as store_add
from client.local_store import (
    count_to_push,
    delete_memory,
    edit_memory,
    get_memory,
    get_row,
    list_memories,
    row_needs_push,
)
from client.session import VaultSession
from client.sync_config import load_sync_config
from client.syncer import SyncReport
from shared_format.errors import FormatError, WrongPassphraseError
from shared_format.plaintext import MemoryPlaintext

DEFAULT_VAULT: Final = Path("~/.engram/vault")
LAYERS: Final = ("episodic", "semantic", "imagined")

app = typer.Typer(
    help="Engram Sync: end-to-end encrypted sync of an Engram memory vault through a relay.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
conflicts_app = typer.Typer(
    help="Local versions that lost to a remote edit (kept, never pushed).",
    invoke_without_command=True,
)
app.add_typer(conflicts_app, name="conflicts")
account_app = typer.Typer(
    help="Your account on the relay: keeps vault keys wrapped, so new devices need no "
    "sync passphrase.",
    no_args_is_help=True,
)
app.add_typer(account_app, name="account")
vault_app = typer.Typer(help="The linked vault's key in your account.", no_args_is_help=True)
app.add_typer(vault_app, name="vault")
team_app = typer.Typer(
    help="Hand the vault key to a new device (pairing codes, key handoff).", no_args_is_help=True
)
app.add_typer(team_app, name="team")
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


class CliError(Exception):
    """A failure reported as one line."""


class _Options:
    vault: Path = DEFAULT_VAULT


OPTIONS = _Options()


@app.callback()
def _main(
    vault: Annotated[
        Path | None,
        typer.Option(
            "--vault",
            envvar="ENGRAM_VAULT",
            help="Vault directory (default ~/.engram/vault).",
            show_default=False,
        ),
    ] = None,
) -> None:
    OPTIONS.vault = (vault or DEFAULT_VAULT).expanduser()


def _passphrase(confirm: bool = False) -> str:
    env = os.environ.get("ENGRAM_PASSPHRASE")
    if env:
        return env
    if not sys.stdin.isatty():
        raise CliError("no passphrase: set ENGRAM_PASSPHRASE or run in a terminal to be asked")
    value: str = typer.prompt("Vault passphrase", hide_input=True, confirmation_prompt=confirm)
    if not value:
        raise CliError("the passphrase must not be empty")
    return value


@contextmanager
def _session(create: bool = False) -> Iterator[VaultSession]:
    path = OPTIONS.vault
    if not create and not (path / "engrams.db").exists():
        raise CliError(f"no vault at {path}: run `engram-sync init` (or pass --vault DIR)")
    with VaultSession.open(path, _passphrase(confirm=create), create=create) as session:
        yield session


def _print_json(payload: Any) -> None:
    out.print_json(json.dumps(payload, ensure_ascii=False, sort_keys=True))


@app.command()
def init() -> None:
    """Create a new passphrase-encrypted vault in the vault directory."""
    if (OPTIONS.vault / "engrams.db").exists():
        raise CliError(f"a vault already exists at {OPTIONS.vault}")
    OPTIONS.vault.mkdir(parents=True, exist_ok=True)
    with _session(create=True) as session:
        out.print(f"created vault {session.path} (device {session.device.device_id})")


@app.command()
def link(
    relay: Annotated[str, typer.Option("--relay", help="Relay URL, e.g. http://127.0.0.1:8788")],
    api_key: Annotated[
        str | None,
        typer.Option("--api-key", envvar="ENGRAM_API_KEY", help="API key for the vault."),
    ] = None,
    account: Annotated[
        bool,
        typer.Option("--account", help="Use the vault key kept in your account (signed in)."),
    ] = False,
    code: Annotated[
        str | None, typer.Option("--code", help="A pairing code ENG-XXXX-XXXX-XXXX from an admin.")
    ] = None,
    vault_id: Annotated[
        str | None, typer.Option("--vault-id", help="Pin a vault id (default: derived).")
    ] = None,
    label: Annotated[str | None, typer.Option("--label", help="This device's name.")] = None,
) -> None:
    """Link the vault to a relay: with an API key, your account (--account) or a pairing code."""
    if account and code:
        raise CliError("use either --account or --code, not both")
    if code:
        if vault_id:
            raise CliError("--vault-id does not go with --code: the code names the vault")
        with _session() as session:
            chosen, has_key = pairing.link_with_code(session, relay, code, label)
            device_id = session.device.device_id
        out.print(f"linked to {relay} as vault {chosen} (device {device_id})")
        if not has_key:
            out.print(
                "this device has no key for the vault yet: run `engram-sync team request` and "
                "have an admin approve it"
            )
        return
    if account:
        account_ops.require_account(OPTIONS.vault)  # before asking for anything
        with _session() as session:
            chosen = account_ops.link_with_account(
                session, relay, _account_password(), vault_id, label
            )
            device_id = session.device.device_id
        out.print(f"linked to {relay} as vault {chosen} (device {device_id})")
        out.print("the vault key came from your account: run `engram-sync sync`")
        return
    if not api_key:
        raise CliError("pass --api-key KEY (or ENGRAM_API_KEY), --account or --code CODE")
    with _session() as session:
        chosen = session.link(relay, api_key, vault_id, label)
        with session.vault.transaction() as conn:
            vault_keys.clear_expected(conn, chosen)
        out.print(f"linked to {relay} as vault {chosen} (device {session.device.device_id})")


@app.command()
def add(
    text: Annotated[str, typer.Argument(help="The memory's text.")],
    tag: Annotated[list[str] | None, typer.Option("--tag", help="A tag (repeatable).")] = None,
    project: Annotated[str | None, typer.Option("--project", help="Project name.")] = None,
    layer: Annotated[str, typer.Option("--layer", help="episodic, semantic or imagined.")] = (
        "episodic"
    ),
) -> None:
    """Add a memory; prints its id."""
    if layer not in LAYERS:
        raise CliError(f"--layer must be one of {', '.join(LAYERS)}")
    if not text.strip():
        raise CliError("the memory text is empty")
    with _session() as session, session.vault.transaction() as conn:
        memory_id = store_add(conn, text, layer=layer, tags=tag or [], project=project)
    out.print(memory_id)


def _summary(memory: MemoryPlaintext, synced: bool) -> dict[str, Any]:
    return {
        "id": memory.id,
        "content": memory.content,
        "layer": memory.layer,
        "tags": memory.tags,
        "project": memory.project,
        "created_at": memory.created_at,
        "modified_at": memory.modified_at,
        "synced": synced,
    }


@app.command("list")
def list_(json_out: Annotated[bool, typer.Option("--json", help="JSON output.")] = False) -> None:
    """List memories, oldest first."""
    with _session() as session:
        conn = session.vault.conn
        items = []
        for memory in list_memories(conn):
            row = get_row(conn, memory.id)
            items.append(_summary(memory, row is not None and not row_needs_push(row)))
    if json_out:
        _print_json(items)
        return
    for item in items:
        first_line = item["content"].splitlines()[0] if item["content"] else ""
        mark = "" if item["synced"] else " *"
        out.print(f"{item['id']}  {item['modified_at'][:19]}  {first_line[:80]}{mark}")
    if not items:
        err.print("no memories yet: `engram-sync add TEXT`")


@app.command()
def show(memory_id: Annotated[str, typer.Argument(help="Memory id.")]) -> None:
    """Show one memory in full (JSON)."""
    with _session() as session:
        memory = get_memory(session.vault.conn, memory_id)
    if memory is None:
        raise CliError(f"no memory {memory_id!r}; `engram-sync list` shows the ids")
    _print_json(json.loads(_encode(memory)))


def _encode(memory: MemoryPlaintext) -> str:
    from shared_format.plaintext import encode_memory

    return encode_memory(memory)


@app.command()
def edit(
    memory_id: Annotated[str, typer.Argument(help="Memory id.")],
    text: Annotated[str, typer.Argument(help="The new text.")],
) -> None:
    """Replace a memory's text."""
    with _session() as session, session.vault.transaction() as conn:
        if not edit_memory(conn, memory_id, text):
            raise CliError(f"no memory {memory_id!r}; `engram-sync list` shows the ids")
    out.print(f"edited {memory_id}")


@app.command()
def delete(memory_id: Annotated[str, typer.Argument(help="Memory id.")]) -> None:
    """Delete a memory (the deletion syncs to the other devices)."""
    with _session() as session, session.vault.transaction() as conn:
        if not delete_memory(conn, memory_id):
            raise CliError(f"no memory {memory_id!r}; `engram-sync list` shows the ids")
    out.print(f"deleted {memory_id}")


def _report_dict(report: SyncReport) -> dict[str, Any]:
    return asdict(report)


def _run_sync(session: VaultSession, show_progress: bool) -> SyncReport:
    with session.relay() as relay:
        if not show_progress:
            return session.syncer(relay).sync()
        columns = (
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=err, transient=True) as bar:
            pending = sum(count_to_push(session.vault.conn))
            pull_task = bar.add_task("pulling", total=None, detail="")
            push_task = bar.add_task("pushing", total=pending or None, detail="")

            def progress(phase: str, report: SyncReport) -> None:
                if phase == "pull":
                    detail = f"{report.pulled} pulled, {report.applied} applied"
                    bar.update(pull_task, detail=detail)
                else:
                    bar.update(push_task, completed=report.pushed, detail=f"{report.pushed} pushed")

            return session.syncer(relay, progress).sync()


@app.command()
def sync(json_out: Annotated[bool, typer.Option("--json", help="JSON output.")] = False) -> None:
    """Pull remote changes, then push local ones."""
    with _session() as session:
        report = _run_sync(session, show_progress=not json_out and err.is_terminal)
    if json_out:
        _print_json(_report_dict(report))
        return
    parts = [f"pulled {report.pulled} (applied {report.applied}), pushed {report.pushed}"]
    if report.conflicts:
        parts.append(f"{report.conflicts} conflict(s) kept: see `engram-sync conflicts`")
    if report.invalid:
        parts.append(f"{report.invalid} invalid blob(s) skipped: see `engram-sync status`")
    if report.oversized:
        parts.append(f"{len(report.oversized)} memory(ies) too large to sync")
    out.print(", ".join(parts))


@app.command()
def watch(
    interval: Annotated[
        float | None, typer.Option("--interval", help="Seconds between syncs.", min=1)
    ] = None,
) -> None:
    """Sync continuously until Ctrl-C or SIGTERM."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with _session() as session:
        every = interval or session.config.interval_secs
        err.print(f"syncing {session.path} every {every:g}s (Ctrl-C to stop)")
        while not stop.is_set():
            try:
                report = _run_sync(session, show_progress=False)
                if report.applied or report.pushed or report.conflicts or report.invalid:
                    out.print(
                        f"pulled {report.pulled} (applied {report.applied}), "
                        f"pushed {report.pushed}, conflicts {report.conflicts}"
                    )
            except SyncError as exc:
                err.print(f"sync failed: {exc} (retrying in {every:g}s)")
                if session.state.revoked:
                    raise
            stop.wait(every)
    err.print("stopped")


@app.command()
def status(json_out: Annotated[bool, typer.Option("--json", help="JSON output.")] = False) -> None:
    """Where this device stands: ids, clock, cursor, pending work, problems."""
    with _session() as session:
        conn = session.vault.conn
        pushes, tombstones = count_to_push(conn)
        conflicts = conn.execute(
            "SELECT count(*) FROM sync_conflicts WHERE restored_at IS NULL"
        ).fetchone()[0]
        reachable: bool | None = None
        if session.config.server_url:
            try:
                with session.relay(max_retries=0, timeout=5) as relay:
                    relay.health()
                reachable = True
            except (SyncError, ValueError):
                reachable = False
        info: dict[str, Any] = {
            "vault_dir": str(session.path),
            "vault_id": session.config.vault_id,
            "relay": session.config.server_url,
            "relay_reachable": reachable,
            "device_id": session.device.device_id,
            "device_label": session.device.label,
            "clock": session.device.vector_clock,
            "cursor": session.state.cursor,
            "pending_pushes": pushes,
            "pending_tombstones": tombstones,
            "conflicts": int(conflicts),
            "skipped_blobs": [asdict(s) for s in session.state.skipped],
            "oversized": session.state.oversized,
            "revoked": session.state.revoked,
            "vault_key": vault_keys.key_source(conn, session.config.vault_id),
            "last_sync_at": session.state.last_sync_at,
            "last_error": session.state.last_error,
        }
    if json_out:
        _print_json(info)
        return
    for key, value in info.items():
        if key == "skipped_blobs":
            out.print(f"skipped_blobs: {len(value)}")
            for s in value[-10:]:
                out.print(
                    f"  {s['memory_id']} from {s['device_id']} @{s['vector_clock']}: {s['reason']}"
                )
        else:
            out.print(f"{key}: {value}")  # fmt: skip


@app.command()
def devices(json_out: Annotated[bool, typer.Option("--json", help="JSON output.")] = False) -> None:
    """The relay's roster of devices for this vault."""
    with _session() as session, session.relay() as relay:
        roster = relay.devices(session.config.vault_id or "")
        me = session.device.device_id
    rows = [
        {
            "device_id": d.device_id,
            "label": d.label,
            "last_seen": d.last_seen,
            "blob_count": d.blob_count,
            "revoked": d.revoked,
            "this_device": d.device_id == me,
        }
        for d in roster.devices
    ]
    if json_out:
        _print_json(rows)
        return
    for r in rows:
        flags = (" (this device)" if r["this_device"] else "") + (
            " REVOKED" if r["revoked"] else ""
        )
        out.print(f"{r['device_id']}  {r['label'] or '-'}  last seen {r['last_seen']}  "
                  f"{r['blob_count']} blobs{flags}")  # fmt: skip


@app.command()
def revoke(device_id: Annotated[str, typer.Argument(help="Device id to revoke.")]) -> None:
    """Revoke a device (needs an admin key): its pushes and pulls are refused from now on."""
    with _session() as session, session.relay() as relay:
        relay.revoke_device(session.config.vault_id or "", device_id)
    out.print(f"revoked {device_id}")


@conflicts_app.callback()
def conflicts_list(
    ctx: typer.Context,
    json_out: Annotated[bool, typer.Option("--json", help="JSON output.")] = False,
) -> None:
    """List kept conflict copies (`conflicts restore ID` brings one back as a new edit)."""
    if ctx.invoked_subcommand is not None:
        return
    with _session() as session:
        items = conflict_ops.list_conflicts(session.vault.conn)
    if json_out:
        _print_json([asdict(c) for c in items])
        return
    if not items:
        out.print("no conflicts")
    for c in items:
        what = "deletion" if c.local_deleted else (c.local_content or "")[:70]
        out.print(f"#{c.id}  {c.memory_id}  lost to {c.remote_device_id}@{c.remote_vector_clock}"
                  f"  {c.detected_at[:19]}  {what}")  # fmt: skip


@conflicts_app.command("restore")
def conflicts_restore(conflict_id: Annotated[int, typer.Argument(help="Conflict number.")]) -> None:
    """Restore a kept local version as a new local edit (it syncs like any edit)."""
    with _session() as session, session.vault.transaction() as conn:
        memory_id = conflict_ops.restore_conflict(conn, conflict_id)
    out.print(f"restored conflict #{conflict_id} into {memory_id}; run `engram-sync sync`")


# --- accounts, vault keys and the team handoff -------------------------------------------------


def _secret_input(env: str, prompt: str, *, confirm: bool = False) -> str:
    value = os.environ.get(env)
    if value:
        return value
    if not sys.stdin.isatty():
        raise CliError(f"no {prompt.lower()}: set {env} or run in a terminal to be asked")
    typed: str = typer.prompt(prompt, hide_input=True, confirmation_prompt=confirm)
    if not typed:
        raise CliError(f"the {prompt.lower()} must not be empty")
    return typed


def _account_password(confirm: bool = False) -> str:
    return _secret_input("ENGRAM_ACCOUNT_PASSWORD", "Account password", confirm=confirm)


def _email(given: str | None) -> str:
    if given:
        return given
    if not sys.stdin.isatty():
        raise CliError("no email: pass --email (or ENGRAM_EMAIL) or run in a terminal")
    typed: str = typer.prompt("Email")
    return typed


def _vault_dir() -> Path:
    if not (OPTIONS.vault / "engrams.db").exists():
        raise CliError(f"no vault at {OPTIONS.vault}: run `engram-sync init` (or pass --vault DIR)")
    return OPTIONS.vault


def _relay_url(given: str | None) -> str:
    if given:
        return given
    signed_in = account_ops.load_account(_vault_dir())
    if signed_in is not None:
        return signed_in.server_url
    linked = load_sync_config(_vault_dir()).server_url
    if linked:
        return linked
    raise CliError("pass --relay URL (the relay your account is on)")


RelayOpt = Annotated[
    str | None, typer.Option("--relay", help="Relay URL (default: the account's or linked one).")
]
EmailOpt = Annotated[str | None, typer.Option("--email", envvar="ENGRAM_EMAIL", help="Email.")]


@account_app.command("signup")
def account_signup(relay: RelayOpt = None, email: EmailOpt = None) -> None:
    """Create an account (asks the password twice); signs in on this vault directory."""
    vault_dir, url = _vault_dir(), _relay_url(relay)
    address = _email(email)
    password = _account_password(confirm=True)
    signed = account_ops.signup(vault_dir, url, address, password)
    out.print(f"signed up and signed in as {signed.email} on {signed.server_url}")
    err.print(
        "next: `engram-sync vault open` keeps this vault's key in the account; "
        "`engram-sync account recovery-phrase` sets up recovery if you forget the password"
    )


@account_app.command("signin")
def account_signin(relay: RelayOpt = None, email: EmailOpt = None) -> None:
    """Sign in to your account on this vault directory."""
    vault_dir, url = _vault_dir(), _relay_url(relay)
    signed = account_ops.signin(vault_dir, url, _email(email), _account_password())
    out.print(f"signed in as {signed.email} on {signed.server_url}")


@account_app.command("signout")
def account_signout() -> None:
    """End the session and forget it on this vault directory."""
    if account_ops.signout(_vault_dir()):
        out.print("signed out")
    else:
        out.print("not signed in")


@account_app.command("recovery-phrase")
def account_recovery_phrase() -> None:
    """Make a recovery phrase (shown once): it resets the password if you forget it."""
    account_ops.require_account(_vault_dir())
    phrase = account_ops.set_recovery_phrase(_vault_dir(), _account_password())
    out.print("Your recovery phrase (shown once; any earlier phrase no longer works):")
    out.print()
    out.print(f"    [bold]{escape(phrase)}[/bold]")
    out.print()
    out.print(
        "Write it down and keep it offline. With it, anyone can take over the account; "
        "without it and the password, the account's keys are gone for good."
    )


@account_app.command("recover")
def account_recover(relay: RelayOpt = None, email: EmailOpt = None) -> None:
    """Set a new password with your recovery phrase (the forgotten password is not needed)."""
    vault_dir, url = _vault_dir(), _relay_url(relay)
    address = _email(email)
    phrase = _secret_input("ENGRAM_RECOVERY_PHRASE", "Recovery phrase")
    new_password = _secret_input(
        "ENGRAM_NEW_ACCOUNT_PASSWORD", "New account password", confirm=True
    )
    signed = account_ops.recover(vault_dir, url, address, phrase, new_password)
    out.print(f"new password set; signed in as {signed.email} (every other session was ended)")


@account_app.command("status")
def account_status(
    json_out: Annotated[bool, typer.Option("--json", help="JSON output.")] = False,
) -> None:
    """Who is signed in where, and the vaults the account holds keys for."""
    info = account_ops.status(_vault_dir())
    if json_out:
        _print_json(info)
        return
    if not info["signed_in"]:
        out.print("not signed in: `engram-sync account signin --relay URL`")
        return
    for key in ("email", "server_url", "account_id", "expires_at", "session_valid"):
        out.print(f"{key}: {escape(str(info[key]))}")
    vaults = info["vaults"]
    shown = "?" if vaults is None else ", ".join(vaults) or "-"
    out.print(f"vaults: {escape(shown)}")


@vault_app.command("open")
def vault_open() -> None:
    """Keep the linked vault's key in your account (wrapped; the relay cannot open it)."""
    account_ops.require_account(_vault_dir())
    with _session() as session:
        vault_id = account_ops.open_vault(session, _account_password())
    out.print(f"the key of vault {vault_id} is now kept in your account")
    err.print(
        "on a new device: `engram-sync account signin`, then "
        "`engram-sync link --relay URL --account`"
    )


@vault_app.command("close")
def vault_close() -> None:
    """Remove the linked vault's key from your account (keys minted from it stay valid)."""
    vault_dir = _vault_dir()
    account_ops.require_account(vault_dir)
    if account_ops.close_vault(vault_dir, _account_password()):
        out.print("the vault's key was removed from your account")
    else:
        out.print("your account held no key for this vault")


@team_app.command("invite")
def team_invite(
    label: Annotated[str | None, typer.Option("--label", help="Name of the new device.")] = None,
) -> None:
    """Issue a pairing code for a new device (admin key, or the owning account)."""
    with _session() as session:
        signed_in = account_ops.load_account(session.path)
        token = None
        if signed_in is not None and signed_in.server_url == session.config.server_url:
            token = signed_in.session_token
        issued = pairing.issue_code(session, label, session_token=token)
    out.print(f"pairing code (shown once, single use, until {issued.expires_at}):")
    out.print(f"    [bold]{escape(issued.code)}[/bold]")
    out.print(
        f"on the new device: `engram-sync link --relay {escape(session.config.server_url or '')} "
        "--code CODE`, then `engram-sync team request`"
    )


@team_app.command("request")
def team_request(
    label: Annotated[str | None, typer.Option("--label", help="Shown to the admin.")] = None,
    wait: Annotated[
        float, typer.Option("--wait", help="Seconds to wait for an admin.", min=0)
    ] = team.DEFAULT_WAIT_SECS,
) -> None:
    """Ask an admin for the vault key (or resume the open request) and keep it on this device."""

    def show(waiting: team.Waiting) -> None:
        verb = "Resuming request" if waiting.resumed else "Requested the vault key:"
        out.print(f"{verb} {waiting.request_id} (open until {waiting.expires_at})")
        out.print("Compare this code with the one on the admin's screen:")
        out.print()
        out.print(f"    [bold]{escape(waiting.fingerprint)}[/bold]")
        out.print()
        out.print(
            f"The admin runs `engram-sync team approve {waiting.request_id}`. Waiting "
            f"{wait:g}s (Ctrl-C stops waiting; run this again to resume)."
        )

    with _session() as session:
        vault_id = team.request_key(session, label, wait=wait, on_waiting=show)
    out.print(f"this device now holds the key of vault {vault_id}: run `engram-sync sync`")


@team_app.command("pending")
def team_pending(
    json_out: Annotated[bool, typer.Option("--json", help="JSON output.")] = False,
) -> None:
    """Open key requests of the linked vault (admin), with their fingerprints."""
    with _session() as session:
        requests = team.pending(session)
    rows = [
        {
            "request_id": r.request_id,
            "label": r.label,
            "fingerprint": r.fingerprint,
            "created_at": r.created_at,
            "expires_at": r.expires_at,
        }
        for r in requests
    ]
    if json_out:
        _print_json(rows)
        return
    if not rows:
        out.print("no open requests")
    for r in rows:
        out.print(
            f"{r['request_id']}  {escape(r['fingerprint'])}  {escape(r['label'] or '-')}  "
            f"until {r['expires_at']}"
        )


@team_app.command("approve")
def team_approve(
    request_id: Annotated[str, typer.Argument(help="The request id (`team pending`).")],
    yes: Annotated[
        bool, typer.Option("--yes", help="Skip the fingerprint question (not recommended).")
    ] = False,
) -> None:
    """Seal this device's vault key to a new device's request, after comparing fingerprints."""
    with _session() as session:
        request = team.find_pending(session, request_id)
        out.print(f"request {request.request_id} from {escape(request.label or '-')}")
        out.print(f"    fingerprint: [bold]{escape(request.fingerprint)}[/bold]")
        if yes:
            err.print(
                "warning: --yes skips the fingerprint comparison; a relay that swapped the key "
                "would get the vault key"
            )
        elif not typer.confirm(
            "Does this match the code on the new device's screen?", default=False
        ):
            raise CliError("not approved: the fingerprints must match (nothing was sent)")
        team.approve(session, request)
    out.print(f"approved: the new device can now fetch the vault key (request {request_id})")


def main() -> None:
    """Entry point: one clear line and a non-zero exit on errors; `--debug` for tracebacks."""
    debug = "--debug" in sys.argv
    if debug:
        sys.argv.remove("--debug")
    try:
        code = app(standalone_mode=False)  # a typer.Exit(n) inside a command returns n
        if isinstance(code, int) and code:
            sys.exit(code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        err.print("aborted")
        sys.exit(130)
    except Exception as exc:
        if debug:
            raise
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        sys.exit(_report_error(exc))


def _report_error(exc: Exception) -> int:
    if isinstance(exc, WrongPassphraseError):
        err.print(f"error: {exc}. Check ENGRAM_PASSPHRASE or the passphrase you typed.")
        return 2
    if isinstance(exc, CliError | SyncError | FormatError | ValueError | OSError):
        err.print(f"error: {exc}")
        return 1
    err.print(f"error: {type(exc).__name__}: {exc} (run again with --debug for details)")
    return 1
