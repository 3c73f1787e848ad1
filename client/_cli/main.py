"""The `engram-sync` command: a vault on this device, synced through a relay.

The vault directory comes from `--vault` or `ENGRAM_VAULT` (default
`~/.engram/vault`); the passphrase from `ENGRAM_PASSPHRASE` or a prompt, never
from the command line. Errors are one line and a non-zero exit (`--debug` shows
the traceback).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from dataclasses import asdict
from types import FrameType
from typing import Annotated, Any, Final

import typer

from engram_sync import __version__
from engram_sync.cli_kit.usage import debug_option, run, version_option
from engram_sync.shared_format.errors import FormatError, WrongPassphraseError
from engram_sync.shared_format.plaintext import encode_memory

from .._agent import control as agent_control
from .._errors import (
    AuthError,
    DeviceRevokedError,
    ForbiddenError,
    RelayError,
    SyncError,
    VaultRetiredError,
)
from .._render import LAYERS, conflict_line, list_items, render_list
from .._session import NotLinkedError, VaultSession
from .._sync.config import DEFAULT_INTERVAL_SECS, load_sync_config
from .._sync.device import ClockExhaustedError
from .._sync.unpushable import shown_id
from .._vault import conflicts as conflict_ops
from .._vault import local_writes
from .._vault.privacy import (
    PRIVACY_LEVELS,
    RetractRefusedError,
    level_change_notice,
    local_only_count,
    pending_retractions,
    queue_retraction,
)
from .._vault.store import add_memory as store_add
from .._vault.store import (
    count_to_push,
    get_memory,
)
from . import agent as cli_agent
from . import history as cli_history
from . import mcp_command as cli_mcp
from . import search as cli_search
from . import sync_command as cli_sync
from . import teams as cli_teams
from . import transfer as cli_transfer
from . import web_command as cli_web
from .rekey import rekey as cli_rekey
from .support import (
    OPTIONS,
    CliError,
    err,
    open_session,
    out,
    print_json,
)
from .vault_registry import resolve_vault, vaults_app
from .verify import verify

# A command imports what only it needs in its body (the relay client and httpx, the sync
# engine, spake2, zxcvbn, rich's progress bars), so `list` does not pay for `sync` (issue 17,
# docs/agent.md; tests/client/cli/test_cli_imports.py pins it).


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
app.add_typer(cli_teams.account_app, name="account")
app.add_typer(cli_teams.vault_app, name="vault")
app.add_typer(cli_teams.team_app, name="team")
app.command("verify")(verify)  # PROTOCOL §18 (client._cli.verify)
app.command("rekey")(cli_rekey)  # PROTOCOL §19 (client._cli.rekey)
cli_transfer.register(app)
cli_search.register(app)
app.add_typer(vaults_app, name="vaults")
cli_agent.register(app)  # unlock, lock: the key agent (docs/agent.md)
cli_history.register(app)  # history, undelete, restore, revert (docs/history.md)
cli_mcp.register(app)  # mcp: the MCP server for AI tools (docs/mcp.md)
cli_web.register(app)  # web: the web vault on 127.0.0.1 (docs/web-vault.md)


@app.callback()
def _main(
    vault: Annotated[
        str | None,
        typer.Option(
            "--vault",
            envvar="ENGRAM_VAULT",
            help="Vault directory, or a name from `engram-sync vaults` (default ~/.engram/vault).",
            show_default=False,
            metavar="DIR|NAME",
        ),
    ] = None,
    version: Annotated[bool, version_option("engram-sync", __version__)] = False,
    debug: Annotated[bool, debug_option()] = False,
) -> None:
    OPTIONS.vault = resolve_vault(vault)  # a name from the registry, or a directory


@app.command()
def init(
    force: Annotated[
        bool,
        typer.Option("--force", help="Keep a weak passphrase without asking (for scripts)."),
    ] = False,
) -> None:
    """Create a new passphrase-encrypted vault in the vault directory (a weak passphrase
    is named and needs a confirmation, or --force)."""
    if (OPTIONS.vault / "engrams.db").exists():
        raise CliError(f"a vault already exists at {OPTIONS.vault}")
    from .passphrase import ask_new_passphrase

    passphrase = ask_new_passphrase(force=force)  # client._cli.passphrase (zxcvbn)
    OPTIONS.vault.mkdir(mode=0o700, parents=True, exist_ok=True)
    with VaultSession.open(OPTIONS.vault, passphrase, create=True) as session:
        out.print(f"created vault {session.path} (device {session.device.device_id})", markup=False)


@app.command()
# long: the command's options are its signature (typer)
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
        str | None,
        typer.Option(
            "--code",
            help="The whole pairing code ENG-XXXX-XXXX-XXXX-SSSS-SSSS from an admin (only its "
            "first part is sent to the relay).",
        ),
    ] = None,
    vault_id: Annotated[
        str | None, typer.Option("--vault-id", help="Pin a vault id (default: derived).")
    ] = None,
    label: Annotated[str | None, typer.Option("--label", help="This device's name.")] = None,
) -> None:
    """Link the vault to a relay: with an API key, your account (--account) or a pairing code."""
    from .._accounts import account as account_ops
    from .._accounts import pairing
    from .._vault import vault_key_store as vault_keys
    from .teams import account_password

    if account and code:
        raise CliError("use either --account or --code, not both")
    if code:
        if vault_id:
            raise CliError("--vault-id does not go with --code: the code names the vault")
        with open_session() as session:
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
        with open_session() as session:
            chosen = account_ops.link_with_account(
                session, relay, account_password(), vault_id, label
            )
            device_id = session.device.device_id
        out.print(f"linked to {relay} as vault {chosen} (device {device_id})")
        out.print("the vault key came from your account: run `engram-sync sync`")
        return
    if not api_key:
        raise CliError("pass --api-key KEY (or ENGRAM_API_KEY), --account or --code CODE")
    # a vault id derived from the passphrase needs the passphrase itself (not the agent's keys)
    with open_session(
        use_agent=bool(vault_id or load_sync_config(OPTIONS.vault).vault_id)
    ) as session:
        chosen = session.link(relay, api_key, vault_id, label)
        with session.vault.transaction() as conn:
            vault_keys.clear_expected(conn, chosen)
        out.print(f"linked to {relay} as vault {chosen} (device {session.device.device_id})")
        _warn_if_keys_open_nothing(session, chosen)


def _warn_if_keys_open_nothing(session: VaultSession, vault_id: str) -> None:
    """Issue 35: say at once when this device's keys open none of the vault's blobs (a
    typo, or a member device before its handoff); `sync` refuses to go on until they do.
    Only a note: a member device must be linked before it can request the key."""
    from .._vault import vault_key_store as vault_keys

    try:
        with session.relay() as client:
            opens = vault_keys.keys_open_relay_blobs(client, vault_id, session.keys)
    except SyncError:
        return  # the first sync checks again, and says why it cannot
    if opens is False:
        source = vault_keys.key_source(session.vault.conn, vault_id)
        note = vault_keys.keys_refused_message(vault_id, source, "`sync` will refuse until then")
        err.print(f"note: {note}", markup=False, highlight=False)


@app.command()
def add(
    text: Annotated[str, typer.Argument(help="The memory's text.")],
    tag: Annotated[list[str] | None, typer.Option("--tag", help="A tag (repeatable).")] = None,
    project: Annotated[str | None, typer.Option("--project", help="Project name.")] = None,
    layer: Annotated[str, typer.Option("--layer", help="episodic, semantic or imagined.")] = (
        "episodic"
    ),
    privacy: Annotated[str, typer.Option("--privacy", help=_PRIVACY_HELP)] = "cloud_first",
) -> None:
    """Add a memory; prints its id."""
    if layer not in LAYERS:
        raise CliError(f"--layer must be one of {', '.join(LAYERS)}")
    _check_privacy(privacy)
    if not text.strip():
        raise CliError("the memory text is empty")
    with open_session() as session, session.vault.transaction() as conn:
        memory_id = store_add(
            conn, text, layer=layer, tags=tag or [], project=project, privacy_level=privacy
        )
    out.print(memory_id, markup=False)


_PRIVACY_HELP: Final = (
    "strict_local (never leaves this device), hybrid, cloud_first or enterprise (docs/privacy.md)."
)


def _check_privacy(level: str) -> None:
    if level not in PRIVACY_LEVELS:
        raise CliError(f"--privacy must be one of {', '.join(PRIVACY_LEVELS)}")


@app.command("list")
def list_(json_out: Annotated[bool, typer.Option("--json", help="JSON output.")] = False) -> None:
    """List memories, oldest first."""
    with open_session() as session:
        items = list_items(session.vault.conn)
    render_list(items, json_out, out, err)


@app.command()
def show(memory_id: Annotated[str, typer.Argument(help="Memory id.")]) -> None:
    """Show one memory in full (JSON)."""
    with open_session() as session:
        memory = get_memory(session.vault.conn, memory_id)
    if memory is None:
        raise CliError(f"no memory {memory_id!r}; `engram-sync list` shows the ids")
    print_json(json.loads(encode_memory(memory)))


@app.command()
def edit(
    memory_id: Annotated[str, typer.Argument(help="Memory id.")],
    text: Annotated[str | None, typer.Argument(help="The new text.")] = None,
    privacy: Annotated[str | None, typer.Option("--privacy", help=_PRIVACY_HELP)] = None,
) -> None:
    """Replace a memory's text, or change its privacy level (or both)."""
    if text is None and privacy is None:
        raise CliError("nothing to change: give the new text, or --privacy LEVEL")
    if privacy is not None:
        _check_privacy(privacy)
    if text is not None and not text.strip():
        raise CliError("the memory text is empty")
    notice = None
    with open_session() as session, session.vault.transaction() as conn:
        previous = local_writes.edit(
            conn, memory_id, text, privacy, session.writer(), own_device=session.device.device_id
        )
        if previous is None:
            raise CliError(f"no memory {memory_id!r}; `engram-sync list` shows the ids")
        if privacy is not None and previous != privacy:
            notice = level_change_notice(conn, memory_id, previous, privacy)
    if text is not None:
        out.print(f"edited {memory_id}", markup=False)
    if notice is not None:
        out.print(notice, markup=False)


