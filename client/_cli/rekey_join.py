"""`engram-sync rekey --join`, and what `sync` and `status` say of a retired vault
(PROTOCOL §19; docs/rekey.md "Other devices"; client._flows.successor, client._sync.retirement).

Secrets never come from the command line: the vault's current passphrase from
ENGRAM_PASSPHRASE or a prompt, the new one from ENGRAM_NEW_PASSPHRASE or a prompt, the
account password from ENGRAM_ACCOUNT_PASSWORD or a prompt, a key for the new vault from
ENGRAM_NEW_API_KEY (default: the current key).
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict
from typing import Any

import typer

from engram_sync.shared_format.errors import WrongPassphraseError

from .._flows.successor import (
    JoinReport,
    UnprovenSuccessorError,
    join_kind,
    join_with_account,
    join_with_handoff,
    join_with_passphrase,
    successor_hint,
    successor_proved,
    unproven_what,
)
from .._session import VaultSession
from .support import (
    NEW_PASSPHRASE_ENV,
    OPTIONS,
    CliError,
    ask_passphrase,
    ask_secret,
    err,
    out,
    print_json,
)
from .teams import account_password

ACCOUNT_PASSWORD_ENV = "ENGRAM_ACCOUNT_PASSWORD"  # noqa: S105 - a variable name
NEW_API_KEY_ENV = "ENGRAM_NEW_API_KEY"


def ask_new_passphrase() -> str:
    """The passphrase the vault was re-keyed to: ENGRAM_NEW_PASSPHRASE, else a prompt."""
    return ask_secret(NEW_PASSPHRASE_ENV, "The vault's new passphrase", what="new passphrase")


def _confirm(what: str) -> bool:
    """Ask the person whether to switch to a vault that is not the relay's hint, or that
    the relay names without a valid successor statement (PROTOCOL §19); never in a script."""
    if not sys.stdin.isatty():
        return False
    err.print(f"warning: {what}", highlight=False)
    return typer.confirm("Switch this device to it anyway?", default=False)


def _new_api_key() -> str | None:
    value = os.environ.get(NEW_API_KEY_ENV, "").strip()
    return value or None


def _open(new_passphrase: str | None) -> tuple[VaultSession, str | None]:
    """The session with the current passphrase; when that no longer opens engrams.db (a
    join that rekeyed it already), with the new one."""
    path = OPTIONS.vault
    if not (path / "engrams.db").exists():
        raise CliError(f"no vault at {path}: run `engram-sync init` (or pass --vault DIR)")
    try:
        return VaultSession.open(path, ask_passphrase()), new_passphrase
    except WrongPassphraseError:
        new_passphrase = new_passphrase or ask_new_passphrase()
        return VaultSession.open(path, new_passphrase), new_passphrase


def join(*, force: bool, json_out: bool, named: str | None = None) -> None:
    """Move this device to the vault that replaced its retired one (PROTOCOL §19); `named`
    (`--successor`): the person's word for a successor without a valid statement."""
    if named is not None and not named.strip():
        raise CliError("--successor needs a vault id")
    session, new_passphrase = _open(None)
    with session:
        kind = join_kind(session)
        if kind == "passphrase":
            report = join_with_passphrase(
                session,
                new_passphrase or ask_new_passphrase(),
                api_key=_new_api_key(),
                force=force,
                confirm=_confirm,
                named=named,
            )
        elif kind == "account":
            named = _check_before_password(session, named)
            report = join_with_account(session, account_password(), named=named, confirm=_confirm)
        else:
            report = join_with_handoff(
                session, api_key=_new_api_key(), named=named, confirm=_confirm
            )
    if json_out:
        print_json(asdict(report))
        return
    out.print(_joined(report))


def _joined(report: JoinReport) -> str:
    if report.already:
        return f"this device syncs vault {report.new_vault_id} already" + (
            "; engrams.db now opens with the new passphrase" if report.db_rekeyed else ""
        )
    what = f"this device now syncs vault {report.new_vault_id} (it replaced {report.old_vault_id})"
    if report.waiting_for_key:
        return (
            f"{what}; its key comes through the team handoff: run `engram-sync team request` "
            f"and have an admin approve it; {report.pending} unpushed change(s) wait for it"
        )
    parts = [what]
    if report.db_rekeyed:
        parts.append("engrams.db now opens with the new passphrase")
    parts.append(f"run `engram-sync sync`: {report.pending} unpushed change(s) go there")
    return "; ".join(parts)


def _check_before_password(session: VaultSession, named: str | None) -> str | None:
    """PROTOCOL §19: the successor statement checked (or the person asked) before the
    account password is asked for; the successor the person confirmed, if asked."""
    hint = successor_hint(session)
    if named is not None or hint is None or successor_proved(session, hint):
        return named
    if not _confirm(unproven_what(session.config.vault_id or "?", hint)):
        raise UnprovenSuccessorError(session.config.vault_id or "?", hint)
    return hint


def follow_successor(session: VaultSession) -> bool:
    """`sync` of a retired account vault: the successor's key from the account, when the
    account password is at hand (ENGRAM_ACCOUNT_PASSWORD or a terminal); True if switched.
    Only a successor whose statement verifies under the old vault's key is followed by
    itself (PROTOCOL §19); any other is asked about on a terminal and refused in a script,
    naming both vault ids and `rekey --join --successor ID`."""
    if join_kind(session) != "account":
        return False
    if not os.environ.get(ACCOUNT_PASSWORD_ENV) and not sys.stdin.isatty():
        return False
    named = _check_before_password(session, None)
    report = join_with_account(session, account_password(), named=named)
    err.print(
        f"vault {report.old_vault_id} was re-keyed on another device: this device now syncs "
        f"its successor {report.new_vault_id} with the key from your account; "
        f"{report.pending} unpushed change(s) go there now",
        highlight=False,
    )
    return True


def retired_status(session: VaultSession) -> dict[str, Any] | None:
    """`status`: the relay's word that the linked vault is retired, and the re-key this
    device followed (None when neither)."""
    hint = session.state.retired
    if hint is None and session.state.rekeyed_from is None:
        return None
    return {
        "successor": hint.successor if hint else None,
        "erase_after": hint.erase_after if hint else None,
        "seen_at": hint.seen_at if hint else None,
        "rekeyed_from": session.state.rekeyed_from,
    }
