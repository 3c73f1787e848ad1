"""`engram-sync rekey [--json]` (PROTOCOL §19, docs/rekey.md "Client"; client._flows.rekey).

Secrets never come from the command line: the new passphrase from `ENGRAM_NEW_PASSPHRASE`
or a prompt (asked twice), the API key for the new vault from `ENGRAM_NEW_API_KEY` or a
prompt (Enter keeps the current key: an operator key that reaches every vault).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Final

import typer

from engram_sync.shared_format.errors import WrongPassphraseError

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

if TYPE_CHECKING:
    from .._flows.rekey import RekeyProgress, RekeyReport

# The re-key engine, the account layer and rich's progress bar are imported where used, so
# another command does not load them (issue 17; tests/client/cli/test_cli_imports.py).

NEW_API_KEY_ENV: Final = "ENGRAM_NEW_API_KEY"
BATCH_ENV: Final = "ENGRAM_REKEY_BATCH"  # blobs per push of the copy (default PUSH_BATCH)


def _batch_size() -> int:
    from .._flows.rekey import PUSH_BATCH

    raw = os.environ.get(BATCH_ENV, "").strip()
    if not raw:
        return PUSH_BATCH
    if not raw.isdigit() or not 1 <= int(raw) <= 1000:
        raise CliError(f"{BATCH_ENV} must be a whole number from 1 to 1000, not {raw!r}")
    return int(raw)


_DECLINED: Final = "nothing changed: run `engram-sync rekey` again with a stronger new passphrase"


def ask_new_passphrase() -> str:
    """The new passphrase: ENGRAM_NEW_PASSPHRASE, else a prompt asked twice."""
    return ask_secret(
        NEW_PASSPHRASE_ENV, "New vault passphrase", what="new passphrase", confirm=True
    )


def ask_new_api_key() -> str | None:
    """The key for the new vault: ENGRAM_NEW_API_KEY, else a prompt; None keeps the current."""
    env = os.environ.get(NEW_API_KEY_ENV)
    if env:
        return env.strip()
    if not sys.stdin.isatty():
        return None
    value: str = typer.prompt(
        "API key for the new vault (Enter keeps the current key)",
        default="",
        hide_input=True,
        show_default=False,
    )
    return value.strip() or None


@contextmanager
def _open_for_rekey() -> Iterator[tuple[VaultSession, str | None]]:
    """The session, and the new passphrase when this is (or resumes) a passphrase re-key.

    A re-key killed after it rekeyed engrams.db opens only with the new passphrase."""
    from .._flows.rekey import Rekey, pending_record

    path = OPTIONS.vault
    if not (path / "engrams.db").exists():
        raise CliError(f"no vault at {path}: run `engram-sync init` (or pass --vault DIR)")
    record = pending_record(path)
    passphrase = ask_passphrase()
    new_passphrase: str | None = None
    try:
        session = VaultSession.open(path, passphrase)
    except WrongPassphraseError:
        if record is None or record.kind != "passphrase" or record.step != "switched":
            raise
        new_passphrase = ask_new_passphrase()
        session = VaultSession.open(path, new_passphrase)
    with session:
        kind = Rekey(session).kind()
        if kind == "passphrase" and new_passphrase is None:
            new_passphrase = ask_new_passphrase()
        yield session, new_passphrase


@contextmanager
def _progress_bar(show: bool) -> Iterator[RekeyProgress | None]:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    if not show:
        yield None
        return
    columns = (
        TextColumn("re-encrypting"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task("copy", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield progress


# long: the command's options are its signature (typer)
def rekey(
    json_out: Annotated[bool, typer.Option("--json", help="JSON output.")] = False,
    join: Annotated[
        bool,
        typer.Option(
            "--join",
            help="This vault was re-keyed on another device: move this device to the new vault "
            "(its new passphrase, your account, or the team handoff), keeping every unpushed edit.",
        ),
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Keep a weak new passphrase without asking (for scripts); with --join: "
            "switch even to a vault the relay did not name.",
        ),
    ] = False,
    successor: Annotated[
        str | None,
        typer.Option(
            "--successor",
            metavar="VAULT_ID",
            help="With --join: follow this vault even though the relay gives no valid "
            "successor statement for it (PROTOCOL §19); only when you know it is the re-key.",
        ),
    ] = None,
) -> None:
    """Move the vault to new keys and a new vault id, then retire the old vault.

    A passphrase vault gets a new passphrase (ENGRAM_NEW_PASSPHRASE, or a prompt asked
    twice; never on the command line), which gives the new keys and vault id; engrams.db is
    rekeyed to it at the end. An account or team vault gets a new random key; signed in to
    an account, its wrap is stored there and a key minted for the new vault (the account
    password from ENGRAM_ACCOUNT_PASSWORD or a prompt). Otherwise the API key for the new
    vault comes from ENGRAM_NEW_API_KEY or a prompt (Enter keeps the current key).
    Interrupted anywhere, running `engram-sync rekey` again finishes it.

    With --join (PROTOCOL §19, client._cli.rekey_join): the other devices follow a re-key.
    """
    from .._accounts.account import load_account
    from .._flows.rekey import Rekey, account_minter, pending_record
    from . import rekey_join

    if successor is not None and not join:
        raise CliError("--successor goes with --join: `engram-sync rekey --join --successor ID`")
    if join:
        rekey_join.join(force=force, json_out=json_out, named=successor)
        return
    batch = _batch_size()
    with _open_for_rekey() as (session, new_passphrase):
        record = pending_record(session.path)
        new_api_key, mint = None, None
        if record is not None and not record.new_api_key:  # its key is still to be minted
            mint = account_minter(session, account_password())  # PROTOCOL §13
        if record is None:
            if new_passphrase is not None:  # a new one: as strong as `init` asks (zxcvbn)
                from .passphrase import check_new_passphrase

                check_new_passphrase(new_passphrase, force=force, declined=_DECLINED)
            from_account = new_passphrase is None and load_account(session.path) is not None
            if from_account and not os.environ.get(NEW_API_KEY_ENV):
                mint = account_minter(session, account_password())  # PROTOCOL §13
            else:
                new_api_key = ask_new_api_key()
        with _progress_bar(show=not json_out and err.is_terminal) as progress:
            report = Rekey(session, progress=progress, push_batch=batch).run(
                new_passphrase=new_passphrase, new_api_key=new_api_key, mint_key=mint
            )
    if json_out:
        print_json(asdict(report))
        return
    _say(report)


def _say(report: RekeyReport) -> None:
    verb = "resumed and finished" if report.resumed else "done"
    out.print(
        f"re-key {verb}: vault {report.old_vault_id} -> {report.new_vault_id} "
        f"({report.live} memories, {report.tombstones} tombstones; {report.pushed} pushed now)"
    )
    out.print(f"the old vault is retired (pulls keep working until {report.erase_after or '?'})")
    if report.kind == "passphrase":
        out.print("use the new passphrase from now on, on this device and the others")
    else:
        out.print(
            "the other devices get the new key from your account (`engram-sync link "
            "--account`) or, for team members, by `engram-sync team approve` for each"
        )