@app.command()
def retract(
    memory_ids: Annotated[list[str], typer.Argument(help="Ids of strict_local memories.")],
) -> None:
    """Remove strict_local memories' copies already synced from the relay and the other
    devices (a deletion is pushed); they stay on this device, still strict_local."""
    with open_session() as session:
        with session.vault.transaction() as conn:
            for memory_id in memory_ids:
                try:
                    queue_retraction(conn, memory_id)
                except RetractRefusedError as exc:
                    raise CliError(str(exc)) from None
        if not session.config.server_url:
            out.print(
                f"retraction of {len(memory_ids)} memory(ies) queued: this vault is not "
                "linked; `engram-sync link` then `engram-sync sync` pushes it",
                markup=False,
            )
            return
    cli_sync.sync(json_out=False)
    with open_session() as session:
        left = set(pending_retractions(session.vault.conn))
    done = [m for m in memory_ids if m not in left]
    if done:
        out.print(
            f"retracted {', '.join(done)}: removed from the relay and, at their next sync, "
            "from the other devices; kept here, strict_local",
            markup=False,
        )
    if left:
        raise CliError(
            f"not retracted yet: {', '.join(sorted(left))} (queued): run `engram-sync sync` again"
        )


@app.command()
def delete(memory_id: Annotated[str, typer.Argument(help="Memory id.")]) -> None:
    """Delete a memory (the deletion syncs to the other devices)."""
    with open_session() as session, session.vault.transaction() as conn:
        own = session.device.device_id
        if not local_writes.delete(conn, memory_id, session.writer(), own_device=own):
            raise CliError(f"no memory {memory_id!r}; `engram-sync list` shows the ids")
    out.print(f"deleted {memory_id}", markup=False)


app.command()(cli_sync.sync)  # client/_cli/sync_command.py, also run by `revert`


@app.command()
def watch(
    interval: Annotated[
        float | None,
        typer.Option(
            "--interval",
            help="Seconds between syncs when nothing else triggers one (the live feed and "
            "local changes sync at once).",
            min=1,
            show_default=f"the vault's interval_secs, {DEFAULT_INTERVAL_SECS}",
        ),
    ] = None,
) -> None:
    """Sync live until Ctrl-C or SIGTERM: pull as soon as another device pushes, push as
    soon as this vault changes (docs/live-sync.md)."""
    from .._flows.live import LiveSync
    from .watch_view import watch_view

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with open_session() as session:
        if not session.config.server_url or not session.config.vault_id:
            raise CliError(
                f"the vault at {session.path} is not linked to a relay: run `engram-sync link "
                "--relay URL --api-key KEY` (or --account, or --code CODE) first"
            )
        every = interval or session.config.interval_secs
        err.print(
            f"watching {session.path} live (a sync at least every {every:g}s; Ctrl-C to stop)"
        )
        with watch_view(err) as view:
            live = LiveSync(
                session,
                interval=every,
                stop=stop,
                retry=_watch_retries,
                on_status=view.show,
            )
            try:
                for report in live.run():
                    notice = cli_sync.repair_notice(report)
                    if notice:
                        view.say(notice)
                    if report.applied or report.pushed or report.conflicts or report.invalid:
                        view.say(
                            f"pulled {report.pulled} (applied {report.applied}), "
                            f"pushed {report.pushed}, conflicts {report.conflicts}",
                            stdout=True,
                        )
            except (DeviceRevokedError, VaultRetiredError) as exc:
                raise CliError(f"{exc.message}; watch stopped") from None
    err.print("stopped")


#: 4xx answers `watch` retries: a timeout, a conflict, too early, a quota (the user may
#: delete memories), too many requests. Any other 4xx says the same again (issue 17).
_WATCH_RETRIED_4XX: Final = frozenset({402, 408, 409, 425, 429})


def _watch_retries(error: SyncError) -> bool:
    """What `watch` retries with backoff: anything that may pass by itself. A wrong or
    refused key, a revoked device, a vault the device cannot open and a relay refusing the
    request itself (a 4xx such as 400, 404, 413, 422) end it at once with the error; so do
    keys that open none of the vault's blobs (issue 35: the same keys fail again)."""
    from .._vault.vault_key_store import KeysDoNotOpenVaultError

    if isinstance(error, KeysDoNotOpenVaultError):
        return False
    status = error.status if isinstance(error, RelayError) else 0
    if 400 <= status < 500 and status not in _WATCH_RETRIED_4XX:
        return False
    return not isinstance(
        error,
        AuthError | ForbiddenError | NotLinkedError | ClockExhaustedError | VaultRetiredError,
    )


@app.command()
def status(json_out: Annotated[bool, typer.Option("--json", help="JSON output.")] = False) -> None:
    """Where this device stands: ids, clock, cursor, pending work, problems."""
    from .._vault import vault_key_store as vault_keys
    from . import rekey_join

    with open_session() as session:
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
            "local_only": local_only_count(conn),  # strict_local, never pushed (privacy.md)
            "conflicts": int(conflicts),
            "skipped_blobs": [asdict(s) for s in session.state.skipped],
            "oversized": session.state.oversized,
            "revoked": session.state.revoked,
            "vault_key": vault_keys.key_source(conn, session.config.vault_id),
            "last_sync_at": session.state.last_sync_at,
            "retired": rekey_join.retired_status(session),  # PROTOCOL §19
            "last_error": _last_error(session),
            "agent": agent_control.agent_state(session.path),  # docs/agent.md
        }
    if json_out:
        print_json(info)
        return
    for key, value in info.items():
        if key == "skipped_blobs":
            out.print(f"skipped_blobs: {len(value)}")
            for s in value[-10:]:
                out.print(  # ids as the relay sent them: escaped (issue 31)
                    f"  {shown_id(s['memory_id'])} from {shown_id(s['device_id'])}"
                    f" @{s['vector_clock']}: {s['reason']}",
                    markup=False,
                )
        else:
            out.print(f"{key}: {'none' if value is None else value}", markup=False)


def _last_error(session: VaultSession) -> str | None:
    """The last sync's failure in words; a revocation says so and what to do (the relay's
    last word, asked again by the next sync: client._sync.revocation)."""
    if session.state.revoked:
        from .._sync.revocation import revoked_message

        return revoked_message(session.device.device_id, session.config.vault_id)
    return session.state.last_error


@app.command()
def devices(json_out: Annotated[bool, typer.Option("--json", help="JSON output.")] = False) -> None:
    """The relay's roster of devices for this vault."""
    with open_session() as session, session.relay() as relay:
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
        print_json(rows)
        return
    for r in rows:
        flags = (" (this device)" if r["this_device"] else "") + (
            " REVOKED" if r["revoked"] else ""
        )
        out.print(f"{r['device_id']}  {r['label'] or '-'}  last seen {r['last_seen']}  "
                  f"{r['blob_count']} blobs{flags}", markup=False)  # fmt: skip


@app.command()
def revoke(
    device_id: Annotated[str, typer.Argument(help="Device id to revoke.")],
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Revoke an id the relay has never seen (pre-revoke it on purpose)."
        ),
    ] = False,
    yes: Annotated[
        bool,
        typer.Option("--yes", help="Revoke this device's own id without asking (for scripts)."),
    ] = False,
) -> None:
    """Revoke a device (needs an admin key): its pushes and pulls are refused from now on.

    The id must be on the vault's roster (`engram-sync devices`) unless --force: a
    mistyped id would otherwise revoke a device that does not exist, and no other. This
    device's own id is asked about first (--yes for scripts).
    """
    with open_session() as session, session.relay() as relay:
        vault_id = session.config.vault_id or ""
        own = device_id == session.device.device_id
        if own and not yes:
            _confirm_own_revoke(device_id)
        if not force:
            known = {d.device_id for d in relay.devices(vault_id).devices}
            if device_id not in known:
                raise CliError(
                    f"vault {vault_id} has no device {device_id!r}; check the id with "
                    "`engram-sync devices`, or pass --force to pre-revoke it"
                )
        relay.revoke_device(vault_id, device_id)
        if own:  # it stops pushing now; `link` with a new key gives it a new id (issue 31)
            session.state.revoked = True
            session.state.save()
    if own:
        out.print(
            f"revoked {device_id} (this device): it no longer syncs; its memories stay here. "
            "To sync again, ask an admin for a new key and run `engram-sync link` with it: "
            "this device then gets a new device id",
            markup=False,
        )
        return
    out.print(f"revoked {device_id}", markup=False)


def _confirm_own_revoke(device_id: str) -> None:
    """Revoking the device the command runs on: asked on a terminal, refused elsewhere."""
    what = (
        f"{device_id} is this device: revoked, it can no longer sync until it is linked "
        "again with a new key (under a new device id)"
    )
    if not sys.stdin.isatty():
        raise CliError(f"{what}; nothing was revoked: pass --yes to revoke it anyway")
    err.print(f"warning: {what}", markup=False, highlight=False)
    if not typer.confirm("Revoke this device?", default=False, err=True):
        raise CliError("nothing was revoked")


@conflicts_app.callback()
def conflicts_list(
    ctx: typer.Context,
    json_out: Annotated[bool, typer.Option("--json", help="JSON output.")] = False,
) -> None:
    """List kept conflict copies (`conflicts restore ID` brings one back as a new edit)."""
    if ctx.invoked_subcommand is not None:
        return
    with open_session() as session:
        items = conflict_ops.list_conflicts(session.vault.conn)
    if json_out:
        print_json([asdict(c) for c in items])
        return
    if not items:
        out.print("no conflicts")
    for c in items:
        out.print(conflict_line(c), markup=False)


@conflicts_app.command("restore")
def conflicts_restore(conflict_id: Annotated[int, typer.Argument(help="Conflict number.")]) -> None:
    """Restore a kept local version as a new local edit (it syncs like any edit)."""
    with open_session() as session, session.vault.transaction() as conn:
        own = session.device.device_id
        memory_id = conflict_ops.restore_conflict(conn, conflict_id, session.writer(), own)
    out.print(f"restored conflict #{conflict_id} into {memory_id}; run `engram-sync sync`")


# --- accounts, vault keys and the team handoff -------------------------------------------------


def main() -> None:
    """Entry point: one clear line and a non-zero exit on errors; `--debug` for tracebacks."""
    run(app, "engram-sync", err, _report_error)


def _report_error(exc: Exception) -> int:
    if isinstance(exc, WrongPassphraseError):
        err.print(
            f"error: {exc}. Check ENGRAM_PASSPHRASE or the passphrase you typed.", markup=False
        )
        return 2
    if isinstance(exc, CliError | SyncError | FormatError | ValueError | OSError):
        err.print(f"error: {exc}", markup=False)  # errors quote user text ([x] stays [x])
        return 1
    err.print(
        f"error: {type(exc).__name__}: {exc} (run again with --debug for details)", markup=False
    )
    return 1
